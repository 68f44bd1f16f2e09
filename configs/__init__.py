"""Experiment configs: Python files with `get_config(arg=None)`; each docstring holds its command."""

import ml_collections


def with_overrides(config: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
    """Set dotted keys (`"model.d_model": 1024`) of `config`; every key must already exist."""
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for name in parents:
            node = node[name]
        if leaf not in node:
            raise KeyError(f"{key} is not a config field")
        node[leaf] = value
    return config


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Fill the derived fields: `model.d_k` / `model.d_v` of 0 mean d_model / num_heads (the paper's
    choice), so changing d_model or h changes the heads' width unless d_k / d_v are set."""
    model = config.model
    for key in ("d_k", "d_v"):
        if model[key] == 0 and model.num_heads > 0:
            if model.d_model % model.num_heads:
                raise ValueError(
                    f"model.d_model ({model.d_model}) is not divisible by model.num_heads ({model.num_heads}); "
                    f"set model.{key} explicitly."
                )
            model[key] = model.d_model // model.num_heads
    return config
