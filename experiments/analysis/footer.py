"""The footer of a sweep's table: what the table is, how it was judged (the statistics, the
reference's noise, convergence, the plateau), and the headline count of rows that agree."""

from __future__ import annotations

from experiments.analysis import stats
from experiments.analysis.cells import first_metric, fraction, share
from experiments.analysis.rows import FRACTIONS, LATE, Row, more_splits


def footer(sweep, source: dict, recs: list[Row], gaps: list[str] = ()) -> list[str]:
    """The lines under the table: what was run and how, how it was judged, the counts; `gaps`: runs
    whose curves miss a dev evaluation (`records.dev_gaps`)."""
    finished = [r for r in recs if r.results]
    first = finished[0].results if finished else {}
    search = first.get("decode") or first  # the decode options; older results held them at top level too
    runs, done = sum(r.seeds_run for r in recs), sum(r.seeds_finished for r in recs)
    complete = sum(0 < r.seeds_finished == r.seeds_run for r in recs)
    lines = [
        f"Sweep {sweep.name}, profile {source['profile']}, root {source['root']}; {done} of {runs} runs finished "
        f"(every seed of {complete} of {len(recs)} rows); collected {source['collected']}.",
    ]
    if source["origin"] != "run directories":
        lines.append(f"Source: {source['origin']}.")
    lines += [
        f"sacreBLEU: {first.get('signature', '?')}; beam {search.get('beam_size', '?')}, alpha "
        f"{search.get('alpha', '?')}; split {first.get('split', '?')}, {first.get('num_sentences', '?')} sentences"
        f"{more_splits_note(sweep, recs)}; no checkpoint averaging.",
        f"Devices: {distinct(recs, 'devices')}; global batch {distinct(recs, 'tokens_per_batch')} tokens per "
        f"side per step; commit {distinct(recs, 'commit')}.",
        statistics_note(sweep) + " " + reference_rule(sweep),
        convergence_note(sweep, recs),
    ]
    if criteria := plateau_note(recs):
        lines.append(
            f"Trained to a plateau: each run ends when early stopping finds {criteria}, and is "
            "evaluated at its last step; 'steps' gives its seeds' last steps and how many ended at a plateau "
            "(the others ran to the cap, or are unfinished)."
        )
    if any(r.end_above_lowest is not None for r in recs):
        lines.append(end_note(recs))
    if gaps:
        lines.append(
            f"Dev evaluations missing from a curve (a stop on an evaluation step, not made up on resume before "
            f"150f6a7; early stopping counted one fewer there): {'; '.join(gaps)}."
        )
    lines += [line for m in sweep.metrics if (line := count_line(recs, m))]
    return lines


def distinct(recs: list[Row], key: str) -> str:
    """The rows' values of `key`, each once, sorted and joined ("a, b"; a row trained at several
    commits holds them joined the same way); "?" if none has one."""
    return ", ".join(sorted({v for r in recs if getattr(r, key) for v in str(getattr(r, key)).split(", ")}) or ["?"])


def more_splits_note(sweep, recs: list[Row]) -> str:
    """'; and test, 1000 sentences, decoded the same way (20 of 20 rows)', or why those columns are blank."""
    out = ""
    for split in more_splits(sweep):
        done = [r for r in recs if r.more[split].results]
        if not done:
            out += f"; {split}: no evaluation in these records (its columns are blank)"
            continue
        n = done[0].more[split].results.get("num_sentences", "?")
        out += f"; and {split}, {n} sentences, decoded the same way ({len(done)} of {len(recs)} rows)"
    return out


def statistics_note(sweep) -> str:
    return (
        f"Statistics: n seeds per row; Δ = mean over the seeds k both have of (row seed k - {sweep.baseline} seed k), "
        f"shown beside '{sweep.baseline}, matched', the mean of those {sweep.baseline} seeds, so that a row's mean "
        f"minus its matched {sweep.baseline} is Δ where each of the row's seeds has its {sweep.baseline} seed (as "
        f"in a finished sweep; the {sweep.baseline} row's own mean is over all of its seeds, including those no "
        f"row is paired with); 95% CI = Δ ± t(0.975, df) x SE, SE = sd of the paired differences / "
        f"sqrt(pairs). Ours is a direction where a two-sided paired t-test on those differences (scipy.stats."
        f"ttest_rel, df = pairs - 1) gives p < {stats.ALPHA:g}; its verdict is inconclusive otherwise (only an "
        f"equivalence test, in the analysis plan, can say equivalent)."
    )


def reference_rule(sweep) -> str:
    parts = []
    for m, noise in sweep.noise.items():
        if "log_sd" in noise:
            parts.append(f"{m.upper()}: |Δ ln {m.upper()}| <= 2 sqrt(2) x {noise['log_sd']}")
        elif "sd" in noise:
            parts.append(f"{m.upper()}: |Δ| <= 2 sqrt(2) x {noise['sd']}")
    if not parts:
        return "The reference's differences are taken as they are."
    why = f" ({sweep.noise_source})" if sweep.noise_source else ""
    return (
        "The reference is a tie where its difference is within the noise of two single runs: "
        + "; ".join(parts)
        + why
        + "."
    )


