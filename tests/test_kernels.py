"""The kernel options (fxformer/kernels/, model.segment_attention, dropout_bits, residual_norm,
loss_impl) against the computations they replace: the reference attention of fxformer/model.py
on its dense mask, Flax's LayerNorm and Dropout, the loss as reductions. The Pallas kernel runs
in interpret mode here; cuDNN's packed route only on a GPU (its glue, the layout, runs here)."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fxformer import optim
from fxformer.errors import UserError
from fxformer.kernels import dropout, projected_loss, segments
from fxformer.kernels.attention import block_ranges, segment_attention
from fxformer.kernels.norm import residual_layer_norm
from fxformer.model import (
    AttentionMask,
    Transformer,
    TransformerConfig,
    dense_mask,
    dot_product_attention,
    heads_first,
    vocabulary_logits,
)

ON_GPU = jax.default_backend() == "gpu"
# small tiles on the CPU, so rows of 9 to 12 span several and the skipping is exercised; 16 on a GPU,
# the smallest tile Triton takes
BLOCK = 16 if ON_GPU else 4

# (q segment ids, kv segment ids or None for self-attention, causal): packed rows of several
# sentences with padding at the end, a padded row of one sentence, a row of padding alone
PACKED = [[1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 0, 0], [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]]
PADDED = [[1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0], [0] * 12]
SOURCE = [[1, 1, 2, 2, 2, 3, 3, 3, 3], [1, 1, 1, 2, 2, 2, 2, 0, 0]]  # the sentences' other side, 9 long
CASES = {
    "packed": (PACKED, None, False),
    "packed causal": (PACKED, None, True),
    "padded causal": (PADDED, None, True),
    "cross": (PACKED, SOURCE, False),
}


def reference(q, k, v, q_segments, kv_segments, causal):
    """fxformer.model's hand-written attention on the dense mask, [b, t, h, d] in and out."""
    mask = dense_mask(AttentionMask(q_segments, kv_segments, causal))
    out = dot_product_attention(heads_first(q), heads_first(k), heads_first(v), mask, lambda w: w)
    return heads_first(out)


def inputs(case, dtype=jnp.float32, seed=0, d_k=6, d_v=10, heads=2):
    q_ids, kv_ids, causal = CASES[case]
    q_segments = jnp.asarray(q_ids, jnp.int32)
    kv_segments = q_segments if kv_ids is None else jnp.asarray(kv_ids, jnp.int32)
    rng = np.random.default_rng(seed)
    (b, q_len), k_len = q_segments.shape, kv_segments.shape[1]
    draw = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    q, k, v = draw(b, q_len, heads, d_k), draw(b, k_len, heads, d_k), draw(b, k_len, heads, d_v)
    cotangent = draw(b, q_len, heads, d_v) * (q_segments > 0)[:, :, None, None]  # padding queries: discarded
    return (q, k, v), q_segments, kv_segments, causal, cotangent


@functools.partial(jax.jit, static_argnames=("causal", "kernel"))
def output_and_gradients(q, k, v, q_segments, kv_segments, cotangent, causal, kernel):
    def attend(q, k, v):
        if kernel:
            return segment_attention(q, k, v, q_segments, kv_segments, causal, block_q=BLOCK, block_k=BLOCK)
        return reference(q, k, v, q_segments, kv_segments, causal)

    out, pullback = jax.vjp(attend, q, k, v)
    return out, pullback(cotangent.astype(out.dtype))


def real_rows(x, segment_ids):
    """x [b, t, ...] at the real (non-padding) positions only."""
    return np.asarray(x, np.float64)[np.asarray(segment_ids) > 0]


@pytest.mark.parametrize("case", CASES)
def test_the_pallas_kernel_equals_the_reference_attention_and_its_gradients_in_float32(case):
    qkv, q_segments, kv_segments, causal, cotangent = inputs(case)
    got, got_grads = output_and_gradients(*qkv, q_segments, kv_segments, cotangent, causal, True)
    want, want_grads = output_and_gradients(*qkv, q_segments, kv_segments, cotangent, causal, False)
    np.testing.assert_allclose(real_rows(got, q_segments), real_rows(want, q_segments), atol=2e-6, rtol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):  # dQ, dK, dV everywhere, padding included
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-6, rtol=1e-5)
    assert np.isfinite(np.asarray(got)).all()  # padding queries too (a row of padding alone in "padded")


