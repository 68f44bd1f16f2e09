"""The command-line flags of the commands that use a trained run (evaluate, translate,
attention_maps, export): the workdir (repeated: an ensemble, where the command takes one), which
checkpoint(s), `--config.decode.*` overrides, the cluster.
"""

from __future__ import annotations

import argparse
import dataclasses

from fxformer import cli, compilecache, configfile, ensemble, marian, parallel, paths
from fxformer.config import DecodeOptions
from fxformer.errors import UserError


def parser(description: str, module: str, ensembles: bool = False) -> argparse.ArgumentParser:
    """An ArgumentParser for `python -m <module>` with the shared flags; `ensembles`: --workdir may
    be repeated (`fxformer.ensemble`), else a second one is refused by `parse`."""
    p = cli.parser(description, module, config=False)
    choices = {"strategy": DecodeOptions.STRATEGIES, "beam_variant": DecodeOptions.BEAM_VARIANTS}
    fields = [
        f"{f.name} ({', '.join(choices[f.name])})" if f.name in choices else f.name
        for f in dataclasses.fields(DecodeOptions)
    ]
    p.epilog = f"Change the search with --config.decode.<field>=<value>: {', '.join(fields)}."
    p.add_argument(
        "--workdir",
        action="append",
        required=True,
        help="a training run directory, or a Marian (OPUS-MT) directory transformers wrote (docs/interop.md)"
        + ("; repeated: an ensemble of the runs (the same tokenizer), searched as one model" if ensembles else ""),
    )
    p.add_argument(
        "--step",
        default="latest",
        help="the checkpoint: latest (default), best (best dev metric in training), a step number, or ema: the "
        "latest checkpoint's smoothed weights (ema0.999 names one of several ema_decay values)",
    )
    p.add_argument(
        "--average_last",
        type=int,
        default=None,
        help="average the K checkpoints ending at --step (default: the config's average_last for latest, else 1)",
    )
    if ensembles:
        p.add_argument(
            "--ensemble_average",
            default="probabilities",
            choices=ensemble.AVERAGES,
            help="how an ensemble combines its members' next-token distributions: the average of their "
            "probabilities (default, fairseq's) or of their log-probabilities, renormalized (Marian's, which does not "
            "renormalize)",
        )
    p.set_defaults(ensembles=ensembles)
    parallel.add_cluster_flags(p)
    return p


def parse(p: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """The flags, with `args.step` as `inference.restore` takes it ('latest', 'best' or a step
    number) and `args.overrides`: the (key, value) pairs of the --config.decode.* flags; the
    compilation cache turned on (`compilecache`)."""
    args, rest = p.parse_known_args(argv)
    if not args.ensembles:
        if len(args.workdir) > 1:
            raise UserError(
                f"{p.prog} takes one --workdir, not {len(args.workdir)}: ensembles are for translate and "
                "evaluate (an ensemble has no attention weights or exported weights of its own)."
            )
        args.workdir = args.workdir[0]
    compilecache.enable(args.compilation_cache)
    args.overrides = configfile.overrides(rest)
    args.step = checkpoint_choice(args.step)
    parallel.join_cluster(args)
    return args


def trained_runs(flags: list[str]) -> list[paths.Workdir | str]:
    """The repeated --workdir of an ensemble's command, each as `trained_run` reads it."""
    return [trained_run(flag) for flag in flags]


def trained_run(flag: str) -> paths.Workdir | str:
    """--workdir as `fxformer.load` takes it: a Marian directory transformers wrote (the path, read
    and never written), else a training run's `Workdir` (refused in one sentence if a file)."""
    return flag if marian.is_marian(flag) else cli.workdir(flag)


def out_folder(run_dir: paths.Workdir | str, out: str, under: str):
    """Where a command writes: `--out`, else the workdir's folder `under` ("eval", "attention"); a
    Marian directory (`trained_run`) is read and never written to, so it needs `--out`."""
    if out:
        return paths.as_path(out)
    if isinstance(run_dir, paths.Workdir):
        return run_dir.root / under
    raise UserError(f"{run_dir} is an imported model, whose directory is not written to: give --out=DIR.")


def checkpoint_choice(flag: str) -> int | str:
    """--step: 'latest', 'best', 'ema' (or 'ema<decay>', the smoothed weights) or a step number (an int)."""
    if flag in ("latest", "best") or flag.startswith("ema"):
        return flag
    if not flag.isdigit():
        raise UserError(f"--step takes 'latest', 'best', 'ema' or a step number, not '{flag}'.")
    return int(flag)
