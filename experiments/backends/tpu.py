"""The Cloud TPU backend: gcloud commands that set up, sync, run, follow and stop a pod's workers.

On every worker: the code of one commit in ~/fxformer, a virtual environment in
~/fxformer-venv (the project's requirements plus jax[tpu]), and ~/fxformer-runs/<name>/ with
the run's worker.log and the pid of what it started (paths relative to ~/fxformer below, so
that the printed commands need no nested quotes). The run is one ssh per worker (so each
worker's exit status and log come back), `python -m experiments.worker` on the far side.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess

from experiments import group
from experiments.backends.base import Launched
from experiments.cli import commit, say, which
from experiments.job import Job, run_commands
from fxformer.errors import UserError

CODE, VENV, RUNS = "~/fxformer", "../fxformer-venv", "../fxformer-runs"  # VENV, RUNS: seen from CODE (~/...)
ARCHIVE = "fxformer-src.tar.gz"


def jax_tpu_requirement(sha: str) -> str:
    """`jax[tpu]` with the version range that commit `sha`'s requirements.txt gives jax (read from
    git, as the code sent to the workers is: `setup` runs from fxformer's checkout)."""
    out = subprocess.run(["git", "show", f"{sha}:requirements.txt"], capture_output=True, text=True)
    if out.returncode:
        raise UserError(f"Commit {sha[:12]} has no requirements.txt; run setup from fxformer's git checkout.")
    for line in out.stdout.splitlines():
        if m := re.match(r"jax\s*([<>=!~][^#;]*)", line.strip()):
            return f"jax[tpu]{m.group(1).strip()}"
    return "jax[tpu]"


