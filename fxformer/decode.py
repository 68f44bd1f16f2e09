"""Cached incremental decoding, greedy search and beam search.

The decoder runs one target position at a time with a key/value cache; `beam_search` is the
paper's decoder (beam 4, length penalty 0.6, maximum length input + 50, early stopping).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fxformer.model import Transformer, TransformerConfig
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID

Array = jax.Array


def decoding_model(config: TransformerConfig) -> Transformer:
    """The same model, in decode mode (one position per call, key/value cache)."""
    return Transformer(dataclasses.replace(config, decode=True, dropout_rate=0.0))


def init_cache(config: TransformerConfig, params, encoded: Array, inputs_segmentation: Array, max_len: int) -> dict:
    """The decoding cache of a batch: empty self-attention slots for `max_len` target positions,
    and every layer's encoder-decoder keys and values, projected once from `encoded`."""
    tokens = jnp.full((encoded.shape[0], max_len), BOS_ID, jnp.int32)
    _, variables = decoding_model(config).apply(
        {"params": params}, encoded, inputs_segmentation, tokens, method=Transformer.decode, mutable=["cache"]
    )
    return variables["cache"]


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


# ---------------------------------------------------------------------------------------------
# Greedy and beam search (section 6.1), compiled as `lax.while_loop`s


