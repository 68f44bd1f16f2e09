"""A sweep's tables: plan's layout, and `collect`'s results beside the reference (markdown, CSV,
JSON) with the statistics of its seeds, built from the sweep's raw records (experiments.records).

    python -m experiments collect table3 --root=runs/table3-mini
    python -m experiments collect table3 --from_records=experiments/results/table3-mini/records.jsonl.gz

`collect` works on a partial sweep: rows not finished show their state. Files go to R/results/
(--out=DIR elsewhere; beside the file with --from_records): table.md, table.csv, results.json
and records.jsonl.gz, the records the table was built from (per replicate: its final
evaluations and learning curve), from which `--from_records` rebuilds the three others byte
for byte, with no run directory. `--from_results=results.json` rebuilds them from the final
figures an older results.json holds (no curves, no test set: those columns stay blank).

Per row and metric: the mean and standard deviation over its seeds, on dev and on the test set;
the difference from the baseline paired by seed (seed k of a row minus seed k of the baseline)
beside the mean of the base seeds it is measured from, with its 95% confidence interval and a
paired t-test (t, df = pairs - 1, p). Ours is a direction where p < 0.05, else a tie; the
reference's is a tie where its difference is within the noise of two single runs (the sweep's
`noise`: 2 sqrt(2) sd). Rows the recipe was chosen on (the sweep's `pilot_rows`) are marked and
left out of the count. Convergence, from the dev curves: the share of each run's dev PPL gain
made in its last 20% of steps, and the PPL direction at 1/4, 1/2 and all of the steps.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import statistics
from collections.abc import Callable

from experiments import records, stats
from experiments.context import Context
from fxformer import exitcodes, paths
from fxformer.config import dotted_keys, lookup
from fxformer.errors import UserError

FRACTIONS = (0.25, 0.5, 1.0)  # where along training the direction is shown again (from the dev curves)
LATE = 0.2  # convergence: the share of the dev PPL gain made in this last part of the steps


@dataclasses.dataclass
class Figures:
    """A row's final figures on one split, per metric: each seed's value, how many, mean and sd."""

    seeds: dict[str, dict[int, float]]
    n: dict[str, int]
    ours: dict[str, float | None]
    sd: dict[str, float | None]
    results: dict = dataclasses.field(default_factory=dict)  # the first seed's evaluation (its settings)


@dataclasses.dataclass
class Row:
    """One row of the table: what it changes, its state, its figures on the sweep's split (and on
    `more` splits), the reference's, its convergence, and (set by `compare`, per metric) the paired
    comparison with the baseline. `results.json` holds these fields in this order."""

    row: str
    pilot: bool
    changes: str
    state: str
    seeds_run: int
    steps: int
    total_steps: int
    ends: dict[int, int]  # each seed's last step (below total_steps where early stopping found a plateau)
    plateaued: int  # finished seeds that early stopping ended before total_steps
    criterion: str  # the plateau criterion ("" without early stopping)
    params: int | None
    devices: str | None
    tokens_per_batch: int
    commit: str
    results: dict  # the first seed's evaluation on the sweep's split
    seeds: dict[str, dict[int, float]]
    n: dict[str, int]
    ours: dict[str, float | None]
    sd: dict[str, float | None]
    more: dict[str, Figures]
    paper: dict[str, float | None]
    paper_params: float | None
    end_above_lowest: float | None
    late_share: float | None
    late_share_seeds: dict[int, float]
    matched: dict = dataclasses.field(default_factory=dict)  # the mean of the base seeds paired with the row's
    delta_ours: dict = dataclasses.field(default_factory=dict)
    se: dict = dataclasses.field(default_factory=dict)
    pairs: dict = dataclasses.field(default_factory=dict)
    t: dict = dataclasses.field(default_factory=dict)
    df: dict = dataclasses.field(default_factory=dict)
    p: dict = dataclasses.field(default_factory=dict)
    ci: dict = dataclasses.field(default_factory=dict)
    delta_paper: dict = dataclasses.field(default_factory=dict)
    direction: dict = dataclasses.field(default_factory=dict)
    along: list[str] = dataclasses.field(default_factory=list)  # the direction at FRACTIONS of the steps


def fmt(value, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


# ---------------------------------------------------------------------------------------------
# plan


def layout(ctx: Context, runs) -> list[str]:
    """The table in the paper's layout: the sweep's columns, a blank cell = same as the baseline."""
    sweep = ctx.sweep
    configs = {run.name: run.resolved(ctx.extra) for run in sweep.runs}
    base = configs.get(sweep.baseline, {})
    metrics = list(sweep.metrics)
    header = ["row", *sweep.columns, *(f"paper {m}" for m in metrics), "paper params x1e6"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        cfg, ref = configs[run.name], sweep.reference.get(run.name, {})
        cells = [run.name]
        for key in sweep.columns.values():
            value = lookup(cfg, key)
            cells.append("" if run.name != sweep.baseline and value == lookup(base, key) else str(value))
        cells += [fmt(ref.get(m)) for m in metrics]
        cells.append(fmt(ref["params"] / 1e6, 0) if ref.get("params") else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------------------------------------
# From the records to one record per row


def more_splits(sweep) -> list[str]:
    """The splits evaluated beside the one the table is judged on (the test set)."""
    return [split for split, _ in sweep.evaluations()[1:]]


def gather(ctx: Context, runs, doc: dict | None = None) -> list[Row]:
    """One record per row of `runs`: its changes versus the baseline, state, per-seed results on
    every split, their mean and sd, the paired comparison with the baseline, the reference's
    figures and its convergence; from `doc` (the sweep's records), else from the root."""
    sweep = ctx.sweep
    doc = doc if doc is not None else records.from_root(ctx, runs)
    by_row: dict[str, list[dict]] = {}
    for rep in sorted(doc["replicates"], key=lambda r: r["seed"]):
        by_row.setdefault(rep["row"], []).append(rep)
    configs = {run.name: run.resolved(ctx.extra) for run in sweep.runs}
    names = {run.name for run in runs} | {sweep.baseline}
    rows = {
        run.name: record(sweep, run, by_row.get(run.name, []), configs[run.name], configs.get(sweep.baseline, {}))
        for run in sweep.runs
        if run.name in names
    }
    base = rows.get(sweep.baseline)
    for name, rec in rows.items():
        compare(sweep, rec, base)
        rec.along = along(sweep, rec, base, by_row.get(name, []), by_row.get(sweep.baseline, []))
    return [rows[run.name] for run in runs]


def record(sweep, run, reps: list[dict], config: dict, base_config: dict) -> Row:
    """A row's record before the comparison with the baseline, from its replicates' records."""
    split = sweep.eval_split
    results = next((rep["evals"][split] for rep in reps if split in rep["evals"]), {})
    config = (reps[0]["config"] if reps else None) or config
    states = [rep["state"] for rep in reps] or ["not in the records"]
    state = states[0] if len(set(states)) == 1 else ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
    info = reps[0]["run_info"] if reps else {}
    total = config["num_train_steps"]
    ends = {rep["seed"]: rep["step"] for rep in reps if rep.get("step")}
    curves = dev_curves(reps, "dev_ppl")
    shares = {k: s for k, c in curves.items() if (s := stats.late_share(c, ends.get(k) or total, LATE)) is not None}
    more = {s: figures(sweep, reps, s) for s in more_splits(sweep)}
    for s, figs in more.items():  # the first evaluation of that split, for the footer's sentence count
        figs.results = next((rep["evals"][s] for rep in reps if s in rep["evals"]), {})
    main = figures(sweep, reps, split)
    return Row(
        row=run.name,
        pilot=run.name in sweep.pilot_rows,
        changes=changes(sweep, config, base_config) if run.name != sweep.baseline else "",
        state=state,
        seeds_run=len(reps),
        steps=results["checkpoint_steps"][-1] if results.get("checkpoint_steps") else reps[0]["step"] if reps else 0,
        total_steps=total,
        ends=ends,
        plateaued=sum(rep["state"] == "finished" and 0 < rep["step"] < total for rep in reps),
        criterion=plateau_criterion(config),
        params=results.get("num_params") or info.get("num_params"),
        devices=info.get("devices"),
        tokens_per_batch=config["data"]["tokens_per_batch"],
        commit=", ".join(sorted({rep["commit"] for rep in reps} - {""})),
        results=results,
        seeds=main.seeds,
        n=main.n,
        ours=main.ours,
        sd=main.sd,
        more=more,
        paper={m: sweep.reference.get(run.name, {}).get(m) for m in sweep.metrics},
        paper_params=sweep.reference.get(run.name, {}).get("params"),
        end_above_lowest=max((r for c in curves.values() if (r := end_above_lowest(c)) is not None), default=None),
        late_share=statistics.fmean(shares.values()) if shares else None,
        late_share_seeds=shares,
    )


def plateau_criterion(config: dict) -> str:
    """The plateau at which early stopping ends a run of `config`, in words ("" without one)."""
    patience = config.get("early_stopping_patience", 0)
    if not patience or not config.get("best_metric"):
        return ""
    delta = config.get("early_stopping_min_delta", 0.0)
    by = f" by {100 * delta:g}% of the last improvement" if delta else ""
    return (
        f"no better {config['best_metric']}{by} in {patience} dev evaluations (one every "
        f"{config['eval_every_steps']} steps), or the cap of {config['num_train_steps']} steps"
    )


def figures(sweep, reps: list[dict], split: str) -> Figures:
    """Per metric on `split`: each seed's final value, how many, their mean and sd."""
    seeds = {
        m: {rep["seed"]: rep["evals"][split][m] for rep in reps if m in rep["evals"].get(split, {})}
        for m in sweep.metrics
    }
    spread = {m: stats.mean_sd(list(seeds[m].values())) for m in sweep.metrics}
    return Figures(
        seeds=seeds,
        n={m: len(seeds[m]) for m in sweep.metrics},
        ours={m: spread[m][0] for m in sweep.metrics},
        sd={m: spread[m][1] for m in sweep.metrics},
    )


def dev_curves(reps: list[dict], key: str) -> dict[int, dict[int, float]]:
    """{seed: {step: value}} of the replicates' learning curves of `key` (those that have one)."""
    out = {}
    for rep in reps:
        points = {p["step"]: p[key] for p in rep["curve"] if isinstance(p.get(key), (int, float))}
        if points:
            out[rep["seed"]] = points
    return out


def end_above_lowest(points: dict[int, float]) -> float | None:
    """How far a learning curve ends above its lowest point (0: it ends at its lowest; a run that
    overfits or diverges ends higher); None without a point."""
    return points[max(points)] - min(points.values()) if points else None


def compare(sweep, rec: Row, base: Row | None) -> None:
    """The row against the baseline, per metric: the paired test and both directions."""
    is_base = base is None or rec is base
    for m in sweep.metrics:
        test = stats.Paired() if is_base else stats.paired(rec.seeds[m], base.seeds[m])
        rec.matched[m], rec.delta_ours[m], rec.se[m] = test.matched, test.mean, test.se
        rec.pairs[m], rec.t[m], rec.df[m], rec.p[m] = test.pairs, test.t, test.df, test.p
        rec.ci[m] = None if test.low is None else [test.low, test.high]
        paper, base_paper = rec.paper[m], base.paper[m] if base else None
        rec.delta_paper[m] = None if paper is None or base_paper is None or is_base else paper - base_paper
        reference = stats.reference_sign(rec.delta_paper[m], base_paper, sweep.noise.get(m, {}))
        rec.direction[m] = "" if rec.row == sweep.baseline else judge(test, reference)


def judge(test: stats.Paired, reference: int | None) -> str:
    """Our direction against the reference's (see the module docstring)."""
    if test.mean is None or reference is None:
        return ""
    if test.pairs < 2:  # no spread to judge by: the raw sign, marked
        raw = "tie" if test.mean == 0 else "agree" if (test.mean > 0) == (reference > 0) else "disagree"
        return f"1 seed: {raw}" if reference else "1 seed: paper tie"
    return stats.verdict(stats.sign(test), reference, test.pairs)


def along(sweep, rec: Row, base: Row | None, reps: list[dict], base_reps: list[dict]) -> list[str]:
    """The first metric's direction against the reference's at each of FRACTIONS of the steps,
    from the dev curves (the last evaluation at or before it, paired by seed); [] without curves."""
    metric = next(iter(sweep.metrics))
    row_curves, base_curves = dev_curves(reps, f"dev_{metric}"), dev_curves(base_reps, f"dev_{metric}")
    if base is None or rec is base or not row_curves or not base_curves:
        return []
    reference = stats.reference_sign(rec.delta_paper[metric], base.paper[metric], sweep.noise.get(metric, {}))
    out = []
    for f in FRACTIONS:
        ours, theirs = at_fraction(row_curves, rec.total_steps, f), at_fraction(base_curves, base.total_steps, f)
        out.append(judge(stats.paired(ours, theirs), reference) or "?")
    return out


def at_fraction(curves: dict[int, dict[int, float]], total_steps: int, f: float) -> dict[int, float]:
    """{seed: its curve's value at the last point at or before f x total_steps} (seeds that have one)."""
    return {k: v for k, c in curves.items() if (v := stats.at_fraction(c, total_steps, f)) is not None}


def changes(sweep, config: dict, base: dict) -> str:
    """The table's fields whose value differs from the baseline's: 'd_k=4, d_v=4'."""
    keys = sweep.columns or {k: k for k in dotted_keys(config)}
    out = []
    for label, key in keys.items():
        try:
            value, base_value = lookup(config, key), lookup(base, key)
        except UserError:  # a field one of them lacks
            continue
        if value != base_value:
            out.append(f"{label}={value}")
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------
# The cells


def label(split: str) -> str:
    return "dev" if split == "validation" else split


def millions(count) -> str:
    return "" if not count else f"{count / 1e6:.3g}"


def signed(value, digits: int = 2) -> str:
    return "" if value is None else f"{value:+.{digits}f}"


def plus_minus(value, spread, sign: bool = False) -> str:
    if value is None:
        return ""
    text = f"{value:+.3f}" if sign else f"{value:.3f}"
    return f"{text} ± {'n/a' if spread is None else f'{spread:.3f}'}"


def p_value(p: float | None) -> str:
    """'p=0.042', 'p<0.001'."""
    return "" if p is None else "p<0.001" if p < 0.001 else f"p={p:.3f}"


def interval(rec: Row, m: str) -> str:
    """Δ and its 95% interval: '+0.253 [+0.141, +0.365]'."""
    d, ci = rec.delta_ours[m], rec.ci[m]
    if d is None:
        return ""
    return f"{d:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else " [n/a]")


def t_cell(rec: Row, m: str) -> str:
    """'9.73 (2), p=0.010': t, its degrees of freedom and the two-sided p."""
    if rec.p[m] is None:
        return ""
    t = "no spread" if rec.t[m] is None else f"{rec.t[m]:.2f}"
    return f"{t} ({rec.df[m]}), {p_value(rec.p[m])}"


def share(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def first_metric(sweep) -> str:
    return next(iter(sweep.metrics)).upper()


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of table.md (`md`, its cell from a row; None: not a column there) and the
    columns of table.csv it is there (`csv`, one value a cell): one list defines both tables."""

    md: str | None
    csv: tuple[str, ...]
    md_cell: Callable[[Row], str] | None
    csv_cells: Callable[[Row], list[str]]


def same(name: str, cell: Callable[[Row], str]) -> Column:
    """A column that is the same in both tables."""
    return Column(name, (name,), cell, lambda r: [cell(r)])


def columns(sweep) -> list[Column]:
    """The table's columns, in order: the row, its figures per metric, the comparisons with the
    baseline per metric, its convergence, its steps and state."""
    seeds = lambda r: str(min(r.n.values(), default=0))  # noqa: E731
    out = [
        Column("row", ("row",), lambda r: f"{r.row} (pilot)" if r.pilot else r.row, lambda r: [r.row]),
        Column(None, ("pilot",), None, lambda r: ["yes" if r.pilot else ""]),
        same("changes vs base", lambda r: r.changes or "—"),
        same("params ours (M)", lambda r: millions(r.params)),
        same("params paper (M)", lambda r: millions(r.paper_params)),
        Column("n", ("seeds",), seeds, lambda r: [seeds(r)]),
    ]
    for m in sweep.metrics:
        out += figures_columns(sweep, m)
    for m in sweep.metrics:
        out += comparison_columns(label(sweep.eval_split), m)
    return (
        out
        + convergence_columns(first_metric(sweep))
        + [
            same("steps", steps_cell),
            same("state", lambda r: r.state),
        ]
    )


def figures_columns(sweep, m: str) -> list[Column]:
    """Mean ± sd over the seeds on the sweep's split and each of `more_splits`, then the paper's."""
    out, M = [], m.upper()
    for s in (sweep.eval_split, *more_splits(sweep)):
        figs = (lambda r: r) if s == sweep.eval_split else (lambda r, s=s: r.more[s])
        out.append(
            Column(
                f"{label(s)} {M} ours (mean ± sd)",
                (f"{label(s)} {M} ours", f"{label(s)} {M} sd"),
                lambda r, figs=figs: plus_minus(figs(r).ours[m], figs(r).sd[m]),
                lambda r, figs=figs: [fmt(figs(r).ours[m], 3), fmt(figs(r).sd[m], 3)],
            )
        )
    return out + [same(f"{label(sweep.eval_split)} {M} paper", lambda r: fmt(r.paper[m]))]


def comparison_columns(split: str, m: str) -> list[Column]:
    """The paired comparison with the baseline (compare): the matched base, Δ with its interval,
    the t-test, the paper's Δ and the direction."""
    M = m.upper()
    ci = lambda r: r.ci[m] or [None, None]  # noqa: E731
    return [
        Column(
            f"{split} {M} base, matched",
            (f"{split} {M} base matched",),
            lambda r: fmt(r.matched[m], 3),
            lambda r: [fmt(r.matched[m], 3)],
        ),
        Column(
            f"Δ{M} ours [95% CI]",
            (f"Δ{M} ours", f"Δ{M} SE", f"Δ{M} CI low", f"Δ{M} CI high"),
            lambda r: interval(r, m),
            lambda r: [signed(r.delta_ours[m], 3), fmt(r.se[m], 3), signed(ci(r)[0], 3), signed(ci(r)[1], 3)],
        ),
        Column(
            f"{M} t (df), p",
            (f"{M} t", f"{M} df", f"{M} p"),
            lambda r: t_cell(r, m),
            lambda r: [fmt(r.t[m], 3), fmt(r.df[m]), fmt(r.p[m], 4)],
        ),
        same(f"Δ{M} paper", lambda r: signed(r.delta_paper[m])),
        Column(f"{M} direction", (f"{M} direction vs paper",), lambda r: r.direction[m], lambda r: [r.direction[m]]),
    ]


def convergence_columns(m1: str) -> list[Column]:
    """The first metric's direction along training, and the share of its gain made late."""
    fractions = " → ".join(fraction(f) for f in FRACTIONS)
    return [
        Column(
            f"{m1} direction at {fractions} of the steps",
            tuple(f"{m1} direction at {fraction(f)}" for f in FRACTIONS),
            lambda r: " → ".join(r.along),
            lambda r: r.along or [""] * len(FRACTIONS),
        ),
        Column(
            f"{m1} gain in the last {share(LATE)}",
            (f"{m1} gain share last {share(LATE)}",),
            lambda r: share(r.late_share),
            lambda r: [fmt(r.late_share, 3)],
        ),
    ]


def steps_cell(r: Row) -> str:
    """'1000/1000'; where seeds ended early at a plateau, their range and how many:
    '2400-3600/6000, 3 of 3 at a plateau'."""
    if not r.criterion or not r.ends or min(r.ends.values()) >= r.total_steps:
        return f"{r.steps}/{r.total_steps}"
    low, high = min(r.ends.values()), max(r.ends.values())
    span = f"{low}" if low == high else f"{low}-{high}"
    return f"{span}/{r.total_steps}, {r.plateaued} of {len(r.ends)} at a plateau"


def plateau_note(recs: list[Row]) -> str:
    """The criterion most rows share, then each other one with its rows in brackets ("" without early stopping)."""
    rows: dict[str, list[str]] = {}
    for r in recs:
        if r.criterion:
            rows.setdefault(r.criterion, []).append(r.row)
    if not rows:
        return ""
    (common, _), *others = sorted(rows.items(), key=lambda item: -len(item[1]))
    return common + "".join(f" (for {', '.join(names)}: {criterion})" for criterion, names in others)


def fraction(f: float) -> str:
    return {0.25: "1/4", 0.5: "1/2", 1.0: "all"}.get(f, f"{f:g}")


# ---------------------------------------------------------------------------------------------
# The footer: what the table is and how it was judged


def footer(sweep, source: dict, recs: list[Row]) -> list[str]:
    finished = [r for r in recs if r.results]
    first = finished[0].results if finished else {}
    unique = lambda key: sorted({str(getattr(r, key)) for r in recs if getattr(r, key)}) or ["?"]  # noqa: E731
    lines = [
        f"Sweep {sweep.name}, profile {source['profile']}, root {source['root']}; {len(finished)} of {len(recs)} "
        f"rows finished; collected {source['collected']}.",
    ]
    if source["origin"] != "run directories":
        lines.append(f"Source: {source['origin']}.")
    lines += [
        f"sacreBLEU: {first.get('signature', '?')}; beam {first.get('beam_size', '?')}, alpha "
        f"{first.get('alpha', '?')}; split {first.get('split', '?')}, {first.get('num_sentences', '?')} sentences"
        f"{more_splits_note(sweep, recs)}; no checkpoint averaging.",
        f"Devices: {', '.join(unique('devices'))}; global batch {', '.join(unique('tokens_per_batch'))} tokens per "
        f"side per step; commit {', '.join(unique('commit'))}.",
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
    lines += [line for m in sweep.metrics if (line := count_line(recs, m))]
    return lines


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
        f"minus its matched {sweep.baseline} is Δ (the {sweep.baseline} row's own mean is over all of its seeds, "
        f"including those no row is paired with); 95% CI = Δ ± t(0.975, df) x SE, SE = sd of the paired differences / "
        f"sqrt(pairs). Ours is a direction where a two-sided paired t-test on those differences (scipy.stats."
        f"ttest_rel, df = pairs - 1) gives p < {stats.ALPHA:g}, a tie otherwise."
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
    if not any(r.along or r.late_share is not None for r in recs):
        return "Convergence: these records hold no dev curves, so the convergence columns are blank."
    return (
        f"Convergence, from the dev curves: '{m1} gain in the last {share(LATE)}' is the share of a run's dev {m1} "
        f"improvement (from its first dev evaluation to its last) made in the last {share(LATE)} of its training "
        f"steps, mean over seeds: 0% had levelled off, {share(LATE)} or more was improving as fast as ever. The "
        f"{m1} direction is judged again (the same test, the same reference) at each run's last dev evaluation at "
        f"or before {', '.join(fraction(f) for f in FRACTIONS)} of its steps."
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


COUNTED = ("agree", "disagree", "tie")


def count_line(recs: list[Row], m: str) -> str | None:
    """The headline: how many rows agree with the paper's direction, pilot rows left out."""
    judged = [r for r in recs if r.direction[m]]
    pilots = [r for r in judged if r.pilot]
    rows = [r for r in judged if not r.pilot]
    counted = [r for r in rows if r.direction[m] in COUNTED]
    verdicts = [r.direction[m] for r in counted]
    if not counted and rows:
        agree = sum(r.direction[m].endswith("agree") and "disagree" not in r.direction[m] for r in rows)
        return f"{m.upper()} direction as the paper's (single seeds, no spread): {agree} of {len(rows)}."
    if not counted:
        return None
    text = (
        f"{m.upper()} direction as the paper's (paired t-test, p < {stats.ALPHA:g}): {verdicts.count('agree')} "
        f"agree, {verdicts.count('tie')} tie, {verdicts.count('disagree')} disagree, of the {len(counted)} rows with "
        f"2 or more paired seeds where the paper's difference is not a tie ({', '.join(r.row for r in counted)})"
    )
    if pilots:
        text += (
            "; not counted: the pilot rows, on which the recipe was chosen (with the baseline, on the same dev set): "
            + ", ".join(f"{r.row} {r.direction[m]}" for r in pilots)
        )
    more = len(rows) - len(counted)
    return text + (f"; {more} more rows have one seed or are paper ties." if more else ".")


# ---------------------------------------------------------------------------------------------
# collect


def markdown(sweep, source: dict, recs: list[Row]) -> str:
    shown = [c for c in columns(sweep) if c.md is not None]
    lines = ["| " + " | ".join(c.md for c in shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(c.md_cell(r) for c in shown) + " |" for r in recs]
    return "\n".join(lines) + "\n\n" + "\n".join(f"{line}  " for line in footer(sweep, source, recs)) + "\n"


def to_csv(sweep, recs: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    cols = columns(sweep)
    writer.writerow([name for c in cols for name in c.csv])
    writer.writerows([value for c in cols for value in c.csv_cells(r)] for r in recs)
    return out.getvalue()


def collect(ctx: Context, runs, doc: dict, directory) -> int:
    """table.md, table.csv and results.json from the records `doc`, and the records themselves
    (unless they came from a results.json, which holds no raw records)."""
    recs = gather(ctx, runs, doc)
    source = doc["header"]
    directory.mkdir(parents=True, exist_ok=True)
    table = markdown(ctx.sweep, source, recs)
    document = {
        "sweep": ctx.sweep.name,
        "profile": source["profile"],
        "source": source,
        "footer": footer(ctx.sweep, source, recs),
        "rows": [dataclasses.asdict(rec) for rec in recs],
    }
    written = ["table.md", "table.csv", "results.json"]
    paths.write_atomic(directory / "table.md", table)
    paths.write_atomic(directory / "table.csv", to_csv(ctx.sweep, recs))
    paths.write_atomic(directory / "results.json", json.dumps(document, indent=2) + "\n")
    if source["origin"] != records.FROM_RESULTS:
        records.write(directory / records.NAME, doc)
        written.append(records.NAME)
    print(table, end="")
    print(f"\nwritten: {directory}/{', '.join(written)}")
    return exitcodes.OK


# ---------------------------------------------------------------------------------------------
# Where the records come from: a file instead of the root


def from_file(args, extra: list[str]) -> tuple[Context, list, dict, str]:
    """(the sweep as the file's records describe it, its rows, the records, the file's folder) for
    --from_records (a records.jsonl.gz collect wrote) or --from_results (a results.json)."""
    if args.root:
        raise UserError("--from_records and --from_results need no --root: the records name it; give one or the other.")
    if args.from_records and args.from_results:
        raise UserError("give --from_records or --from_results, not both.")
    path = args.from_records or args.from_results
    doc = records.read(path) if args.from_records else records.from_results(path)
    found = doc["header"]
    if args.profile and args.profile != found["profile"]:
        raise UserError(f"{path} holds the {found['profile']} profile, not {args.profile}; leave out --profile.")
    args.profile = found["profile"]
    ctx = Context(args, list(found.get("extra", [])) or extra)
    if ctx.sweep.name != found["sweep"]:
        raise UserError(f"{path} holds records of the sweep {found['sweep']}, not {ctx.sweep.name}.")
    rows = set(found["rows"])
    runs = [run for run in ctx.sweep.select(args.only) if run.name in rows]
    return ctx, runs, doc, str(paths.as_path(path).parent)
