"""The model options a Marian (OPUS-MT) model needs, each against a NumPy computation of its own:
the sinusoids in halves, swish and the exact GELU in the feed-forward network, LayerNorm's epsilon
(in every residual_norm kernel), a bias on the vocabulary logits, unscaled embeddings; the kernel
options compute the same model with them on, and what a kernel cannot do is refused in one sentence."""

import dataclasses
import math
from types import SimpleNamespace

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf
from test_kernels import assert_same_loss_and_gradients

from fxformer import config as fxconfig
from fxformer import configfile, optim
from fxformer.errors import UserError
from fxformer.kernels import counter_dropout as cd
from fxformer.model import (
    FeedForward,
    Transformer,
    TransformerConfig,
    option_problem,
    output_bias,
    residual,
    sinusoid_table,
)

SMALL = TransformerConfig(vocab_size=31, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, max_len=32)
MARIAN = dataclasses.replace(
    SMALL, activation="swish", sinusoid_layout="halves", layer_norm_epsilon=1e-5, output_bias=True, attention_bias=True
)


def marian_sinusoids(length: int, dim: int) -> np.ndarray:
    """transformers' Marian table, from its definition: angle(pos, j) = pos / 10000^(2 (j // 2) / dim);
    sin of the even j in the first half of the features, cos of the odd j in the second."""
    angle = np.array([[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for pos in range(length)])
    return np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1)


def test_sinusoids_in_halves_are_marians_table_and_the_papers_features_reordered():
    halves, paper = sinusoid_table(40, 16, "halves"), sinusoid_table(40, 16)
    np.testing.assert_allclose(halves, marian_sinusoids(40, 16), atol=1e-6)
    np.testing.assert_array_equal(halves, np.concatenate([paper[:, 0::2], paper[:, 1::2]], axis=1))
    assert np.abs(halves - paper).max() > 0.5  # the two layouts are not confused


def gelu(x):
    return x * 0.5 * (1 + erf(x / math.sqrt(2)))


@pytest.mark.parametrize(
    "activation, numpy_fn",
    [("relu", lambda x: np.maximum(x, 0)), ("swish", lambda x: x / (1 + np.exp(-x))), ("gelu", gelu)],
)
def test_the_feed_forward_network_applies_its_activation(activation, numpy_fn):
    c = dataclasses.replace(SMALL, activation=activation)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 16)) * 2, jnp.float32)
    params = FeedForward(c).init(jax.random.key(0), x, True)["params"]
    params = jax.tree.map(lambda p: p + 0.1, params)  # biases off zero
    got = np.asarray(FeedForward(c).apply({"params": params}, x, True))
    hidden, output = params["hidden"], params["output"]
    want = numpy_fn(np.asarray(x) @ hidden["kernel"] + hidden["bias"]) @ output["kernel"] + output["bias"]
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    # tanh's GELU (jax.nn.gelu's default) is not what "gelu" means: it moves the output measurably
    if activation == "gelu":
        tanh_gelu = np.asarray(jax.nn.gelu(np.asarray(x) @ hidden["kernel"] + hidden["bias"]))
        assert np.abs(tanh_gelu @ output["kernel"] + output["bias"] - want).max() > 10 * 2e-5


def numpy_layer_norm(z, scale, bias, eps):
    mean, var = z.mean(-1, keepdims=True), z.var(-1, keepdims=True)
    return (z - mean) / np.sqrt(var + eps) * scale + bias


@pytest.mark.parametrize("residual_norm", ["flax", "fused", "pallas"])
def test_every_residual_norm_uses_the_configured_epsilon(residual_norm):
    """A sum whose variance is near 1e-5, where 1e-5 and 1e-6 differ by far more than float32 rounding."""
    c = dataclasses.replace(SMALL, layer_norm_epsilon=1e-5, residual_norm=residual_norm, dropout_rate=0.0)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 3, 16)) * 3e-3, jnp.float32)

    class Layer(nn.Module):  # a residual sub-layer around the identity: LayerNorm(x + x)
        @nn.compact
        def __call__(self, x):
            return residual(c, x, lambda y: y, "feed_forward", True)

    params = Layer().init(jax.random.key(0), x)["params"]
    got = np.asarray(Layer().apply({"params": params}, x))
    norm = params["feed_forward_norm"]
    z = 2 * np.asarray(x, np.float64)
    want = numpy_layer_norm(z, norm["scale"], norm["bias"], 1e-5)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(numpy_layer_norm(z, norm["scale"], norm["bias"], 1e-6) - want).max() > 100 * 1e-5