class Tpu:
    def __init__(self, args: argparse.Namespace, echo: bool = True, handle_signals: bool = True):
        if not args.tpu or not args.zone:
            raise UserError("The tpu backend needs --tpu=<TPU VM name> and --zone=<zone>.")
        self.args, self.echo, self.handle_signals = args, echo, handle_signals
        self.group = group.Group(args.grace_s)

    # -- gcloud command lines ------------------------------------------------------------------

    def _where(self) -> list[str]:
        return [f"--zone={self.args.zone}"] + ([f"--project={self.args.project}"] if self.args.project else [])

    def gcloud(self, verb: str, *args: str) -> list[str]:
        """`gcloud compute tpus tpu-vm VERB ARGS --zone=Z [--project=P]`, flags after the positional ones."""
        positional = [a for a in args if not a.startswith("--")]
        flags = [a for a in args if a.startswith("--")]
        return ["gcloud", "compute", "tpus", "tpu-vm", verb, *positional, *self._where(), *flags]

    def ssh(self, worker: int | str, command: str) -> list[str]:
        return self.gcloud("ssh", self.args.tpu, f"--worker={worker}", f"--command={command}")

    def in_code(self, *argv: str) -> str:
        """A shell command run in the code directory with the run's virtual environment."""
        check = (
            f'test -x {VENV}/bin/python || {{ echo "fxformer: no venv; run python -m experiments setup" >&2; exit 2; }}'
        )
        return f"cd {CODE} && {{ {check}; }} && {VENV}/bin/python {shlex.join(argv)}"

    def rundir(self, job: Job) -> str:
        return f"{RUNS}/{job.name}"

    def commit(self, dry_run: bool) -> str:
        """The full hash of --commit (the code every worker runs)."""
        found = commit(self.args.commit)
        if found is None:
            raise UserError(f"'{self.args.commit}' is not a commit here; run from fxformer's git checkout.")
        sha, dirty = found
        if dirty and not dry_run:
            say(f"note: uncommitted changes are not sent; the workers run commit {sha[:12]}")
        return sha

    def sync_commands(self, job: Job, dry_run: bool) -> list[list[str]]:
        """The code at one commit onto every worker, replacing the previous copy."""
        sha = self.commit(dry_run)
        archive = job.logdir / ARCHIVE
        unpack = (
            f"rm -rf {CODE}.new && mkdir -p {CODE}.new && tar -xzf ~/{ARCHIVE} -C {CODE}.new && "
            f"rm -rf {CODE} && mv {CODE}.new {CODE} && echo {sha} > {CODE}/COMMIT"
        )
        return [
            ["mkdir", "-p", str(job.logdir)],
            ["git", "archive", "--format=tar.gz", "-o", str(archive), sha],
            self.gcloud("scp", str(archive), f"{self.args.tpu}:{ARCHIVE}", "--worker=all"),
            self.ssh("all", unpack),
        ]

    def setup_command(self, sha: str) -> list[str]:
        """An idempotent venv on every worker: created once, pip run again only when requirements change."""
        stamp = f"{VENV}/.fxformer-requirements"
        install = f'{VENV}/bin/pip install -q -r requirements.txt "{jax_tpu_requirement(sha)}"'
        return self.ssh(
            "all",
            (
                f"cd {CODE} && (test -x {VENV}/bin/python || python3 -m venv {VENV}) && "
                f"want=$(sha256sum requirements.txt | cut -c1-16) && "
                f'if [ "$(cat {stamp} 2>/dev/null)" != "$want" ]; then {install} && echo "$want" > {stamp}; fi && '
                f'{VENV}/bin/python -c "import jax; print(jax.__version__)"'
            ),
        )

    def run_command(self, job: Job, worker: int | str) -> list[str]:
        flags = job.worker_flags(self.rundir(job), ["--distributed"])
        return self.ssh(worker, self.in_code("-m", "experiments.worker", *flags))

    def stop_command(self, job: Job, kill: bool = False) -> list[str]:
        flags = ["--stop"] + (["--kill"] if kill else [])
        return self.ssh("all", self.in_code("-m", "experiments.worker", f"--rundir={self.rundir(job)}", *flags))

    def count_command(self) -> list[str]:
        return self.gcloud("describe", self.args.tpu, "--format=value(networkEndpoints.len())")

    def workers(self) -> int:
        """Hosts in the slice: --workers, else asked from gcloud (one network endpoint per host)."""
        if self.args.workers:
            return self.args.workers
        ask = self.count_command()
        which("gcloud")
        out = subprocess.run(ask, capture_output=True, text=True)
        if out.returncode or not out.stdout.strip().isdigit():
            raise UserError(f"Could not ask gcloud about TPU {self.args.tpu}: {out.stderr.strip()[:200]}")
        return int(out.stdout.strip())

    # -- verbs ---------------------------------------------------------------------------------

    def setup(self, job: Job, dry_run: bool) -> int:
        sync = self.sync_commands(job, dry_run)
        return run_commands([*sync, self.setup_command(self.commit(True))], dry_run)

    def launch(self, job: Job, dry_run: bool) -> Launched:
        if dry_run:
            return Launched.of(self.print_launch(job))
        n = self.workers()
        run_commands(self.sync_commands(job, False), False)
        argvs = [self.run_command(job, i) for i in range(n)]
        logs = [job.logdir / f"worker_{i}.log" for i in range(n)]
        which("gcloud")
        for i, log in enumerate(logs):
            say(f"worker {i}: log {log}")
        stop = lambda: run_commands([self.stop_command(job)], False, check=False)
        kill = lambda: run_commands([self.stop_command(job, kill=True)], False, check=False)
        status = self.group.run(argvs, logs, stop, kill, self.echo, self.handle_signals)
        return Launched.of(status, self.group.interrupted)

    def interrupt(self) -> None:
        self.group.interrupt()

    def left_running(self, job: Job) -> int | None:
        return None  # the workers run on the TPU hosts, where a relaunched worker refuses to start beside one

    def print_launch(self, job: Job) -> int:
        """The launch as a shell script: sync, then one ssh per worker in parallel, each to its log."""
        run_commands(self.sync_commands(job, True), True)
        if self.args.workers:
            for i in range(self.args.workers):
                log = shlex.quote(str(job.logdir / f"worker_{i}.log"))
                print(f"{shlex.join(self.run_command(job, i))} > {log} 2>&1 &")
        else:
            log = shlex.quote(str(job.logdir / "worker_$i.log")).replace("'", '"')
            print(f"n=$({shlex.join(self.count_command())})  # hosts in the slice")
            print("for i in $(seq 0 $((n - 1))); do")
            command = shlex.join(self.run_command(job, "WORKER")).replace("--worker=WORKER", "--worker=$i")
            print(f"  {command} > {log} 2>&1 &")
            print("done")
        print("wait  # the launcher also stops every worker when one fails (python -m experiments stop)")
        return 0

    def logs(self, job: Job, dry_run: bool) -> int:
        if dry_run and not self.args.workers:
            raise UserError("Give --workers=<hosts in the slice> with --dry-run, or leave --dry-run out.")
        n = self.workers()
        fetch = [
            self.gcloud(
                "scp",
                f"{self.args.tpu}:fxformer-runs/{job.name}/worker.log",
                str(job.logdir / f"worker_{i}.log"),
                f"--worker={i}",
            )
            for i in range(n)
        ]
        run_commands([["mkdir", "-p", str(job.logdir)], *fetch], dry_run, check=False)
        if not dry_run:
            for i in range(n):
                say(f"worker {i}: {job.logdir / f'worker_{i}.log'}")
        return 0

    def stop(self, job: Job, dry_run: bool) -> int:
        return run_commands([self.stop_command(job)], dry_run)

    def before_retry(self, job: Job) -> None:
        """Re-create the TPU if it was pre-empted (levanter's habit), then set it up again."""
        state = subprocess.run(
            self.gcloud("describe", self.args.tpu, "--format=value(state)"), capture_output=True, text=True
        ).stdout.strip()
        if state in ("READY", ""):
            return
        if not (self.args.accelerator_type and self.args.runtime_version):
            raise UserError(
                f"TPU {self.args.tpu} is {state}; give --accelerator_type and --runtime_version so that "
                "--retries can re-create it, or re-create it yourself and launch again."
            )
        say(f"TPU {self.args.tpu} is {state}: re-creating it")
        create = self.gcloud(
            "create",
            self.args.tpu,
            f"--accelerator-type={self.args.accelerator_type}",
            f"--version={self.args.runtime_version}",
        )
        run_commands([self.gcloud("delete", self.args.tpu, "--quiet"), create], False)
        self.setup(job, False)
