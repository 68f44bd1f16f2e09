"""The cells of a sweep's table: how each figure is written, and the columns of table.md and
table.csv, both defined by one list (`columns`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from experiments.analysis import stats
from experiments.analysis.rows import FRACTIONS, LATE, Row, more_splits


def fmt(value, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


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
    """'p=0.042', 'p<0.001'; a p that would round to the level keeps more decimals, so that
    'p=0.050' never stands beside a verdict it does not show ('p=0.0497', 'p=0.04996')."""
    if p is None:
        return ""
    if p < 0.001:
        return "p<0.001"
    for digits in (3, 4, 5, 6):
        if float(text := f"{p:.{digits}f}") != stats.ALPHA:
            return f"p={text}"
    return f"p<{stats.ALPHA:g}" if p < stats.ALPHA else f"p={p:.3g}"  # within 5e-7 of the level


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
    if rec.t[m] is not None:
        t = f"{rec.t[m]:.2f}"
    else:  # differences all equal, or a diverged seed's NaN
        t = "n/a" if math.isnan(rec.p[m]) else "no spread"
    return f"{t} ({rec.df[m]}), {p_value(rec.p[m])}"


def share(value: float | None) -> str:
    """0.2 -> '20%'; a small negative share is '0%', not '-0%'."""
    return "" if value is None else f"{round(100 * value)}%"


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
    the t-test, the paper's Δ and the paired view's verdict."""
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
        Column(
            f"{M} verdict, paired (uncorrected)",
            (f"{M} paired verdict (uncorrected)",),
            lambda r: r.direction[m],
            lambda r: [r.direction[m]],
        ),
    ]


def convergence_columns(m1: str) -> list[Column]:
    """The first metric's paired verdict along training, and how much it fell late."""
    fractions = " → ".join(fraction(f) for f in FRACTIONS)
    return [
        Column(
            f"{m1} paired verdict at {fractions} of the steps",
            tuple(f"{m1} paired verdict at {fraction(f)}" for f in FRACTIONS),
            lambda r: " → ".join(r.along),
            lambda r: r.along or [""] * len(FRACTIONS),
        ),
        Column(
            f"{m1} fall in the last {share(LATE)}",
            (f"{m1} fall last {share(LATE)}",),
            lambda r: share(r.late_fall),
            lambda r: [fmt(r.late_fall, 3)],
        ),
    ]


def steps_cell(r: Row) -> str:
    """'1000/1000' without early stopping; with it, the last steps of the seeds whose training is
    over and how many of them ended at a plateau: '2400-3600/6000, 3 of 3 at a plateau',
    '3000/3000, 0 of 3 at a plateau'."""
    if not r.criterion or not r.ends:
        return f"{r.steps}/{r.total_steps}"
    low, high = min(r.ends.values()), max(r.ends.values())
    span = f"{low}" if low == high else f"{low}-{high}"
    return f"{span}/{r.total_steps}, {r.plateaued} of {len(r.ends)} at a plateau"


def fraction(f: float) -> str:
    return {0.25: "1/4", 0.5: "1/2", 1.0: "all"}.get(f, f"{f:g}")
