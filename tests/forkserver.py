"""The test suite's commands started without their imports: a fork server.

The suite starts some 300 `python -m fxformer.<command>` processes; each spent 1.5 to 2 s of CPU
importing JAX, Flax, orbax, grain and fxformer before its first line of work: most of a
refusal's time, and a third of a short training run's. Here one process per test worker (the
server) imports them once, without starting any JAX backend, and forks a child for each
command: the child takes the command's standard streams, working directory, environment and
arguments, and runs the module as `python -m` runs it (`runpy`, as `__main__`, the module itself
not yet imported).

What the test holds is a real process of its own (the client, tests/forkclient.py, a
standard-library Python started with -S -E) whose exit status, signals and standard streams are
the child's: the client passes its file descriptors 0-2 to the server (SCM_RIGHTS), forwards
every signal a test sends (SIGTERM, SIGINT, SIGABRT, ...) to the child, and exits as the child
ended (its status, or killed by its signal). A client killed with SIGKILL takes its child with
it (the child holds the client's connection and kills itself when it closes). SIGSTOP cannot be
forwarded (it pauses the client alone): a test that pauses its command starts it with
`executable=` (a fresh process), as does one that counts the command's own child processes.

A command is forked only when nothing imported before the fork could differ from a fresh
process: `sys.executable -m fxformer.<module>`, `-m experiments[.<module>]`, `-m
benchmarks.<module>` or `sys.executable <script>.py` (never `-c`: the tests' probes of what a fresh
process imports run so); no `preexec_fn`, `pass_fds` or `executable`; an environment whose
variables that an import may read (`AT_IMPORT`: Python's, JAX's, XLA's, NumPy's BLAS, ...) equal
the server's, but for XLA_FLAGS (read when the backend starts) and JAX_PLATFORMS (which the child
sets in JAX's config as JAX's import would have); and a path that finds what the server imported
where the server found it: the command's first folder (its working directory, or a script's own)
is the checkout, or PYTHONPATH names the checkout (where the server has none) and that folder
holds nothing named like a module the server imported from elsewhere (test_docs_run's reader's
folder: `configs` links to the checkout's). Anything else starts a fresh Python as before. A
forked command routes the commands it starts itself the same way (a sweep's launcher, its
workers, their training runs; the GPU queue's items), and a shell line's commands can be routed
too (`Routing.in_shell`). Each child reseeds `random` and NumPy's global generator, as a fresh
process is seeded.
`FXFORMER_TEST_FORKSERVER=0` starts every command as a fresh process.
"""

from __future__ import annotations

import gc
import json
import os
import re
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
from importlib.machinery import all_suffixes
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLIENT = Path(__file__).resolve().parent / "forkclient.py"
# Variables the imported libraries (Python, JAX and XLA, TensorFlow's and TFDS's, NumPy's BLAS,
# matplotlib, absl, grain, orbax) may read when imported: where one differs from the server's, the
# command starts a fresh Python. Others (a test's own, pytest's) are set in the child before it runs.
AT_IMPORT = ("PYTHON", "JAX_", "XLA_", "TF_", "TFDS_", "NPY_", "OMP_", "OPENBLAS_", "MKL_", "MPL", "ABSL", "GRAIN_")
AT_IMPORT += ("ORBAX_", "LD_", "CUDA", "TPU_", "HOME", "XDG_", "TMPDIR", "PATH", "LANG", "LC_")
LATE_ENVIRONMENT = ("XLA_FLAGS", "JAX_PLATFORMS")  # read when the backend starts; the child sets the second
PRELOAD = (  # the commands the tests start, and what they import (their modules are dropped before each run)
    "fxformer.train",
    "fxformer.evaluate",
    "fxformer.translate",
    "fxformer.attention_maps",
    "fxformer.importing",
    "fxformer.export",
    "fxformer.plot",
    "fxformer.params",
    "fxformer.compare",
    "fxformer.data.__main__",
)


# ---------------------------------------------------------------------------------------------
# The server (run as a script: python tests/forkserver.py SOCKET)