def length_penalty(length: Array, alpha: float) -> Array:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha; |Y| counts the output tokens, EOS included."""
    return ((5.0 + length) / 6.0) ** alpha


def _start(config: TransformerConfig, params, inputs: Array, copies: int, max_extra: int):
    """Encode once; repeat the encoder output `copies` times per example; the decoding cache;
    per-example length limits."""
    model = decoding_model(config)
    segmentation = (inputs != PAD_ID).astype(jnp.int32)
    encoded = model.apply({"params": params}, inputs, segmentation, method=Transformer.encode)
    limit = segmentation.sum(-1) + max_extra  # maximum output length = input length + 50
    encoded, segmentation = jnp.repeat(encoded, copies, axis=0), jnp.repeat(segmentation, copies, axis=0)
    max_len = inputs.shape[1] + max_extra
    return encoded, segmentation, limit, max_len, init_cache(config, params, encoded, segmentation, max_len)


def _next_log_probs(config, params, cache, encoded, segmentation, tokens):
    """Log-probabilities of the next token [rows, vocab]; PAD and BOS are never produced."""
    logits, cache = decode_step(config, params, cache, encoded, segmentation, tokens)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return log_probs.at[:, jnp.array([PAD_ID, BOS_ID])].set(-jnp.inf), cache


def greedy_search(config: TransformerConfig, params, inputs: Array, max_extra: int = 50) -> tuple[Array, Array]:
    """The most probable next token at every step: (outputs [b, max_len], summed log-probabilities [b])."""
    b = inputs.shape[0]
    encoded, segmentation, limit, max_len, cache = _start(config, params, inputs, 1, max_extra)

    def cond(s):
        return (s["t"] < max_len) & ~s["done"].all()

    def body(s):
        log_probs, cache = _next_log_probs(config, params, s["cache"], encoded, segmentation, s["last"])
        token = jnp.where(s["done"], PAD_ID, jnp.argmax(log_probs, axis=-1))
        logp = s["logp"] + jnp.where(s["done"], 0.0, jnp.take_along_axis(log_probs, token[:, None], -1)[:, 0])
        outputs = s["outputs"].at[:, s["t"]].set(token)
        done = s["done"] | (token == EOS_ID) | (s["t"] + 1 >= limit)
        return {"t": s["t"] + 1, "last": token, "outputs": outputs, "logp": logp, "done": done, "cache": cache}

    state = {
        "t": jnp.zeros((), jnp.int32),
        "last": jnp.full((b,), BOS_ID, jnp.int32),
        "outputs": jnp.full((b, max_len), PAD_ID, jnp.int32),
        "logp": jnp.zeros((b,), jnp.float32),
        "done": jnp.zeros((b,), bool),
        "cache": cache,
    }
    state = jax.lax.while_loop(cond, body, state)
    return state["outputs"], state["logp"]


def _gather_beams(cache: dict, parents: Array, batch: int, beam: int) -> dict:
    """Reorder the per-row self-attention cache ([batch * beam, ...]) by `parents` [batch, beam].

    Scalar indices are shared by all rows, and the encoder-side `memory_*` keys and values are
    the same for every beam of an example: both stay as they are.
    """

    def gather(path, x):
        if x.ndim == 0 or "memory" in jax.tree_util.keystr(path):
            return x
        x = x.reshape(batch, -1, *x.shape[1:])
        x = jnp.take_along_axis(x, parents.reshape(batch, beam, *([1] * (x.ndim - 2))), axis=1)
        return x.reshape(batch * beam, *x.shape[2:])

    return jax.tree_util.tree_map_with_path(gather, cache)


def beam_search(
    config: TransformerConfig,
    params,
    inputs: Array,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_extra: int = 50,
    early_stop: bool = True,
) -> tuple[Array, Array]:
    """Beam search with GNMT length penalty: (outputs [b, beam, max_len], scores [b, beam]), best first.

    Each step keeps the `beam_size` best extensions of the live hypotheses. One that ends (EOS,
    or its example's maximum length, input length + `max_extra`) moves to the finished set with
    score log-probability / lp(|Y|) and leaves the beam for that step; with beam 1 this is greedy
    search. The search stops early once no live hypothesis can beat the `beam_size` finished
    ones: a live log-probability only falls, and its penalty is largest at the maximum length.
    `early_stop=False` runs to the maximum length instead (same result, for checking).
    """
    b, k = inputs.shape[0], beam_size
    encoded, segmentation, limit, max_len, cache = _start(config, params, inputs, k, max_extra)
    best_possible = lambda live_logp: live_logp.max(-1) / length_penalty(limit, alpha)

    def cond(s):
        worst_finished = s["finished_scores"][:, -1]
        done = worst_finished >= best_possible(s["live_logp"])  # -inf >= -inf: no live hypothesis left
        return (s["t"] < max_len) & ~(early_stop & done.all())

    def body(s):
        t = s["t"]
        last = s["live_seqs"][:, :, t].reshape(b * k)
        log_probs, cache = _next_log_probs(config, params, s["cache"], encoded, segmentation, last)
        vocab = log_probs.shape[-1]
        candidates = (s["live_logp"][:, :, None] + log_probs.reshape(b, k, vocab)).reshape(b, k * vocab)
        top_logp, top = jax.lax.top_k(candidates, k)
        parent, token = top // vocab, top % vocab
        seqs = jnp.take_along_axis(s["live_seqs"], parent[:, :, None], axis=1).at[:, :, t + 1].set(token)
        length = t + 1
        ends = (token == EOS_ID) | (length >= limit[:, None])
        live_logp = jnp.where(ends, -jnp.inf, top_logp)  # an ended hypothesis leaves the beam
        cache = _gather_beams(cache, parent, b, k)

        scores = jnp.where(ends, top_logp / length_penalty(length, alpha), -jnp.inf)
        all_scores = jnp.concatenate([s["finished_scores"], scores], axis=1)
        all_seqs = jnp.concatenate([s["finished_seqs"], seqs], axis=1)
        finished_scores, best = jax.lax.top_k(all_scores, k)
        finished_seqs = jnp.take_along_axis(all_seqs, best[:, :, None], axis=1)
        return {
            "t": t + 1,
            "live_seqs": seqs,
            "live_logp": live_logp,
            "finished_seqs": finished_seqs,
            "finished_scores": finished_scores,
            "cache": cache,
        }

    seqs = jnp.full((b, k, max_len + 1), PAD_ID, jnp.int32).at[:, :, 0].set(BOS_ID)
    state = {
        "t": jnp.zeros((), jnp.int32),
        "live_seqs": seqs,
        "live_logp": jnp.full((b, k), -jnp.inf).at[:, 0].set(0.0),  # one live start, no duplicates
        "finished_seqs": seqs,
        "finished_scores": jnp.full((b, k), -jnp.inf),
        "cache": cache,
    }
    state = jax.lax.while_loop(cond, body, state)
    return state["finished_seqs"][:, :, 1:], state["finished_scores"]
