"""From a sweep's raw records (experiments.records) to one Row per table row: its state, each
seed's final figures on every split with their mean and sd, the paired comparison with the
baseline (experiments.stats), the reference's figures, and its convergence from the dev curves.
`report` lays these out as tables, `figures` as plots."""

from __future__ import annotations

import dataclasses
import statistics

from experiments.analysis import stats
from fxformer.config import dotted_keys, lookup
from fxformer.errors import UserError

FRACTIONS = (0.25, 0.5, 1.0)  # where along training the direction is shown again (from the dev curves)
LATE = 0.2  # convergence: the relative fall of dev PPL over this last part of the steps


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
    seeds_finished: int
    steps: int
    total_steps: int
    ends: dict[int, int]  # each seed's last step (below total_steps where early stopping found a plateau)
    plateaued: int  # seeds whose training is over that early stopping ended before total_steps
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
    late_fall: float | None
    late_fall_seeds: dict[int, float]
    matched: dict = dataclasses.field(default_factory=dict)  # the mean of the base seeds paired with the row's
    delta_ours: dict = dataclasses.field(default_factory=dict)
    se: dict = dataclasses.field(default_factory=dict)
    pairs: dict = dataclasses.field(default_factory=dict)
    t: dict = dataclasses.field(default_factory=dict)
    df: dict = dataclasses.field(default_factory=dict)
    p: dict = dataclasses.field(default_factory=dict)
    ci: dict = dataclasses.field(default_factory=dict)
    delta_paper: dict = dataclasses.field(default_factory=dict)
    reference: dict = dataclasses.field(default_factory=dict)  # the reference's direction: +1, -1, 0 (its tie)
    direction: dict = dataclasses.field(default_factory=dict)  # the uncorrected paired view's verdict
    along: list[str] = dataclasses.field(default_factory=list)  # the direction at FRACTIONS of the steps


def more_splits(sweep) -> list[str]:
    """The splits evaluated beside the one the table is judged on (the test set)."""
    return [split for split, _ in sweep.evaluations()[1:]]


def gather(sweep, runs, doc: dict) -> list[Row]:
    """One record per row of `runs` (rows of `sweep`): its changes versus the baseline, state,
    per-seed results on every split, their mean and sd, the paired comparison with the baseline,
    the reference's figures and its convergence; from `doc`, the sweep's records."""
    extra = tuple(doc["header"].get("extra", ()))
    by_row: dict[str, list[dict]] = {}
    for rep in sorted(doc["replicates"], key=lambda r: r["seed"]):
        by_row.setdefault(rep["row"], []).append(rep)
    names = {run.name for run in runs} | {sweep.baseline}
    chosen = [run for run in sweep.runs if run.name in names]
    # a row's config as its records hold it; a row without records resolved from the sweep without its
    # profile's data folder, so that a records file rebuilds the table on a machine with no data files
    configs = {
        run.name: recorded_config(by_row.get(run.name, [])) or run.without_folder(sweep.profile).resolved(extra)
        for run in chosen
    }
    rows = {
        run.name: record(sweep, run, by_row.get(run.name, []), configs[run.name], configs.get(sweep.baseline, {}))
        for run in chosen
    }
    base = rows.get(sweep.baseline)
    for name, rec in rows.items():
        compare(sweep, rec, base)
        rec.along = along(sweep, rec, base, by_row.get(name, []), by_row.get(sweep.baseline, []))
    return [rows[run.name] for run in runs]


def recorded_config(reps: list[dict]) -> dict | None:
    """The config of a row's first replicate with one recorded (its lowest seed that has), if any."""
    return next((rep["config"] for rep in reps if rep.get("config")), None)