def serve(path: str) -> None:
    global SERVER
    env = dict(os.environ)  # before the imports, which may set variables
    sys.path[0] = str(REPO)
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from fxformer import metrics

    metrics.import_tensorboardx()
    SERVER = Routing(path, env, imported())  # what a child routes its own commands by
    # What the imports made lives as long as a fresh process's would: out of the collector's sight
    # (gc.freeze), so that no child spends its collections walking it, copying the pages it touches.
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    parent = os.getppid()
    print("ready", json.dumps(SERVER.modules), flush=True)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:  # the test worker's end is the server's
        if select.select([listener], [], [], 0.02)[0]:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                run_child(json.loads(message), fds, conn)  # never returns
            for fd in fds:
                os.close(fd)
            conn.sendall(struct.pack("q", pid))
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            try:
                conn.sendall(struct.pack("q", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass  # the client is gone
            conn.close()


def run_child(request: dict, fds: list[int], conn: socket.socket) -> None:
    """In the forked child: become the command, then exit as it ends (never returns)."""
    import random
    import runpy
    import types

    import numpy as np

    for target, fd in zip(request["present"], fds):
        os.dup2(fd, target)
        os.close(fd)
    for target in {0, 1, 2} - set(request["present"]):
        os.close(target)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()
    np.random.seed()
    if "JAX_PLATFORMS" in os.environ:  # read when JAX is imported: set as that read would have
        import jax

        jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])

    def lifeline():  # the client's connection closes when it ends: killed, this child goes too
        try:
            conn.recv(1)
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=lifeline, daemon=True).start()
    SERVER.route()  # the command's own commands (a sweep's workers, their runs) are forked too
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    argv = request["argv"]  # ["-m", module, *args] or [script, *args]
    sys.path[0:1] = [str(SERVER.first(argv, os.getcwd())), *SERVER.added_path(os.environ)]
    if argv[0] == "-m":
        for name in (argv[1], f"{argv[1]}.__main__"):  # a package runs its __main__
            sys.modules.pop(name, None)
        sys.argv = ["-m", *argv[2:]]
        runpy._run_module_as_main(argv[1])  # as `python -m` runs it
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")  # as `python script.py` runs it
    raise SystemExit(0)


# ---------------------------------------------------------------------------------------------
# In the test worker


