"""Transformer (big) on WMT 2014 English->German: the last row of Table 3.

python -m fxformer.train --config=configs/big.py --workdir=runs/big
"""

import ml_collections

from configs import base
from fxformer.config import with_overrides

# The big model differs from base in these fields only (Table 3, last row).
OVERRIDES = {
    "model.d_model": 1024,
    "model.d_ff": 4096,
    "model.num_heads": 16,
    "model.dropout_rate": 0.3,
    "num_train_steps": 300_000,
    "checkpoint_every_steps": 600,  # ~10 minutes at the paper's 1.0 s/step
    "average_last": 20,
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The paper's big model."""
    if arg:
        raise ValueError(f"configs/big.py takes no argument, not '{arg}'.")
    return with_overrides(base.get_config(), OVERRIDES)
