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
