"""What a training run is: its state (parameters, Adam moments, step, RNG key), the model and
optimizer its config builds (the config it records in its workdir: `fxformer.config`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from fxformer import checkpoint, optim, parallel
from fxformer.model import Transformer, TransformerConfig, init_params


@flax.struct.dataclass
class TrainState:
    """Everything a step changes, plus the run's RNG key (dropout keys are folded from it)."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def create_state(model: Transformer, tx: optax.GradientTransformation, seed: int | jax.Array) -> TrainState:
    """Xavier-initialised parameters and fresh Adam moments."""
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    params = init_params(model, init_key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_key)


def fresh_state(model: Transformer, tx: optax.GradientTransformation, seed: int, sharding):
    """`create_state` jitted, as a function of nothing. A seed from 0 to 2**31 - 1 is an argument of
    the compiled program (the same key as the constant), so that every seed of a sweep row shares
    one program and its compilation cache entry; another is compiled in as a constant."""
    if 0 <= seed < 2**31:
        init = jax.jit(functools.partial(create_state, model, tx), out_shardings=sharding)
        return functools.partial(init, jnp.asarray(seed, jnp.int32))
    return jax.jit(functools.partial(create_state, model, tx, seed), out_shardings=sharding)


def imported_state(fresh, tx: optax.GradientTransformation, params_of):
    """`fresh` (`fresh_state`) with the parameters `params_of()` gives instead of its random ones, and
    Adam's moments fresh for them: the first state of a run fine-tuning an imported model."""

    def start() -> TrainState:
        state = fresh()
        params = params_of()
        return state.replace(params=params, opt_state=jax.jit(tx.init)(params))

    return start


def model_of(config: ml_collections.ConfigDict, vocab_size: int) -> Transformer:
    """The Transformer a run's config describes, over a vocabulary of `vocab_size`."""
    return Transformer(TransformerConfig.from_config(config.model, vocab_size))


def build(config: ml_collections.ConfigDict, vocab_size: int, mesh):
    """(model, optimizer, the state's shapes placed on the mesh): nothing is computed."""
    model = model_of(config, vocab_size)
    tx = optim.optimizer(config)
    shapes = jax.eval_shape(functools.partial(create_state, model, tx, config.seed))
    return model, tx, checkpoint.abstract_like(shapes, parallel.replicated(mesh))


def abstract_params(model: Transformer, mesh):
    """The parameters' shapes placed on the mesh, as `build` places them in the state (no
    optimizer, nothing computed): what inference restores."""
    shapes = jax.eval_shape(functools.partial(init_params, model), jax.random.key(0))
    return checkpoint.abstract_like(shapes, parallel.replicated(mesh))
