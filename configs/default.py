"""A small Transformer on the embedded English->German corpus, sized for a 2-core CPU.

    python -m fxformer.train --config=configs/default.py --workdir=runs/default

The same architecture and training recipe as the paper, scaled down: trains offline in
minutes and is what the README's main job runs.
"""

import ml_collections

from configs import base
from fxformer.config import with_overrides


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The base recipe, shrunk to the embedded corpus."""
    if arg:
        raise ValueError(f"configs/default.py takes no argument, not '{arg}'.")
    return with_overrides(
        base.get_config(),
        {
            "model.num_layers": 3,
            "model.d_model": 128,
            "model.d_ff": 512,
            "model.num_heads": 4,
            "model.max_len": 128,
            "data.dataset": "embedded",
            "data.vocab_size": 1000,
            "data.tokenizer_sentences": 100_000,
            "data.max_length": 64,
            "data.tokens_per_batch": 4096,
            "warmup_steps": 400,
            "learning_rate_scale": 1.0,
            "num_train_steps": 600,  # about 5 minutes on 2 CPU cores (the quick start, with evaluation: about 6)
            "checkpoint_every_steps": 200,
            "checkpoint_every_minutes": 2.0,
            "keep_checkpoints": 5,
            "log_every_steps": 50,
            "eval_every_steps": 200,
            "average_last": 1,
        },
    )
