"""Translate text with a trained workdir: lines in (stdin or --input), translations out (stdout).

    echo "Today the man sees the dog." | python -m fxformer.translate --workdir=runs/default
    python -m fxformer.translate --workdir=runs/base --input=news.en --average_last=5 > news.de
    python -m fxformer.translate --workdir=runs/base --config.decode.nbest=3 < news.en
    python -m fxformer.translate --workdir=runs/base --config.decode.strategy=sample \\
        --config.decode.temperature=0.7 --config.decode.top_k=40 --config.decode.seed=1 < news.en

`--workdir` may also name a Marian (OPUS-MT) directory transformers wrote (docs/interop.md).
Repeated, it gives an ensemble of the runs (the same tokenizer), searched on their combined
next-token distribution (`--ensemble_average`, `fxformer.ensemble`).
Progress goes to stderr, so stdout holds only the translations, one per input line: lines
are split on newlines only (a form feed or a Unicode line separator stays inside its line), a
blank line comes out blank, and input must be UTF-8.

With `--config.decode.nbest=K` (K > 1) each input line gives K lines, best first, each
`<line number, from 0><TAB><score><TAB><translation>`; the score is log p / lp(|Y|) for beam
search, log p for sampling (a blank input line gives K lines with an empty score and text).
Sampling with the same `decode.seed` (and batch size) prints the same output every time.

On several processes (the cluster flags) every process reads `--input` and translates its share;
process 0 alone writes the translations.
"""

from __future__ import annotations

import os
import sys

import jax

from fxformer import api, cli, inferflags, paths
from fxformer.errors import UserError


def formatted(lines: list[str], translated: dict[int, list[tuple[str, float]]], nbest: int) -> str:
    """The output text: one translation per input line, or `nbest` tab-separated scored lines."""
    out = []
    for i in range(len(lines)):
        found = translated.get(i, [])
        if nbest == 1:
            out.append(found[0][0] if found else "")
        else:
            out += [f"{i}\t{score:.4f}\t{text}" for text, score in found] or [f"{i}\t\t"] * nbest
    return "".join(text + "\n" for text in out)


def translated_lines(
    args, workdirs: list[paths.Workdir | str], lines: list[str]
) -> tuple[api.TrainedRun, dict[int, list]]:
    """The run or ensemble loaded (`fxformer.load`), and the translations of the non-blank `lines` by number."""
    log = cli.log_to_stderr
    run = api.load(workdirs, args.step, args.average_last, args.overrides, log, average=args.ensemble_average)
    log(f"translating {len(lines):,} lines with {api.described(run)}")
    found = run.nbest(lines, batch_size=args.batch_size, log=log, what="translate")
    return run, {i: translations for i, translations in enumerate(found) if translations}


def main() -> None:
    p = inferflags.parser(__doc__, "fxformer.translate", ensembles=True)
    p.add_argument("--input", default="-", help="a file of source sentences, one per line (default: stdin)")
    p.add_argument("--batch_size", type=int, default=0, help="sentences per batch (default: data.eval_batch_size)")
    args = inferflags.parse(p)
    if args.batch_size < 0:
        raise UserError(f"--batch_size must be a number of sentences (0: the config's), not {args.batch_size}.")
    if sys.stdout is None:  # `translate >&-`: nowhere to write, found before any work
        raise UserError("Standard output is closed; redirect it to a file (> out.txt).")
    if args.input == "-":
        if jax.process_count() > 1:  # a scheduler gives standard input to one process at most
            raise UserError(f"With {jax.process_count()} processes give --input=FILE, which every process reads.")
        if sys.stdin is None:
            raise UserError("Standard input is closed; give --input=FILE or pipe the sentences in.")
        data = sys.stdin.buffer.read()
    else:
        data = cli.read_flag_file("input", args.input)
    lines = paths.split_lines(data, "stdin" if args.input == "-" else args.input)
    run, translated = translated_lines(
        args, inferflags.trained_runs(args.workdir), lines
    )  # the standard output holds them alone (`cli.run`)
    if jax.process_index() != 0:  # every process has every translation; one copy is written
        return
    try:
        sys.stdout.write(formatted(lines, translated, run.decode.nbest))
        sys.stdout.flush()
    except BrokenPipeError:  # `translate | head -1`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    cli.run(main)
