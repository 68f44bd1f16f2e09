"""A sweep's results beside its reference table: `collect` (markdown, CSV, JSON) and `plot` (PNG).

    python -m experiments collect table3 --root=runs/table3-mini
    python -m experiments plot    table3 --root=runs/table3-mini

Both work on a partial sweep: rows not finished show their state. Files go to R/results/
(--out=DIR elsewhere): table.md, table.csv, results.json; delta.png, params.png, curves.png.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time

from experiments.runner import Context, fmt, lookup
from fxformer import exitcodes, paths


def gather(ctx: Context, runs) -> list[dict]:
    """One record per row: its changes versus the baseline, state, results and the reference's."""
    sweep = ctx.sweep
    configs = {run.name: run.resolved(ctx.extra) for run in sweep.runs}
    base_config = configs.get(sweep.baseline, {})
    rows = {}
    for run in sweep.runs:
        row = ctx.read(run)
        info = paths.Workdir(ctx.workdir(run)).run_info
        info = json.loads(info.read_text()) if info.exists() else {}
        results = row.results or {}
        config = row.config or configs[run.name]
        rows[run.name] = {
            "row": run.name,
            "changes": changes(sweep, config, base_config) if run.name != sweep.baseline else "",
            "state": row.state(ctx.args.lease_s),
            "steps": results["checkpoint_steps"][-1] if results else row.step,
            "total_steps": config["num_train_steps"],
            "params": results.get("num_params") or info.get("num_params"),
            "devices": info.get("devices"),
            "tokens_per_batch": config["data"]["tokens_per_batch"],
            "commit": row.status.get("commit", ""),
            "results": results,
            "ours": {m: results.get(m) for m in sweep.metrics},
            "paper": {m: sweep.reference.get(run.name, {}).get(m) for m in sweep.metrics},
            "paper_params": sweep.reference.get(run.name, {}).get("params"),
        }
    base = rows.get(sweep.baseline)
    for record in rows.values():
        for side in ("ours", "paper"):
            record[f"delta_{side}"] = {
                m: None if base is None or record[side][m] is None or base[side][m] is None
                else record[side][m] - base[side][m]
                for m in sweep.metrics
            }  # fmt: skip
        record["direction"] = direction(record, sweep)
    return [rows[run.name] for run in runs]


def changes(sweep, config: dict, base: dict) -> str:
    """The table's fields whose value differs from the baseline's: 'd_k=4, d_v=4'."""
    keys = sweep.columns or {k: k for k in flat(config)}
    out = []
    for label, key in keys.items():
        try:
            value, base_value = lookup(config, key), lookup(base, key)
        except KeyError:
            continue
        if value != base_value:
            out.append(f"{label}={value}")
    return ", ".join(out)


