"""A trained run in Python: the one way to load a checkpoint for evaluation, in a notebook or a
script, and the path the commands `translate`, `evaluate` and `attention_maps` take too (they sit
above this module; what they share with it, `evaluation` and `attention_weights`, below it).

    import fxformer
    run = fxformer.load("runs/default")                # step="best" | "latest" | 600, average_last=5
    run.translate(["The old teacher has helped the boy."])   # ['Der alte Lehrer hat dem Jungen geholfen.']
    run.translate(sentences, beam_size=8, alpha=1.0)   # any field of the decode section
    run.score(sources, targets)      # per sentence: summed log-probability and its token count
    run.attention("The dog sleeps.")  # every attention weight, as the attention figures draw them
    run.evaluate("test")              # perplexity, BLEU, chrF: what `fxformer.evaluate` prints
    fxformer.load(["runs/seed0", "runs/seed1"])   # an ensemble: the same methods (`fxformer.ensemble`)

`fxformer.load` takes a path, an `os.PathLike` or a `gs://` URL; only the parameters are read (never
the optimizer state), onto the devices at hand.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from fxformer import attention_weights, cli, configfile, ensemble, evaluation, inference, marian, parallel, paths
from fxformer.data import pipeline
from fxformer.data.tokenizer import workdir_tokenizer
from fxformer.errors import UserError
from fxformer.tokens import PAD_ID


def quiet(*_args, **_kwargs) -> None:
    """The API's log: silent (the commands pass their own, which print progress)."""


