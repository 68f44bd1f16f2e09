"""Inference with a trained run, in one place: restore a workdir's parameters (never its optimizer
state) onto the devices at hand (one checkpoint, the average of k, or the best by dev metric),
the dev loss, the model's step function for the searches in `decode`, batched translation with
n-best scores, sacreBLEU. Used by `evaluate`, `translate`, `attention_maps` and the training loop
(dev loss, dev BLEU). Wherever a model is taken, an `ensemble.Ensemble` may stand in its place,
with a tuple of its members' parameters in place of one tree.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import sacrebleu
from jax.experimental import multihost_utils

from fxformer import checkpoint, configfile, decode, ensemble, marian, optim, parallel, paths, schema, trainstate
from fxformer.config import DecodeOptions, ema_decays, load_workdir_config, resolve_derived, validate
from fxformer.data import corpora, pipeline, tokenized
from fxformer.data.tokenizer import Tokenizer, workdir_tokenizer
from fxformer.errors import UserError
from fxformer.metrics import per_token
from fxformer.model import Transformer, TransformerConfig, default_segmentation, grow_cache
from fxformer.timefmt import duration
from fxformer.tokens import BOS_ID, PAD_ID

Array = jax.Array

# ---------------------------------------------------------------------------------------------
# A workdir, restored


@dataclasses.dataclass(frozen=True)
class Restored:
    """A training workdir, ready for inference (read by attribute)."""

    config: ml_collections.ConfigDict  # the run's config, with any decode overrides (an ensemble: its first member's)
    model: Transformer | ensemble.Ensemble
    tokenizer: Tokenizer
    params: Any  # an ensemble: a tuple of its members' parameters
    steps: list[int]  # the checkpoint steps whose parameters these are (averaged if several; an ensemble: [])
    mesh: jax.sharding.Mesh
    trained_decode: dict | None = None  # the trained run's decode section, before any overrides

    @property
    def decode_changes(self) -> dict:
        """The decode fields the overrides set to another value than the trained run's ({"alpha":
        1.5}): what names an evaluation's results (`paths.Workdir.eval_result`)."""
        return configfile.changed_decode(self.trained_decode or self.config.decode, self.config.decode)

    @property
    def decode(self) -> DecodeOptions:
        """The config's decode section, with any overrides, as the searches take it."""
        return DecodeOptions.of(self.config.decode)


def restore(
    workdir: paths.Workdir,
    step: int | str = "latest",
    average_last: int | None = None,
    overrides=(),
    log=print,
    keep_average: bool = True,
) -> Restored:
    """A workdir's config, model, tokenizer and parameters, on the devices at hand. Only the
    parameters are read from a checkpoint, never the optimizer's state (but for smoothed weights,
    which the optimizer state keeps: those alone are read).

    `step`: "latest" (the last checkpoint saved), "best" (the best dev metric seen in training,
    kept in `W/best`), a step number, or "ema" (the latest checkpoint's smoothed weights of the
    run's first `ema_decay`; "ema0.999" names one decay). `average_last`: k >= 1 averages the parameters of the k
    checkpoints that end at `step` (1: that checkpoint alone); None: the config's
    `average_last` for "latest", 1 otherwise. An average is saved under
    `W/averaged/last<k>/<last step>` and reused (`keep_average=False`: reused if saved, else
    computed in memory only). `overrides`: (key, value) pairs of the decode section.
    """
    smoothing = isinstance(step, str) and step.startswith("ema")
    if not (step in ("latest", "best") or smoothing or isinstance(step, int) and not isinstance(step, bool)):
        raise UserError(f"The checkpoint to restore is 'latest', 'best', 'ema' or a step number, not {step!r}.")
    if average_last is not None and average_last < 1:
        raise UserError(f"average_last must be positive (1: no averaging), not {average_last}.")
    if step == "best" and (average_last or 1) > 1:
        raise UserError(f"{workdir.best} keeps one checkpoint: the best is not averaged (average_last {average_last}).")
    if smoothing and (average_last or 1) > 1:
        raise UserError(
            f"The smoothed weights ({step}) are an average already: give no average_last (--average_last), not "
            f"{average_last}."
        )
    trained = load_workdir_config(workdir)  # the one read of W/config.json
    config = configfile.apply_decode_overrides(trained.copy_and_resolve_references(), overrides, workdir)
    decay = smoothed_decay(workdir, step, config) if smoothing else None
    if average_last is None:  # the config's for the latest checkpoint; a named one alone
        average_last = config.average_last if step == "latest" else 1
    tokenizer = workdir_tokenizer(workdir)
    if tokenizer is None:
        raise UserError(f"{workdir} has no tokenizer.model; is it a training workdir?")
    mesh = parallel.data_mesh()
    model = trainstate.model_of(config, tokenizer.vocab_size)
    abstract_params = trainstate.abstract_params(model, mesh)
    interval = config.checkpoint_every_steps
    if decay is not None:
        ema, at = checkpoint.smoothed_params(workdir, optim.ema_key(decay), abstract_params)
        params, steps = optim.smoothed(ema, decay, at), [at]
        log(f"smoothed weights: decay {decay:g} at step {at}")
    else:
        params, steps = checkpoint.workdir_params(
            workdir, step, average_last, abstract_params, log=log, keep_average=keep_average, interval=interval
        )
    return Restored(config, model, tokenizer, params, steps, mesh, trained.decode.to_dict())


