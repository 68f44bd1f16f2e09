"""Command-line plumbing shared by every fxformer command.

Configs are Python files with `get_config(arg=None)`, named as `--config=configs/x.py[:arg]`;
any field is overridden with `--config.a.b=value`. An unknown key or a value of the wrong
type is refused with one sentence, and so is any other `UserError`: no traceback for
mistakes a user can fix.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_collections
from absl import logging as absl_logging

from fxformer import exitcodes

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # config files import each other as `configs.base`
    sys.path.insert(0, str(REPO_ROOT))


class UserError(Exception):
    """A mistake the user can fix; reported as one sentence, without a traceback."""


def load_config(spec: str) -> ml_collections.ConfigDict:
    """`path/to/config.py[:arg]` -> the ConfigDict its `get_config(arg)` returns."""
    path, _, arg = spec.partition(":")
    file = Path(path)
    if not file.is_file():
        raise UserError(f"Config file '{path}' does not exist.")
    module_spec = importlib.util.spec_from_file_location(f"_fxformer_config_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - a config file that does not even import
        raise UserError(f"Config file '{path}' failed to load: {type(e).__name__}: {e}.") from None
    if not hasattr(module, "get_config"):
        raise UserError(f"Config file '{path}' has no get_config() function.")
    try:
        config = module.get_config(arg) if arg else module.get_config()
    except ValueError as e:  # config files raise ValueError for a bad argument
        raise UserError(str(e)) from None
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - a bug in the config file: name it, in one line
        raise UserError(f"Config file '{path}' failed in get_config(): {type(e).__name__}: {e}.") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise UserError(
            f"Config file '{path}' must return an ml_collections.ConfigDict from get_config(), "
            f"not a {type(config).__name__}."
        )
    return config


def _all_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for name, value in config.items():
        keys.append(prefix + name)
        if isinstance(value, ml_collections.ConfigDict):
            keys += _all_keys(value, f"{prefix}{name}.")
    return keys


def _parse_value(key: str, raw: str, current: Any) -> Any:
    """Parse `raw` as the type of the field's current value."""
    kind = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        type(current), f"a {type(current).__name__}"
    )
    try:
        if isinstance(current, bool):
            lowered = raw.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError
            return lowered in ("true", "1")
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
        if isinstance(current, str):
            return raw
        value = ast.literal_eval(raw)
        if current is not None and not isinstance(value, type(current)):
            raise ValueError
        return value
    except (ValueError, SyntaxError):
        raise UserError(f"Config key '{key}' takes {kind}, and '{raw}' is not.") from None


def apply_override(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
    """Set the dotted `key` of `config` from the command-line string `raw`, checking key and type."""
    *parents, leaf = key.split(".")
    node = config
    for i, name in enumerate(parents + [leaf]):
        if not isinstance(node, ml_collections.ConfigDict) or name not in node:
            close = difflib.get_close_matches(key, _all_keys(config), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserError(f"Unknown config key '{key}'{hint}.")
        if i < len(parents):
            node = node[name]
    if isinstance(node[leaf], ml_collections.ConfigDict):
        raise UserError(f"Config key '{key}' is a section; set one of its fields instead.")
    with node.unlocked():
        node[leaf] = _parse_value(key, raw, node[leaf])


def parser(description: str, module: str, config: bool = True) -> argparse.ArgumentParser:
    """An ArgumentParser for `python -m <module>` that takes `--config=file[:arg]` and `--config.key=value`."""
    p = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Override any config field with --config.<key>=<value>, e.g. --config.model.num_heads=16."
        if config
        else None,
    )
    if config:
        p.add_argument("--config", help="config file and optional argument: configs/table3.py:B1")
    return p


def parse(
    p: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> tuple[argparse.Namespace, ml_collections.ConfigDict | None]:
    """Parse flags; load the config and apply its overrides in command-line order."""
    args, rest = p.parse_known_args(argv)
    overrides = []
    for item in rest:
        if not item.startswith("--config."):
            raise UserError(f"Unknown flag '{item}'; see --help.")
        key, sep, raw = item[len("--config.") :].partition("=")
        if not sep:
            raise UserError(f"Override '{item}' needs a value: --config.{key}=<value>.")
        overrides.append((key, raw))
    config = None
    if getattr(args, "config", None):
        config = load_config(args.config)
        for key, raw in overrides:
            apply_override(config, key, raw)
        resolve_derived(config)
    elif overrides:
        raise UserError("Overrides --config.<key>=<value> need a --config file.")
    return args, config


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
    model = config.get("model")
    if model is not None and all(k in model for k in ("d_k", "d_v", "d_model", "num_heads")):
        for key in ("d_k", "d_v"):
            if model[key] == 0 and model.num_heads > 0:
                model[key] = head_width(model.d_model, model.num_heads, key)
    return config


def log_to_stderr(*args, **kwargs) -> None:
    """Progress output for commands whose stdout is data."""
    print(*args, file=sys.stderr, **kwargs)


def run(main: Callable[[], int | None]) -> None:
    """Run a command's main; a UserError becomes one line on stderr and exit status 2 (`exitcodes`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    absl_logging.set_verbosity(absl_logging.ERROR)  # TFDS and orbax chatter; our own output is print()
    # orbax logs each background thread's failure with a traceback; fxformer reports a failed save itself
    absl_logging.get_absl_logger().addFilter(lambda record: "/orbax/" not in record.pathname)
    try:
        sys.exit(main() or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(exitcodes.USER_ERROR)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as e:
        from fxformer.paths import unwritable  # paths imports this module

        if unwritable(e) is None:
            raise
        print(
            f"error: cannot write {e.filename or 'a file'} ({unwritable(e)}); free space there or make it "
            "writable (or choose another --workdir), then run the same command again.",
            file=sys.stderr,
        )
        sys.exit(exitcodes.USER_ERROR)
