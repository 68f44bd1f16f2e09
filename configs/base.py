"""Transformer (base) on WMT 2014 English->German, as in the paper.

    python -m fxformer.train --config=configs/base.py --workdir=runs/base

Needs WMT14 prepared with TFDS first (docs/data.md, "WMT 2014"). Table 3 rows start from here.

The paper's base recipe is fxformer's defaults (`fxformer/schema.py`, where every config field is
defined, with its default): the other configs override some of them.
"""

import ml_collections

from fxformer.schema import defaults


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The paper's base model, optimizer and data (sections 3, 5, 6)."""
    if arg:
        raise ValueError(f"configs/base.py takes no argument, not '{arg}'.")
    return defaults()
