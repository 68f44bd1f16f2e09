"""The fork server the suite starts its commands from (tests/forkserver.py): a forked command
prints, reads and exits as a fresh Python running it does, signals reach it, a client killed
takes its command with it, and what cannot be forked safely starts a fresh Python."""

import signal
import subprocess
import sys
import time

import forkserver
import psutil
import pytest
from conftest import env_with_devices

COMMAND = [sys.executable, "-m", "fxformer.translate", "--workdir=/nonexistent/run"]


@pytest.fixture
def server(fork_server):
    if fork_server is None:
        pytest.skip("FXFORMER_TEST_FORKSERVER=0: no fork server")
    return fork_server


def fresh(args, **kwargs) -> subprocess.CompletedProcess:
    """`args` run by a fresh Python (`executable` given: never forked)."""
    return subprocess.run(args, executable=args[0], capture_output=True, text=True, **kwargs)


def test_a_forked_command_prints_and_exits_as_a_fresh_process_does(server):
    env = env_with_devices(1)
    assert server.refuses(COMMAND, {"env": env}) is None
    assert "not a plain" in server.refuses(COMMAND, {"env": env, "executable": sys.executable})
    forked = subprocess.run(COMMAND, capture_output=True, text=True, env=env, input="A sentence.\n")
    alone = fresh(COMMAND, env=env, input="A sentence.\n")
    assert forked.returncode == alone.returncode == 2
    assert forked.stdout == alone.stdout and forked.stderr == alone.stderr and "/nonexistent/run" in forked.stderr
    help_forked = subprocess.run([*COMMAND[:3], "--help"], capture_output=True, text=True, env=env)
    assert help_forked.returncode == 0 and help_forked.stdout == fresh([*COMMAND[:3], "--help"], env=env).stdout


def test_signals_reach_the_command_and_a_killed_client_takes_it_along(server, tmp_path, tiny_run):
    """SIGTERM to the client ends the command as it ends a fresh process (translate keeps no
    handler: killed by it); SIGKILL to the client ends the forked child too."""
    gone = [sys.executable, "-m", "fxformer.no_such_module"]
    forked = subprocess.run(gone, capture_output=True, text=True, env=env_with_devices(1))
    assert forked.returncode == fresh(gone, env=env_with_devices(1)).returncode == 1
    assert "No module named fxformer.no_such_module" in forked.stderr

    waiting = [sys.executable, "-m", "fxformer.translate", f"--workdir={tiny_run(tmp_path / 'w')}"]  # reads stdin
    server_process = psutil.Process(server.process.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        before = {p.pid for p in server_process.children()}
        client = subprocess.Popen(waiting, env=env_with_devices(1), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        deadline = time.time() + 30
        while not {p.pid for p in server_process.children()} - before:
            assert time.time() < deadline and client.poll() is None
            time.sleep(0.02)
        (child,) = [p for p in server_process.children() if p.pid not in before]
        client.send_signal(sig)
        assert client.wait(timeout=60) == -sig
        child.wait(timeout=30)  # raises if it outlives its client, its input still open
        client.stdin.close()
        client.stdout.close()
    alone = subprocess.Popen(waiting, executable=sys.executable, env=env_with_devices(1), stdin=subprocess.PIPE)
    alone.send_signal(signal.SIGTERM)
    assert alone.wait(timeout=60) == -signal.SIGTERM


def test_another_folder_is_forked_only_where_a_fresh_python_imports_the_same_modules(server, tmp_path):
    """From a folder other than the checkout, with PYTHONPATH naming the checkout (as the docs'
    commands run), a module and a script are forked and print what a fresh Python prints; a
    folder holding a module the server imported, a PYTHONPATH elsewhere, or none, start a fresh one."""
    env = {**env_with_devices(1), "PYTHONPATH": str(forkserver.REPO)}
    script = tmp_path / "probe.py"
    script.write_text("import sys, fxformer\nprint(sys.argv[1:], sys.path[:2], fxformer.__file__)\n")
    module = [sys.executable, "-m", "fxformer.translate", "--help"]
    for args in (module, [sys.executable, str(script), "a", "b"]):
        assert server.refuses(args, {"cwd": tmp_path, "env": env}) is None
        forked = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
        alone = fresh(args, cwd=tmp_path, env=env)
        assert forked.returncode == alone.returncode == 0, forked.stderr[-2000:]
        assert forked.stdout == alone.stdout and forked.stdout
    line = f"echo x | {sys.executable} -m fxformer.translate --help && {sys.executable} {script} c"
    routed = server.in_shell(line, tmp_path, env)
    assert routed.count(str(forkserver.CLIENT)) == 2 and routed.startswith("echo x | ")
    done = subprocess.run(["bash", "-c", routed], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.endswith(fresh([sys.executable, str(script), "c"], env=env).stdout)

    assert "PYTHONPATH does not name" in server.refuses(module, {"cwd": tmp_path, "env": env_with_devices(1)})
    assert "PYTHONPATH" in server.refuses(module, {"cwd": tmp_path, "env": {**env, "PYTHONPATH": str(tmp_path)}})
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text("")
    assert "holds numpy" in server.refuses(module, {"cwd": tmp_path, "env": env})
    assert server.in_shell(line, tmp_path, env) == line


def test_a_forked_command_collects_its_own_garbage_but_never_walks_the_servers_imports(server, tmp_path):
    """The server freezes (gc.freeze) what its imports made before it forks: a forked command's
    collections leave those objects alone (a fresh Python has frozen none), and still free the
    command's own cycles."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import gc\nfrozen = gc.get_freeze_count()\nloop = []\nloop.append(loop)\ndel loop\n"
        "print(frozen, gc.collect())\n"
    )
    args = [sys.executable, str(script)]
    env = {**env_with_devices(1), "PYTHONPATH": str(forkserver.REPO)}
    assert server.refuses(args, {"cwd": tmp_path, "env": env}) is None
    forked = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    frozen, collected = (int(n) for n in forked.stdout.split())
    assert frozen > 100_000 and collected >= 1, forked.stdout  # the imports of JAX, Flax, orbax, ...: ~195,000
    alone = fresh(args, cwd=tmp_path, env=env).stdout.split()
    assert int(alone[0]) == 0 and int(alone[1]) >= 1
