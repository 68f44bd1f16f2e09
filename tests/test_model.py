"""The model against independent computations: NumPy attention, the paper's formulas."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fxformer import inference
from fxformer.errors import UserError
from fxformer.model import (
    AttentionMask,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    dense_mask,
    dot_product_attention,
    fused_attention,
    fused_mask_arguments,
    grow_cache,
    heads_first,
    sinusoid_table,
)
from fxformer.params import count_parameters

TINY = TransformerConfig(vocab_size=23, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_k=6, d_v=10, max_len=32)


def init(config, src_len=7, tgt_len=6, seed=0):
    tokens = jnp.ones((2, src_len), jnp.int32)
    return Transformer(config).init(jax.random.key(seed), tokens, tokens[:, :tgt_len])["params"]


def logits_of(config, params, inputs, targets, **kw):
    """The model's forward pass, compiled (one XLA program per shape: faster than op by op)."""
    return np.asarray(_forward(config, params, jnp.asarray(inputs), jnp.asarray(targets), **kw))


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, inputs, targets, **kw):
    return Transformer(config).apply({"params": params}, inputs, targets, **kw)


def numpy_attention(params, xq, xkv, mask, h, d_k, d_v):
    """softmax(Q K^T / sqrt(d_k)) V per head, in float64 NumPy, from the module's weights."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    project = lambda x, name: x @ p[name]["kernel"] + p[name].get("bias", 0.0)
    q = project(xq, "query").reshape(*xq.shape[:2], h, d_k)
    k = project(xkv, "key").reshape(*xkv.shape[:2], h, d_k)
    v = project(xkv, "value").reshape(*xkv.shape[:2], h, d_v)
    out = np.zeros((*xq.shape[:2], h, d_v))
    for b in range(xq.shape[0]):
        for i in range(h):
            scores = q[b, :, i] @ k[b, :, i].T / math.sqrt(d_k)  # [q, k]
            scores = np.where(mask[b], scores, -np.inf)
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            out[b, :, i] = (weights / weights.sum(-1, keepdims=True)) @ v[b, :, i]
    return project(out.reshape(*xq.shape[:2], h * d_v), "out")


@pytest.mark.parametrize("causal, bias", [(False, False), (True, False), (True, True)])
def test_attention_equals_numpy_with_padding_and_causal_masks(causal, bias):
    c = dataclasses.replace(TINY, attention_bias=bias)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, c.d_model)).astype(np.float32)
    lengths = np.array([5, 3])  # the second row has two padded keys
    mask = np.arange(5)[None, None, :] < lengths[:, None, None]  # [b, q, k]
    mask = np.broadcast_to(mask, (2, 5, 5))
    if causal:
        mask = mask & np.tril(np.ones((5, 5), bool))
    keys = AttentionMask(jnp.ones((2, 5), jnp.int32), jnp.arange(5) < jnp.asarray(lengths)[:, None], causal)
    module = MultiHeadAttention(c)
    params = module.init(jax.random.key(1), x, x, keys, True)["params"]
    got = module.apply({"params": params}, x, x, keys, True)
    want = numpy_attention(params, x, x, mask, c.num_heads, c.d_k, c.d_v)
    assert c.d_k != c.d_v
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_fully_masked_rows_give_no_nan():
    c = TINY
    x = np.ones((1, 3, c.d_model), np.float32)
    mask = AttentionMask(jnp.zeros((1, 3), jnp.int32), jnp.zeros((1, 3), jnp.int32))
    module = MultiHeadAttention(c)
    params = module.init(jax.random.key(1), x, x, mask, True)["params"]
    assert np.isfinite(np.asarray(module.apply({"params": params}, x, x, mask, True))).all()


@pytest.mark.slow  # compiles the model several times
def test_future_target_tokens_do_not_change_earlier_logits():
    params = init(TINY)
    inputs = np.array([[5, 6, 7, 8, 3, 0, 0]] * 2)
    targets = np.array([[9, 10, 11, 12, 13, 3]] * 2)
    changed = targets.copy()
    changed[:, 3] = 17  # position 3's token; the decoder sees it from position 4 on
    a, b = logits_of(TINY, params, inputs, targets), logits_of(TINY, params, inputs, changed)
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert np.abs(a[:, 4:] - b[:, 4:]).max() > 1e-4  # and the change is seen later


@pytest.mark.slow  # compiles the model several times (the fast set stays under a minute)
def test_padded_source_tokens_change_nothing():
    params = init(TINY)
    inputs = np.array([[5, 6, 7, 3, 0, 0, 0]])
    targets = np.array([[9, 10, 11, 3]])
    segmentation = np.array([[1, 1, 1, 1, 0, 0, 0]])
    changed = inputs.copy()
    changed[0, 4:] = [13, 14, 15]  # garbage where padding is, still marked as padding
    a = logits_of(TINY, params, inputs, targets, inputs_segmentation=jnp.asarray(segmentation))
    b = logits_of(TINY, params, changed, targets, inputs_segmentation=jnp.asarray(segmentation))
    np.testing.assert_array_equal(a, b)
    c = logits_of(TINY, params, np.array([[5, 6, 7, 3]]), targets)  # no padding at all
    np.testing.assert_allclose(a, c, atol=1e-5)


@pytest.mark.slow  # compiles the model several times
def test_packed_row_equals_each_sequence_alone():
    params = init(TINY)
    src1, tgt1 = [5, 6, 7, 3], [9, 10, 3]
    src2, tgt2 = [11, 12, 3], [13, 14, 15, 16, 3]
    inputs = np.array([src1 + src2 + [0]])
    targets = np.array([tgt1 + tgt2 + [0]])
    packed = logits_of(
        TINY,
        params,
        inputs,
        targets,
        inputs_segmentation=jnp.array([[1] * 4 + [2] * 3 + [0]]),
        targets_segmentation=jnp.array([[1] * 3 + [2] * 5 + [0]]),
        inputs_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0]]),
        targets_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 4, 0]]),
    )
    alone1 = logits_of(TINY, params, np.array([src1]), np.array([tgt1]))
    alone2 = logits_of(TINY, params, np.array([src2]), np.array([tgt2]))
    np.testing.assert_allclose(packed[0, :3], alone1[0], atol=1e-5)
    np.testing.assert_allclose(packed[0, 3:8], alone2[0], atol=1e-5)


def test_sinusoid_table_is_the_papers_formula():
    d_model, max_len = 12, 50
    table = sinusoid_table(max_len, d_model)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        pytest.param({"norm": "pre"}, marks=pytest.mark.slow),
        pytest.param({"positional": "learned"}, marks=pytest.mark.slow),
    ],
)  # one fast
def test_cached_decoding_equals_full_forward(variant):
    config = dataclasses.replace(TINY, **variant)
    params = init(config)
    inputs = jnp.array([[5, 6, 7, 8, 3, 0, 0], [9, 10, 3, 0, 0, 0, 0]])
    targets = jnp.array([[9, 10, 11, 12, 13, 3], [4, 5, 6, 3, 0, 0]])
    full = np.asarray(jax.nn.log_softmax(logits_of(config, params, inputs, targets), axis=-1))
    decoding = inference.start_decoding(config, params, inputs, copies=1, max_extra=0)  # room for 7 positions
    assert decoding.max_len == 7
    cache, previous = decoding.cache, jnp.full((2,), 2)  # BOS
    produced = [i for i in range(config.vocab_size) if i not in (0, 2)]  # the step function rules out PAD, BOS
    for t in range(targets.shape[1]):
        log_probs, cache = decoding.step(previous, cache)
        log_probs = np.asarray(log_probs)
        assert np.isneginf(log_probs[:, [0, 2]]).all()
        np.testing.assert_allclose(log_probs[0, produced], full[0, t, produced], atol=1e-5)
        if t < 4:
            np.testing.assert_allclose(log_probs[1, produced], full[1, t, produced], atol=1e-5)
        previous = targets[:, t]
        if t == 2:  # room for more positions half-way changes nothing
            cache = grow_cache(cache, 11)
            assert cache["decoder"]["layer_0"]["self_attention"]["cached_key"].shape[2] == 11


@pytest.mark.slow  # compiles the model in two dtypes
def test_bfloat16_compute_stays_close_to_float32():
    config = dataclasses.replace(TINY, dropout_rate=0.0)
    params = init(config)
    inputs = np.array([[5, 6, 7, 8, 3, 0, 0]])
    targets = np.array([[9, 10, 11, 12, 3]])
    f32 = logits_of(config, params, inputs, targets)
    bf16 = logits_of(dataclasses.replace(config, dtype=jnp.bfloat16), params, inputs, targets)
    assert jax.tree.leaves(params)[0].dtype == jnp.float32
    assert np.isfinite(bf16).all()
    assert np.abs(bf16 - f32).max() < 0.1 * np.abs(f32).max() + 0.05


@pytest.mark.slow  # compiles the model several times (the fast set stays under a minute)
def test_dropout_only_in_training_mode():
    params = init(TINY)
    inputs, targets = jnp.array([[5, 6, 7, 3]]), jnp.array([[9, 10, 3]])
    model = Transformer(TINY)
    a = model.apply({"params": params}, inputs, targets)
    b = model.apply({"params": params}, inputs, targets)
    c = model.apply({"params": params}, inputs, targets, deterministic=False, rngs={"dropout": jax.random.key(3)})
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3


def test_the_compiled_initialiser_gives_flaxs_values_bit_for_bit(monkeypatch):
    """model.xavier_uniform is Flax's initialiser compiled: the same parameters, initialised op by
    op or compiled, as with Flax's own."""
    from flax import linen as nn

    from fxformer import model

    ours = [init(TINY, seed=3), jax.jit(lambda k: init(TINY, seed=k))(3)]
    monkeypatch.setattr(model, "xavier_uniform", nn.initializers.xavier_uniform())
    flax_own = [init(TINY, seed=3), jax.jit(lambda k: init(TINY, seed=k))(3)]
    for a, b in zip(ours, flax_own):
        assert jax.tree.structure(a) == jax.tree.structure(b)
        assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_parameter_count_matches_closed_form():
    """Shared embedding + N encoder layers + N decoder layers, counted by hand."""
    from configs import base

    m = base.get_config().model  # N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=0: 64
    V, d, f, h, dk, dv = 37000, 512, 2048, 8, 64, 64
    attention = 2 * d * h * dk + d * h * dv + h * dv * d  # W^Q, W^K, W^V, W^O: no biases
    ffn = d * f + f + f * d + d
    norm = 2 * d
    expected = V * d + 6 * (attention + ffn + 2 * norm) + 6 * (2 * attention + ffn + 3 * norm)
    assert count_parameters(m, V) == expected