@pytest.mark.parametrize("case", ["packed causal", "cross"])
def test_the_pallas_kernel_in_bfloat16_is_as_close_to_float32_as_the_reference_in_bfloat16(case):
    qkv, q_segments, kv_segments, causal, cotangent = inputs(case, jnp.bfloat16, d_k=16, d_v=16)
    exact = output_and_gradients(
        *(x.astype(jnp.float32) for x in qkv), q_segments, kv_segments, cotangent, causal, False
    )
    got = output_and_gradients(*qkv, q_segments, kv_segments, cotangent, causal, True)
    bf16 = output_and_gradients(*qkv, q_segments, kv_segments, cotangent, causal, False)

    def error(a, b):  # relative error over the real rows, as ||a - b|| / ||b||
        a, b = real_rows(a, q_segments), real_rows(b, q_segments)
        return np.linalg.norm(a - b) / np.linalg.norm(b)

    assert error(got[0], exact[0]) < 1e-2 and error(got[0], exact[0]) < 2 * error(bf16[0], exact[0]) + 1e-3
    for g, w, r in zip(got[1], exact[1], bf16[1], strict=True):
        rel = np.linalg.norm(np.asarray(g, np.float64) - np.asarray(w)) / np.linalg.norm(np.asarray(w))
        ref = np.linalg.norm(np.asarray(r, np.float64) - np.asarray(w)) / np.linalg.norm(np.asarray(w))
        assert rel < 2e-2 and rel < 2 * ref + 1e-3, (rel, ref)


@pytest.mark.parametrize("case", ["packed causal", "cross"])
def test_no_token_attends_outside_its_segment(case):
    """Keys and values of every other segment (and of padding) replaced: a segment's outputs are
    bit for bit the same, and its loss sends no gradient to any key or value outside it."""
    (q, k, v), q_segments, kv_segments, causal, _ = inputs(case)
    rng = np.random.default_rng(1)
    for segment in (1, 2):
        own = q_segments == segment  # [b, q]
        outside = (kv_segments != segment)[:, :, None, None]
        k2 = jnp.where(outside, jnp.asarray(rng.normal(size=k.shape) * 100, k.dtype), k)
        v2 = jnp.where(outside, jnp.asarray(rng.normal(size=v.shape) * 100, v.dtype), v)
        cotangent = jnp.ones((*q_segments.shape, q.shape[2], v.shape[-1])) * own[:, :, None, None]
        out, grads = output_and_gradients(q, k, v, q_segments, kv_segments, cotangent, causal, True)
        out2, _ = output_and_gradients(q, k2, v2, q_segments, kv_segments, cotangent, causal, True)
        np.testing.assert_array_equal(np.asarray(out)[np.asarray(own)], np.asarray(out2)[np.asarray(own)])
        assert not np.asarray(grads[1])[np.asarray(outside)[..., 0, 0]].any()  # dK outside the segment
        assert not np.asarray(grads[2])[np.asarray(outside)[..., 0, 0]].any()  # dV
        assert np.asarray(grads[1])[np.asarray(~outside)[..., 0, 0]].any()  # and some inside


def test_the_tiles_visited_cover_every_visible_pair_and_skip_the_rest_of_a_packed_row():
    ids = jnp.asarray([[1] * 8 + [2] * 8 + [3] * 8 + [0] * 8], jnp.int32)  # three sentences of 8, then padding
    for causal in (False, True):
        (first, end), (k_first, k_end) = block_ranges(ids, ids, 8, 8, causal)
        visible = np.asarray(dense_mask(AttentionMask(ids, ids, causal)))[0, 0]  # [q, k]
        for i in range(4):
            for j in range(4):
                tile_visible = visible[8 * i : 8 * i + 8, 8 * j : 8 * j + 8].any()
                assert tile_visible == (first[0, i] <= j < end[0, i]) == (k_first[0, j] <= i < k_end[0, j])
    assert (np.asarray(end - first) == [1, 1, 1, 0]).all()  # 3 tiles of 16, not 16: the padding block none


