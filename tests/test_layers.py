"""fxformer/layers.py: Flax's Dense and LayerNorm with the stored parameters' shapes checked
without tracing their initialisers: the same parameters and outputs as Flax's own layers, no
initialiser run in `apply`, and Flax's error for a stored parameter of another shape."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import errors

from fxformer import layers


def block(dense, norm, features: int, calls: list):
    """A module of `dense` then `norm` whose kernel initialiser counts its calls in `calls`."""

    def counted(key, shape, dtype=jnp.float32):
        calls.append(shape)
        return nn.initializers.xavier_uniform()(key, shape, dtype)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return norm(name="norm")(dense(features, kernel_init=counted, name="dense")(x))

    return Block()


X = jax.random.normal(jax.random.key(1), (3, 6))


def test_the_same_parameters_and_outputs_as_flax_and_no_initialiser_traced_in_apply():
    ours_calls, flax_calls = [], []
    ours = block(layers.Dense, layers.LayerNorm, 4, ours_calls)
    theirs = block(nn.Dense, nn.LayerNorm, 4, flax_calls)
    params = ours.init(jax.random.key(0), X)
    expected = theirs.init(jax.random.key(0), X)
    assert jax.tree.structure(params) == jax.tree.structure(expected)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected)))
    assert ours_calls == flax_calls == [(6, 4)]  # init: each runs the initialiser once

    out = jax.jit(ours.apply)(params, X)
    np.testing.assert_array_equal(out, jax.jit(theirs.apply)(params, X))
    assert ours_calls == [(6, 4)]  # apply ran no initialiser
    assert flax_calls == [(6, 4), (6, 4)]  # Flax's apply traces it to check the shape


@pytest.mark.parametrize("kind", ["ours", "flax"])
def test_a_stored_parameter_of_another_shape_raises_flaxs_error(kind):
    dense, norm = (layers.Dense, layers.LayerNorm) if kind == "ours" else (nn.Dense, nn.LayerNorm)
    params = block(dense, norm, 4, []).init(jax.random.key(0), X)
    with pytest.raises(errors.ScopeParamShapeError, match=r'"kernel" in "/dense".*\(6, 5\).*\(6, 4\)'):
        block(dense, norm, 5, []).apply(params, X)
    wide = jax.tree.map(lambda a: a, params)
    wide["params"]["norm"]["scale"] = jnp.ones(5)
    with pytest.raises(errors.ScopeParamShapeError, match=r'"scale" in "/norm"'):
        block(dense, norm, 4, []).apply(wide, X)
