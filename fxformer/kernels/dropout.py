"""Dropout (section 5.4) from 8-bit random numbers: a quarter of the random-number work.

`flax.linen.Dropout` draws one float32 uniform per element (`jax.random.bernoulli`): one
threefry evaluation per element. `jax.random.bits(..., uint8)` is no cheaper under jax's default
`jax_threefry_partitionable` (checked in jax 0.10.2's `_threefry_random_bits_partitionable`: one
evaluation per element, its 32 bits cut to 8). So the bits are drawn here as 32-bit words for a
quarter of the elements and each word is split into its four bytes (`lax.bitcast_convert_type`).

A byte keeps its element when it is below `threshold` = round(256 (1 - rate)), so the keep
probability is threshold / 256, within 1/512 of 1 - rate (0.1: 230 / 256 = 0.8984 instead of
0.9), and kept elements are scaled by 256 / threshold: the expectation is unchanged exactly.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def threshold(rate: float) -> int:
    """Bytes below this keep their element: round(256 (1 - rate)), between 1 and 255."""
    return min(255, max(1, round(256 * (1.0 - rate))))


def keep_mask(key: Array, shape: tuple[int, ...], rate: float) -> Array:
    """bool `shape`: which elements dropout keeps, each with probability threshold(rate) / 256."""
    size = 1
    for n in shape:
        size *= n
    words = jax.random.bits(key, (-(-size // 4),), jnp.uint32)  # a quarter as many words as elements
    data = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(-1)[:size]  # [4 x words] bytes
    return (data < threshold(rate)).reshape(shape)


def apply(x: Array, keep: Array, rate: float) -> Array:
    """x where `keep`, scaled by 256 / threshold(rate) (the inverse of the keep probability); 0 elsewhere."""
    scale = jnp.asarray(256.0 / threshold(rate), x.dtype)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))


class ByteDropout(nn.Module):
    """`flax.linen.Dropout` with masks from bytes (`keep_mask`); the same `dropout` RNG stream name."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        return apply(x, keep_mask(self.make_rng("dropout"), x.shape, self.rate), self.rate)