def record(sweep, run, reps: list[dict], config: dict, base_config: dict) -> Row:
    """A row's record before the comparison with the baseline, from its replicates' records."""
    split = sweep.eval_split
    results = next((rep["evals"][split] for rep in reps if split in rep["evals"]), {})
    states = [rep["state"] for rep in reps] or ["not in the records"]
    state = states[0] if len(set(states)) == 1 else ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
    info = reps[0]["run_info"] if reps else {}
    total = config["num_train_steps"]
    ends = {rep["seed"]: rep["step"] for rep in trained(reps) if rep.get("step")}
    curves = dev_curves(trained(reps), "dev_ppl")
    falls = {k: f for k, c in curves.items() if (f := stats.late_fall(c, ends.get(k) or total, LATE)) is not None}
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
        seeds_finished=sum(rep["state"] == "finished" for rep in reps),
        steps=results["checkpoint_steps"][-1] if results.get("checkpoint_steps") else reps[0]["step"] if reps else 0,
        total_steps=total,
        ends=ends,
        plateaued=sum(0 < rep["step"] < total for rep in trained(reps)),
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
        late_fall=statistics.fmean(falls.values()) if falls else None,
        late_fall_seeds=falls,
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


def trained(reps: list[dict]) -> list[dict]:
    """The replicates whose training is over (finished, or trained and not yet evaluated on every
    split): the convergence columns and the steps are theirs alone (a running seed's curve is
    not yet a run's)."""
    return [rep for rep in reps if rep["state"] in ("finished", "trained")]


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
    """The row against the baseline, per metric: the paired test, the reference's direction and the
    paired view's verdict."""
    is_base = base is None or rec is base
    for m in sweep.metrics:
        test = stats.Paired() if is_base else stats.paired(rec.seeds[m], base.seeds[m])
        rec.matched[m], rec.delta_ours[m], rec.se[m] = test.matched, test.mean, test.se
        rec.pairs[m], rec.t[m], rec.df[m], rec.p[m] = test.pairs, test.t, test.df, test.p
        rec.ci[m] = None if test.low is None else [test.low, test.high]
        paper, base_paper = rec.paper[m], base.paper[m] if base else None
        rec.delta_paper[m] = None if paper is None or base_paper is None or is_base else paper - base_paper
        reference = stats.reference_sign(rec.delta_paper[m], base_paper, sweep.noise.get(m, {}))
        rec.reference[m] = None if is_base else reference
        rec.direction[m] = "" if rec.row == sweep.baseline else paired_verdict(test, reference)


def paired_verdict(test: stats.Paired, reference: int | None) -> str:
    """The uncorrected paired view's verdict (stats.verdict, with no equivalence test: a difference
    the paired t-test does not find, or cannot test with one pair, is inconclusive, never
    equivalent); "" where the reference has no figure or no seed is paired."""
    if test.mean is None or reference is None:
        return ""
    return stats.verdict(stats.sign(test) or 0, False, reference)


def along(sweep, rec: Row, base: Row | None, reps: list[dict], base_reps: list[dict]) -> list[str]:
    """The first metric's direction against the reference's at each of FRACTIONS of each run's own
    steps (where early stopping ended it, else the cap), from the trained runs' dev curves (the
    last evaluation at or before it, paired by seed); [] without curves."""
    metric = next(iter(sweep.metrics))
    row_curves = dev_curves(trained(reps), f"dev_{metric}")
    base_curves = dev_curves(trained(base_reps), f"dev_{metric}")
    if base is None or rec is base or not row_curves or not base_curves:
        return []
    reference = stats.reference_sign(rec.delta_paper[metric], base.paper[metric], sweep.noise.get(metric, {}))
    out = []
    for f in FRACTIONS:
        ours = at_fraction(row_curves, rec.ends, rec.total_steps, f)
        theirs = at_fraction(base_curves, base.ends, base.total_steps, f)
        out.append(paired_verdict(stats.paired(ours, theirs), reference) or "?")
    return out


def at_fraction(curves: dict[int, dict[int, float]], ends: dict[int, int], cap: int, f: float) -> dict[int, float]:
    """{seed: its curve's value at the last point at or before f x its own last step (`ends`, else
    the cap)} for the seeds that have one: a run that early stopping ended at step 700 is judged
    at 175 and 350, not at its end for every fraction past 700."""
    return {k: v for k, c in curves.items() if (v := stats.at_fraction(c, ends.get(k) or cap, f)) is not None}


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
