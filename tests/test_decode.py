"""The searches against brute force and a plain-Python reference, over a fixed log-probability
table (no model to compile), and once end to end through the real model."""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fxformer import decode, inference
from fxformer.config import DecodeOptions
from fxformer.model import Transformer, TransformerConfig
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID

# Vocabulary: PAD 0, UNK 1, BOS 2, EOS 3, and words 4, 5. Searches never produce PAD or BOS.
VOCAB = 6
OUTPUT_TOKENS = [1, 4, 5]  # besides EOS


def random_table(seed, max_len, sharpness=2.0):
    """log p(next | position, the token before the previous one, the previous one): a trigram
    model that also depends on the position, so a search must carry (and reorder) history."""
    logits = sharpness * np.random.default_rng(seed).normal(size=(max_len, VOCAB, VOCAB, VOCAB))
    logits[..., [PAD_ID, BOS_ID]] = -np.inf
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def table_decoder(table, rows):
    """The table as a step function; the cache holds the shared position and each row's
    token before the previous one (what a beam reorder must move)."""

    def step(tokens, cache):
        log_probs = table[cache["t"], cache["before"], tokens]
        return log_probs, {"t": cache["t"] + 1, "before": tokens}

    return step, {"t": jnp.zeros((), jnp.int32), "before": jnp.full((rows,), BOS_ID, jnp.int32)}


def grown(cache, length):  # the table's cache has no length to grow: records the lengths asked for
    GROWN.append(length)
    return cache


GROWN = []


@functools.partial(jax.jit, static_argnames=("max_len", "beam_size", "alpha", "variant", "early_stop", "stages"))
def table_beam(table, limit, max_len, beam_size, alpha, variant="live", early_stop=True, stages=False):
    step, cache = table_decoder(table, limit.shape[0] * beam_size)
    grow = grown if stages else None
    return decode.beam_search(step, cache, limit, max_len, beam_size, alpha, variant, early_stop, grow)


@functools.partial(jax.jit, static_argnames=("max_len", "temperature", "top_k", "stages"))
def table_sample(table, limit, max_len, rng, temperature=1.0, top_k=0, stages=False):
    step, cache = table_decoder(table, limit.shape[0])
    return decode.sample_search(step, cache, limit, max_len, rng, temperature, top_k, grown if stages else None)


def table_logprob(table, y):
    before, previous, total = BOS_ID, BOS_ID, 0.0
    for t, token in enumerate(y):
        total += table[t, before, previous, token]
        before, previous = previous, token
    return total


def penalty(length, alpha):
    return ((5 + length) / 6) ** alpha


def all_outputs(limit):
    """Every possible output: words then EOS (shorter than the limit), or `limit` words without EOS."""
    outs = []
    for n in range(limit):
        outs += [list(w) + [EOS_ID] for w in itertools.product(OUTPUT_TOKENS, repeat=n)]
    outs += [list(w) for w in itertools.product(OUTPUT_TOKENS, repeat=limit)]
    return outs


def trimmed(sequence):
    """An output row up to and including EOS (or all of it, if cut at the limit)."""
    sequence = [int(t) for t in sequence if t != PAD_ID]
    return sequence[: sequence.index(EOS_ID) + 1] if EOS_ID in sequence else sequence


def reference_beam(table, limit, beam_size, alpha, variant):
    """Plain-Python beam search over the table: (finished [(score, seq)], best first)."""
    width = 2 * beam_size if variant == "t2t" else beam_size
    live, finished = [(0.0, [])], []
    for t in range(limit):
        candidates = []
        for parent, (logp, seq) in enumerate(live):
            before, previous = ([BOS_ID, BOS_ID] + seq)[-2:]
            for token in range(VOCAB):
                lp = table[t, before, previous, token]
                if np.isfinite(lp):
                    candidates.append((logp + lp, parent * VOCAB + token, seq + [token]))
        candidates.sort(key=lambda c: (-c[0], c[1]))  # top_k: higher first, lower index on ties
        top = candidates[:width]
        ends = lambda seq: seq[-1] == EOS_ID or len(seq) >= limit  # noqa: E731
        finished += [(logp / penalty(len(seq), alpha), seq) for logp, _, seq in top if ends(seq)]
        finished = sorted(finished, key=lambda f: -f[0])[:beam_size]
        live = [(logp, seq) for logp, _, seq in top if not ends(seq)][:beam_size]
        if not live:
            break
        best_possible = max(logp for logp, _ in live) / penalty(limit, alpha)
        if len(finished) == beam_size and finished[-1][0] >= best_possible:
            break
    return finished


