"""softmax(Q K^T / sqrt(d_k)) V over packed rows, computed tile by tile and only where a
segment can see: a flash-attention kernel in Pallas (FlashAttention-2's online softmax, Dao
2023), forward and backward, that takes the segment ids of both sides.

What it computes: a query of segment s (ids 1, 2, ...; 0 is padding) sees the keys of segment s,
and with `causal` only those at or before its own position: `fxformer.model.dense_mask`. A query
that sees no key (padding) gets output 0 and passes no gradient, where the reference gives it
uniform weights; its output is discarded either way (the loss weighs padding 0).

Why a kernel: a packed row of 256 holds about eight sentences, so most of the dense [q, k]
products are hidden by the segment mask; the XLA path computes them all and cuDNN is given the
mask as a dense [b, h, q, k] bias. Here a [block_q, block_k] tile is visited only when one of
its query-key pairs is visible (`block_ranges`, from the segment ids, once per mask), and the
probabilities never leave the chip: the forward pass keeps one float32 log-sum-exp per query,
and the backward pass recomputes each tile from it.

Layout [b, t, h, d], the model's: no transposes. On a GPU the kernel is compiled by Triton;
elsewhere Pallas interprets it (`interpret`), which is how the CPU tests run it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from fxformer.kernels import pallas

Array = jax.Array


def block_ranges(q_segments: Array, kv_segments: Array, block_q: int, block_k: int, causal: bool) -> tuple:
    """(first, end) [b, q / block_q] of the key blocks each query block must visit, and (first,
    end) [b, k / block_k] of the query blocks each key block must visit: the span of the tiles
    that hold a visible query-key pair (none: an empty span, 0 to 0). Exact for any segment ids;
    for packed rows (each segment one run) every tile inside a span is visible too."""
    same = (q_segments[:, :, None] == kv_segments[:, None, :]) & (q_segments[:, :, None] > 0)  # [b, q, k]
    if causal:
        same &= jnp.tril(jnp.ones(same.shape[1:], bool))
    b, q_len, k_len = same.shape
    tiles = same.reshape(b, q_len // block_q, block_q, k_len // block_k, block_k).any(axis=(2, 4))  # [b, nq, nk]

    def span(visible: Array) -> tuple[Array, Array]:  # [b, n, m] -> first and end along m, [b, n]
        m = visible.shape[-1]
        first = jnp.argmax(visible, axis=-1)
        end = m - jnp.argmax(visible[..., ::-1], axis=-1)
        any_ = visible.any(axis=-1)
        return jnp.where(any_, first, 0).astype(jnp.int32), jnp.where(any_, end, 0).astype(jnp.int32)

    return span(tiles), span(tiles.transpose(0, 2, 1))


def _visible(q_seg: Array, k_seg: Array, q_pos: Array, k_pos: Array, causal: bool) -> Array:
    """[block_q, block_k] bool: the query-key pairs of one tile that the mask lets through."""
    seen = (q_seg[:, None] == k_seg[None, :]) & (q_seg[:, None] > 0)
    return seen & (q_pos[:, None] >= k_pos[None, :]) if causal else seen


def _forward_kernel(first_ref, end_ref, q_ref, k_ref, v_ref, qs_ref, ks_ref, o_ref, lse_ref, *, scale, causal, bk):
    """One query block of one row and head: the online softmax over its span of key blocks."""
    bq = q_ref.shape[0]
    q, q_seg = q_ref[...], qs_ref[...]  # [bq, d_k], [bq]
    q_pos = pl.program_id(2) * bq + jnp.arange(bq)

    def visit(j, carry):
        acc, top, total = carry  # [bq, d_v], [bq], [bq]: unnormalised output, running max, running sum
        keys = pl.ds(j * bk, bk)
        s = jnp.dot(q, k_ref[keys, :].T, preferred_element_type=jnp.float32) * scale  # [bq, bk]
        s = jnp.where(_visible(q_seg, ks_ref[keys], q_pos, j * bk + jnp.arange(bk), causal), s, -jnp.inf)
        new_top = jnp.maximum(top, s.max(axis=-1))
        base = jnp.where(new_top == -jnp.inf, 0.0, new_top)  # a query that has seen nothing yet: no nan
        p = jnp.exp(s - base[:, None])
        rescale = jnp.exp(top - base)
        v = v_ref[keys, :]
        acc = acc * rescale[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return acc, new_top, total * rescale + p.sum(axis=-1)

    start = (jnp.zeros((bq, v_ref.shape[-1]), jnp.float32), jnp.full((bq,), -jnp.inf), jnp.zeros((bq,)))
    acc, top, total = jax.lax.fori_loop(first_ref[()], end_ref[()], visit, start)
    seen = total > 0
    safe = jnp.where(seen, total, 1.0)
    o_ref[...] = jnp.where(seen[:, None], acc / safe[:, None], 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, top + jnp.log(safe), 0.0)  # 0 for padding: exp(-inf - 0) = 0 later


def _dq_kernel(first_ref, end_ref, q_ref, k_ref, v_ref, qs_ref, ks_ref, do_ref, lse_ref, delta_ref, dq_ref, **kw):
    """dQ of one query block: dS = P (dP - delta), dQ = dS K / sqrt(d_k), over its key blocks."""
    scale, causal, bk = kw["scale"], kw["causal"], kw["bk"]
    bq = q_ref.shape[0]
    q, q_seg, do = q_ref[...], qs_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]  # [bq] each
    q_pos = pl.program_id(2) * bq + jnp.arange(bq)

    def visit(j, dq):
        keys = pl.ds(j * bk, bk)
        k, v = k_ref[keys, :], v_ref[keys, :]
        s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * scale
        visible = _visible(q_seg, ks_ref[keys], q_pos, j * bk + jnp.arange(bk), causal)
        p = jnp.where(visible, jnp.exp(s - lse[:, None]), 0.0)  # [bq, bk]
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    dq = jax.lax.fori_loop(first_ref[()], end_ref[()], visit, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(
    first_ref, end_ref, q_ref, k_ref, v_ref, qs_ref, ks_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, **kw
):
    """dK and dV of one key block: dV = P^T dO, dK = dS^T Q / sqrt(d_k), over its query blocks."""
    scale, causal, bq = kw["scale"], kw["causal"], kw["bq"]
    bk = k_ref.shape[0]
    k, v, k_seg = k_ref[...], v_ref[...], ks_ref[...]
    k_pos = pl.program_id(2) * bk + jnp.arange(bk)

    def visit(i, carry):
        dk, dv = carry
        queries = pl.ds(i * bq, bq)
        q, do = q_ref[queries, :], do_ref[queries, :]
        s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * scale  # [bq, bk]
        visible = _visible(qs_ref[queries], k_seg, i * bq + jnp.arange(bq), k_pos, causal)
        p = jnp.where(visible, jnp.exp(s - lse_ref[queries][:, None]), 0.0)
        dv = dv + jnp.dot(p.T.astype(do.dtype), do, preferred_element_type=jnp.float32)
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds = p * (dp - delta_ref[queries][:, None])
        return dk + jnp.dot(ds.T.astype(q.dtype), q, preferred_element_type=jnp.float32), dv

    zeros = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    dk, dv = jax.lax.fori_loop(first_ref[()], end_ref[()], visit, zeros)
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _specs(b_len: tuple[int, int], d_k: int, d_v: int, block: int, tiled: str):
    """BlockSpecs over the grid (row, head, block): the side named by `tiled` ("q" or "k") one
    block at a time, the other side whole; [b, t, h, d] arrays, [b, t] segment ids, and the
    per-(row, block) span scalars."""
    q_len, k_len = b_len
    row = lambda length, d: pl.BlockSpec((None, length, None, d), lambda b, h, i: (b, 0, h, 0))  # noqa: E731
    tile = lambda d: pl.BlockSpec((None, block, None, d), lambda b, h, i: (b, i, h, 0))  # noqa: E731
    seg_row = lambda length: pl.BlockSpec((None, length), lambda b, h, i: (b, 0))  # noqa: E731
    seg_tile = pl.BlockSpec((None, block), lambda b, h, i: (b, i))
    scalar = pl.BlockSpec((None, None), lambda b, h, i: (b, i))
    if tiled == "q":
        return [scalar, scalar, tile(d_k), row(k_len, d_k), row(k_len, d_v), seg_tile, seg_row(k_len)]
    return [scalar, scalar, row(q_len, d_k), tile(d_k), tile(d_v), seg_row(q_len), seg_tile]


def _forward(q, k, v, q_seg, kv_seg, causal, scale, bq, bk, interpret):
    """(output [b, q, h, d_v], log-sum-exp [b, h, q] float32, the spans)."""
    b, q_len, h, d_k = q.shape
    k_len, d_v = k.shape[1], v.shape[-1]
    ranges = block_ranges(q_seg, kv_seg, bq, bk, causal)
    kernel = functools.partial(_forward_kernel, scale=scale, causal=causal, bk=bk)
    out, lse = pallas.call(
        kernel,
        (b, h, q_len // bq),
        _specs((q_len, k_len), d_k, d_v, bq, "q"),
        [
            pl.BlockSpec((None, bq, None, d_v), lambda b, h, i: (b, i, h, 0)),
            pl.BlockSpec((None, None, bq), lambda b, h, i: (b, h, i)),
        ],
        [jax.ShapeDtypeStruct((b, q_len, h, d_v), q.dtype), jax.ShapeDtypeStruct((b, h, q_len), jnp.float32)],
        interpret,
        "segment_attention_forward",
    )(*ranges[0], q, k, v, q_seg, kv_seg)
    return out, lse, ranges


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _attention(q, k, v, q_seg, kv_seg, causal, scale, bq, bk, interpret):
    return _forward(q, k, v, q_seg, kv_seg, causal, scale, bq, bk, interpret)[0]


def _attention_forward(q, k, v, q_seg, kv_seg, causal, scale, bq, bk, interpret):
    out, lse, ranges = _forward(q, k, v, q_seg, kv_seg, causal, scale, bq, bk, interpret)
    return out, (q, k, v, q_seg, kv_seg, out, lse, ranges)


def _attention_backward(causal, scale, bq, bk, interpret, residuals, d_out):
    q, k, v, q_seg, kv_seg, out, lse, (q_ranges, k_ranges) = residuals
    b, q_len, h, d_k = q.shape
    k_len, d_v = k.shape[1], v.shape[-1]
    delta = (d_out.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1).transpose(0, 2, 1)  # [b, h, q]
    row_stats = pl.BlockSpec((None, None, q_len), lambda b, h, i: (b, h, 0))
    tile_stats = pl.BlockSpec((None, None, bq), lambda b, h, i: (b, h, i))
    dq = pallas.call(
        functools.partial(_dq_kernel, scale=scale, causal=causal, bk=bk),
        (b, h, q_len // bq),
        [*_specs((q_len, k_len), d_k, d_v, bq, "q"), _tile(bq, d_v), tile_stats, tile_stats],
        _tile(bq, d_k),
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret,
        "segment_attention_dq",
    )(*q_ranges, q, k, v, q_seg, kv_seg, d_out, lse, delta)
    dk, dv = pallas.call(
        functools.partial(_dkv_kernel, scale=scale, causal=causal, bq=bq),
        (b, h, k_len // bk),
        [*_specs((q_len, k_len), d_k, d_v, bk, "k"), _row(q_len, d_v), row_stats, row_stats],
        [_tile(bk, d_k), _tile(bk, d_v)],
        [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        interpret,
        "segment_attention_dkv",
    )(*k_ranges, q, k, v, q_seg, kv_seg, d_out, lse, delta)
    return dq, dk, dv, None, None


def _tile(block: int, d: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, block, None, d), lambda b, h, i: (b, i, h, 0))


def _row(length: int, d: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, length, None, d), lambda b, h, i: (b, 0, h, 0))


_attention.defvjp(_attention_forward, _attention_backward)


def segment_attention(
    query: Array,
    key: Array,
    value: Array,
    q_segments: Array,
    kv_segments: Array,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    interpret: bool | None = None,
) -> Array:
    """query [b, q, h, d_k], key [b, k, h, d_k], value [b, k, h, d_v], segment ids [b, q] and
    [b, k] -> [b, q, h, d_v]; differentiable in query, key and value.

    Lengths are padded to whole blocks (with segment 0, which nothing sees; for Triton, to a
    power of two) and, for Triton, head widths to a power of two of at least 16 (zeros, which
    change no product); the padding is cut off again. `interpret` None: compiled on a GPU,
    interpreted elsewhere."""
    interpret = pallas.interpreted(interpret)
    q_len, k_len, d_k, d_v = query.shape[1], key.shape[1], query.shape[-1], value.shape[-1]
    block_q, block_k = min(block_q, pallas.power_of_two(q_len)), min(block_k, pallas.power_of_two(k_len))
    wide_k, wide_v = (d_k, d_v) if interpret else (max(16, pallas.power_of_two(d_k)), max(16, pallas.power_of_two(d_v)))

    def pad(x: Array, length: int, width: int | None = None) -> Array:
        widths = [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
        if width is not None:
            widths[-1] = (0, width - x.shape[-1])
        return jnp.pad(x, widths)

    if interpret:  # whole blocks
        q_pad, k_pad = -q_len % block_q + q_len, -k_len % block_k + k_len
    else:  # Triton's blocks are powers of two, the whole rows read too; padding tiles are never visited
        q_pad, k_pad = max(block_q, pallas.power_of_two(q_len)), max(block_k, pallas.power_of_two(k_len))
    out = _attention(  # zero columns added to Q and K leave Q K^T as it is
        pad(query, q_pad, wide_k),
        pad(key, k_pad, wide_k),
        pad(value, k_pad, wide_v),
        pad(q_segments.astype(jnp.int32), q_pad),
        pad(kv_segments.astype(jnp.int32), k_pad),
        causal,
        1.0 / math.sqrt(d_k),
        block_q,
        block_k,
        interpret,
    )
    return out[:, :q_len, :, :d_v]