def smoothed_decay(workdir: paths.Workdir, step: str, config) -> float:
    """The decay `step` names ("ema": the run's first `ema_decay`; "ema0.999"), refused in one
    sentence where the run kept no such smoothed weights."""
    decays = ema_decays(config)
    if not decays:
        raise UserError(
            f"{workdir} was trained without smoothed weights (ema_decay 0): evaluate a checkpoint (--step=latest), "
            "or train with --config.ema_decay=0.9999."
        )
    try:
        decay = decays[0] if step == "ema" else float(step[3:])
    except ValueError:
        decay = None
    if decay not in decays:
        kept = ", ".join(f"ema{d:g}" for d in decays)
        raise UserError(f"{workdir} keeps smoothed weights {kept}, not {step}: give --step=ema or one of them.")
    return decay


def restore_marian(path, overrides=()) -> Restored:
    """A Marian directory written by transformers (`fxformer.marian`), ready for inference: fxformer's
    default config with the model section the import reads, and the imported parameters on the
    devices at hand (replicated). `overrides`: (key, value) pairs of the decode section."""
    fields, params, tokenizer = marian.read(path)
    config = schema.defaults()
    config.model.update(fields)
    config.data.max_length = min(config.data.max_length, fields["max_len"])
    resolve_derived(config)
    validate(config)
    trained = config.decode.to_dict()
    config = configfile.apply_decode_overrides(config, overrides, path)
    mesh = parallel.data_mesh()
    model = trainstate.model_of(config, tokenizer.vocab_size)
    abstract = trainstate.abstract_params(model, mesh)
    if jax.tree.structure(abstract) != jax.tree.structure(params):
        raise UserError(f"{path}: the imported parameters do not make the model its config.json describes.")
    params = jax.tree.map(lambda a, p: jax.device_put(jnp.asarray(p, jnp.float32), a.sharding), abstract, params)
    return Restored(config, model, tokenizer, params, [], mesh, trained)


# ---------------------------------------------------------------------------------------------
# The dev loss, and teacher-forced log-probabilities


def max_len(model: Transformer | ensemble.Ensemble) -> int:
    """The positions `model` encodes and decodes (an ensemble: those every member does)."""
    return ensemble.of(model).max_len


