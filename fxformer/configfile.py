"""Config files and overrides: `path/to/config.py[:arg]` names a Python file whose
`get_config(arg)` returns an `ml_collections.ConfigDict`; `--config.a.b=value` sets a field,
parsed as the type of its current value. Imports no JAX (the launcher and sweeps use it).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import ml_collections

from fxformer.config import check_decode, parse_value, resolve_derived, walk
from fxformer.errors import UserError


def make_importable(file: Path) -> None:
    """Let a config file in a package (configs/) import its siblings as `configs.base`, wherever
    the command runs from: the package's parent goes on sys.path, once."""
    package = Path(file).resolve().parent
    if (package / "__init__.py").exists() and str(package.parent) not in sys.path:
        sys.path.insert(0, str(package.parent))


def load_module(path: str):
    """The Python module of the config file at `path` (its siblings in configs/ importable), read
    without writing its bytecode: a command leaves the folder of a config file as it found it."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"Config file '{path}' does not exist{where_configs_live(path)}.")
    make_importable(file)
    module_spec = importlib.util.spec_from_file_location(f"_fxformer_config_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ beside a user's config
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - a config file that does not even import
        raise UserError(f"Config file '{path}' failed to load: {type(e).__name__}: {e}.") from None
    finally:
        sys.dont_write_bytecode = writes
    return module


def where_configs_live(path: str) -> str:
    """For a config path that does not exist: where the configs are (they live in a checkout of
    fxformer, beside the package; an installed package has none)."""
    checkout = Path(__file__).resolve().parent.parent / "configs"
    if Path(path).is_absolute():
        return ""
    if checkout.is_dir():
        return f" under {Path.cwd()}; the configs are in {checkout} (give --config={checkout / Path(path).name})"
    return (
        f" under {Path.cwd()}; the configs (configs/default.py, configs/base.py, ...) are files of a checkout "
        "of fxformer, not of the installed package: give the path to one in a checkout"
    )


def load_config(spec: str) -> ml_collections.ConfigDict:
    """`path/to/config.py[:arg]` -> the ConfigDict its `get_config(arg)` returns."""
    path, _, arg = spec.partition(":")
    module = load_module(path)
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


def apply_override(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
    """Set the dotted `key` of `config` from the command-line string `raw`, checking key and type."""
    node, leaf = walk(config, key)
    if isinstance(node[leaf], ml_collections.ConfigDict):
        raise UserError(f"Config key '{key}' is a section; set one of its fields instead.")
    with node.unlocked():
        node[leaf] = parse_value(key, raw, node[leaf])


def overrides(flags: Iterable[str]) -> list[tuple[str, str]]:
    """`--config.a.b=value` flags -> [(key, raw value)], in order; any other flag is refused."""
    pairs = []
    for item in flags:
        if not item.startswith("--config."):
            raise UserError(f"Unknown flag '{item}'; see --help.")
        key, sep, raw = item[len("--config.") :].partition("=")
        if not sep:
            raise UserError(f"Override '{item}' needs a value: --config.{key}=<value>.")
        pairs.append((key, raw))
    return pairs


def resolve(spec: str, pairs: Iterable[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
    """The config file `spec` with the overrides applied in order and the derived fields filled."""
    config = load_config(spec)
    for key, raw in pairs:
        apply_override(config, key, raw)
    return resolve_derived(config)


def decode_changes(config: ml_collections.ConfigDict, pairs, workdir) -> dict:
    """The decode fields that the overrides `pairs` set to another value than the trained run's
    `config` ({"alpha": 1.5}): what names an evaluation's results (`paths.Workdir.eval_result`)."""
    searched = apply_decode_overrides(config.copy_and_resolve_references(), pairs, workdir)
    return changed_decode(config.decode, searched.decode)


def changed_decode(trained: Mapping, searched: Mapping) -> dict:
    """The fields of a `searched` decode section whose value differs from the `trained` run's
    ({"alpha": 1.5})."""
    return {key: value for key, value in searched.items() if trained.get(key) != value}


def apply_decode_overrides(config: ml_collections.ConfigDict, pairs, workdir) -> ml_collections.ConfigDict:
    """`--config.decode.x=v` overrides onto the config of the run in `workdir`, and the decode checks;
    any other key is fixed by the trained run."""
    for key, raw in pairs:
        if not key.startswith("decode."):
            raise UserError(
                f"--config.{key} cannot change at inference: it is fixed by the trained run ({workdir}/config.json); "
                "only --config.decode.<field> overrides are taken here."
            )
        apply_override(config, key, raw)
    check_decode(config)
    return config
