"""The versions of the packages a run's numbers depend on, as installed here, and the host's CPU
(no JAX import: the sweeps' records read them too)."""

from __future__ import annotations

import contextlib
import platform
from importlib import metadata
from pathlib import Path

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "sentencepiece", "sacrebleu")  # jaxlib: XLA


def versions() -> dict[str, str]:
    """Python's version and each of `PACKAGES`' installed here (those not installed left out)."""
    out = {"python": platform.python_version()}
    for package in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[package] = metadata.version(package)
    return out


VECTOR_EXTENSIONS = ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd")  # the widest first


def cpu(cpuinfo: str | None = None) -> str:
    """The host's CPU model and its widest vector extension ("Intel(R) Xeon(R) Processor, avx512f"):
    XLA compiles a CPU run for the host's instruction set, so the same run can differ in its last
    bits, and after training in its figures, between CPUs. `cpuinfo`: /proc/cpuinfo's text (Linux;
    elsewhere the platform's processor name alone)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    model = fields.get("model name") or platform.processor() or platform.machine()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    widest = next((name for name in VECTOR_EXTENSIONS if name in flags), None)
    return f"{model}, {widest}" if widest else model
