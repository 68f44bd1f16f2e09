"""A replicated sweep judged by its analysis plan (experiments/results/table3-regime/PLAN.md), from
the sweep's raw records alone: `collect` writes the result as analysis.md and analysis.json beside
table.md, so `--from_records` rebuilds them byte for byte.

The plan, in short: the primary result is each row's difference from the baseline in the log of
the primary metric (dev perplexity), with its 95% confidence interval, from one linear model of
all rows (row a fixed effect; seeds are not blocks), read at one named readout (`final`: each
run's last evaluation, no averaging; or `step:N` from the dev curves). A row whose variance fails
an F screen against the pool (p < 0.01) is tested alone with Welch's test; Welch for every row is
reported as a sensitivity. Two families over the counted rows, each corrected by Holm's method at
0.05: the difference tests (H0: no difference) and the equivalence tests (TOST, H0: outside the
margin). The verdicts (experiments.analysis.stats.verdict) set ours against the reference's direction,
a tie where its difference is within its own noise band (2 sqrt(2) x its per-run log sd). Rows the
recipe was chosen on (the sweep's `pilot_rows`) and the baseline are not counted.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter

from experiments.analysis import stats

POWER = 0.8  # a row whose equivalence test has less power than this at the margin is named under-powered
VERDICTS = stats.VERDICTS
VERDICT_COLORS = {"agrees": "tab:green", "disagrees": "tab:red", "equivalent": "tab:blue", "inconclusive": "0.45"}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The plan's settings: a sweep's `plan` dict over these defaults, and the reference's noise."""

    metric: str = "ppl"  # analysed on the log scale; lower is better for perplexity
    split: str = "validation"  # the dev set: the primary split
    readout: str = "final"  # "final" (each run's last evaluation) or "step:N" (the dev curve at step N)
    margin: float = 0.05  # the equivalence margin, a relative change of the metric
    paper_log_sd: float = 0.003  # the reference's per-run sd of the log metric: its tie band
    paper_log_sd_sensitivity: float = 0.006  # the same band at twice the noise: the rows it makes ties
    readouts: tuple[str, ...] = ()  # other readouts reported as sensitivities ("step:700")
    complete_rows: bool = False  # a row enters the model only with every seed the sweep plans for it finished

    @classmethod
    def of(cls, sweep) -> Plan:
        plan = dict(sweep.plan)
        plan.setdefault("paper_log_sd", sweep.noise.get("ppl", {}).get("log_sd", cls.paper_log_sd))
        plan["readouts"] = tuple(plan.get("readouts", ()))
        return cls(**plan)


@dataclasses.dataclass
class Judged:
    """One row under the plan: its values, the contrast with the baseline and both families' tests."""

    row: str
    counted: bool
    n: int
    diverged: int  # seeds left out: a non-finite value (a diverged run)
    geomean: float | None
    estimate: float | None = None  # log scale, row - base
    se: float | None = None
    df: float | None = None
    method: str = ""
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_holm: float | None = None
    p_tost: float | None = None
    p_tost_holm: float | None = None
    paper: float | None = None  # the reference's log ratio to its baseline
    paper_sign: int | None = None
    verdict: str = ""
    power: float | None = None  # TOST's power at the margin for a true difference of 0, at Holm's strictest level


def log_values(doc: dict, split: str, metric: str, readout: str, log: bool = True) -> tuple[dict, dict]:
    """({row: {seed: log value}}, {row: seeds with a non-finite value}) at `readout`, of finished
    runs only (a running run's curve already holds early steps: it would enter a step's model
    before its row is complete); runs without a value there (ended before step N) are absent.
    `log=False`: the values themselves."""
    values, diverged = {}, Counter()
    for rep in doc["replicates"]:
        if rep.get("state", "finished") != "finished":  # (a hand-made document may name no state)
            continue
        if readout == "final":
            value = rep["evals"].get(split, {}).get(metric)
        else:
            step = int(readout.removeprefix("step:"))
            value = next((p.get(f"dev_{metric}") for p in rep.get("curve", []) if p["step"] == step), None)
        if value is None:
            continue
        if not (isinstance(value, (int, float)) and math.isfinite(value) and (value > 0 or not log)):
            diverged[rep["row"]] += 1
            continue
        values.setdefault(rep["row"], {})[rep["seed"]] = math.log(value) if log else value
    return values, dict(diverged)


