"""The Transformer of "Attention Is All You Need", section 3, as Flax linen modules.

Read it next to the paper: one module per concept, each docstring names what it
implements. Every module is a pure function of its parameters (`init`/`apply`).

Shapes: b = batch, q = query length, k = key length, l = length, h = heads.
Packed rows (several examples in one row) carry `segmentation` ids (1, 2, ...,
0 for padding) and per-segment `positions`; attention never crosses segments. The layers
pass an `AttentionMask` (segment ids, causal or not), not a dense mask: each kernel builds
what it needs from it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fxformer import layers
from fxformer.config import attention_impl, head_widths
from fxformer.errors import UserError
from fxformer.kernels import counter_dropout, segments
from fxformer.kernels import dropout as byte_dropout
from fxformer.kernels.attention import segment_attention
from fxformer.kernels.norm import ResidualLayerNorm
from fxformer.tokens import BOS_ID, PAD_ID

Array = jax.Array
# Every weight matrix's initialiser (section 5.4 / t2t). Compiled with its shape and dtype static:
# tracing a model's `init` traces the random draw once per shape, not once per matrix (`params
# --table3` in 10% less time), and the values are the same bit for bit (tests/test_model.py).
xavier_uniform = jax.jit(nn.initializers.xavier_uniform(), static_argnums=(1, 2))


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of one model; the names are the paper's symbols. Built from a config's
    `model` section by `from_config`, after `fxformer.config.validate` has refused what the model
    cannot be built with; built directly, d_k and d_v must be given."""

    vocab_size: int
    num_layers: int = 6  # N
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8  # h
    d_k: int = 0  # from_config: 0 means d_model / h
    d_v: int = 0  # from_config: 0 means d_model / h
    dropout_rate: float = 0.1  # P_drop: sub-layer outputs, embeddings + positions
    attention_dropout_rate: float = 0.0  # departure: dropout on attention weights
    relu_dropout_rate: float = 0.0  # departure: dropout inside the feed-forward network
    positional: str = "sinusoidal"  # or "learned" (Table 3 row E)
    max_len: int = 512  # size of the positional table
    norm: str = "post"  # "post": LayerNorm(x + Dropout(f(x))); "pre": x + Dropout(f(LayerNorm(x)))
    attention_bias: bool = False  # departure when True: biases on the Q, K, V and output projections
    activation: str = "relu"  # departure: "swish" (SiLU) or "gelu" (erf) in the feed-forward network
    sinusoid_layout: str = "interleaved"  # departure: "halves", the sines in the first d_model/2 features
    layer_norm_epsilon: float = 1e-6  # every LayerNorm's eps
    output_bias: bool = False  # departure when True: a bias on the vocabulary logits
    scale_embedding: bool = True  # the embeddings times sqrt(d_model) (3.4); False: departure
    dtype: Any = jnp.float32  # compute dtype; parameters stay float32
    # "xla": hand-written, the reference (every query-key product is computed, masked ones included);
    # "cudnn": jax.nn.dot_product_attention's fused kernel, given what `fused_mask_arguments` gives it
    # (is_causal in decoder self-attention, where jax documents that cuDNN skips the masked half; a
    # dense segment mask, added to the logits, only for packed rows; key lengths for padded rows'
    # other attention). Decoding keeps "xla". from_config resolves "auto" (fxformer.config.attention_impl).
    attention_impl: str = "xla"
    # How training's attention learns the packing (decoding keeps the reference): "mask", the
    # dense segment mask (a [b, h, q, k] bias to cuDNN); "cudnn_offsets", cuDNN told each
    # segment's offset and length (`fxformer.kernels.segments`; attention_impl "cudnn"); "pallas",
    # `fxformer.kernels.attention`, which visits only the tiles a segment can see (any backend).
    segment_attention: str = "mask"
    segment_block_k: int = 64  # segment_attention=pallas: keys per tile (queries per tile: 64)
    qkv_projection: str = "separate"  # "merged": self-attention's W^Q, W^K, W^V as one product (the same parameters)
    dropout_bits: int = 32  # 8: dropout masks from bytes, four per random 32-bit word (`fxformer.kernels.dropout`)
    # "fused": post-norm's LayerNorm(x + Dropout(y)) with its own gradient, `kernels.norm`; "pallas":
    # the dropout, the sum and the norm in one kernel, the mask from counters in it (and the
    # feed-forward's ReLU + dropout too), `kernels.counter_dropout`
    residual_norm: str = "flax"
    # "one_pass": the loss's sums from one pass over the logits (`fxformer.optim`); "fused": the
    # projection and the loss in one kernel, the logits never written (`kernels.projected_loss`)
    loss_impl: str = "reductions"
    decode: bool = False  # one target position per call, with a key/value cache

    def __post_init__(self):
        """Assert what `fxformer.config.validate` refuses in one sentence before a model is built."""
        sizes = (self.num_layers, self.d_model, self.d_ff, self.num_heads, self.d_k, self.d_v, self.max_len)
        rates = (self.dropout_rate, self.attention_dropout_rate, self.relu_dropout_rate)
        assert min(sizes) > 0 and self.d_model % 2 == 0, f"sizes must be positive, d_model even: {self}"
        assert all(0 <= rate < 1 for rate in rates), f"rates must be in [0, 1): {self}"
        assert self.positional in ("sinusoidal", "learned") and self.norm in ("post", "pre"), self
        assert self.attention_impl in ("xla", "cudnn"), self
        assert self.activation in ACTIVATIONS and self.sinusoid_layout in ("interleaved", "halves"), self
        problem = option_problem(self)
        assert problem is None, problem

    @classmethod
    def from_config(cls, model_config, vocab_size: int) -> TransformerConfig:
        """Build from the `model` section of a validated experiment config (`fxformer.config`):
        d_k / d_v of 0 become d_model / h, "auto" attention what serves on this machine."""
        names = {f.name for f in dataclasses.fields(cls)} - {"vocab_size", "decode"}
        kwargs = {name: model_config[name] for name in names}
        kwargs["d_k"], kwargs["d_v"] = head_widths(model_config)
        kwargs["dtype"] = jnp.dtype(model_config.dtype)
        kwargs["attention_impl"] = attention_impl(model_config, jax.default_backend())
        problem = option_problem(SimpleNamespace(**kwargs))
        if problem:
            raise UserError(problem + ".")
        return cls(vocab_size=vocab_size, **kwargs)


