"""A sweep's figures (`plot`), PNG files from the same records as its table (matplotlib, no display):

delta.png   per row and metric, the change versus the baseline in percent of it, ours with its 95%
            interval beside the reference's, on a linear axis, rows grouped as in the paper (A, B,
            C, D, E, big); with an analysis plan, perplexity's bars are the plan's estimates
            (experiments.analysis: exp(Δ log PPL) - 1) and each row carries its verdict, else the
            paired Δ over the matched base mean; the reference's noise band shaded; one or two
            bars that dwarf the rest are cut short, their values written
params.png  each row's dev figure against its parameter count, ours and the reference's, every
            point labelled without overlap
curves.png  each group's dev perplexity during training, mean over seeds with the range (only
            where the records hold learning curves)
budget.png  with an analysis plan that has readouts during training, each counted row's change versus
            the baseline at every shared dev evaluation, the plan applied there (experiments.analysis.budget)
regime.png  two sweeps' tables side by side (drawn by the `regime` verb, not `plot`): each row's
            change versus the baseline in both with the reference's, and the interaction
"""

from __future__ import annotations

import math
import re

from experiments.analysis import budget, plans
from experiments.analysis.rows import Row, dev_curves, gather, trained
from fxformer import exitcodes, png


def group_of(name: str) -> str:
    """A row's group: its name without the trailing number (A3 -> A; base, big stay)."""
    return re.sub(r"\d+$", "", name)


def plot(sweep, runs, doc: dict, directory) -> int:
    """delta.png, params.png and (where the records hold learning curves) curves.png of `runs`."""
    recs = gather(sweep, runs, doc)
    directory.mkdir(parents=True, exist_ok=True)
    judged = plans.judge(sweep, doc, plans.Plan.of(sweep)) if sweep.plan else []
    delta = delta_figure(sweep, recs, directory / "delta.png", {j.row: j for j in judged})
    written = [delta, params_figure(sweep, recs, directory / "params.png")]
    by_row: dict[str, list[dict]] = {}
    for rep in sorted(doc["replicates"], key=lambda r: r["seed"]):
        by_row.setdefault(rep["row"], []).append(rep)
    if any(dev_curves(reps, "dev_ppl") for reps in by_row.values()):
        written.append(curves_figure(sweep, runs, by_row, directory / "curves.png"))
        if plans.Plan.of(sweep).readouts and (drawn := budget.budget_figure(sweep, doc, directory / "budget.png")):
            written.append(drawn)
    print("written: " + ", ".join(str(p) for p in written))
    return exitcodes.OK


# ---------------------------------------------------------------------------------------------
# delta.png


def relative(rec: Row, base: Row | None, metric: str) -> tuple[float | None, float | None, float | None]:
    """Ours in percent of the matched base mean: (Δ, CI low, CI high); None where unknown."""
    matched = rec.matched[metric]
    if not matched or rec.delta_ours[metric] is None:
        return None, None, None
    ci = rec.ci[metric] or [None, None]
    scale = lambda v: None if v is None else 100 * v / matched  # noqa: E731
    return scale(rec.delta_ours[metric]), scale(ci[0]), scale(ci[1])


def relative_paper(rec: Row, base: Row | None, metric: str) -> float | None:
    """The reference's change in percent of its own baseline."""
    if base is None or not base.paper[metric] or rec.delta_paper[metric] is None:
        return None
    return 100 * rec.delta_paper[metric] / base.paper[metric]


def positions(recs: list[Row]) -> tuple[list[float], list[tuple[str, float, float]]]:
    """Each row's place on the y axis, one unit apart and a gap between groups, and each group's
    (name, first place, last place)."""
    places, groups, y = [], [], 0.0
    for i, rec in enumerate(recs):
        if i and group_of(rec.row) != group_of(recs[i - 1].row):
            y += 0.6
        places.append(y)
        if groups and groups[-1][0] == group_of(rec.row):
            groups[-1] = (groups[-1][0], groups[-1][1], y)
        else:
            groups.append((group_of(rec.row), y, y))
        y += 1.0
    return places, groups


