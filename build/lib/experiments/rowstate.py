"""What a sweep's run directory `R/<run>` holds, and who runs it now: a status file with a lease.

`R/<run>` is the run's fxformer workdir (config.json, checkpoints/, metrics.jsonl, eval/) plus
`sweep.json`, written by the sweep runner: attempts, the resolved config it started with, the
commit, and while it runs an owner (host, pid) with a heartbeat. A launcher leaves a run alone
while another owner's heartbeat is fresher than the lease (or, on this host, while that pid
lives); a stale run is taken over (marin's executor). SLURM rows are held while their job is
queued or running. Works on local paths and object stores alike (etils.epath).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

from fxformer import paths

DEFAULT_LEASE_S = 300.0


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
    results: dict | None = None  # fxformer.evaluate's JSON for the final step, if written
    config: dict | None = None  # the workdir's config.json

    @property
    def total_steps(self) -> int | None:
        cfg = self.config or self.status.get("config")
        return cfg["num_train_steps"] if cfg else None

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
        alive = _alive_here(owner)
        if alive is None:
            alive = time.time() - float(self.status.get("heartbeat", 0)) < lease_s
        return owner if alive else None

    def state(self, lease_s: float = DEFAULT_LEASE_S) -> str:
        """pending, running, trained (not evaluated), stopped (resumable), failed or finished."""
        if self.results is not None:
            return "finished"
        if self.holder(lease_s):
            return "submitted" if self.status.get("job_id") else "running"
        total = self.total_steps
        if total is not None and self.checkpoint_steps and max(self.checkpoint_steps) >= total:
            return "trained"
        if self.status.get("state") == "failed":
            return "failed"
        if self.checkpoint_steps or self.status:
            return "stopped"
        return "pending"

    def eta_s(self) -> float | None:
        """Seconds left for a running row, from its pace since the current attempt began."""
        started, first = self.status.get("started"), self.status.get("start_step", 0)
        total = self.total_steps
        if not started or total is None or self.step <= first:
            return None
        rate = (self.step - first) / max(time.time() - float(started), 1e-9)
        return (total - self.step) / rate


def read(workdir: paths.Workdir, eval_split: str) -> RowState:
    """The row's state from its files (missing files are simply absent state)."""
    w = paths.Workdir(workdir)
    row = RowState(w)
    status_path = w.sweep_status
    if status_path.exists():
        row.status = json.loads(status_path.read_text())
    if w.config.exists():
        row.config = json.loads(w.config.read_text())
    if w.checkpoints.exists():
        row.checkpoint_steps = sorted(int(p.name) for p in w.checkpoints.iterdir() if p.name.isdigit())
    if w.metrics.exists():
        lines = w.metrics.read_text().strip().splitlines()
        row.logged_step = json.loads(lines[-1])["step"] if lines else 0
    total = row.total_steps
    if total is not None:
        result = w.eval / f"{eval_split}-{total}.json"
        if result.exists():
            row.results = json.loads(result.read_text())
    return row


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
        if json.loads(path.read_text()).get("token") != self.token:
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