# ---------------------------------------------------------------------------------------------
# The fused-attention route (model.attention_impl)


PACKED = jnp.array([[1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 3, 3], [1, 1, 2, 0, 0, 0]])  # [b, q]
PADDED = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])  # the last: an eval filler row
PACKED_SOURCE = jnp.array([[1, 1, 2, 2, 2, 2, 0, 0], [1, 2, 3, 3, 3, 3, 3, 3], [1, 1, 1, 2, 2, 0, 0, 0]])  # [b, k]
PADDED_SOURCE = jnp.array([[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0]])
# each case: the mask, and what the fused route hands jax.nn.dot_product_attention for it
FUSED_CASES = {
    "packed self-attention": (AttentionMask(PACKED, PACKED), {"mask": (3, 3, 6, 6), "is_causal": False}),
    "padded self-attention": (AttentionMask(PADDED, PADDED, packed=False), {"key_value_seq_lengths": [4, 6, 1]}),
    "packed decoder self-attention": (
        AttentionMask(PACKED, PACKED, causal=True), {"mask": (3, 3, 6, 6), "is_causal": True}),
    "padded decoder self-attention": (AttentionMask(PADDED, PADDED, causal=True, packed=False), {"is_causal": True}),
    "packed cross-attention": (AttentionMask(PACKED, PACKED_SOURCE), {"mask": (3, 3, 6, 8), "is_causal": False}),
    "padded cross-attention": (
        AttentionMask(PADDED, PADDED_SOURCE, packed=False), {"key_value_seq_lengths": [5, 8, 1]}),
}  # fmt: skip