def planned(j: plans.Judged | None) -> tuple[float | None, float | None, float | None]:
    """The plan's estimate of a row as percentages: (exp(Δ) - 1, and of the CI's ends)."""
    if j is None or j.estimate is None:
        return None, None, None
    return tuple(100 * math.expm1(v) for v in (j.estimate, j.low, j.high))


def noise_band(sweep, base: Row | None, metric: str) -> float | None:
    """The reference's noise band in percent of its baseline: 2 sqrt(2) x its per-run sd."""
    noise = sweep.noise.get(metric, {})
    if "log_sd" in noise:
        return 100 * math.expm1(2 * math.sqrt(2) * noise["log_sd"])
    if "sd" in noise and base is not None and base.paper.get(metric):
        return 100 * 2 * math.sqrt(2) * noise["sd"] / base.paper[metric]
    return None


def tick(rec: Row, j: plans.Judged | None) -> str:
    """A row's label on the y axis: its name, '(pilot)', and its verdict under the plan."""
    name = f"{rec.row} (pilot)" if rec.pilot else rec.row
    return f"{name}: {j.verdict}" if j is not None and j.verdict else name


def delta_figure(sweep, recs: list[Row], path, judged: dict | None = None):
    plt = png.pyplot()
    judged = judged or {}
    profile = sweep.profile.partition(":")[0]  # a profile's folder is a local path: not in the figure
    from matplotlib.transforms import blended_transform_factory

    base = next((r for r in recs if r.row == sweep.baseline), None)
    others = [r for r in recs if r.row != sweep.baseline]
    places, groups = positions(others)
    metrics = list(sweep.metrics)
    height = 0.3 * (places[-1] + 1 if places else 1) + 1.8
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics) + 0.6, height), sharey=True, squeeze=False)
    for ax, m in zip(axes[0], metrics):
        by_plan = m == "ppl" and bool(judged)
        ours = [planned(judged.get(r.row)) if by_plan else relative(r, base, m) for r in others]
        paper = [relative_paper(r, base, m) for r in others]
        limit = cut_at(ours, paper)
        if (band := noise_band(sweep, base, m)) is not None:
            ax.axvspan(-band, band, color="tab:orange", alpha=0.15, linewidth=0, label="paper's noise band (a tie)")
        bars(ax, places, ours, paper, profile, limit)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.margins(x=0.16)  # room for the bars' labels
        ax.grid(axis="x", alpha=0.3)
        for _, first, _ in groups[1:]:
            ax.axhline(first - 0.8, color="0.75", linewidth=0.6)
        cut = "" if limit is None else f"\nbars beyond ±{limit:.3g}% cut there (« »: their values are written)"
        how = "ours: the plan's model, exp(Δ log PPL) - 1" if by_plan else "ours: of the matched seeds"
        ax.set_xlabel(f"Δ{m.upper()} vs {sweep.baseline}, % of {sweep.baseline} ({how}){cut}")
        ax.set_title(f"{m.upper()}: {'lower' if sweep.metrics[m] == 'lower' else 'higher'} is better")
    first = axes[0][0]
    fig.legend(*first.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
    first.set_yticks(places, [tick(r, judged.get(r.row)) for r in others])
    for label, r in zip(first.get_yticklabels(), others):  # the verdict in its colour
        if (j := judged.get(r.row)) is not None and j.verdict:
            label.set_color(plans.VERDICT_COLORS[j.verdict])
    first.invert_yaxis()
    last = axes[0][-1]
    to_side = blended_transform_factory(last.transAxes, last.transData)
    for name, top, bottom in groups:
        last.text(1.02, (top + bottom) / 2, name, transform=to_side, fontweight="bold", va="center")
    verdict = "; verdicts: the analysis plan (analysis.md)" if judged else ""
    fig.suptitle(f"{sweep.name} ({profile}): change versus {sweep.baseline}, ours (95% CI) beside the paper{verdict}")
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))  # the legend below
    return png.save(fig, path)


