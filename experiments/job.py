"""One run as the launcher sees it (a `Job`), where its logs go, and the one way commands are run."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from pathlib import Path

from experiments.cli import flag_value, say, which
from fxformer import exitcodes
from fxformer.errors import UserError
from fxformer.paths import is_url


@dataclasses.dataclass(frozen=True)
class Job:
    """One run: fxformer.train's flags, then optionally fxformer.evaluate on the same workdir
    (or, with `train=False`, the evaluation alone: a sweep's trained but unevaluated row; a
    sweep's `eval_flags` name every split it evaluates, `--split=validation,test`)."""

    name: str
    train_flags: tuple[str, ...]
    evaluate: bool = False
    eval_flags: tuple[str, ...] = ()
    logdir: Path = Path("logs")
    train: bool = True
    hold_log: bool = False  # the logdir lies in the workdir: write nothing there until train accepts the run
    workdir: str = ""  # the run's --workdir (also among train_flags, which are passed on as given)

    def __post_init__(self):
        given = flag_value(list(self.train_flags), "workdir") or ""
        if given != self.workdir:  # evaluation would read another directory than training writes
            raise ValueError(f"Job {self.name}: workdir={self.workdir!r} but its train flags give --workdir={given!r}")

    def evaluation(self, cluster_flags: list[str]) -> list[str]:
        """fxformer.evaluate's module and flags."""
        return ["fxformer.evaluate", *cluster_flags, f"--workdir={self.workdir}", *self.eval_flags]

    def worker_flags(self, rundir: str, cluster_flags: list[str]) -> list[str]:
        """The flags of `python -m experiments.worker` that run this job on one host."""
        flags = [f"--rundir={rundir}"]
        evaluation = self.evaluation(cluster_flags)
        if not self.train:
            return [*flags, "--", *evaluation]
        if self.evaluate:
            flags.append(f"--then={shlex.join(evaluation)}")
        if self.hold_log:
            flags.append("--hold_log")
        return [*flags, "--", "fxformer.train", *cluster_flags, *self.train_flags]


def default_logdir(workdir: str, *name: str) -> Path:
    """Where a run's launcher logs go: `W/logs` for a local workdir, else `logs/<name...>` here
    (a gs:// workdir is no place for a local process's log)."""
    if workdir and not is_url(workdir):
        return Path(os.path.expanduser(workdir)) / "logs"
    return Path("logs", *name)


def run_commands(argvs: list[list[str]], dry_run: bool, check: bool = True) -> int:
    """Run commands one after another (or print them); the first failure stops and is returned."""
    for argv in argvs:
        if dry_run:
            print(shlex.join(argv))
            continue
        which(argv[0])
        say(shlex.join(argv)[:300])
        status = subprocess.run(argv).returncode
        if status and check:
            raise UserError(f"'{shlex.join(argv)[:120]}...' failed with status {status}; see its output above.")
    return exitcodes.OK
