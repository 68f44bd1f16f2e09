"""A run's config in one place: the fields derived from others, the `decode` section and its
checks, and the resolved config a run records in its workdir (`W/config.json`: read, written,
compared on resume). Imports no JAX (the launcher and the sweeps use it).
"""

from __future__ import annotations

import json
import time

import ml_collections

from configs import base
from fxformer import paths
from fxformer.errors import UserError


def head_width(d_model: int, num_heads: int, key: str) -> int:
    """What `model.d_k` / `model.d_v` of 0 mean: d_model / h, the paper's choice (refused when h
    does not divide d_model)."""
    if d_model % num_heads:
        raise UserError(
            f"model.d_model ({d_model}) is not divisible by model.num_heads ({num_heads}); set model.{key} explicitly."
        )
    return d_model // num_heads


def resolve_derived(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Fill fields derived from others, after the overrides: `model.d_k` / `model.d_v` of 0 become
    d_model / h, so changing d_model or h changes the heads' width unless d_k / d_v are set."""
    model = config.model if "model" in config else {}
    if all(k in model for k in ("d_k", "d_v", "d_model", "num_heads")):
        for key in ("d_k", "d_v"):
            if model[key] == 0 and model.num_heads > 0:
                model[key] = head_width(model.d_model, model.num_heads, key)
    return config


# Fields older code wrote under other names: its dotted key -> today's.
RENAMED = {"beam_size": "decode.beam_size", "alpha": "decode.alpha", "max_decode_extra": "decode.max_extra"}


def upgrade(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A config written by older code (a workdir's config.json), as today's code reads it: fields
    it names otherwise (`RENAMED`) moved to today's names, and every field it lacks filled with
    configs/base.py's default; the fields it has keep their values."""
    old = config.to_dict()
    for before, now in RENAMED.items():
        if before in old:
            value = old.pop(before)
            section, _, leaf = now.rpartition(".")
            old.setdefault(section, {}).setdefault(leaf, value)
    return ml_collections.ConfigDict(_filled(old, base.get_config().to_dict()))


def _filled(config: dict, defaults: dict) -> dict:
    """`config` with every key of `defaults` it lacks (in sections too) set to the default."""
    out = dict(config)
    for key, default in defaults.items():
        if key not in out:
            out[key] = default
        elif isinstance(default, dict) and isinstance(out[key], dict):
            out[key] = _filled(out[key], default)
    return out


STRATEGIES = ("beam", "greedy", "sample")


def check_decode(decode: ml_collections.ConfigDict) -> None:
    """Refuse, in one sentence, a decode section the searches cannot run."""
    if decode.strategy not in STRATEGIES:
        raise UserError(f"decode.strategy must be one of {', '.join(STRATEGIES)}, not {decode.strategy!r}.")
    if decode.beam_variant not in ("live", "t2t"):
        raise UserError(f"decode.beam_variant must be live or t2t, not {decode.beam_variant!r}.")
    for key, low in (("beam_size", 1), ("nbest", 1), ("max_extra", 0), ("top_k", 0), ("alpha", 0)):
        if decode[key] < low:
            raise UserError(f"decode.{key} must be at least {low}, not {decode[key]}.")
    if not decode.temperature >= 0:
        raise UserError(f"decode.temperature must be 0 or more, not {decode.temperature}.")
    if decode.strategy == "beam" and decode.nbest > decode.beam_size:
        raise UserError(f"decode.nbest ({decode.nbest}) cannot exceed decode.beam_size ({decode.beam_size}).")
    if decode.strategy == "greedy" and decode.nbest > 1:
        raise UserError("decode.nbest > 1 needs decode.strategy=beam or sample; greedy search finds one.")


RUNTIME_FIELDS = {"attention_impl"}  # how the model is computed, not what it is: may change on resume


def load_workdir_config(workdir: paths.PathLike) -> ml_collections.ConfigDict:
    """The resolved config a run wrote into its workdir, upgraded: one written by older code gets
    the fields added since (`upgrade`)."""
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
    return upgrade(ml_collections.ConfigDict(loaded))


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
    (train's process 0 calls it when a new run starts, and for a resume at its first save). Fields a resume
    changed (`num_train_steps`, the schedule, intervals, ...) are appended to `W/config-history.jsonl`
    with the step from which they hold, so no value is overwritten silently."""
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
