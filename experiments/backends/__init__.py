"""Where runs go: one module per backend, each implementing `base.Backend` and returning a
`base.Launched`; a new one (GKE, Ray) is one more module and one more entry in `BACKENDS`.

    local  N processes on this machine, a loopback coordinator (the offline stand-in for a pod)
    tpu    a Cloud TPU VM slice through gcloud: sync, set up, one ssh per worker
    slurm  an sbatch script, one srun task per GPU, requeued after a pre-emption
"""

from __future__ import annotations

import argparse

from experiments.backends.base import Backend, Launched, Outcome
from experiments.backends.local import Local
from experiments.backends.slurm import Slurm
from experiments.backends.tpu import Tpu

BACKENDS = {"local": Local, "tpu": Tpu, "slurm": Slurm}
__all__ = ["BACKENDS", "Backend", "Launched", "Outcome", "add_flags", "backend_for"]


def backend_for(args: argparse.Namespace, echo: bool = True, handle_signals: bool = True) -> Backend:
    """The backend `--backend` names, configured by its flags. `echo`: process 0's output to our
    stdout; `handle_signals`: SIGTERM/Ctrl-C caught by the launch itself (only in the main thread;
    a launch in a thread is stopped through `interrupt`)."""
    return BACKENDS[args.backend](args, echo=echo, handle_signals=handle_signals)


def add_flags(p: argparse.ArgumentParser) -> None:
    """Where runs go, and each backend's own flags (shared by launch and the sweep verbs)."""
    p.add_argument("--backend", choices=list(BACKENDS), default="local", help="where to run (local)")
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true", help="print, run nothing")
    p.add_argument("--grace_s", type=float, default=120.0, help="seconds to let processes save before a kill")
    local = p.add_argument_group("local backend")
    local.add_argument("--processes", type=int, default=1, help="processes on this machine (loopback coordinator)")
    local.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
    tpu = p.add_argument_group("tpu backend (gcloud)")
    tpu.add_argument("--tpu", default="", help="TPU VM name")
    tpu.add_argument("--zone", default="", help="its zone, e.g. us-central2-b")
    tpu.add_argument("--project", default="", help="Google Cloud project (default: gcloud's)")
    tpu.add_argument("--workers", type=int, default=0, help="hosts in the slice (default: asked from gcloud)")
    tpu.add_argument("--accelerator_type", default="", help="e.g. v4-32: lets --retries re-create a pre-empted TPU")
    tpu.add_argument("--runtime_version", default="", help="TPU VM image for re-creation, e.g. tpu-ubuntu2204-base")
    tpu.add_argument("--commit", default="HEAD", help="the git commit whose code runs (sync)")
    slurm = p.add_argument_group("slurm backend (sbatch + srun)")
    slurm.add_argument("--nodes", type=int, default=1, help="nodes")
    slurm.add_argument("--gpus_per_node", type=int, default=8, help="GPUs per node: one process each")
    slurm.add_argument("--cpus_per_task", type=int, default=0, help="CPUs per process (default: SLURM's)")
    slurm.add_argument("--time", default="", help="time limit, e.g. 24:00:00")
    slurm.add_argument("--partition", default="", help="partition")
    slurm.add_argument("--account", default="", help="account")
    slurm.add_argument("--python", default=".venv/bin/python", help="the cluster's Python with fxformer's requirements")
