"""The attention weights of a trained run on a sentence pair: every layer and head of encoder
self-attention, decoder self-attention and encoder-decoder attention, from the teacher-forced
pass with dropout off, as in training (what `fxformer.load(...).attention` returns and the
`attention_maps` command draws).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fxformer import inference
from fxformer.errors import UserError
from fxformer.model import Transformer, TransformerConfig
from fxformer.tokens import BOS_ID

KINDS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "encoder-decoder attention"}


@dataclasses.dataclass(frozen=True)
class Weights:
    """The attention weights of one sentence pair: float32 arrays [layers, heads, queries, keys]."""

    source: str
    target: str
    translated: bool  # the target is the model's own translation
    source_tokens: list[str]  # the source's wordpieces, then </s>
    decoder_inputs: list[str]  # <s>, then the target's wordpieces: what each decoder position reads
    target_tokens: list[str]  # the target's wordpieces, then </s>: what each decoder position predicts
    encoder: np.ndarray  # [N, h, source, source]
    decoder: np.ndarray  # [N, h, target, target]
    cross: np.ndarray  # [N, h, target, source]

    def of(self, kind: str) -> np.ndarray:
        """The weights of `kind` (a key of `KINDS`)."""
        return getattr(self, kind)

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """The tokens that label the (queries, keys) of `kind`."""
        return {
            "encoder": (self.source_tokens, self.source_tokens),
            "decoder": (self.decoder_inputs, self.decoder_inputs),
            "cross": (self.target_tokens, self.source_tokens),
        }[kind]

    def to_json(self) -> dict:
        """Tokens and weights as plain lists: weights[kind][layer][head][query][key], layer and head from 0."""
        return {
            "source": self.source,
            "target": self.target,
            "translated": self.translated,
            "tokens": {
                "source": self.source_tokens,
                "decoder_inputs": self.decoder_inputs,
                "targets": self.target_tokens,
            },
            "axes": {
                "encoder": ["source", "source"],
                "decoder": ["decoder_inputs", "decoder_inputs"],
                "cross": ["targets", "source"],
            },
            "weights": {kind: np.round(self.of(kind).astype(np.float64), 7).tolist() for kind in KINDS},
        }


def teacher_forced_weights(config: TransformerConfig, params, inputs, targets) -> dict[str, jax.Array]:
    """kind -> [batch, N, h, queries, keys]: the post-softmax weights of every layer and head in
    the teacher-forced pass of `inputs` [b, s] and `targets` [b, t] (PAD_ID-padded), dropout off.
    The model's attention sows them (`MultiHeadAttention`, collection `intermediates`)."""
    # the hand-written attention: cuDNN's fused kernel never forms the weights
    model = Transformer(dataclasses.replace(config, attention_impl="xla", decode=False))
    apply = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y, mutable=["intermediates"])[1])
    sown = apply(params, jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32))["intermediates"]

    def stack(side: str, sublayer: str) -> jax.Array:
        layers = [sown[side][f"layer_{i}"][sublayer]["attention_weights"][0] for i in range(config.num_layers)]
        return jnp.stack(layers, axis=1)

    return {
        "encoder": stack("encoder", "self_attention"),
        "decoder": stack("decoder", "self_attention"),
        "cross": stack("decoder", "cross_attention"),
    }


def own_translation(run: inference.Restored, source: str, log=print) -> str:
    """The best translation of `source`, found as `fxformer.translate` finds it: the run's decode
    section, checkpoint(s), batch size and padded length."""
    return inference.translate_sources(run, [source], log=log)[0][0][0]


def check_sentences(source: str, target: str | None) -> None:
    """Refuse an empty source, or an empty target given as such (None: the model's own)."""
    if not source.strip():
        raise UserError("The source sentence is empty; give one with --source.")
    if target is not None and not target.strip():
        raise UserError("The target sentence is empty; give a translation, or leave --target out to use the model's.")


def check_length(what: str, n: int, limit: int, why: str) -> None:
    """Refuse a sentence of `n` wordpieces beyond `limit` (`why` says where the limit comes from)."""
    if n > limit:
        raise UserError(
            f"The {what} has {n} wordpieces (with the end-of-sentence mark) but this model takes at most {limit} "
            f"({why}); give a shorter sentence."
        )


def pair_weights(run: inference.Restored, source: str, target: str | None = None, log=print) -> Weights:
    """Every attention weight of the restored `run` (`fxformer.load(...).restored`) on `source` and `target`
    (None: the model's own translation), with the wordpieces that label them. Unknown
    characters become the tokenizer's <unk>, as in training."""
    check_sentences(source, target)
    c, tokenizer = run.model.config, run.tokenizer
    source_ids = tokenizer.encode_source(source)
    translated = target is None
    if translated:  # as translate does, but refused rather than cut: the figures show the whole sentence
        extra = run.decode.max_extra
        why = f"model.max_len {c.max_len} less decode.max_extra {extra} for its translation"
        check_length("source", len(source_ids), c.max_len - extra, why)
        target = own_translation(run, source, log)
    else:
        check_length("source", len(source_ids), c.max_len, f"model.max_len {c.max_len}")
    target_ids = tokenizer.encode_target(target)
    check_length("target", len(target_ids), c.max_len, f"model.max_len {c.max_len}")
    found = jax.device_get(teacher_forced_weights(c, run.params, source_ids[None], target_ids[None]))
    pieces = [tokenizer.piece(i) for i in target_ids]
    return Weights(
        source=source,
        target=target,
        translated=translated,
        source_tokens=[tokenizer.piece(i) for i in source_ids],
        decoder_inputs=[tokenizer.piece(BOS_ID), *pieces[:-1]],
        target_tokens=pieces,
        **{kind: np.asarray(a[0], np.float32) for kind, a in found.items()},
    )
