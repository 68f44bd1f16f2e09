"""A sweep as data: named runs over a config, the metrics to report, an optional reference table.

A config file describes its own sweep with `sweep(profile)`, beside `get_config` (big_vision's
habit), returning a plain dict; `configs/table3.py` is the first:

    def sweep(profile="paper"):
        return {
            "runs": {"base": "configs/table3.py:base,mini", "B1": "configs/table3.py:B1,mini", ...},
            "baseline": "base",                      # the run every other is compared with
            "columns": {"N": "model.num_layers", ...},  # the table's layout: label -> config key
            "metrics": {"ppl": "lower", "bleu": "higher"},  # from fxformer.evaluate's results
            "reference": {"base": {"ppl": 4.92, "bleu": 25.8, "params": 65e6}, ...},  # optional
            "eval_flags": ["--split=validation", "--average_last=1"],
            "replicates": {"base": 5, "*": 3},       # seeds per run (or one number); default 1
            "noise": {"ppl": {"log_sd": 0.003}},      # the reference's run-to-run sd, for its ties
            "more_splits": ["test"],                  # the same evaluation on these splits too
            "pilot_rows": ["D1", "C1"],               # rows that chose the recipe: marked, not counted
        }

A run is a config spec, optionally with overrides: `("configs/default.py", {"model.d_model": 256})`.
Grids come from `product` and `zipit` over `axis(key, values)`, named by their overrides:

    runs = grid("configs/default.py", product(axis("model.num_heads", [4, 8]), axis("seed", [0, 1])))

Resolving a run's config imports no JAX (only the config files and ml_collections).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
import itertools
import json
from pathlib import Path

from experiments.cli import flag_value
from fxformer import configfile
from fxformer.errors import UserError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep: `--config=<config>` plus `--config.<key>=<value>` for each override."""

    name: str
    config: str
    overrides: tuple[tuple[str, object], ...] = ()

    def flags(self, extra: tuple[str, ...] = ()) -> list[str]:
        """fxformer.train's config flags for this run (the workdir is added by the runner)."""
        return [f"--config={self.config}", *(f"--config.{k}={v}" for k, v in self.overrides), *extra]

    def without_folder(self, profile: str) -> Run:
        """This run with its profile's data folder (`multi30k:<folder>`) left out of its config: what a
        table reads of a row (its shape, steps and stopping rule), resolved with no data files present."""
        name = profile_name(profile)
        return self if name == profile else dataclasses.replace(self, config=self.config.replace(profile, name))

    def resolved(self, extra: tuple[str, ...] = ()) -> dict:
        """The config this run trains with, as the JSON fxformer.train writes to W/config.json."""
        spec, *rest = self.flags(extra)
        config = configfile.resolve(spec.removeprefix("--config="), configfile.overrides(rest))
        return json.loads(config.to_json())


@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    profile: str
    runs: tuple[Run, ...]
    baseline: str | None = None
    columns: dict = dataclasses.field(default_factory=dict)
    metrics: dict = dataclasses.field(default_factory=lambda: {"ppl": "lower", "bleu": "higher"})
    reference: dict = dataclasses.field(default_factory=dict)
    eval_flags: tuple[str, ...] = ()
    replicates: dict = dataclasses.field(default_factory=dict)  # run name or pattern -> seeds; "*" the rest
    noise: dict = dataclasses.field(default_factory=dict)  # metric -> the reference's per-run sd: {"log_sd": ..}
    noise_source: str = ""  # where that sd comes from, for the table's footer
    more_splits: tuple[str, ...] = ()  # evaluated too, with eval_flags' decoding: e.g. the test set beside dev
    pilot_rows: tuple[str, ...] = ()  # rows looked at to choose the recipe: marked, left out of the count
    plan: dict = dataclasses.field(default_factory=dict)  # the analysis plan's settings (experiments.analysis)
    claims: tuple[dict, ...] = ()  # the reference's stated conclusions: {"claim", "rows": {row: direction}}
    data_source: str = ""  # where the data files come from (records' header, beside their SHA-256)

    @property
    def eval_split(self) -> str:
        """The split the table is judged on: eval_flags' --split (fxformer.evaluate's default, test, without)."""
        return flag_value(list(self.eval_flags), "split") or "test"

    def evaluations(self) -> list[tuple[str, tuple[str, ...]]]:
        """(split, fxformer.evaluate's flags) of every evaluation of a row: eval_split's first, then
        each of more_splits with the same flags but its --split."""
        out = [(self.eval_split, self.eval_flags)]
        for split in self.more_splits:
            if split not in (s for s, _ in out):
                out.append((split, with_split(self.eval_flags, split)))
        return out

    def replicates_of(self, name: str) -> int:
        """How many seeds of run `name` the sweep runs (its entry, else the first matching pattern, else 1)."""
        if name in self.replicates:
            return self.replicates[name]
        return next((n for p, n in self.replicates.items() if fnmatch.fnmatchcase(name, p)), 1)

    def select(self, only: str) -> list[Run]:
        """The runs matching `--only` (comma-separated names or shell patterns: 'A*,base'), in order."""
        if not only:
            return list(self.runs)
        patterns = [p.strip() for p in only.split(",") if p.strip()]
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(run.name, pattern) for run in self.runs):
                names = ", ".join(run.name for run in self.runs)
                raise UserError(f"--only: '{pattern}' matches no run of {self.name}; its runs are {names}.")
        return [run for run in self.runs if any(fnmatch.fnmatchcase(run.name, p) for p in patterns)]