@pytest.mark.parametrize("case", FUSED_CASES)
def test_the_jax_nn_route_given_the_cudnn_arguments_equals_the_hand_written_attention(case):
    """jax.nn.dot_product_attention (its XLA implementation on a CPU; cuDNN's kernel on a GPU),
    given `is_causal`, a segment mask or key lengths as the cudnn route gives them, against the
    hand-written softmax(Q K^T / sqrt(d_k)) V on the dense mask."""
    mask, handed = FUSED_CASES[case]
    arguments = fused_mask_arguments(mask, 3)
    assert set(arguments) == set(handed)
    for name, want in handed.items():
        got = arguments[name]
        got = got.shape if name == "mask" else got if name == "is_causal" else np.asarray(got).tolist()
        assert got == want, name
    if "mask" in arguments:  # the segments alone, every head: causality is `is_causal`'s; padding sees all
        q_ids, kv_ids = np.asarray(mask.q_segments)[:, None, :, None], np.asarray(mask.kv_segments)[:, None, None, :]
        want = np.broadcast_to(((q_ids == kv_ids) & (kv_ids > 0)) | (q_ids == 0), arguments["mask"].shape)
        np.testing.assert_array_equal(arguments["mask"], want)
    (b, q_len), k_len = mask.q_segments.shape, mask.kv_segments.shape[1]
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(b, q_len, 3, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, k_len, 3, 8)), jnp.float32) for _ in range(2))
    ours = heads_first(dot_product_attention(*map(heads_first, (q, k, v)), dense_mask(mask), lambda w: w))
    theirs = np.asarray(fused_attention(q, k, v, mask, "xla"))
    real = np.asarray(mask.q_segments) > 0
    np.testing.assert_allclose(theirs[real], np.asarray(ours)[real], atol=1e-5)
    assert np.isfinite(theirs).all()
    # Every query, padding too, sees at least one key through what the kernel is told: cuDNN's
    # gradient is NaN for a query that sees none (its output discarded all the same).
    sees = np.ones((b, 1, q_len, k_len), bool)
    if "mask" in arguments:
        sees &= np.asarray(arguments["mask"])[:, :1]
    if arguments.get("is_causal"):
        sees &= np.tril(np.ones((q_len, k_len), bool))
    if "key_value_seq_lengths" in arguments:
        sees &= np.arange(k_len) < np.asarray(arguments["key_value_seq_lengths"])[:, None, None, None]
    assert sees.any(-1).all()


