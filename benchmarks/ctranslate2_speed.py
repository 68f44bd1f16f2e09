"""What the CTranslate2 export buys on a CPU: a trained run's test split decoded by fxformer and
by CTranslate2 (float32 and int8), greedy and beam 4, in one process on the same cores, each
warmed up, the median of three timed runs; sentences per second side by side and the BLEU of
each (sacreBLEU, the same references).

    python -m benchmarks.ctranslate2_speed --workdir=runs/default --out=docs/results/ct2-speed.json

The run is exported to CTranslate2 first (into a temporary folder, or `--ct2=DIR` if given);
CTranslate2 runs with `intra_threads` = the cores JAX's CPU client uses and `inter_threads=1`,
batches of the run's eval batch size, fxformer's length limit per batch as its longest source +
max_extra (CTranslate2's is per batch too). Prints a markdown table and writes the records.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(fn, repeats: int = 3):
    """(the median wall time over `repeats` runs after one warm-up, the warm-up's result)."""
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, result


def report(rows: list[dict], n: int, args, version: str) -> None:
    """The markdown table on stdout, and the records in `args.out` if given."""
    print(f"| engine | search | sentences/s | BLEU |  ({n} sentences of {args.split}, median of {args.repeats})")
    print("|---|---|---|---|")
    for row in sorted(rows, key=lambda r: (r["beam"], -n / r["s"])):
        search = "greedy" if row["beam"] == 1 else f"beam {row['beam']}"
        print(f"| {row['engine']} | {search} | {n / row['s']:.1f} | {row['bleu']} |")
    if args.out:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        record = {
            "command": " ".join(
                [sys.executable.rsplit("/", 1)[-1], "-m", "benchmarks.ctranslate2_speed", *sys.argv[1:]]
            ),
            "commit": head,
            "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t")
            if os.path.exists("/proc/cpuinfo")
            else "",
            "threads": args.threads,
            "sentences": n,
            "split": args.split,
            "ctranslate2": version,
            "rows": rows,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


def decode(run, translator, sources: list[list[str]], beam: int) -> list[str]:
    """CTranslate2's translations of `sources` (pieces), in the run's eval batches, limited per
    batch as fxformer limits it (its longest source, with </s>, + max_extra), as text."""
    batch, max_extra = run.config.data.eval_batch_size, run.config.decode.max_extra
    ids = {piece: i for i, piece in enumerate(run.tokenizer.vocabulary())}
    found = []
    for start in range(0, len(sources), batch):
        chunk = sources[start : start + batch]
        found += translator.translate_batch(
            chunk,
            beam_size=beam,
            max_batch_size=batch,
            length_penalty=run.config.decode.alpha if beam > 1 else 1.0,
            max_decoding_length=max(len(s) for s in chunk) + 1 + max_extra,
            suppress_sequences=[["<pad>"], ["<s>"]],
        )
    return [run.tokenizer.decode([ids[t] for t in r.hypotheses[0]]) for r in found]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, help="a trained run (exportable: model.norm=post)")
    p.add_argument("--split", default="test", help="the split decoded (default test)")
    p.add_argument("--limit", type=int, default=0, help="its first n sentences (0: all)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CTranslate2's intra_threads")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after the warm-up (the median is reported)")
    p.add_argument("--out", help="the JSON records to write")
    args = p.parse_args(argv)

    import ctranslate2
    import sacrebleu

    import fxformer
    from fxformer import evaluation, export

    run = fxformer.load(args.workdir)
    test = evaluation.split_test_set(run.config, args.split, args.limit, log=lambda *a: None)
    sources = [[run.tokenizer.piece(i) for i in run.tokenizer.encode_source(s).tolist()[:-1]] for s in test.sources]
    folder = tempfile.mkdtemp(prefix="ct2-speed-")
    rows = []

    def bleu(hypotheses):
        return round(sacrebleu.corpus_bleu(hypotheses, [test.references]).score, 2)

    for quantization in ("float32", "int8"):
        out = Path(folder) / quantization
        export.write_ctranslate2(run, out, quantization)
        translator = ctranslate2.Translator(
            str(out), device="cpu", compute_type=quantization, intra_threads=args.threads, inter_threads=1
        )
        for beam in (1, 4):
            median, times, hypotheses = timed(lambda t=translator, b=beam: decode(run, t, sources, b), args.repeats)
            rows.append({"engine": f"CTranslate2 {quantization}", "beam": beam, "s": median, "times": times})
            rows[-1]["bleu"] = bleu(hypotheses)
            print(f"CTranslate2 {quantization} beam {beam}: {median:.2f} s", file=sys.stderr)
    for beam in (1, 4):
        options = {"strategy": "greedy"} if beam == 1 else {"strategy": "beam", "beam_size": beam}
        median, times, hypotheses = timed(lambda o=options: run.translate(test.sources, **o), args.repeats)
        rows.append(
            {"engine": "fxformer (JAX, float32)", "beam": beam, "s": median, "times": times, "bleu": bleu(hypotheses)}
        )
        print(f"fxformer beam {beam}: {median:.2f} s", file=sys.stderr)
    report(rows, len(test.sources), args, ctranslate2.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
