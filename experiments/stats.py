"""The statistics of a replicated sweep: mean and spread over seeds, differences from the
baseline paired by seed with their standard error, and when a difference is a direction.

Plain Python (no numpy), so the no-JAX launcher keeps its light imports.
"""

from __future__ import annotations

import math
import statistics

TIE_SE = 2.0  # a mean paired difference within 2 standard errors of 0 is a tie (about 95%)


def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation); sd is None for fewer than two values, both for none."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def paired(row: dict[int, float], base: dict[int, float]) -> tuple[float | None, float | None, int]:
    """(mean difference row - base over the seeds both have, its standard error, pairs). The SE is
    the pairs' sample sd over sqrt(pairs), None for a single pair."""
    diffs = [row[k] - base[k] for k in sorted(row.keys() & base.keys())]
    mean, sd = mean_sd(diffs)
    return mean, None if sd is None else sd / math.sqrt(len(diffs)), len(diffs)


def sign(difference: float | None, se: float | None, tie_se: float = TIE_SE) -> int | None:
    """+1 or -1 where |difference| > tie_se standard errors, 0 for a tie, None where it cannot be said."""
    if difference is None or se is None:
        return None
    if abs(difference) <= tie_se * se:
        return 0
    return 1 if difference > 0 else -1


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