def cut_at(ours: list[tuple], paper: list[float | None]) -> float | None:
    """Where to cut the one or two bars that dwarf the rest (more than 2.5 times the next bar's
    reach, interval included), so that the others stay readable: 1.2 times the next one's reach;
    None when no bar dwarfs the rest."""
    reach = [max(abs(v) for v in o if v is not None) for o in ours if o[0] is not None]
    reach = sorted(reach + [abs(v) for v in paper if v is not None])
    for k in (2, 1):  # two first: when both dwarf the rest, cutting the largest alone leaves the second
        if len(reach) > k and reach[-k] > 2.5 * reach[-k - 1] > 0:
            return 1.2 * reach[-k - 1]
    return None


def bars(ax, places: list[float], ours: list[tuple], paper: list[float | None], profile: str, limit=None) -> None:
    """Ours (with the interval) above the reference's at each place, each bar labelled with its
    value; a bar or interval reaching beyond ±`limit` is drawn to it, its label marked « or »."""
    clip = (lambda v: v) if limit is None else (lambda v: v if v is None else max(-limit, min(limit, v)))  # noqa: E731
    shown = [tuple(clip(v) for v in o) for o in ours]
    values = [o[0] for o in shown]
    alone = [o[0] is not None and None in o for o in shown]  # one seed: a value without an interval
    y_ours, y_paper = [p - 0.2 for p in places], [p + 0.2 for p in places]
    drawn = ax.barh(y_ours, [v or 0 for v in values], height=0.4, color="tab:blue", label=f"ours ({profile}), 95% CI")
    with_ci = [(y, o) for y, o in zip(y_ours, shown) if None not in o]
    if with_ci:
        ax.errorbar(
            [o[0] for _, o in with_ci],
            [y for y, _ in with_ci],
            xerr=[[o[0] - o[1] for _, o in with_ci], [o[2] - o[0] for _, o in with_ci]],
            fmt="none",
            ecolor="black",
            elinewidth=0.8,
            capsize=2,
        )
    for patch, one in zip(drawn.patches, alone):  # no interval: the bar hatched, not given one of width 0
        if one:
            patch.set(facecolor="white", edgecolor="tab:blue", hatch="////")
    ax.barh(y_paper, [clip(v) or 0 for v in paper], height=0.4, color="tab:gray", label="paper")
    for y, (value, lo, hi), original, one in zip(y_ours, shown, ours, alone):
        end = value if value is None else max(value, hi or value) if value >= 0 else min(value, lo or value)
        note = " (1 seed)" if one else ""
        bar_label(ax, y, original[0], end, cut=original != (value, lo, hi), note=note)  # the bar or interval cut
    for y, value in zip(y_paper, paper):
        bar_label(ax, y, value, clip(value), cut=clip(value) != value)


def bar_label(ax, y: float, value: float | None, end: float | None, cut: bool = False, note: str = "") -> None:
    if value is None:
        return
    ax.annotate(
        f"{'« ' if cut and value < 0 else ''}{value:+.1f}%{note}{' »' if cut and value >= 0 else ''}",
        (end, y),
        xytext=(3 if end >= 0 else -3, 0),
        textcoords="offset points",
        ha="left" if end >= 0 else "right",
        va="center",
        fontsize=6,
    )


# ---------------------------------------------------------------------------------------------
# params.png


def params_figure(sweep, recs: list[Row], path):
    plt = png.pyplot()

    metric = next(iter(sweep.metrics))
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    panels = []
    for ax, side, params_key in ((axes[0], "ours", "params"), (axes[1], "paper", "paper_params")):
        shown = [r for r in recs if getattr(r, params_key) and getattr(r, side)[metric] is not None]
        points = [(getattr(r, params_key) / 1e6, getattr(r, side)[metric], r.row) for r in shown]
        spread = [(r.sd[metric] or 0) if side == "ours" else 0 for r in shown]
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=spread, fmt="o", markersize=4, capsize=2)
        if points:
            log_axis(ax.xaxis)
            if metric == "ppl":  # log perplexity is the loss: equal steps in it are equal ratios
                log_axis(ax.yaxis, subs=tuple(range(1, 10)))
        ax.set_xlabel("parameters (millions, log scale)")
        ax.set_ylabel(f"dev {metric.upper()}" + (" (log scale)" if metric == "ppl" else ""))
        ax.set_title(f"ours, {sweep.profile.partition(':')[0]} (mean ± sd over seeds)" if side == "ours" else "paper")
        ax.margins(x=0.15, y=0.12)
        panels.append((ax, points))
    fig.suptitle(f"{sweep.name} ({sweep.profile.partition(':')[0]}): dev {metric.upper()} against parameters")
    fig.tight_layout()
    for ax, points in panels:
        place_labels(ax, points)
    return png.save(fig, path)


