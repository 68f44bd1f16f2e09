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

The run is loaded by `fxformer.load`, as from Python; the evaluation itself is `fxformer.evaluation`.
"""

from __future__ import annotations

from fxformer import api, cli, evaluation, inferflags, parallel, paths
from fxformer.config import load_workdir_config
from fxformer.data import corpora
from fxformer.errors import UserError


def score_file(workdir: paths.Workdir, hypotheses_file: str, split: str, limit: int = 0, log=print) -> dict:
    """sacreBLEU and chrF of an existing translation file against `split`'s references (no model)."""
    config = load_workdir_config(workdir)
    hypotheses = paths.split_lines(cli.read_flag_file("hypotheses", hypotheses_file), hypotheses_file)
    _, n, references = evaluation.references_of(config, split, limit, log)
    if len(hypotheses) != n:
        raise UserError(
            f"{hypotheses_file} has {len(hypotheses):,} lines but the {split} split has {n:,} sentences; "
            "give one translation per line, in order (or --limit=N for the first N)."
        )
    return {**evaluation.scores(hypotheses, references), "num_sentences": n, "split": split}


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

    evaluation.check_writable(workdir)  # before the restore: the results are written at the end
    run = api.load(workdir, args.step, args.average_last, args.overrides, say)
    if len(splits) > 1:  # every split checked before the first is decoded
        builder = corpora.prepare(run.config.data, log=say)
        for split in splits:
            corpora.data_source(builder, split)
    for split in splits:
        r = run.evaluate(split, args.limit, log=say, report=report)
        say(
            f"BLEU {r['bleu']:.2f} (lowercased {r['bleu_lc']:.2f}), chrF {r['chrf']:.2f}; results in "
            f"{r.get('path', workdir)}",
            flush=True,  # before the next split's progress lines (stderr), in a log that holds both
        )


if __name__ == "__main__":
    cli.run(main)
