"""Dropout (5.4) whose mask is computed where it is used, from counters: post-norm's sub-layer
tail LayerNorm(x + Dropout(y)) (3.1) as one Pallas kernel, forward and backward, and the
feed-forward's ReLU + dropout as another. No random-bits pass runs before them and no mask is
kept for the backward pass: each kernel hashes the element's coordinates again.

The mask: element (token n, feature f) of dropout site s is kept when the first word of
Threefry-2x32 (20 rounds; Salmon et al. 2011, the generator behind `jax.random`) of the counter
(n, s * 2^24 + f) under the key (k0, k1) is at least round(rate * 2^32): kept with probability
1 - rate to within 2^-32, kept values scaled by 1 / (1 - rate). Token n = row * length + position
(the element's row and position in the [rows, length] batch); the site s names the dropout
(`SITES`: a residual's sub-layer output, the ReLU); the key is the data of the dropout key that
`flax.linen.Module.make_rng("dropout")` gives the module, which differs between runs' seeds,
steps (`fxformer.train` folds the step into it) and modules (the layers). Different sites of one
module and different tokens and features are different counters: Threefry's outputs for distinct
counters under one key are what `jax.random` relies on for independent draws.

On a GPU the kernels are compiled by Triton; elsewhere Pallas interprets them (`interpret`), which
is how the CPU tests run them. Chosen by `model.residual_norm=pallas` (`fxformer.model.residual`).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from fxformer import layers
from fxformer.kernels import pallas
from fxformer.kernels.norm import residual_layer_norm

Array = jax.Array

SITES = {"self_attention": 0, "cross_attention": 1, "feed_forward": 2, "relu": 3}  # s in the counter
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # Threefry-2x32's, as in Random123 and jax


def _rotate_left(x: Array, r: int) -> Array:
    return jax.lax.shift_left(x, jnp.uint32(r)) | jax.lax.shift_right_logical(x, jnp.uint32(32 - r))


def threefry2x32(k0: Array, k1: Array, c0: Array, c1: Array) -> tuple[Array, Array]:
    """Threefry-2x32 with 20 rounds: the key (k0, k1) and counters (c0, c1), uint32 arrays of any
    (broadcastable) shapes, to two uint32 words. Element-wise integer work only, so a kernel can
    compute it where it needs the bits."""
    ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = c0 + ks[0], c1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, r) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + jnp.uint32(i + 1)
    return x0, x1


def counters(tokens: Array, features: Array, site: int) -> tuple[Array, Array]:
    """The counter of each (token, feature) of a site: (n, s * 2^24 + f), broadcast."""
    return tokens.astype(jnp.uint32), jnp.uint32(site << 24) + features.astype(jnp.uint32)


def keep(key: Array, tokens: Array, features: Array, site: int, rate: float) -> Array:
    """bool: which elements dropout keeps, for `key` [2] uint32 (a dropout key's data), token and
    feature indices (broadcastable int arrays) at `site`."""
    bits, _ = threefry2x32(key[0], key[1], *counters(tokens, features, site))
    return bits >= jnp.uint32(min(round(rate * 2.0**32), 2**32 - 1))


def mask(key: Array, shape: tuple[int, int, int], site: int, rate: float) -> Array:
    """The whole keep mask [rows, length, features] of a site, as the kernels compute it (for tests and references)."""
    rows, length, d = shape
    tokens = jnp.arange(rows * length, dtype=jnp.uint32).reshape(rows, length, 1)
    return keep(key, tokens, jnp.arange(d, dtype=jnp.uint32), site, rate)


def key_data(rng: Array) -> Array:
    """A dropout key (new-style or raw uint32) as its two uint32 words."""
    data = jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng
    return data.reshape(-1)[:2].astype(jnp.uint32)


def _block_keep(key_ref, br, d, site, rate):
    """The keep mask [br, d] of the grid's current block of tokens."""
    tokens = pl.program_id(0) * br + jnp.arange(br)
    return keep(key_ref[...], tokens[:, None], jnp.arange(d)[None, :], site, rate)


def _norm_forward_kernel(key_ref, x_ref, y_ref, scale_ref, bias_ref, o_ref, z_ref, stats_ref, **kw):
    """z = x + Dropout(y); LayerNorm(z) with z's mean and 1 / sqrt(var + eps) kept per token."""
    br, d = x_ref.shape
    kept = _block_keep(key_ref, br, d, kw["site"], kw["rate"])
    y = y_ref[...]
    z = x_ref[...] + jnp.where(kept, y * jnp.asarray(1.0 / (1.0 - kw["rate"]), y.dtype), jnp.zeros((), y.dtype))
    zf = z.astype(jnp.float32)
    mean = zf.mean(axis=-1)
    rstd = jax.lax.rsqrt(jnp.square(zf - mean[:, None]).mean(axis=-1) + kw["epsilon"])
    o_ref[...] = ((zf - mean[:, None]) * rstd[:, None] * scale_ref[...] + bias_ref[...]).astype(o_ref.dtype)
    z_ref[...] = z
    stats_ref[...] = jnp.stack([mean, rstd], axis=-1)


def _norm_backward_kernel(key_ref, g_ref, z_ref, stats_ref, scale_ref, dx_ref, dy_ref, dscale_ref, dbias_ref, **kw):
    """dz of LayerNorm, dx = dz, dy = dz where kept (scaled); this block's sums for dscale and dbias."""
    br, d = g_ref.shape
    mean, rstd = stats_ref[:, 0], stats_ref[:, 1]
    normalised = (z_ref[...].astype(jnp.float32) - mean[:, None]) * rstd[:, None]
    g = g_ref[...].astype(jnp.float32)
    gs = g * scale_ref[...]
    dz = rstd[:, None] * (
        gs - gs.mean(axis=-1, keepdims=True) - normalised * (gs * normalised).mean(axis=-1, keepdims=True)
    )
    kept = _block_keep(key_ref, br, d, kw["site"], kw["rate"])
    dx_ref[...] = dz.astype(dx_ref.dtype)
    dy_ref[...] = jnp.where(kept, dz / (1.0 - kw["rate"]), 0.0).astype(dy_ref.dtype)
    dscale_ref[...] = (g * normalised).sum(axis=0)[None, :]
    dbias_ref[...] = g.sum(axis=0)[None, :]


def _specs(br: int, d: int):
    """(the key whole, one block of tokens [br, d], a vector [d] whole, one block's row of [blocks, d])."""
    return (
        pl.BlockSpec((2,), lambda i: (0,)),
        pl.BlockSpec((br, d), lambda i: (i, 0)),
        pl.BlockSpec((d,), lambda i: (0,)),
        pl.BlockSpec((1, d), lambda i: (i, 0)),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _dropout_residual_norm(key, x, y, scale, bias, static):
    return _norm_forward(key, x, y, scale, bias, static)[0]


def _norm_forward(key, x, y, scale, bias, static):
    site, rate, epsilon, br, interpret = static
    n, d = x.shape
    key_spec, tile, vector, _ = _specs(br, d)
    out, z, stats = pallas.call(
        functools.partial(_norm_forward_kernel, site=site, rate=rate, epsilon=epsilon),
        (n // br,),
        [key_spec, tile, tile, vector, vector],
        [tile, tile, pl.BlockSpec((br, 2), lambda i: (i, 0))],
        [jax.ShapeDtypeStruct(x.shape, x.dtype)] * 2 + [jax.ShapeDtypeStruct((n, 2), jnp.float32)],
        interpret,
        "dropout_residual_norm_forward",
    )(key, x, y, scale, bias)
    return out, (key, z, stats, scale)


def _norm_backward(static, residuals, g):
    site, rate, _, br, interpret = static
    key, z, stats, scale = residuals
    n, d = z.shape
    key_spec, tile, vector, block_row = _specs(br, d)
    dx, dy, dscale, dbias = pallas.call(
        functools.partial(_norm_backward_kernel, site=site, rate=rate),
        (n // br,),
        [key_spec, tile, tile, pl.BlockSpec((br, 2), lambda i: (i, 0)), vector],
        [tile, tile, block_row, block_row],
        [jax.ShapeDtypeStruct(z.shape, z.dtype)] * 2 + [jax.ShapeDtypeStruct((n // br, d), jnp.float32)] * 2,
        interpret,
        "dropout_residual_norm_backward",
    )(key, g, z, stats, scale)
    return None, dx, dy, dscale.sum(axis=0), dbias.sum(axis=0)


_dropout_residual_norm.defvjp(_norm_forward, _norm_backward)


def _relu_forward_kernel(key_ref, h_ref, o_ref, *, site, rate):
    br, d = h_ref.shape
    kept = _block_keep(key_ref, br, d, site, rate) & (h_ref[...] > 0)
    h = h_ref[...]
    o_ref[...] = jnp.where(kept, h * jnp.asarray(1.0 / (1.0 - rate), h.dtype), jnp.zeros((), h.dtype))


def _relu_backward_kernel(key_ref, h_ref, g_ref, dh_ref, *, site, rate):
    br, d = h_ref.shape
    kept = _block_keep(key_ref, br, d, site, rate) & (h_ref[...] > 0)
    g = g_ref[...]
    dh_ref[...] = jnp.where(kept, g * jnp.asarray(1.0 / (1.0 - rate), g.dtype), jnp.zeros((), g.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _relu_dropout(key, h, static):
    site, rate, br, interpret = static
    key_spec, tile, _, _ = _specs(br, h.shape[1])
    return pallas.call(
        functools.partial(_relu_forward_kernel, site=site, rate=rate),
        (h.shape[0] // br,),
        [key_spec, tile],
        tile,
        jax.ShapeDtypeStruct(h.shape, h.dtype),
        interpret,
        "relu_dropout_forward",
    )(key, h)


def _relu_dropout_forward(key, h, static):
    return _relu_dropout(key, h, static), (key, h)


def _relu_dropout_backward(static, residuals, g):
    site, rate, br, interpret = static
    key, h = residuals
    key_spec, tile, _, _ = _specs(br, h.shape[1])
    dh = pallas.call(
        functools.partial(_relu_backward_kernel, site=site, rate=rate),
        (h.shape[0] // br,),
        [key_spec, tile, tile],
        tile,
        jax.ShapeDtypeStruct(h.shape, h.dtype),
        interpret,
        "relu_dropout_backward",
    )(key, h, g)
    return None, dh


_relu_dropout.defvjp(_relu_dropout_forward, _relu_dropout_backward)


def _rows(x: Array, block_rows: int, interpret: bool) -> tuple[Array, int]:
    """x [..., d] as [tokens_pad, d] (whole blocks; for Triton a power of two) and the block size."""
    x = x.reshape(-1, x.shape[-1])
    n = x.shape[0]
    br = min(block_rows, pallas.power_of_two(n))
    return jnp.pad(x, ((0, -n % br), (0, 0))), br


def dropout_residual_norm(
    key: Array,
    x: Array,
    y: Array,
    scale: Array,
    bias: Array,
    site: int,
    rate: float,
    epsilon: float = 1e-6,
    block_rows: int = 32,
    interpret: bool | None = None,
) -> Array:
    """LayerNorm(x + Dropout(y)) over the last axis: x, y [rows, length, d] in the compute dtype,
    float32 `scale` and `bias` [d], `key` [2] uint32, the mask `mask(key, x.shape, site, rate)`.
    Differentiable in x, y, scale and bias. `interpret` None: compiled on a GPU, interpreted elsewhere."""
    interpret = pallas.interpreted(interpret)
    (xs, br), (ys, _) = _rows(x, block_rows, interpret), _rows(y, block_rows, interpret)
    out = _dropout_residual_norm(key, xs, ys, scale, bias, (site, float(rate), float(epsilon), br, interpret))
    return out[: x.size // x.shape[-1]].reshape(x.shape)


def relu_dropout(
    key: Array, h: Array, site: int, rate: float, block_rows: int = 32, interpret: bool | None = None
) -> Array:
    """Dropout(ReLU(h)) for h [rows, length, d], the mask `mask(key, h.shape, site, rate)`; differentiable in h."""
    interpret = pallas.interpreted(interpret)
    hs, br = _rows(h, block_rows, interpret)
    return _relu_dropout(key, hs, (site, float(rate), br, interpret))[: h.size // h.shape[-1]].reshape(h.shape)


class DropoutResidualNorm(layers.Module):
    """LayerNorm(x + Dropout(y)) as one kernel, with the parameters of `flax.linen.LayerNorm`
    (float32 `scale` and `bias`; epsilon `model.layer_norm_epsilon`), so a checkpoint loads into either. Deterministic
    (evaluation, decoding): `kernels.norm.residual_layer_norm`, the same function without dropout."""

    rate: float
    site: int
    dtype: jnp.dtype = jnp.float32
    epsilon: float = 1e-6

    @nn.compact
    def __call__(self, x: Array, y: Array, deterministic: bool) -> Array:
        d = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (d,), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (d,), jnp.float32)
        x, y = x.astype(self.dtype), y.astype(self.dtype)
        if deterministic or self.rate == 0.0:
            return residual_layer_norm(x, y, scale, bias, self.epsilon)
        key = key_data(self.make_rng("dropout"))
        return dropout_residual_norm(key, x, y, scale, bias, self.site, self.rate, self.epsilon)
