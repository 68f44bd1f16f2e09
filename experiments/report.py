"""A sweep's tables and figures: plan's layout, and its results beside the reference: `collect`
(markdown, CSV, JSON) and `plot` (PNG), with the statistics of its seeds.

    python -m experiments collect table3 --root=runs/table3-mini
    python -m experiments plot    table3 --root=runs/table3-mini

Both work on a partial sweep: rows not finished show their state. Files go to R/results/
(--out=DIR elsewhere): table.md, table.csv, results.json; delta.png, params.png, curves.png.

Per row and metric: the mean and standard deviation over its seeds, and the difference from
the baseline paired by seed (seed k of a row minus seed k of the baseline) with its standard
error. Our direction is a tie where |mean difference| <= 2 SE; the reference's is a tie where
its difference is within the noise of two single runs (the sweep's `noise`: 2 sqrt(2) sd).
"""

from __future__ import annotations

import csv
import io
import json
import re
import time

from experiments import stats
from experiments.context import Context
from fxformer import exitcodes, paths
from fxformer.config import dotted_keys, lookup
from fxformer.errors import UserError


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
# collect


def gather(ctx: Context, runs) -> list[dict]:
    """One record per row: its changes versus the baseline, state, per-seed results, their mean and
    sd, the paired difference from the baseline with its SE, and the reference's figures."""
    sweep = ctx.sweep
    configs = {run.name: run.resolved(ctx.extra) for run in sweep.runs}
    base_config = configs.get(sweep.baseline, {})
    rows = {run.name: record(ctx, run, configs[run.name], base_config) for run in sweep.runs}
    base = rows.get(sweep.baseline)
    for rec in rows.values():
        rec["delta_ours"], rec["se"], rec["pairs"], rec["delta_paper"], rec["direction"] = {}, {}, {}, {}, {}
        for m in sweep.metrics:
            d, se, n = (None, None, 0) if not base or rec is base else stats.paired(rec["seeds"][m], base["seeds"][m])
            rec["delta_ours"][m], rec["se"][m], rec["pairs"][m] = d, se, n
            paper, base_paper = rec["paper"][m], base["paper"][m] if base else None
            missing = paper is None or base_paper is None or rec is base
            rec["delta_paper"][m] = None if missing else paper - base_paper
            rec["direction"][m] = direction(rec, m, base_paper, sweep) if rec["row"] != sweep.baseline else ""
    return [rows[run.name] for run in runs]


def record(ctx: Context, run, config: dict, base_config: dict) -> dict:
    """A row's record before the comparison with the baseline."""
    sweep = ctx.sweep
    reps = ctx.replicates(run)
    found = [(rep, ctx.read(rep)) for rep in reps]
    info = paths.Workdir(ctx.workdir(run)).run_info
    info = json.loads(info.read_text()) if info.exists() else {}
    first = next((row for _, row in found if row.results), None)
    results = first.results if first else {}
    seeds = {m: {rep.seed: row.results[m] for rep, row in found if row.results and m in row.results}
             for m in sweep.metrics}  # fmt: skip
    config = found[0][1].config or config
    states = [str(row.state(ctx.args.lease_s)) for _, row in found]
    return {
        "row": run.name,
        "changes": changes(sweep, config, base_config) if run.name != sweep.baseline else "",
        "state": states[0] if len(set(states)) == 1 else ", ".join(f"{states.count(s)} {s}" for s in set_of(states)),
        "seeds_run": len(reps),
        "steps": results["checkpoint_steps"][-1] if results else found[0][1].step,
        "total_steps": config["num_train_steps"],
        "params": results.get("num_params") or info.get("num_params"),
        "devices": info.get("devices"),
        "tokens_per_batch": config["data"]["tokens_per_batch"],
        "commit": ", ".join(sorted({row.status.get("commit", "") for _, row in found} - {""})),
        "results": results,
        "seeds": seeds,
        "n": {m: len(seeds[m]) for m in sweep.metrics},
        "ours": {m: stats.mean_sd(list(seeds[m].values()))[0] for m in sweep.metrics},
        "sd": {m: stats.mean_sd(list(seeds[m].values()))[1] for m in sweep.metrics},
        "paper": {m: sweep.reference.get(run.name, {}).get(m) for m in sweep.metrics},
        "paper_params": sweep.reference.get(run.name, {}).get("params"),
        "end_above_lowest": max(
            (rise for rep in reps if (rise := end_above_lowest(curve(ctx, rep))) is not None), default=None
        ),
    }


def end_above_lowest(points: dict[int, float]) -> float | None:
    """How far a learning curve ends above its lowest point (0: it ends at its lowest; a run that
    overfits or diverges ends higher); None without a point."""
    return points[max(points)] - min(points.values()) if points else None


