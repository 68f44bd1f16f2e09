"""Batched translation with a trained model: the jitted beam search over the devices at hand,
source lengths, progress, and sacreBLEU on the outputs. Used by `evaluate`, `translate` and the
training loop's dev BLEU; imports no training code.
"""

from __future__ import annotations

import functools
import sys
import time

import jax
import numpy as np
import sacrebleu
from jax.experimental import multihost_utils

from fxformer import decode, parallel
from fxformer.data import pipeline
from fxformer.data.tokenizer import Tokenizer
from fxformer.metrics import duration


def progress(done: int, total: int, start: float, what: str) -> None:
    """`what: done/total, ETA` on stderr: one line rewritten in place on a terminal; in a log
    file, a line at every tenth of the work (no carriage returns)."""
    elapsed = time.time() - start
    eta = duration(elapsed / done * (total - done)) if done else "?"
    if sys.stderr.isatty():
        end = "\n" if done == total else ""
        print(f"\r{what}: {done}/{total} ETA {eta}   ", end=end, file=sys.stderr, flush=True)
    elif done == total or done * 10 // total != (done - 1) * 10 // total:
        print(f"{what}: {done}/{total} ETA {eta}", file=sys.stderr, flush=True)


def translator(model, mesh, beam_size: int, alpha: float, max_extra: int):
    """A jitted (params, inputs [b, l]) -> best outputs [b, l + max_extra], rows split over devices."""
    search = functools.partial(decode.beam_search, model.config, beam_size=beam_size, alpha=alpha, max_extra=max_extra)
    best = lambda params, inputs: search(params, inputs)[0][:, 0]  # noqa: E731
    return jax.jit(
        best,
        in_shardings=(parallel.replicated(mesh), parallel.sharded_rows(mesh)),
        out_shardings=parallel.sharded_rows(mesh),
    )


def translate_examples(
    translate, params, examples: list[dict], tokenizer: Tokenizer, batch_size: int, length: int, mesh,
    what: str | None,
) -> list[str]:  # fmt: skip
    """Detokenized best translation of every example's `inputs`, in order; progress on stderr
    as `what` (None: quiet)."""
    out = [""] * len(examples)
    batch_size = parallel.round_to_devices(batch_size)
    batches = list(pipeline.eval_batches(examples, batch_size, length, jax.process_index(), jax.process_count()))
    start = time.time()
    for i, batch in enumerate(batches):
        inputs = parallel.global_batch(mesh, {"inputs": batch["inputs"]})["inputs"]
        outputs = multihost_utils.process_allgather(translate(params, inputs), tiled=True)
        index = multihost_utils.process_allgather(batch["index"], tiled=False).reshape(-1)
        for row, j in zip(np.asarray(outputs), index):
            if j >= 0:
                out[j] = tokenizer.decode(row)
        if what:
            progress(i + 1, len(batches), start, what)
    return out


def source_length(examples: list[dict], model, max_decode_extra: int, log=print) -> int:
    """Padded source length for beam search, leaving room for input + max_decode_extra output positions."""
    limit = model.config.max_len - max_decode_extra
    longer = sum(len(e["inputs"]) > limit for e in examples)
    if longer:
        log(
            f"warning: {longer} of {len(examples)} sources are cut to {limit} tokens (model.max_len - max_decode_extra)"
        )
    return pipeline.eval_length(examples, limit)


def bleu(hypotheses: list[str], references: list[str]) -> tuple[sacrebleu.metrics.bleu.BLEUScore, str]:
    """Corpus sacreBLEU with its default settings (13a tokenization, exact match), and its signature."""
    metric = sacrebleu.metrics.BLEU()
    return metric.corpus_score(hypotheses, [references]), str(metric.get_signature())


class DevBleu:
    """BLEU on the first `sentences` of the dev split during training: beam search with the
    config's beam and alpha, compiled once."""

    def __init__(self, model, mesh, config, source, tokenizer: Tokenizer, log=print):
        data = config.data
        n = min(config.get("dev_bleu_sentences", 0) or len(source), len(source))
        self.examples = pipeline.tokenize_split(source, tokenizer, data, n)
        self.references = [source[i][data.target_lang].decode("utf-8") for i in range(n)]
        self.length = source_length(self.examples, model, config.max_decode_extra, log)
        self.translate = translator(model, mesh, config.beam_size, config.alpha, config.max_decode_extra)
        self.tokenizer, self.batch_size, self.mesh = tokenizer, data.eval_batch_size, mesh

    def __call__(self, params) -> float:
        hypotheses = translate_examples(
            self.translate, params, self.examples, self.tokenizer, self.batch_size, self.length, self.mesh, None
        )
        return bleu(hypotheses, self.references)[0].score