class Score(NamedTuple):
    """A target sentence's summed log-probability given its source (teacher-forced, dropout off,
    no label smoothing) over its `tokens` wordpieces, the end of sentence included."""

    log_prob: float
    tokens: int


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """A workdir's checkpoint(s), restored: `config`, `tokenizer`, `params`, `steps` (the
    checkpoint steps averaged into `params`), and what can be done with them. An ensemble's
    `members` are its runs (its `params` a tuple of theirs, `config` and `workdir` its first's)."""

    workdir: paths.Workdir | None  # None: a model imported from transformers' Marian files
    restored: inference.Restored
    step: int | str
    members: tuple[TrainedRun, ...] = ()  # an ensemble's runs, in order; () for one run
    path: str = ""  # where it was loaded from: the workdir, or the imported directory

    @property
    def name(self) -> str:
        """How results name these parameters: the checkpoint label (`600-avg5`, `600-best`,
        `600-ema0.9999`), `imported`, or an ensemble's `ensemble-<member>+<member>...`, each
        `<run's folder>.<label>`."""
        if self.members:
            return "ensemble-" + "+".join(f"{paths.as_path(m.path).name}.{m.name}" for m in self.members)
        if self.workdir is None:
            return "imported"
        if isinstance(self.step, str) and self.step.startswith("ema"):  # the smoothed weights, named by their decay
            return f"{self.steps[-1]}-ema{inference.smoothed_decay(self.workdir, self.step, self.config):g}"
        return paths.checkpoint_label(self.steps, self.step == "best")

    @property
    def config(self):
        return self.restored.config

    @property
    def tokenizer(self):
        return self.restored.tokenizer

    @property
    def params(self):
        return self.restored.params

    @property
    def steps(self) -> list[int]:
        return self.restored.steps

    def with_decode(self, **options) -> TrainedRun:
        """This run searching with other decode fields (`beam_size=8`, `strategy="sample"`, ...)."""
        if not options:
            return self
        pairs = [(f"decode.{key}", str(value)) for key, value in options.items()]
        config = configfile.apply_decode_overrides(self.config.copy_and_resolve_references(), pairs, self.workdir)
        return dataclasses.replace(self, restored=dataclasses.replace(self.restored, config=config))

    @property
    def decode(self):
        """The search's options (`DecodeOptions`): the run's decode section, with any overrides."""
        return self.restored.decode

    def nbest(
        self, sentences: list[str], *, batch_size: int = 0, log=quiet, what: str | None = None, **decode
    ) -> list[list[tuple[str, float]]]:
        """Each sentence's translations with their scores, best first (`decode.nbest` of them; a
        blank sentence gets none): log p / lp(|Y|) for beam search, log p for sampling. `what`:
        progress on stderr under that name (None: quiet); `batch_size` 0: the config's."""
        run = self.with_decode(**decode).restored
        todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]  # blank stays blank
        if not todo:
            return [[] for _ in sentences]
        found = inference.translate_sources(
            run, [sentences[i] for i in todo], batch_size=batch_size, what=what, log=log
        )
        out: list[list[tuple[str, float]]] = [[] for _ in sentences]
        for i, translations in zip(todo, found):
            out[i] = translations
        return out

    def translate(self, sentences: str | list[str], **decode) -> str | list[str]:
        """The best translation of each sentence ("" for a blank one), searched as the run's decode
        section says with `decode`'s fields changed; a single string gives a single string."""
        one = isinstance(sentences, str)
        found = self.nbest([sentences] if one else list(sentences), **decode)
        best = [translations[0][0] if translations else "" for translations in found]
        return best[0] if one else best

    def score(self, sources: list[str], targets: list[str]) -> list[Score]:
        """Each target's summed log-probability given its source and its token count, as the
        perplexity `evaluate` reports counts them: exp(-sum of log_prob / sum of tokens) over a
        split is its perplexity."""
        if len(sources) != len(targets):
            raise UserError(f"score takes one target per source: {len(sources)} sources, {len(targets)} targets.")
        model = self.restored.model
        examples = pipeline.tokenize_pairs(self.tokenizer, sources, targets)
        length = pipeline.eval_length(examples, inference.max_len(model))
        sums = sentence_log_probs(model)
        out: list[Score | None] = [None] * len(examples)
        batch_size = parallel.round_to_devices(self.config.data.eval_batch_size)
        for batch in pipeline.eval_batches(examples, batch_size, length):
            log_probs, tokens = jax.device_get(sums(self.params, batch["inputs"], batch["targets"]))
            for j, lp, n in zip(batch["index"], log_probs, tokens):
                if j >= 0:
                    out[j] = Score(float(lp), int(n))
        return out

    def attention(self, source: str, target: str | None = None) -> attention_weights.Weights:
        """Every attention weight on (source, target), teacher-forced with dropout off; without a
        target, on the run's own translation. `w.cross`, `w.encoder`, `w.decoder`: [layers, heads,
        queries, keys]; `w.axes(kind)` the wordpieces that label them. An ensemble has no
        attention of its own: refused in one sentence (load one member)."""
        if self.members:
            raise UserError(
                f"An ensemble has no attention weights of its own: each of its {len(self.members)} members has "
                "its own; load one run (one --workdir) to see them."
            )
        return attention_weights.pair_weights(self.restored, source, target, log=quiet)

    def evaluate(
        self,
        split: str | tuple[str, str] = "test",
        limit: int = 0,
        *,
        out: str | os.PathLike | None = None,
        log=quiet,
        report=None,
        **decode,
    ) -> dict:
        """Perplexity per wordpiece, sacreBLEU (cased and lowercased) and chrF on `split` (its first
        `limit` sentences if > 0), as `fxformer.evaluate` prints them: a split of the run's data, or
        a pair of text files (source, reference), one sentence per line. The results and
        translations are written to W/eval/, or to the folder `out` (an imported model has no
        workdir: `out` is needed), as the command writes them, their path under "path". `log`:
        progress; `report(results)`: called with the scores before anything is written."""
        run = self.with_decode(**decode)
        if out is None and self.workdir is None:
            raise UserError(
                "An imported model's directory is not written to: give out=DIR (--out=DIR) for the results."
            )
        folder = paths.as_path(out) if out is not None else self.workdir.eval
        evaluation.check_writable(folder)
        if isinstance(split, str):
            if self.workdir is None:
                raise UserError(
                    f"An imported model has no data splits to evaluate '{split}' on: give a pair of text files "
                    "(source, reference), --source_file=FILE --reference_file=FILE."
                )
            test = evaluation.split_test_set(self.config, split, limit, log)
        else:
            test = evaluation.file_test_set(*split, limit=limit)
        result = paths.eval_result(folder, test.name, self.name, test.first, run.restored.decode_changes)
        about = None
        if self.members:
            members = [{"path": m.path, "checkpoint_steps": m.steps} for m in self.members]
            about = {"ensemble": {"members": members, "average": self.restored.model.average}}
        return evaluation.evaluate(run.restored, test, result, log, report, about)


def described(run: TrainedRun) -> str:
    """What the commands say they use: `checkpoint step(s) [600]`, `an imported model`, or an
    ensemble's `an ensemble of 2 (runs/a step(s) [600], runs/b step(s) [400]), averaging probabilities`."""
    if run.members:
        each = ", ".join(f"{m.path} " + (f"step(s) {m.steps}" if m.steps else "imported") for m in run.members)
        return f"an ensemble of {len(run.members)} ({each}), averaging {run.restored.model.average}"
    return f"checkpoint step(s) {run.steps}" if run.steps else "an imported model"


Member = str | os.PathLike | paths.Workdir | tuple  # a run, or (run, step[, average_last])