SEGMENT_ATTENTION = ("mask", "cudnn_offsets", "pallas")
RESIDUAL_NORMS = ("flax", "fused", "pallas")
LOSS_IMPLS = ("reductions", "one_pass", "fused")


def option_problem(c) -> str | None:
    """What is wrong with the kernel options of a model's config (`TransformerConfig`'s fields
    segment_attention, segment_block_k, qkv_projection, dropout_bits, residual_norm, loss_impl), in one
    sentence, or None."""
    if c.segment_attention not in SEGMENT_ATTENTION:
        return f"model.segment_attention must be one of {', '.join(SEGMENT_ATTENTION)}, not {c.segment_attention!r}"
    if c.segment_attention == "cudnn_offsets" and c.attention_impl != "cudnn":
        return "model.segment_attention=cudnn_offsets needs model.attention_impl=cudnn (it is cuDNN's packed layout)"
    if c.segment_attention != "mask" and c.attention_dropout_rate > 0:
        return (
            f"model.segment_attention={c.segment_attention} computes no attention weights to drop: "
            "it needs model.attention_dropout_rate=0"
        )
    if c.qkv_projection not in ("separate", "merged"):
        return f"model.qkv_projection must be separate or merged, not {c.qkv_projection!r}"
    if c.segment_block_k < 16 or c.segment_block_k & (c.segment_block_k - 1):
        return f"model.segment_block_k must be a power of two of at least 16 (a Triton tile), not {c.segment_block_k!r}"
    if c.dropout_bits not in (8, 32):
        return f"model.dropout_bits must be 8 or 32, not {c.dropout_bits!r}"
    if c.residual_norm not in RESIDUAL_NORMS:
        return f"model.residual_norm must be one of {', '.join(RESIDUAL_NORMS)}, not {c.residual_norm!r}"
    if c.residual_norm == "pallas" and c.norm != "post":
        return "model.residual_norm=pallas is post-norm's LayerNorm(x + Dropout(y)): it needs model.norm=post"
    if c.loss_impl not in LOSS_IMPLS:
        return f"model.loss_impl must be one of {', '.join(LOSS_IMPLS)}, not {c.loss_impl!r}"
    if c.loss_impl == "fused" and c.output_bias:
        return (
            "model.loss_impl=fused projects with the embedding alone: model.output_bias=true needs loss_impl one_pass"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Masks


def default_segmentation(tokens: Array) -> Array:
    """Segment ids of an unpacked batch: 1 for real tokens, 0 for padding."""
    return (tokens != PAD_ID).astype(jnp.int32)


def default_positions(tokens: Array) -> Array:
    """Positions 0..l-1 of an unpacked batch."""
    return jnp.broadcast_to(jnp.arange(tokens.shape[-1], dtype=jnp.int32), tokens.shape)


def segment_mask(q_segmentation: Array, k_segmentation: Array) -> Array:
    """[b, 1, q, k] bool: a query sees a key of its own segment that is not padding."""
    same = q_segmentation[:, :, None] == k_segmentation[:, None, :]
    return (same & (k_segmentation[:, None, :] > 0))[:, None]


def causal_mask(length: int) -> Array:
    """[1, 1, l, l] bool: position i sees positions <= i (decoder self-attention)."""
    return jnp.tril(jnp.ones((length, length), bool))[None, None]


@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """Which keys each query sees, described rather than built: a query sees the keys of its own
    segment (ids 1, 2, ...; 0 is padding, seen by no query) and, when `causal` (decoder
    self-attention), only those at or before its own position.

    `packed` False promises that both segmentations are `default_segmentation` of padded rows,
    one example per row with its padding at the end (as the pipeline pads), so a row's key
    length says all its key segment ids say. True (any segment ids) is always safe.
    """

    q_segments: Array  # [b, q]
    kv_segments: Array  # [b, k]
    causal: bool = False
    packed: bool = True


def dense_mask(mask: AttentionMask) -> Array:
    """[b, 1, q, k] bool: what the reference attention applies (segments, then causality)."""
    same = segment_mask(mask.q_segments, mask.kv_segments)
    return same & causal_mask(mask.q_segments.shape[1]) if mask.causal else same


def shift_right(targets: Array, segmentation: Array | None = None) -> Array:
    """Decoder inputs: targets moved one step right, BOS at the start of every segment."""
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=BOS_ID)[:, :-1]
    if segmentation is not None:
        previous = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
        shifted = jnp.where(segmentation != previous, BOS_ID, shifted)
    return shifted