class Routing:
    """`subprocess.Popen` of the commands the server at `path` runs, sent there: `env` is the
    server's environment, which a command's import-time variables must equal; `modules` what it
    imported (top-level name -> its file; None for a namespace package or a built-in one)."""

    def __init__(self, path: str, env: dict, modules: dict[str, str | None]):
        self.path, self.env, self.modules = path, env, modules
        self.original = None  # Popen's own __init__ while `route` sends commands to the server

    def refuses(self, args, kwargs) -> str | None:
        """Why the command `args` (Popen's arguments) cannot be forked from the server, or None."""
        given = [k for k in ("preexec_fn", "pass_fds", "executable", "shell") if kwargs.get(k)]
        if given or not forkable(args):
            return f"{given or args[:3]}: not a plain `python -m fxformer.<module>`, `experiments` or a script"
        env = kwargs.get("env")
        env = os.environ if env is None else env
        added = self.added_path(env)
        allowed = (*LATE_ENVIRONMENT, "PYTHONPATH") if added else LATE_ENVIRONMENT  # PYTHONPATH: the checkout
        differ = {k for k in {*env, *self.env} if env.get(k) != self.env.get(k)}
        differ = sorted(k for k in differ if k.startswith(AT_IMPORT) and k not in allowed)
        if differ:
            return f"its environment differs from the server's in {', '.join(differ)}"
        first = self.first(args[1:], kwargs.get("cwd") or os.getcwd())
        if first == REPO:
            return None
        if not added:
            return f"its path begins at {first}, not {REPO}, and its PYTHONPATH does not name {REPO}"
        shadowed = self.shadowed(first)
        return f"{first} holds {', '.join(shadowed)}, which the server imported from elsewhere" if shadowed else None

    def runs(self, args, kwargs) -> bool:
        return self.refuses(args, kwargs) is None

    def added_path(self, env) -> list[str]:
        """What `env`'s PYTHONPATH puts on a command's path that the server's lacks: the checkout,
        where the server has no PYTHONPATH and `env`'s names the checkout alone; else nothing."""
        path = env.get("PYTHONPATH")
        return [str(REPO)] if path and "PYTHONPATH" not in self.env and Path(path).resolve() == REPO else []

    @staticmethod
    def first(argv, cwd) -> Path:
        """The folder a fresh Python running `argv` (["-m", module, ...] or [script, ...]) in `cwd`
        puts first on its path: `cwd` for a module, the script's own (links resolved) for a script."""
        return Path(cwd).resolve() if argv[0] == "-m" else Path(cwd, argv[0]).resolve().parent

    def shadowed(self, folder: Path) -> list[str]:
        """The entries of `folder` that a fresh Python whose path begins there would import in place
        of a module the server imported from elsewhere."""
        found = []
        for entry in folder.iterdir():
            name = entry.name.split(".")[0]
            if name not in self.modules:
                continue
            origin = self.modules[name]
            if origin is not None and Path(origin).resolve().is_relative_to(entry.resolve()):
                continue  # the same files (a link to them)
            if entry.is_dir() and (origin is None or (entry / "__init__.py").exists()):
                found.append(entry.name)  # a package, or a portion of a namespace package
            elif entry.is_file() and any(entry.name == name + suffix for suffix in all_suffixes()):
                found.append(entry.name)  # a module
        return sorted(found)

    def client_args(self, args) -> list[str]:
        return [sys.executable, "-S", "-E", str(CLIENT), self.path, *map(str, args[1:])]

    def in_shell(self, command: str, cwd, env) -> str:
        """`command`, a line for a shell run in `cwd` with `env`, with each `<python> -m <module>`
        and `<python> <script>.py` (<python> this one, `sys.executable`) that the server runs
        there sent to it instead."""

        def routed(match: re.Match) -> str:
            args = [sys.executable, *match[1].split()]
            return shlex.join(self.client_args(args)) if self.runs(args, {"cwd": cwd, "env": env}) else match[0]

        return re.sub(rf"{re.escape(sys.executable)} (-m [\w.]+|\S+\.py)(?=\s|$)", routed, command)

    def route(self) -> None:
        """Send this process's `subprocess.Popen` of commands the server runs (`refuses` None) there."""
        original = self.original = subprocess.Popen.__init__

        def init(popen, args, *rest, **kwargs):
            if not rest and self.runs(args, kwargs):
                args = self.client_args(args)
            original(popen, args, *rest, **kwargs)

        subprocess.Popen.__init__ = init

    def undo(self) -> None:
        if self.original is not None:
            subprocess.Popen.__init__ = self.original
            self.original = None


class Server(Routing):
    """This worker's server, in the worker's environment, and the routing of the worker's commands to it."""

    def __init__(self, folder: Path):
        path, env = str(folder / "forkserver.sock"), dict(os.environ)
        server = [sys.executable, __file__, path]
        self.process = subprocess.Popen(
            server, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
        )
        word, _, modules = self.process.stdout.readline().partition(" ")
        if word != "ready":
            raise RuntimeError(f"the fork server did not start (exit {self.process.wait()})")
        super().__init__(path, env, json.loads(modules))

    def close(self) -> None:
        """The routing undone and the server ended."""
        self.undo()
        self.process.kill()
        self.process.wait()


def forkable(args) -> bool:
    """Whether `args` is a command the server runs: `python -m fxformer.<module>`, `experiments[.<module>]`
    or `benchmarks.<module>`, or `python <script>.py` (never `python -c`: the tests' probes of what a
    fresh process imports are run so)."""
    if not isinstance(args, (list, tuple)) or len(args) < 2 or args[0] != sys.executable:
        return False
    if args[1] != "-m":
        return str(args[1]).endswith(".py")
    module = str(args[2]) if len(args) > 2 else ""
    return module == "experiments" or module.startswith(("fxformer.", "experiments.", "benchmarks."))


def imported() -> dict[str, str | None]:
    """This process's top-level modules: name -> its file (None: a namespace or built-in module)."""
    return {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items()) if "." not in name}


def install(folder: Path) -> Server | None:
    """Route the worker's `subprocess.Popen` of forkable commands through a server (its socket in
    `folder`), started now, in the environment the tests begin with: the server (`close()` ends
    it and the routing). `FXFORMER_TEST_FORKSERVER=0`: nothing routed, None."""
    if os.environ.get("FXFORMER_TEST_FORKSERVER", "1") == "0":
        return None
    server = Server(folder)
    server.route()
    return server


if __name__ == "__main__":
    serve(sys.argv[1])