def test_the_models_pallas_route_equals_the_mask_route_in_logits_and_gradients():
    config = TransformerConfig(vocab_size=23, num_layers=1, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, max_len=32)
    pallas = dataclasses.replace(config, segment_attention="pallas")
    inputs_ids = jnp.asarray([[5, 6, 7, 3, 8, 9, 3, 0], [4, 5, 6, 7, 8, 9, 10, 3]], jnp.int32)
    targets = jnp.asarray([[7, 3, 9, 10, 11, 3, 0, 0], [12, 13, 3, 14, 15, 16, 3, 0]], jnp.int32)
    inputs_segments = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 0], [1] * 8], jnp.int32)
    targets_segments = jnp.asarray([[1, 1, 2, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]], jnp.int32)
    positions = lambda s: jnp.asarray([[0, 1, 2, 3, 0, 1, 2, 0], list(range(8))], jnp.int32)  # noqa: E731
    kw = dict(
        inputs_segmentation=inputs_segments,
        targets_segmentation=targets_segments,
        inputs_positions=positions(inputs_segments),
        targets_positions=jnp.asarray([[0, 1, 0, 1, 2, 3, 0, 0], list(range(8))], jnp.int32),
    )
    params = Transformer(config).init(jax.random.key(0), inputs_ids, targets)["params"]
    weights = (targets_segments > 0)[:, :, None]

    @functools.partial(jax.jit, static_argnums=0)
    def loss_and_logits(c, params):
        def loss(params):
            logits = Transformer(c).apply({"params": params}, inputs_ids, targets, **kw)
            return (jax.nn.log_softmax(logits) * weights).sum(), logits

        return jax.value_and_grad(loss, has_aux=True)(params)

    (_, want), want_grads = loss_and_logits(config, params)
    (_, got), got_grads = loss_and_logits(pallas, params)
    np.testing.assert_allclose(real_rows(got, targets_segments), real_rows(want, targets_segments), atol=1e-5)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# cuDNN's packed segments: the layout here, the kernel on a GPU


def test_the_cudnn_layout_gives_each_sentence_its_offset_and_length_and_padding_a_segment_of_its_own():
    ids = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1], [1, 2, 2, 2, 2, 2, 2, 0]], jnp.int32)
    layout = segments.segment_layout(ids, 5)
    np.testing.assert_array_equal(
        layout.offsets, [[0, 3, 5, 6, -1, -1], [0, -1, -1, -1, -1, -1], [0, 1, 7, -1, -1, -1]]
    )
    np.testing.assert_array_equal(layout.lengths, [[3, 2, 1, 2, -1], [8, -1, -1, -1, -1], [1, 6, 1, -1, -1]])
    np.testing.assert_array_equal(layout.count, [4, 1, 3])
    assert bool(layout.fits)
    # every position in exactly one segment: nothing is left for cuDNN to leave unwritten
    for row, (offsets, lengths) in enumerate(zip(np.asarray(layout.offsets), np.asarray(layout.lengths), strict=True)):
        cover = np.concatenate([np.arange(o, o + n) for o, n in zip(offsets, lengths, strict=False) if n > 0])
        np.testing.assert_array_equal(cover, np.arange(8), err_msg=f"row {row}")


@pytest.mark.parametrize(
    "ids, why",
    [
        ([[1, 2, 3, 4, 5, 6, 0, 0]], "seven segments with the padding's, room for five"),
        ([[1, 1, 2, 2, 1, 1, 0, 0]], "a sentence in two runs"),
        ([[1, 1, 3, 3, 3, 3, 0, 0]], "an id skipped"),
        ([[0, 0, 1, 1, 1, 1, 1, 1]], "padding first"),
    ],
)
def test_rows_the_cudnn_layout_cannot_say_are_flagged(ids, why):
    assert not bool(segments.segment_layout(jnp.asarray(ids, jnp.int32), 5).fits), why


def test_this_jax_has_the_private_cudnn_arguments_the_packed_route_calls():
    assert segments.packed_cudnn_problem() is None  # the signature checked, as the route checks it before a call


