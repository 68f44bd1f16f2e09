"""Data parallelism over every device of every process: a 1-D `Mesh('data')`.

The semantics of pmap, written with `jax.jit` and shardings: parameters and optimizer state
are replicated, each batch is split along its rows over the devices, and XLA averages the
gradients across all of them. Each process feeds only its own slice of the global batch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from fxformer.errors import UserError


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1) -> None:
    """Join a multi-process run (a TPU pod slice, several GPU hosts) before touching devices.

    With no arguments JAX finds the cluster itself (Cloud TPU, SLURM, Open MPI);
    the arguments name it explicitly, e.g. a coordinator on localhost for tests.
    """
    if not coordinator_address and "SLURM_JOB_ID" in os.environ and "SLURM_STEP_NODELIST" not in os.environ:
        raise UserError(  # JAX would fail obscurely: only srun tells each task its rank and the node list
            "--distributed inside a SLURM job needs one process per task started by srun "
            "(srun python -m fxformer.train --distributed ...), not python run directly in the batch script."
        )
    # fxformer's train loop agrees on SIGTERM itself (lifecycle.StopRequest); JAX's pre-emption
    # notifier would take the signal away from it.
    jax.config.update("jax_enable_preemption_service", False)
    kwargs = {}
    if coordinator_address:
        kwargs["coordinator_address"] = coordinator_address
    if num_processes:
        kwargs["num_processes"] = num_processes
    if process_id >= 0:
        kwargs["process_id"] = process_id
    jax.distributed.initialize(**kwargs)


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """--distributed, or an explicit --coordinator_address/--num_processes/--process_id."""
    p.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() (TPU pods, SLURM + srun)")
    p.add_argument("--coordinator_address", default="", help="host:port of process 0, for a manual cluster")
    p.add_argument("--num_processes", type=int, default=0, help="processes in a manual cluster")
    p.add_argument("--process_id", type=int, default=-1, help="this process's rank in a manual cluster")


def join_cluster(args: argparse.Namespace) -> None:
    """Join the cluster the flags of `add_cluster_flags` describe, if any."""
    if args.distributed or args.coordinator_address:
        initialize(args.coordinator_address, args.num_processes, args.process_id)


def print_once(*args, **kwargs) -> None:
    """`print` on process 0 alone: every process holds the same results, and a scheduler that
    gathers every process's output into one log should show them once. Outside a cluster it
    prints without asking JAX (which would start its backends: a GPU's memory, a TPU)."""
    if not jax.distributed.is_initialized() or jax.process_index() == 0:
        print(*args, **kwargs)


def data_mesh() -> Mesh:
    """Every device of every process on one 'data' axis."""
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))


def replicated(mesh: Mesh) -> NamedSharding:
    """The same full copy on every device (parameters, optimizer state, scalars)."""
    return NamedSharding(mesh, PartitionSpec())


def sharded_rows(mesh: Mesh) -> NamedSharding:
    """Rows (the leading axis) split over the 'data' axis (batches)."""
    return NamedSharding(mesh, PartitionSpec("data"))


def round_to_devices(batch_size: int) -> int:
    """The smallest multiple of the device count that is at least `batch_size` (eval batches)."""
    n = jax.device_count()
    return max(n, -(-batch_size // n) * n)


def global_batch(mesh: Mesh, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's rows -> global arrays whose rows span all processes: each process's rows on
    its own devices, wherever the mesh puts them (not necessarily in process order: carry what
    identifies a row, e.g. an example's index, as a row of its own)."""
    sharding = sharded_rows(mesh)
    out = {}
    for key, value in local_batch.items():
        if value.shape[0] % jax.local_device_count():
            raise UserError(
                f"A batch of {value.shape[0]} rows per process does not split over "
                f"{jax.local_device_count()} local devices; change data.tokens_per_batch or data.eval_batch_size."
            )
        global_shape = (value.shape[0] * jax.process_count(), *value.shape[1:])
        out[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return out


@contextlib.contextmanager
def process_zero_first(name: str) -> Iterator[None]:
    """The block runs on process 0 first while the others wait at the barrier `name`, then on
    the others (what process 0 wrote, such as a dataset or a tokenizer, they find)."""
    first, others = jax.process_index() == 0, jax.process_count() > 1
    if others and not first:
        multihost_utils.sync_global_devices(name)
    yield
    if others and first:
        multihost_utils.sync_global_devices(name)


def any_process(flags: np.ndarray) -> np.ndarray:
    """Element-wise OR of a small boolean vector over every process (a tiny collective)."""
    return multihost_utils.process_allgather(flags).reshape(-1, flags.shape[-1]).any(axis=0)


class GlobalBatches:
    """Training batches as global arrays on the devices: this process's batches from `batches` (a
    grain iterator), each placed by `global_batch`, `ahead` of them (0 = none) placed before their
    step comes, so that the copy to the devices overlaps the step before (asynchronous dispatch).

    Its state (`get_state`, `set_state`, as orbax's grain handler saves it) is the iterator's at
    the next batch the loop has not taken (batches placed ahead are made again after a restore),
    with the global rows per step it counted batches of (`restored_rows` after a restore).
    """

    def __init__(self, mesh: Mesh, batches, ahead: int = 0, rows: int = 0):
        self.mesh, self.batches, self.ahead, self.rows = mesh, batches, ahead, rows
        self.placed: list[tuple[dict, dict, dict]] = []  # (state before, local batch, global batch)
        self.restored_rows: int | None = None  # the rows per step of the restored state (None: not recorded)

    def __iter__(self):
        return self

    def _place(self) -> None:
        state = self.batches.get_state() if self.ahead else None
        local = next(self.batches)
        self.placed.append((state, local, global_batch(self.mesh, local)))

    def __next__(self) -> tuple[dict[str, np.ndarray], dict[str, jax.Array]]:
        """(this process's rows, the global batch) of the next step."""
        if not self.placed:
            self._place()
        _, local, placed = self.placed.pop(0)
        while len(self.placed) < self.ahead:
            self._place()
        return local, placed

    def get_state(self) -> bytes:
        state = self.placed[0][0] if self.placed else self.batches.get_state()
        return json.dumps({"rows_per_step": self.rows, "iterator": state}, indent=4).encode()

    def set_state(self, state: bytes) -> None:
        self.placed.clear()
        saved = json.loads(state)
        if isinstance(saved, dict) and saved.keys() == {"rows_per_step", "iterator"}:
            self.restored_rows, saved = saved["rows_per_step"] or None, saved["iterator"]
        self.batches.set_state(saved)  # a checkpoint written before 2026-11-27: the iterator's state alone

    def start_prefetch(self) -> None:  # orbax's grain handler calls it after a restore
        pass