# ---------------------------------------------------------------------------------------------
# Embeddings and positions (section 3.4, 3.5)


class SharedEmbedding(layers.Module):
    """One matrix for source embedding, target embedding and pre-softmax projection (3.4), and
    with `output_bias` a bias [vocab] on the logits (a departure: Marian's `final_logits_bias`)."""

    config: TransformerConfig

    def setup(self):
        c = self.config
        # Normal(0, d_model^-1/2): after the sqrt(d_model) scale the embeddings have unit variance.
        init = nn.initializers.normal(stddev=c.d_model**-0.5)
        self.embedding = self.param("embedding", init, (c.vocab_size, c.d_model), jnp.float32)
        self.bias = self.param("output_bias", nn.initializers.zeros_init(), (c.vocab_size,)) if c.output_bias else None

    def __call__(self, tokens: Array) -> Array:
        """Token ids [b, l] -> embeddings [b, l, d_model], multiplied by sqrt(d_model) (`scale_embedding`)."""
        c = self.config
        x = jnp.take(self.embedding, tokens, axis=0).astype(c.dtype)
        return x * jnp.asarray(math.sqrt(c.d_model), c.dtype) if c.scale_embedding else x

    def logits(self, x: Array) -> Array:
        """Decoder output [b, l, d_model] -> vocabulary logits [b, l, vocab], in the compute dtype."""
        return vocabulary_logits(x, self.embedding, self.config.dtype, self.bias)


def vocabulary_logits(x: Array, embedding: Array, dtype, bias: Array | None = None) -> Array:
    """The pre-softmax projection with the shared embedding [vocab, d_model]: x [..., d_model] ->
    logits [..., vocab] in `dtype` (the product accumulates in float32 either way), plus `bias`
    [vocab] if given. Consumers upcast inside their reductions (`optim.cross_entropy_sums`, the
    decoder's log-softmax), so a bfloat16 model never stores a float32 copy of [tokens, vocab]."""
    logits = jnp.einsum("...d,vd->...v", x.astype(dtype), embedding.astype(dtype))
    return logits if bias is None else logits + bias.astype(dtype)


