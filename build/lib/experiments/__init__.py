"""Launching fxformer runs (local processes, Cloud TPU pods, SLURM) and, next, sweeps; imports no JAX."""
