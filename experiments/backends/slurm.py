"""The SLURM backend: an sbatch script that starts one process per GPU with srun and requeues itself.

Why srun: only a job step tells each process its rank and the node list, which
`jax.distributed.initialize()` reads (a plain `python` in the batch script fails, jax issue
30073; fxformer refuses it in one sentence). Pre-emption: SLURM sends SIGTERM to every task
(each saves and exits 75) and requeues a job submitted with --requeue by itself; before the
time limit, `--signal=B:USR1@180` warns the script, which stops the tasks the same way and
requeues the job. A requeued job resumes from the workdir's checkpoints. `scancel` stops
without requeueing.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess

from experiments.backends.base import Launched, Outcome
from experiments.cli import say, which
from experiments.job import Job
from fxformer.errors import UserError

SCRIPT = """\
#!/bin/bash
# fxformer run '{name}': {nodes} node(s) x {gpus} GPU(s), one process per GPU.
# Written by: python -m experiments launch --backend=slurm; submit from the repository root.
#SBATCH --job-name=fxformer-{name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={gpus}
#SBATCH --gpus-per-node={gpus}
{optional}#SBATCH --output={logdir}/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@180

# Before the time limit SLURM sends USR1 to this script: stop the tasks (they save a
# checkpoint and exit 75) and requeue the job, which then resumes from that checkpoint.
requeue=0
on_usr1() {{
  echo "fxformer: time limit near: saving, stopping and requeueing job $SLURM_JOB_ID"
  requeue=1
  kill -TERM "$step" 2>/dev/null
}}
trap on_usr1 USR1
# Pre-emption and scancel send SIGTERM to the tasks themselves; this script waits for them.
trap 'echo "fxformer: SIGTERM: the tasks save a checkpoint and stop"' TERM

run_step() {{  # one srun job step, one process per GPU; waits through the traps for its status
  srun --kill-on-bad-exit=1 --output={logdir}/%x-%j.%t.log "$@" &
  step=$!
  while true; do
    wait "$step"; status=$?
    kill -0 "$step" 2>/dev/null || return "$status"
  done
}}

cd "$SLURM_SUBMIT_DIR"
run_step {train}
status=$?
if [ "$requeue" = 1 ]; then
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
{evaluate}exit "$status"
"""


class Slurm:
    def __init__(self, args: argparse.Namespace, echo: bool = True, handle_signals: bool = True):
        if args.nodes < 1 or args.gpus_per_node < 1:
            raise UserError("--nodes and --gpus_per_node must be at least 1.")
        self.args = args

    def script(self, job: Job) -> str:
        a = self.args
        optional = "".join(
            f"#SBATCH --{key}={value}\n"
            for key, value in (
                ("cpus-per-task", a.cpus_per_task),
                ("time", a.time),
                ("partition", a.partition),
                ("account", a.account),
            )
            if value
        )
        train = shlex.join([a.python, "-m", "fxformer.train", *job.train_flags, "--distributed"])
        evaluation = shlex.join([a.python, "-m", *job.evaluation([]), "--distributed"])
        if not job.train:  # a trained row of a sweep: the evaluation alone
            train, evaluation = evaluation, ""
        elif not job.evaluate:
            evaluation = ""
        evaluate = f'if [ "$status" = 0 ]; then\n  run_step {evaluation}\n  status=$?\nfi\n' if evaluation else ""
        return SCRIPT.format(
            name=job.name,
            nodes=a.nodes,
            gpus=a.gpus_per_node,
            optional=optional,
            logdir=job.logdir,
            train=train,
            evaluate=evaluate,
        )

    def launch(self, job: Job, dry_run: bool) -> Launched:
        """Submit the job (sbatch returns at once: the scheduler holds it from then on)."""
        script = self.script(job)
        path = job.logdir / f"{job.name}.sbatch"
        if dry_run:
            print(f"# {path}, submitted with: sbatch --parsable {path}")
            print(script, end="")
            return Launched.of(0)
        job.logdir.mkdir(parents=True, exist_ok=True)
        path.write_text(script)
        out = subprocess.run([which("sbatch"), "--parsable", str(path)], capture_output=True, text=True)
        if out.returncode:
            raise UserError(f"sbatch refused {path}: {out.stderr.strip()[:300]}")
        job_id = out.stdout.strip().split(";")[0]
        (job.logdir / "job_id").write_text(job_id + "\n")
        print(f"submitted job {job_id}: {path}; logs in {job.logdir}/ (slurm-{job_id}.out, one file per process)")
        return Launched(Outcome.SUBMITTED, 0, job_id=job_id)

    def setup(self, job: Job, dry_run: bool) -> int:
        say(
            f"on the cluster: python3 -m venv .venv && .venv/bin/pip install -r requirements.txt 'jax[cuda12]' "
            f"(the python the script runs is --python={self.args.python})"
        )
        return 0

    def _job_id(self, job: Job) -> str:
        path = job.logdir / "job_id"
        if not path.exists():
            raise UserError(f"No job id in {path}; was this run launched with --backend=slurm from here?")
        return path.read_text().strip()

    def logs(self, job: Job, dry_run: bool) -> int:
        job_id = self._job_id(job)
        for path in sorted(job.logdir.glob(f"*{job_id}*")):
            print(path)
        return 0

    def stop(self, job: Job, dry_run: bool) -> int:
        argv = ["scancel", self._job_id(job)]  # SIGTERM to every task first: each saves and exits
        if dry_run:
            print(shlex.join(argv))
            return 0
        return subprocess.run([which("scancel"), *argv[1:]]).returncode

    def before_retry(self, job: Job) -> None:
        pass

    def interrupt(self) -> None:
        pass  # nothing runs here: scancel stops a submitted job (python -m experiments stop)

    def left_running(self, job: Job) -> int | None:
        return None  # the scheduler runs the tasks; a submitted row's lease says who holds it
