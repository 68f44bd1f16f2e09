"""Programs that measure fxformer on an accelerator (gpu/: the GPU run queue, its option variants,
the Flax WMT peer, diagnostics), run as modules from a checkout: `python -m benchmarks.gpu.queue`.
They import JAX; experiments/ (the launcher and sweeps) does not. Their records are kept in
experiments/results/gpu/."""