def log_probs(model: Transformer | ensemble.Ensemble, params, inputs: Array, targets: Array) -> Array:
    """Teacher-forced next-token log-probabilities [b, l, vocab] in float32, dropout off (an
    ensemble: its members' combined, `ensemble.combine`)."""
    members = ensemble.of(model)
    each = [
        jax.nn.log_softmax(m.apply({"params": p}, inputs, targets, deterministic=True).astype(jnp.float32), axis=-1)
        for m, p in zip(members.models, ensemble.params_of(model, params), strict=True)
    ]
    return ensemble.combine(each, members.average)


def ensemble_loss_sums(params, batch: dict, model: ensemble.Ensemble, label_smoothing: float) -> dict[str, Array]:
    """`optim.loss_sums` of an ensemble's combined distribution on a padded batch (dropout off)."""
    combined = log_probs(model, params, batch["inputs"], batch["targets"])  # normalized: its own logits
    return optim.cross_entropy_sums(combined, batch["targets"], optim.target_weights(batch), label_smoothing)


def loss_step(model: Transformer | ensemble.Ensemble, label_smoothing: float, mesh, chunk: int = 0):
    """A jitted (params, padded batch) -> summed loss / NLL / accuracy / tokens, rows split over
    devices (`chunk`: as in `optim.loss_sums`; an ensemble's members are not chunked)."""
    if isinstance(model, ensemble.Ensemble):
        sums = functools.partial(ensemble_loss_sums, model=model, label_smoothing=label_smoothing)
    else:
        sums = functools.partial(optim.loss_sums, model=model, label_smoothing=label_smoothing, chunk=chunk)
    return jax.jit(
        sums,
        in_shardings=(parallel.replicated(mesh), parallel.sharded_rows(mesh)),
        out_shardings=parallel.replicated(mesh),
    )


def dev_loss(
    jit_loss_step, params, examples: list[dict], config, mesh, max_len: int, prefix: str = ""
) -> dict[str, float]:
    """Per-token loss, NLL, perplexity and accuracy over `examples` (keys with `prefix`), each
    counted once (`jit_loss_step`: a compiled `loss_step`)."""
    length = pipeline.eval_length(examples, max_len)
    totals = dict.fromkeys(optim.SUMS, 0.0)
    batch_size = parallel.round_to_devices(config.data.eval_batch_size)
    for batch in pipeline.eval_batches(examples, batch_size, length, jax.process_index(), jax.process_count()):
        batch.pop("index")
        sums = jax.device_get(jit_loss_step(params, parallel.global_batch(mesh, batch)))
        for key in totals:
            totals[key] += float(sums[key])
    return per_token(totals, prefix)


# ---------------------------------------------------------------------------------------------
# The model's step function, and the searches over it


def decoding_model(config: TransformerConfig) -> Transformer:
    """The same model, in decode mode (one position per call, key/value cache)."""
    return Transformer(dataclasses.replace(config, decode=True, dropout_rate=0.0))


class Decoding(NamedTuple):
    """What a search needs: the step function, its initial cache, each example's length limit."""

    step: decode.StepFn  # (previous tokens [rows], cache) -> (next-token log-probs [rows, vocab], cache)
    cache: Any  # per-row self-attention keys and values of every decoder layer (+ shared counters)
    limit: Array  # [batch] maximum output length: input length + max_extra
    max_len: int  # output positions: padded input length + max_extra
    grow: decode.GrowFn  # (cache, length) -> the cache with room for `length` positions


def start_decoding(
    config: TransformerConfig | ensemble.Ensemble, params, inputs: Array, copies: int, max_extra: int
) -> Decoding:
    """What the searches take, for a model (its config) or an ensemble (`model_decoding` of each
    member, their caches a tuple, their next-token distributions combined at every step). Every
    search leaves PAD and BOS out: their log-probabilities are set to -inf (after the combination)."""
    if isinstance(config, ensemble.Ensemble):
        members = [
            model_decoding(m.config, p, inputs, copies, max_extra) for m, p in zip(config.models, params, strict=True)
        ]
        d = members[0] if len(members) == 1 else combined(members, config.average)
    else:
        d = model_decoding(config, params, inputs, copies, max_extra)

    def step(tokens: Array, cache) -> tuple[Array, Any]:
        log_probs, cache = d.step(tokens, cache)
        return log_probs.at[:, jnp.array([PAD_ID, BOS_ID])].set(-jnp.inf), cache

    return d._replace(step=step)