@pytest.mark.parametrize("variant", DecodeOptions.BEAM_VARIANTS)
@pytest.mark.parametrize("seed, alpha", [(0, 0.6), (1, 0.0), (2, 1.0)])
def test_wide_beam_finds_every_hypothesis_in_brute_force_order(variant, seed, alpha):
    table = random_table(seed, max_len=5)
    candidates = all_outputs(limit=4)  # 40 ending in EOS + 81 cut at the limit
    scores = np.array([table_logprob(table, y) / penalty(len(y), alpha) for y in candidates])
    order = np.argsort(-scores)
    outputs, beam_scores = table_beam(jnp.asarray(table), jnp.array([4]), 5, 128, alpha, variant)
    np.testing.assert_allclose(np.asarray(beam_scores[0, : len(candidates)]), scores[order], rtol=1e-5, atol=1e-5)
    assert trimmed(outputs[0, 0]) == candidates[order[0]]


@pytest.mark.parametrize("variant", DecodeOptions.BEAM_VARIANTS)
@pytest.mark.parametrize("seed, beam_size, alpha", [(3, 2, 0.6), (4, 4, 0.6), (5, 3, 2.0), (6, 1, 0.6)])
def test_beam_variants_equal_a_plain_python_beam_search(variant, seed, beam_size, alpha):
    table = random_table(seed, max_len=7, sharpness=1.0)
    limits = [6, 3]  # two examples with different length limits
    outputs, scores = table_beam(jnp.asarray(table), jnp.array(limits), 7, beam_size, alpha, variant)
    for i, limit in enumerate(limits):
        want = reference_beam(table, limit, beam_size, alpha, variant)
        got = [(float(s), trimmed(o)) for s, o in zip(scores[i], outputs[i]) if np.isfinite(s)]
        assert [seq for _, seq in got] == [seq for _, seq in want]
        np.testing.assert_allclose([s for s, _ in got], [s for s, _ in want], rtol=1e-5)
        for score, seq in got:  # the n-best are scored as the table scores them, best first
            assert score == pytest.approx(table_logprob(table, seq) / penalty(len(seq), alpha), abs=1e-4)
        assert all(a >= b for (a, _), (b, _) in zip(got, got[1:]))


def test_the_t2t_variant_keeps_its_beam_full_where_the_live_one_shrinks():
    """A table where EOS is likely: the live variant's beam loses every hypothesis that ends;
    t2t refills it from its 2k candidates, so it can find a better long output. Beam 2 against
    the best of every possible output: t2t finds it for each of 40 tables, live misses some."""
    found = {"live": [], "t2t": []}
    for seed in range(40):
        table = random_table(seed, max_len=6, sharpness=1.5)
        table[:, :, :, EOS_ID] += 1.0  # EOS favoured (no longer normalized: the searches do not care)
        best = max(table_logprob(table, y) / penalty(len(y), 0.6) for y in all_outputs(5))
        for variant, hits in found.items():
            outputs, scores = table_beam(jnp.asarray(table), jnp.array([5]), 6, 2, 0.6, variant)
            y, score = trimmed(outputs[0, 0]), float(scores[0, 0])
            assert score == pytest.approx(table_logprob(table, y) / penalty(len(y), 0.6), abs=1e-4)  # its own score
            hits.append(abs(score - best) < 1e-4)
    assert all(found["t2t"]) and not all(found["live"]), {v: sum(h) for v, h in found.items()}


@pytest.mark.parametrize("variant", DecodeOptions.BEAM_VARIANTS)
@pytest.mark.parametrize("seed, alpha", [(7, 2.0), (8, 0.6), (9, 0.0)])
def test_early_stopping_changes_nothing(variant, seed, alpha):
    """Stopping once no live hypothesis can win must give what searching to the end gives."""
    table = jnp.asarray(random_table(seed, max_len=9, sharpness=0.7))
    limits = jnp.array([8, 5, 9])
    early = table_beam(table, limits, 9, 4, alpha, variant)
    full = table_beam(table, limits, 9, 4, alpha, variant, early_stop=False)
    np.testing.assert_array_equal(np.asarray(early[0]), np.asarray(full[0]))
    np.testing.assert_allclose(np.asarray(early[1]), np.asarray(full[1]), atol=1e-6)