def paper_direction(sweep, row: str, metric: str, log_sd: float) -> tuple[float | None, int | None]:
    """The reference's log ratio of `row` to its baseline, and its direction beyond its noise band."""
    ref, base = sweep.reference.get(row, {}).get(metric), sweep.reference.get(sweep.baseline, {}).get(metric)
    if not ref or not base or row == sweep.baseline:
        return None, None
    return math.log(ref / base), stats.reference_sign(ref - base, base, {"log_sd": log_sd})


def judge(sweep, doc: dict, plan: Plan, welch_all: bool = False, seed_blocks: bool = False) -> list[Judged]:
    """Every row of the records under `plan` (a sensitivity: the plan with one setting replaced), or
    with every row tested by Welch's test, or from the row + seed model (`stats.blocked`)."""
    margin, log_sd = math.log1p(plan.margin), plan.paper_log_sd
    values, diverged = log_values(doc, plan.split, plan.metric, plan.readout)
    base = sweep.baseline
    everything = {row: list(seeds.values()) for row, seeds in values.items()}
    if plan.complete_rows:  # a row still running its seeds is shown, not modelled (the stop rule)
        values = {r: v for r, v in values.items() if r == base or len(v) >= sweep.replicates_of(r)}
    groups = {row: list(seeds.values()) for row, seeds in values.items()}
    if welch_all:
        found = {r: stats.welch(v, groups[base]) for r, v in groups.items() if r != base and len(v) > 1}
    elif seed_blocks:
        found = stats.blocked(values, base) if len(groups.get(base, ())) >= 2 else {}
    else:
        found = stats.contrasts(groups, base)
    rows = [run.name for run in sweep.runs if run.name in set(doc["header"]["rows"]) | {base}]
    counted = [r for r in rows if r != base and r not in sweep.pilot_rows and r in found]
    p_holm = stats.holm({r: found[r].p() for r in counted})
    p_tost_holm = stats.holm({r: found[r].p_equivalent(margin) for r in counted})
    out = []
    for row in rows:
        seeds = everything.get(row, [])
        paper, sign = paper_direction(sweep, row, plan.metric, log_sd)
        j = Judged(row, row in counted, len(seeds), diverged.get(row, 0),
                   math.exp(statistics.fmean(seeds)) if seeds else None, paper=paper, paper_sign=sign)  # fmt: skip
        if c := found.get(row):
            j.estimate, j.se, j.df, j.method = c.estimate, c.se, c.df, c.method
            j.low, j.high = c.interval()
            j.p, j.p_tost = c.p(), c.p_equivalent(margin)
            j.power = stats.power_equivalence(margin, c.se, c.df, stats.ALPHA / max(1, len(counted)))
        if row in counted:
            j.p_holm, j.p_tost_holm = p_holm[row], p_tost_holm[row]
            j.verdict = verdict_of(j, sign) if sign is not None else ""
        out.append(j)
    return out


def verdict_of(j: Judged, direction: int) -> str:
    """A counted row's verdict against `direction`, from its two Holm-adjusted tests."""
    difference = (1 if j.estimate > 0 else -1) if j.p_holm < stats.ALPHA else 0
    return stats.verdict(difference, j.p_tost_holm < stats.ALPHA, direction)


def count(judged: list[Judged]) -> dict[str, int]:
    """How many counted rows have each verdict (in VERDICTS' order)."""
    found = Counter(j.verdict for j in judged if j.counted and j.verdict)
    return {v: found[v] for v in VERDICTS}