def combined(members: list[Decoding], average: str) -> Decoding:
    """The members' decodings as one: each steps with its own cache (the tuple of theirs), and the
    next-token log-probabilities are `ensemble.combine`d."""

    def step(tokens: Array, caches: tuple) -> tuple[Array, tuple]:
        stepped = [m.step(tokens, cache) for m, cache in zip(members, caches, strict=True)]
        return ensemble.combine([lp for lp, _ in stepped], average), tuple(cache for _, cache in stepped)

    first = members[0]
    return Decoding(step, tuple(m.cache for m in members), first.limit, first.max_len, grow_cache)


def model_decoding(config: TransformerConfig, params, inputs: Array, copies: int, max_extra: int) -> Decoding:
    """Encode `inputs` [batch, l] once and project every decoder layer's encoder-side keys and
    values once (the `memory` collection, held by the step function, one per example, never
    reordered); rows are each example repeated `copies` times (beams, samples). The step gives
    the model's full next-token log-softmax. The cache starts with room for the first of
    `decode.cache_lengths(max_len)` positions and is grown as the search goes."""
    model = decoding_model(config)
    segmentation = default_segmentation(inputs)
    encoded = model.apply({"params": params}, inputs, segmentation, method=Transformer.encode)
    max_len = inputs.shape[1] + max_extra
    sizing = jnp.full((inputs.shape[0], decode.cache_lengths(max_len)[0]), BOS_ID, jnp.int32)  # and projects the memory
    _, variables = model.apply(
        {"params": params}, encoded, segmentation, sizing, method=Transformer.decode, mutable=["cache", "memory"]
    )
    repeat = lambda x: x if x.ndim == 0 else jnp.repeat(x, copies, axis=0)  # noqa: E731
    memory = variables["memory"]  # one per example, shared by its rows
    segmentation_rows = repeat(segmentation)

    def step(tokens: Array, cache) -> tuple[Array, Any]:
        logits, updated = model.apply(
            {"params": params, "memory": memory, "cache": cache},
            encoded,  # unused once the memory is projected
            segmentation_rows,
            tokens[:, None],
            method=Transformer.decode,
            mutable=["cache"],
        )
        logits = logits[:, 0].astype(jnp.float32)
        # log_softmax's own form (logits - max - log sum exp) is 2.3x slower at 128 rows x 37,000 on
        # XLA's CPU, which fuses its max and subtraction into the projection's product.
        return logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True), updated["cache"]

    cache = jax.tree.map(repeat, variables["cache"])
    return Decoding(step, cache, segmentation.sum(-1) + max_extra, max_len, grow_cache)


def search(
    config: TransformerConfig | ensemble.Ensemble,
    params,
    inputs: Array,
    options: DecodeOptions,
    rng: Array | None = None,
):
    """The search `options` describe on `inputs` [batch, l]: (outputs [batch, n, max_len], scores
    [batch, n]), best first, n = `nbest`. Scores: beam, log p / lp(|Y|); greedy and sample, log p.
    `config`: a model's, or an ensemble (`params` a tuple of its members')."""
    o = options
    if o.strategy == "beam":
        d = start_decoding(config, params, inputs, o.beam_size, o.max_extra)
        outputs, scores = decode.beam_search(
            d.step, d.cache, d.limit, d.max_len, o.beam_size, o.alpha, o.beam_variant, grow=d.grow
        )
        return outputs[:, : o.nbest], scores[:, : o.nbest]
    n = o.nbest if o.strategy == "sample" else 1
    d = start_decoding(config, params, inputs, n, o.max_extra)
    limit = jnp.repeat(d.limit, n)
    if o.strategy == "greedy":
        outputs, logp = decode.greedy_search(d.step, d.cache, limit, d.max_len, d.grow)
    else:
        outputs, logp = decode.sample_search(d.step, d.cache, limit, d.max_len, rng, o.temperature, o.top_k, d.grow)
    outputs, logp = outputs.reshape(inputs.shape[0], n, -1), logp.reshape(inputs.shape[0], n)
    order = jnp.argsort(-logp, axis=1)
    return jnp.take_along_axis(outputs, order[:, :, None], axis=1), jnp.take_along_axis(logp, order, axis=1)


