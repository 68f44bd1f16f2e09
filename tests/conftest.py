"""Shared fixtures: a small embedded corpus built with the real TFDS builder, and its tokenizer."""

import contextlib
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # fake CPU devices
# A command that hangs is killed with SIGABRT by `ended`: faulthandler then prints every thread's stack.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")
# No display: figures are files (fxformer/png.py). The docs' commands run so (test_docs_run.py), and
# matplotlib reads it when imported, so the fork server (tests/forkserver.py) must have it too.
os.environ.setdefault("MPLBACKEND", "Agg")
# A compilation cache (fxformer/compilecache.py) for the tests and every command they start, which
# inherit these variables: the same tiny model is compiled by dozens of processes (identical
# programs, identical results), and by the next run of the suite. Every program is kept, however
# fast it compiled: reading a tiny entry back (about 30 ms) can cost more than its compile (the
# suite's 1,362 hits read back 28 s of compiles in 40 s), but the sweeps' processes compile the
# same small programs again without it: test_sweep.py + test_evaluate.py took 6% more CPU with a
# threshold of 0.1 s (and the locations below) than with neither, where the locations alone took
# 4% less (three pairs each, side by side). No size limit: with one, every write lists the whole
# folder, and the suite writes thousands of entries (about 45 MB); the suite empties the folder
# itself past `TESTS_CACHE_MOST`. Its own folder (`~/.cache/fxformer/jax-tests`), never the
# commands' (or $FXFORMER_COMPILATION_CACHE): a command's size limit cannot evict entries written
# without one (JAX warns and writes nothing), and the suite's emptying must not touch a user's cache.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# No Python stack in the programs' source locations: lowering writes each operation's frames into
# the module (10 by default), which no test reads (test_decode.py + test_model.py: 7% less CPU).
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")
from fxformer import compilecache  # noqa: E402  (imports no JAX)

if os.environ.get(compilecache.ENV) != compilecache.OFF:
    os.environ[compilecache.ENV] = compilecache.user_folder("jax-tests")
TESTS_CACHE_MOST = 1 << 30
_folder = compilecache.default_folder()
if "PYTEST_XDIST_WORKER" not in os.environ and _folder != compilecache.OFF:  # pytest itself, once
    if os.path.isdir(_folder) and compilecache.size(_folder)[1] > TESTS_CACHE_MOST:
        shutil.rmtree(_folder, ignore_errors=True)
compilecache.enable()  # before JAX is imported: as environment variables, which the commands inherit

import fsspec  # noqa: E402
import jax  # noqa: E402

# Float32 tests compare against NumPy at float32 tolerances: on a GPU, JAX's default matmul
# precision is TF32 (about 1e-3 relative), which those comparisons would measure instead of the
# code. Full float32 here; a CPU computes in full float32 either way. Bfloat16 tests are unaffected.
jax.config.update("jax_default_matmul_precision", "highest")
# The tests' tiny programs compile with LLVM's optimisations off and XLA's older elemental
# emitters instead of its fusion emitters (compiling is most of their time, running milliseconds;
# the elemental emitters alone halve test_model's and test_decode's CPU time), and into one LLVM
# module rather than parts for parallel code generation (a train step of the 1-layer test model
# compiles in 0.19 s against 0.22, of a 3-layer d_model 128 one in 0.55 against 0.61). The commands the
# tests start as subprocesses compile so too (`env_with_devices`; a fifth less CPU for the
# files of commands), except one end to end (`as_users=True`: test_multi30k's prepare, train and
# evaluate), which compiles as users' runs do.
# An XLA that does not know a flag ends the process at once with status 1, its message lost in
# pytest's capture (a newer XLA that removed the elemental emitters would): the flags are tried once
# in a child process first (by pytest itself; its workers inherit the answer).
FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
)


