"""The versions of the packages a run's numbers depend on, as installed here (no JAX import: the
sweeps' records read them too)."""

from __future__ import annotations

import contextlib
import platform
from importlib import metadata

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "sentencepiece", "sacrebleu")  # jaxlib: XLA


def versions() -> dict[str, str]:
    """Python's version and each of `PACKAGES`' installed here (those not installed left out)."""
    out = {"python": platform.python_version()}
    for package in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[package] = metadata.version(package)
    return out