def sinusoid_table(max_len: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same), [max_len, d_model].
    `layout` "halves" (Marian's): the same d_model/2 sines in features [0, d_model/2), the cosines after."""
    position = np.arange(max_len, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = position / np.power(10000.0, two_i / d_model)  # [max_len, d_model / 2]
    sines, cosines = np.sin(angle), np.cos(angle)
    if layout == "halves":
        return np.concatenate([sines, cosines], axis=1).astype(np.float32)
    table = np.empty((max_len, d_model), np.float32)
    table[:, 0::2] = sines
    table[:, 1::2] = cosines
    return table


class PositionalEncoding(layers.Module):
    """Sinusoidal positional encoding (3.5), or learned positional embeddings (row E)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, positions: Array) -> Array:
        """Positions [b, l] -> encodings [b, l, d_model]."""
        c = self.config
        if c.positional == "learned":
            # Scaled like the sinusoids (variance 1/2), so either option meets the same embeddings.
            init = nn.initializers.normal(stddev=math.sqrt(0.5))
            table = self.param("embedding", init, (c.max_len, c.d_model), jnp.float32)
        else:
            table = jnp.asarray(sinusoid_table(c.max_len, c.d_model, c.sinusoid_layout))
        return jnp.take(table, positions, axis=0).astype(c.dtype)


# ---------------------------------------------------------------------------------------------
# Attention (section 3.2)


def heads_first(x: Array) -> Array:
    """[b, t, h, d] -> [b, h, t, d]."""
    return x.transpose(0, 2, 1, 3)


def dot_product_attention(
    query: Array, key: Array, value: Array, mask: Array, dropout: Callable[[Array], Array]
) -> Array:
    """softmax(Q K^T / sqrt(d_k)) V per head; masked keys get the dtype's most negative value.

    query [b, h, q, d_k], key [b, h, k, d_k], value [b, h, k, d_v], mask [b|1, 1|h, q, k] ->
    [b, h, q, d_v]. Heads come before positions, the layout both products want: a decoder's
    cache kept this way is read in place at every step (kept [b, k, h, d], XLA copied each
    layer's whole cache into this order at every step: half the time of a beam search on a CPU).
    The softmax runs in float32; a fully masked row gives uniform weights, never NaN.
    """
    d_k = query.shape[-1]
    logits = jnp.einsum("bhqd,bhkd->bhqk", query, key).astype(jnp.float32) / math.sqrt(d_k)
    logits = logits + jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)
    weights = dropout(jax.nn.softmax(logits, axis=-1))  # [b, h, q, k]
    return jnp.einsum("bhqk,bhkd->bhqd", weights.astype(value.dtype), value)


def fused_mask_arguments(mask: AttentionMask, num_heads: int) -> dict[str, Any]:
    """What the fused route tells `jax.nn.dot_product_attention` about `mask`, the least that says it:

    - packed rows: the segment mask broadcast to [b, h, q, k] (cuDNN adds it to the logits as a
      bias: the products only it hides are computed all the same), and `is_causal` in decoder
      self-attention. Padding queries see every key (causality permitting, so at least the
      first): a query that sees none gives NaN gradients in cuDNN's kernel (measured on an
      H100: the base model's training loss was NaN from step 2), though its output is discarded;
    - padded rows, decoder self-attention: `is_causal` alone; a real query's earlier keys are all
      real, so padding needs no mask, and jax documents that cuDNN skips the masked half;
    - padded rows, other attention: `key_value_seq_lengths`, each row's number of real keys, at
      least 1: a row of padding alone (an eval batch's filler) attends to its first key, not to
      none, so its outputs stay finite.

    Real queries see exactly the reference's keys. Padding queries, whose outputs are discarded,
    see no key in the reference (uniform weights); here every query sees at least one key.
    """
    if mask.packed:
        padding = (mask.q_segments == 0)[:, None, :, None]  # [b, 1, q, 1]
        sees = segment_mask(mask.q_segments, mask.kv_segments) | padding  # [b, 1, q, k]
        b, _, q_len, k_len = sees.shape
        return {"mask": jnp.broadcast_to(sees, (b, num_heads, q_len, k_len)), "is_causal": mask.causal}
    if mask.causal:
        return {"is_causal": True}
    lengths = jnp.maximum((mask.kv_segments > 0).sum(-1), 1).astype(jnp.int32)  # [b]
    return {"key_value_seq_lengths": lengths}


def fused_attention(
    query: Array, key: Array, value: Array, mask: AttentionMask, implementation: str, offsets: bool = False
) -> Array:
    """The same attention through `jax.nn.dot_product_attention` (layout [b, t, h, d]), told about
    the mask what `fused_mask_arguments` says; `implementation` "cudnn" is the fused GPU kernel,
    "xla" jax's own (what tests run on a CPU). No attention dropout, and no weights to sow.

    `offsets` (model.segment_attention=cudnn_offsets, implementation "cudnn"): packed rows go to
    cuDNN as segments, offsets and lengths (`fxformer.kernels.segments`), instead of a dense mask;
    a batch with a row the layout cannot hold (more segments than it has room for) takes the
    dense mask, chosen on the device (`lax.cond`), so no row is ever given the wrong segments.

    Rows of an odd length get one padding position more (a query and a key of segment 0, which
    no real query sees: not its segment, beyond its length, or after it) and lose it again:
    cuDNN's kernel trains only on even lengths (on an H100 with jax 0.11.2 it refused 7 x 7 in
    decoder self-attention, `is_causal` alone; jax 0.10's check names a mask)."""
    q_len, k_len = query.shape[1], key.shape[1]
    same = mask.q_segments is mask.kv_segments  # self-attention: one segmentation for both sides
    if q_len % 2 or k_len % 2:

        def even(x: Array, length: int) -> Array:
            return jnp.pad(x, [(0, 0), (0, length % 2)] + [(0, 0)] * (x.ndim - 2))

        query, key, value = even(query, q_len), even(key, k_len), even(value, k_len)
        kv_segments = even(mask.kv_segments, k_len)
        q_segments = kv_segments if same else even(mask.q_segments, q_len)
        mask = dataclasses.replace(mask, q_segments=q_segments, kv_segments=kv_segments)
        return fused_attention(query, key, value, mask, implementation, offsets)[:, :q_len]
    if offsets and mask.packed:
        return offsets_or_mask(query, key, value, mask, same)
    arguments = fused_mask_arguments(mask, query.shape[2])
    return jax.nn.dot_product_attention(query, key, value, implementation=implementation, **arguments)


def offsets_or_mask(query: Array, key: Array, value: Array, mask: AttentionMask, same: bool) -> Array:
    """cuDNN's attention over packed segments (`fxformer.kernels.segments`), or, for a batch with
    a row the layout cannot hold, over the dense mask: chosen on the device by `lax.cond`, in the
    forward and in the backward pass. Its own gradient, because `lax.cond` differentiated by JAX
    makes the taken branch return zeros for the other branch's residuals, here a [b, h, q, k]
    bias and copies of Q, K, V a call; the packed route's residuals are kept, the mask's route
    recomputes its forward pass in the rare batch that takes it."""
    causal = mask.causal

    def masked(q, k, v, q_segments, kv_segments):
        arguments = fused_mask_arguments(AttentionMask(q_segments, kv_segments, causal), q.shape[2])
        return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", **arguments)

    def packed(q_segments, kv_segments):
        return lambda q, k, v: segments.packed_cudnn_attention(q, k, v, q_segments, kv_segments, causal, same)

    @jax.custom_vjp
    def attend(q, k, v, q_segments, kv_segments):
        out, fits = packed(q_segments, kv_segments)(q, k, v)
        return jax.lax.cond(fits, lambda: out, lambda: masked(q, k, v, q_segments, kv_segments))

    def forward(q, k, v, q_segments, kv_segments):
        out, pullback, fits = jax.vjp(packed(q_segments, kv_segments), q, k, v, has_aux=True)
        out = jax.lax.cond(fits, lambda: out, lambda: masked(q, k, v, q_segments, kv_segments))
        return out, (fits, pullback, q, k, v, q_segments, kv_segments)

    def backward(residuals, g):
        fits, pullback, q, k, v, q_segments, kv_segments = residuals

        def with_mask():
            return jax.vjp(lambda q, k, v: masked(q, k, v, q_segments, kv_segments), q, k, v)[1](g)

        return (*jax.lax.cond(fits, lambda: pullback(g), with_mask), None, None)

    attend.defvjp(forward, backward)
    return attend(query, key, value, mask.q_segments, mask.kv_segments)


def rows_per_example(x: Array, copies: int) -> Array:
    """[b, q, ...] -> [b / copies, copies x q, ...]: an example's rows (its beams or samples,
    example-major: i * copies + j) attend to its one memory as that many queries, so the memory
    is read once per example, not once per row."""
    return x.reshape(x.shape[0] // copies, copies * x.shape[1], *x.shape[2:])


Cache = Literal["none", "steps", "memory"]


class DenseParams(layers.Module):
    """The parameters `nn.Dense(features, use_bias)` of the same name makes, made and initialised as
    it makes them (the same names, shapes, initialisers and random keys), without its product: the
    kernel [in_features, features] and the bias (or None)."""

    features: int
    use_bias: bool

    @nn.compact
    def __call__(self, in_features: int) -> tuple[Array, Array | None]:
        kernel = self.param("kernel", xavier_uniform, (in_features, self.features), jnp.float32)
        bias = (
            self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32) if self.use_bias else None
        )
        return kernel, bias


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    With `config.decode`, `cache` says what the decoder keeps between calls: "steps" (its
    self-attention) appends each position's key and value to the `cache` collection, sized by
    the first call's length (what a beam search reorders); "memory" (encoder-decoder attention)
    projects the encoder output once, on the first call, into the `memory` collection and
    reuses it (the same for every step and beam); a memory of fewer rows than the queries'
    serves each example's consecutive rows (its beams or samples). "none" keeps nothing.
    """

    config: TransformerConfig
    cache: Cache = "none"  # only used when config.decode

    @nn.compact
    def __call__(self, inputs_q: Array, inputs_kv: Array, mask: AttentionMask, deterministic: bool) -> Array:
        """inputs_q [b, q, d_model] attends to inputs_kv [b, k, d_model] -> [b, q, d_model]."""
        c = self.config
        b, q_len, _ = inputs_q.shape
        query, kv = self._projections(inputs_q, inputs_kv)  # [b, q, h, d_k]; K, V where merged with Q
        if c.segment_attention == "pallas" and not c.decode:  # decoding attends one query: the reference path
            key, value = kv or self._keys_values(inputs_kv)
            segments = (mask.q_segments, mask.kv_segments)
            heads = segment_attention(query, key, value, *segments, mask.causal, block_k=c.segment_block_k)
        elif c.attention_impl == "cudnn" and not c.decode:
            offsets = c.segment_attention == "cudnn_offsets"
            heads = fused_attention(query, *(kv or self._keys_values(inputs_kv)), mask, "cudnn", offsets)
        else:
            heads = self._reference_attention(query, inputs_kv, mask, deterministic, kv)
        heads = heads.reshape(b, q_len, c.num_heads * c.d_v)  # Concat(head_1, ..., head_h)
        return self._dense(c.d_model, "out")(heads)

    def _dense(self, features: int, name: str) -> layers.Dense:
        """One of W^Q, W^K, W^V (all heads at once) or W^O."""
        c = self.config
        return layers.Dense(features, use_bias=c.attention_bias, kernel_init=xavier_uniform, dtype=c.dtype, name=name)

    def _heads(self, x: Array, name: str, width: int) -> Array:
        """x [b, t, d_model] times W^name -> [b, t, h, width]."""
        return self._dense(self.config.num_heads * width, name)(x).reshape(*x.shape[:2], self.config.num_heads, width)

    def _projections(self, inputs_q: Array, inputs_kv: Array) -> tuple[Array, tuple[Array, Array] | None]:
        """(Q W^Q, None), or with `qkv_projection` merged in self-attention (training and evaluation)
        (Q W^Q, (K W^K, V W^V)) from one product with the three matrices side by side."""
        c = self.config
        if c.qkv_projection != "merged" or inputs_q is not inputs_kv or c.decode:
            return self._heads(inputs_q, "query", c.d_k), None
        widths = {"query": c.d_k, "key": c.d_k, "value": c.d_v}
        parts = [
            DenseParams(c.num_heads * w, c.attention_bias, name=name)(inputs_q.shape[-1]) for name, w in widths.items()
        ]
        y = jnp.dot(inputs_q.astype(c.dtype), jnp.concatenate([k for k, _ in parts], axis=1).astype(c.dtype))
        if c.attention_bias:
            y = y + jnp.concatenate([b for _, b in parts]).astype(c.dtype)
        q, k, v = jnp.split(y, [c.num_heads * c.d_k, 2 * c.num_heads * c.d_k], axis=-1)
        heads = lambda x, w: x.reshape(*x.shape[:2], c.num_heads, w)  # noqa: E731
        return heads(q, c.d_k), (heads(k, c.d_k), heads(v, c.d_v))

    def _keys_values(self, inputs_kv: Array) -> tuple[Array, Array]:
        """K W^K [b, k, h, d_k] and V W^V [b, k, h, d_v]."""
        c = self.config
        return self._heads(inputs_kv, "key", c.d_k), self._heads(inputs_kv, "value", c.d_v)

    def _keeps(self, cache: Cache) -> bool:
        """Whether this call reads and writes the decoder's `cache` of that kind."""
        return self.config.decode and self.cache == cache

    def _reference_attention(
        self, query: Array, inputs_kv: Array, mask: AttentionMask, deterministic: bool, kv=None
    ) -> Array:
        """`dot_product_attention` on the dense mask, with the decoder's caches: query [b, q, h, d_k]
        -> [b, q, h, d_v]; `kv`: the keys and values where they are already projected."""
        b, q_len, h, _ = query.shape
        if self._keeps("memory"):
            key, value = self._memory(inputs_kv)  # [examples, h, k, d]
        else:
            key, value = map(heads_first, kv or self._keys_values(inputs_kv))  # [b, h, k, d]
        dense = dense_mask(mask)  # [b, 1, q, k]
        if self._keeps("steps"):
            key, value, dense = self._extend_cache(key, value, dense)
        copies = b // key.shape[0]  # rows per example that share one memory (beams, samples)
        query = heads_first(rows_per_example(query, copies))  # [b / copies, h, copies x q, d_k]
        heads = dot_product_attention(query, key, value, dense[::copies], self._attention_dropout(deterministic))
        return heads_first(heads).reshape(b, q_len, h, -1)  # from [b / copies, copies x q, h, d_v], rows in order

    def _attention_dropout(self, deterministic: bool) -> Callable[[Array], Array]:
        """Dropout on the weights [b, h, q, k] after the softmax, which it first sows for
        fxformer.attention_maps when asked (apply(..., mutable=["intermediates"])); otherwise sow does
        nothing, so training and decoding are unchanged."""
        dropout = make_dropout(self.config, self.config.attention_dropout_rate)

        def drop(weights: Array) -> Array:
            self.sow("intermediates", "attention_weights", weights)
            return dropout(weights, deterministic)

        return drop

    def _memory(self, inputs_kv: Array) -> tuple[Array, Array]:
        """Encoder-side key and value [examples, h, k, d]: projected from `inputs_kv` into the
        `memory` collection on the first call, read from it on every later one."""
        if not self.has_variable("memory", "key"):
            key, value = self._keys_values(inputs_kv)
            self.put_variable("memory", "key", heads_first(key))
            self.put_variable("memory", "value", heads_first(value))
        return self.get_variable("memory", "key"), self.get_variable("memory", "value")

    def _extend_cache(self, key: Array, value: Array, mask: Array) -> tuple[Array, Array, Array]:
        """Write this step's key and value [b, h, 1, d] at the cache index; mask out the unwritten slots."""
        initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
        index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        if not initialized:  # the init call only sizes the cache
            return key, value, mask
        i = index.value
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, 0, i, 0))
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, 0, i, 0))
        index.value = i + key.shape[2]
        max_len = cached_key.value.shape[2]
        mask = (jnp.arange(max_len) <= i)[None, None, None, :]  # [1, 1, 1, max_len]
        return cached_key.value, cached_value.value, mask


