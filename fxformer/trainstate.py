"""What a training run is: its state (parameters, Adam moments, step, RNG key), the model and
optimizer its config builds, and the resolved config it records in its workdir.
"""

from __future__ import annotations

import functools
import json
import time
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


def init_params(model: Transformer, key: jax.Array):
    """Xavier-initialised parameters."""
    tokens = jnp.ones((1, 8), jnp.int32)
    return model.init(key, tokens, tokens)["params"]


def create_state(model: Transformer, tx: optax.GradientTransformation, seed: int) -> TrainState:
    """Xavier-initialised parameters and fresh Adam moments."""
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    params = init_params(model, init_key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_key)


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


def check_workdir_config(config: ml_collections.ConfigDict, workdir: paths.PathLike) -> None:
    """Refuse a workdir whose recorded model differs from the config's (nothing is written)."""
    paths.check_workdir(workdir)
    if not paths.Workdir(workdir).config.exists():
        return
    old = load_workdir_config(workdir).to_dict()
    new = json.loads(config.to_json())
    keys = (set(old["model"]) | set(new["model"])) - RUNTIME_FIELDS
    changed = [k for k in keys if old["model"].get(k) != new["model"].get(k)]
    if changed:
        raise UserError(
            f"{workdir} holds a model with a different model.{changed[0]} "
            f"({old['model'].get(changed[0])} vs {new['model'].get(changed[0])}); use a new --workdir."
        )


def config_changes(old: dict, new: dict, prefix: str = "") -> dict[str, list]:
    """{dotted key: [old, new]} for every field whose value differs between two configs."""
    out = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(config_changes(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = [a, b]
    return out


def write_workdir_config(config: ml_collections.ConfigDict, workdir: paths.PathLike, step: int = 0) -> None:
    """Record the resolved config the run trains with, once training really goes on from `step`
    (train calls it when a new run starts, and for a resume at its first save). Fields a resume
    changed (`num_train_steps`, the schedule, intervals, ...) are appended to `W/config-history.jsonl`
    with the step from which they hold, so no value is overwritten silently."""
    if jax.process_index() != 0:
        return
    run = paths.Workdir(workdir)
    new = json.loads(config.to_json())
    if run.config.exists():
        changed = config_changes(load_workdir_config(workdir).to_dict(), new)
        if not changed:
            return
        history = run.config_history.read_text() if run.config_history.exists() else ""
        line = json.dumps({"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changed": changed})
        paths.write_atomic(run.config_history, history + line + "\n")
    run.config.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(run.config, config.to_json(indent=2))  # other processes read the old file or the new one
