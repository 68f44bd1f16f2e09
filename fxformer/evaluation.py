"""A restored run's perplexity and sacreBLEU on a split, the way the paper measured them, written
to `W/eval/`: what `fxformer.load(...).evaluate` and the `evaluate` command share."""

from __future__ import annotations

import json

import jax
import ml_collections
import sacrebleu

from fxformer import inference, paths
from fxformer.data import corpora, pipeline


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


def evaluate(
    run: inference.Restored,
    workdir: paths.Workdir,
    split: str = "test",
    step: int | str = "latest",
    limit: int = 0,
    log=print,
    report=None,
) -> dict:
    """Perplexity and sacreBLEU of the restored `run` (`fxformer.load(workdir, step, ...).restored`)
    on `split` (its first `limit` sentences if > 0); writes and returns the results. `report(results)`,
    if given, is called before anything is written (so a disk that fills at the end loses no score).
    The caller checked `W/eval` writable first (`check_writable`)."""
    source, n, references = references_of(run.config, split, limit, log)
    examples = pipeline.tokenize_split(source, run.tokenizer, run.config.data, n)

    loss_step = inference.loss_step(run.model, run.config.label_smoothing, run.mesh, run.config.loss_chunk_tokens)
    losses = inference.dev_loss(loss_step, run.params, examples, run.config, run.mesh, run.model.config.max_len)
    best = inference.BestTranslations(
        run.model, run.mesh, run.decode, examples, run.tokenizer, run.config.data.eval_batch_size, log
    )
    options = best.options
    hypotheses = best(run.params, f"{options.strategy} search ({split})")

    steps = run.steps
    first = n if n < len(source) else 0
    result = workdir.eval_result(split, steps, best=step == "best", first=first, decode=run.decode_changes)
    results = {
        **scores(hypotheses, references),
        **{k: losses[k] for k in ("ppl", "nll", "loss", "accuracy")},
        "num_sentences": n,
        "split": split,
        "checkpoint_steps": steps,
        "decode": options.to_dict(),  # the search's options (older results held beam_size and alpha at top level too)
        "num_params": sum(x.size for x in jax.tree.leaves(run.params)),
        "devices": jax.device_count(),
    }
    if report is not None:
        report(results)
    if jax.process_index() == 0:
        result.parent.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(result.with_suffix(".hyp.txt"), "".join(h + "\n" for h in hypotheses))
        paths.write_atomic(result.with_suffix(".ref.txt"), "".join(r + "\n" for r in references))
        paths.write_atomic(result, json.dumps(results, indent=2) + "\n")
        results["path"] = str(result)
    return results


def check_writable(workdir: paths.Workdir) -> None:
    """On process 0, that W/eval/ can take the results: checked before any work, since they are written at the end."""
    if jax.process_index() == 0:
        paths.check_writable(workdir.eval, "evaluation writes its results")
