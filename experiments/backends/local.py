"""The local backend: N processes of one run on this machine with a loopback coordinator, the
offline stand-in for a pod (each process is `python -m experiments.worker`)."""

from __future__ import annotations

import argparse
import random
import shlex
import signal
import socket
import sys
from pathlib import Path

from experiments import group, worker
from experiments.backends.base import Launched
from experiments.cli import say
from experiments.job import Job
from fxformer import exitcodes
from fxformer.errors import UserError


class Local:
    """N processes of the same run on this machine."""

    def __init__(self, args: argparse.Namespace, echo: bool = True, handle_signals: bool = True):
        if args.processes < 1:
            raise UserError(f"--processes must be at least 1, not {args.processes}.")
        self.processes, self.grace_s, self.port = args.processes, args.grace_s, args.port
        self.echo, self.handle_signals = echo, handle_signals  # off for rows run side by side in threads
        self.group = group.Group(self.grace_s)

    def rundir(self, job: Job, i: int) -> Path:
        return job.logdir / f"process_{i}"

    def argvs(self, job: Job, port: int) -> list[list[str]]:
        out = []
        for i in range(self.processes):
            cluster = []
            if self.processes > 1:
                cluster = [
                    f"--coordinator_address=127.0.0.1:{port}",
                    f"--num_processes={self.processes}",
                    f"--process_id={i}",
                ]
            out.append(
                [sys.executable, "-m", "experiments.worker", *job.worker_flags(str(self.rundir(job, i)), cluster)]
            )
        return out

    def launch(self, job: Job, dry_run: bool) -> Launched:
        port = self.port or free_port()
        argvs = self.argvs(job, port)
        if dry_run:
            for argv in argvs:
                print(shlex.join(argv))
            return Launched.of(exitcodes.OK)
        once = " (once training begins: a refused run writes nothing there)" if job.hold_log else ""
        for i in range(self.processes):
            say(f"process {i}: log {self.rundir(job, i) / 'worker.log'}{once}")
        # each worker writes its own log: take process 0's output to the console, drop the rest
        stop, kill = (lambda: self.signal(job, signal.SIGTERM)), (lambda: self.signal(job, signal.SIGKILL))
        status = self.group.run(argvs, [None] * self.processes, stop, kill, self.echo, self.handle_signals)
        return Launched.of(status, self.group.interrupted)

    def interrupt(self) -> None:
        self.group.interrupt()

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

    def left_running(self, job: Job) -> int | None:
        """A worker of an earlier launch still running though its launcher is gone (a closed terminal
        ends the sweep; its workers ignore SIGHUP): launched again, the job's worker would refuse to
        start beside it. Each process's run dir is looked at, written or not yet (its pid is held in /tmp)."""
        rundirs = (self.rundir(job, i) for i in range(self.processes))
        return next((pid for d in rundirs if (pid := worker.running_pid(d)) is not None), None)

    def before_retry(self, job: Job) -> None:
        pass


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(tries: int = 100, rng: random.Random | None = None) -> int:
    """A port for the coordinator, free now and outside the kernel's ephemeral range: a port that
    bind(0) handed out (the usual way) is closed before the coordinator binds it, and in between
    any process's outgoing connection or bind(0) can take it; a port outside that range only
    another explicit bind can take. (A hardening: the two-process launches that failed now and
    then beside busy tests failed in `paths.check_writable`, not here.)"""
    low, high = 32768, 60999  # Linux's default range, where the kernel does not say
    if EPHEMERAL.exists():
        low, high = (int(n) for n in EPHEMERAL.read_text().split())
    spans = [span for span in ((10000, low - 1), (high + 1, 65535)) if span[1] - span[0] >= 1000]
    rng = rng or random.Random()
    if not spans:  # a kernel whose ephemeral range leaves no room: the usual way
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(tries):
        port = rng.randint(*rng.choice(spans))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise UserError(f"no free port for the coordinator in {tries} tries; give one with --port.")
