"""Run a group of processes as one: output to per-process logs, all stopped when one fails.

Used by the local backend (N worker processes on loopback) and the TPU backend (one ssh per
worker). Imports no JAX.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from experiments.cli import say
from fxformer import exitcodes


def combined_status(codes: list[int]) -> int:
    """0 if every process finished; the first failure if any; else 75 (stopped, resumable)."""
    failures = [c for c in codes if c not in (exitcodes.OK, exitcodes.STOPPED)]
    if failures:
        return failures[0]
    return exitcodes.STOPPED if exitcodes.STOPPED in codes else exitcodes.OK


def _pump(stream, log_path: Path | None, echo: bool) -> None:
    """Copy a child's output to its log file (and to our stdout for the first process)."""
    with open(log_path, "ab") if log_path else open("/dev/null", "wb") as log:
        for chunk in iter(lambda: stream.read1(65536), b""):
            log.write(chunk)
            log.flush()
            if echo:
                sys.stdout.write(chunk.decode("utf-8", "replace"))
                sys.stdout.flush()


class Group:
    """Processes started together, one launch at a time; a backend keeps one for its life, so that
    a stop asked before a launch has its processes (`interrupt` from another thread while the row
    is claimed) is kept: that launch, and any later one, starts none."""

    def __init__(self, grace_s: float = 60.0):
        self.grace_s = grace_s
        self.stop_all: Callable[[], None] = lambda: None
        self.kill_all: Callable[[], None] = lambda: None
        self.interrupted = False

    def run(
        self,
        argvs: list[list[str]],
        logs: list[Path | None],
        stop_all: Callable[[], None],
        kill_all: Callable[[], None],
        echo_first: bool = True,
        handle_signals: bool = True,
    ) -> int:
        """Start every argv, wait; on a failure or a signal to us, stop the rest (`stop_all` asks
        every process to save and stop, `kill_all` kills them after the grace period). The combined
        status; 75 with nothing started after an `interrupt`. Without `handle_signals` (a group
        run from a thread), the caller forwards signals by `interrupt`."""
        self.stop_all, self.kill_all = stop_all, kill_all
        if self.interrupted:  # nothing started, nothing to save
            return exitcodes.STOPPED
        for log in logs:
            if log:
                log.parent.mkdir(parents=True, exist_ok=True)
        procs, pumps = [], []
        for i, (argv, log) in enumerate(zip(argvs, logs)):
            # own session: a Ctrl-C in the terminal reaches only us, and we stop the group in order
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            pumps.append(threading.Thread(target=_pump, args=(p.stdout, log, echo_first and i == 0), daemon=True))
            pumps[-1].start()
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        previous = {s: signal.signal(s, self._on_signal) for s in signals}
        try:
            stopping_since = None
            while any(p.poll() is None for p in procs):
                codes = [p.poll() for p in procs]
                ended = [c for c in codes if c is not None]
                if stopping_since is None and (self.interrupted or any(c != exitcodes.OK for c in ended)):
                    failed = [i for i, c in enumerate(codes) if c not in (None, exitcodes.OK, exitcodes.STOPPED)]
                    if failed:
                        say(f"process {failed[0]} exited with status {codes[failed[0]]}; stopping the others")
                        self.stop_all()
                    elif self.interrupted:
                        self.stop_all()
                    stopping_since = time.time()  # after a stop (75) the others stop at the same step
                if stopping_since is not None and time.time() - stopping_since > self.grace_s:
                    say(f"processes still running {self.grace_s:.0f}s after the stop; killing them")
                    self.kill_all()
                    for p in procs:
                        if p.poll() is None:
                            p.kill()
                    break
                time.sleep(0.2)
            codes = [p.wait() for p in procs]
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        for t in pumps:
            t.join(timeout=5)
        return combined_status([c if c >= 0 else 128 - c for c in codes])

    def interrupt(self) -> None:
        """Ask every process to save and stop, as a SIGTERM to us would."""
        self.interrupted = True

    def _on_signal(self, signum, frame) -> None:
        if self.interrupted and signum == signal.SIGINT:  # a second Ctrl-C: no more waiting
            self.kill_all()
            raise KeyboardInterrupt
        say(f"{signal.Signals(signum).name}: asking every process to save and stop (Ctrl-C again kills)")
        self.interrupted = True
