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
import dataclasses
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

from experiments import group, worker
from experiments.group import LaunchError, say
from experiments.worker import flag_value
from fxformer import exitcodes
from fxformer.paths import is_url

VERBS = {
    "launch": "start a run (and relaunch it after a pre-emption with --retries)",
    "setup": "prepare the machines: code and an idempotent virtual environment (tpu)",
    "logs": "fetch and show the per-process logs of a run",
    "stop": "ask a run's processes to save and stop (only the processes the launcher started)",
}


@dataclasses.dataclass(frozen=True)
class Job:
    """One run: fxformer.train's flags, then optionally fxformer.evaluate on the same workdir
    (or, with `train=False`, the evaluation alone: a sweep's trained but unevaluated row)."""

    name: str
    train_flags: tuple[str, ...]
    evaluate: bool = False
    eval_flags: tuple[str, ...] = ()
    logdir: Path = Path("logs")
    train: bool = True

    @property
    def workdir(self) -> str:
        return flag_value(list(self.train_flags), "workdir") or ""

    def worker_flags(self, rundir: str, cluster_flags: list[str]) -> list[str]:
        """The flags of `python -m experiments.worker` that run this job on one host."""
        flags = [f"--rundir={rundir}"]
        evaluate = ["fxformer.evaluate", *cluster_flags, f"--workdir={self.workdir}", *self.eval_flags]
        if not self.train:
            return [*flags, "--", *evaluate]
        if self.evaluate:
            flags.append(f"--then={shlex.join(evaluate)}")
        return [*flags, "--", "fxformer.train", *cluster_flags, *self.train_flags]


def job_from_args(args: argparse.Namespace, train_flags: list[str], need_flags: bool) -> Job:
    """The Job that the launcher's flags and the flags after `--` describe."""
    workdir = flag_value(train_flags, "workdir")
    if need_flags and not workdir:
        raise LaunchError("Give fxformer.train's flags after --, with --workdir: -- --config=C --workdir=W.")
    if any(f == "--distributed" or f.startswith(("--coordinator_address", "--process_id")) for f in train_flags):
        raise LaunchError("Leave --distributed and the cluster flags to the launcher; it adds them per backend.")
    name = args.name or (workdir.rstrip("/").rsplit("/", 1)[-1] if workdir else "") or args.default_name
    if not name:
        raise LaunchError("Give --name=<run name> (or the run's --workdir after --) to say which run.")
    if args.logdir:
        logdir = Path(args.logdir)
    elif workdir and not is_url(workdir):
        logdir = Path(os.path.expanduser(workdir)) / "logs"
    else:
        logdir = Path("logs") / name
    return Job(name, tuple(train_flags), args.evaluate, tuple(shlex.split(args.eval_flags)), logdir)


# ---------------------------------------------------------------------------------------------
# The local backend: N processes on this machine, a loopback coordinator


