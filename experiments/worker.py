"""The launcher's hands on one host: run fxformer's commands there, and stop only what it started.

    python -m experiments.worker --rundir=DIR [--then='fxformer.evaluate --workdir=W' ...] -- fxformer.train <flags>
    python -m experiments.worker --rundir=DIR --stop

Runs `python -m <the module and flags after -->` (then each `--then` command in turn, while the
one before finished with status 0), each in its own session with its output appended to
DIR/worker.log, which this process follows on stdout. DIR/pid names the command running now:
`--stop` sends SIGTERM to that process alone (it saves and exits 75), never `pkill python`.
SIGTERM or Ctrl-C to this process is forwarded the same way; a lost ssh connection (SIGHUP)
leaves the run going. The exit status is the last command's (see `fxformer.exitcodes`).
Both the local backend (several processes on this machine) and every TPU worker run this.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from experiments.cli import split_at_dashes
from fxformer import exitcodes


def running_pid(rundir: Path) -> int | None:
    """The pid recorded in DIR/pid if that process is alive and is an fxformer command, else None."""
    try:
        pid = int((rundir / "pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # no /proc (macOS), or no such process
        cmdline = subprocess.run(["ps", "-p", str(pid), "-o", "command="], capture_output=True).stdout
    return pid if b"fxformer." in cmdline else None  # a recycled pid belongs to someone else


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


def run(rundir: Path, command_lines: list[list[str]], echo=sys.stdout) -> int:
    """Run the commands one after another while the previous one succeeded; their exit status."""
    rundir.mkdir(parents=True, exist_ok=True)
    if (pid := running_pid(rundir)) is not None:
        print(f"worker: {rundir} already runs pid {pid}; stop it first (python -m experiments stop)", file=sys.stderr)
        return exitcodes.USER_ERROR
    log_path = rundir / "worker.log"
    status = exitcodes.OK
    for line in command_lines:
        with log_path.open("ab") as log:
            start = log.tell()  # this command's output begins here (the log keeps earlier attempts)
            log.write(f"$ {shlex.join(line)}\n".encode())
            log.flush()
            child = subprocess.Popen(line, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        (rundir / "pid").write_text(f"{child.pid}\n")
        status = _follow(child, log_path, start, echo)
        if status != exitcodes.OK:
            break
    return status


def _follow(child: subprocess.Popen, log_path: Path, start: int, echo) -> int:
    """Copy the log's new lines to `echo` until the child exits, forwarding SIGTERM/SIGINT to it."""
    forward = lambda signum, frame: child.send_signal(signal.SIGTERM)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with log_path.open("rb") as log:
            log.seek(start)
            while True:
                done = child.poll() is not None
                chunk = log.read()
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
    p = argparse.ArgumentParser(prog="python -m experiments.worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rundir", required=True, help="where this host keeps worker.log and pid")
    p.add_argument("--then", action="append", default=[],
                   help="an fxformer command (module and flags) to run after the first; repeat for more")  # fmt: skip
    p.add_argument("--stop", action="store_true", help="SIGTERM the command this rundir's worker started")
    p.add_argument("--kill", action="store_true", help="with --stop: SIGKILL instead (a process that hangs)")
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
    return run(rundir, [[sys.executable, "-m", *command] for command in commands])


if __name__ == "__main__":
    sys.exit(main())
