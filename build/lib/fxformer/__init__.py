"""fxformer: the original Transformer ("Attention Is All You Need") in JAX/Flax."""
