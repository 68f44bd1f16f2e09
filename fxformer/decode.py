"""Cached incremental decoding: the decoder one target position at a time."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fxformer.model import Transformer, TransformerConfig

Array = jax.Array


def decoding_model(config: TransformerConfig) -> Transformer:
    """The same model, in decode mode (one position per call, key/value cache)."""
    return Transformer(dataclasses.replace(config, decode=True, dropout_rate=0.0))


def init_cache(config: TransformerConfig, batch_size: int, max_len: int) -> dict:
    """An empty key/value cache for `batch_size` rows of up to `max_len` target positions."""
    model = decoding_model(config)
    tokens = jnp.ones((batch_size, max_len), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens[:, :1], tokens))
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])


def decode_step(
    config: TransformerConfig, params, cache: dict, encoded: Array, inputs_segmentation: Array, tokens: Array
) -> tuple[Array, dict]:
    """Previous tokens [b] -> next-token logits [b, vocab] and the updated cache."""
    logits, variables = decoding_model(config).apply(
        {"params": params, "cache": cache},
        encoded,
        inputs_segmentation,
        tokens[:, None],
        method=Transformer.decode,
        mutable=["cache"],
    )
    return logits[:, 0], variables["cache"]
