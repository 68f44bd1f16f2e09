"""Checkpoint(s) -> per-wordpiece perplexity and sacreBLEU, the way the paper measured them.

    python -m fxformer.evaluate --workdir=runs/default
    python -m fxformer.evaluate --workdir=runs/base --split=test --average_last=5 --config.decode.beam_size=4
    python -m fxformer.evaluate --workdir=runs/base --split=test --hypotheses=my_translations.txt
    python -m fxformer.evaluate --workdir=runs/base --split=validation,test   # restored once, both splits

Restores onto the devices at hand, whatever count trained the run. Writes
`W/eval/<split>-<step>[-avg<k>][-best][-<decode field>=<value>...][-first<n>].json` (bleu, bleu_lc
(lowercased), chrf, ppl, num_sentences, checkpoint_steps, sacreBLEU's signature, `decode`: the
search's options, ...) and the detokenized translations beside it (`.hyp.txt`, with `.ref.txt`).
`--config.decode.<field>=<value>` changes the search (strategy, beam_size, alpha, beam_variant,
max_extra, ...; each one that differs from the trained run's is named in the file name, so that no
search overwrites another's results); the model and data are the trained run's.
`--hypotheses=FILE` scores an existing translation file (one line per sentence of the split, in
the order of the `.ref.txt` an evaluation writes: TFDS stores the WMT splits in its own order, not
the official file's) with the same sacreBLEU settings, without a model.
"""

from __future__ import annotations

import json

import jax
import ml_collections
import sacrebleu

from fxformer import cli, inference, inferflags, parallel, paths
from fxformer.config import load_workdir_config
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


def evaluate(
    workdir: paths.Workdir,
    split: str = "test",
    step: int | str = "latest",
    average_last: int | None = None,
    overrides=(),
    limit: int = 0,
    log=print,
    report=None,
    restored: inference.Restored | None = None,
) -> dict:
    """Perplexity and sacreBLEU of a workdir's checkpoint(s) on `split` (`step`, `average_last`:
    which, as `inference.restore` takes them); writes and returns the results. `report(results)`,
    if given, is called before anything is written (so a disk that fills at the end loses no score).
    `restored`: those checkpoint(s) already restored with the same `step`, `average_last` and
    `overrides` by a caller that checked `W/eval` writable first (several splits in one process)."""
    run = restored or restore_writable(workdir, step, average_last, overrides, log)
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


def restore_writable(workdir: paths.Workdir, step, average_last, overrides, log) -> inference.Restored:
    """`inference.restore`, after `check_writable`."""
    check_writable(workdir)
    return inference.restore(workdir, step, average_last, overrides, log)


def score_file(workdir: paths.Workdir, hypotheses_file: str, split: str, limit: int = 0, log=print) -> dict:
    """sacreBLEU and chrF of an existing translation file against `split`'s references (no model)."""
    config = load_workdir_config(workdir)
    hypotheses = paths.split_lines(cli.read_flag_file("hypotheses", hypotheses_file), hypotheses_file)
    _, n, references = references_of(config, split, limit, log)
    if len(hypotheses) != n:
        raise UserError(
            f"{hypotheses_file} has {len(hypotheses):,} lines but the {split} split has {n:,} sentences; "
            "give one translation per line, in order (or --limit=N for the first N)."
        )
    return {**scores(hypotheses, references), "num_sentences": n, "split": split}


def main() -> None:
    p = inferflags.parser(__doc__, "fxformer.evaluate")
    p.add_argument(
        "--split",
        default="test",
        help="dataset split: test (newstest2014), validation, ...; several separated by commas (validation,test) "
        "are evaluated one after another from one restore",
    )
    p.add_argument("--limit", type=int, default=0, help="evaluate the first N sentences only")
    p.add_argument(
        "--hypotheses",
        default="",
        help="score this translation file instead of translating: one line per sentence, in the order fxformer "
        "reads the split (that of the .ref.txt any evaluation writes; for TFDS's WMT splits not the official "
        "file's order)",
    )
    args = inferflags.parse(p)
    splits = args.split.split(",")
    if not all(splits) or len(set(splits)) < len(splits):
        raise UserError(
            f"--split={args.split}: give split names separated by commas, each once (--split=validation,test)."
        )
    if args.hypotheses and len(splits) > 1:
        raise UserError(f"--hypotheses scores one split's translations, not {len(splits)}; give one --split.")
    workdir = cli.workdir(args.workdir)
    say = parallel.print_once
    if args.hypotheses:
        r = score_file(workdir, args.hypotheses, args.split, args.limit, log=say)
        say(f"{r['split']}: {r['num_sentences']:,} sentences of {args.hypotheses}")
        say(r["sacrebleu"])
        say(f"sacreBLEU signature: {r['signature']}")
        say(f"BLEU {r['bleu']:.2f} (lowercased {r['bleu_lc']:.2f}), chrF {r['chrf']:.2f}")
        return

    def report(r: dict) -> None:
        say(f"{r['split']}: {r['num_sentences']:,} sentences, checkpoint step(s) {r['checkpoint_steps']}")
        say(f"perplexity (per wordpiece): {r['ppl']:.3f}")
        say(r["sacrebleu"])
        say(f"sacreBLEU signature: {r['signature']}", flush=True)

    restored = None
    if len(splits) > 1:  # restored once; every split checked before the first is decoded
        restored = restore_writable(workdir, args.step, args.average_last, args.overrides, say)
        builder = corpora.prepare(restored.config.data, log=say)
        for split in splits:
            corpora.data_source(builder, split)
    for split in splits:
        r = evaluate(workdir, split, args.step, args.average_last, args.overrides, args.limit, say, report, restored)
        say(
            f"BLEU {r['bleu']:.2f} (lowercased {r['bleu_lc']:.2f}), chrF {r['chrf']:.2f}; results in "
            f"{r.get('path', workdir)}",
            flush=True,  # before the next split's progress lines (stderr), in a log that holds both
        )


if __name__ == "__main__":
    cli.run(main)