def set_of(values: list[str]) -> list[str]:
    return sorted(set(values))


def direction(rec: dict, metric: str, base_paper: float | None, sweep) -> str:
    """Our direction against the reference's for `metric` (see the module docstring)."""
    d, se, pairs = rec["delta_ours"][metric], rec["se"][metric], rec["pairs"][metric]
    reference = stats.reference_sign(rec["delta_paper"][metric], base_paper, sweep.noise.get(metric, {}))
    if d is None or reference is None:
        return ""
    if pairs < 2:  # no spread to judge by: the raw sign, marked
        raw = "tie" if d == 0 else "agree" if (d > 0) == (reference > 0) else "disagree"
        return f"1 seed: {raw}" if reference else "1 seed: paper tie"
    return stats.verdict(stats.sign(d, se), reference, pairs)


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


def split_name(sweep) -> str:
    return "dev" if "validation" in " ".join(sweep.eval_flags) else "test"


def header(sweep) -> list[str]:
    """The CSV's columns: one value a cell (the markdown table joins mean and sd, difference and SE)."""
    split = split_name(sweep)
    cols = ["row", "changes vs base", "params ours (M)", "params paper (M)", "seeds"]
    for m in sweep.metrics:
        cols += [f"{split} {m.upper()} ours", f"{split} {m.upper()} sd", f"{split} {m.upper()} paper"]
    for m in sweep.metrics:
        cols += [f"Δ{m.upper()} ours", f"Δ{m.upper()} SE", f"Δ{m.upper()} paper"]
    cols += [f"{m.upper()} direction vs paper" for m in sweep.metrics]
    return cols + ["steps", "state"]


def cells(rec: dict, sweep) -> list[str]:
    out = [rec["row"], rec["changes"] or "—", millions(rec["params"]), millions(rec["paper_params"]),
           str(min(rec["n"].values(), default=0))]  # fmt: skip
    for m in sweep.metrics:
        out += [fmt(rec["ours"][m], 3), fmt(rec["sd"][m], 3), fmt(rec["paper"][m])]
    for m in sweep.metrics:
        out += [signed(rec["delta_ours"][m], 3), fmt(rec["se"][m], 3), signed(rec["delta_paper"][m])]
    out += [rec["direction"][m] for m in sweep.metrics]
    return out + [f"{rec['steps']}/{rec['total_steps']}", rec["state"]]


def markdown_header(sweep) -> list[str]:
    split = split_name(sweep)
    cols = ["row", "changes vs base", "params ours (M)", "params paper (M)", "n"]
    for m in sweep.metrics:
        cols += [f"{split} {m.upper()} ours (mean ± sd)", f"{split} {m.upper()} paper"]
    for m in sweep.metrics:
        cols += [f"Δ{m.upper()} ours (± SE)", f"Δ{m.upper()} paper"]
    cols += [f"{m.upper()} direction" for m in sweep.metrics]
    return cols + ["steps", "state"]


def markdown_cells(rec: dict, sweep) -> list[str]:
    out = [rec["row"], rec["changes"] or "—", millions(rec["params"]), millions(rec["paper_params"]),
           str(min(rec["n"].values(), default=0))]  # fmt: skip
    for m in sweep.metrics:
        out += [plus_minus(rec["ours"][m], rec["sd"][m]), fmt(rec["paper"][m])]
    for m in sweep.metrics:
        d = rec["delta_ours"][m]
        out += ["" if d is None else plus_minus(d, rec["se"][m], sign=True), signed(rec["delta_paper"][m])]
    out += [rec["direction"][m] for m in sweep.metrics]
    return out + [f"{rec['steps']}/{rec['total_steps']}", rec["state"]]


def plus_minus(value, spread, sign: bool = False) -> str:
    if value is None:
        return ""
    text = f"{value:+.3f}" if sign else f"{value:.3f}"
    return f"{text} ± {'n/a' if spread is None else f'{spread:.3f}'}"


def millions(count) -> str:
    return "" if not count else f"{count / 1e6:.3g}"


def signed(value, digits: int = 2) -> str:
    return "" if value is None else f"{value:+.{digits}f}"


