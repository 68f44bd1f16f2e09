"""Post-norm's sub-layer tail, LayerNorm(x + y) (section 3.1, with y = Dropout(Sublayer(x))), as
one function with its own gradient, so that XLA sees one element-wise producer and two row
reductions where Flax's LayerNorm, differentiated by JAX, leaves it the mean, the variance, the
normalised values and their products as separate values to keep and read back.

Forward: z = x + y in the compute dtype (as `x + y` is in the model), its mean and variance in
float32, (z - mean) / sqrt(var + eps) * scale + bias. Kept for the backward pass: z, and one mean
and one 1 / sqrt(var + eps) per row. Backward, in one pass over g and z: with x^ the normalised z
and g' = g * scale, dz = (g' - mean(g') - x^ mean(g' x^)) / sqrt(var + eps); dx = dy = dz;
dscale = sum(g x^), dbias = sum(g) over the rows. Dropout stays outside, element-wise, for XLA to
fuse into the sum.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from fxformer import layers

Array = jax.Array


def _statistics(z: Array, epsilon: float) -> tuple[Array, Array]:
    zf = z.astype(jnp.float32)
    mean = zf.mean(axis=-1, keepdims=True)
    variance = jnp.square(zf - mean).mean(axis=-1, keepdims=True)
    return mean, jax.lax.rsqrt(variance + epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def residual_layer_norm(x: Array, y: Array, scale: Array, bias: Array, epsilon: float = 1e-6) -> Array:
    """LayerNorm(x + y) over the last axis, with float32 `scale` and `bias` [d]; x and y [..., d]
    in the compute dtype, which the result has too."""
    return _forward(x, y, scale, bias, epsilon)[0]


def _forward(x, y, scale, bias, epsilon):
    z = x + y
    mean, rstd = _statistics(z, epsilon)
    out = ((z.astype(jnp.float32) - mean) * rstd * scale + bias).astype(x.dtype)
    return out, (z, mean, rstd, scale)


def _backward(epsilon, residuals, g):
    z, mean, rstd, scale = residuals
    normalised = (z.astype(jnp.float32) - mean) * rstd
    g = g.astype(jnp.float32)
    gs = g * scale
    dz = rstd * (gs - gs.mean(axis=-1, keepdims=True) - normalised * (gs * normalised).mean(axis=-1, keepdims=True))
    rows = tuple(range(g.ndim - 1))
    dz = dz.astype(z.dtype)
    return dz, dz, (g * normalised).sum(axis=rows), g.sum(axis=rows)


residual_layer_norm.defvjp(_forward, _backward)


class ResidualLayerNorm(layers.Module):
    """LayerNorm(x + y) with the parameters of `flax.linen.LayerNorm` (float32 `scale` and `bias`;
    epsilon `model.layer_norm_epsilon`), so a checkpoint loads into either."""

    dtype: jnp.dtype = jnp.float32
    epsilon: float = 1e-6

    @nn.compact
    def __call__(self, x: Array, y: Array) -> Array:
        d = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (d,), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (d,), jnp.float32)
        return residual_layer_norm(x.astype(self.dtype), y.astype(self.dtype), scale, bias, self.epsilon)
