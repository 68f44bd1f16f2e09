"""The launcher: golden dry-run output (tpu, slurm), no JAX on the launching machine, the local
backend on two processes with a pre-emption that resumes exactly, and the SLURM-without-srun refusal.

Golden files live in tests/golden/. After an intended change of the printed commands, regenerate
them with `FXFORMER_UPDATE_GOLDEN=1 python -m pytest tests/test_launch.py` and review the diff.
"""

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY, env_with_devices, left_as_is, logged, run_train

from experiments import __main__ as experiments_main
from experiments.backends import local
from fxformer import exitcodes

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"


def experiments(*argv, env=None, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "experiments", *argv], cwd=REPO, env=env, capture_output=True, text=True, **kwargs
    )


def head_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        pytest.skip("not a git checkout: the tpu backend syncs committed code")
    return out.stdout.strip()


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FXFORMER_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"dry-run output differs from {path} (see this file's docstring)"


# The dry runs' clusters: a v4-32 TPU slice (4 workers), two SLURM nodes of 8 GPUs
TPU_4_WORKERS = ("--backend=tpu", "--tpu=my-v4-32", "--zone=us-central2-b", "--workers=4", "--dry-run")
SLURM_2X8 = ("--backend=slurm", "--nodes=2", "--gpus_per_node=8", "--time=24:00:00", "--dry-run")


def golden_dry_run(name: str, *argv: str, capsys=None) -> tuple[str, str]:
    """`python -m experiments <argv>` (a dry run), its exit status 0 and its output the golden file
    `name` (the commit a TPU launch syncs written <commit>): its (stdout, stderr). With `capsys` it
    runs in this process, where a fake bucket sees what it would write; else as a command."""
    if capsys is None:
        result = experiments(*argv)
        status, out, err = result.returncode, result.stdout, result.stderr
    else:
        status = experiments_main.main(list(argv))
        out, err = capsys.readouterr()
    assert status == 0, err
    if "--backend=tpu" in argv:
        out = out.replace(head_commit(), "<commit>")
    check_golden(name, out)
    return out, err


@pytest.mark.slow
def test_tpu_dry_run_matches_golden_file():
    text, _ = golden_dry_run(
        "launch_tpu_4_workers.txt",
        "launch",
        "--backend=tpu",
        "--tpu=my-v4-32",
        "--zone=us-central2-b",
        "--workers=4",
        "--evaluate",
        "--eval_flags=--split=validation",
        "--dry-run",
        "--",
        "--config=configs/base.py",
        "--workdir=gs://bucket/runs/base",
    )
    runs = [line for line in text.splitlines() if "experiments.worker" in line]
    assert [f"--worker={i} " in line for i, line in enumerate(runs)] == [True] * 4
    for i, line in enumerate(runs):  # the flags reach fxformer.train unchanged, the URL intact, with --distributed
        assert "gcloud compute tpus tpu-vm ssh my-v4-32" in line
        assert "--then=fxformer.evaluate --distributed --workdir=gs://bucket/runs/base --split=validation" in line
        tail = (
            " -- fxformer.train --distributed --config=configs/base.py --workdir=gs://bucket/runs/base'"
            f" > logs/base/worker_{i}.log 2>&1 &"
        )
        assert line.endswith(tail)


@pytest.mark.slow
def test_tpu_dry_run_without_worker_count_asks_gcloud_in_the_script():
    result = experiments(
        "launch",
        "--backend=tpu",
        "--tpu=my-v4-32",
        "--zone=us-central2-b",
        "--dry-run",
        "--",
        "--config=configs/base.py",
        "--workdir=gs://bucket/runs/base",
    )
    assert result.returncode == 0, result.stderr
    assert "gcloud compute tpus tpu-vm describe my-v4-32" in result.stdout
    assert "--worker=$i" in result.stdout and "gs://bucket/runs/base" in result.stdout


@pytest.mark.slow
def test_slurm_dry_run_matches_golden_file():
    out, _ = golden_dry_run(
        "launch_slurm_2x8.txt",
        "launch",
        "--backend=slurm",
        "--nodes=2",
        "--gpus_per_node=8",
        "--time=24:00:00",
        "--partition=gpu",
        "--evaluate",
        "--dry-run",
        "--",
        "--config=configs/base.py",
        "--workdir=/shared/runs/base",
    )
    assert "srun " in out and "--requeue" in out and "scontrol requeue" in out