def test_the_kernel_options_that_cannot_be_built_are_refused_in_one_sentence():
    from fxformer.configfile import load_config

    config = load_config("configs/default.py")
    config.model.segment_attention = "cudnn_offsets"
    with pytest.raises(UserError, match="needs model.attention_impl=cudnn"):
        TransformerConfig.from_config(config.model, 100)
    config.model.segment_attention, config.model.dropout_bits = "mask", 16
    with pytest.raises(UserError, match="dropout_bits must be 8 or 32"):
        TransformerConfig.from_config(config.model, 100)
    config.model.dropout_bits, config.model.segment_block_k = 32, 48
    with pytest.raises(UserError, match="segment_block_k must be a power of two of at least 16"):
        TransformerConfig.from_config(config.model, 100)
    config.model.segment_block_k, config.model.residual_norm, config.model.norm = 64, "pallas", "pre"
    with pytest.raises(UserError, match="residual_norm=pallas is post-norm's"):
        TransformerConfig.from_config(config.model, 100)


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU (cuDNN fused attention)")
@pytest.mark.parametrize("case", ["packed", "packed causal", "cross"])
def test_cudnns_packed_segments_equal_the_reference_on_a_gpu(case):
    from fxformer.model import fused_attention

    (q, k, v), q_segments, kv_segments, causal, cotangent = inputs(case, jnp.bfloat16, d_k=64, d_v=64)
    mask = AttentionMask(q_segments, kv_segments, causal)

    def attend(q, k, v, offsets):
        if offsets:
            return fused_attention(q, k, v, mask, "cudnn", offsets=True)
        return reference(q, k, v, q_segments, kv_segments, causal)

    out, pull = jax.vjp(lambda *a: attend(*a, True), q, k, v)
    want, pull_want = jax.vjp(lambda *a: attend(*a, False), *(x.astype(jnp.float32) for x in (q, k, v)))
    a, b = real_rows(out, q_segments), real_rows(want, q_segments)
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 2e-2
    for g, w in zip(pull(cotangent), pull_want(cotangent.astype(jnp.float32)), strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.isfinite(g).all() and np.linalg.norm(g - w) / np.linalg.norm(w) < 3e-2


# ---------------------------------------------------------------------------------------------
# Dropout from bytes, the fused residual LayerNorm, the one-pass loss


def test_byte_dropout_equals_a_reference_fed_the_same_mask():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 5, 7)), jnp.float32)
    key = jax.random.key(3)
    keep = dropout.keep_mask(key, x.shape, 0.1)
    want = np.where(np.asarray(keep), np.asarray(x) / (230 / 256), 0.0)  # round(256 x 0.9) = 230
    np.testing.assert_allclose(np.asarray(dropout.apply(x, keep, 0.1)), want, rtol=1e-6)
    module = dropout.ByteDropout(0.1)
    out = module.apply({}, x, False, rngs={"dropout": key})
    # the module draws its own key from the stream: its mask is read off its output and checked the same way
    kept = np.asarray(out) != 0
    np.testing.assert_allclose(np.asarray(out), np.where(kept, np.asarray(x) / (230 / 256), 0.0), rtol=1e-6)
    assert module.apply({}, x, True) is x


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_byte_dropout_keeps_threshold_over_256_of_the_elements(rate):
    keep = np.asarray(dropout.keep_mask(jax.random.key(0), (1000, 1001), rate))
    p = dropout.threshold(rate) / 256
    assert abs(p - (1 - rate)) <= 1 / 512
    assert abs(keep.mean() - p) < 5 * np.sqrt(p * (1 - p) / keep.size)
    assert abs(keep[:, 0].mean() - p) < 0.05 and abs(keep[0].mean() - p) < 0.05  # no row or column left out


