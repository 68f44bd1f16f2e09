"""Dropout from counters (fxformer/kernels/counter_dropout.py, model.residual_norm=pallas): the
generator against Random123's known answer and jax's own Threefry, the keep rate, the masks'
independence across rows, positions' features, sites, steps and seeds (each check shown to fail
when the counter or key leaves that coordinate out), and the two kernels against references fed
the same mask, in value and gradient, at blocks of 16 and 32 (interpret mode on the CPU)."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

from fxformer import optim
from fxformer.kernels import counter_dropout as cd
from fxformer.kernels.norm import residual_layer_norm
from fxformer.model import Transformer, TransformerConfig

SHAPE = (8, 64, 128)  # rows, positions, features: 65,536 elements a mask
KEY = cd.key_data(jax.random.key(7))


def phi_z(a, b) -> float:
    """The phi coefficient of two boolean arrays times sqrt(n): about N(0, 1) where independent."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.corrcoef(a, b)[0, 1] * math.sqrt(a.size))


def test_threefry_gives_random123s_known_answer_and_jaxs_own_words():
    # Random123's kat_vectors, threefry2x32_20: key (0x13198a2e, 0x03707344), counter (0x243f6a88, 0x85a308d3)
    pi = [jnp.uint32(w) for w in (0x13198A2E, 0x03707344, 0x243F6A88, 0x85A308D3)]
    assert [int(w) for w in cd.threefry2x32(*pi)] == [0xC4923A9C, 0x483DF7A0]
    rng = np.random.default_rng(0)
    for _ in range(3):
        key, counts = (jnp.asarray(rng.integers(0, 2**32, n, dtype=np.uint64), jnp.uint32) for n in (2, 64))
        ours = cd.threefry2x32(key[0], key[1], counts[:32], counts[32:])
        np.testing.assert_array_equal(np.concatenate(ours), np.asarray(threefry_2x32(key, counts)))


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_the_keep_rate_is_one_minus_the_rate(rate):
    kept = np.asarray(cd.mask(KEY, SHAPE, 0, rate))
    n, p = kept.size, 1 - rate
    assert abs(kept.mean() - p) < 4 * math.sqrt(p * (1 - p) / n), kept.mean()  # within 4 binomial sds


def independence(key=KEY) -> dict[str, float]:
    """Each coordinate's check: phi z between masks that differ only in it."""
    m = np.asarray(cd.mask(key, SHAPE, 0, 0.5))
    other_step = np.asarray(cd.mask(cd.key_data(jax.random.fold_in(jax.random.key(7), 1)), SHAPE, 0, 0.5))
    return {
        "rows": phi_z(m[0::2], m[1::2]),
        "positions": phi_z(m[:, 0::2], m[:, 1::2]),
        "features": phi_z(m[..., 0::2], m[..., 1::2]),
        "sites": phi_z(m, cd.mask(key, SHAPE, 1, 0.5)),
        "steps": phi_z(m, other_step),
    }


def test_masks_are_independent_across_rows_positions_features_sites_and_steps():
    checks = independence()
    assert all(abs(z) < 5 for z in checks.values()), checks  # |z| < 5: p < 6e-7 each under independence


@pytest.mark.parametrize("left_out", ["rows", "features", "sites"])
def test_each_independence_check_fails_when_the_counter_leaves_its_coordinate_out(left_out, monkeypatch):
    """A counter without the row (the token index modulo the length: only the position), without
    the feature, or without the site: that coordinate's check fails, as it must."""
    counters = cd.counters
    length = SHAPE[1]

    def broken(tokens, features, site):
        if left_out == "rows":
            tokens = tokens % length
        return counters(
            tokens, features * 0 if left_out == "features" else features, 0 if left_out == "sites" else site
        )

    monkeypatch.setattr(cd, "counters", broken)
    checks = independence()
    assert abs(checks[left_out]) > 100, checks  # identical masks: phi 1, z = sqrt(n / 2)