def grow_cache(cache, length: int):
    """The decoder's `cache` collection with room for `length` positions: zeros appended to each
    self-attention key and value [b, h, t, d], which the mask leaves out until they are written."""

    def grow(path, x):
        name = getattr(path[-1], "key", None)
        if name not in ("cached_key", "cached_value") or x.shape[2] >= length:
            return x
        return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))

    return jax.tree_util.tree_map_with_path(grow, cache)


# ---------------------------------------------------------------------------------------------
# Feed-forward network (3.3) and residual sub-layers (3.1)


ACTIVATIONS = {  # model.activation: "swish" is SiLU, x sigmoid(x); "gelu" the exact x Phi(x), not tanh's
    "relu": nn.relu,
    "swish": nn.silu,
    "gelu": functools.partial(nn.gelu, approximate=False),
}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (`activation`: another nonlinearity for max(0, .))."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        c = self.config
        h = layers.Dense(c.d_ff, kernel_init=xavier_uniform, dtype=c.dtype, name="hidden")(x)
        fused = c.residual_norm == "pallas" and c.activation == "relu"  # the kernel's nonlinearity is ReLU
        if fused and c.relu_dropout_rate > 0 and not deterministic:  # one kernel
            key = counter_dropout.key_data(self.make_rng("dropout"))
            h = counter_dropout.relu_dropout(key, h, counter_dropout.SITES["relu"], c.relu_dropout_rate)
        else:
            h = make_dropout(c, c.relu_dropout_rate)(ACTIVATIONS[c.activation](h), deterministic=deterministic)
        return layers.Dense(c.d_model, kernel_init=xavier_uniform, dtype=c.dtype, name="output")(h)