def test_cache_lengths_grow_in_steps_of_16_or_a_quarter_and_end_at_the_maximum():
    assert decode.cache_lengths(7) == [7]
    assert decode.cache_lengths(82) == [16, 32, 48, 64, 82]  # no stage of two steps at the end
    lengths = decode.cache_lengths(306)
    assert lengths[:6] == [16, 32, 48, 64, 80, 100] and lengths[-1] == 306
    assert all(b - a >= max(16, a // 4) for a, b in zip(lengths, lengths[1:]))


@pytest.mark.parametrize(
    "n, k, blocked",
    [(148_000, 4, True), (148_000, 8, True), (4 * 32_000, 3, True), (3 * 50_021, 4, False), (999, 2, False)],
)  # 3 x 50,021 has no block size between 64 and 256, 999 is small: lax.top_k itself
def test_top_k_in_blocks_equals_lax_top_k_ties_and_infinities_included(n, k, blocked):
    rng = np.random.default_rng(n + k)
    x = rng.normal(size=(6, n)).astype(np.float32)
    x[0] = np.round(x[0])  # ties everywhere, the top ones in many blocks
    x[1, 3:] = -np.inf  # fewer finite values than k
    x[2] = -np.inf
    x[3, rng.choice(n, 40)] = 9.0  # equal maxima in several blocks
    x[4, -k:] = 9.0  # the best at the very end
    x[5, [0, n - 2, n - 1]] = [9.0, 9.0, 10.0]  # the tie at 9 goes to index 0, in a block with a lower maximum
    assert blocked == ("reduce_max" in str(jax.make_jaxpr(decode.top_k, static_argnums=1)(x, k)))
    got, want = jax.jit(decode.top_k, static_argnums=1)(x, k), jax.lax.top_k(x, k)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.slow  # compiles the model several times (the fast set stays under a minute)
def test_searching_in_stages_of_growing_cache_changes_nothing(monkeypatch):
    """With the cache grown in stages (lengths 1, 2, ..., 6 here), every search gives what one
    loop over the whole length gives, and stops as early."""
    monkeypatch.setattr(decode, "FIRST_CACHE_LENGTH", 1)
    assert decode.cache_lengths(6) == [1, 2, 3, 4, 5, 6] and decode.cache_lengths(1) == [1]
    table = jnp.asarray(random_table(7, 6))
    limits = jnp.array([6, 3, 5])
    for variant in DecodeOptions.BEAM_VARIANTS:
        GROWN.clear()
        staged = table_beam(table, limits, 6, 3, 0.6, variant, stages=True)
        assert GROWN == [1, 2, 3, 4, 5, 6]  # traced once per stage
        for got, want in zip(staged, table_beam(table, limits, 6, 3, 0.6, variant)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    rng = jax.random.key(3)
    for got, want in zip(table_sample(table, limits, 6, rng, stages=True), table_sample(table, limits, 6, rng)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_greedy_follows_the_argmax_and_beam_one_is_greedy():
    table = random_table(10, max_len=6)
    limits = jnp.array([6, 4])
    step, cache = table_decoder(jnp.asarray(table), 2)
    greedy, logp = decode.greedy_search(step, cache, limits, 6)
    for i, limit in enumerate([6, 4]):
        y, before, previous = [], BOS_ID, BOS_ID
        while len(y) < limit and (not y or y[-1] != EOS_ID):
            y.append(int(np.argmax(table[len(y), before, previous])))
            before, previous = previous, y[-1]
        assert trimmed(greedy[i]) == y and float(logp[i]) == pytest.approx(table_logprob(table, y), abs=1e-5)
    beam, scores = table_beam(jnp.asarray(table), limits, 6, 1, 0.6)
    np.testing.assert_array_equal(np.asarray(beam[:, 0]), np.asarray(greedy))


@pytest.mark.slow  # compiles the model several times (the fast set stays under a minute)
def test_sampling_is_reproducible_follows_the_distribution_and_top_k():
    table = random_table(11, max_len=4, sharpness=1.0)
    rows = 4000
    limits = jnp.full((rows,), 3)
    first = table_sample(jnp.asarray(table), limits, 4, jax.random.key(0), temperature=0.7)
    again = table_sample(jnp.asarray(table), limits, 4, jax.random.key(0), temperature=0.7)
    other = table_sample(jnp.asarray(table), limits, 4, jax.random.key(1), temperature=0.7)
    np.testing.assert_array_equal(np.asarray(first[0]), np.asarray(again[0]))
    assert not np.array_equal(np.asarray(first[0]), np.asarray(other[0]))
    # the first token's frequencies follow softmax(log p / temperature)
    want = np.exp(table[0, BOS_ID, BOS_ID] / 0.7)
    want /= want.sum()
    counts = np.bincount(np.asarray(first[0][:, 0]), minlength=VOCAB) / rows
    np.testing.assert_allclose(counts, want, atol=0.03)
    for row, logp in zip(np.asarray(first[0][:50]), np.asarray(first[1][:50])):  # scores are the model's log p
        assert float(logp) == pytest.approx(table_logprob(table, trimmed(row)), abs=1e-4)
    # top_k = 2: only the two most probable tokens of each step are ever drawn
    outputs, _ = table_sample(jnp.asarray(table), limits, 4, jax.random.key(2), top_k=2)
    for row in np.asarray(outputs[:300]):
        y = trimmed(row)
        before, previous = BOS_ID, BOS_ID
        for t, token in enumerate(y):
            assert token in np.argsort(-table[t, before, previous])[:2]
            before, previous = previous, token
    greedy = table_sample(jnp.asarray(table), limits[:4], 4, jax.random.key(3), top_k=1)[0]
    step, cache = table_decoder(jnp.asarray(table), 4)
    np.testing.assert_array_equal(np.asarray(greedy), np.asarray(decode.greedy_search(step, cache, limits[:4], 4)[0]))


# ---------------------------------------------------------------------------------------------
# End to end through the Transformer's step function

TINY = TransformerConfig(vocab_size=6, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, max_len=16)


def tiny_params(seed, config=TINY):
    params = Transformer(config).init(jax.random.key(seed), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
    return jax.tree.map(lambda x: 3 * x, params["params"])  # sharpened, so hypotheses differ clearly


def teacher_forced_logprob(params, inputs, outputs, config=TINY):
    """Sum of log p(y_t | y_<t, x) over each output (up to and including EOS), by a full forward pass."""
    targets = np.zeros((len(outputs), max(map(len, outputs))), np.int32)
    for i, y in enumerate(outputs):
        targets[i, : len(y)] = y
    inputs = np.repeat(np.asarray(inputs), len(outputs), axis=0)
    logits = Transformer(config).apply({"params": params}, jnp.asarray(inputs), jnp.asarray(targets))
    log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
    return np.array([sum(log_probs[i, t, y[t]] for t in range(len(y))) for i, y in enumerate(outputs)])


OPTIONS = DecodeOptions(
    strategy="beam", beam_size=4, alpha=0.6, beam_variant="live", max_extra=2, nbest=4, temperature=1.0, top_k=0, seed=0
)


@pytest.mark.slow  # compiles the model several times
@pytest.mark.parametrize("variant", DecodeOptions.BEAM_VARIANTS)
def test_the_models_wide_beam_finds_the_brute_force_best(variant, monkeypatch):
    monkeypatch.setattr(decode, "FIRST_CACHE_LENGTH", 2)  # the cache grows from 2 to 4 positions on the way
    params = tiny_params(0)
    inputs = np.array([[4, EOS_ID]])  # input length 2, so outputs may have 2 + 2 = 4 tokens
    candidates = all_outputs(limit=4)
    scores = teacher_forced_logprob(params, inputs, candidates) / np.array([penalty(len(y), 0.6) for y in candidates])
    order = np.argsort(-scores)
    options = dataclasses.replace(OPTIONS, beam_size=128, nbest=128, beam_variant=variant)
    outputs, beam_scores = inference.search(TINY, params, jnp.asarray(inputs), options)
    np.testing.assert_allclose(np.asarray(beam_scores[0, : len(candidates)]), scores[order], rtol=1e-5, atol=1e-5)
    assert trimmed(outputs[0, 0]) == candidates[order[0]]


@pytest.mark.slow  # compiles the model several times
def test_the_models_nbest_are_teacher_forced_scores_and_greedy_is_the_forward_argmax(monkeypatch):
    monkeypatch.setattr(decode, "FIRST_CACHE_LENGTH", 3)  # the cache grows 3, 6, 9, 10 on the way
    config = dataclasses.replace(TINY, vocab_size=12)
    params = tiny_params(4, config)
    inputs = np.array([[4, 5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID, PAD_ID]])
    nbest = dataclasses.replace(OPTIONS, max_extra=5, nbest=3)
    outputs, scores = inference.search(config, params, jnp.asarray(inputs), nbest)
    assert outputs.shape[:2] == scores.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            y = trimmed(outputs[i, j])
            want = teacher_forced_logprob(params, inputs[i : i + 1], [y], config)[0] / penalty(len(y), 0.6)
            assert float(scores[i, j]) == pytest.approx(want, abs=1e-4)
        assert (np.diff(np.asarray(scores[i])) <= 0).all()  # best first
    greedy_search = dataclasses.replace(OPTIONS, strategy="greedy", nbest=1)
    greedy, _ = inference.search(config, params, jnp.asarray(inputs[:1]), greedy_search)
    y = trimmed(np.asarray(greedy[0, 0]))
    logits = np.array(Transformer(config).apply({"params": params}, jnp.asarray(inputs[:1]), jnp.asarray([y]))[0])
    logits[:, [PAD_ID, BOS_ID]] = -np.inf
    assert list(logits.argmax(-1)) == y