def xla_knows(flags: str) -> bool:
    """Whether this jaxlib starts its backends with `flags` in XLA_FLAGS (a child process tries)."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}"}
    child = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True)
    return child.returncode == 0


if "FXFORMER_TEST_FAST_COMPILE" not in os.environ:
    os.environ["FXFORMER_TEST_FAST_COMPILE"] = "1" if xla_knows(FAST_COMPILE) else "0"
FAST_FLAGS = f" {FAST_COMPILE}" if os.environ["FXFORMER_TEST_FAST_COMPILE"] == "1" else ""
if FAST_FLAGS not in os.environ["XLA_FLAGS"]:  # read once, here, by the backend; xdist workers inherit it
    os.environ["XLA_FLAGS"] += FAST_FLAGS
jax.devices()
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from etils import epath  # noqa: E402
from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

from fxformer import configfile  # noqa: E402
from fxformer.data import corpora, token_ids  # noqa: E402
from fxformer.data.tokenizer import tokenizer_for  # noqa: E402

# Tests that run fxformer's commands end to end (subprocesses), or compile the model many times,
# carry `@pytest.mark.slow`: `python -m pytest -m "not slow"` runs the rest in under a minute
# (49 s on 2 CPU cores, 2026-11-24).


# The small embedded corpus every test shares (built once per session): data fields.
SMALL_DATA = {
    "num_train": 3000,
    "num_validation": 52,  # with eval_batch_size 40: two batches, the last part-filled (52 = 6 x 8 + 4)
    "num_test": 52,
    "vocab_size": 400,
    "tokenizer_sentences": 6000,
    "max_length": 32,
    "tokens_per_batch": 256,
}


def small_config(data_dir, **data_overrides):
    """configs/default.py on the small corpus, reading and writing TFDS data under `data_dir`."""
    config = configfile.load_config("configs/default.py")
    for key, value in {**SMALL_DATA, "tfds_data_dir": str(data_dir), **data_overrides}.items():
        config.data[key] = value
    return config


class FakeBucket(MemoryFileSystem):
    """gs://bucket/key -> an in-memory store keyed 'bucket/key': a local stand-in for a bucket."""

    protocol = ("gs", "gcs")
    store: dict = {}
    pseudo_dirs = [""]
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path):
        path = fsspec.utils.stringify_path(path)
        for prefix in ("gs://", "gcs://"):
            path = path.removeprefix(prefix)
        return path.rstrip("/")


def pytest_collection_finish(session):
    """What the imports and the collection made lives to the end: out of the collector's sight
    (gc.freeze), so that the collections of the tests' own garbage do not walk it each time."""
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def fork_server():
    """The commands the tests start, forked from a process that has imported their libraries
    (tests/forkserver.py): the same code and process boundaries, without 1.5-2 s of imports each.
    The server, or None where FXFORMER_TEST_FORKSERVER=0."""
    import tempfile

    import forkserver

    folder = Path(tempfile.mkdtemp(prefix="fxfs-"))  # short: a socket's path holds at most 107 bytes
    server = forkserver.install(folder)
    yield server
    if server is not None:
        server.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fake_bucket():
    """A fresh, empty fake bucket behind gs:// (through fsspec, etils.epath's backend)."""
    FakeBucket.store, FakeBucket.pseudo_dirs = {}, [""]
    for scheme in ("gs", "gcs"):
        fsspec.register_implementation(scheme, FakeBucket, clobber=True)
    epath.backend.fsspec_backend._get_filesystem.cache_clear()
    return FakeBucket


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tfds")


@pytest.fixture(scope="session")
def corpus(data_dir):
    """(config, builder, tokenizer) for a 3000-pair embedded corpus."""
    config = small_config(data_dir)
    builder = corpora.prepare(config.data)
    return config, builder, tokenizer_for(config.data, builder)


@pytest.fixture(scope="session")
def corpus_ids(corpus):
    """The folder of the small corpus's stored token ids (train, validation, test)."""
    config, builder, tokenizer = corpus
    return token_ids(config.data, builder, tokenizer, log=lambda *a: None)


# A tiny model on the small corpus, as command-line overrides of configs/default.py.
TINY = {
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.d_ff": 64,
    "model.num_heads": 2,
    "model.d_k": 16,
    "model.d_v": 16,
    "model.max_len": 96,
    **{f"data.{key}": value for key, value in SMALL_DATA.items()},
    "data.tokens_per_batch": 512,
    "data.eval_batch_size": 40,
    "warmup_steps": 20,
    # a barely trained model searches to its length limit: source + 10 tokens (the default 50 would
    # double every test's decoding, and no test of the commands needs the longer limit)
    "decode.max_extra": 10,
    "log_every_steps": 1,
    "eval_every_steps": 1000,
    "checkpoint_every_steps": 1000,
    "checkpoint_every_minutes": 1000.0,
}


