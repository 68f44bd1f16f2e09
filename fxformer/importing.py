"""Import a Marian (OPUS-MT) model that transformers wrote into a new workdir, to fine-tune it.

    python -m fxformer.importing opus-mt-en-de --workdir=runs/ft --config=configs/default.py \\
        --config.learning_rate_scale=0.1 --config.warmup_steps=200 --config.num_train_steps=2000
    python -m fxformer.train --workdir=runs/ft      # trains it on the corpus the config names

The workdir gets the model section from the Marian directory's config.json (the architecture and
its departures from the paper, as `fxformer.load` reads them: docs/interop.md), the data and
training sections from --config and its overrides, the Marian tokenizer's files (`W/marian/`:
source.spm, target.spm, vocab.json, config.json, in place of tokenizer.model) and the imported
parameters (`W/imported/0`), which the run's first step starts from with fresh Adam moments.
Then `fxformer.train --workdir=W` trains it on any corpus the config names, resumes, keeps its
best and averages, and `evaluate`, `translate` and `attention_maps` read it as any run. The
dropout rates come from config.json too, unless --config.model.<rate>=<value> sets them; any
other model field is the imported model's and is refused as an override. Nothing is written
into the Marian directory, and a refused import leaves no workdir.
"""

from __future__ import annotations

from pathlib import Path

import jax

from fxformer import checkpoint, cli, configfile, marian, paths
from fxformer.config import resolve_derived, validate, write_workdir_config
from fxformer.errors import UserError

DROPOUTS = ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate")  # the run may change these


def check_overrides(overridden: set[str], fields) -> None:
    """Refuse, in one sentence, an override of a model field the import sets, but the dropout rates."""
    for key in sorted(overridden & {f"model.{name}" for name in fields}):
        if key.removeprefix("model.") not in DROPOUTS:
            raise UserError(
                f"--config.{key} is the imported model's (config.json); only the dropout rates "
                f"({', '.join(DROPOUTS)}) may be set for fine-tuning."
            )


def imported_config(config, fields: dict, overridden: set[str], vocab_size: int):
    """`config` (--config and its overrides) with the imported model's fields in its model section,
    but the dropout rates the command line set."""
    config.model.update({k: v for k, v in fields.items() if f"model.{k}" not in overridden})
    config.data.vocab_size = vocab_size  # the imported vocabulary's, recorded (no tokenizer is trained)
    config.data.max_length = min(config.data.max_length, fields["max_len"])
    return resolve_derived(config)


def write(workdir: paths.Workdir, source: Path, config, params) -> None:
    """The workdir of the fine-tuning run: the tokenizer's files, the parameters, then the config
    (last: a workdir without W/config.json is no run)."""
    workdir.marian.mkdir(parents=True, exist_ok=True)
    for name in marian.TOKENIZER_FILES:
        paths.write_atomic(workdir.marian / name, (source / name).read_bytes())
    with checkpoint.open_manager(workdir.imported, asynchronous=False) as manager:
        checkpoint.save_params(manager, 0, params, {"imported_from": str(source.resolve())})
    write_workdir_config(config, workdir)


def main() -> None:
    p = cli.parser(__doc__, "fxformer.importing", compiles=False)
    p.add_argument("marian", help="a Marian directory transformers wrote (save_pretrained, or a model repository)")
    p.add_argument("--workdir", required=True, help="the new run directory (absent or empty)")
    args, config = cli.parse(p)
    if config is None:
        raise UserError(
            "Give --config=FILE: the data and training sections of the fine-tuning run (configs/default.py, or yours)."
        )
    source = Path(args.marian)
    if not marian.is_marian(source):
        raise UserError(f"{source} is no Marian directory: its config.json should say model_type marian.")
    workdir = cli.workdir(args.workdir)
    if workdir.root.exists() and any(workdir.root.iterdir()):
        raise UserError(f"{workdir} is not empty; import into a new --workdir.")
    overridden = {key for key, _ in configfile.overrides(p.parse_known_args()[1])}
    check_overrides(
        overridden, marian.model_fields(marian.read_config(source), 0, False)
    )  # before the weights are read
    fields, params, tokenizer = marian.read(source)
    config = imported_config(config, fields, overridden, tokenizer.vocab_size)
    validate(config, jax.default_backend(), jax.process_count())
    paths.check_writable(workdir, "the imported model is written")
    made = not workdir.root.exists()
    try:
        write(workdir, source, config, params)
    except BaseException:
        if made:  # a refused or interrupted import leaves no half a workdir
            workdir.root.rmtree(missing_ok=True)
        raise
    count = sum(x.size for x in jax.tree.leaves(params))
    print(f"imported {source} ({count:,} parameters, vocabulary {tokenizer.vocab_size:,}) into {workdir.root}")
    print(f"fine-tune it: python -m fxformer.train --workdir={workdir.root}")


if __name__ == "__main__":
    cli.run(main)
