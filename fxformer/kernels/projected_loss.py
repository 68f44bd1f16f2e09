"""The pre-softmax projection (3.4) and the label-smoothed loss's reductions (5.4) as one Pallas
kernel: the logits [tokens, vocab] are never written to memory.

Forward, per block of target tokens: the vocabulary is visited a tile at a time, each tile's
logits computed from the decoder's output and the shared embedding (`model.vocabulary_logits`:
the product accumulates in float32 and is rounded to the compute dtype, as the model's logits
are) and folded into four running quantities per token: the largest logit and the sum of
exponentials below it (the online log-sum-exp, rescaled as the maximum grows), the sum of the
logits and the target's logit. Returned per token, as `optim.logit_reductions` returns them: the
log-sum-exp, sum_v q(v) x_v (q the smoothed target: 1 - eps on the target, eps / (vocab - 1)
elsewhere, so the sum is eps / (vocab - 1) (sum_v x_v - x_t) + (1 - eps) x_t), the target's logit
and the largest logit.

Backward, the logits recomputed tile by tile from the same two matrices: their gradient is
g_lse softmax + g_q q + g_t onehot (the largest logit has none), rounded to the compute dtype as
the model's logits' gradient is, and multiplied back: one kernel per token block for the
decoder's output (dH = G E, over the vocabulary's tiles), one per vocabulary tile for the
embedding (dE = G^T H, over the token blocks). Nothing of the size [tokens, vocab] exists in
either pass; what is kept is one float32 log-sum-exp per token.

On a GPU it is compiled by Triton (blocks and the arrays read whole padded to powers of two,
widths to at least 16); elsewhere Pallas interprets it (`interpret`), which is how the CPU tests
run it. Chosen by `model.loss_impl=fused` (`fxformer.optim.loss_sums`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from fxformer.kernels import pallas

Array = jax.Array


def _logits(h: Array, e: Array, dtype) -> Array:
    """One tile's logits [rows, cols] in float32, rounded to `dtype` as the model's are."""
    return jnp.dot(h, e.T, preferred_element_type=jnp.float32).astype(dtype).astype(jnp.float32)


def _forward_kernel(h_ref, e_ref, t_ref, lse_ref, q_ref, target_ref, top_ref, *, vocab, bv, dtype, smoothing):
    """One block of tokens: the online log-sum-exp and the sums over the vocabulary's tiles."""
    h, t = h_ref[...], t_ref[...]  # [br, d], [br]
    br = h.shape[0]

    def visit(j, carry):
        top, total, x_sum, target = carry  # [br] each
        cols = j * bv + jnp.arange(bv)
        x = _logits(h, e_ref[pl.ds(j * bv, bv), :], dtype)  # [br, bv]
        valid = cols[None, :] < vocab
        new_top = jnp.maximum(top, jnp.where(valid, x, -jnp.inf).max(axis=-1))
        p = jnp.where(valid, jnp.exp(x - new_top[:, None]), 0.0)
        total = total * jnp.exp(top - new_top) + p.sum(axis=-1)
        x_sum = x_sum + jnp.where(valid, x, 0.0).sum(axis=-1)
        target = target + jnp.where(cols[None, :] == t[:, None], x, 0.0).sum(axis=-1)
        return new_top, total, x_sum, target

    zeros = jnp.zeros((br,), jnp.float32)
    start = (jnp.full((br,), -jnp.inf), zeros, zeros, zeros)
    top, total, x_sum, target = jax.lax.fori_loop(0, -(-vocab // bv), visit, start)
    other = smoothing / (vocab - 1)
    lse_ref[...] = top + jnp.log(total)
    q_ref[...] = other * (x_sum - target) + (1.0 - smoothing) * target
    target_ref[...] = target
    top_ref[...] = top


def _gradient(x, cols, t, lse, g_lse, g_q, g_t, *, vocab, smoothing):
    """The logits' gradient [rows, cols] of one tile: g_lse softmax + g_q q + g_t onehot, 0 outside the vocabulary."""
    is_target = cols[None, :] == t[:, None]
    q = jnp.where(is_target, 1.0 - smoothing, smoothing / (vocab - 1))
    grad = g_lse[:, None] * jnp.exp(x - lse[:, None]) + g_q[:, None] * q + jnp.where(is_target, g_t[:, None], 0.0)
    return jnp.where(cols[None, :] < vocab, grad, 0.0)


def _dh_kernel(h_ref, e_ref, t_ref, lse_ref, g_lse_ref, g_q_ref, g_t_ref, dh_ref, *, vocab, bv, dtype, smoothing):
    """dH of one block of tokens: the sum over the vocabulary's tiles of G_tile E_tile."""
    h, t, lse = h_ref[...], t_ref[...], lse_ref[...]
    g = (g_lse_ref[...], g_q_ref[...], g_t_ref[...])

    def visit(j, dh):
        cols = j * bv + jnp.arange(bv)
        e = e_ref[pl.ds(j * bv, bv), :]
        grad = _gradient(_logits(h, e, dtype), cols, t, lse, *g, vocab=vocab, smoothing=smoothing)
        return dh + jnp.dot(grad.astype(e.dtype), e, preferred_element_type=jnp.float32)

    dh = jax.lax.fori_loop(0, -(-vocab // bv), visit, jnp.zeros(h.shape, jnp.float32))
    dh_ref[...] = dh.astype(dh_ref.dtype)


def _de_kernel(h_ref, e_ref, t_ref, lse_ref, g_lse_ref, g_q_ref, g_t_ref, de_ref, *, vocab, rows, br, dtype, smoothing):
    """dE of one vocabulary tile: the sum over the token blocks of G_block^T H_block."""
    e = e_ref[...]  # [bv, d]
    bv = e.shape[0]
    cols = pl.program_id(0) * bv + jnp.arange(bv)

    def visit(i, de):
        at = pl.ds(i * br, br)
        h, t = h_ref[at, :], t_ref[at]
        g = (g_lse_ref[at], g_q_ref[at], g_t_ref[at])
        grad = _gradient(_logits(h, e, dtype), cols, t, lse_ref[at], *g, vocab=vocab, smoothing=smoothing)
        return de + jnp.dot(grad.T.astype(h.dtype), h, preferred_element_type=jnp.float32)

    de = jax.lax.fori_loop(0, -(-rows // br), visit, jnp.zeros(e.shape, jnp.float32))
    de_ref[...] = de.astype(de_ref.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _reductions(h, e, t, static):
    return _forward(h, e, t, static)[0]


def _forward(h, e, t, static):
    """h [rows_pad, d], e [vocab_pad, d] (the compute dtype), t [rows_pad] -> four [rows_pad] float32."""
    vocab, rows, br, bv, smoothing, interpret = static
    kernel = functools.partial(_forward_kernel, vocab=vocab, bv=bv, dtype=h.dtype, smoothing=smoothing)
    per_row = pl.BlockSpec((br,), lambda i: (i,))
    out = pallas.call(
        kernel,
        (h.shape[0] // br,),
        [pl.BlockSpec((br, h.shape[1]), lambda i: (i, 0)), pl.BlockSpec(e.shape, lambda i: (0, 0)), per_row],
        [per_row] * 4,
        [jax.ShapeDtypeStruct((h.shape[0],), jnp.float32)] * 4,
        interpret,
        "projected_loss_forward",
    )(h, e, t)
    return tuple(out), (h, e, t, out[0])


def _backward(static, residuals, cotangents):
    vocab, rows, br, bv, smoothing, interpret = static
    h, e, t, lse = residuals
    g_lse, g_q, g_t, _ = cotangents
    kw = dict(vocab=vocab, dtype=h.dtype, smoothing=smoothing)
    per_row = pl.BlockSpec((br,), lambda i: (i,))
    whole = lambda x: pl.BlockSpec(x.shape, lambda i: (0,) * x.ndim)  # noqa: E731
    dh = pallas.call(
        functools.partial(_dh_kernel, bv=bv, **kw),
        (h.shape[0] // br,),
        [pl.BlockSpec((br, h.shape[1]), lambda i: (i, 0)), whole(e), *[per_row] * 5],
        pl.BlockSpec((br, h.shape[1]), lambda i: (i, 0)),
        jax.ShapeDtypeStruct(h.shape, h.dtype),
        interpret,
        "projected_loss_dh",
    )(h, e, t, lse, g_lse, g_q, g_t)
    de = pallas.call(
        functools.partial(_de_kernel, rows=rows, br=br, **kw),
        (-(-vocab // bv),),
        [whole(h), pl.BlockSpec((bv, e.shape[1]), lambda j: (j, 0)), *[whole(t)] * 5],
        pl.BlockSpec((bv, e.shape[1]), lambda j: (j, 0)),
        jax.ShapeDtypeStruct(e.shape, e.dtype),
        interpret,
        "projected_loss_de",
    )(h, e, t, lse, g_lse, g_q, g_t)
    return dh, de, None


_reductions.defvjp(_forward, _backward)


def projected_reductions(
    hidden: Array,
    embedding: Array,
    targets: Array,
    label_smoothing: float,
    dtype,
    block_rows: int = 64,
    block_vocab: int = 128,
    interpret: bool | None = None,
) -> tuple[Array, Array, Array, Array]:
    """(log-sum-exp, sum_v q(v) x_v, the target's logit, the largest logit), each [...] float32,
    of the logits x = `model.vocabulary_logits(hidden, embedding, dtype)` without computing them
    whole: hidden [..., d_model] (the decoder's output), embedding [vocab, d_model] (the shared
    matrix), targets [...]. Differentiable in hidden and embedding. `interpret` None: compiled on
    a GPU, interpreted elsewhere."""
    interpret = pallas.interpreted(interpret)
    shape, (vocab, d) = targets.shape, embedding.shape
    h = hidden.reshape(-1, d).astype(dtype)
    t = targets.reshape(-1).astype(jnp.int32)
    rows = h.shape[0]
    br, bv = min(block_rows, pallas.power_of_two(rows)), min(block_vocab, pallas.power_of_two(vocab))
    if interpret:  # whole blocks
        rows_pad, vocab_pad, width = rows + -rows % br, vocab + -vocab % bv, d
    else:  # Triton: blocks and the arrays read whole are powers of two; the padding is never visited
        rows_pad, vocab_pad, width = (
            pallas.power_of_two(max(rows, br)),
            pallas.power_of_two(max(vocab, bv)),
            max(16, pallas.power_of_two(d)),
        )
    h = jnp.pad(h, ((0, rows_pad - rows), (0, width - d)))  # zero columns change no product
    e = jnp.pad(embedding.astype(dtype), ((0, vocab_pad - vocab), (0, width - d)))
    t = jnp.pad(t, (0, rows_pad - rows))
    out = _reductions(h, e, t, (vocab, rows, br, bv, float(label_smoothing), interpret))
    return tuple(x[:rows].reshape(shape) for x in out)
