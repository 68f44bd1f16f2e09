"""Translate text with a trained workdir: lines in (stdin or --input), translations out (stdout).

    echo "Today the man sees the dog." | python -m fxformer.translate --workdir=runs/default
    python -m fxformer.translate --workdir=runs/base --input=news.en --average_last=5 > news.de

Progress goes to stderr, so stdout holds only the translations, one per input line: lines
are split on newlines only (a form feed or a Unicode line separator stays inside its line), a
blank line comes out blank, and input must be UTF-8.
"""

from __future__ import annotations

import os
import sys

from fxformer import cli, paths
from fxformer.evaluate import inference_parser, parse_inference_args, restore_for_inference
from fxformer.inference import source_length, translate_examples, translator


def main() -> None:
    p = inference_parser(__doc__, "fxformer.translate")
    p.add_argument("--input", default="-", help="a file of source sentences, one per line (default: stdin)")
    p.add_argument("--batch_size", type=int, default=0, help="sentences per batch (default: data.eval_batch_size)")
    args = parse_inference_args(p)
    if args.input == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = paths.as_path(args.input).read_bytes()
        except OSError as e:
            raise cli.UserError(f"Cannot read --input '{args.input}': {e.strerror or e}.") from None
    lines = paths.split_lines(data, "stdin" if args.input == "-" else args.input)
    log = cli.log_to_stderr
    config, model, tokenizer, params, steps, mesh, _ = restore_for_inference(
        args.workdir, args.step, args.average_last, log
    )
    log(f"translating {len(lines):,} lines with checkpoint step(s) {steps}")
    if not lines:
        return
    todo = [i for i, line in enumerate(lines) if line.strip()]  # blank lines stay blank, untranslated
    examples = [{"inputs": tokenizer.encode(lines[i]), "targets": tokenizer.encode("")} for i in todo]
    extra = config.max_decode_extra
    length = source_length(examples, model, extra, log)
    translate = translator(
        model, mesh, args.beam_size or config.beam_size, config.alpha if args.alpha is None else args.alpha, extra
    )
    batch_size = args.batch_size or config.data.eval_batch_size
    out = [""] * len(lines)
    if examples:
        translated = translate_examples(translate, params, examples, tokenizer, batch_size, length, mesh, "translate")
        for i, line in zip(todo, translated):
            out[i] = line
    try:
        sys.stdout.write("".join(line + "\n" for line in out))
        sys.stdout.flush()
    except BrokenPipeError:  # `translate | head -1`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    cli.run(main)
