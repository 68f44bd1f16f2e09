"""What a sweep's run directory `R/<run>` holds, and who runs it now: a status file with a lease.

`R/<run>` is the run's fxformer workdir (config.json, checkpoints/, metrics.jsonl, eval/) plus
`sweep.json`, the lease, written by the sweep runner: attempts, the resolved config it started
with, the commit, its `RowStatus`, and while it runs an owner (host, pid) with a heartbeat.
A launcher leaves a run alone while another owner's heartbeat is fresher than the lease (or,
on this host, while that pid lives); a stale run is taken over (marin's executor). SLURM rows
are held while their job is queued or running. Works on local paths and object stores alike (etils.epath).
"""

from __future__ import annotations

import enum
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

from etils import epath

from experiments.cli import flag_value, read_json
from fxformer import configfile, early, metrics, paths
from fxformer.config import load_workdir_config

DEFAULT_LEASE_S = 300.0


class RowStatus(str, enum.Enum):
    """Where a row stands: read from its files (`RowState.state`), written to its lease, and what
    running it came to (`runner.run_row`). A str, so it prints and compares as its value."""

    PENDING = "pending"  # nothing started
    RUNNING = "running"  # a launcher (here or elsewhere) holds it now
    SUBMITTED = "submitted"  # a scheduler holds it (a queued or running SLURM job)
    TRAINED = "trained"  # trained to its last step, not yet evaluated
    STOPPED = "stopped"  # started, not finished, nobody holds it: resumable
    FAILED = "failed"  # its last attempt failed
    FINISHED = "finished"  # trained and evaluated

    def __str__(self) -> str:
        return self.value


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive_here(owner: str) -> bool | None:
    """True/False if `owner` is a process on this host, alive or not; None if on another host."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _slurm_job_alive(job_id: str) -> bool:
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except OSError:  # no squeue here: not on the cluster, so nothing of ours runs there now
        return False
    except subprocess.TimeoutExpired:
        return True  # the scheduler is slow to answer: assume it still holds the job
    return bool(out.stdout.strip())


@dataclass
class RowState:
    """One run directory as found on disk: its sweep status, checkpoints, progress and results."""

    workdir: paths.Workdir
    status: dict = field(default_factory=dict)
    checkpoint_steps: list[int] = field(default_factory=list)
    logged_step: int = 0  # the last step in metrics.jsonl
    wall_s: float | None = None  # the training wall time metrics.jsonl's last line gives
    results: dict | None = None  # fxformer.evaluate's JSON for the final step, if written
    config: dict | None = None  # the workdir's config.json, as today's code reads it (`load_workdir_config`)
    unevaluated: list[str] = field(default_factory=list)  # the splits still without results for the final step
    finals: dict = field(default_factory=dict)  # split -> its result file for the final step (`final_result`)
    early_end: int | None = None  # the step at which early stopping ended the run (a plateau), if it did
    # the sweep's decode fields that differ from the config's, which name its results
    decode: dict = field(default_factory=dict)
    average: int = 1  # the checkpoints the sweep's evaluation averages (its --average_last, else the config's)

    @property
    def total_steps(self) -> int | None:
        """The run's last step: where early stopping ended it, else its config's num_train_steps."""
        cfg = self.config or self.status.get("config")
        return self.early_end or (cfg["num_train_steps"] if cfg else None)

    @property
    def step(self) -> int:
        return max([self.logged_step, *self.checkpoint_steps])

    @property
    def attempts(self) -> int:
        return int(self.status.get("attempts", 0))

    def holder(self, lease_s: float = DEFAULT_LEASE_S) -> str | None:
        """Who runs this row now (owner or 'slurm job N'), if anyone else is; else None."""
        owner = self.status.get("owner")
        if not owner:
            return None
        if self.status.get("job_id"):
            return f"slurm job {self.status['job_id']}" if _slurm_job_alive(self.status["job_id"]) else None
        if owner == owner_id():
            return None
        fresh = time.time() - float(self.status.get("heartbeat", 0)) < lease_s
        here = _alive_here(owner)  # a process id on this host: dead at once; alive only with a fresh heartbeat too
        alive = fresh if here is None else here and fresh  # (after a reboot, another process may have its pid)
        return owner if alive else None

    def state(self, lease_s: float = DEFAULT_LEASE_S) -> RowStatus:
        """The row's status from its files, any of the seven RowStatus values (RUNNING and SUBMITTED
        from a live lease); a row evaluated on its first split but not on every other is TRAINED:
        its evaluation goes on."""
        if self.results is not None and not self.unevaluated:
            return RowStatus.FINISHED
        if self.holder(lease_s):
            return RowStatus.SUBMITTED if self.status.get("job_id") else RowStatus.RUNNING
        if self.results is not None:
            return RowStatus.TRAINED
        total = self.total_steps
        if total is not None and self.checkpoint_steps and max(self.checkpoint_steps) >= total:
            return RowStatus.TRAINED
        if self.status.get("state") == RowStatus.FAILED:
            return RowStatus.FAILED
        if self.checkpoint_steps or self.status:
            return RowStatus.STOPPED
        return RowStatus.PENDING

    def eta_s(self) -> float | None:
        """Seconds left for a running row, from its pace since the current attempt began."""
        started, first = self.status.get("started"), self.status.get("start_step", 0)
        total = self.total_steps
        if not started or total is None or self.step <= first:
            return None
        rate = (self.step - first) / max(time.time() - float(started), 1e-9)
        return (total - self.step) / rate


def read(
    workdir: paths.Workdir, eval_split: str, more_splits: list[str] | tuple[str, ...] = (), eval_flags=()
) -> RowState:
    """The row's state from its files (missing files are simply absent state): `results` are those
    of `eval_split`, and a row is finished once `more_splits` have theirs too; `eval_flags`: the
    sweep's evaluation flags, whose `--config.decode.*` name the results where they change the
    search, and whose `--average_last` (else the config's) says how many checkpoints they average."""
    w = paths.Workdir(workdir)
    row = RowState(w)
    if w.sweep_status.exists():
        fix = "delete it and run the sweep again (the row's checkpoints are kept and it resumes)"
        row.status = read_json(w.sweep_status, "the sweep's record of this row", fix)
    logged = metrics.logged(w)
    if w.config.exists():  # checked as every command checks it
        config = load_workdir_config(w)
        row.config = config.to_dict()
        decode_flags = [flag for flag in eval_flags if flag.startswith("--config.decode.")]
        row.decode = configfile.decode_changes(config, configfile.overrides(decode_flags), w)
        row.average = int(flag_value(list(eval_flags), "average_last") or config.average_last)
        c = row.config
        plateau = early.ended_at(
            w, c["best_metric"], c["early_stopping_patience"], logged, c.get("early_stopping_min_delta", 0.0)
        )
        row.early_end = plateau or row.status.get("early_end")  # or, restored from records, what they told
    row.checkpoint_steps = w.checkpoint_steps()
    row.logged_step = logged[-1]["step"] if logged else 0
    row.wall_s = logged[-1].get("wall_s") if logged else None
    total = row.total_steps
    if total is not None:
        splits = (eval_split, *more_splits)
        found = {s: final_result(w, s, total, row.decode, row.average) for s in splits}
        row.finals = {s: path for s, path in found.items() if path is not None}
        if eval_split in row.finals:
            fix = "delete it and run the sweep again to re-evaluate"
            row.results = read_json(row.finals[eval_split], "the row's evaluation", fix)
        row.unevaluated = [s for s in splits if s not in row.finals]
    return row


def final_result(w: paths.Workdir, split: str, step: int, decode: dict, average: int = 1) -> epath.Path | None:
    """`fxformer.evaluate`'s result on `split` for the parameters at the run's last `step`, as the
    sweep evaluates them: the `average` checkpoints ending there (`-avg<k>`; fewer where fewer were
    saved, the most found), the checkpoint alone for 1; None if not written."""
    for k in range(max(average, 1), 0, -1):
        path = w.eval_result(split, [0] * (k - 1) + [step], decode=decode)
        if path.exists():
            return path
    return None


def write_status(workdir: paths.Workdir, status: dict) -> None:
    path = paths.Workdir(workdir).sweep_status
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(path, json.dumps(status, indent=2) + "\n")


class Lease:
    """Hold a row while it runs: claim it, keep a heartbeat in its status file, release it."""

    def __init__(self, workdir: paths.Workdir, status: dict, every_s: float):
        self.workdir, self.status, self.every_s = workdir, dict(status), every_s
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def claim(self) -> bool:
        """Write our ownership, then read it back: False if another launcher claimed it meanwhile."""
        self.update(owner=owner_id(), token=self.token, heartbeat=time.time(), job_id=None)
        time.sleep(0.5)  # a launcher claiming at the same moment overwrites one of the two writes
        path = paths.Workdir(self.workdir).sweep_status
        if read_json(path, "the sweep's record of this row", "run the sweep again").get("token") != self.token:
            return False
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return True

    def update(self, **fields) -> None:
        with self._lock:
            self.status.update(fields)
            write_status(self.workdir, self.status)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.update(heartbeat=time.time())
            except OSError:  # a full disk or a lost bucket: the next beat tries again
                pass

    def release(self, **fields) -> None:
        """Stop the heartbeat and record the outcome; the row is free again."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.update(**{"owner": None, "token": None, **fields})
