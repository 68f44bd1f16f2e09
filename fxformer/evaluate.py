"""Checkpoint(s) -> per-wordpiece perplexity and sacreBLEU, the way the paper measured them.

    python -m fxformer.evaluate --workdir=runs/default
    python -m fxformer.evaluate --workdir=runs/base --split=test --average_last=5 --config.decode.beam_size=4
    python -m fxformer.evaluate --workdir=runs/base --split=test --hypotheses=my_translations.txt
    python -m fxformer.evaluate --workdir=runs/base --split=validation,test   # restored once, both splits
    python -m fxformer.evaluate --workdir=opus-mt-en-de --source_file=test.en --reference_file=test.de --out=evals

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
`--source_file` and `--reference_file` give the test set as two text files (one sentence per line)
instead of a split; `--out=DIR` writes the results there instead of W/eval/. A Marian (OPUS-MT)
directory written by transformers is evaluated so, with both (docs/interop.md): nothing is
written into the directory read. `--workdir` repeated evaluates an ensemble of the runs
(`fxformer.ensemble`; the search options are the first run's), its results in the first run's
W/eval/ (or `--out`) under a name that lists the members:
`<split>-ensemble-<run folder>.<checkpoint label>+<run folder>.<checkpoint label>...json`.

The run is loaded by `fxformer.load`, as from Python; the evaluation itself is `fxformer.evaluation`.
"""

from __future__ import annotations

from fxformer import api, cli, evaluation, inferflags, parallel, paths
from fxformer.config import load_workdir_config
from fxformer.data import corpora
from fxformer.errors import UserError


def score_file(hypotheses_file: str, test: evaluation.TestSet) -> dict:
    """sacreBLEU and chrF of an existing translation file against `test`'s references (no model)."""
    hypotheses = paths.split_lines(cli.read_flag_file("hypotheses", hypotheses_file), hypotheses_file)
    n = len(test.references)
    if len(hypotheses) != n:
        raise UserError(
            f"{hypotheses_file} has {len(hypotheses):,} lines but {test.about} has {n:,} sentences; "
            "give one translation per line, in order (or --limit=N for the first N)."
        )
    return {**evaluation.scores(hypotheses, test.references), "num_sentences": n, "split": test.name}


def parser():
    """The command's flags: the shared ones of a trained run, the test set, where results go."""
    p = inferflags.parser(__doc__, "fxformer.evaluate", ensembles=True)
    p.add_argument(
        "--split",
        default="test",
        help="dataset split: test (newstest2014), validation, ...; several separated by commas (validation,test) "
        "are evaluated one after another from one restore",
    )
    p.add_argument("--limit", type=int, default=0, help="evaluate the first N sentences only")
    p.add_argument(
        "--source_file",
        default="",
        help="a test set as two text files instead of a split: the source sentences, one per line "
        "(with --reference_file; results named after this file)",
    )
    p.add_argument("--reference_file", default="", help="the reference translations of --source_file, line by line")
    p.add_argument(
        "--out",
        default="",
        help="write the results and translations to this folder instead of W/eval/ (needed for an imported model)",
    )
    p.add_argument(
        "--hypotheses",
        default="",
        help="score this translation file instead of translating: one line per sentence, in the order fxformer "
        "reads the split (that of the .ref.txt any evaluation writes; for TFDS's WMT splits not the official "
        "file's order)",
    )
    return p


def test_sets(args, run_dir: paths.Workdir | str) -> list:
    """What --split, --source_file and --reference_file ask for: split names, or one (source,
    reference) pair of files (read now, not after the restore); refused in one sentence where the
    flags, or an imported model, cannot take them."""
    files = (args.source_file, args.reference_file)
    if any(files) and not all(files):
        raise UserError("A test set of text files takes both --source_file=FILE and --reference_file=FILE.")
    splits = [files] if all(files) else args.split.split(",")
    if not all(splits) or len(set(splits)) < len(splits):
        raise UserError(
            f"--split={args.split}: give split names separated by commas, each once (--split=validation,test)."
        )
    if args.hypotheses and len(splits) > 1:
        raise UserError(f"--hypotheses scores one split's translations, not {len(splits)}; give one --split.")
    if not isinstance(run_dir, paths.Workdir) and not all(files):
        raise UserError(
            f"{run_dir} is an imported model with no data splits: give --source_file=FILE --reference_file=FILE."
        )
    if all(files):
        evaluation.file_test_set(*files, limit=args.limit)
    return splits


def score_hypotheses(args, run_dir, test_set, say) -> None:
    """--hypotheses: the file scored against the test set's references, printed."""
    if isinstance(test_set, tuple):
        test = evaluation.file_test_set(*test_set, limit=args.limit)
    else:
        test = evaluation.split_test_set(load_workdir_config(run_dir), test_set, args.limit, log=say)
    r = score_file(args.hypotheses, test)
    say(f"{r['split']}: {r['num_sentences']:,} sentences of {args.hypotheses}")
    say(r["sacrebleu"])
    say(f"sacreBLEU signature: {r['signature']}")
    say(f"BLEU {r['bleu']:.2f} (lowercased {r['bleu_lc']:.2f}), chrF {r['chrf']:.2f}")


def main() -> None:
    args = inferflags.parse(parser())
    run_dirs = inferflags.trained_runs(args.workdir)
    run_dir = run_dirs[0]  # an ensemble's first run: its data splits, its W/eval/
    splits = test_sets(args, run_dir)
    say = parallel.print_once
    if args.hypotheses:
        score_hypotheses(args, run_dir, splits[0], say)
        return

    def report(r: dict) -> None:
        say(f"{r['split']}: {r['num_sentences']:,} sentences, {api.described(run)}")
        say(f"perplexity (per wordpiece): {r['ppl']:.3f}")
        say(r["sacrebleu"])
        say(f"sacreBLEU signature: {r['signature']}", flush=True)

    out = inferflags.out_folder(run_dir, args.out, "eval")
    evaluation.check_writable(out)  # before the restore: the results are written at the end
    run = api.load(run_dirs, args.step, args.average_last, args.overrides, say, average=args.ensemble_average)
    if len(splits) > 1:  # every split checked before the first is decoded
        builder = corpora.prepare(run.config.data, log=say)
        for split in splits:
            corpora.data_source(builder, split)
    for split in splits:
        r = run.evaluate(split, args.limit, out=out, log=say, report=report)
        say(
            f"BLEU {r['bleu']:.2f} (lowercased {r['bleu_lc']:.2f}), chrF {r['chrf']:.2f}; results in "
            f"{r.get('path', out)}",
            flush=True,  # before the next split's progress lines (stderr), in a log that holds both
        )


if __name__ == "__main__":
    cli.run(main)
