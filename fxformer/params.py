"""Parameter counts, and Table 3 side by side with the paper.

    python -m fxformer.params --table3
    python -m fxformer.params --config=configs/big.py
    fxformer-params --table3=/path/to/fxformer/configs/table3.py   # installed: the checkout's rows

Counts use a shared vocabulary of `--vocab_size` tokens (default: the config's
data.vocab_size; 37,000, the paper's WMT14 BPE, for --table3) and abstract evaluation
(`jax.eval_shape`), so even the big model is counted without memory.
"""

from __future__ import annotations

from pathlib import Path

import jax
import ml_collections
import numpy as np

from fxformer import cli, configfile
from fxformer.config import validate
from fxformer.errors import UserError
from fxformer.model import Transformer, TransformerConfig, init_params

PAPER_VOCAB_SIZE = 37_000


def count_parameters(model_config: ml_collections.ConfigDict, vocab_size: int) -> int:
    """Number of trainable parameters of the model a config describes."""
    config = TransformerConfig.from_config(model_config, vocab_size)
    shapes = jax.eval_shape(lambda: init_params(Transformer(config), jax.random.key(0)))
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))


def millions(count: int) -> str:
    """34,304 -> '0.0343M', 63,021,568 -> '63.0M': three significant figures below ten million."""
    return f"{count / 1e6:.3g}M" if count < 10_000_000 else f"{count / 1e6:.1f}M"


TABLE3 = str(Path(__file__).resolve().parent.parent / "configs" / "table3.py")  # the rows, in a checkout


def table3(vocab_size: int = PAPER_VOCAB_SIZE, rows_file: str = TABLE3) -> str:
    """A markdown table of every Table 3 row of the config file `rows_file` (its ROWS, PAPER and
    get_config): its settings, our count, the paper's, the gap."""
    rows = configfile.load_module(rows_file)

    columns = ["row", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "positions"]
    columns += ["params x1e6", "paper x1e6", "diff %"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows.ROWS:
        c = rows.get_config(row)
        m = c.model
        count = count_parameters(m, vocab_size) / 1e6
        paper = rows.PAPER[row][2]
        diff = f"{100 * (count - paper) / paper:+.1f}" if paper else ""
        cells = [
            row,
            m.num_layers,
            m.d_model,
            m.d_ff,
            m.num_heads,
            m.d_k,
            m.d_v,
            m.dropout_rate,
            c.label_smoothing,
            m.positional,
            f"{count:.1f}",
            paper or "",
            diff,
        ]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = cli.parser(__doc__, "fxformer.params")
    p.add_argument(
        "--table3",
        nargs="?",
        const=TABLE3,
        default="",
        metavar="ROWS_FILE",
        help="print every Table 3 row against the paper; the rows are configs/table3.py of the checkout "
        "(installed: give --table3=/path/to/fxformer/configs/table3.py)",
    )
    p.add_argument("--vocab_size", type=int, default=0, help="shared vocabulary size (default: the config's)")
    args, config = cli.parse(p)
    if args.vocab_size < 0:
        raise UserError(f"--vocab_size must be positive, not {args.vocab_size}.")
    if args.table3:
        if not Path(args.table3).is_file():
            raise UserError(
                f"--table3 reads the rows from a checkout's configs/table3.py, and {args.table3} does not exist "
                "(an installed package holds no configs): give --table3=/path/to/fxformer/configs/table3.py."
            )
        print(table3(args.vocab_size or PAPER_VOCAB_SIZE, args.table3))
    elif config is not None:
        validate(config, jax.default_backend())
        vocab_size = args.vocab_size or config.data.vocab_size
        count = count_parameters(config.model, vocab_size)
        print(f"{args.config}: {count:,} parameters ({millions(count)}) with a {vocab_size:,}-token vocabulary")
    else:
        raise UserError("Give --table3 or --config=<config file[:arg]>.")


if __name__ == "__main__":
    cli.run(main)
