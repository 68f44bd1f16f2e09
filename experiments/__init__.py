"""Launching fxformer runs (local processes, Cloud TPU pods, SLURM) and sweeps over them; imports no JAX."""