@pytest.mark.slow
def test_sbatch_script_is_valid_bash():
    result = experiments(
        "launch", "--backend=slurm", "--nodes=2", "--dry-run", "--", "--config=c.py", "--workdir=/shared/w"
    )
    script = result.stdout.split("\n", 1)[1]  # after the "# path, submitted with" line
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.slow
def test_launcher_never_imports_jax():
    """A launch's dry run imports no JAX (every module's imports: test_experiments_design.py)."""
    code = (
        "import sys; from experiments import __main__ as m; m.main(['launch', '--backend=slurm', '--dry-run', '--', "
        "'--config=configs/base.py', '--workdir=/w']); "
        "assert 'jax' not in sys.modules and 'jaxlib' not in sys.modules, 'jax imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_launcher_refuses_bad_input_in_one_sentence():
    cases = [
        (["launch", "--backend=tpu", "--dry-run", "--", "--workdir=w"], "needs --tpu"),
        (["launch", "--dry-run", "--", "--config=c.py"], "with --workdir"),
        (["launch", "--dry-run", "--", "--workdir=w", "--distributed"], "Leave --distributed"),
        (["launch", "--processes=0", "--", "--workdir=w"], "--processes must be at least 1"),
        (["frobnicate"], "unknown verb"),
    ]
    for argv, message in cases:
        with left_as_is(REPO / "w"):
            result = experiments(*argv)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, argv


@pytest.mark.slow
def test_distributed_under_slurm_without_srun_is_refused(tmp_path, data_dir):
    env = {**env_with_devices(1), "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1"}
    env.pop("SLURM_STEP_NODELIST", None)
    workdir = tmp_path / "w"
    with left_as_is(workdir):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "fxformer.train",
                "--config=configs/default.py",
                f"--workdir={workdir}",
                "--distributed",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
    assert result.returncode == exitcodes.USER_ERROR, result.stderr[-2000:]
    assert "started by srun" in result.stderr and "Traceback" not in result.stderr


def local_launch(workdir, data_dir, *launcher_flags, **overrides):
    """`experiments launch --backend=local --processes=2` of the tiny config, as a running process."""
    flags = {**TINY, "data.tfds_data_dir": str(data_dir), "data.num_shards": 2, **overrides}
    argv = [
        sys.executable,
        "-m",
        "experiments",
        "launch",
        "--backend=local",
        "--processes=2",
        "--grace_s=60",
        *launcher_flags,
        "--",
        "--config=configs/default.py",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in flags.items()),
    ]
    return subprocess.Popen(
        argv, cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def sigterm_one_process_after(workdir, process, steps):
    """Wait until `steps` steps are logged, then SIGTERM the training command of process 1 only."""
    deadline = time.time() + 300
    while not (workdir / "metrics.jsonl").exists() or max(logged(workdir), default=0) < steps:
        if process.poll() is not None or time.time() > deadline:  # process 0's output is on stdout
            if process.poll() is None:
                process.kill()
            out, err = process.communicate()
            pytest.fail(f"the launch ended ({process.returncode}) before step {steps}:\n{out[-3000:]}\n{err[-3000:]}")
        time.sleep(0.05)
    pid = int((workdir / "logs" / "process_1" / "pid").read_text())
    os.kill(pid, signal.SIGTERM)


@pytest.mark.slow
def test_local_backend_two_processes_resume_after_sigterm_exactly(tmp_path, data_dir, corpus):
    common = {"num_train_steps": 30}
    straight = tmp_path / "straight"
    run_train(straight, data_dir, devices=2, **{"data.num_shards": 2}, **common)  # 2 devices in one process

    workdir = tmp_path / "launched"
    first = local_launch(workdir, data_dir, **common)
    sigterm_one_process_after(workdir, first, 3)
    out, err = first.communicate(timeout=300)
    assert first.returncode == exitcodes.STOPPED, err[-3000:]  # not 0: the run is not finished
    assert "2 devices (cpu) in 2 process(es)" in out
    stopped_at = max(logged(workdir))
    assert 3 <= stopped_at < 30
    assert (workdir / "checkpoints" / str(stopped_at)).is_dir()  # saved at the step both processes agreed on

    second = local_launch(workdir, data_dir, "--retries=1", **common)  # pre-empted again: relaunched by itself
    sigterm_one_process_after(workdir, second, stopped_at + 3)
    out, err = second.communicate(timeout=300)
    assert second.returncode == exitcodes.OK, err[-3000:]
    assert "relaunching (1 of 1)" in err and out.count("resumed from") == 2
    a, b = logged(straight), logged(workdir)
    assert sorted(b) == list(range(1, 31))
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5), step
    for i in range(2):
        assert "fxformer.train" in (workdir / "logs" / f"process_{i}" / "worker.log").read_text()


@pytest.mark.slow
def test_stop_ends_a_launch_with_retries_instead_of_being_taken_for_a_preemption(tmp_path, data_dir, corpus):
    workdir = tmp_path / "w"
    launched = local_launch(workdir, data_dir, "--retries=2", num_train_steps=100_000)
    deadline = time.time() + 300
    while not (workdir / "metrics.jsonl").exists() or max(logged(workdir), default=0) < 3:
        assert launched.poll() is None and time.time() < deadline, launched.communicate()[1][-3000:]
        time.sleep(0.05)
    stopped = experiments("stop", "--backend=local", "--processes=2", "--", f"--workdir={workdir}")
    assert stopped.returncode == 0 and stopped.stderr.count("SIGTERM sent") == 2, stopped.stderr
    out, err = launched.communicate(timeout=300)
    assert launched.returncode == exitcodes.STOPPED, err[-3000:]  # its processes answered 75: saved, not done
    assert "stopped by `stop`: not relaunched" in err and "relaunching" not in err
    assert out.count("resumed from") == 0  # one attempt only
    again = local_launch(workdir, data_dir, "--retries=1", num_train_steps=max(logged(workdir)) + 2)
    out, err = again.communicate(timeout=300)  # a new launch is not held by the old request
    assert again.returncode == exitcodes.OK and "resumed from" in out, err[-3000:]


