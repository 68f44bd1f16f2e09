"""A small-corpus recipe: Multi30k English->German (task 1), or any corpus of its size.

    python -m fxformer.train --config=configs/multi30k.py:/path/to/multi30k --workdir=runs/multi30k
    python -m fxformer.evaluate --workdir=runs/multi30k --split=test

The argument is the folder that holds `task1/raw/` of the public multi30k/dataset repository
(or `data/task1/raw/`, or the `raw` folder itself), with its file names: train.{en,de}.gz,
val.{en,de}.gz, test_2016_flickr.{en,de}.gz (29,000 / 1,014 / 1,000 pairs; val is the dev
split, test2016 the test split). Another corpus of this size: override the six
`data.*_file` fields instead (docs/data.md, "Multi30k").

The recipe departs from the paper's base where 29,000 pairs call for it (each departure a named
field): a smaller model, more dropout (residual, attention and ReLU), a small shared BPE, a
smaller batch and shorter warm-up, and many epochs. The pilot that chose it, on val only, is in
experiments/results/multi30k/README.md. Tried there and not kept: residual dropout 0.3 without
attention and ReLU dropout (P2: learned too slowly for two hours), twice the peak learning rate
(P4a: diverged), residual dropout 0.2 (P4b: val BLEU 37.80, below this recipe's 40.33). The length
penalty was re-chosen on val by P5 (the same recipe re-run): alpha 1.5, not 1.0.
"""

import ml_collections

from configs import base
from fxformer.config import with_overrides

FILES = {  # split -> the stem of its files in task1/raw
    "": "train",
    "validation_": "val",
    "test_": "test_2016_flickr",
}
RAW = ("task1/raw", "data/task1/raw", "raw", "")  # where under the argument the files may be

RECIPE = {
    "model.num_layers": 3,
    "model.d_model": 256,
    "model.d_ff": 1024,
    "model.num_heads": 4,
    "model.dropout_rate": 0.1,  # P3: dropout 0.3 (P1, P2) learned too slowly for two hours
    "model.attention_dropout_rate": 0.1,
    "model.relu_dropout_rate": 0.1,
    "model.max_len": 128,
    "data.dataset": "text",
    "data.vocab_size": 8000,
    "data.tokenizer_sentences": 100_000,
    "data.max_length": 64,
    "data.tokens_per_batch": 2048,  # P2: more updates for the same tokens than P1's 4,096
    "data.eval_batch_size": 128,
    "warmup_steps": 500,
    "learning_rate_scale": 1.0,
    "num_train_steps": 5600,  # about 111 minutes on the 2-core CPU with its dev evaluations
    "train_minutes": 115.0,  # and never more: on a slower machine the time budget ends the run first
    "checkpoint_every_steps": 400,
    "checkpoint_every_minutes": 0.0,  # saves at fixed steps only: averaged checkpoints are evenly spaced
    "keep_checkpoints": 20,
    "log_every_steps": 100,
    "eval_every_steps": 400,
    "dev_bleu_every_steps": 800,
    "dev_bleu_sentences": 0,  # the whole val split
    "best_metric": "dev_bleu",
    "average_last": 5,  # chosen on P3's val: the last 5 (40.21) over 8, 3 and 1 (40.16, 39.78, 38.67)
    # P5's val (the frozen recipe re-run, last 5 averaged): 40.40 at 1.5 against 40.12 at 1.0, 40.09 at
    # 0.6, 39.47 at 2.0; the rule written before it ran: the best replaces 1.0 if >= 0.2 better
    "decode.alpha": 1.5,
}


def raw_folder(arg: str) -> str:
    """The folder under `arg` that holds the Multi30k files; one sentence if none does."""
    import os

    for sub in RAW:
        folder = os.path.normpath(os.path.join(os.path.expanduser(arg), sub))
        if os.path.isfile(os.path.join(folder, "train.en.gz")):
            return folder
    raise ValueError(
        f"No Multi30k files under '{arg}': expected task1/raw/train.en.gz there (git clone the public "
        "multi30k/dataset repository and give its data/ folder), or set the data.*_file fields."
    )


def set_files(config: ml_collections.ConfigDict, arg: str) -> ml_collections.ConfigDict:
    """`config` reading the Multi30k files under `arg` (train, val as dev, test2016 as test)."""
    folder = raw_folder(arg)
    src, tgt = config.data.source_lang, config.data.target_lang
    for prefix, stem in FILES.items():
        config.data[f"{prefix}source_file"] = f"{folder}/{stem}.{src}.gz"
        config.data[f"{prefix}target_file"] = f"{folder}/{stem}.{tgt}.gz"
    return config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The small-corpus recipe on the Multi30k files under `arg` (without `arg`: no files set)."""
    config = with_overrides(base.get_config(), RECIPE)
    return set_files(config, arg) if arg else config
