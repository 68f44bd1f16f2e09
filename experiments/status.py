"""`experiments status`: where each run of a sweep's root stands, and how long the rest will take.

python -m experiments status table3 --root=runs/table3-mini
"""

from __future__ import annotations

import statistics

from experiments.cli import duration
from experiments.context import Context
from experiments.rowstate import RowStatus
from fxformer import exitcodes
from fxformer.errors import UserError


def show(ctx: Context, runs) -> int:
    """The table of every run (state, step, attempts, ETA, a note), the counts and the time left."""
    lines = ["| row | state | step | attempts | ETA | note |", "|---|---|---|---|---|---|"]
    counts: dict[str, int] = {}
    left = Left()
    shown = ctx.units(runs)
    names = {rep.name for rep in shown}
    budget = lambda rep: rep.resolved(ctx.extra)["num_train_steps"]  # noqa: E731  # its cap, early stopping or not
    for rep in ctx.units(ctx.sweep.runs):  # the root's other finished runs: their times estimate the rest
        if rep.name not in names:
            try:
                row = ctx.read(rep)
            except UserError:  # a damaged run outside the selection: not this command's to report
                continue
            if row.state(ctx.options.lease_s) == RowStatus.FINISHED:
                left.add(rep.run.name, RowStatus.FINISHED, row.wall_s, None, budget(rep))
    for rep in shown:
        row, cap = ctx.read(rep), budget(rep)
        state = row.state(ctx.options.lease_s)
        counts[str(state)] = counts.get(str(state), 0) + 1
        total = row.total_steps or cap
        eta = row.eta_s() if state == RowStatus.RUNNING else None
        left.add(rep.run.name, state, row.wall_s, eta, cap)
        note = row.holder(ctx.options.lease_s) or ""
        if state == RowStatus.FAILED and "last_status" in row.status:
            note = f"last exit status {row.status['last_status']}"
        if state == RowStatus.FINISHED:
            note = ", ".join(f"{m} {row.results[m]:.2f}" for m in ctx.sweep.metrics if m in row.results)
        cells = [rep.name, str(state), f"{row.step}/{total}", str(row.attempts), duration(eta) if eta else "", note]
        lines.append("| " + " | ".join(cells) + " |")
    print(f"# {ctx.sweep.name}, profile {ctx.profile}, in {ctx.root}")
    print("\n".join(lines))
    print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + left.sentence())
    return exitcodes.OK


class Left:
    """How long the unfinished runs of a sweep will take: a running one its own ETA; one not yet
    running the median training time of its row's finished seeds, else the median of every finished
    run of the root (those --only leaves out too) scaled by its step budget (the cap, where early
    stopping may end a run sooner) over theirs: big's three times the steps, three times the time;
    all of it shared by as many runs as run now (at least one)."""

    def __init__(self):
        self.walls: dict[str, list[float]] = {}
        self.budgets: list[int] = []  # the step budgets (caps) of the finished runs with a wall time
        self.waiting: list[tuple[str, int]] = []  # (row, its step budget)
        self.etas: list[float] = []

    def add(self, row: str, state: RowStatus, wall_s: float | None, eta_s: float | None, total: int) -> None:
        if state == RowStatus.FINISHED:
            if wall_s:
                self.walls.setdefault(row, []).append(wall_s)
                self.budgets.append(total)
        elif state == RowStatus.RUNNING:
            self.etas.append(eta_s or 0.0)
        elif state not in (RowStatus.SUBMITTED, RowStatus.TRAINED):  # queued elsewhere; evaluation alone left
            self.waiting.append((row, total))

    def seconds(self) -> float | None:
        """None before any run finished with a wall time (nothing to estimate by)."""
        every = [w for walls in self.walls.values() for w in walls]
        if not every or not (self.waiting or self.etas):
            return None
        typical, budget = statistics.median(every), statistics.median(self.budgets)
        work = sum(
            statistics.median(self.walls[row]) if row in self.walls else typical * total / budget
            for row, total in self.waiting
        )
        return (work + sum(self.etas)) / max(1, len(self.etas))

    def sentence(self) -> str:
        seconds = self.seconds()
        if seconds is None:
            return ""
        at = max(1, len(self.etas))
        return (
            f"; about {duration(seconds)} left, {at} at a time (runs not yet running: the median training time "
            "of their row's finished seeds, else of every finished run scaled by their step budgets; evaluation "
            "not counted)"
        )
