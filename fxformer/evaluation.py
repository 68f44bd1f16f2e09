"""A restored run's perplexity and sacreBLEU on a test set (a split of its data, or two text files),
the way the paper measured them, written to `W/eval/` or a folder the user names: what
`fxformer.load(...).evaluate` and the `evaluate` command share."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import ml_collections
import sacrebleu
from etils import epath

from fxformer import cli, inference, paths
from fxformer.data import corpora, pipeline
from fxformer.errors import UserError


def references_of(config: ml_collections.ConfigDict, split: str, limit: int, log=print):
    """(the split's records, how many are used, their reference translations)."""
    data = config.data
    source = corpora.data_source(corpora.prepare(data, log=log), split)
    references = pipeline.references(source, data, limit)  # the first `limit` if > 0
    return source, len(references), references


def scores(hypotheses: list[str], references: list[str]) -> dict:
    """sacreBLEU's BLEU (with its signature), its lowercased BLEU (`sacrebleu -lc`, the small-corpus
    literature's usual figure) and chrF of a corpus."""
    bleu, signature = inference.bleu(hypotheses, references)
    lowercased = sacrebleu.metrics.BLEU(lowercase=True).corpus_score(hypotheses, [references])
    chrf = sacrebleu.metrics.CHRF().corpus_score(hypotheses, [references])
    return {
        "bleu": bleu.score,
        "bleu_lc": lowercased.score,
        "chrf": chrf.score,
        "sacrebleu": str(bleu),
        "signature": signature,
    }


@dataclasses.dataclass(frozen=True)
class TestSet:
    """The sentence pairs an evaluation scores: a split of the run's data, or two text files."""

    name: str  # the split, or the source file's name: what names the results
    sources: list[str]
    references: list[str]
    first: int = 0  # n when these are the first n pairs of a longer set (named in the results), else 0
    about: str = ""  # how a message names it: "the test split", "test.en and test.de"


def split_test_set(config: ml_collections.ConfigDict, split: str, limit: int = 0, log=print) -> TestSet:
    """The split of the run's data (its first `limit` pairs if > 0)."""
    source, n, references = references_of(config, split, limit, log)
    lang = config.data.source_lang
    sources = [source[i][lang].decode("utf-8") for i in range(n)]
    return TestSet(split, sources, references, n if n < len(source) else 0, f"the {split} split")


def file_test_set(source_file: str, reference_file: str, limit: int = 0) -> TestSet:
    """A test set as two text files, one sentence per line, line i of one translating line i of the
    other (the first `limit` pairs if > 0), named after the source file in the results."""
    sources, references = (
        paths.split_lines(cli.read_flag_file(flag, f), f)
        for flag, f in (("source_file", source_file), ("reference_file", reference_file))
    )
    if len(sources) != len(references) or not sources:
        raise UserError(
            f"{source_file} has {len(sources):,} lines and {reference_file} {len(references):,}: give one "
            "reference translation per source sentence, a pair per line number."
        )
    n = len(sources) if limit <= 0 else min(limit, len(sources))
    name = re.sub(r"[^\w.-]", "_", paths.as_path(source_file).name)
    return TestSet(
        name, sources[:n], references[:n], n if n < len(sources) else 0, f"{source_file} and {reference_file}"
    )


def evaluate(
    run: inference.Restored, test: TestSet, result: epath.Path, log=print, report=None, about: dict | None = None
) -> dict:
    """Perplexity and sacreBLEU of the restored `run` (`fxformer.load(...).restored`, one run or an
    ensemble) on `test`; writes the results to `result` (the translations beside it, `.hyp.txt` and
    `.ref.txt`) and returns them, with `about`'s fields (an ensemble's members). `report(results)`,
    if given, is called before anything is written (so a disk that fills at the end loses no
    score). The caller checked the folder writable first (`check_writable`)."""
    examples = pipeline.tokenize_pairs(run.tokenizer, test.sources, test.references)
    loss_step = inference.loss_step(run.model, run.config.label_smoothing, run.mesh, run.config.loss_chunk_tokens)
    losses = inference.dev_loss(loss_step, run.params, examples, run.config, run.mesh, inference.max_len(run.model))
    best = inference.BestTranslations(
        run.model, run.mesh, run.decode, examples, run.tokenizer, run.config.data.eval_batch_size, log
    )
    options = best.options
    hypotheses = best(run.params, f"{options.strategy} search ({test.name})")
    results = {
        **scores(hypotheses, test.references),
        **{k: losses[k] for k in ("ppl", "nll", "loss", "accuracy")},
        "num_sentences": len(test.references),
        "split": test.name,
        "checkpoint_steps": run.steps,
        "decode": options.to_dict(),  # the search's options (older results held beam_size and alpha at top level too)
        "num_params": sum(x.size for x in jax.tree.leaves(run.params)),
        "devices": jax.device_count(),
        **(about or {}),
    }
    if report is not None:
        report(results)
    if jax.process_index() == 0:
        result.parent.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(result.with_suffix(".hyp.txt"), "".join(h + "\n" for h in hypotheses))
        paths.write_atomic(result.with_suffix(".ref.txt"), "".join(r + "\n" for r in test.references))
        paths.write_atomic(result, json.dumps(results, indent=2) + "\n")
        results["path"] = str(result)
    return results


def check_writable(folder) -> None:
    """On process 0, that `folder` (W/eval/, or --out) can take the results: checked before any
    work, since they are written at the end."""
    if jax.process_index() == 0:
        paths.check_writable(folder, "evaluation writes its results")