PACKED_BATCH = dict(  # as the packer makes them: each target segment has its source segment
    inputs_segmentation=jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 2, 2, 2, 0, 0]]),
    targets_segmentation=jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 2, 2, 2, 2, 0]]),
    inputs_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 0, 1, 2, 0, 0]]),
    targets_positions=jnp.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 0, 1, 2, 3, 0]]),
)


@pytest.mark.slow  # compiles the model several times (the fast set stays under a minute)
@pytest.mark.parametrize("packed", [False, True])
def test_the_models_fused_route_equals_the_reference_on_real_targets(packed, monkeypatch):
    """The whole model with attention_impl="cudnn", its kernel swapped for jax's XLA one (the
    same arguments, on a CPU), against the hand-written attention on dense masks."""
    kernel = fused_attention
    monkeypatch.setattr("fxformer.model.fused_attention", lambda q, k, v, mask, *_: kernel(q, k, v, mask, "xla"))
    config = dataclasses.replace(TINY, d_k=8, d_v=8)  # jax.nn's attention wants d_k == d_v
    params = init(config)
    inputs = jnp.array([[5, 6, 3, 7, 8, 9, 3, 0], [4, 5, 6, 7, 8, 3, 0, 0], [0] * 8])
    targets = jnp.array([[9, 10, 3, 11, 3, 0, 0], [12, 3, 13, 14, 15, 3, 0], [0] * 7])
    batch = {k: jnp.concatenate([a, jnp.zeros((1, a.shape[1]), a.dtype)]) for k, a in PACKED_BATCH.items()}
    kw = batch if packed else {}
    reference = logits_of(config, params, inputs, targets, **kw)
    fused = logits_of(dataclasses.replace(config, attention_impl="cudnn"), params, inputs, targets, **kw)
    real = np.asarray(targets) != 0  # the loss weighs padding targets 0
    np.testing.assert_allclose(fused[real], reference[real], atol=1e-5)
    assert np.isfinite(fused).all()  # the filler row of padding alone too


def test_auto_attention_changes_nothing_on_a_cpu_and_cudnn_is_refused_in_one_sentence():
    from fxformer import configfile
    from fxformer.config import with_overrides

    config = configfile.load_config("configs/default.py")
    auto = TransformerConfig.from_config(with_overrides(config, {"model.attention_impl": "auto"}).model, 50)
    assert auto.attention_impl == "xla" and auto.d_k == auto.d_v == 32  # 0: d_model / h
    if jax.default_backend() != "gpu":  # no GPU here: auto takes the reference path, so results are identical
        with pytest.raises(UserError, match="model.attention_impl=cudnn needs a GPU"):
            TransformerConfig.from_config(with_overrides(config, {"model.attention_impl": "cudnn"}).model, 50)