def test_the_dropout_residual_norm_kernel_takes_the_epsilon():
    rng = np.random.default_rng(2)
    x, y = (jnp.asarray(rng.normal(size=(3, 11, 16)) * 3e-3, jnp.float32) for _ in range(2))
    scale, bias = jnp.ones(16), jnp.zeros(16)
    key = jnp.asarray([7, 11], jnp.uint32)
    kept = np.asarray(cd.mask(key, x.shape, 2, 0.1))
    got = np.asarray(cd.dropout_residual_norm(key, x, y, scale, bias, site=2, rate=0.1, epsilon=1e-5, block_rows=16))
    z = np.asarray(x, np.float64) + np.where(kept, np.asarray(y, np.float64) / 0.9, 0)
    np.testing.assert_allclose(got, numpy_layer_norm(z, 1.0, 0.0, 1e-5), atol=1e-4)
    assert np.abs(numpy_layer_norm(z, 1.0, 0.0, 1e-6) - numpy_layer_norm(z, 1.0, 0.0, 1e-5)).max() > 1e-2


def batch_of(rng):
    batch = {"inputs": rng.integers(4, 31, (3, 9)), "targets": rng.integers(4, 31, (3, 7))}
    batch["targets"][1, 5:] = 0  # padding
    return {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}


def test_the_output_bias_is_added_to_every_logit_and_the_chunked_loss_adds_it_too():
    batch = batch_of(np.random.default_rng(3))
    model = Transformer(MARIAN)
    params = model.init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
    bias = jnp.asarray(np.random.default_rng(4).normal(size=31), jnp.float32)
    params = {**params, "embed": {**params["embed"], "output_bias": bias}}
    assert output_bias(params) is bias
    logits = model.apply({"params": params}, batch["inputs"], batch["targets"])
    hidden = model.apply({"params": params}, batch["inputs"], batch["targets"], project=False)
    want = np.asarray(hidden) @ np.asarray(params["embed"]["embedding"]).T + np.asarray(bias)
    np.testing.assert_allclose(np.asarray(logits), want, atol=1e-4, rtol=1e-5)
    whole = optim.loss_sums(params, batch, model, 0.1)
    chunked = optim.loss_sums(params, batch, model, 0.1, chunk=4)
    for key in optim.SUMS:
        np.testing.assert_allclose(float(chunked[key]), float(whole[key]), rtol=1e-5)
    unbiased = optim.loss_sums({**params, "embed": {**params["embed"], "output_bias": 0 * bias}}, batch, model, 0.1)
    assert abs(float(unbiased["loss"]) - float(whole["loss"])) > 1e-2


def test_unscaled_embeddings_are_the_rows_themselves():
    tokens = jnp.asarray([[5, 6, 7]], jnp.int32)
    for scale, factor in ((True, 4.0), (False, 1.0)):  # sqrt(16)
        model = Transformer(dataclasses.replace(SMALL, scale_embedding=scale))
        params = model.init(jax.random.key(0), tokens, tokens)["params"]
        embedded = model.apply({"params": params}, tokens, method=lambda m, t: m.embed(t))
        np.testing.assert_allclose(
            np.asarray(embedded)[0], factor * np.asarray(params["embed"]["embedding"])[[5, 6, 7]], rtol=1e-6
        )


def test_the_kernel_options_compute_the_same_marian_model_and_loss():
    """residual_norm fused and pallas, loss_impl one_pass, qkv_projection merged, with every Marian
    option on: the loss sums and gradients of the default kernels, in float32."""
    options = [dataclasses.replace(MARIAN, residual_norm=r) for r in ("fused", "pallas")]
    options += [dataclasses.replace(MARIAN, loss_impl="one_pass"), dataclasses.replace(MARIAN, qkv_projection="merged")]
    batch = batch_of(np.random.default_rng(5))
    params = Transformer(MARIAN).init(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
    assert_same_loss_and_gradients(MARIAN, options, params, batch)


def test_what_the_kernels_or_the_model_cannot_do_is_refused_in_one_sentence():
    problem = option_problem(SimpleNamespace(**{**dataclasses.asdict(MARIAN), "loss_impl": "fused"}))
    assert "output_bias" in problem and "one_pass" in problem
    for field, value, words in (
        ("activation", "tanh", "model.activation must be one of relu, swish, gelu"),
        ("sinusoid_layout", "blocks", "model.sinusoid_layout must be 'interleaved' or 'halves'"),
        ("layer_norm_epsilon", 0.0, "model.layer_norm_epsilon must be in (0, 1)"),
    ):
        config = configfile.load_config("configs/default.py")
        config.model[field] = value
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            fxconfig.validate(config)