def test_masks_differ_across_seeds_and_a_key_without_the_step_repeats_them():
    seeds = [np.asarray(cd.mask(cd.key_data(jax.random.key(s)), SHAPE, 0, 0.5)) for s in (0, 1)]
    assert abs(phi_z(*seeds)) < 5 and (seeds[0] != seeds[1]).mean() > 0.45
    steps = [cd.key_data(jax.random.fold_in(jax.random.key(0), step)) for step in (3, 4)]
    assert not np.array_equal(*steps)
    assert abs(independence(cd.key_data(jax.random.key(0)))["steps"]) < 5
    same = [np.asarray(cd.mask(cd.key_data(jax.random.key(0)), SHAPE, 0, 0.5)) for _ in range(2)]
    assert np.array_equal(*same)  # the same key, site and coordinates: the same mask (the backward's)


@pytest.mark.parametrize(
    "dtype, tol, block", [(jnp.float32, 2e-6, 16), (jnp.float32, 2e-6, 32), (jnp.bfloat16, 3e-2, 16)]
)
def test_the_dropout_residual_norm_kernel_equals_layer_norm_of_the_sum_given_its_mask(dtype, tol, block):
    rng = np.random.default_rng(0)
    shape = (3, 11, 16)  # 33 tokens: no whole block of 16 or 32
    x, y, g = (jnp.asarray(rng.normal(size=shape) * s, dtype) for s in (1.0, 2.0, 1.0))
    scale, bias = (jnp.asarray(rng.normal(size=16), jnp.float32) for _ in range(2))
    kept = cd.mask(KEY, shape, 2, 0.1)

    def reference(x, y, scale, bias):
        return residual_layer_norm(x, jnp.where(kept, y * jnp.asarray(1 / 0.9, dtype), 0).astype(dtype), scale, bias)

    kernel = functools.partial(cd.dropout_residual_norm, KEY, site=2, rate=0.1, block_rows=block)
    out, pull = jax.vjp(lambda x, y, s, b: kernel(x, y, s, b), x, y, scale, bias)
    want, pull_want = jax.vjp(reference, x, y, scale, bias)
    assert out.dtype == want.dtype == dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol)
    for a, b in zip(pull(g), pull_want(g), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=4 * tol, rtol=tol)


@pytest.mark.parametrize("block", [16, 32])
def test_the_relu_dropout_kernel_equals_relu_then_the_same_mask(block):
    rng = np.random.default_rng(1)
    h, g = (jnp.asarray(rng.normal(size=(3, 11, 32)), jnp.float32) for _ in range(2))
    kept = cd.mask(KEY, h.shape, 3, 0.3)
    out, pull = jax.vjp(lambda h: cd.relu_dropout(KEY, h, 3, 0.3, block_rows=block), h)
    want, pull_want = jax.vjp(lambda h: jnp.where(kept, jax.nn.relu(h) / 0.7, 0.0), h)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(pull(g)[0]), np.asarray(pull_want(g)[0]), rtol=1e-6)
    assert 0.3 < float((out > 0).mean()) < 0.4  # ReLU keeps about half, dropout 0.7 of those


def test_the_models_pallas_residuals_train_with_their_own_masks_and_evaluate_as_flax():
    """residual_norm=pallas: the same parameters as Flax's LayerNorm (a checkpoint loads into
    either) and, without dropout, the same loss and gradients; with dropout, one key gives one
    loss and another key another, every gradient finite."""
    config = TransformerConfig(
        vocab_size=31, num_layers=1, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, max_len=32, relu_dropout_rate=0.1
    )
    pallas = dataclasses.replace(config, residual_norm="pallas")
    rng = np.random.default_rng(0)
    batch = {k: jnp.asarray(rng.integers(4, 31, (2, n)), jnp.int32) for k, n in (("inputs", 9), ("targets", 7))}
    params = Transformer(config).init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
    init = Transformer(pallas).init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
    assert jax.tree.structure(params) == jax.tree.structure(init)

    @functools.partial(jax.jit, static_argnums=0)
    def loss_and_grads(c, key=None):
        loss = lambda p: optim.loss_sums(p, batch, Transformer(c), 0.1, rng=key)["loss"]  # noqa: E731
        return jax.value_and_grad(loss)(params)

    (want, want_grads), (got, got_grads) = loss_and_grads(config), loss_and_grads(pallas)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-4)
    first, grads = loss_and_grads(pallas, jax.random.key(1))
    again, second = loss_and_grads(pallas, jax.random.key(1))[0], loss_and_grads(pallas, jax.random.key(2))[0]
    assert float(first) == float(again) != float(second) and float(first) != float(want)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
