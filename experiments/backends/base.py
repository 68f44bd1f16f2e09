"""What every backend offers (`Backend`) and what a launch comes back with (`Launched`)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol

from experiments.job import Job
from fxformer import exitcodes


class Outcome(enum.Enum):
    """How a launch ended, as a sweep acts on it."""

    FINISHED = "finished"  # every command exited 0
    STOPPED = "stopped"  # saved and stopped before the last step (75): launch again to resume
    FAILED = "failed"  # any other exit status
    SUBMITTED = "submitted"  # handed to a scheduler that runs it later (sbatch)


@dataclasses.dataclass(frozen=True)
class Launched:
    """A launch's outcome, its exit status (`fxformer.exitcodes`), whether the launcher itself was
    asked to stop (SIGTERM, Ctrl-C) while it ran, and the scheduler's job id for a submission."""

    outcome: Outcome
    status: int
    interrupted: bool = False
    job_id: str = ""

    @classmethod
    def of(cls, status: int, interrupted: bool = False) -> Launched:
        """The outcome an exit status means."""
        outcome = {exitcodes.OK: Outcome.FINISHED, exitcodes.STOPPED: Outcome.STOPPED}.get(status, Outcome.FAILED)
        return cls(outcome, status, interrupted)


class Backend(Protocol):
    """Where runs go. Each verb takes the Job and `dry_run` (print the exact commands, run nothing)."""

    def launch(self, job: Job, dry_run: bool) -> Launched:
        """Run the job to its end (or submit it); a dry run prints and comes back FINISHED, status 0."""

    def setup(self, job: Job, dry_run: bool) -> int:
        """Prepare the machines (code, environment); an exit status."""

    def logs(self, job: Job, dry_run: bool) -> int:
        """Show or fetch the job's per-process logs; an exit status."""

    def stop(self, job: Job, dry_run: bool) -> int:
        """Ask the job's processes to save and stop; an exit status."""

    def before_retry(self, job: Job) -> None:
        """Make a relaunch possible after a pre-emption (e.g. re-create the machine)."""

    def interrupt(self) -> None:
        """Ask the launch running now (in another thread) to save and stop, as SIGTERM to us would."""

    def left_running(self, job: Job) -> int | None:
        """The pid of a command an earlier launch of `job` started here that still runs though its
        launcher is gone (None: none, or none this machine can see)."""
