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


def rounded(value, digits: int = 10):
    """`value` with every float in it (nested in dicts, lists, tuples) to `digits` significant
    figures: the last bits of a computation differ between CPUs and BLAS builds, so a results
    file rebuilds byte for byte on any machine only from numbers rounded well above them."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {key: rounded(v, digits) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


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


# ---------------------------------------------------------------------------------------------
# The analysis plan (experiments/results/table3-regime/PLAN.md): every row against the baseline on
# the log scale from one model of all rows, two families of tests each corrected by Holm's method,
# and a verdict from both. statsmodels fits the model, `holm` corrects the p-values; scipy gives the
# t and F distributions; the tests check them against closed forms (Holm against statsmodels' too).

SCREEN_ALPHA = 0.01  # a row whose variance exceeds the pool of the others' at this level is tested alone (Welch)
MARGINS = (0.02, 0.05, 0.10)  # equivalence margins, as relative changes of the metric (log(1 + m) on the log scale)
AGREES, DISAGREES, EQUIVALENT, INCONCLUSIVE = "agrees", "disagrees", "equivalent", "inconclusive"
VERDICTS = (AGREES, DISAGREES, EQUIVALENT, INCONCLUSIVE)  # the only words a verdict is written in


@dataclasses.dataclass(frozen=True)
class Contrast:
    """A row against the baseline: the difference of their mean log values (row - base), its
    standard error and degrees of freedom, the row's number of values, and how it was estimated:
    'pooled' (the model of all rows, one residual variance) or 'welch' (the row's and the base's
    own variances, Welch-Satterthwaite degrees of freedom). The tests follow from these four."""

    estimate: float
    se: float
    df: float
    n: int
    method: str = "pooled"

    def p(self) -> float:
        """Two-sided p of the difference test (H0: no difference)."""
        from scipy import stats as scipy_stats

        if self.se == 0:
            return 1.0 if self.estimate == 0 else 0.0
        return float(2 * scipy_stats.t.sf(abs(self.estimate / self.se), self.df))

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        """The two-sided `level` confidence interval of the difference."""
        from scipy import stats as scipy_stats

        half = float(scipy_stats.t.ppf(0.5 + level / 2, self.df)) * self.se
        return self.estimate - half, self.estimate + half

    def p_equivalent(self, margin: float) -> float:
        """TOST: the larger of the two one-sided p's of H0 'difference <= -margin' and H0 'difference
        >= +margin' (margin on the log scale); small when the difference lies inside +-margin."""
        from scipy import stats as scipy_stats

        if self.se == 0:
            return 0.0 if abs(self.estimate) < margin else 1.0
        lower = scipy_stats.t.sf((self.estimate + margin) / self.se, self.df)
        upper = scipy_stats.t.cdf((self.estimate - margin) / self.se, self.df)
        return float(max(lower, upper))


def variance_outliers(groups: dict[str, list[float]], alpha: float = SCREEN_ALPHA) -> set[str]:
    """The rows whose sample variance is larger than the pooled variance of all the other rows by a
    one-sided F test at `alpha` (rows of one value cannot be tested and stay in the pool)."""
    from scipy import stats as scipy_stats

    sums = {row: (len(v) - 1, (len(v) - 1) * statistics.variance(v)) for row, v in groups.items() if len(v) >= 2}
    out = set()
    for row, (df, ss) in sums.items():
        rest_df = sum(d for r, (d, _) in sums.items() if r != row)
        rest_ss = sum(s for r, (_, s) in sums.items() if r != row)
        if rest_df and rest_ss > 0 and scipy_stats.f.sf((ss / df) / (rest_ss / rest_df), df, rest_df) < alpha:
            out.add(row)
    return out


def pooled(groups: dict[str, list[float]], base: str) -> dict[str, Contrast]:
    """Every row of `groups` ({row: values}) against `base` by ordinary least squares with the row as
    a fixed effect (an intercept for the base, one indicator per other row; statsmodels): each
    row's coefficient is its difference from the base, with the residual variance pooled over all
    rows (degrees of freedom: values - rows)."""
    import numpy as np
    import statsmodels.api as sm

    others = [row for row in groups if row != base]
    y, x = [], []
    for row in [base, *others]:
        for value in groups[row]:
            y.append(value)
            x.append([1.0] + [1.0 if row == other else 0.0 for other in others])
    fit = sm.OLS(np.asarray(y), np.asarray(x)).fit()
    return {
        row: Contrast(float(fit.params[j + 1]), float(fit.bse[j + 1]), float(fit.df_resid), len(groups[row]))
        for j, row in enumerate(others)
    }


def blocked(values: dict[str, dict[int, float]], base: str) -> dict[str, Contrast]:
    """Every row against `base` by ordinary least squares with the row and the seed as fixed effects
    (an intercept for base's seed 0, an indicator per other row and per other seed; statsmodels):
    seed s of every row shares its data order, and this model takes out what a seed does to all rows
    alike. Residual variance pooled; degrees of freedom: values - rows - seeds + 1. Method 'blocked'."""
    import numpy as np
    import statsmodels.api as sm

    others = [row for row in values if row != base]
    seeds = sorted({seed for row in values.values() for seed in row})
    y, x = [], []
    for row in [base, *others]:
        for seed, value in sorted(values[row].items()):
            y.append(value)
            x.append([1.0] + [float(row == r) for r in others] + [float(seed == s) for s in seeds[1:]])
    if len(y) <= len(x[0]):
        return {}
    fit = sm.OLS(np.asarray(y), np.asarray(x)).fit()
    return {
        row: Contrast(float(fit.params[j + 1]), float(fit.bse[j + 1]), float(fit.df_resid), len(values[row]), "blocked")
        for j, row in enumerate(others)
        if len(values[row]) >= 1
    }