def footer(ctx: Context, records: list[dict]) -> list[str]:
    finished = [r for r in records if r["results"]]
    first = finished[0]["results"] if finished else {}
    unique = lambda key: sorted({str(r[key]) for r in records if r[key]}) or ["?"]  # noqa: E731
    lines = [
        f"Sweep {ctx.sweep.name}, profile {ctx.profile}, root {ctx.root}; {len(finished)} of {len(records)} rows "
        f"finished; collected {time.strftime('%Y-%m-%d %H:%M')}.",
        f"sacreBLEU: {first.get('signature', '?')}; beam {first.get('beam_size', '?')}, alpha "
        f"{first.get('alpha', '?')}; split {first.get('split', '?')}, {first.get('num_sentences', '?')} sentences; "
        "no checkpoint averaging.",
        f"Devices: {', '.join(unique('devices'))}; global batch {', '.join(unique('tokens_per_batch'))} tokens per "
        f"side per step; commit {', '.join(unique('commit'))}.",
        f"Statistics: n seeds per row; Δ = mean over seeds k of (row seed k - {ctx.sweep.baseline} seed k), ± its "
        f"standard error (sd of the paired differences / sqrt(pairs)); ours is a tie where |Δ| <= "
        f"{stats.TIE_SE:g} SE. " + reference_rule(ctx.sweep),
    ]
    lines.append(end_note(records))
    for m in ctx.sweep.metrics:
        verdicts = [r["direction"][m] for r in records if r["direction"][m]]
        counted = [v for v in verdicts if v in ("agree", "disagree", "tie")]
        names = [r["row"] for r in records if r["direction"][m] in ("agree", "disagree", "tie")]
        if counted:
            lines.append(
                f"{m.upper()} direction as the paper's: {counted.count('agree')} agree, {counted.count('tie')} tie, "
                f"{counted.count('disagree')} disagree, of the {len(counted)} rows with 2 or more paired seeds "
                f"where the paper's difference is not a tie ({', '.join(names)})"
                + (
                    f"; {len(verdicts) - len(counted)} more rows have one seed or are paper ties."
                    if len(verdicts) > len(counted)
                    else "."
                )
            )
        elif verdicts:
            agree = sum(v.endswith("agree") and "disagree" not in v for v in verdicts)
            lines.append(f"{m.upper()} direction as the paper's (single seeds, no spread): {agree} of {len(verdicts)}.")
    return lines


def end_note(records: list[dict]) -> str:
    """Whether the runs end at their lowest dev perplexity, against each row's seed sd."""
    measured = [r for r in records if r["end_above_lowest"] is not None]
    rises = [r["end_above_lowest"] for r in measured]
    above = [f"{r['row']} (+{r['end_above_lowest']:.3f}, seed sd {r['sd']['ppl']:.3f})" for r in measured
             if r["sd"].get("ppl") is not None and r["end_above_lowest"] > r["sd"]["ppl"]]  # fmt: skip
    return (
        f"Dev PPL at the end vs each run's lowest: in {rises.count(0)} of {len(rises)} rows every seed ends at its "
        f"lowest; the largest rise is {max(rises, default=0):.3f}; rows with a seed that ends above its lowest "
        f"by more than the row's seed sd: {', '.join(above) or 'none'}."
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


def markdown(ctx: Context, records: list[dict]) -> str:
    cols = markdown_header(ctx.sweep)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(markdown_cells(r, ctx.sweep)) + " |" for r in records]
    return "\n".join(lines) + "\n\n" + "\n".join(f"{line}  " for line in footer(ctx, records)) + "\n"


def to_csv(ctx: Context, records: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header(ctx.sweep))
    writer.writerows(cells(r, ctx.sweep) for r in records)
    return out.getvalue()


def out_dir(ctx: Context):
    directory = paths.as_path(ctx.args.out or f"{ctx.root}/results")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def collect(ctx: Context, runs) -> int:
    records = gather(ctx, runs)
    directory = out_dir(ctx)
    table = markdown(ctx, records)
    paths.write_atomic(directory / "table.md", table)
    paths.write_atomic(directory / "table.csv", to_csv(ctx, records))
    document = {"sweep": ctx.sweep.name, "profile": ctx.profile, "footer": footer(ctx, records), "rows": records}
    paths.write_atomic(directory / "results.json", json.dumps(document, indent=2) + "\n")
    print(table, end="")
    print(f"\nwritten: {directory}/table.md, table.csv, results.json")
    return exitcodes.OK


# ---------------------------------------------------------------------------------------------
# plot


def curve(ctx: Context, rep, key: str = "dev_ppl") -> dict[int, float]:
    """{step: value} of a run's logged `key` (its learning curve; damaged lines are passed over)."""
    logged = paths.Workdir(ctx.workdir(rep)).logged()
    return {point["step"]: point[key] for point in logged if isinstance(point.get(key), float)}


def band(ctx: Context, run, key: str = "dev_ppl") -> tuple[list[int], list[float], list[float], list[float]]:
    """A row's learning curve over its seeds: (steps every seed logged, mean, min, max)."""
    curves = [c for c in (curve(ctx, rep, key) for rep in ctx.replicates(run)) if c]
    if not curves:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    values = [[c[s] for c in curves] for s in steps]
    return steps, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def group_of(name: str) -> str:
    """A row's group: its name without the trailing number (A3 -> A; base, big stay)."""
    return re.sub(r"\d+$", "", name)