def translator(model: Transformer | ensemble.Ensemble, mesh, options: DecodeOptions):
    """A jitted (params, inputs [b, l], rng) -> (outputs [b, n, l + max_extra], scores [b, n]),
    rows split over devices, searching as `options` say."""
    config = model if isinstance(model, ensemble.Ensemble) else model.config
    run = functools.partial(search, config, options=options)
    return jax.jit(
        lambda params, inputs, rng: run(params, inputs, rng=rng),
        in_shardings=(parallel.replicated(mesh), parallel.sharded_rows(mesh), parallel.replicated(mesh)),
        out_shardings=(parallel.sharded_rows(mesh), parallel.sharded_rows(mesh)),
    )


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


def translate_examples(
    *,
    translate,
    params,
    examples: list[dict],
    tokenizer: Tokenizer,
    batch_size: int,
    length: int,
    mesh,
    what: str | None = None,
    seed: int = 0,
) -> list[list[tuple[str, float]]]:
    """The one place translations are assembled (search -> detokenize): every example's
    detokenized translations with their scores, best first, in order (`translate`: a
    `translator`); progress on stderr as `what` (None: quiet). Batches group sources of similar
    length, longest first, each padded to its own bucket of at most `length` (one compilation per
    bucket). Sampling uses a key folded from `seed` and the batch's number, so a run repeats exactly."""
    out: list[list[tuple[str, float]]] = [[] for _ in examples]
    batch_size = parallel.round_to_devices(batch_size)
    process = jax.process_index(), jax.process_count()
    batches = list(pipeline.eval_batches(examples, batch_size, length, *process, by_length=True))
    start = time.time()
    for i, batch in enumerate(batches):
        placed = parallel.global_batch(mesh, {"inputs": batch["inputs"], "index": batch["index"]})
        outputs, scores = translate(params, placed["inputs"], jax.random.fold_in(jax.random.key(seed), i))
        # the example each global row holds, gathered as the rows are: wherever the mesh puts a process's rows
        outputs, scores, index = (
            multihost_utils.process_allgather(a, tiled=True) for a in (outputs, scores, placed["index"])
        )
        for rows, row_scores, j in zip(np.asarray(outputs), np.asarray(scores), index):
            if j >= 0:
                out[j] = [(tokenizer.decode(row), float(s)) for row, s in zip(rows, row_scores)]
        if what:
            progress(i + 1, len(batches), start, what)
    return out


def translate_sources(
    run: Restored, sources: list[str], *, batch_size: int = 0, what: str | None = None, log=print
) -> list[list[tuple[str, float]]]:
    """Sentences of text -> their translations with scores, best first (tokenize, then
    `translate_examples`), searched as the run's decode section says; `batch_size` 0: the
    config's eval batch size. `fxformer.translate` and `fxformer.attention_maps` translate with it."""
    tokenizer = run.tokenizer
    examples = [{"inputs": tokenizer.encode_source(s), "targets": tokenizer.encode_target("")} for s in sources]
    return translate_examples(
        translate=translator(run.model, run.mesh, run.decode),
        params=run.params,
        examples=examples,
        tokenizer=run.tokenizer,
        batch_size=batch_size or run.config.data.eval_batch_size,
        mesh=run.mesh,
        what=what,
        seed=run.decode.seed,
        length=source_length(examples, run.model, run.decode.max_extra, log),
    )


