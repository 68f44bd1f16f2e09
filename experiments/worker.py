"""The launcher's hands on one host: run fxformer's commands there, and stop only what it started.

    python -m experiments.worker --rundir=DIR [--then='fxformer.evaluate --workdir=W' ...] -- fxformer.train <flags>
    python -m experiments.worker --rundir=DIR --stop

Runs `python -m <the module and flags after -->` (then each `--then` command in turn, while the
one before finished with status 0), each in its own session with its output appended to
DIR/worker.log, which this process follows on stdout. DIR/pid names the command running now:
`--stop` sends SIGTERM to that process alone (it saves and exits 75), never `pkill python`.
With `--hold_log` (the launcher's, when DIR lies in the run's workdir) nothing is written under
DIR until fxformer.train has accepted the run: its output is held here and its pid kept in the
temporary directory meanwhile, so a refused run leaves the workdir as it was (or absent).
SIGTERM or Ctrl-C to this process is forwarded the same way; a lost ssh connection (SIGHUP)
leaves the run going. The exit status is the last command's (see `fxformer.exitcodes`).
Both the local backend (several processes on this machine) and every TPU worker run this.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.cli import flag_value, split_at_dashes
from fxformer import exitcodes, paths


def held_pid(rundir: Path) -> Path:
    """Where the pid of a command whose log is held (`--hold_log`) is kept until its run is
    accepted: in the temporary directory, named after DIR, so that `stop` finds it meanwhile."""
    digest = hashlib.sha256(os.path.abspath(rundir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"fxformer-worker-{digest}.pid"


def running_pid(rundir: Path) -> int | None:
    """The pid recorded in DIR/pid (or, while its log is held, in `held_pid`) if that process is
    alive and is an fxformer command, else None."""
    for pid_file in (rundir / "pid", held_pid(rundir)):
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # no /proc (macOS), or no such process
            cmdline = subprocess.run(["ps", "-p", str(pid), "-o", "command="], capture_output=True).stdout
        if b"fxformer." in cmdline:  # a recycled pid belongs to someone else
            return pid
    return None


def stop(rundir: Path, sig: int = signal.SIGTERM) -> bool:
    """Signal the command this rundir's worker started, if it still runs; True if there was one."""
    pid = running_pid(rundir)
    if pid is None:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


class Accepted:
    """Whether fxformer.train has accepted its run in `workdir` since this was made: train writes
    W/run.json (`fxformer.paths.Workdir.run_info`, by `fxformer.train.describe`) once everything
    up to the first step has been checked, and a refusal comes before it."""

    def __init__(self, workdir: str):
        self.path = os.fspath(paths.Workdir(workdir).run_info)
        self.before = self._stamp()
        self.seen = False

    def _stamp(self) -> tuple[int, int] | None:
        try:
            found = os.stat(self.path)
        except OSError:
            return None
        return found.st_ino, found.st_mtime_ns  # written atomically: a new file each time

    def __call__(self) -> bool:
        if not self.seen:
            now = self._stamp()
            self.seen = now is not None and now != self.before
        return self.seen


def run(rundir: Path, command_lines: list[list[str]], echo=sys.stdout, hold_for: str = "") -> int:
    """Run the commands one after another while the previous one succeeded; their exit status.
    `hold_for`: the workdir of the first command, fxformer.train, whose output and pid are held
    until it accepts the run (`held`)."""
    if (pid := running_pid(rundir)) is not None:
        print(f"worker: {rundir} already runs pid {pid}; stop it first (python -m experiments stop)", file=sys.stderr)
        return exitcodes.USER_ERROR
    status = exitcodes.OK
    for i, line in enumerate(command_lines):
        status = held(rundir, line, echo, Accepted(hold_for)) if i == 0 and hold_for else logged(rundir, line, echo)
        if status != exitcodes.OK:
            break
    return status


