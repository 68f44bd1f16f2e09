"""A sweep as the verbs see it: its rows, its root `R`, the flags every row gets, and its
replicates (seeds), each a run directory, a Job and a RowState. Shared by runner and report."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from collections.abc import Callable

from experiments import backends, rowstate
from experiments import sweep as sweeps
from experiments.backends import Backend
from experiments.cli import say
from experiments.job import Job, default_logdir
from fxformer import paths
from fxformer.errors import UserError

ROOT_RECORD = "sweep-root.json"  # R/<this>: which sweep, profile, flags and seeds a root holds
OLD_ROOT_RECORD = "sweep.json"  # its name before, when it shared the row lease's name


@dataclasses.dataclass(frozen=True)
class Replicate:
    """Seed k of a row. Seed 0 is the row as configured, in `R/<row>`; seed k > 0 adds k to the
    config's `seed` (parameter init, dropout) and `data.shuffle_seed` (data order), in `R/<row>.s<k>`.
    Seed k of one row is paired with seed k of the baseline: same data order, same init seed."""

    run: sweeps.Run
    seed: int = 0

    @property
    def name(self) -> str:
        return self.run.name if self.seed == 0 else f"{self.run.name}.s{self.seed}"

    def flags(self, extra: tuple[str, ...]) -> list[str]:
        """fxformer.train's config flags for this replicate (without the workdir)."""
        flags = self.run.flags(extra)
        if self.seed == 0:
            return flags
        config = self.run.resolved(extra)
        return [
            *flags,
            f"--config.seed={config['seed'] + self.seed}",
            f"--config.data.shuffle_seed={config['data']['shuffle_seed'] + self.seed}",
        ]

    def resolved(self, extra: tuple[str, ...]) -> dict:
        config = self.run.resolved(extra)
        if self.seed:
            config["seed"] += self.seed
            config["data"]["shuffle_seed"] += self.seed
        return config


@dataclasses.dataclass(frozen=True)
class Options:
    """How the verbs treat a sweep's rows: its flags, read once (`of`); the verbs read these."""

    backend: str = "local"  # where rows run (--backend; its own flags make `Context.new_backend`)
    dry_run: bool = False  # print the commands, run nothing
    parallel: int = 1  # local backend: rows side by side
    max_attempts: int = 3  # tries per row before it counts as failed
    retry_failed: bool = False  # try rows that failed max_attempts times again
    move_changed: bool = False  # move runs with a changed config aside, start over
    lease_s: float = rowstate.DEFAULT_LEASE_S  # a row whose owner's heartbeat is older is taken over
    out: str = ""  # collect, plot: where the files go

    @classmethod
    def of(cls, args: argparse.Namespace) -> Options:
        """The options the parsed flags of a sweep verb (`runner.parser`) give."""
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})


class Context:
    """A sweep, its root, the per-row flags and the number of seeds, as the verbs see them; the
    flags that shape how its rows run, as `options`."""

    def __init__(self, args: argparse.Namespace, extra: list[str]):
        recorded = read_root(args.root, args.dry_run) if args.root else {}
        if recorded and args.profile and args.profile != recorded["profile"]:
            raise UserError(
                f"{args.root} holds the {recorded['profile']} profile of {recorded['sweep']}; "
                f"give another --root for --profile={args.profile}."
            )
        self.profile = args.profile or recorded.get("profile") or "paper"
        self.sweep = sweeps.load(args.sweep, self.profile)
        self.root = args.root or f"runs/{self.sweep.name}-{sweeps.profile_name(self.profile)}"
        self.root_file = paths.as_path(self.root) / ROOT_RECORD
        self.extra = tuple(extra) if extra else tuple(recorded.get("extra", ()))
        self.seeds = args.seeds or recorded.get("seeds") or 0  # 0: the sweep's own counts
        self.options = Options.of(args)
        # a row's backend, as --backend and its flags say; launched in a thread, the sweep keeps the signals
        self.new_backend: Callable[..., Backend] = functools.partial(backends.backend_for, args, handle_signals=False)

    @property
    def args(self) -> Options:
        """`options` under its older name, which `experiments.records` still reads."""
        return self.options

    def record(self) -> None:
        """R/sweep-root.json: which sweep and profile this root holds, the flags every row gets, the seeds."""
        self.root_file.parent.mkdir(parents=True, exist_ok=True)
        record = {"sweep": self.sweep.name, "profile": self.profile, "extra": list(self.extra)}
        if self.seeds:
            record["seeds"] = self.seeds
        paths.write_atomic(self.root_file, json.dumps(record, indent=2) + "\n")

    def replicates(self, run: sweeps.Run) -> list[Replicate]:
        """The seeds of `run` this sweep runs: --seeds (or the root's), else the sweep's count for it."""
        return [Replicate(run, k) for k in range(self.seeds or self.sweep.replicates_of(run.name))]

    def units(self, runs: list[sweeps.Run]) -> list[Replicate]:
        """Every replicate of `runs`, seed by seed (seed 0 of every row first: a table early)."""
        by_row = [self.replicates(run) for run in runs]
        most = max((len(r) for r in by_row), default=0)
        return [reps[k] for k in range(most) for reps in by_row if k < len(reps)]

    def workdir(self, rep: Replicate | sweeps.Run) -> paths.Workdir:
        """The run directory of a row or replicate, `R/<name>`."""
        return paths.Workdir(paths.as_path(self.root) / rep.name)

    @property
    def eval_split(self) -> str:
        return self.sweep.eval_split

    @property
    def more_splits(self) -> list[str]:
        """The splits evaluated after eval_split (the test set beside dev)."""
        return [split for split, _ in self.sweep.evaluations()[1:]]

    def read(self, rep: Replicate | sweeps.Run) -> rowstate.RowState:
        return rowstate.read(self.workdir(rep), self.eval_split, self.more_splits, self.sweep.eval_flags)

    def job(self, rep: Replicate, train: bool = True, splits: list[str] | None = None) -> Job:
        """The replicate's job: training (unless `train` is False), then one fxformer.evaluate of
        `splits` (default: every split the sweep evaluates; several in one process, restored once)."""
        workdir = self.workdir(rep)
        flags = (*rep.flags(self.extra), f"--workdir={workdir}")
        logdir = default_logdir(workdir, self.sweep.name, rep.name)
        chosen = [split for split, _ in self.sweep.evaluations() if splits is None or split in splits]
        return Job(
            f"{self.sweep.name}-{rep.name}",
            flags,
            evaluate=True,
            eval_flags=sweeps.with_split(self.sweep.eval_flags, ",".join(chosen)),
            logdir=logdir,
            train=train,
            workdir=str(workdir),
        )


def read_root(root: str, dry_run: bool) -> dict:
    """A root's record; one written under its old name (R/sweep.json) is moved to the new one."""
    path = paths.as_path(root) / ROOT_RECORD
    old = paths.as_path(root) / OLD_ROOT_RECORD
    fix = "delete it and give --profile (and the flags after --) again"
    if not path.exists() and old.exists():
        record = rowstate.read_json(old, "the sweep's root record", fix)
        if not dry_run:
            old.rename(path)
            say(f"{root}: the root record moved from {OLD_ROOT_RECORD} to {ROOT_RECORD} (its new name)")
        return record
    return rowstate.read_json(path, "the sweep's root record", fix) if path.exists() else {}