def log_axis(axis, subs: tuple[float, ...] = (1.0, 2.0, 5.0)) -> None:
    """A log scale with plain tick labels at 1, 2 and 5 of each decade (0.2, 0.5, 1, 2, ...), or `subs`."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (axis.axes.set_xscale if axis is axis.axes.xaxis else axis.axes.set_yscale)("log")
    axis.set_major_locator(LogLocator(subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def place_labels(ax, points: list[tuple[float, float, str]], fontsize: float = 8) -> list:
    """Label each point (x, y, text) where its label overlaps no other label, no marker and stays
    inside the axes: the first free place of a ring of candidates around the point, further out
    ring by ring (with a leader line), else the least crowded one. The labels' boxes (display
    coordinates), in order. Hand-written on purpose: adjustText 1.3.0 (its default forces, points
    and leader lines given) was tried on the 6,000-pair table's params.png and left labels on
    markers and error bars in the cluster of rows at 0.6M parameters, where this search leaves none."""
    from matplotlib.text import Text

    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    markers = [ax.transData.transform((x, y)) for x, y, _ in points]
    boxes = []
    for x, y, text in sorted(points, key=lambda p: (p[0], -p[1])):
        best = None
        for dx, dy in candidates():
            label = annotate(ax, x, y, text, dx, dy, fontsize)
            label.update_positions(renderer)
            box = Text.get_window_extent(label, renderer)  # the text alone, not its leader line
            crowd = sum(overlap(box, b) for b in boxes) + sum(marker_overlap(box, m) for m in markers)
            crowd += box.width * box.height - overlap(box, frame)  # the part outside the axes
            if best is None or crowd < best[0]:
                if best is not None:
                    best[1].remove()
                best = (crowd, label, box)
            else:
                label.remove()
            if crowd == 0:
                break
        boxes.append(best[2])
    return boxes


def candidates():
    """Offsets in points around a point: right, left, above, below and the diagonals, ring by ring."""
    for ring in range(1, 7):
        for angle in (0, 180, 90, 270, 30, 150, 330, 210, 60, 120, 300, 240):
            a = math.radians(angle)
            yield 7 * ring * math.cos(a), 7 * ring * math.sin(a)


def annotate(ax, x: float, y: float, text: str, dx: float, dy: float, fontsize: float):
    ha = "left" if dx > 1e-6 else "right" if dx < -1e-6 else "center"
    va = "bottom" if dy > 1e-6 else "top" if dy < -1e-6 else "center"
    far = math.hypot(dx, dy) > 8
    arrow = {"arrowstyle": "-", "color": "0.6", "linewidth": 0.5, "shrinkA": 0, "shrinkB": 3} if far else None
    return ax.annotate(
        text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=fontsize, arrowprops=arrow
    )


def overlap(a, b) -> float:
    """The area two boxes share (display units)."""
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(width, 0) * max(height, 0)


def marker_overlap(box, point, radius: float = 4.0) -> float:
    """The area a label's box shares with a marker (a square of `radius` around the point)."""
    x0, y0 = point[0] - radius, point[1] - radius
    width = min(box.x1, x0 + 2 * radius) - max(box.x0, x0)
    height = min(box.y1, y0 + 2 * radius) - max(box.y0, y0)
    return max(width, 0) * max(height, 0)


# ---------------------------------------------------------------------------------------------
# curves.png