def logged(rundir: Path, line: list[str], echo) -> int:
    """Run one command with its output appended to DIR/worker.log and its pid in DIR/pid."""
    rundir.mkdir(parents=True, exist_ok=True)
    log_path = rundir / "worker.log"
    with log_path.open("ab") as log:
        start = log.tell()  # this command's output begins here (the log keeps earlier attempts)
        log.write(f"$ {shlex.join(line)}\n".encode())
        log.flush()
        child = subprocess.Popen(line, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (rundir / "pid").write_text(f"{child.pid}\n")
    with log_path.open("rb") as log:
        log.seek(start)
        return _follow(child, log.read, echo)


def held(rundir: Path, line: list[str], echo, accepted: Accepted) -> int:
    """Run one command with its output through this process: held in memory, and its pid in
    `held_pid`, until `accepted()`; from then on both are where `logged` puts them. A run never
    accepted (refused, or stopped before training) writes nothing under DIR: its output went to
    `echo` alone."""
    kept = bytearray(f"$ {shlex.join(line)}\n".encode())
    child = subprocess.Popen(line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    pid_file = held_pid(rundir)
    pid_file.write_text(f"{child.pid}\n")
    log = None

    def keep(chunk: bytes) -> None:
        nonlocal log
        if log is None and accepted():
            rundir.mkdir(parents=True, exist_ok=True)
            log = (rundir / "worker.log").open("ab")
            (rundir / "pid").write_text(f"{child.pid}\n")
            pid_file.unlink(missing_ok=True)
            chunk = bytes(kept) + chunk
        if log is None:
            kept.extend(chunk)
        elif chunk:
            log.write(chunk)
            log.flush()

    try:
        return _follow(child, _reader(child.stdout), echo, keep)
    finally:
        pid_file.unlink(missing_ok=True)
        if log is not None:
            log.close()
        child.stdout.close()


def _reader(pipe):
    """What `pipe` holds now, without waiting (b"" when nothing)."""
    os.set_blocking(pipe.fileno(), False)

    def read() -> bytes:
        out = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(pipe.fileno(), 65536):
                out += chunk
        return out

    return read


def _follow(child: subprocess.Popen, read, echo, keep=lambda chunk: None) -> int:
    """Copy the child's new output (`read`) to `echo` (and to `keep`) until the child exits,
    forwarding SIGTERM/SIGINT to it."""
    forward = lambda signum, frame: child.send_signal(signal.SIGTERM)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            done = child.poll() is not None
            chunk = read()
            keep(chunk)
            if chunk and echo is not None:
                try:
                    echo.write(chunk.decode("utf-8", "replace"))
                    echo.flush()
                except (OSError, ValueError):  # nobody listens any more (ssh gone): keep running
                    echo = None
            if done:
                return child.returncode if child.returncode >= 0 else 128 - child.returncode
            time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, train_flags = split_at_dashes(argv)
    p = argparse.ArgumentParser(
        prog="python -m experiments.worker", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rundir", required=True, help="where this host keeps worker.log and pid")
    p.add_argument(
        "--then",
        action="append",
        default=[],
        help="an fxformer command (module and flags) to run after the first; repeat for more",
    )
    p.add_argument("--stop", action="store_true", help="SIGTERM the command this rundir's worker started")
    p.add_argument("--kill", action="store_true", help="with --stop: SIGKILL instead (a process that hangs)")
    p.add_argument(
        "--hold_log", action="store_true", help="write nothing under --rundir until fxformer.train has accepted the run"
    )
    args = p.parse_args(ours)
    rundir = Path(os.path.expanduser(args.rundir))
    if args.stop:
        sig = signal.SIGKILL if args.kill else signal.SIGTERM
        print(f"worker: {'stopping' if stop(rundir, sig) else 'nothing running in'} {rundir}")
        return exitcodes.OK
    if not train_flags or not train_flags[0].startswith("fxformer."):
        p.error("give the fxformer command after --, e.g. -- fxformer.train --config=C --workdir=W")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a lost ssh connection leaves the run going
    commands = [train_flags, *(shlex.split(then) for then in args.then)]
    workdir = flag_value(train_flags, "workdir") or ""
    hold_for = workdir if args.hold_log and train_flags[0] == "fxformer.train" and not paths.is_url(workdir) else ""
    return run(rundir, [[sys.executable, "-m", *command] for command in commands], hold_for=hold_for)


if __name__ == "__main__":
    sys.exit(main())