def residual(c: TransformerConfig, x: Array, sublayer, name: str, deterministic: bool) -> Array:
    """Post-norm LayerNorm(x + Dropout(Sublayer(x))), or pre-norm x + Dropout(Sublayer(LayerNorm(x))).

    Call it inside a compact method: the LayerNorm it creates belongs to the caller.
    """
    eps = c.layer_norm_epsilon
    if c.residual_norm == "pallas":  # post-norm (option_problem): dropout, sum and norm in one kernel
        norm = counter_dropout.DropoutResidualNorm(
            c.dropout_rate, counter_dropout.SITES[name], c.dtype, epsilon=eps, name=f"{name}_norm"
        )
        return norm(x, sublayer(x), deterministic)
    drop = make_dropout(c, c.dropout_rate)
    if c.norm == "post" and c.residual_norm == "fused":
        fused = ResidualLayerNorm(dtype=c.dtype, epsilon=eps, name=f"{name}_norm")
        return fused(x, drop(sublayer(x), deterministic=deterministic))
    norm = layers.LayerNorm(epsilon=eps, dtype=c.dtype, name=f"{name}_norm")
    if c.norm == "pre":
        return x + drop(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + drop(sublayer(x), deterministic=deterministic))


def make_dropout(c: TransformerConfig, rate: float) -> nn.Module:
    """Dropout at `rate`: Flax's (a float32 uniform per element), or with `dropout_bits` 8 from
    bytes (`fxformer.kernels.dropout`: a quarter of the random numbers)."""
    return byte_dropout.ByteDropout(rate) if c.dropout_bits == 8 else nn.Dropout(rate)


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each a residual sub-layer."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, mask: AttentionMask, deterministic: bool) -> Array:
        c = self.config
        attend = MultiHeadAttention(c, name="self_attention")
        x = residual(c, x, lambda y: attend(y, y, mask, deterministic), "self_attention", deterministic)
        ffn = FeedForward(c, name="feed_forward")
        return residual(c, x, lambda y: ffn(y, deterministic), "feed_forward", deterministic)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network."""

    config: TransformerConfig

    @nn.compact
    def __call__(
        self, x: Array, encoded: Array, self_mask: AttentionMask, cross_mask: AttentionMask, deterministic: bool
    ) -> Array:
        c = self.config
        attend = MultiHeadAttention(c, cache="steps", name="self_attention")
        x = residual(c, x, lambda y: attend(y, y, self_mask, deterministic), "self_attention", deterministic)
        cross = MultiHeadAttention(c, cache="memory", name="cross_attention")
        x = residual(c, x, lambda y: cross(y, encoded, cross_mask, deterministic), "cross_attention", deterministic)
        ffn = FeedForward(c, name="feed_forward")
        return residual(c, x, lambda y: ffn(y, deterministic), "feed_forward", deterministic)


# ---------------------------------------------------------------------------------------------
# Stacks and the model (3.1)


class Encoder(nn.Module):
    """Embeddings + positions, dropout, N encoder layers."""

    config: TransformerConfig
    embed: SharedEmbedding

    @nn.compact
    def __call__(self, inputs: Array, mask: AttentionMask, positions: Array, deterministic: bool) -> Array:
        c = self.config
        x = self.embed(inputs) + PositionalEncoding(c, name="positional")(positions)
        x = make_dropout(c, c.dropout_rate)(x, deterministic=deterministic)  # [b, l, d_model]
        for i in range(c.num_layers):
            x = EncoderLayer(c, name=f"layer_{i}")(x, mask, deterministic)
        if c.norm == "pre":
            x = layers.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=c.dtype, name="final_norm")(x)
        return x


class Decoder(nn.Module):
    """Embeddings + positions, dropout, N decoder layers, the shared pre-softmax projection."""

    config: TransformerConfig
    embed: SharedEmbedding

    @nn.compact
    def __call__(
        self,
        decoder_inputs: Array,
        encoded: Array,
        self_mask: AttentionMask,
        cross_mask: AttentionMask,
        positions: Array,
        deterministic: bool,
        project: bool = True,
    ) -> Array:
        c = self.config
        if c.decode:
            # One position per call: the position is a counter in the cache.
            initialized = self.has_variable("cache", "position")
            step = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
            if initialized:
                positions = jnp.full_like(decoder_inputs, step.value)
                step.value = step.value + decoder_inputs.shape[1]
        x = self.embed(decoder_inputs) + PositionalEncoding(c, name="positional")(positions)
        x = make_dropout(c, c.dropout_rate)(x, deterministic=deterministic)
        for i in range(c.num_layers):
            x = DecoderLayer(c, name=f"layer_{i}")(x, encoded, self_mask, cross_mask, deterministic)
        if c.norm == "pre":
            x = layers.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=c.dtype, name="final_norm")(x)
        return self.embed.logits(x) if project else x


class Transformer(nn.Module):
    """The encoder-decoder Transformer; `__call__` is the teacher-forced forward pass."""

    config: TransformerConfig

    def setup(self):
        self.embed = SharedEmbedding(self.config)
        self.encoder = Encoder(self.config, self.embed)
        self.decoder = Decoder(self.config, self.embed)

    def encode(
        self,
        inputs: Array,
        inputs_segmentation: Array | None = None,
        inputs_positions: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        """Source ids [b, l] -> encoder output [b, l, d_model]; no `inputs_segmentation`: padded rows."""
        packed = inputs_segmentation is not None
        if not packed:
            inputs_segmentation = default_segmentation(inputs)
        if inputs_positions is None:
            inputs_positions = default_positions(inputs)
        mask = AttentionMask(inputs_segmentation, inputs_segmentation, packed=packed)
        return self.encoder(inputs, mask, inputs_positions, deterministic)

    def decode(
        self,
        encoded: Array,
        inputs_segmentation: Array,
        targets: Array,
        targets_segmentation: Array | None = None,
        targets_positions: Array | None = None,
        deterministic: bool = True,
        inputs_packed: bool = True,
        project: bool = True,
    ) -> Array:
        """Target ids [b, l] -> logits [b, l, vocab] predicting each target from the ones before
        (`project` False: the decoder's output [b, l, d_model] before the pre-softmax projection).

        No `targets_segmentation`: padded rows. `inputs_packed` False promises `inputs_segmentation`
        is `default_segmentation` of padded rows (see `AttentionMask.packed`).
        With `config.decode`, `targets` is the previous token [b, 1] (BOS first) and the
        logits predict the next one; the cache carries everything earlier.
        """
        targets_packed = targets_segmentation is not None
        if self.config.decode:
            decoder_inputs = targets
            targets_segmentation = jnp.ones_like(targets)  # after the sizing call, the cache index masks self-attention
        else:
            if targets_segmentation is None:
                decoder_inputs = shift_right(targets)
                targets_segmentation = default_segmentation(targets)
            else:
                decoder_inputs = shift_right(targets, targets_segmentation)
        if targets_positions is None:
            targets_positions = default_positions(targets)
        self_mask = AttentionMask(targets_segmentation, targets_segmentation, causal=True, packed=targets_packed)
        cross_mask = AttentionMask(targets_segmentation, inputs_segmentation, packed=targets_packed or inputs_packed)
        return self.decoder(decoder_inputs, encoded, self_mask, cross_mask, targets_positions, deterministic, project)

    def __call__(
        self,
        inputs: Array,
        targets: Array,
        inputs_segmentation: Array | None = None,
        targets_segmentation: Array | None = None,
        inputs_positions: Array | None = None,
        targets_positions: Array | None = None,
        deterministic: bool = True,
        project: bool = True,
    ) -> Array:
        """Source ids [b, l_src], target ids [b, l_tgt] -> logits [b, l_tgt, vocab] (`project`
        False: the decoder's output [b, l_tgt, d_model]). Without segmentations, each row is one
        example padded at its end."""
        encoded = self.encode(inputs, inputs_segmentation, inputs_positions, deterministic)
        inputs_packed = inputs_segmentation is not None
        if not inputs_packed:
            inputs_segmentation = default_segmentation(inputs)
        return self.decode(
            encoded,
            inputs_segmentation,
            targets,
            targets_segmentation,
            targets_positions,
            deterministic,
            inputs_packed,
            project,
        )


def shared_embedding(params) -> Array:
    """The shared embedding matrix [vocab, d_model] in a Transformer's parameters."""
    return params["embed"]["embedding"]


def output_bias(params) -> Array | None:
    """The logits' bias [vocab] in a Transformer's parameters (`output_bias`), or None."""
    return params["embed"].get("output_bias")


def init_params(model: Transformer, key: Array):
    """Xavier-initialised parameters of `model` (their shapes do not depend on the dummy batch)."""
    tokens = jnp.ones((1, 8), jnp.int32)
    return model.init(key, tokens, tokens)["params"]
