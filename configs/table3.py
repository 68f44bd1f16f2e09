"""Table 3 of the paper: one config per row, named by the argument.

    python -m fxformer.train --config=configs/table3.py:B1 --workdir=runs/table3/B1

Rows: base, A1..A4, B1, B2, C1..C7, D1..D4, E, big. Blank cells are the base model's.
Table 3 reports dev (newstest2013) results with beam search and no checkpoint averaging.
"""

import ml_collections

from configs import base, big, with_overrides

ROWS = {
    "base": {},
    "A1": {"model.num_heads": 1, "model.d_k": 512, "model.d_v": 512},
    "A2": {"model.num_heads": 4, "model.d_k": 128, "model.d_v": 128},
    "A3": {"model.num_heads": 16, "model.d_k": 32, "model.d_v": 32},
    "A4": {"model.num_heads": 32, "model.d_k": 16, "model.d_v": 16},
    "B1": {"model.d_k": 16},
    "B2": {"model.d_k": 32},
    "C1": {"model.num_layers": 2},
    "C2": {"model.num_layers": 4},
    "C3": {"model.num_layers": 8},
    "C4": {"model.d_model": 256, "model.d_k": 32, "model.d_v": 32},
    "C5": {"model.d_model": 1024, "model.d_k": 128, "model.d_v": 128},
    "C6": {"model.d_ff": 1024},
    "C7": {"model.d_ff": 4096},
    "D1": {"model.dropout_rate": 0.0},
    "D2": {"model.dropout_rate": 0.2},
    "D3": {"label_smoothing": 0.0},
    "D4": {"label_smoothing": 0.2},
    "E": {"model.positional": "learned"},
    "big": big.OVERRIDES,
}

# The paper's published figures for each row: dev perplexity, dev BLEU, parameters x 1e6.
PAPER = {
    "base": (4.92, 25.8, 65),
    "A1": (5.29, 24.9, None),
    "A2": (5.00, 25.5, None),
    "A3": (4.91, 25.8, None),
    "A4": (5.01, 25.4, None),
    "B1": (5.16, 25.1, 58),
    "B2": (5.01, 25.4, 60),
    "C1": (6.11, 23.7, 36),
    "C2": (5.19, 25.3, 50),
    "C3": (4.88, 25.5, 80),
    "C4": (5.75, 24.5, 28),
    "C5": (4.66, 26.0, 168),
    "C6": (5.12, 25.4, 53),
    "C7": (4.75, 26.2, 90),
    "D1": (5.77, 24.6, None),
    "D2": (4.95, 25.5, None),
    "D3": (4.67, 25.3, None),
    "D4": (5.47, 25.7, None),
    "E": (4.92, 25.7, None),
    "big": (4.33, 26.4, 213),
}


def get_config(row: str = "base") -> ml_collections.ConfigDict:
    """The base config with Table 3 row `row` applied; dev evaluation without averaging."""
    if row not in ROWS:
        raise ValueError(f"Unknown Table 3 row '{row}'; choose one of {', '.join(ROWS)}.")
    config = with_overrides(base.get_config(), ROWS[row])
    config.average_last = 1
    return config