def plot(ctx: Context, runs) -> int:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    sweep = ctx.sweep
    records = gather(ctx, runs)
    directory = out_dir(ctx)
    written = []
    others = [r for r in records if r["row"] != sweep.baseline]

    metrics = list(sweep.metrics)
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(8, 0.5 * len(others) + 2), 3.2 * len(metrics)))
    axes = [axes] if len(metrics) == 1 else list(axes)
    x = range(len(others))
    for ax, m in zip(axes, metrics):
        base = next((r for r in records if r["row"] == sweep.baseline), None)
        for offset, side, color in ((-0.2, "ours", "tab:blue"), (0.2, "paper", "tab:gray")):
            values = [relative(r, base, side, m) for r in others]
            errors = [relative_se(r, base, m) if side == "ours" else 0 for r in others]
            ax.bar([i + offset for i in x], [v if v is not None else 0 for v in values], width=0.4, color=color,
                   yerr=[2 * e for e in errors] if side == "ours" else None, capsize=2,
                   label="paper" if side == "paper" else f"ours ({ctx.profile}), ± 2 SE")  # fmt: skip
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_yscale("symlog", linthresh=10)  # a row that failed to train must not flatten the others
        ax.set_xticks(list(x), [r["row"] for r in others])
        ax.set_ylabel(f"{m.upper()} change vs {sweep.baseline} (%, symlog)")
        ax.set_title(f"{m.upper()}: {'lower' if sweep.metrics[m] == 'lower' else 'higher'} is better")
        ax.legend(fontsize=8)
    fig.suptitle(f"{sweep.name} ({ctx.profile}): change versus {sweep.baseline}, ours beside the paper")
    fig.tight_layout()
    written.append(save(fig, directory / "delta.png"))

    metric = metrics[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, side, params_key in ((axes[0], "ours", "params"), (axes[1], "paper", "paper_params")):
        points = [(r[params_key] / 1e6, r[side][metric], r["row"]) for r in records
                  if r[params_key] and r[side][metric] is not None]  # fmt: skip
        spread = [(r["sd"][metric] or 0) if side == "ours" else 0 for r in records
                  if r[params_key] and r[side][metric] is not None]  # fmt: skip
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=spread, fmt="o", capsize=2)
        for px, py, name in points:
            ax.annotate(name, (px, py), fontsize=8, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("parameters (millions)")
        ax.set_ylabel(f"dev {metric.upper()}")
        ax.set_title("ours (mean ± sd over seeds)" if side == "ours" else "paper")
    fig.suptitle(f"{sweep.name} ({ctx.profile}): dev {metric.upper()} against parameters")
    fig.tight_layout()
    written.append(save(fig, directory / "params.png"))

    groups = []
    for run in runs:
        g = group_of(run.name)
        if run.name != sweep.baseline and g not in groups:
            groups.append(g)
    if groups:
        base_run = next((r for r in sweep.runs if r.name == sweep.baseline), None)
        cols = min(3, len(groups))
        rows = (len(groups) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
        for ax, g in zip(axes.flat, groups):
            members = [run for run in runs if group_of(run.name) == g and run.name != sweep.baseline]
            for run in ([base_run] if base_run else []) + members:
                steps, mean, low, high = band(ctx, run)
                style = {"color": "black", "linestyle": "--"} if run is base_run else {}
                line = ax.plot(steps, mean, label=run.name, **style)[0]
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            ax.set_yscale("log")
            ax.set_title(f"group {g}")
            ax.set_xlabel("step")
            ax.set_ylabel("dev PPL")
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(groups) :]:
            ax.axis("off")
        fig.suptitle(f"{sweep.name} ({ctx.profile}): dev perplexity during training (mean over seeds, band: min-max)")
        fig.tight_layout()
        written.append(save(fig, directory / "curves.png"))
    print("written: " + ", ".join(str(p) for p in written))
    return exitcodes.OK


def relative(record: dict, base: dict | None, side: str, metric: str) -> float | None:
    """Percent change of `metric` versus the baseline (scales differ between ours and the paper's);
    ours is the mean paired difference."""
    if base is None or not base[side][metric]:
        return None
    delta = record[f"delta_{side}"][metric]
    return None if delta is None else 100 * delta / base[side][metric]


def relative_se(record: dict, base: dict | None, metric: str) -> float:
    """The standard error of our paired difference, in percent of the baseline's mean (0 if unknown)."""
    if base is None or not base["ours"][metric] or record["se"][metric] is None:
        return 0.0
    return 100 * record["se"][metric] / base["ours"][metric]


def save(fig, path):
    import matplotlib.pyplot as plt

    with path.open("wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
    return path


def main(verb: str, ctx: Context, runs) -> int:
    return collect(ctx, runs) if verb == "collect" else plot(ctx, runs)
