"""Packed rows told to cuDNN as segments: where each sentence starts and how long it is, instead
of a dense [b, h, q, k] mask.

cuDNN's fused attention takes packed rows ("THD" layout, jax-ml/jax#25812, openxla/xla#20861):
per row, the offset of each segment (`q_offsets` / `kv_offsets`, [b, M + 1]) and its length
(`q_seqlen` / `kv_seqlen`, [b, M]), -1 past a row's last segment; segment m of the queries
attends to segment m of the keys and nothing else. JAX reaches it only through its private
`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention` (checked on jax 0.10.2 and at
jax's main branch of 2026-08, 0.11.1.dev: the same arguments), so `packed_cudnn_attention` checks
that function's signature before calling it and refuses in one sentence where it differs.

`segment_layout` is the glue, a pure function of the segment ids (tested on the CPU): rows as
the pipeline packs them (segments 1, 2, ..., n in order, each one run, padding 0 at the end). Its
one subtlety: cuDNN leaves positions outside every segment unwritten (jax's own test multiplies
its outputs and gradients by the padding mask before comparing), and an unwritten gradient
would reach the projections' weights. So the padding run of a row is one more segment, which
attends to itself: every position is written, the padding's outputs are discarded by the loss
as before, and no real query sees a padding key. In cross-attention the two sides' padding runs
differ in length, and one may be empty; `packed_cudnn_attention` adds two padding positions to
both sides there (the length stays even, as cuDNN wants), so each side has a padding segment.
"""

from __future__ import annotations

import inspect
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class SegmentLayout(NamedTuple):
    """One side's packed rows as cuDNN takes them; `fits` False: some row cannot be said so
    (more segments than the layout has room for, or not segments 1..n in runs then padding)."""

    offsets: Array  # [b, M + 1] int32: where segment m of a row starts; -1 past its last
    lengths: Array  # [b, M] int32: its length; -1 past the last
    count: Array  # [b] int32: segments of each row, the padding segment included
    fits: Array  # [] bool


def segment_layout(segment_ids: Array, max_segments: int) -> SegmentLayout:
    """The layout of [b, l] segment ids (1, 2, ..., 0 = padding), the padding run of each row
    (where it has one) as its last segment; at most `max_segments` segments a row, padding's
    included."""
    ids = segment_ids.astype(jnp.int32)
    real = ids.max(axis=1, keepdims=True)  # [b, 1]: segments a row holds, padding's not counted
    covered = jnp.where(ids > 0, ids, real + 1)  # [b, l]: padding is segment n + 1
    m = jnp.arange(1, max_segments + 1, dtype=jnp.int32)
    lengths = (covered[:, :, None] == m).sum(axis=1, dtype=jnp.int32)  # [b, M]
    starts = jnp.cumsum(lengths, axis=1, dtype=jnp.int32) - lengths  # runs in order: each starts where the last ended
    present = lengths > 0
    offsets = jnp.pad(jnp.where(present, starts, -1), ((0, 0), (0, 1)), constant_values=-1)
    count = present.sum(axis=1, dtype=jnp.int32)
    in_order = (jnp.diff(covered, axis=1) >= 0).all(axis=1)  # runs of 1, 2, ... then padding
    no_gaps = count == covered.max(axis=1)  # every id up to the last present: none skipped, none beyond M
    return SegmentLayout(offsets, jnp.where(present, lengths, -1), count, (in_order & no_gaps).all())


def max_segments_for(length: int) -> int:
    """Room in the layout for rows of `length`: a sentence of at least 8 tokens on average (a
    row of 256: 32, padding included; WMT rows hold about 8), so the kernel is not launched for
    hundreds of empty segments; rows with more take the dense mask instead (`fits`)."""
    return max(2, length // 8)


def packed_cudnn_problem() -> str | None:
    """Why this jax cannot take packed segments to cuDNN, in one sentence, or None when it can."""
    version = tuple(int(part) for part in jax.__version__.split(".")[:3] if part.isdigit())
    if version < (0, 5, 1):
        return (
            f"model.segment_attention=cudnn_offsets needs jax 0.5.1 or later (cuDNN's packed segments), not {version}"
        )
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fused  # noqa: PLC0415 (private, checked here)
    except ImportError as e:
        return f"model.segment_attention=cudnn_offsets: jax {jax.__version__} has no cuDNN attention module ({e})"
    wanted = {"q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "scale", "mask_type", "qkv_layout"}
    missing = wanted - set(inspect.signature(fused.dot_product_attention).parameters)
    if missing or not hasattr(fused, "MaskType"):
        return (
            f"model.segment_attention=cudnn_offsets: jax {jax.__version__}'s private cuDNN attention lacks "
            f"{sorted(missing) or 'MaskType'}; use model.segment_attention=mask"
        )
    return None


def packed_cudnn_attention(
    query: Array, key: Array, value: Array, q_segments: Array, kv_segments: Array, causal: bool, self_attention: bool
) -> tuple[Array, Array]:
    """(cuDNN's attention over packed segments [b, q, h, d], whether every row fit the layout).

    query [b, q, h, d], key and value [b, k, h, d]; segment ids [b, q] and [b, k]. Where a row
    does not fit (`SegmentLayout.fits`), the output is not to be used: the caller takes another
    route then (`fxformer.model.fused_attention` chooses with `lax.cond`)."""
    problem = packed_cudnn_problem()
    if problem:
        raise RuntimeError(problem)
    from jax._src.cudnn import fused_attention_stablehlo as fused  # noqa: PLC0415

    q_len = query.shape[1]
    if not self_attention:  # give both sides a padding segment, and keep the lengths even

        def extend(x: Array) -> Array:
            return jnp.pad(x, [(0, 0), (0, 2)] + [(0, 0)] * (x.ndim - 2))

        query, key, value, q_segments, kv_segments = map(extend, (query, key, value, q_segments, kv_segments))
    room = max_segments_for(max(query.shape[1], key.shape[1]))
    q_layout = segment_layout(q_segments, room)
    kv_layout = q_layout if self_attention else segment_layout(kv_segments, room)
    paired = (q_layout.count == kv_layout.count).all()  # segment m meets segment m: the same sentences
    out = fused.dot_product_attention(
        query,
        key,
        value,
        None,
        None,
        q_layout.lengths,
        kv_layout.lengths,
        q_layout.offsets,
        kv_layout.offsets,
        scale=1.0 / math.sqrt(query.shape[-1]),
        mask_type=fused.MaskType.CAUSAL if causal else fused.MaskType.NO_MASK,
        qkv_layout="BTNH",
    )
    return out[:, :q_len], q_layout.fits & kv_layout.fits & paired