def count_text(judged: list[Judged]) -> str:
    counts = count(judged)
    members = {v: [j.row for j in judged if j.counted and j.verdict == v] for v in VERDICTS}
    return "; ".join(f"{counts[v]} {v}" + (f" ({', '.join(members[v])})" if members[v] else "") for v in VERDICTS)


def interactions(first: list[Judged], second: list[Judged]) -> dict[str, stats.Contrast]:
    """Per row judged in both: how its difference from the baseline moves from `first` to `second`."""
    a = {j.row: j for j in first if j.estimate is not None}
    out = {}
    for j in second:
        if j.estimate is not None and j.row in a:
            before = stats.Contrast(a[j.row].estimate, a[j.row].se, a[j.row].df, a[j.row].n, a[j.row].method)
            out[j.row] = stats.interaction(before, stats.Contrast(j.estimate, j.se, j.df, j.n, j.method))
    return out


def claims(sweep, judged: list[Judged]) -> list[dict]:
    """The reference's stated conclusions (the sweep's `claims`), each with our verdict per row
    judged against the direction the claim states (not the reference's numbers)."""
    by_row = {j.row: j for j in judged}
    out = []
    for claim in sweep.claims:
        verdicts = {}
        for row, direction in claim["rows"].items():
            j = by_row.get(row)
            if j is None or j.p_holm is None:
                verdicts[row] = "not run" if j is None or not j.n else "not counted"
                continue
            verdicts[row] = verdict_of(j, direction)
        out.append({"claim": claim["claim"], "source": claim.get("source", ""), "verdicts": verdicts})
    return out


def bleu_contrasts(sweep, doc: dict, split: str) -> dict[str, stats.Contrast]:
    """Every row's BLEU difference from the baseline (not logged) from the same model: CIs, no verdicts."""
    values, _ = log_values(doc, split, "bleu", "final", log=False)
    groups = {row: list(seeds.values()) for row, seeds in values.items()}
    return stats.contrasts(groups, sweep.baseline) if sweep.baseline in groups else {}


# ---------------------------------------------------------------------------------------------
# The document: analysis.md and analysis.json


def percent(log_value: float | None, sign: bool = True) -> str:
    """A log difference as a relative change: +4.2%."""
    if log_value is None:
        return ""
    return f"{100 * math.expm1(log_value):{'+' if sign else ''}.1f}%"


def interval_text(low: float | None, high: float | None, relative: bool = True, digits: int = 2) -> str:
    if low is None:
        return ""
    if relative:
        return f"[{percent(low)}, {percent(high)}]"
    return f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def p_text(p: float | None) -> str:
    return "" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def direction_text(sign: int | None) -> str:
    return {None: "", 1: "worse", -1: "better", 0: "tie"}[sign]