def random_words(jaxpr) -> int:
    """Elements of the `random_bits` draws in `jaxpr` and the jaxprs inside it: what threefry is
    evaluated for (once per element, whatever the bit width, under jax_threefry_partitionable)."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "random_bits":
            count += int(np.prod(eqn.params["shape"]))
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)  # a ClosedJaxpr, or a Jaxpr
            if hasattr(inner, "eqns"):
                count += random_words(inner)
    return count


def test_byte_dropout_draws_a_quarter_of_the_random_words_flax_draws():
    shape, key = (64, 100), jax.random.key(0)
    ours = random_words(jax.make_jaxpr(lambda k: dropout.keep_mask(k, shape, 0.1))(key).jaxpr)
    flax = random_words(jax.make_jaxpr(lambda k: jax.random.bernoulli(k, 0.9, shape))(key).jaxpr)
    uint8 = random_words(jax.make_jaxpr(lambda k: jax.random.bits(k, shape, jnp.uint8))(key).jaxpr)
    assert flax == uint8 == 6400 and ours == 1600  # jax.random.bits in uint8 draws as many as Flax


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_the_fused_residual_layer_norm_equals_flax_layer_norm_of_the_sum(dtype, tol):
    rng = np.random.default_rng(0)
    x, y, g = (jnp.asarray(rng.normal(size=(2, 5, 16)) * s + s, dtype) for s in (1.0, 3.0, 1.0))
    scale, bias = jnp.asarray(rng.normal(size=16), jnp.float32), jnp.asarray(rng.normal(size=16), jnp.float32)

    def flax_norm(x, y, scale, bias):
        return nn.LayerNorm(dtype=dtype).apply({"params": {"scale": scale, "bias": bias}}, x + y)

    out, pull = jax.vjp(residual_layer_norm, x, y, scale, bias)
    want, pull_want = jax.vjp(flax_norm, x, y, scale, bias)
    assert out.dtype == want.dtype == dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol)
    for a, b in zip(pull(g), pull_want(g), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol * 4, rtol=tol)


def test_the_models_kernel_options_compute_the_same_model_and_loss():
    """residual_norm=fused with loss_impl=one_pass or fused, and qkv_projection=merged, against the
    defaults: the same parameters (a checkpoint loads into either), loss sums and gradients in float32."""
    config = TransformerConfig(vocab_size=31, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, max_len=32)
    options = [dataclasses.replace(config, residual_norm="fused", loss_impl=impl) for impl in ("one_pass", "fused")]
    options.append(dataclasses.replace(config, qkv_projection="merged"))
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(4, 31, (3, 9)), "targets": rng.integers(4, 31, (3, 7))}
    batch["targets"][1, 5:] = 0  # padding
    batch = {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}
    params = Transformer(config).init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
    for fused in options:  # the same parameters, initialised alike
        init = Transformer(fused).init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
        assert jax.tree.structure(params) == jax.tree.structure(init)
        assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(init), strict=True))
    assert_same_loss_and_gradients(config, options, params, batch)


def assert_same_loss_and_gradients(reference: TransformerConfig, options, params, batch) -> None:
    """Each of `options` (model configs) gives `reference`'s loss sums and gradients on `batch`, in float32."""

    @functools.partial(jax.jit, static_argnums=0)
    def sums_and_grads(c, params):
        loss = lambda p: optim.loss_sums(p, batch, Transformer(c), 0.1)  # noqa: E731
        return loss(params), jax.grad(lambda p: loss(p)["loss"])(params)

    want, want_grads = sums_and_grads(reference, params)
    for c in options:
        got, got_grads = sums_and_grads(c, params)
        for key in optim.SUMS:
            np.testing.assert_allclose(float(got[key]), float(want[key]), rtol=1e-5)
        for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-4)


@functools.partial(jax.jit, static_argnames=("dtype", "kernel", "blocks"))
def projected_sums_and_gradients(hidden, embedding, targets, weights, dtype, kernel, blocks=(16, 16)):
    """A weighted sum of the four per-token reductions, and its gradients in hidden and embedding."""

    def total(hidden, embedding):
        if kernel:
            out = projected_loss.projected_reductions(hidden, embedding, targets, 0.1, dtype, *blocks)
        else:
            out = optim.logit_reductions(vocabulary_logits(hidden, embedding, dtype), targets, 0.1)
        return sum((o * w).sum() for o, w in zip(out[:3], weights, strict=True)), out

    return jax.value_and_grad(total, argnums=(0, 1), has_aux=True)(hidden, embedding)


def projected_inputs(rows=37, vocab=53, d=8, seed=0):
    """Rows and a vocabulary that fill no whole block of 16 (the padding on both sides exercised)."""
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(3, rows, d)), jnp.float32)
    embedding = jnp.asarray(rng.normal(size=(vocab, d)) * 0.5, jnp.float32)
    targets = jnp.asarray(rng.integers(0, vocab, size=(3, rows)), jnp.int32)
    return hidden, embedding, targets, jnp.asarray(rng.normal(size=(3, 3, rows)), jnp.float32)


