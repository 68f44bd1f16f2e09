"""Early stopping, in one place: the dev evaluations since the last improvement (`counts`), the
rule the training loop asks after each dev evaluation (`EarlyStopping`), and where a run's
plateau ended it, read back from its metrics (`ended_at`, for the sweep's tables).

The rule: a run ends once `early_stopping_patience` dev evaluations of `best_metric` have passed
without an improvement, an improvement being a value better than the last improvement's by at
least `early_stopping_min_delta` of it (0: any better value). Its state is the metric's values
logged in `W/metrics.jsonl`, so a resumed run counts exactly as the uninterrupted one did (and a
run that stopped early stays stopped). Pure Python: no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import ml_collections

from fxformer import metrics, paths


def counts(values: Sequence[float], higher: bool, min_delta: float = 0.0) -> list[int]:
    """After each dev evaluation of `values` (in order), how many have passed since the last
    improvement: a value better than the reference (the last improvement's value; the first value
    is one) by at least `min_delta` of it (0.01: 1%; 0: any better value counts)."""
    out, reference, count = [], None, 0
    for value in values:
        better = reference is None or (value > reference if higher else value < reference)
        if better and (reference is None or abs(value - reference) >= min_delta * abs(reference)):
            reference, count = value, 0
        else:
            count += 1
        out.append(count)
    return out


@dataclasses.dataclass
class EarlyStopping:
    """The rule and its count for one run: `observe` each dev evaluation, then read why it ends."""

    metric: str  # best_metric ("" or patience 0: never stops early)
    patience: int
    min_delta: float
    last_step: int  # num_train_steps: the run ends there anyway
    evaluations: list[float] = dataclasses.field(default_factory=list)  # the metric's values so far

    @classmethod
    def of(cls, config: ml_collections.ConfigDict, logged: Sequence[dict], resume_step: int) -> EarlyStopping:
        """The rule of `config`, counting every evaluation `logged` up to `resume_step` (whether or
        not its best parameters were kept: a best saved after the last checkpoint is retraced)."""
        metric = config.best_metric
        values = [line[metric] for line in logged if metric and metric in line and line["step"] <= resume_step]
        patience, min_delta = config.early_stopping_patience, config.early_stopping_min_delta
        return cls(metric, patience, min_delta, config.num_train_steps, values)

    @property
    def stale(self) -> int:
        """Dev evaluations since the last improvement."""
        higher = self.metric in metrics.HIGHER_IS_BETTER
        return counts(self.evaluations, higher, self.min_delta)[-1] if self.evaluations else 0

    def observe(self, step: int, logged: dict) -> str:
        """Count the dev value in `logged` (if it has one) and say why the run ends at `step`."""
        if self.metric and self.metric in logged:
            self.evaluations.append(float(logged[self.metric]))
        return self.reason(step)

    def reason(self, step: int) -> str:
        """Why early stopping ends the run at `step`, in words; "" if it goes on (at the last
        step the run ends anyway)."""
        if self.patience and self.stale >= self.patience and step < self.last_step:
            by = f" by {100 * self.min_delta:g}%" if self.min_delta else ""
            return f"no better {self.metric}{by} in {self.patience} dev evaluations (early stopping)"
        return ""


def ended_at(
    workdir: paths.Workdir, metric: str, patience: int, lines: list[dict] | None = None, min_delta: float = 0.0
) -> int | None:
    """The step at which early stopping ended the run in `workdir`: the `patience`-th dev
    evaluation of `metric` without an improvement (`counts` with `min_delta`), when the run's
    evaluations end in such a streak; or None. `lines`: `metrics.logged(workdir)` if the caller
    has read it already."""
    if not metric or patience <= 0 or not paths.complete_steps(workdir.best):  # no best/: nothing was counted
        return None
    evals = [line for line in (metrics.logged(workdir) if lines is None else lines) if metric in line]
    streak = counts([line[metric] for line in evals], metric in metrics.HIGHER_IS_BETTER, min_delta)
    if not streak or streak[-1] < patience:
        return None
    return evals[len(evals) - 1 - (streak[-1] - patience)]["step"]
