"""Greedy and beam search against brute-force enumeration and teacher-forced scoring."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fxformer import decode
from fxformer.model import Transformer, TransformerConfig
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID

# Vocabulary: PAD 0, UNK 1, BOS 2, EOS 3, and words 4, 5. Decoders never produce PAD or BOS.
TINY = TransformerConfig(vocab_size=6, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, max_len=16)
OUTPUT_TOKENS = [1, 4, 5]  # besides EOS


def tiny_params(seed, config=TINY):
    params = Transformer(config).init(jax.random.key(seed), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
    # Sharpen the random model so that hypotheses differ clearly in probability.
    return jax.tree.map(lambda x: 3 * x, params["params"])


def teacher_forced_logprob(params, inputs, outputs, config=TINY):
    """Sum of log p(y_t | y_<t, x) over each output (up to and including EOS), by a full forward pass."""
    targets = np.zeros((len(outputs), max(map(len, outputs))), np.int32)
    for i, y in enumerate(outputs):
        targets[i, : len(y)] = y
    inputs = np.repeat(np.asarray(inputs), len(outputs), axis=0)
    logits = Transformer(config).apply({"params": params}, jnp.asarray(inputs), jnp.asarray(targets))
    log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
    return np.array([sum(log_probs[i, t, y[t]] for t in range(len(y))) for i, y in enumerate(outputs)])


def penalty(length, alpha):
    return ((5 + length) / 6) ** alpha


def all_outputs(limit):
    """Every possible output: words then EOS (shorter than the limit), or `limit` words without EOS."""
    outs = []
    for n in range(limit):
        outs += [list(w) + [EOS_ID] for w in itertools.product(OUTPUT_TOKENS, repeat=n)]
    outs += [list(w) for w in itertools.product(OUTPUT_TOKENS, repeat=limit)]
    return outs


@pytest.mark.parametrize("seed, alpha", [(0, 0.6), (1, 0.6), (2, 0.0), (3, 1.0)])
def test_wide_beam_finds_the_brute_force_best(seed, alpha):
    params = tiny_params(seed)
    inputs = np.array([[4, EOS_ID]])  # input length 2, so outputs may have 2 + 2 = 4 tokens
    max_extra = 2
    candidates = all_outputs(limit=4)  # 40 ending in EOS + 81 cut at the limit
    scores = teacher_forced_logprob(params, inputs, candidates) / np.array([penalty(len(y), alpha) for y in candidates])
    order = np.argsort(-scores)
    outputs, beam_scores = decode.beam_search(TINY, params, jnp.asarray(inputs), 128, alpha, max_extra)
    assert beam_scores[0, 0] == pytest.approx(scores[order[0]], abs=1e-5)
    if scores[order[0]] - scores[order[1]] > 1e-4:
        best = candidates[order[0]]
        assert list(np.asarray(outputs[0, 0, : len(best)])) == best
    # The beam held every hypothesis: its finished scores are the top 121 of the enumeration.
    np.testing.assert_allclose(np.asarray(beam_scores[0, : len(candidates)]), scores[order], rtol=1e-6, atol=1e-5)


def trimmed(sequence):
    """An output row up to and including EOS (or all of it, if cut at the limit)."""
    sequence = [int(t) for t in sequence if t != PAD_ID]
    return sequence[: sequence.index(EOS_ID) + 1] if EOS_ID in sequence else sequence


def test_scores_are_length_penalised_teacher_forced_logprobs():
    config = dataclasses.replace(TINY, vocab_size=12)
    params = tiny_params(4, config)
    inputs = np.array([[4, 5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID, PAD_ID]])
    outputs, scores = decode.beam_search(config, params, jnp.asarray(inputs), beam_size=4, alpha=0.6, max_extra=5)
    for i in range(2):
        for j in range(4):
            y = trimmed(outputs[i, j])
            want = teacher_forced_logprob(params, inputs[i : i + 1], [y], config)[0] / penalty(len(y), 0.6)
            assert float(scores[i, j]) == pytest.approx(want, abs=1e-4)
        assert (np.diff(np.asarray(scores[i])) <= 0).all()  # best first
    assert len(trimmed(outputs[1, 0])) <= 3 + 5  # input length + max_extra


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_size_one_is_greedy(alpha):
    config = dataclasses.replace(TINY, vocab_size=12)
    for seed in range(3):
        params = tiny_params(seed, config)
        inputs = jnp.array([[4, 5, 6, EOS_ID], [7, EOS_ID, PAD_ID, PAD_ID], [8, 9, 10, 11]])
        beam, beam_scores = decode.beam_search(config, params, inputs, beam_size=1, alpha=alpha, max_extra=6)
        greedy, greedy_logp = decode.greedy_search(config, params, inputs, max_extra=6)
        np.testing.assert_array_equal(np.asarray(beam[:, 0]), np.asarray(greedy))
        lengths = np.array([len(trimmed(row)) for row in np.asarray(greedy)])
        np.testing.assert_allclose(np.asarray(beam_scores[:, 0]), greedy_logp / penalty(lengths, alpha), atol=1e-5)


def test_greedy_is_the_argmax_of_the_full_forward_pass():
    config = dataclasses.replace(TINY, vocab_size=12)
    params = tiny_params(7, config)
    inputs = np.array([[4, 5, EOS_ID]])
    greedy, _ = decode.greedy_search(config, params, jnp.asarray(inputs), max_extra=4)
    y = trimmed(np.asarray(greedy[0]))
    logits = Transformer(config).apply({"params": params}, jnp.asarray(inputs), jnp.asarray([y]))
    logits = np.asarray(logits[0]).copy()
    logits[:, [PAD_ID, BOS_ID]] = -np.inf
    assert list(logits.argmax(-1)) == y


# Cases where a hypothesis that finishes late beats `beam_size` earlier finished ones (found by
# searching seeds): stopping as soon as the beam has finished hypotheses, or bounding a live
# hypothesis without its length penalty, returns something else here.
@pytest.mark.parametrize("seed, scale, alpha", [(3, 0.5, 2.0), (3, 1.0, 2.0), (9, 1.0, 2.0), (0, 1.0, 0.6)])
def test_early_stopping_changes_nothing(seed, scale, alpha):
    """Stopping once no live hypothesis can win must give what searching to the end gives."""
    config = dataclasses.replace(TINY, vocab_size=12)
    inputs = jnp.array([[4, 5, 6, EOS_ID], [7, EOS_ID, PAD_ID, PAD_ID], [8, 9, 10, 11]])
    params = jax.tree.map(lambda x: x / 3 * scale, tiny_params(seed, config))
    early = decode.beam_search(config, params, inputs, beam_size=4, alpha=alpha, max_extra=8)
    full = decode.beam_search(config, params, inputs, beam_size=4, alpha=alpha, max_extra=8, early_stop=False)
    np.testing.assert_array_equal(np.asarray(early[0]), np.asarray(full[0]))
    np.testing.assert_allclose(np.asarray(early[1]), np.asarray(full[1]), atol=1e-6)
