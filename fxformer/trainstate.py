"""What a training run is: its state (parameters, Adam moments, step, RNG key), the model and
optimizer its config builds, and the resolved config it records in its workdir.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from fxformer import checkpoint, optim, parallel, paths
from fxformer.errors import UserError
from fxformer.model import Transformer, TransformerConfig
from fxformer.resolve import decode_section


@flax.struct.dataclass
class TrainState:
    """Everything a step changes, plus the run's RNG key (dropout keys are folded from it)."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def create_state(model: Transformer, tx: optax.GradientTransformation, seed: int) -> TrainState:
    """Xavier-initialised parameters and fresh Adam moments."""
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    tokens = jnp.ones((1, 8), jnp.int32)
    params = model.init(init_key, tokens, tokens)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_key)


def build(config: ml_collections.ConfigDict, vocab_size: int, mesh):
    """(model, optimizer, the state's shapes placed on the mesh): nothing is computed."""
    model = Transformer(TransformerConfig.from_config(config.model, vocab_size))
    tx = optim.optimizer(config)
    shapes = jax.eval_shape(functools.partial(create_state, model, tx, config.seed))
    return model, tx, checkpoint.abstract_like(shapes, parallel.replicated(mesh))


RUNTIME_FIELDS = {"attention_impl"}  # how the model is computed, not what it is: may change on resume


def load_workdir_config(workdir: paths.PathLike) -> ml_collections.ConfigDict:
    """The resolved config a run wrote into its workdir (one written before the `decode`
    section existed gets it, from its top-level beam_size / alpha / max_decode_extra)."""
    path = paths.Workdir(workdir).config
    paths.check_workdir(workdir)
    if not path.exists():
        raise UserError(f"{workdir} has no config.json; is it a training workdir?")
    try:
        loaded = json.loads(path.read_text())
        if not isinstance(loaded, dict) or "model" not in loaded:
            raise ValueError("not a config")
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(
            f"{path} is damaged ({type(e).__name__}); write it again by training with the run's --config."
        ) from None
    return decode_section(ml_collections.ConfigDict(loaded))


def write_workdir_config(config: ml_collections.ConfigDict, workdir: paths.PathLike) -> None:
    """Record the resolved config; refuse a workdir whose model differs from the config's."""
    paths.check_workdir(workdir)
    path = paths.Workdir(workdir).config
    if path.exists():
        old = load_workdir_config(workdir).to_dict()
        new = json.loads(config.to_json())
        keys = (set(old["model"]) | set(new["model"])) - RUNTIME_FIELDS
        changed = [k for k in keys if old["model"].get(k) != new["model"].get(k)]
        if changed:
            raise UserError(
                f"{workdir} holds a model with a different model.{changed[0]} "
                f"({old['model'].get(changed[0])} vs {new['model'].get(changed[0])}); use a new --workdir."
            )
    if jax.process_index() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(path, config.to_json(indent=2))  # other processes read the old file or the new one