def load(
    workdir: Member | list[Member],
    step: int | Literal["latest", "best"] = "latest",
    average_last: int | None = None,
    overrides=(),
    log=quiet,
    keep_average: bool = True,
    average: str = "probabilities",
) -> TrainedRun:
    """A training workdir's checkpoint restored for evaluation: `step` "latest" (the last saved),
    "best" (the best dev metric seen in training) or a step number; `average_last` k averages the k
    checkpoints ending at `step` (None: the config's for "latest", else 1), and an average is saved
    under `W/averaged/` for the next load (`keep_average=False`: reused if saved, else kept in
    memory only, as `attention_maps` does: it writes nothing outside `W/attention/`). `overrides`:
    (key, value) pairs of the decode section, as the commands' `--config.decode.*` flags. A workdir
    that is no training run is refused in one sentence, as the commands refuse it. A directory
    transformers wrote for a Marian (OPUS-MT) model is imported (`fxformer.marian`, docs/interop.md).

    A list gives an ensemble (`fxformer.ensemble`, `average` its combination): each member a
    workdir (with `step` and `average_last`) or a tuple (workdir, step[, average_last]); the
    search options are the first member's with `overrides`. A list of one is that run."""
    if isinstance(workdir, list):
        if not workdir:
            raise UserError("An ensemble needs at least one run: give a list of workdirs.")
        ensemble.check_average(average)
        members = [member if isinstance(member, tuple) else (member,) for member in workdir]
        if any(len(member) > 3 for member in members):
            raise UserError("An ensemble's member is a workdir or a tuple (workdir, step, average_last).")
        where = [m[0] if isinstance(m[0], paths.Workdir) else os.fspath(m[0]) for m in members]
        ensemble.check_tokenizers([str(w) for w in where], [tokenizer_at(w) for w in where])  # before any restore
        runs = [
            load(path, *choice, *(step, average_last)[len(choice) :], overrides, log, keep_average)
            for path, *choice in members
        ]
        return runs[0] if len(runs) == 1 else ensemble_of(runs, average)
    if isinstance(step, str) and step not in ("latest", "best"):
        step = int(step) if step.isdigit() else step  # "600" as the commands' --step takes it
    run = located(workdir)
    if isinstance(run, Path):
        if step != "latest" or average_last not in (None, 1):
            raise UserError(f"{run} is one imported model: it has no steps to choose or average.")
        return TrainedRun(None, inference.restore_marian(run, overrides), "imported", path=str(run))
    restored = inference.restore(run, step, average_last, overrides, log, keep_average)
    return TrainedRun(run, restored, step, path=str(run))


def located(where: str | os.PathLike | paths.Workdir) -> paths.Workdir | Path:
    """What `load` reads at `where`: a directory transformers wrote for a Marian model (its Path),
    else a training workdir (`paths.Workdir`, local or a bucket's)."""
    if isinstance(where, paths.Workdir):
        return where
    path = os.fspath(where)
    return Path(path) if marian.is_marian(path) else cli.workdir(path)


def tokenizer_at(where: str | os.PathLike | paths.Workdir):
    """The tokenizer a run to load keeps (None where there is none yet: `load` refuses it)."""
    run = located(where)
    return marian.read_tokenizer(run) if isinstance(run, Path) else workdir_tokenizer(run)


def ensemble_of(runs: list[TrainedRun], average: str) -> TrainedRun:
    """Loaded runs (their tokenizers checked alike) as one ensemble (`fxformer.ensemble`)."""
    first = runs[0].restored
    model = ensemble.Ensemble(tuple(run.restored.model for run in runs), average)
    restored = dataclasses.replace(first, model=model, params=tuple(run.params for run in runs), steps=[])
    return TrainedRun(runs[0].workdir, restored, runs[0].step, members=tuple(runs), path=runs[0].path)


@functools.lru_cache(maxsize=8)
def token_log_probs(model):
    """A jitted (params, inputs [b, l], targets [b, l]) -> each target token's log-probability
    [b, l] under the model or ensemble (teacher-forced, dropout off; padding's entries are not
    meaningful)."""

    def picked(params, inputs, targets):
        log_probs = inference.log_probs(model, params, inputs, targets)
        return jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]

    return jax.jit(picked)


@functools.lru_cache(maxsize=8)
def sentence_log_probs(model):
    """A jitted (params, inputs [b, l], targets [b, l]) -> (each row's summed target log-probability,
    its target tokens): the model's log-softmax at each target, padding left out."""

    tokens = token_log_probs(model)

    def sums(params, inputs, targets):
        weights = (targets != PAD_ID).astype(jnp.float32)
        return (tokens(params, inputs, targets) * weights).sum(-1), weights.sum(-1)

    return jax.jit(sums)


__all__ = ["Score", "TrainedRun", "load"]
