"""Build (or find) a config's dataset and tokenizer, and describe them.

    python -m fxformer.data --config=configs/default.py

Prints per-split sizes and token counts, a length histogram, what the length filter
removes, packing efficiency, and, last, the monotone word-by-word baseline's sacreBLEU.
"""

from __future__ import annotations

import time

import numpy as np

from fxformer import cli
from fxformer.config import validate
from fxformer.data import baseline, corpora, pipeline, token_ids, tokenized
from fxformer.data.tokenizer import tokenizer_for
from fxformer.errors import UserError

BINS = [0, 8, 16, 32, 64, 128, 256, 512, 1024, 10**9]


def histogram(lengths: np.ndarray) -> list[str]:
    """Text bars for the longer side of each pair, in token bins."""
    counts, _ = np.histogram(lengths, bins=BINS)
    top = max(counts.max(), 1)
    lines = []
    for lo, hi, n in zip(BINS[:-1], BINS[1:], counts):
        if n:
            label = f"{lo + 1}-{hi}" if hi < 10**9 else f">{lo}"
            lines.append(f"  {label:>9} {n:>10,} {'#' * max(1, round(40 * n / top))}")
    return lines


def packing_report(ids, data, count: int) -> str:
    """How full `count` training batches are: real tokens over slots, per side."""
    rows = pipeline.rows_per_step(data, 1)
    ds, _ = pipeline.train_dataset(ids, data, rows, seed=0)
    real = {"inputs": 0, "targets": 0}
    batches = iter(ds)
    for _ in range(count):
        batch = next(batches)
        for key in real:
            real[key] += int((batch[f"{key}_segment_ids"] > 0).sum())
    slots = count * rows * data.max_length
    return (
        f"packing ({count} batches of {rows} rows x {data.max_length}): "
        f"source {100 * real['inputs'] / slots:.1f}%, target {100 * real['targets'] / slots:.1f}% real tokens / slots"
    )


def main() -> None:
    p = cli.parser(__doc__, "fxformer.data")
    p.add_argument("--workdir", help="also copy the tokenizer into this run directory")
    p.add_argument("--limit", type=int, default=200_000, help="pairs per split to count (0 = all)")
    p.add_argument("--packing_batches", type=int, default=20, help="training batches to measure packing on")
    p.add_argument("--baseline_pairs", type=int, default=200_000, help="training pairs the baseline learns from")
    args, config = cli.parse(p)
    if config is None:
        raise UserError("Give --config=<config file>, e.g. --config=configs/default.py.")
    for flag in ("packing_batches", "baseline_pairs"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be at least 1, not {getattr(args, flag)}.")
    workdir = cli.workdir(args.workdir) if args.workdir else None
    validate(config)
    data = config.data
    start = time.time()
    builder = corpora.prepare(data)
    tokenizer = tokenizer_for(data, builder, workdir)
    print(f"dataset: {builder.name}/{builder.builder_config.name} in {builder.data_dir}")
    print(f"tokenizer: {tokenizer.path} ({tokenizer.vocab_size:,} pieces)")

    ids = token_ids(data, builder, tokenizer)
    print(f"token ids: {ids}")
    splits = [data.train_split, data.eval_split, data.test_split]
    sources = {split: corpora.data_source(builder, split) for split in splits}
    print(f"\n| split | pairs | source tokens | target tokens | longer than {data.max_length} |")
    print("|---|---|---|---|---|")
    train_lengths = None
    for split in sources:
        stored = tokenized.load(ids, split)
        n = len(stored) if args.limit <= 0 else min(args.limit, len(stored))
        src, tgt = stored.inputs.lengths[:n], stored.targets.lengths[:n]
        longer = int((np.maximum(src, tgt) > data.max_length).sum())
        counted = f" (first {n:,} counted)" if n < len(stored) else ""
        print(f"| {split} | {len(stored):,}{counted} | {src.sum():,} | {tgt.sum():,} | {longer:,} |")
        if split == data.train_split:
            train_lengths, train_longer = np.maximum(src, tgt), longer
    print(f"\nlength histogram ({data.train_split}, tokens of the longer side, EOS included):")
    print("\n".join(histogram(train_lengths)))
    verb = "removes" if data.overlong == "drop" else "truncates"
    print(f"length filter: max_length {data.max_length} {verb} {train_longer:,} of {len(train_lengths):,} pairs")

    print(packing_report(ids, data, args.packing_batches))

    print(f"({time.time() - start:.0f}s)")
    if data.dataset not in corpora.EMBEDDED:  # IBM Model 1's dense table does not fit a real vocabulary
        print(
            f"baseline sacreBLEU ({data.test_split}): not computed "
            "(the word-by-word baseline is for the embedded corpora)"
        )
        return
    train, test = sources[data.train_split], sources[data.test_split]
    pair = lambda r: (r[data.source_lang].decode("utf-8"), r[data.target_lang].decode("utf-8"))
    train_pairs = [pair(train[i]) for i in range(min(len(train), args.baseline_pairs))]
    test_pairs = [pair(test[i]) for i in range(len(test))]
    print(f"baseline sacreBLEU ({data.test_split}): {baseline.baseline_bleu(train_pairs, test_pairs):.1f}")


if __name__ == "__main__":
    cli.run(main)