def band(reps: list[dict], key: str = "dev_ppl") -> tuple[list[int], list[float], list[float], list[float]]:
    """A row's learning curve over its seeds whose training is over: (the steps every one of them
    logged, so up to where the first ended; mean, min, max)."""
    curves = list(dev_curves(trained(reps), key).values())
    if not curves:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    values = [[c[s] for c in curves] for s in steps]
    return steps, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def seed_lines(reps: list[dict], key: str = "dev_ppl") -> list[tuple[list[int], list[float]]]:
    """Each trained seed's own curve (steps, values), to where that seed ended: drawn thin beside
    the row's band, so that a seed that trained longer than the first to end is seen to its end."""
    out = []
    for points in dev_curves(trained(reps), key).values():
        steps = sorted(points)
        out.append((steps, [points[s] for s in steps]))
    return out


def curves_figure(sweep, runs, by_row: dict[str, list[dict]], path):
    plt = png.pyplot()

    groups = []
    for run in runs:
        if run.name != sweep.baseline and group_of(run.name) not in groups:
            groups.append(group_of(run.name))
    cols = max(1, min(3, len(groups)))
    rows = max(1, (len(groups) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, g in zip(axes.flat, groups):
        members = [run.name for run in runs if group_of(run.name) == g and run.name != sweep.baseline]
        for name in [sweep.baseline, *members]:
            steps, mean, low, high = band(by_row.get(name, []))
            style = {"color": "black", "linestyle": "--"} if name == sweep.baseline else {}
            label = name if steps else f"{name} (not run)"
            line = ax.plot(steps, mean, label=label, **style)[0]
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            for seed_steps, values in seed_lines(by_row.get(name, [])):
                ax.plot(seed_steps, values, color=line.get_color(), linestyle=line.get_linestyle(), lw=0.6, alpha=0.6)
        log_axis(ax.yaxis, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0))  # the ends of the curves, close together, read off
        ax.set_title(f"group {g}")
        ax.set_xlabel("step")
        ax.set_ylabel("dev PPL")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    what = "dev perplexity during training (mean over seeds to where the first ended, band min-max; thin: each seed)"
    fig.suptitle(f"{sweep.name} ({sweep.profile.partition(':')[0]}): {what}")
    fig.tight_layout()
    return png.save(fig, path)


# ---------------------------------------------------------------------------------------------
# regime.png


def regime_figure(first, second, moved: dict, path, noise: float | None = None):
    """Two tables of one sweep side by side (experiments.regime): per row judged in both, left its
    difference from the baseline in each table and the reference's, right the interaction (how
    that difference moves from `first` to `second`) with its 95% CI. `first`, `second`:
    (name, {row: plans.Judged}); `moved`: {row: stats.Contrast}; `noise`: the reference's
    noise band, percent. A mark or interval end beyond the cut (`cut_at`) is drawn at it, and its
    label gives the whole estimate and interval, « or » on the side beyond the cut."""
    plt = png.pyplot()
    (name_a, a), (name_b, b) = first, second
    rows = [row for row in b if row in moved]
    places = [float(i) for i in range(len(rows))]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 0.55 * len(rows) + 2.6), sharey=True, gridspec_kw={"width_ratios": [3.4, 2]}
    )
    sides = ((name_a, a, "tab:orange", "o", -0.22), (name_b, b, "tab:blue", "s", 0.0))
    regime_changes(left, sides, rows, places, noise)
    regime_interactions(right, moved, rows, places, name_a, name_b)
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    left.set_yticks(places, rows)
    left.set_ylim(len(rows) - 0.5, -0.7)  # top to bottom, room above the first row's labels
    height = fig.get_size_inches()[1]
    handles, labels = left.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (not labels[i].startswith("ours"), i))  # ours first
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"Table 3 in two regimes: {name_a} and {name_b}, dev perplexity")
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))
    return png.save(fig, path)