def flat(config: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in config.items():
        keys += flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return keys


def direction(record: dict, sweep) -> str | None:
    """For the first metric: 'yes' if our change versus the baseline goes the reference's way,
    'no' if it goes the other, None where there is no reference change or no result."""
    metric = next(iter(sweep.metrics))
    ours, paper = record["delta_ours"][metric], record["delta_paper"][metric]
    if ours is None or paper is None or paper == 0 or record["row"] == sweep.baseline:
        return None
    return "yes" if (ours > 0) == (paper > 0) and ours != 0 else "no"


def header(sweep) -> list[str]:
    split = "dev" if "validation" in " ".join(sweep.eval_flags) else "test"
    cols = ["row", "changes vs base", "params ours (M)", "params paper (M)"]
    for m in sweep.metrics:
        cols += [f"{split} {m.upper()} ours", f"{split} {m.upper()} paper"]
    for m in sweep.metrics:
        cols += [f"Δ{m.upper()} ours", f"Δ{m.upper()} paper"]
    return cols + [f"{next(iter(sweep.metrics)).upper()} direction as paper", "steps", "state"]


def cells(record: dict, sweep) -> list[str]:
    out = [record["row"], record["changes"] or "—", millions(record["params"]), millions(record["paper_params"])]
    for m in sweep.metrics:
        out += [fmt(record["ours"][m]), fmt(record["paper"][m])]
    for m in sweep.metrics:
        out += [signed(record["delta_ours"][m]), signed(record["delta_paper"][m])]
    steps = f"{record['steps']}/{record['total_steps']}"
    return out + [record["direction"] or "", steps, record["state"]]


def millions(count) -> str:
    return "" if not count else f"{count / 1e6:.3g}"


def signed(value) -> str:
    return "" if value is None else f"{value:+.2f}"


def footer(ctx: Context, records: list[dict]) -> list[str]:
    finished = [r for r in records if r["results"]]
    first = finished[0]["results"] if finished else {}
    unique = lambda key: sorted({str(r[key]) for r in records if r[key]}) or ["?"]  # noqa: E731
    judged = [r for r in records if r["direction"]]
    lines = [
        f"Sweep {ctx.sweep.name}, profile {ctx.profile}, root {ctx.root}; {len(finished)} of {len(records)} rows "
        f"finished; collected {time.strftime('%Y-%m-%d %H:%M')}.",
        f"sacreBLEU: {first.get('signature', '?')}; beam {first.get('beam_size', '?')}, alpha "
        f"{first.get('alpha', '?')}; split {first.get('split', '?')}, {first.get('num_sentences', '?')} sentences; "
        "no checkpoint averaging.",
        f"Devices: {', '.join(unique('devices'))}; global batch {', '.join(unique('tokens_per_batch'))} tokens per "
        f"side per step; commit {', '.join(unique('commit'))}.",
    ]
    if judged:
        agree = sum(r["direction"] == "yes" for r in judged)
        metric = next(iter(ctx.sweep.metrics)).upper()
        lines.append(
            f"{metric} direction versus base as in the paper: {agree} of {len(judged)} rows "
            "(rows whose paper value differs from base and whose result is in)."
        )
    return lines


def markdown(ctx: Context, records: list[dict]) -> str:
    cols = header(ctx.sweep)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cells(r, ctx.sweep)) + " |" for r in records]
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


def curve(ctx: Context, run, key: str = "dev_ppl") -> tuple[list[int], list[float]]:
    """(steps, values) of a row's logged `key` (its learning curve)."""
    path = paths.Workdir(ctx.workdir(run)).metrics
    if not path.exists():
        return [], []
    points = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    points = [p for p in points if key in p]
    return [p["step"] for p in points], [p[key] for p in points]


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
            ax.bar([i + offset for i in x], [v if v is not None else 0 for v in values], width=0.4, color=color,
                   label=side if side == "paper" else f"ours ({ctx.profile})")  # fmt: skip
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
        ax.scatter([p[0] for p in points], [p[1] for p in points])
        for px, py, name in points:
            ax.annotate(name, (px, py), fontsize=8, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("parameters (millions)")
        ax.set_ylabel(f"dev {metric.upper()}")
        ax.set_title("ours" if side == "ours" else "paper")
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
                steps, values = curve(ctx, run)
                style = {"color": "black", "linestyle": "--"} if run is base_run else {}
                ax.plot(steps, values, label=run.name, **style)
            ax.set_yscale("log")
            ax.set_title(f"group {g}")
            ax.set_xlabel("step")
            ax.set_ylabel("dev PPL")
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(groups) :]:
            ax.axis("off")
        fig.suptitle(f"{sweep.name} ({ctx.profile}): dev perplexity during training")
        fig.tight_layout()
        written.append(save(fig, directory / "curves.png"))
    print("written: " + ", ".join(str(p) for p in written))
    return exitcodes.OK


def relative(record: dict, base: dict | None, side: str, metric: str) -> float | None:
    """Percent change of `metric` versus the baseline (scales differ between ours and the paper's)."""
    if base is None or record[side][metric] is None or not base[side][metric]:
        return None
    return 100 * (record[side][metric] - base[side][metric]) / base[side][metric]


def save(fig, path):
    import matplotlib.pyplot as plt

    with path.open("wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
    return path


def main(verb: str, ctx: Context, runs) -> int:
    return collect(ctx, runs) if verb == "collect" else plot(ctx, runs)