@pytest.mark.slow  # compiles the model's gradient twice per case
@pytest.mark.parametrize("packed", [False, True])
def test_the_fused_routes_gradients_equal_the_references_in_float32(packed, monkeypatch):
    """The training gradients through the cudnn route's arguments (odd lengths padded, padding
    queries seeing keys), jax's XLA kernel standing in on a CPU, against the hand-written attention."""
    kernel = fused_attention
    monkeypatch.setattr("fxformer.model.fused_attention", lambda q, k, v, mask, *_: kernel(q, k, v, mask, "xla"))
    base, *case = bfloat16_case(packed)
    base = dataclasses.replace(base, dtype=jnp.float32)
    reference, fused = (
        loss_gradients(base, *case),
        loss_gradients(dataclasses.replace(base, attention_impl="cudnn"), *case),
    )
    np.testing.assert_allclose(fused, reference, atol=1e-6, rtol=1e-4)


def bfloat16_case(packed: bool):
    """The GPU tests' model (bfloat16, no dropout, heads 8 wide), parameters and batch: padded rows
    and a filler row of padding alone, or the same rows packed (PACKED_BATCH's segments)."""
    base = dataclasses.replace(TINY, dtype=jnp.bfloat16, dropout_rate=0.0, d_k=8, d_v=8)
    inputs = jnp.array([[5, 6, 7, 8, 3, 0, 0, 0], [9, 10, 3, 4, 5, 6, 3, 0], [0] * 8])
    targets = jnp.array([[9, 10, 11, 12, 13, 3, 0], [4, 5, 6, 3, 7, 3, 0], [0] * 7])
    kw = {k: jnp.concatenate([a, jnp.zeros((1, a.shape[1]), a.dtype)]) for k, a in PACKED_BATCH.items()}
    return base, init(base), inputs, targets, kw if packed else {}


def loss_weights(targets, kw) -> jax.Array:
    """1 where the loss weighs a target: a packed row's segments (`kw`), else its non-padding tokens."""
    return ((kw["targets_segmentation"] if kw else targets) != 0).astype(jnp.float32)


def loss_gradients(config, params, inputs, targets, kw) -> np.ndarray:
    """The gradient of the (unsmoothed) cross-entropy over `loss_weights`, flattened, in float64."""
    import optax

    weights = loss_weights(targets, kw)

    def loss(p):
        logits = Transformer(config).apply({"params": p}, inputs, targets, **kw).astype(jnp.float32)
        return (optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights).sum() / weights.sum()

    return np.concatenate([np.asarray(g, np.float64).ravel() for g in jax.tree.leaves(jax.grad(loss)(params))])


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (cuDNN fused attention)")
@pytest.mark.parametrize("packed", [False, True])
def test_cudnn_attention_equals_xla_in_bfloat16_on_a_gpu(packed):
    base, params, inputs, targets, kw = bfloat16_case(packed)
    xla = logits_of(base, params, inputs, targets, **kw)
    cudnn = logits_of(dataclasses.replace(base, attention_impl="cudnn"), params, inputs, targets, **kw)
    real = np.asarray(loss_weights(targets, kw), bool)[:, :, None]
    np.testing.assert_allclose(np.where(real, cudnn, 0), np.where(real, xla, 0), atol=0.1, rtol=0.05)
    assert np.isfinite(cudnn).all()


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (cuDNN fused attention)")
@pytest.mark.parametrize("packed", [False, True])
def test_cudnn_gradients_are_finite_and_as_close_to_float32_as_xlas_on_a_gpu(packed):
    """The training step's gradients through cuDNN's kernel in bfloat16: finite (padding queries
    that saw no key made them NaN: the base model's loss was NaN from step 2 on an H100, though
    the forward was right), and as close to the float32 gradients as the reference's bfloat16 ones
    (with jax's XLA kernel standing in on a CPU: 0.017 vs 0.111 padded, 0.047 vs 0.049 packed)."""
    base, *case = bfloat16_case(packed)
    exact = loss_gradients(dataclasses.replace(base, dtype=jnp.float32), *case)
    xla, cudnn = loss_gradients(base, *case), loss_gradients(dataclasses.replace(base, attention_impl="cudnn"), *case)
    assert np.isfinite(cudnn).all()
    error = lambda g: np.linalg.norm(g - exact)
    assert error(cudnn) <= 2 * error(xla) + 0.02 * np.linalg.norm(exact)