def table_lines(
    judged: list[Judged], test: dict[str, Judged], bleu: dict[str, dict[str, stats.Contrast]], plan: Plan
) -> list[str]:
    """The plan's table: a row per row, the primary columns first."""
    name = f"{plan.split} {plan.metric.upper()}"
    header = [
        "row", "seeds", f"{name} (geo. mean)", "Δ", "95% CI", "p", "Holm p", f"TOST ±{100 * plan.margin:g}% Holm p",
        "paper Δ", "paper", "verdict", "power", "test Δ [95% CI]", "test Holm p", "dev BLEU Δ [95% CI]",
        *(["test BLEU Δ [95% CI]"] if bleu.get("test") else []),
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for j in judged:
        t = test.get(j.row)
        b = [bleu["dev"].get(j.row)] + ([bleu["test"].get(j.row)] if bleu.get("test") else [])
        seeds = f"{j.n}" + (f" (+{j.diverged} diverged)" if j.diverged else "")
        cells = [
            j.row + ("" if j.counted or j.estimate is None else " (pilot)"), seeds,
            f"{j.geomean:.2f}" if j.geomean else "", percent(j.estimate), interval_text(j.low, j.high),
            p_text(j.p), p_text(j.p_holm), p_text(j.p_tost_holm), percent(j.paper), direction_text(j.paper_sign),
            j.verdict, f"{j.power:.2f}" if j.power is not None else "",
            f"{percent(t.estimate)} {interval_text(t.low, t.high)}" if t and t.estimate is not None else "",
            p_text(t.p_holm) if t else "",
            *(f"{c.estimate:+.2f} {interval_text(*c.interval(), relative=False)}" if c else "" for c in b),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def intro(sweep, plan: Plan, pooled: Judged | None, welch_rows: list[str], counted: int) -> str:
    """The paragraph above the table: what was estimated and tested, and how."""
    model = f"residual variance pooled, {pooled.df:.0f} df" if pooled else "no pooled row"
    return (
        f"Primary: each row's difference from {sweep.baseline} in log {plan.split} {plan.metric.upper()} at "
        f"readout `{plan.readout}`, shown as a relative change with its 95% CI, from one linear model of all rows "
        f"(row a fixed effect, seeds not blocked; {model}); tested alone with Welch's test (variance screen, F test "
        f"p < {stats.SCREEN_ALPHA:g}): {', '.join(welch_rows) or 'none'}. Two families over the {counted} counted "
        f"rows, each corrected by Holm's method at {stats.ALPHA:g}: the difference tests, and equivalence (TOST) "
        f"within ±{100 * plan.margin:g}%. The paper's direction is a tie within 2√2 × {plan.paper_log_sd:g} nats "
        f"(its per-run noise). 'power': TOST's power at the margin for a row with no true difference, at Holm's "
        f"strictest level. Verdicts: experiments/analysis/stats.py `verdict`. Generated by "
        f"experiments/analysis/plans.py from records.jsonl.gz."
    )


def readout_verdicts(plan: Plan, judged: list[Judged], sensitivities: dict) -> dict[str, dict[str, str]]:
    """{readout: {counted row: verdict}} at the plan's other readouts, then its own (last)."""
    found = {r: sensitivities[f"readout {r}"] for r in plan.readouts}
    found[plan.readout] = judged
    return {r: {j.row: j.verdict for j in js if j.counted} for r, js in found.items()}


def sensitivity_judgements(sweep, doc: dict, plan: Plan, test: dict[str, Judged]) -> dict[str, list[Judged]]:
    """The same rows with one setting of the plan changed, by label: each margin, the paper's noise
    doubled, each other readout, Welch for every row, the row + seed model, the test split."""
    changed = {f"margin ±{100 * m:g}%": {"margin": m} for m in stats.MARGINS}
    changed[f"paper noise sd {plan.paper_log_sd_sensitivity:g}"] = {"paper_log_sd": plan.paper_log_sd_sensitivity}
    changed |= {f"readout {readout}": {"readout": readout} for readout in plan.readouts}
    found = {label: judge(sweep, doc, dataclasses.replace(plan, **c)) for label, c in changed.items()}
    found["Welch for every row"] = judge(sweep, doc, plan, welch_all=True)
    found["row + seed model (seed a fixed effect)"] = judge(sweep, doc, plan, seed_blocks=True)
    if test:
        found[f"{plan_split(sweep)} split"] = list(test.values())
    return found


def plan_split(sweep) -> str | None:
    """The split evaluated beside the primary one (the test set), if any."""
    return next(iter(dict(sweep.evaluations()[1:])), None)


def sensitivity_lines(plan: Plan, judged: list[Judged], sensitivities: dict, by_readout: dict) -> list[str]:
    """analysis.md's sensitivities: the counts under each, the rows a doubled noise band makes
    ties, and each counted row's verdict at every readout."""
    ties = sensitivities[f"paper noise sd {plan.paper_log_sd_sensitivity:g}"]
    new_ties = [j.row for j, k in zip(judged, ties) if j.paper_sign and k.paper_sign == 0]
    lines = [
        "Sensitivities (the same rows, one setting changed):",
        "",
        *(f"- {label}: {count_text(found)}" for label, found in sensitivities.items()),
        f"- the paper's own noise at sd {plan.paper_log_sd_sensitivity:g} nats makes these rows paper ties: "
        f"{', '.join(new_ties) or 'none'}",
    ]
    if plan.readouts:
        lines += ["", "Each counted row's verdict at each readout (the plan, its dev curve read at that step):", ""]
        lines += ["| row | " + " | ".join(by_readout) + " |", "|---|" + "---|" * len(by_readout)]
        lines += [
            f"| {j.row} | " + " | ".join(v.get(j.row, "") for v in by_readout.values()) + " |"
            for j in judged
            if j.counted
        ]
    return lines


def claim_lines(plan: Plan, found_claims: list[dict]) -> list[str]:
    """analysis.md's table of the paper's claims, each row's verdict against the claim's direction."""
    if not found_claims:
        return []
    how = f"on {plan.split} {plan.metric.upper()}, the plan's outcome, also where the paper states the claim in BLEU"
    lines = ["", f"**The paper's claims** (each row judged against the direction the claim states, {how}):", ""]
    lines += ["| claim | rows: our verdict |", "|---|---|"]
    for c in found_claims:
        rows = ", ".join(f"{row}: {v}" for row, v in c["verdicts"].items())
        lines.append(f"| {c['claim']} ({c['source']}) | {rows} |")
    return lines


def document(sweep, doc: dict) -> tuple[str, dict]:
    """(analysis.md, analysis.json's content) of a sweep's records under its plan."""
    plan = Plan.of(sweep)
    judged = judge(sweep, doc, plan)
    counted = [j for j in judged if j.counted]
    test_split = plan_split(sweep)
    on_test = dataclasses.replace(plan, split=test_split or "", readout="final")
    test = {j.row: j for j in judge(sweep, doc, on_test)} if test_split else {}
    bleu = {
        "dev": bleu_contrasts(sweep, doc, plan.split),
        "test": bleu_contrasts(sweep, doc, test_split) if test else {},
    }
    pooled = next((j for j in judged if j.method == "pooled"), None)
    welch_rows = [j.row for j in judged if j.method == "welch"]
    sensitivities = sensitivity_judgements(sweep, doc, plan, test)
    by_readout = readout_verdicts(plan, judged, sensitivities)
    found_claims = claims(sweep, judged)
    lines = [
        f"# {sweep.name}, profile {doc['header']['profile'].partition(':')[0]}: the analysis plan's result",
        "",
        intro(sweep, plan, pooled, welch_rows, len(counted)),
        "",
        *table_lines(judged, test, bleu, plan),
        "",
        f"**Counts** ({len(counted)} counted rows): {count_text(judged)}.",
        "",
        f"Under-powered at the ±{100 * plan.margin:g}% margin (TOST power below {POWER:g}): "
        f"{', '.join(j.row for j in counted if j.power is not None and j.power < POWER) or 'none'}.",
        "",
        *sensitivity_lines(plan, judged, sensitivities, by_readout),
        *claim_lines(plan, found_claims),
    ]
    data = {  # floats rounded (`stats.rounded`): the file rebuilds byte for byte on any machine
        "plan": dataclasses.asdict(plan),
        "rows": [dataclasses.asdict(j) for j in judged],
        "counts": count(judged),
        "sensitivities": {label: count(found) for label, found in sensitivities.items()},
        "test": {row: dataclasses.asdict(j) for row, j in test.items()},
        **{
            key: {row: dataclasses.asdict(c) | {"interval": c.interval()} for row, c in bleu[split].items()}
            for key, split in (("bleu", "dev"), ("test_bleu", "test"))
        },
        "claims": found_claims,
        "readouts": by_readout,
    }
    return "\n".join(lines) + "\n", stats.rounded(data)
