"""The Transformer of "Attention Is All You Need", section 3, as Flax linen modules.

Read it next to the paper: one module per concept, each docstring names what it
implements. Every module is a pure function of its parameters (`init`/`apply`).

Shapes: b = batch, q = query length, k = key length, l = length, h = heads.
Packed rows (several examples in one row) carry `segmentation` ids (1, 2, ...,
0 for padding) and per-segment `positions`; attention never crosses segments.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fxformer.errors import UserError
from fxformer.resolve import head_width
from fxformer.tokens import BOS_ID, PAD_ID

Array = jax.Array
xavier_uniform = nn.initializers.xavier_uniform()  # every weight matrix (section 5.4 / t2t)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of one model; the names are the paper's symbols."""

    vocab_size: int
    num_layers: int = 6  # N
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8  # h
    d_k: int = 0  # 0: d_model / h
    d_v: int = 0  # 0: d_model / h
    dropout_rate: float = 0.1  # P_drop: sub-layer outputs, embeddings + positions
    attention_dropout_rate: float = 0.0  # departure: dropout on attention weights
    relu_dropout_rate: float = 0.0  # departure: dropout inside the feed-forward network
    positional: str = "sinusoidal"  # or "learned" (Table 3 row E)
    max_len: int = 512  # size of the positional table
    norm: str = "post"  # "post": LayerNorm(x + Dropout(f(x))); "pre": x + Dropout(f(LayerNorm(x)))
    attention_bias: bool = False  # departure when True: biases on the Q, K, V and output projections
    dtype: Any = jnp.float32  # compute dtype; parameters stay float32
    attention_impl: str = "xla"  # "xla" (the reference) or "cudnn" (fused); from_config resolves "auto"
    decode: bool = False  # one target position per call, with a key/value cache

    def __post_init__(self):
        """Resolve d_k = d_v = 0 to d_model / h; refuse settings the model cannot be built with."""
        for key in ("d_k", "d_v"):
            if getattr(self, key) == 0 and self.num_heads > 0:
                object.__setattr__(self, key, head_width(self.d_model, self.num_heads, key))
        sizes = {f: getattr(self, f) for f in ("num_layers", "d_model", "d_ff", "num_heads", "d_k", "d_v", "max_len")}
        rates = {f: getattr(self, f) for f in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate")}
        problems = [f"model.{f} must be positive, not {v}" for f, v in sizes.items() if v <= 0]
        problems += [f"model.{f} must be in [0, 1), not {v}" for f, v in rates.items() if not 0 <= v < 1]
        if self.positional not in ("sinusoidal", "learned"):
            problems.append(f"model.positional must be 'sinusoidal' or 'learned', not {self.positional!r}")
        if self.norm not in ("post", "pre"):
            problems.append(f"model.norm must be 'post' or 'pre', not {self.norm!r}")
        if self.attention_impl not in ("xla", "cudnn"):
            problems.append(f"model.attention_impl must be 'xla', 'cudnn' or 'auto', not {self.attention_impl!r}")
        if self.d_model % 2:
            problems.append(f"model.d_model must be even (sinusoids come in sin/cos pairs), not {self.d_model}")
        if problems:
            raise UserError(problems[0] + ".")

    @classmethod
    def from_config(cls, model_config, vocab_size: int, **overrides) -> TransformerConfig:
        """Build from the `model` section of an ml_collections experiment config."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"vocab_size", "dtype", "decode"}
        kwargs = {name: model_config[name] for name in fields if name in model_config}
        dtype = model_config.get("dtype", "float32")
        if dtype not in ("float32", "bfloat16"):
            raise UserError(f"model.dtype must be 'float32' or 'bfloat16', not {dtype!r}.")
        kwargs["dtype"] = jnp.dtype(dtype)
        kwargs = {**kwargs, **overrides}
        kwargs["attention_impl"] = attention_implementation(kwargs, jax.default_backend())
        return cls(vocab_size=vocab_size, **kwargs)


def attention_implementation(fields: dict, backend: str) -> str:
    """`model.attention_impl` resolved for this machine: "xla" (hand-written, the reference) or
    "cudnn" (`jax.nn.dot_product_attention`'s fused kernel: the masked half of causal attention
    is never computed). "auto" takes cudnn where it serves and xla elsewhere; "cudnn" where it
    cannot serve is refused in one sentence, never silently changed."""
    wanted = fields.get("attention_impl", "xla")
    if wanted == "xla":
        return "xla"
    d_k, d_v = fields.get("d_k", 0), fields.get("d_v", 0)
    reasons = [
        (backend != "gpu", f"a GPU (this is {backend})"),
        (d_k != d_v, f"d_k == d_v (here {d_k} vs {d_v})"),
        (fields.get("attention_dropout_rate", 0.0) > 0, "attention_dropout_rate 0"),
        (jnp.dtype(fields.get("dtype", "float32")) != jnp.bfloat16, "dtype bfloat16"),
    ]
    missing = [what for failed, what in reasons if failed]
    if wanted == "auto":
        return "xla" if missing else "cudnn"
    if wanted == "cudnn" and missing:
        raise UserError(
            f"model.attention_impl=cudnn needs {missing[0]}; use model.attention_impl=auto (cudnn where it "
            "serves) or xla."
        )
    return wanted


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


def shift_right(targets: Array, segmentation: Array | None = None) -> Array:
    """Decoder inputs: targets moved one step right, BOS at the start of every segment."""
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=BOS_ID)[:, :-1]
    if segmentation is not None:
        previous = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
        shifted = jnp.where(segmentation != previous, BOS_ID, shifted)
    return shifted


# ---------------------------------------------------------------------------------------------
# Embeddings and positions (section 3.4, 3.5)


class SharedEmbedding(nn.Module):
    """One matrix for source embedding, target embedding and pre-softmax projection (3.4)."""

    config: TransformerConfig

    def setup(self):
        c = self.config
        # Normal(0, d_model^-1/2): after the sqrt(d_model) scale the embeddings have unit variance.
        init = nn.initializers.normal(stddev=c.d_model**-0.5)
        self.embedding = self.param("embedding", init, (c.vocab_size, c.d_model), jnp.float32)

    def __call__(self, tokens: Array) -> Array:
        """Token ids [b, l] -> embeddings [b, l, d_model], multiplied by sqrt(d_model)."""
        c = self.config
        x = jnp.take(self.embedding, tokens, axis=0).astype(c.dtype)
        return x * jnp.asarray(math.sqrt(c.d_model), c.dtype)

    def logits(self, x: Array) -> Array:
        """Decoder output [b, l, d_model] -> vocabulary logits [b, l, vocab], float32."""
        logits = jnp.einsum("bld,vd->blv", x, self.embedding.astype(self.config.dtype))
        return logits.astype(jnp.float32)


def sinusoid_table(max_len: int, d_model: int) -> np.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same), [max_len, d_model]."""
    position = np.arange(max_len, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = position / np.power(10000.0, two_i / d_model)  # [max_len, d_model / 2]
    table = np.empty((max_len, d_model), np.float32)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle)
    return table


class PositionalEncoding(nn.Module):
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
            table = jnp.asarray(sinusoid_table(c.max_len, c.d_model))
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


def fused_attention(query: Array, key: Array, value: Array, mask: Array, implementation: str | None) -> Array:
    """The same attention through `jax.nn.dot_product_attention` (layout [b, t, h, d], the
    mask broadcast to [b, h, q, k]); `implementation` "cudnn" is the fused GPU kernel, "xla"
    jax's own reference (used to test this route on a CPU). No attention dropout."""
    b, q_len, h, _ = query.shape
    mask = jnp.broadcast_to(mask, (b, h, q_len, key.shape[1]))
    return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation=implementation)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    With `config.decode`, `cache` says what the decoder keeps between calls: "steps" (its
    self-attention) appends each position's key and value to the `cache` collection, sized by
    the first call's length (what a beam search reorders); "memory" (encoder-decoder attention)
    projects the encoder output once, on the first call, into the `memory` collection and
    reuses it (the same for every step and beam); a memory of fewer rows than the queries'
    serves each example's consecutive rows (its beams or samples).
    """

    config: TransformerConfig
    cache: str = ""  # "", "steps" or "memory": see above; only used when config.decode

    @nn.compact
    def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Array, deterministic: bool) -> Array:
        c = self.config
        b, q_len, _ = inputs_q.shape
        dense = lambda features, name: nn.Dense(  # noqa: E731
            features, use_bias=c.attention_bias, kernel_init=xavier_uniform, dtype=c.dtype, name=name
        )
        query = dense(c.num_heads * c.d_k, "query")(inputs_q).reshape(b, q_len, c.num_heads, c.d_k)

        def project_kv():  # key [b, k, h, d_k], value [b, k, h, d_v]
            key = dense(c.num_heads * c.d_k, "key")(inputs_kv).reshape(b, -1, c.num_heads, c.d_k)
            value = dense(c.num_heads * c.d_v, "value")(inputs_kv).reshape(b, -1, c.num_heads, c.d_v)
            return key, value

        if c.attention_impl == "cudnn" and not c.decode:  # decoding attends one query: the reference path
            heads = fused_attention(query, *project_kv(), mask, "cudnn")
        else:
            copies = 1  # rows per example that share one memory (beams, samples)
            if c.decode and self.cache == "memory":
                if not self.has_variable("memory", "key"):
                    key, value = project_kv()
                    self.put_variable("memory", "key", heads_first(key))
                    self.put_variable("memory", "value", heads_first(value))
                key, value = self.get_variable("memory", "key"), self.get_variable("memory", "value")
                copies = b // key.shape[0]
            else:
                key, value = map(heads_first, project_kv())
            if c.decode and self.cache == "steps":
                key, value, mask = self._extend_cache(key, value, mask)
            dropout = nn.Dropout(c.attention_dropout_rate)

            def drop(weights: Array) -> Array:  # [b, h, q, k], after the softmax
                # Kept for fxformer.attention only when asked (apply(..., mutable=["intermediates"]));
                # otherwise sow does nothing, so training and decoding are unchanged.
                self.sow("intermediates", "attention_weights", weights)
                return dropout(weights, deterministic)

            # An example's rows attend to its memory as that many queries: the memory is read
            # once per example, not once per beam. Rows are example-major (i * copies + j).
            query = query.reshape(b // copies, copies * q_len, c.num_heads, c.d_k)
            mask = mask[::copies]  # the same for every copy of an example
            heads = dot_product_attention(heads_first(query), key, value, mask, drop)
            heads = heads_first(heads)  # [b / copies, copies x q, h, d_v]: the rows' order, as below
        heads = heads.reshape(b, q_len, c.num_heads * c.d_v)  # Concat(head_1, ..., head_h)
        return dense(c.d_model, "out")(heads)

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


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        c = self.config
        h = nn.relu(nn.Dense(c.d_ff, kernel_init=xavier_uniform, dtype=c.dtype, name="hidden")(x))
        h = nn.Dropout(c.relu_dropout_rate)(h, deterministic=deterministic)
        return nn.Dense(c.d_model, kernel_init=xavier_uniform, dtype=c.dtype, name="output")(h)


def residual(c: TransformerConfig, x: Array, sublayer, name: str, deterministic: bool) -> Array:
    """Post-norm LayerNorm(x + Dropout(Sublayer(x))), or pre-norm x + Dropout(Sublayer(LayerNorm(x))).

    Call it inside a compact method: the LayerNorm it creates belongs to the caller.
    """
    norm = nn.LayerNorm(dtype=c.dtype, name=f"{name}_norm")
    drop = nn.Dropout(c.dropout_rate)
    if c.norm == "pre":
        return x + drop(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + drop(sublayer(x), deterministic=deterministic))


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each a residual sub-layer."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
        c = self.config
        attend = MultiHeadAttention(c, name="self_attention")
        x = residual(c, x, lambda y: attend(y, y, mask, deterministic), "self_attention", deterministic)
        ffn = FeedForward(c, name="feed_forward")
        return residual(c, x, lambda y: ffn(y, deterministic), "feed_forward", deterministic)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array, encoded: Array, self_mask: Array, cross_mask: Array, deterministic: bool) -> Array:
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
    def __call__(self, inputs: Array, segmentation: Array, positions: Array, deterministic: bool) -> Array:
        c = self.config
        x = self.embed(inputs) + PositionalEncoding(c, name="positional")(positions)
        x = nn.Dropout(c.dropout_rate)(x, deterministic=deterministic)  # [b, l, d_model]
        mask = segment_mask(segmentation, segmentation)
        for i in range(c.num_layers):
            x = EncoderLayer(c, name=f"layer_{i}")(x, mask, deterministic)
        if c.norm == "pre":
            x = nn.LayerNorm(dtype=c.dtype, name="final_norm")(x)
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
        inputs_segmentation: Array,
        segmentation: Array,
        positions: Array,
        deterministic: bool,
    ) -> Array:
        c = self.config
        if c.decode:
            # One position per call: the position is a counter in the cache.
            initialized = self.has_variable("cache", "position")
            step = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
            if initialized:
                positions = jnp.full_like(decoder_inputs, step.value)
                step.value = step.value + decoder_inputs.shape[1]
            self_mask = causal_mask(decoder_inputs.shape[1])  # replaced by the cache mask
        else:
            self_mask = segment_mask(segmentation, segmentation) & causal_mask(decoder_inputs.shape[1])
        cross_mask = segment_mask(segmentation, inputs_segmentation)
        x = self.embed(decoder_inputs) + PositionalEncoding(c, name="positional")(positions)
        x = nn.Dropout(c.dropout_rate)(x, deterministic=deterministic)
        for i in range(c.num_layers):
            x = DecoderLayer(c, name=f"layer_{i}")(x, encoded, self_mask, cross_mask, deterministic)
        if c.norm == "pre":
            x = nn.LayerNorm(dtype=c.dtype, name="final_norm")(x)
        return self.embed.logits(x)


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
        """Source ids [b, l] -> encoder output [b, l, d_model]."""
        if inputs_segmentation is None:
            inputs_segmentation = default_segmentation(inputs)
        if inputs_positions is None:
            inputs_positions = default_positions(inputs)
        return self.encoder(inputs, inputs_segmentation, inputs_positions, deterministic)

    def decode(
        self,
        encoded: Array,
        inputs_segmentation: Array,
        targets: Array,
        targets_segmentation: Array | None = None,
        targets_positions: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        """Target ids [b, l] -> logits [b, l, vocab] predicting each target from the ones before.

        With `config.decode`, `targets` is the previous token [b, 1] (BOS first) and the
        logits predict the next one; the cache carries everything earlier.
        """
        if self.config.decode:
            decoder_inputs = targets
            targets_segmentation = jnp.ones_like(targets)
        else:
            if targets_segmentation is None:
                decoder_inputs = shift_right(targets)
                targets_segmentation = default_segmentation(targets)
            else:
                decoder_inputs = shift_right(targets, targets_segmentation)
        if targets_positions is None:
            targets_positions = default_positions(targets)
        return self.decoder(
            decoder_inputs, encoded, inputs_segmentation, targets_segmentation, targets_positions, deterministic
        )

    def __call__(
        self,
        inputs: Array,
        targets: Array,
        inputs_segmentation: Array | None = None,
        targets_segmentation: Array | None = None,
        inputs_positions: Array | None = None,
        targets_positions: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        """Source ids [b, l_src], target ids [b, l_tgt] -> logits [b, l_tgt, vocab]."""
        if inputs_segmentation is None:
            inputs_segmentation = default_segmentation(inputs)
        encoded = self.encode(inputs, inputs_segmentation, inputs_positions, deterministic)
        return self.decode(
            encoded, inputs_segmentation, targets, targets_segmentation, targets_positions, deterministic
        )
