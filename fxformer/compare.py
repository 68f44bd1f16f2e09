"""Compare systems on the same test sentences, as translation papers do: sacreBLEU's paired
bootstrap and approximate randomization tests (BLEU and chrF), each system against the first,
with the difference's 95% interval from the same resamples (`fxformer.significance`).

    python -m fxformer.compare --workdir=runs/base --workdir=runs/big --split=test
    python -m fxformer.compare --references=newstest.de baseline.de system.de --out=cmp.json

With workdirs (the baseline first): each run's translations of `--split` as `fxformer.evaluate`
writes them (W/eval/<split>-<step>....hyp.txt), read if that evaluation exists, else made now by
`fxformer.load(W).evaluate(split)` (the run's decode section; `--step`, `--average_last` as in
evaluate). The report is printed as a table and written as JSON beside the baseline's evaluations
(W/eval/compare-<split>-<names>.json) or to `--out`. With `--references`: translation files, one
line per reference line, compared as given; the report goes to `--out` if given.
"""

from __future__ import annotations

import argparse
import json
import re

from fxformer import api, cli, inferflags, paths, significance
from fxformer.errors import UserError


def translations(
    workdir: paths.Workdir, split: str, step, average_last, limit: int, log
) -> tuple[list[str], list[str]]:
    """(translations, references) of `split` (its first `limit` sentences if > 0) by the run at
    `workdir`: its evaluation's files if written, else evaluated now."""
    run = api.load(workdir, step, average_last, log=log)
    changes = run.restored.decode_changes
    result = workdir.eval_result(split, run.steps, best=step == "best", first=limit, decode=changes)
    if not result.exists():
        log(f"{workdir}: no {result.name} yet; evaluating {split}")
        result = paths.as_path(run.evaluate(split, limit, log=log)["path"])
    hyp, ref = (paths.split_lines(result.with_suffix(s).read_bytes(), str(result)) for s in (".hyp.txt", ".ref.txt"))
    return hyp, ref


def from_workdirs(args, log) -> tuple[dict, paths.PathLike]:
    """The report on the runs of `--workdir` (baseline first), and where it is written."""
    workdirs = [cli.workdir(w) for w in args.workdir]
    step = inferflags.checkpoint_choice(args.step)
    systems, references = [], None
    for workdir in workdirs:
        hyp, ref = translations(workdir, args.split, step, args.average_last, args.limit, log)
        if references is not None and ref != references:
            raise UserError(
                f"{workdir} was evaluated on other {args.split} sentences than {workdirs[0]}; "
                "compare runs of one data set."
            )
        references = ref
        systems.append((workdir.root.name, hyp))  # runs/big -> big
    names = "-".join(re.sub(r"[^\w.-]", "_", name) for name, _ in systems)
    out = args.out or workdirs[0].eval / f"compare-{args.split}-{names}.json"
    return significance.compare(systems, references), out


def from_files(args) -> dict:
    """The report on the translation files given, against `--references`."""

    def read(flag: str, name: str) -> list[str]:
        return paths.split_lines(cli.read_flag_file(flag, name), name)

    systems = [(name, read("systems", name)) for name in args.systems]
    return significance.compare(systems, read("references", args.references))


def parser() -> argparse.ArgumentParser:
    p = cli.parser(__doc__, "fxformer.compare", config=False)
    p.add_argument("systems", nargs="*", help="with --references: translation files, the baseline first")
    p.add_argument("--workdir", action="append", default=[], help="a training run; repeat it, the baseline first")
    p.add_argument("--references", default="", help="the reference file that the translation files translate")
    p.add_argument("--split", default="test", help="with --workdir: the split compared (default: test)")
    p.add_argument("--step", default="latest", help="with --workdir: latest (default), best or a step number")
    p.add_argument("--average_last", type=int, default=None, help="with --workdir: as fxformer.evaluate takes it")
    p.add_argument("--limit", type=int, default=0, help="with --workdir: the split's first N sentences only")
    p.add_argument(
        "--out", default="", help="write the report as JSON here (default, with --workdir: W/eval/ of the first)"
    )
    return p


def main() -> None:
    args, _ = cli.parse(parser())  # the compilation cache too, for a run evaluated now
    if bool(args.workdir) == bool(args.references):
        raise UserError(
            "Give the runs (--workdir=A --workdir=B) or the files (--references=REF A.txt B.txt), not both."
        )
    if args.workdir and args.systems:
        raise UserError(f"Translation files ({', '.join(args.systems)}) go with --references, not --workdir.")
    if args.workdir:
        report, out = from_workdirs(args, cli.log_to_stderr)
    else:
        report, out = from_files(args), args.out
    print(significance.table(report))
    if out:
        paths.write_atomic(paths.as_path(out), json.dumps(report, indent=1) + "\n")
        print(f"written in {out}")


if __name__ == "__main__":
    cli.run(main)