class Local:
    """N processes of the same run on this machine: the offline stand-in for a pod."""

    def __init__(self, args: argparse.Namespace):
        if args.processes < 1:
            raise LaunchError(f"--processes must be at least 1, not {args.processes}.")
        self.processes, self.grace_s, self.port = args.processes, args.grace_s, args.port
        self.group: group.Group | None = None  # the running launch, if any

    def rundir(self, job: Job, i: int) -> Path:
        return job.logdir / f"process_{i}"

    def argvs(self, job: Job, port: int) -> list[list[str]]:
        out = []
        for i in range(self.processes):
            cluster = []
            if self.processes > 1:
                cluster = [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={self.processes}",
                           f"--process_id={i}"]  # fmt: skip
            out.append(
                [sys.executable, "-m", "experiments.worker", *job.worker_flags(str(self.rundir(job, i)), cluster)]
            )
        return out

    def launch(self, job: Job, dry_run: bool) -> int:
        port = self.port or free_port()
        argvs = self.argvs(job, port)
        if dry_run:
            for argv in argvs:
                print(shlex.join(argv))
            return exitcodes.OK
        for i in range(self.processes):
            say(f"process {i}: log {self.rundir(job, i) / 'worker.log'}")
        self.group = group.Group(
            lambda: self.signal(job, signal.SIGTERM), lambda: self.signal(job, signal.SIGKILL), self.grace_s
        )
        # each worker writes its own log: take process 0's output to the console, drop the rest
        return self.group.run(argvs, [None] * self.processes)

    def signal(self, job: Job, sig: signal.Signals) -> None:
        """Send `sig` to the fxformer command each process's worker runs now (only those)."""
        for i in range(self.processes):
            worker.stop(self.rundir(job, i), sig)

    def setup(self, job: Job, dry_run: bool) -> int:
        say("the local backend runs in this checkout and environment: nothing to set up")
        return exitcodes.OK

    def logs(self, job: Job, dry_run: bool) -> int:
        for i in range(self.processes):
            path = self.rundir(job, i) / "worker.log"
            print(f"==> {path} <==")
            if path.exists():
                print("".join(path.read_text(errors="replace").splitlines(keepends=True)[-20:]), end="")
        return exitcodes.OK

    def stop(self, job: Job, dry_run: bool) -> int:
        for i in range(self.processes):
            stopped = worker.stop(self.rundir(job, i)) if not dry_run else False
            say(f"process {i}: {'SIGTERM sent' if stopped else 'not running'}")
        return exitcodes.OK

    def before_retry(self, job: Job) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# The command


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags of every launcher verb; each backend reads its own."""
    p.add_argument("--name", default="", help="run name (default: the last part of --workdir)")
    p.add_argument("--logdir", default="", help="local log directory (default: W/logs, or logs/<name> for a URL)")
    p.add_argument("--retries", type=int, default=0, help="relaunch a run stopped by a pre-emption up to K times")
    p.add_argument("--evaluate", action="store_true", help="run fxformer.evaluate --workdir=W after training")
    p.add_argument("--eval_flags", default="", help="more fxformer.evaluate flags, e.g. '--split=validation'")
    add_backend_flags(p)


def add_backend_flags(p: argparse.ArgumentParser) -> None:
    """Where runs go, and each backend's own flags (shared by launch and the sweep verbs)."""
    p.add_argument("--backend", choices=["local", "tpu", "slurm"], default="local", help="where to run (local)")
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true", help="print, run nothing")
    p.add_argument("--grace_s", type=float, default=120.0, help="seconds to let processes save before a kill")
    local = p.add_argument_group("local backend")
    local.add_argument("--processes", type=int, default=1, help="processes on this machine (loopback coordinator)")
    local.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
    tpu = p.add_argument_group("tpu backend (gcloud)")
    tpu.add_argument("--tpu", default="", help="TPU VM name")
    tpu.add_argument("--zone", default="", help="its zone, e.g. us-central2-b")
    tpu.add_argument("--project", default="", help="Google Cloud project (default: gcloud's)")
    tpu.add_argument("--workers", type=int, default=0, help="hosts in the slice (default: asked from gcloud)")
    tpu.add_argument("--accelerator_type", default="", help="e.g. v4-32: lets --retries re-create a pre-empted TPU")
    tpu.add_argument("--runtime_version", default="", help="TPU VM image for re-creation, e.g. tpu-ubuntu2204-base")
    tpu.add_argument("--commit", default="HEAD", help="the git commit whose code runs (sync)")
    slurm = p.add_argument_group("slurm backend (sbatch + srun)")
    slurm.add_argument("--nodes", type=int, default=1, help="nodes")
    slurm.add_argument("--gpus_per_node", type=int, default=8, help="GPUs per node: one process each")
    slurm.add_argument("--cpus_per_task", type=int, default=0, help="CPUs per process (default: SLURM's)")
    slurm.add_argument("--time", default="", help="time limit, e.g. 24:00:00")
    slurm.add_argument("--partition", default="", help="partition")
    slurm.add_argument("--account", default="", help="account")
    slurm.add_argument("--python", default=".venv/bin/python", help="the cluster's Python with fxformer's requirements")


def backend_for(args: argparse.Namespace):
    if args.backend == "tpu":
        from experiments.tpu import Tpu

        return Tpu(args)
    if args.backend == "slurm":
        from experiments.slurm import Slurm

        return Slurm(args)
    return Local(args)


def main(verb: str, argv: list[str]) -> int:
    ours, train_flags = worker.split_at_dashes(argv)
    p = argparse.ArgumentParser(
        prog=f"python -m experiments {verb}",
        description=f"{VERBS[verb]}.\n\n{__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Everything after -- is passed to fxformer.train.",
    )
    add_flags(p)
    args = p.parse_args(ours)
    args.default_name = "setup" if verb == "setup" else ""  # setting up machines concerns no run
    if args.retries < 0:
        raise LaunchError(f"--retries must be at least 0, not {args.retries}.")
    job = job_from_args(args, train_flags, need_flags=verb == "launch")
    backend = backend_for(args)
    if verb != "launch":
        return getattr(backend, verb)(job, args.dry_run)
    for attempt in range(args.retries + 1):
        status = backend.launch(job, args.dry_run)
        interrupted = backend.group is not None and backend.group.interrupted
        if status != exitcodes.STOPPED or attempt == args.retries or interrupted:
            break
        say(f"the run stopped before its last step (status 75); relaunching ({attempt + 1} of {args.retries})")
        backend.before_retry(job)
    if status == exitcodes.STOPPED and not args.dry_run:
        say("stopped before the last step, checkpoint saved: launch the same command again to resume")
    return status


def run_commands(argvs: list[list[str]], dry_run: bool, check: bool = True) -> int:
    """Run commands one after another (or print them); the first failure stops and is returned."""
    for argv in argvs:
        if dry_run:
            print(shlex.join(argv))
            continue
        group.which(argv[0])
        say(shlex.join(argv)[:300])
        status = subprocess.run(argv).returncode
        if status and check:
            raise LaunchError(f"'{shlex.join(argv)[:120]}...' failed with status {status}; see its output above.")
    return exitcodes.OK
