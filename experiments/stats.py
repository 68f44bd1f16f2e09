"""The statistics of a replicated sweep: mean and spread over seeds, differences from the
baseline paired by seed, and when a difference is a direction: a paired t-test on the
seed-matched differences (row seed k - base seed k), two-sided, a direction where p < 0.05,
with the 95% confidence interval of the mean difference; and the reference's ties.

Plain Python but for the test itself (scipy.stats, imported when a test is made), so the
no-JAX launcher keeps its light imports.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

ALPHA = 0.05  # two-sided: a paired difference is a direction where the t-test's p < ALPHA, else a tie
LEVEL = 0.95  # the confidence interval of a mean paired difference


def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation); sd is None for fewer than two values, both for none."""
    if not values:
        return None, None
    if len(values) < 2:
        return statistics.fmean(values), None
    mean = statistics.fmean(values)  # the sd by its formula: statistics.stdev raises on a NaN (a diverged run)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@dataclasses.dataclass(frozen=True)
class Paired:
    """A row against the baseline over the seeds both have: the mean difference (row seed k -
    base seed k), its standard error, the number of pairs, the mean of the base seeds in those
    pairs (the matched base: matched + mean = the mean of the row's paired seeds), and the
    paired t-test: t, its degrees of freedom (pairs - 1), the two-sided p and the 95% interval
    of the mean difference. None where it cannot be said (no pair; one pair has no spread)."""

    mean: float | None = None
    se: float | None = None
    pairs: int = 0
    matched: float | None = None
    t: float | None = None
    df: int | None = None
    p: float | None = None
    low: float | None = None
    high: float | None = None


def paired(row: dict[int, float], base: dict[int, float]) -> Paired:
    """`row` against `base` ({seed: value} each), paired by seed."""
    seeds = sorted(row.keys() & base.keys())
    if not seeds:
        return Paired()
    diffs = [row[k] - base[k] for k in seeds]
    mean, sd = mean_sd(diffs)
    matched = statistics.fmean(base[k] for k in seeds)
    if sd is None:
        return Paired(mean, None, 1, matched)
    t, p, low, high = t_test([row[k] for k in seeds], [base[k] for k in seeds])
    return Paired(mean, sd / math.sqrt(len(seeds)), len(seeds), matched, t, len(seeds) - 1, p, low, high)


def t_test(row: list[float], base: list[float]) -> tuple[float | None, float, float, float]:
    """scipy's paired t-test of `row` against `base` (same length, 2 or more): (t, two-sided p,
    the LEVEL interval of the mean difference). Differences that are all equal have no spread
    to test against: t is None, p is 0 (1 where they are all 0) and the interval that value; a NaN
    difference (a diverged run) gives NaN p and interval, which `sign` reads as a tie."""
    diffs = [r - b for r, b in zip(row, base)]
    if any(math.isnan(d) for d in diffs):  # a diverged run: no evidence either way (max/min skip a NaN)
        return None, math.nan, math.nan, math.nan
    if max(diffs) == min(diffs):
        return None, 0.0 if diffs[0] else 1.0, diffs[0], diffs[0]
    from scipy import stats as scipy_stats

    result = scipy_stats.ttest_rel(row, base)
    interval = result.confidence_interval(LEVEL)
    return float(result.statistic), float(result.pvalue), float(interval.low), float(interval.high)


def sign(test: Paired, alpha: float = ALPHA) -> int | None:
    """+1 or -1 where the paired t-test gives p < alpha, 0 for a tie, None where it cannot be said."""
    if test.mean is None or test.p is None:
        return None
    if not test.p < alpha:  # a NaN p (a diverged run's NaN) is no evidence either: a tie
        return 0
    return 1 if test.mean > 0 else -1


def reference_sign(difference: float | None, base: float | None, noise: dict) -> int | None:
    """The reference's direction, a tie where its difference is within two standard deviations of
    the difference of two single runs (2 * sqrt(2) * sd): `noise` gives the per-run sd, either of
    the log of the metric (`log_sd`, e.g. log-perplexity) or of the metric itself (`sd`)."""
    if difference is None:
        return None
    if "log_sd" in noise and base:
        size, threshold = abs(math.log((base + difference) / base)), 2 * math.sqrt(2) * noise["log_sd"]
    elif "sd" in noise:
        size, threshold = abs(difference), 2 * math.sqrt(2) * noise["sd"]
    else:
        size, threshold = abs(difference), 0.0
    if size <= threshold:
        return 0
    return 1 if difference > 0 else -1


def verdict(ours: int | None, reference: int | None, pairs: int) -> str:
    """agree / disagree / tie (ours within noise) for a reference direction; for a reference tie,
    'paper tie' and ours; '1 seed' (with the raw sign's verdict) where no SE exists."""
    if reference is None:
        return ""
    if pairs < 2 or ours is None:
        return "1 seed"
    if reference == 0:
        return "paper tie, ours tie" if ours == 0 else "paper tie, ours not"
    if ours == 0:
        return "tie"
    return "agree" if ours == reference else "disagree"


def late_fall(curve: dict[int, float], total_steps: int, last: float = 0.2) -> float | None:
    """How much a learning curve ({step: dev PPL}) fell in the last `last` of the training steps,
    relative to where it was: (value at the last point at or before (1 - last) x total_steps -
    value at the end) / that value. Near 0: it had levelled off; above: still falling (0.2: a
    fifth lower at the end); below 0: it ended worse. Relative to the value late in training,
    not to the whole gain, which a first evaluation far above the end would make look small.
    None where the curve has no point in the first (1 - last) of the steps, or only one point."""
    steps = sorted(curve)
    before = [s for s in steps if s <= (1 - last) * total_steps]
    if not before or before[-1] == steps[-1]:
        return None
    late = curve[before[-1]]
    return (late - curve[steps[-1]]) / late


def at_fraction(curve: dict[int, float], total_steps: int, fraction: float) -> float | None:
    """A curve's value at its last point at or before `fraction` of the training steps."""
    steps = [s for s in curve if s <= fraction * total_steps]
    return curve[max(steps)] if steps else None
