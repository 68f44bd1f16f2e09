"""budget.png: each counted row's change against the baseline over the training budget, from the
dev curves. At every evaluation step the rows' finished runs share, the analysis plan is applied
as at its own readouts (`step:N`: one pooled model, Holm over the rows counted there), giving the
row's estimate with its 95% CI and its verdict; a panel per row draws them against the step, the
reference's change and its noise band beside, the plan's readouts marked (the last step is the
plan's `final`: each run's last evaluation). Where a verdict would have been another had training
stopped earlier, the colour of the points changes there. Drawn for sweeps whose runs all ran one
budget (the regime table's 5,300 steps), not for plateau-stopped ones.
"""

from __future__ import annotations

import dataclasses
import math

from experiments.analysis import plans
from fxformer import png

COLUMNS = 4


def shared_steps(doc: dict, rows: set[str], key: str) -> list[int]:
    """The steps at which every finished run of `rows` has a dev value of `key` in its curve; none
    unless every one of them ran the same budget (a plateau rule that ended runs at different steps
    leaves no common budget to draw over)."""
    steps, ends = None, set()
    for rep in doc["replicates"]:
        if rep["row"] in rows and rep["state"] == "finished":
            have = {p["step"] for p in rep.get("curve", []) if isinstance(p.get(key), (int, float))}
            steps, ends = (have if steps is None else steps & have), ends | {rep["step"]}
    return sorted(steps) if steps and len(ends) == 1 and max(steps) in ends else []


def over_budget(sweep, doc: dict, plan: plans.Plan) -> tuple[list[int], dict[str, list[plans.Judged]]]:
    """(steps, {counted row: its Judged at each step}) under `plan` read at each shared step."""
    counted = [j.row for j in plans.judge(sweep, doc, plan) if j.counted and j.estimate is not None]
    steps = shared_steps(doc, {*counted, sweep.baseline}, f"dev_{plan.metric}")
    by_row: dict[str, list[plans.Judged]] = {row: [] for row in counted}
    for step in steps:
        at = {j.row: j for j in plans.judge(sweep, doc, dataclasses.replace(plan, readout=f"step:{step}"))}
        for row in counted:
            by_row[row].append(at[row])
    return steps, by_row


def budget_figure(sweep, doc: dict, path):
    """Draw budget.png to `path`; None where fewer than three shared steps or no counted row."""
    plan = plans.Plan.of(sweep)
    steps, by_row = over_budget(sweep, doc, plan)
    if len(steps) < 3 or not by_row:
        return None
    plt = png.pyplot()
    rows = list(by_row)
    lines = math.ceil(len(rows) / COLUMNS)
    fig, axes = plt.subplots(lines, COLUMNS, figsize=(3.2 * COLUMNS, 2.4 * lines + 1.0), sharex=True, squeeze=False)
    marks = [int(r.removeprefix("step:")) for r in plan.readouts if r.startswith("step:")]
    band = 100 * math.expm1(2 * math.sqrt(2) * plan.paper_log_sd)
    for ax, row in zip(axes.flat, rows):
        row_panel(ax, row, steps, by_row[row], marks, band)
    for ax in list(axes.flat)[len(rows) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"Δ dev {plan.metric.upper()} vs base, %")
    legend = [plt.Line2D([], [], marker="o", linestyle="", color=c, label=v) for v, c in plans.VERDICT_COLORS.items()]
    legend.append(plt.Line2D([], [], linestyle="--", color="tab:gray", label="paper"))
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8)
    name = sweep.profile.partition(":")[0]
    fig.suptitle(f"{sweep.name} ({name}): each row's change versus base over the budget, the plan read at each step")
    fig.tight_layout(rect=(0, 0.5 / fig.get_size_inches()[1], 1, 1))
    return png.save(fig, path)


def row_panel(ax, row: str, steps: list[int], judged: list[plans.Judged], marks: list[int], band: float) -> None:
    """One row: its estimate and 95% CI at each step, coloured by its verdict there."""
    value = [100 * math.expm1(j.estimate) for j in judged]
    low, high = [100 * math.expm1(j.low) for j in judged], [100 * math.expm1(j.high) for j in judged]
    ax.axhspan(-band, band, color="0.5", alpha=0.15, linewidth=0)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.fill_between(steps, low, high, color="tab:blue", alpha=0.18, linewidth=0)
    ax.plot(steps, value, color="tab:blue", linewidth=0.8)
    colors = [plans.VERDICT_COLORS.get(j.verdict, "black") for j in judged]
    ax.scatter(steps, value, c=colors, s=10, zorder=3)
    if judged[-1].paper is not None:
        ax.axhline(100 * math.expm1(judged[-1].paper), color="tab:gray", linestyle="--", linewidth=0.8)
    for step in (*marks, steps[-1]):
        ax.axvline(step, color="0.6", linestyle=":", linewidth=0.8)
    read = [j.verdict for s, j in zip(steps, judged) if s in (*marks, steps[-1])]
    ax.set_title(f"{row}: {' → '.join(read)}", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
