"""Learning curves of a run as PNG files: train loss, dev perplexity, learning rate.

    python -m fxformer.plot --workdir=runs/default            # writes runs/default/curves.png
    python -m fxformer.plot --workdir=runs/a --workdir=runs/b --out=compare.png

Reads `W/metrics.jsonl` only (no JAX, no checkpoints), so it works during training too. Each
panel is plotted against steps; several workdirs are overlaid, labelled by their names.
"""

from __future__ import annotations

import json

from fxformer import cli, paths

PANELS = (
    ("loss", "train loss (label-smoothed)", False),
    ("dev_ppl", "dev perplexity (per wordpiece)", True),
    ("learning_rate", "learning rate", False),
)


def read_metrics(workdir: paths.PathLike) -> list[dict]:
    path = paths.Workdir(workdir).metrics
    if not path.exists():
        raise cli.UserError(f"{workdir} has no metrics.jsonl yet; train first (it is written at each log step).")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(workdirs: list[str], out: paths.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    runs = {str(w).rstrip("/").rsplit("/", 1)[-1] or str(w): read_metrics(w) for w in workdirs}
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6))
    for ax, (key, title, log_scale) in zip(axes, PANELS):
        for name, lines in runs.items():
            points = [(m["step"], m[key]) for m in lines if key in m]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None,
                        label=name)  # fmt: skip
        if log_scale:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("step")
        if len(runs) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = paths.as_path(out)
    with out.open("wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def main() -> None:
    p = cli.parser(__doc__, "fxformer.plot", config=False)
    p.add_argument("--workdir", action="append", required=True, help="a run directory (repeat to overlay runs)")
    p.add_argument("--out", default="", help="the PNG file (default: W/curves.png of the first workdir)")
    args, _ = cli.parse(p)
    out = args.out or str(paths.as_path(args.workdir[0]) / "curves.png")
    plot(args.workdir, out)
    print(f"written: {out}")


if __name__ == "__main__":
    cli.run(main)