def test_the_coordinator_port_is_free_and_outside_the_kernels_ephemeral_range():
    """bind(0)'s ports come from the ephemeral range, where any outgoing connection can take the
    port between the choice and the coordinator's bind; the local backend's come from outside it."""
    low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for seed in range(20):
        port = local.free_port(rng=random.Random(seed))
        assert 10000 <= port <= 65535 and not low <= port <= high, port
    first = local.free_port(rng=random.Random(7))
    with socket.socket() as busy:  # the port that seed picks first is taken now: the next one is given
        busy.bind(("127.0.0.1", first))
        again = local.free_port(rng=random.Random(7))
        assert again != first and not low <= again <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", again))


def local_launch_args(workdir, data_dir, **overrides) -> list[str]:
    """`experiments launch --backend=local` (one process) of the tiny config, with its logs in W/logs."""
    flags = {**TINY, "data.tfds_data_dir": str(data_dir), **overrides}
    return [
        "launch",
        "--backend=local",
        "--",
        "--config=configs/default.py",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in flags.items()),
    ]


@pytest.mark.slow
def test_a_refused_local_launch_writes_nothing_into_the_workdir(tmp_path, data_dir, corpus):
    """The workers' logs (W/logs/process_<i>) wait until train has accepted the run: a refused
    launch leaves a fresh workdir absent (refused at once, or after preparing the data) and an
    existing one byte for byte; an accepted one's log holds its whole output, from the start."""

    def launch(workdir, **overrides):
        return experiments(*local_launch_args(workdir, data_dir, **overrides), env=env_with_devices(1))

    fresh = tmp_path / "fresh"
    for overrides, words in (
        ({"model.num_heads": 0}, "model.num_heads must be positive"),
        ({"data.max_length": 3}, "keeps none of"),
    ):
        with left_as_is(fresh):
            refused = launch(fresh, **overrides)
        assert refused.returncode == exitcodes.USER_ERROR, refused.stdout[-2000:] + refused.stderr[-2000:]
        assert words in refused.stdout and "Traceback" not in refused.stdout, refused.stdout[-2000:]

    workdir = tmp_path / "w"
    accepted = launch(workdir, num_train_steps=2)
    assert accepted.returncode == exitcodes.OK, accepted.stdout[-2000:] + accepted.stderr[-2000:]
    log = (workdir / "logs" / "process_0" / "worker.log").read_text()
    assert log.startswith("$ ") and "fxformer.train" in log.splitlines()[0] and "step 2/2" in log
    assert log.count("\n") >= accepted.stdout.count("\n")  # what was echoed before the run was accepted too
    with left_as_is(workdir):
        refused = launch(workdir, num_train_steps=4, **{"data.max_length": 3})
    assert refused.returncode == exitcodes.USER_ERROR and "keeps none of" in refused.stdout, refused.stdout[-2000:]
    from experiments.worker import held_pid

    assert not held_pid(workdir / "logs" / "process_0").exists()  # the pid kept while the log was held


@pytest.mark.parametrize("name", ["a/b", "my run", "../up"])
def test_a_run_name_must_be_a_plain_name(name, capsys):
    argv = ["launch", f"--name={name}", "--dry-run", "--", "--config=configs/base.py", "--workdir=/w"]
    assert experiments_main.main(argv) == 2
    assert "is not a plain name" in capsys.readouterr().err


@pytest.mark.parametrize("workdir", ["/x/my runs/b$x", "/x/it's"])
def test_a_run_name_taken_from_the_workdir_must_be_plain_too(workdir, capsys):
    for backend in ("local", "slurm"):  # pasted into job names and scripts
        argv = ["launch", f"--backend={backend}", "--dry-run", "--", "--config=configs/base.py", f"--workdir={workdir}"]
        assert experiments_main.main(argv) == 2
        assert "(the end of --workdir) is not a plain name; give --name=" in capsys.readouterr().err
    for backend in ("slurm", "tpu"):  # a plain name in a path with a space: the scripts' log paths
        argv = ["launch", f"--backend={backend}", "--dry-run", "--", "--config=c.py", "--workdir=/x/my runs/b"]
        assert experiments_main.main(argv) == 2
        assert "backend's scripts cannot carry; give --logdir=" in capsys.readouterr().err
    argv = ["launch", "--name=ok", "--dry-run", "--", "--config=configs/base.py", "--workdir=/w", "--num_processes=4"]
    assert experiments_main.main(argv) == 2  # the launcher's own flag, which a later one would override
    assert "Leave --distributed and the cluster flags to the launcher" in capsys.readouterr().err