def convergence_note(sweep, recs: list[Row]) -> str:
    m1 = first_metric(sweep)
    if not any(r.ends for r in recs):
        return "Convergence: no run's training is over yet, so the convergence columns are blank."
    if not any(r.along or r.late_fall is not None for r in recs):
        return "Convergence: these records hold no dev curves, so the convergence columns are blank."
    return (
        f"Convergence, from the dev curves: '{m1} fall in the last {share(LATE)}' is how much a run's dev {m1} fell "
        f"over the last {share(LATE)} of its training steps, relative to its value then (at its last dev evaluation "
        f"at or before {share(1 - LATE)} of its steps), mean over seeds: 0% had levelled off, 10% still fell by a "
        f"tenth, below 0 ended worse than it was. The paired verdict is given again "
        f"(the same test, the same reference) at each run's last dev evaluation at or before "
        f"{', '.join(fraction(f) for f in FRACTIONS)} of its own steps (to where early stopping ended it, else "
        f"the cap). Runs whose training is over only."
    )


def end_note(recs: list[Row]) -> str:
    """Whether the runs end at their lowest dev perplexity, against each row's seed sd."""
    measured = [r for r in recs if r.end_above_lowest is not None]
    rises = [r.end_above_lowest for r in measured]
    above = [
        f"{r.row} (+{r.end_above_lowest:.3f}, seed sd {r.sd['ppl']:.3f})"
        for r in measured
        if r.sd.get("ppl") is not None and r.end_above_lowest > r.sd["ppl"]
    ]
    return (
        f"Dev PPL at the end vs each run's lowest: in {rises.count(0)} of {len(rises)} rows every seed ends at its "
        f"lowest; the largest rise is {max(rises, default=0):.3f}; rows with a seed that ends above its lowest "
        f"by more than the row's seed sd: {', '.join(above) or 'none'}."
    )


def count_line(recs: list[Row], m: str) -> str | None:
    """The headline of the uncorrected paired view: how many rows agree with the paper's direction,
    pilot rows and the paper's ties left out (a tie cannot agree without an equivalence test)."""
    judged = [r for r in recs if r.direction[m]]
    pilots = [r for r in judged if r.pilot]
    rows = [r for r in judged if not r.pilot]
    if not rows:
        return None
    directed = [r for r in rows if r.reference[m]]
    beyond = "a paper difference beyond its noise"
    if directed and all(r.pairs[m] < 2 for r in rows):  # single seeds: no spread, only the raw sign
        agree = sum(r.delta_ours[m] != 0 and (r.delta_ours[m] > 0) == (r.reference[m] > 0) for r in directed)
        lead = f"{m.upper()} direction as the paper's (single seeds, no spread: the raw sign, no verdict)"
        return f"{lead}: {agree} of the {len(directed)} rows with {beyond}."
    counted = [r for r in directed if r.pairs[m] >= 2]
    if not counted:
        return f"{m.upper()} direction as the paper's: no row has 2 or more paired seeds and {beyond}."
    verdicts = [r.direction[m] for r in counted]
    text = (
        f"{m.upper()} direction as the paper's (the uncorrected paired view: a paired t-test, p < {stats.ALPHA:g}, "
        f"no correction for the rows compared): "
        + ", ".join(f"{verdicts.count(v)} {v}" for v in stats.VERDICTS if v != stats.EQUIVALENT)
        + f", of the {len(counted)} rows with 2 or more paired seeds where the paper's difference is not a tie "
        f"({', '.join(r.row for r in counted)})"
    )
    if pilots:
        text += (
            "; not counted: the pilot rows, on which the recipe was chosen (with the baseline, on the same dev set): "
            + ", ".join(f"{r.row} {r.direction[m]}" for r in pilots)
        )
    more = len(rows) - len(counted)
    return text + (f"; {more} more rows have one seed or are paper ties." if more else ".")


def plateau_note(recs: list[Row]) -> str:
    """The criterion most rows share, then each other one with its rows in brackets, and the rows
    without early stopping ("" when no row has it)."""
    rows: dict[str, list[str]] = {}
    for r in recs:
        if r.criterion:
            rows.setdefault(r.criterion, []).append(r.row)
    if not rows:
        return ""
    (common, _), *others = sorted(rows.items(), key=lambda item: -len(item[1]))
    none = [r.row for r in recs if not r.criterion]
    return (
        common
        + "".join(f" (for {', '.join(names)}: {criterion})" for criterion, names in others)
        + (f" (for {', '.join(none)}: no early stopping, the steps set)" if none else "")
    )
