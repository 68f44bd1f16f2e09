"""Ensembles: several trained runs that share a vocabulary, searched and scored as one model.

At every position each member computes its own next-token distribution (from its own decoder
cache) and the ensemble's is their combination (`combine`):

- `"probabilities"` (the default, fairseq's `--path a.pt:b.pt`): the average of the members'
  probabilities, log((1/n) sum_i p_i) = logsumexp_i(log p_i) - log n;
- `"log_probabilities"` (Marian's): the average of their log-probabilities, renormalized to a
  distribution, log_softmax((1/n) sum_i log p_i). Marian sums the members' weighted
  log-probabilities without renormalizing; fxformer renormalizes, so that an ensemble's scores
  and perplexity are those of a distribution, as a single model's are (a named departure).

Every search (greedy, beam, sampling), `score` and the perplexity `evaluate` reports take the
combined distribution. The members may differ in size, step and options (a Table 3 row beside
base); they must share the tokenizer (its model file's bytes: the same pieces, hence the same
special ids). An ensemble of one is its member itself: `combine` returns its log-probabilities
untouched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from fxformer.errors import UserError

AVERAGES = ("probabilities", "log_probabilities")


def check_average(average: str) -> str:
    """`average` if it is one of `AVERAGES`, else refused in one sentence."""
    if average not in AVERAGES:
        raise UserError(f"An ensemble averages {' or '.join(AVERAGES)}, not {average!r}.")
    return average


def combine(log_probs: Sequence[jax.Array], average: str = "probabilities") -> jax.Array:
    """The ensemble's log-probabilities [..., vocab] from each member's (normalized) ones, as
    `average` says (module docstring); one member's are returned as they are."""
    if len(log_probs) == 1:
        return log_probs[0]
    stacked = jnp.stack([x.astype(jnp.float32) for x in log_probs])
    if check_average(average) == "probabilities":
        return jax.nn.logsumexp(stacked, axis=0) - math.log(len(log_probs))
    mean = stacked.mean(axis=0)
    return mean - jax.nn.logsumexp(mean, axis=-1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class Ensemble:
    """The members' models (`fxformer.model.Transformer`, in decode order) and how their
    distributions are combined: what `fxformer.inference` takes in place of one model, with a
    tuple of the members' parameters in place of one tree. Hashable, so that a compiled search or
    score is kept per ensemble."""

    models: tuple
    average: str = "probabilities"

    def __post_init__(self):
        check_average(self.average)

    @property
    def max_len(self) -> int:
        """The positions every member can encode and decode: the smallest member's `max_len`."""
        return min(model.config.max_len for model in self.models)


def of(model) -> Ensemble:
    """`model` as an ensemble: itself if it is one, else an ensemble of that one model."""
    return model if isinstance(model, Ensemble) else Ensemble((model,))


def params_of(model, params) -> tuple:
    """The members' parameters as a tuple, in `of(model)`'s order."""
    return tuple(params) if isinstance(model, Ensemble) else (params,)


def check_tokenizers(names: Sequence[str], tokenizers: Sequence) -> None:
    """Refuse, in one sentence naming the two runs, members whose tokenizers differ (the bytes of
    their model files: the same pieces, ids and special tokens); None (a run without one) is left
    to the restore to refuse."""
    for name, tokenizer in zip(names[1:], tokenizers[1:]):
        if None not in (tokenizer, tokenizers[0]) and tokenizer.proto != tokenizers[0].proto:
            raise UserError(
                f"{names[0]} and {name} have different tokenizers: an ensemble's members must share one "
                "(the same tokenizer.model, hence the same vocabulary and special ids)."
            )