@pytest.mark.parametrize("blocks", [(16, 16), (32, 64)])
def test_the_fused_projection_and_loss_equal_the_reductions_of_the_projected_logits(blocks):
    """Value and gradients (hidden and embedding) of the kernel against `optim.logit_reductions`
    of `model.vocabulary_logits`, in float32, at blocks of 16 or more (the GPU's)."""
    args = projected_inputs()
    (total, out), grads = projected_sums_and_gradients(*args, jnp.float32, True, blocks)
    (want_total, want), want_grads = projected_sums_and_gradients(*args, jnp.float32, False)
    for a, b in zip(out, want, strict=True):  # log-sum-exp, q-weighted sum, target's logit, largest logit
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(float(total), float(want_total), rtol=1e-5)
    for g, w in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-5)


def test_the_fused_projection_and_loss_in_bfloat16_are_as_close_to_float32_as_the_reference_in_bfloat16():
    """In bfloat16 the logits and their gradient are rounded as the model's are: the kernel is no
    further from the float32 result than the reference computed in bfloat16, and close to it."""
    args = projected_inputs(seed=1)
    (_, exact), exact_grads = projected_sums_and_gradients(*args, jnp.float32, False)
    (_, out), grads = projected_sums_and_gradients(*args, jnp.bfloat16, True)
    (_, ref), ref_grads = projected_sums_and_gradients(*args, jnp.bfloat16, False)
    exact, got, want = (*exact, *exact_grads), (*out, *grads), (*ref, *ref_grads)
    for e, g, w in zip(exact, got, want, strict=True):
        assert float(jnp.abs(g - e).max()) <= 1.5 * float(jnp.abs(w - e).max()) + 1e-6
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), atol=2e-2, rtol=2e-2)


def test_the_one_pass_loss_option_runs_in_loss_chunks_too():
    config = TransformerConfig(vocab_size=31, num_layers=1, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, max_len=32)
    batch = {"inputs": jnp.full((2, 6), 5, jnp.int32), "targets": jnp.asarray([[6, 7, 8, 3, 0], [9, 10, 3, 0, 0]])}
    params = Transformer(config).init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
    whole = optim.loss_sums(params, batch, Transformer(config), 0.1)
    chunked = optim.loss_sums(
        params, batch, Transformer(dataclasses.replace(config, loss_impl="one_pass")), 0.1, chunk=3
    )
    for key in optim.SUMS:
        np.testing.assert_allclose(float(chunked[key]), float(whole[key]), rtol=1e-5)


@pytest.mark.parametrize("case", ["packed causal", "cross"])
def test_the_cudnn_call_passes_jaxs_own_checks_of_its_arguments(case, monkeypatch):
    """Shapes, dtypes and ranks of the offsets and lengths as jax's private cuDNN attention
    checks them, forward and backward, abstractly (no kernel runs); only its device checks, which
    need a Hopper GPU, stand in."""
    from jax._src.cudnn import fused_attention_stablehlo as fused

    monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fused, "check_compute_capability", lambda capability: True)
    monkeypatch.setattr(fused, "is_cuda_compute_capability_equal", lambda capability: False)
    (q, k, v), q_segments, kv_segments, causal, _ = inputs(case, jnp.bfloat16, d_k=64, d_v=64)
    self_attention = CASES[case][1] is None
    if k.shape[1] % 2:  # the source side's 9: cuDNN takes even lengths (fused_attention pads them so)
        k, v = (jnp.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0))) for x in (k, v))
        kv_segments = jnp.pad(kv_segments, ((0, 0), (0, 1)))

    def attend(q, k, v):
        return segments.packed_cudnn_attention(q, k, v, q_segments, kv_segments, causal, self_attention)[0]

    out = jax.eval_shape(attend, q, k, v)
    grads = jax.eval_shape(lambda q, k, v: jax.vjp(attend, q, k, v)[1](jnp.ones(q.shape[:3] + (64,), q.dtype)), q, k, v)
    assert out.shape == q.shape[:3] + (64,) and [g.shape for g in grads] == [q.shape, k.shape, v.shape]