def regime_changes(left, sides, rows: list[str], places: list[float], noise: float | None) -> None:
    """The regime figure's left panel: each table's change versus base per row (`sides`: name,
    {row: Judged}, colour, marker, offset), its verdict written beside it, the paper's marked."""
    b = sides[-1][1]
    ours = [planned(table[row]) for _, table, *_ in sides for row in rows]
    paper = [100 * math.expm1(b[row].paper) if b[row].paper is not None else None for row in rows]
    limit = cut_at(ours, paper)
    clip = (lambda v: v) if limit is None else (lambda v: max(-limit, min(limit, v)))  # noqa: E731
    if noise is not None:
        left.axvspan(-noise, noise, color="0.5", alpha=0.15, linewidth=0, label="paper's noise band (a tie)")
    for name, table, color, marker, offset in sides:
        for i, (y, row) in enumerate(zip(places, rows)):
            value, low, high = planned(table[row])
            shown = [clip(v) for v in (value, low, high)]
            left.errorbar(
                shown[0], y + offset, xerr=[[shown[0] - shown[1]], [shown[2] - shown[0]]], fmt=marker, color=color,
                markersize=5, capsize=2, elinewidth=1, label=f"ours, {name}, 95% CI" if i == 0 else None,
            )  # fmt: skip
            verdict = table[row].verdict + (" (1 seed)" if table[row].n == 1 else "")  # its interval: the pooled sd
            text = f"{value:+.1f}% {verdict}"
            if shown != [value, low, high]:  # cut: the whole interval written, « » on the side beyond it
                cut_low, cut_high = low < -limit, high > limit
                text = f"{'« ' * cut_low}{value:+.1f}% [{low:+.1f}%, {high:+.1f}%]{' »' * cut_high} {verdict}"
            ink = plans.VERDICT_COLORS.get(table[row].verdict, "black")
            point_label(left, text, shown[0], shown[1], shown[2], y + offset, ink)
    known = [(y, value) for y, value in zip(places, paper) if value is not None]
    for i, (y, value) in enumerate(known):
        left.plot(clip(value), y + 0.22, "D", color="tab:gray", markersize=5, label="paper" if i == 0 else None)
    left.axvline(0, color="black", linewidth=0.8)
    left.margins(x=0.3)
    cut_note = "" if limit is None else f"\nmarks and intervals beyond ±{limit:.3g}% drawn to it, their values written"
    left.set_xlabel(f"Δ dev PPL vs base, % of base (exp(Δ log PPL) - 1){cut_note}")
    left.set_title("each table's change versus base; the verdict under its plan", fontsize=10)


def regime_interactions(right, moved: dict, rows: list[str], places: list[float], name_a: str, name_b: str) -> None:
    """The regime figure's right panel: each row's interaction with its 95% CI (black: excludes 0)."""
    for y, row in zip(places, rows):
        c = moved[row]
        value, lo, hi = (100 * math.expm1(v) for v in (c.estimate, *c.interval()))
        color = "black" if c.p() < 0.05 else "0.55"
        right.errorbar(value, y, xerr=[[value - lo], [hi - value]], fmt="o", color=color, markersize=5, capsize=2)
        right.annotate(  # above the mark: a label beside a long interval would leave the axes
            f"{value:+.1f}% [{lo:+.1f}%, {hi:+.1f}%]", (value, y), xytext=(0, 5), textcoords="offset points",
            ha="center", va="bottom", fontsize=6.5,
        )  # fmt: skip
    right.axvline(0, color="black", linewidth=0.8)
    right.margins(x=0.2)
    right.set_xlabel(f"interaction, %\nexp(Δ log PPL in {name_b} - in {name_a}) - 1")
    right.set_title("the change with the regime, 95% CI (black: excludes 0)", fontsize=10)


def point_label(ax, text: str, value: float, low: float, high: float, y: float, color: str) -> None:
    """`text` beside a mark and its interval, on the side away from 0."""
    ahead = value >= 0
    ax.annotate(
        text, (high if ahead else low, y), xytext=(4 if ahead else -4, 0), textcoords="offset points",
        ha="left" if ahead else "right", va="center", fontsize=6.5, color=color,
    )  # fmt: skip
