"""Launch one fxformer run on local processes, a Cloud TPU pod or a SLURM cluster; imports no JAX.

    python -m experiments launch --backend=local --processes=2 -- --config=configs/default.py --workdir=runs/two
    python -m experiments setup  --backend=tpu --tpu=my-v4-32 --zone=us-central2-b
    python -m experiments launch --backend=tpu --tpu=my-v4-32 --zone=us-central2-b -- --config=configs/base.py \\
        --workdir=gs://bucket/runs/base
    python -m experiments logs   --backend=tpu --tpu=my-v4-32 --zone=us-central2-b --name=base
    python -m experiments launch --backend=slurm --nodes=2 --gpus_per_node=8 -- --config=configs/base.py \\
        --workdir=/shared/runs/base

Everything after `--` goes to `fxformer.train` unchanged (and `fxformer.evaluate --workdir=W`
runs after it with --evaluate). `--dry-run` prints the exact commands (or the sbatch script)
and runs nothing. The exit status is the run's: 0 finished, 75 stopped before its last step
(pre-empted; launch again to resume, or give --retries), anything else a failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import time
from pathlib import Path

from experiments import backends
from experiments.backends import Outcome
from experiments.cli import flag_value, say, split_at_dashes, verb_parser
from experiments.job import Job, default_logdir
from fxformer import exitcodes
from fxformer.errors import UserError
from fxformer.paths import is_url

VERBS = {
    "launch": "start a run (and relaunch it after a pre-emption with --retries)",
    "setup": "prepare the machines: code and an idempotent virtual environment (tpu)",
    "logs": "fetch and show the per-process logs of a run",
    "stop": "ask a run's processes to save and stop (only the processes the launcher started)",
}
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=,+-]*")
PLAIN_PATH = re.compile(r"[A-Za-z0-9_.=,+/-]+")  # no ~: #SBATCH lines do not expand it, bash does


def job_from_args(args: argparse.Namespace, train_flags: list[str], need_flags: bool) -> Job:
    """The Job that the launcher's flags and the flags after `--` describe."""
    workdir = flag_value(train_flags, "workdir")
    if need_flags and not workdir:
        raise UserError("Give fxformer.train's flags after --, with --workdir: -- --config=C --workdir=W.")
    cluster = ("--coordinator_address", "--process_id", "--num_processes")
    if any(f == "--distributed" or f.startswith(cluster) for f in train_flags):
        raise UserError("Leave --distributed and the cluster flags to the launcher; it adds them per backend.")
    if args.name and not PLAIN_NAME.fullmatch(args.name):
        raise UserError(f"--name={args.name!r} is not a plain name; use letters, digits and _.=,+- (no / or spaces).")
    name = args.name or (workdir.rstrip("/").rsplit("/", 1)[-1] if workdir else "") or args.default_name
    if not name:
        raise UserError("Give --name=<run name> (or the run's --workdir after --) to say which run.")
    if not PLAIN_NAME.fullmatch(name):  # it names jobs, log files and remote directories in scripts
        raise UserError(
            f"The run name {name!r} (the end of --workdir) is not a plain name; give --name=<letters, "
            "digits and _.=,+->."
        )
    logdir = Path(args.logdir) if args.logdir else default_logdir(workdir or "", name)
    if getattr(args, "backend", "local") != "local" and not PLAIN_PATH.fullmatch(str(logdir)):
        raise UserError(
            f"The log directory {str(logdir)!r} has spaces or shell characters, which the {args.backend} "
            "backend's scripts cannot carry; give --logdir=<a path of letters, digits and /_.=,+->."
        )
    # A refused run leaves its workdir as it was (or absent): the workers' logs wait for train to accept it.
    hold = bool(workdir) and not is_url(workdir) and inside(logdir, Path(os.path.expanduser(workdir)))
    return Job(
        name,
        tuple(train_flags),
        evaluate=args.evaluate,
        eval_flags=tuple(shlex.split(args.eval_flags)),
        logdir=logdir,
        hold_log=hold,
        workdir=workdir or "",
    )


STOP_REQUESTED = "stop-requested"  # in the run's log directory: `stop` asks that no retry relaunch the run


def request_stop(job: Job) -> None:
    """Mark the run as stopped by `stop`, so that a launch with --retries does not take the status 75
    its processes answer with for a pre-emption and relaunch them."""
    if Path(job.logdir).is_dir():  # no log directory: the run is not running here
        (Path(job.logdir) / STOP_REQUESTED).write_text(f"{time.time()}\n")


def inside(path: Path, directory: Path) -> bool:
    """Whether `path` is `directory` or lies under it (neither needs to exist)."""
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(directory))


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags of every launcher verb; each backend reads its own."""
    p.add_argument("--name", default="", help="run name (default: the last part of --workdir)")
    p.add_argument("--logdir", default="", help="local log directory (default: W/logs, or logs/<name> for a URL)")
    p.add_argument("--retries", type=int, default=0, help="relaunch a run stopped by a pre-emption up to K times")
    p.add_argument("--evaluate", action="store_true", help="run fxformer.evaluate --workdir=W after training")
    p.add_argument("--eval_flags", default="", help="more fxformer.evaluate flags, e.g. '--split=validation'")
    backends.add_flags(p)


def main(verb: str, argv: list[str]) -> int:
    ours, train_flags = split_at_dashes(argv)
    p = verb_parser(verb, f"{VERBS[verb]}.\n\n{__doc__}", epilog="Everything after -- is passed to fxformer.train.")
    add_flags(p)
    args = p.parse_args(ours)
    args.default_name = "setup" if verb == "setup" else ""  # setting up machines concerns no run
    if args.retries < 0:
        raise UserError(f"--retries must be at least 0, not {args.retries}.")
    job = job_from_args(args, train_flags, need_flags=verb == "launch")
    backend = backends.backend_for(args)
    if verb == "stop" and not args.dry_run:
        request_stop(job)
    if verb != "launch":
        return getattr(backend, verb)(job, args.dry_run)
    stop_request = Path(job.logdir) / STOP_REQUESTED
    if not args.dry_run:
        stop_request.unlink(missing_ok=True)  # an earlier run's

    def stopped_by_user() -> bool:
        asked = stop_request.exists()
        if asked:
            say("stopped by `stop`: not relaunched")
        return asked

    for attempt in range(args.retries + 1):
        launched = backend.launch(job, args.dry_run)
        if launched.outcome != Outcome.STOPPED or attempt == args.retries or launched.interrupted:
            break
        if stopped_by_user():
            break
        say(f"the run stopped before its last step (status 75); relaunching ({attempt + 1} of {args.retries})")
        backend.before_retry(job)
        if stopped_by_user():  # `stop` while the machines were made ready again
            break
    if launched.outcome == Outcome.STOPPED and not args.dry_run:
        say("stopped before the last step, checkpoint saved: launch the same command again to resume")
    return launched.status if launched.outcome != Outcome.SUBMITTED else exitcodes.OK