def source_length(examples: list[dict], model, max_extra: int, log=print) -> int:
    """Padded source length for the search, leaving room for input + max_extra output positions."""
    limit = max_len(model) - max_extra
    longer = sum(len(e["inputs"]) > limit for e in examples)
    if longer:
        log(f"warning: {longer} of {len(examples)} sources are cut to {limit} tokens (model.max_len - max_extra)")
    return pipeline.eval_length(examples, limit)


def bleu(hypotheses: list[str], references: list[str]) -> tuple[sacrebleu.metrics.bleu.BLEUScore, str]:
    """Corpus sacreBLEU with its default settings (13a tokenization, exact match), and its signature."""
    metric = sacrebleu.metrics.BLEU()
    return metric.corpus_score(hypotheses, [references]), str(metric.get_signature())


class BestTranslations:
    """The best translation of each of `examples` under the search `options` describe (their
    `nbest` set aside), compiled once for their padded length."""

    def __init__(
        self,
        model,
        mesh,
        options: DecodeOptions,
        examples: list[dict],
        tokenizer: Tokenizer,
        batch_size: int,
        log=print,
    ):
        self.options = dataclasses.replace(options, nbest=1)
        self.length = source_length(examples, model, self.options.max_extra, log)
        self.translate = translator(model, mesh, self.options)
        self.examples, self.tokenizer, self.batch_size, self.mesh = examples, tokenizer, batch_size, mesh

    def __call__(self, params, what: str | None = None) -> list[str]:
        translated = translate_examples(
            translate=self.translate,
            params=params,
            examples=self.examples,
            tokenizer=self.tokenizer,
            batch_size=self.batch_size,
            length=self.length,
            mesh=self.mesh,
            what=what,
            seed=self.options.seed,
        )
        return [nbest[0][0] for nbest in translated]


class DevEvaluation(NamedTuple):
    """The dev evaluations during training: the loss over the first dev `examples` (`dev_loss`),
    and BLEU of the config's search (`bleu`; None where it is not measured)."""

    config: ml_collections.ConfigDict
    mesh: jax.sharding.Mesh
    max_len: int
    compiled_loss: Any  # `loss_step`
    examples: list[dict]
    bleu: DevBleu | None

    @classmethod
    def of(cls, config, model: Transformer, mesh, prepared: tuple, log=print) -> DevEvaluation:
        """From `train.prepare_data`'s (builder, tokenizer, folder of the token ids)."""
        builder, tokenizer, ids = prepared
        bleu = None
        if config.dev_bleu_every_steps > 0:
            bleu = DevBleu(model, mesh, config, corpora.data_source(builder, config.data.eval_split), tokenizer, log)
        examples = tokenized.load(ids, config.data.eval_split).examples(
            config.eval_batches * config.data.eval_batch_size
        )
        compiled = loss_step(model, config.label_smoothing, mesh, config.loss_chunk_tokens)
        return cls(config, mesh, model.config.max_len, compiled, examples, bleu)

    def __call__(self, params, *, loss: bool, bleu: bool) -> dict[str, float]:
        """The dev metrics asked for: dev_loss, dev_nll, dev_ppl, dev_accuracy; dev_bleu."""
        logged = {}
        if loss:
            logged = dev_loss(self.compiled_loss, params, self.examples, self.config, self.mesh, self.max_len, "dev_")
        if bleu:
            logged["dev_bleu"] = self.bleu(params)
        return logged


class DevBleu:
    """BLEU on the first `dev_bleu_sentences` of the dev split during training, searching as the
    config's decode section says (best translation only), compiled once."""

    def __init__(self, model, mesh, config, source, tokenizer: Tokenizer, log=print):
        data = config.data
        n = min(config.dev_bleu_sentences or len(source), len(source))
        examples = pipeline.tokenize_split(source, tokenizer, data, n)
        self.references = pipeline.references(source, data, n)
        options = DecodeOptions.of(config.decode)
        self.best = BestTranslations(model, mesh, options, examples, tokenizer, data.eval_batch_size, log)

    def __call__(self, params) -> float:
        return bleu(self.best(params), self.references)[0].score