@pytest.mark.parametrize("fits", [True, False])
def test_the_offsets_route_takes_the_mask_for_a_batch_the_layout_cannot_hold_forward_and_backward(fits, monkeypatch):
    """Both kernels stood in on the CPU: cuDNN's packed route by twice the reference (so the two
    routes differ), its mask route by jax's XLA attention; `fits` says which the layout allows."""
    from fxformer import model

    def packed_stand_in(q, k, v, q_segments, kv_segments, causal, self_attention):
        return 2 * reference(q, k, v, q_segments, kv_segments, causal), jnp.asarray(fits)

    xla = jax.nn.dot_product_attention
    monkeypatch.setattr(segments, "packed_cudnn_attention", packed_stand_in)
    monkeypatch.setattr(jax.nn, "dot_product_attention", lambda *a, implementation, **kw: xla(*a, **kw))
    (q, k, v), q_segments, _, causal, cotangent = inputs("packed causal", d_k=8, d_v=8)
    mask = AttentionMask(q_segments, q_segments, causal)
    got, pull = jax.vjp(lambda q, k, v: model.offsets_or_mask(q, k, v, mask, True), q, k, v)
    factor = 2 if fits else 1
    want, pull_want = jax.vjp(lambda q, k, v: factor * reference(q, k, v, q_segments, q_segments, causal), q, k, v)
    np.testing.assert_allclose(real_rows(got, q_segments), real_rows(want, q_segments), atol=1e-5)
    for g, w in zip(pull(cotangent), pull_want(cotangent), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5)


def test_the_offsets_route_keeps_no_residual_of_the_mask_route(monkeypatch):
    """Traced only: the forward pass's lax.cond returns the attention output and nothing else (no
    [b, h, q, k] bias, no copies of Q, K, V for the branch not taken)."""
    from jax._src.cudnn import fused_attention_stablehlo as fused

    from fxformer.model import fused_attention

    monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fused, "check_compute_capability", lambda capability: True)
    monkeypatch.setattr(fused, "is_cuda_compute_capability_equal", lambda capability: False)
    (q, k, v), q_segments, _, causal, _ = inputs("packed causal", jnp.bfloat16, d_k=64, d_v=64)
    mask = AttentionMask(q_segments, q_segments, causal)
    loss = lambda q, k, v: fused_attention(q, k, v, mask, "cudnn", offsets=True).astype(jnp.float32).sum()  # noqa: E731
    jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v).jaxpr

    def conds(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "cond":
                yield [v.aval.shape for v in eqn.outvars]
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    yield from conds(inner)

    outputs = list(conds(jaxpr))
    assert [q.shape] in outputs and [q.shape, k.shape, v.shape] in outputs and len(outputs) == 2, outputs


def test_the_flat_update_is_adams_update_element_for_element():
    """flat_update=True: optax.flatten around the same Adam; three updates of a small tree of
    parameters of several shapes give the tree's updates, and the moments are one vector each."""
    from fxformer.configfile import load_config

    config = load_config("configs/default.py")
    flat_config = load_config("configs/default.py")
    flat_config.flat_update = True
    rng = np.random.default_rng(0)
    params = {
        "a": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
        "b": {"c": jnp.asarray(rng.normal(size=5), jnp.float32)},
    }
    tree, flat = optim.optimizer(config), optim.optimizer(flat_config)
    states = [tree.init(params), flat.init(params)]
    assert {x.shape for x in jax.tree.leaves(states[1]) if x.ndim} == {(17,)}  # 12 + 5 parameters, one vector
    for scale in (1.0, 2.0, 3.0):
        grads = jax.tree.map(lambda x, s=scale: jnp.asarray(rng.normal(size=x.shape) * s, jnp.float32), params)
        (u_tree, states[0]), (u_flat, states[1]) = (
            tree.update(grads, states[0], params),
            flat.update(grads, states[1], params),
        )
        for a, b in zip(jax.tree.leaves(u_tree), jax.tree.leaves(u_flat), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-12)


def test_merged_projections_with_biases_give_the_separate_projections_logits():
    config = TransformerConfig(
        vocab_size=31, num_layers=1, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=4, max_len=32, attention_bias=True
    )
    merged = dataclasses.replace(config, qkv_projection="merged")
    inputs, targets = jnp.full((2, 6), 5, jnp.int32), jnp.asarray([[6, 7, 8, 3, 0], [9, 10, 3, 0, 0]])
    params = Transformer(config).init(jax.random.key(1), inputs, targets)["params"]
    params = jax.tree.map(lambda x: x + 0.1, params)  # biases away from their zero start
    want, got = (Transformer(c).apply({"params": params}, inputs, targets) for c in (config, merged))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