def train_command(workdir, data_dir, **overrides):
    flags = {**TINY, "data.tfds_data_dir": str(data_dir), **overrides}
    return [
        sys.executable,
        "-m",
        "fxformer.train",
        "--config=configs/default.py",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in flags.items()),
    ]


def env_with_devices(n, as_users: bool = False):
    """The environment of a command on `n` fake CPU devices, compiling as the tests do (FAST_COMPILE,
    where this XLA knows it) or, `as_users`, as users' runs do."""
    flags = f"--xla_force_host_platform_device_count={n}" + ("" if as_users else FAST_FLAGS)
    return {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}


def run_module(module: str, *flags, devices: int = 1, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`python -m <module> <flags>` on `devices` fake CPU devices (`stdin` its input), run to its end."""
    return subprocess.run(
        [sys.executable, "-m", module, *flags],
        env=env_with_devices(devices),
        capture_output=True,
        text=True,
        input=stdin,
    )


def cluster_flags(port: int, i: int) -> list[str]:
    """The flags that make an fxformer command process `i` of 2 on a loopback coordinator at `port`."""
    return [f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"]


def on_two_processes(argv, timeout_s: float = 300, stdin: str | None = None) -> list[tuple[int, str, str]]:
    """`argv(port, i)` run as processes 0 and 1 of a cluster whose coordinator listens on a free
    loopback port, each with 2 CPU devices (and `stdin` on its standard input): each one's
    (exit status, stdout, stderr)."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    processes = [
        subprocess.Popen(
            argv(port, i),
            env=env_with_devices(2),
            stdin=None if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    ended = []
    for p in processes:
        out, err = p.communicate(input=stdin, timeout=timeout_s)
        ended.append((p.returncode, out, err))
    return ended


# What gloo (JAX's CPU collectives) writes from its own threads as a cluster connects, digits as N.
# Other writes cut it into fragments ("3 peer ranks. Expected number of connected peer ranks is : 3").
GLOO_LINE = "[Gloo] Rank N is connected to N peer ranks. Expected number of connected peer ranks is : N"


def own_lines(output: str) -> list[str]:
    """A command's non-blank output lines, less a library's: any that is gloo's connection line,
    whole or a fragment of it. fxformer's commands keep these off their standard output; a test
    of a multi-process command reads its output through this all the same."""
    lines = [line for line in output.splitlines() if line.strip()]
    return [line for line in lines if not is_gloo(line)]


def is_gloo(line: str) -> bool:
    """Whether `line` is gloo's connection line or a piece of it (of a few characters at least)."""
    text = re.sub(r"\d+", "N", line.strip())
    return len(text) >= 5 and text in GLOO_LINE


def ended(process: subprocess.Popen, timeout_s: float = 120) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a started command, its pipes read while it ends: reading
    only after `wait` blocks a command whose pipe is full. Past `timeout_s` the test fails with
    the command's stacks (SIGABRT: faulthandler is on in the commands the tests start)."""
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            out, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        pytest.fail(f"{' '.join(map(str, process.args[:3]))} did not end in {timeout_s:.0f} s; its stacks:\n{err}")
    return process.returncode, out, err


def wait_while_running(process: subprocess.Popen, done, deadline: float, every_s: float = 0.05) -> None:
    """Poll `done()` every `every_s` seconds until it is true; the test fails if the command ends
    first or the time (`deadline`, as time.time()) runs out."""
    while not done():
        assert process.poll() is None and time.time() < deadline
        time.sleep(every_s)


def run_train(workdir, data_dir, devices=1, **overrides):
    result = subprocess.run(
        train_command(workdir, data_dir, **overrides), env=env_with_devices(devices), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def logged(workdir, key="loss"):
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line[key] for line in lines if key in line}


def final_params(workdir, devices: int | None = None):
    """The parameters of the latest checkpoint, restored by `fxformer.load` (the commands' loader), as NumPy:
    in this process, or in a command of its own on `devices` fake devices."""
    if devices is None:
        import fxformer

        params = fxformer.load(workdir, average_last=1).params
        return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}
    code = (
        "import sys, numpy as np, jax, fxformer; "
        "r = fxformer.load(sys.argv[1], average_last=1).restored; params, mesh = r.params, r.mesh; "
        "flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}; "
        "np.savez(sys.argv[2], **flat); print(r.steps, len(mesh.devices.flat))"
    )
    out = workdir / f"params-{devices}.npz"
    result = subprocess.run(
        [sys.executable, "-c", code, str(workdir), str(out)],
        env=env_with_devices(devices),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == str(devices)
    return dict(np.load(out))


TINY_RUNS = {  # the runs tests begin from, by steps: their train_command overrides
    2: {"num_train_steps": 2},  # one checkpoint, at its last step
    4: {"num_train_steps": 4, "checkpoint_every_steps": 2},  # checkpoints at 2 and 4
}


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, data_dir, corpus):
    """`tiny_run(workdir, steps)`: a copy, at `workdir`, of a TINY run of `steps` (`TINY_RUNS`),
    trained once per test process; the copy is the test's to change, the original never handed out."""
    trained = {}

    def copy(workdir: Path, steps: int = 2) -> Path:
        if steps not in trained:
            trained[steps] = tmp_path_factory.mktemp(f"tiny-{steps}-steps") / "w"
            run_train(trained[steps], data_dir, **TINY_RUNS[steps])
        shutil.copytree(trained[steps], workdir)
        return workdir

    return copy


@pytest.fixture(scope="session")
def eight_device_workdir(tmp_path_factory, data_dir, corpus):
    """A run trained on 8 fake devices, with checkpoints at steps 10 and 20 (shared with test_evaluate)."""
    workdir = tmp_path_factory.mktemp("eight") / "w"
    result = run_train(workdir, data_dir, devices=8, num_train_steps=20, checkpoint_every_steps=10)
    assert "8 devices" in result.stdout
    return workdir


def cut_short(state: Path, pattern: str = "*", keep: int = 100) -> list[Path]:
    """Damage a checkpoint's `state` directory as a storage fault would: every file matching
    `pattern` (under it, at any depth) larger than 1,000 bytes keeps only its first `keep` bytes.
    The files cut, to be mended from a `snapshot`."""
    cut = [path for path in state.rglob(pattern) if path.is_file() and path.stat().st_size > 1000]
    for path in cut:
        path.write_bytes(path.read_bytes()[:keep])
    return cut


def snapshot(path) -> dict[str, bytes] | None:
    """Every file under `path` by relative name ("" for `path` itself if it is a file), and every
    directory (b"<dir>"): compared byte for byte before and after a refusal. None if it is absent."""
    root = Path(path)
    if not root.exists():
        return None
    if root.is_file():
        return {"": root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


@contextlib.contextmanager
def left_as_is(*paths):
    """What every refusal owes the workdirs (or sweep roots) it names: each of `paths` byte for byte
    as before the command inside (`config.json` included), and still absent if it was absent."""
    before = [snapshot(path) for path in paths]
    yield
    for path, was in zip(paths, before):
        now = snapshot(path)
        if now != was:
            changed = sorted(k for k in {*(was or {}), *(now or {})} if (was or {}).get(k) != (now or {}).get(k))
            raise AssertionError(f"the refused command changed {path}: {'created' if was is None else changed}")


def refused_in_process(monkeypatch, main, argv, *untouched) -> str:
    """A command's `main` run in this process with `argv` (its flags): the UserError it refuses
    with, one line (what `cli.run` prints), each of `untouched` left as it was. Its message."""
    from fxformer.errors import UserError

    monkeypatch.setattr(sys, "argv", ["command", *argv])
    with left_as_is(*untouched), pytest.raises(UserError) as refused:
        main()
    assert "\n" not in str(refused.value), str(refused.value)
    return str(refused.value)