def with_split(flags: tuple[str, ...], split: str) -> tuple[str, ...]:
    """`flags` with their --split (either form) set to `split`, appended if they had none."""
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--split" or flag.startswith("--split="):
            out.append(f"--split={split}")
            skip = flag == "--split"
        else:
            out.append(flag)
    return tuple(out) if f"--split={split}" in out else (*out, f"--split={split}")


def axis(key: str, values) -> list[dict]:
    """One swept field: [{key: v} for each value]."""
    return [{key: v} for v in values]


def product(*axes: list[dict]) -> list[dict]:
    """Every combination of the axes' settings."""
    return [dict(itertools.chain.from_iterable(d.items() for d in combo)) for combo in itertools.product(*axes)]


def zipit(*axes: list[dict]) -> list[dict]:
    """The axes' settings side by side (equal lengths): the i-th of each together."""
    if len({len(a) for a in axes}) > 1:
        raise ValueError("zipit needs axes of equal length")
    return [dict(itertools.chain.from_iterable(d.items() for d in combo)) for combo in zip(*axes)]


def grid(config: str, settings: list[dict]) -> dict:
    """Runs of `config` with each setting's overrides, named by them: 'num_heads=4,seed=0'."""
    runs = {}
    for setting in settings:
        name = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in setting.items()) or "default"
        runs[name] = (config, setting)
    return runs


def from_dict(name: str, profile: str, description: dict) -> Sweep:
    """A Sweep from a config file's `sweep(profile)` dict (runs: name -> spec or (spec, overrides))."""
    runs = []
    for run_name, spec in description["runs"].items():
        config, overrides = (spec, {}) if isinstance(spec, str) else spec
        runs.append(Run(run_name, config, tuple(overrides.items())))
    return Sweep(
        name=name,
        profile=profile,
        runs=tuple(runs),
        baseline=description.get("baseline"),
        columns=dict(description.get("columns", {})),
        metrics=dict(description.get("metrics", {"ppl": "lower", "bleu": "higher"})),
        reference=dict(description.get("reference", {})),
        eval_flags=tuple(description.get("eval_flags", ())),
        noise=dict(description.get("noise", {})),
        noise_source=description.get("noise_source", ""),
        more_splits=tuple(description.get("more_splits", ())),
        pilot_rows=tuple(description.get("pilot_rows", ())),
        plan=dict(description.get("plan", {})),
        claims=tuple(description.get("claims", ())),
        data_source=description.get("data_source", ""),
        replicates=counts if isinstance(counts := description.get("replicates", 1), dict) else {"*": counts},
    )


def profile_name(profile: str) -> str:
    """The profile a `--profile` names: a profile may take a folder (`multi30k:<folder>`)."""
    return profile.partition(":")[0]


def load(name: str, profile: str) -> Sweep:
    """The sweep `name` (configs/<name>.py, or a path to a config file) in `profile`."""
    path = Path(name) if name.endswith(".py") else CONFIGS / f"{name}.py"
    if not path.is_file():
        raise UserError(f"No sweep '{name}': {path} does not exist (give configs/<name>.py with sweep()).")
    configfile.make_importable(path)
    spec = importlib.util.spec_from_file_location(f"_fxformer_sweep_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "sweep"):
        raise UserError(f"{path} describes no sweep: it has no sweep(profile) function.")
    profiles = getattr(module, "PROFILES", None)
    if profiles is not None and profile_name(profile) not in profiles:
        raise UserError(f"Unknown profile '{profile}' for {name}; choose one of {', '.join(profiles)}.")
    return from_dict(path.stem, profile, module.sweep(profile))


def of_records(header: dict) -> Sweep:
    """The sweep a records file was collected from: its header's sweep and profile."""
    return load(header["sweep"], header["profile"])