def welch(row: list[float], base: list[float]) -> Contrast:
    """`row` against `base` with each one's own variance (scipy's Welch t-test for its degrees of freedom)."""
    from scipy import stats as scipy_stats

    result = scipy_stats.ttest_ind(row, base, equal_var=False)
    se = math.sqrt(statistics.variance(row) / len(row) + statistics.variance(base) / len(base))
    return Contrast(statistics.fmean(row) - statistics.fmean(base), se, float(result.df), len(row), "welch")


def contrasts(groups: dict[str, list[float]], base: str, alpha: float = SCREEN_ALPHA) -> dict[str, Contrast]:
    """The plan's estimates: every row against `base` from the pooled model over the rows that pass
    the variance screen (`variance_outliers`); a row that fails it is tested alone with Welch's
    test, and every row is if the base fails it. A row needs 2 values for Welch, the base 2 for any."""
    groups = {row: list(v) for row, v in groups.items() if v}
    if len(groups.get(base, ())) < 2:
        return {}
    outliers = variance_outliers(groups, alpha)
    alone = set(groups) - {base} if base in outliers else outliers
    out = {row: welch(groups[row], groups[base]) for row in alone if len(groups[row]) >= 2}
    pool = {row: v for row, v in groups.items() if row not in alone}
    if len(pool) > 1 and sum(len(v) for v in pool.values()) > len(pool):
        out.update(pooled(pool, base))
    return {row: out[row] for row in groups if row in out}


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values over one family; NaN counts as 1. The i-th smallest of m
    p-values becomes the running maximum of (m - i) x p over the first i + 1, at most 1. Written
    out rather than statsmodels' multipletests (the same values: tests/test_stats_plan.py), which
    runs a full garbage collection on every call: seconds in a process that holds JAX."""
    rows = sorted(pvalues, key=lambda row: 1.0 if math.isnan(pvalues[row]) else pvalues[row])
    out, running = {}, 0.0
    for i, row in enumerate(rows):
        p = 1.0 if math.isnan(pvalues[row]) else pvalues[row]
        running = max(running, min(1.0, (len(rows) - i) * p))
        out[row] = running
    return {row: out[row] for row in pvalues}


def verdict(difference: int, equivalent: bool, reference: int) -> str:
    """A row's verdict, the one rule of every table, figure and JSON: the plan's (its Holm-corrected
    tests) and the uncorrected paired view's (no equivalence test: `equivalent` False) alike.
    `difference`: the sign of a significant difference, 0 if not; `equivalent`: the equivalence
    (TOST) test's verdict; `reference`: the reference's direction, 0 for its tie.
    - The reference shows a direction: agrees / disagrees by the sign of a significant difference
      (significant and inside the margin too: the sign decides; the table shows the estimate
      beside the margin); else equivalent (ours inside the margin where the reference moved);
      else inconclusive.
    - The reference ties: agrees where ours is equivalent (significant or not: a difference smaller
      than the margin); disagrees where ours is significant and not equivalent; else inconclusive."""
    if reference:
        if difference:
            return AGREES if difference == reference else DISAGREES
        return EQUIVALENT if equivalent else INCONCLUSIVE
    if equivalent:
        return AGREES
    return DISAGREES if difference else INCONCLUSIVE


def interaction(first: Contrast, second: Contrast) -> Contrast:
    """How a row's difference from the baseline changes from one table to another (second - first),
    two independent estimates: the SEs add in quadrature, Welch-Satterthwaite degrees of freedom."""
    a, b = first.se**2, second.se**2
    df = (a + b) ** 2 / (a**2 / first.df + b**2 / second.df) if a + b else first.df + second.df
    return Contrast(second.estimate - first.estimate, math.sqrt(a + b), df, min(first.n, second.n), "interaction")


def power_difference(effect: float, se: float, df: float, alpha: float) -> float:
    """The power of the two-sided difference test at level `alpha` against a true difference
    `effect` (log scale), for a contrast of standard error `se` (noncentral t, scipy)."""
    from scipy import stats as scipy_stats

    critical, shift = scipy_stats.t.ppf(1 - alpha / 2, df), effect / se
    return float(scipy_stats.nct.sf(critical, df, shift) + scipy_stats.nct.cdf(-critical, df, shift))


def power_equivalence(margin: float, se: float, df: float, alpha: float) -> float:
    """The power of TOST at level `alpha` (margin on the log scale) when the true difference is 0:
    P(|estimate| + t(1 - alpha, df) * se < margin) with the SE taken as known, 2 T(margin / se -
    t) - 1, 0 where negative (an approximation: it ignores the spread of the estimated SE)."""
    from scipy import stats as scipy_stats

    z = margin / se - scipy_stats.t.ppf(1 - alpha, df)
    return max(0.0, float(2 * scipy_stats.t.cdf(z, df) - 1))


def contrast_se(sd: float, n_row: int, n_base: int) -> float:
    """The standard error of a row-minus-base difference of means with a common sd."""
    return sd * math.sqrt(1 / n_row + 1 / n_base)


def base_seeds(n_row: int, rows: int) -> int:
    """Dunnett's allocation: the baseline, compared with every one of `rows` rows, gets about
    sqrt(rows) times a row's seeds."""
    return math.ceil(n_row * math.sqrt(rows))


def choose_margin(sd: float, n_row: int, n_base: int, df: float, rows: int, power: float = 0.8) -> float | None:
    """The plan's margin rule: the smallest of MARGINS at which TOST has `power` for a row with no
    true difference, at Holm's strictest level (ALPHA / rows); None if none has."""
    se = contrast_se(sd, n_row, n_base)
    for m in MARGINS:
        if power_equivalence(math.log1p(m), se, df, ALPHA / rows) >= power:
            return m
    return None
