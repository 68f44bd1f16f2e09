"""What the Pallas kernels of this package share: where a kernel runs (compiled by Triton on a
GPU, interpreted elsewhere), how it is called, and the powers of two Triton's tiles are."""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl


def interpreted(interpret: bool | None) -> bool:
    """A kernel's `interpret` argument resolved: None means compiled on a GPU, interpreted elsewhere."""
    return jax.default_backend() != "gpu" if interpret is None else interpret


def compiler_params(interpret: bool):
    """Triton's settings for a compiled kernel (4 warps, 2 pipeline stages); None when interpreted."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu  # noqa: PLC0415 (GPU-only import)

    return plgpu.CompilerParams(num_warps=4, num_stages=2)


def call(kernel, grid: tuple, in_specs, out_specs, out_shape, interpret: bool, name: str):
    """`pl.pallas_call` of `kernel` over `grid`, with `compiler_params` and a name the profiler shows."""
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=compiler_params(interpret),
        interpret=interpret,
        name=name,
    )


def power_of_two(n: int) -> int:
    """The smallest power of two at least n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())
