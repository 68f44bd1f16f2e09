"""Learning curves of a run as PNG files: train loss, dev perplexity, dev BLEU (when training
measured it, `dev_bleu_every_steps`), learning rate.

    python -m fxformer.plot --workdir=runs/default            # writes runs/default/curves.png
    python -m fxformer.plot --workdir=runs/a --workdir=runs/b --out=compare.png --x=tokens_seen
    python -m fxformer.plot --workdir=runs/multi30k --panels=dev_bleu --x=minutes --out=bleu.png

Reads `W/metrics.jsonl` only (no JAX, no checkpoints), so it works during training too (and on
a folder that holds a copied metrics.jsonl alone). Each panel is plotted against steps (or `--x`
tokens_seen, epochs, wall_s, minutes); several workdirs are overlaid, labelled by their names.
"""

from __future__ import annotations

from fxformer import cli, marian, metrics, paths, png
from fxformer.errors import UserError

PANELS = (
    ("loss", "train loss (label-smoothed)", False),
    ("dev_ppl", "dev perplexity (per wordpiece)", True),
    ("dev_bleu", "dev BLEU (beam search, during training)", False),
    ("learning_rate", "learning rate", False),
)
PANEL_KEYS = tuple(key for key, _, _ in PANELS)
X_AXES = {
    "step": "step",
    "tokens_seen": "target tokens seen",
    "epochs": "epochs",
    "wall_s": "seconds of training",
    "minutes": "minutes of training",
}


def x_value(line: dict, x: str) -> float | None:
    """A metrics line's value on the axis `x` (minutes: its wall_s / 60), None where not logged."""
    if x == "minutes":
        return line["wall_s"] / 60 if "wall_s" in line else None
    return line.get(x)


def read_metrics(workdir: paths.PathLike) -> list[dict]:
    """The run's logged lines, or one sentence why there are none."""
    if marian.is_marian(workdir):
        raise UserError(f"{workdir} is a model imported from transformers' files: it has no training curves to plot.")
    logged = metrics.logged(paths.Workdir(workdir))
    if not logged:
        raise UserError(f"{workdir} has no metrics.jsonl yet; train first (it is written at each log step).")
    return logged


def labels(workdirs: list[str]) -> list[str]:
    """Each run's label: the fewest last parts of its path that tell the runs apart (`default` for
    one run; `x/default` and `y/default` beside each other)."""
    parts = [[p for p in str(w).split("/") if p] or [str(w)] for w in workdirs]
    for n in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-n:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{'/'.join(p)} ({i + 1})" for i, p in enumerate(parts)]  # the same run given twice


def plot(workdirs: list[str], out: paths.PathLike, x: str = "step", keys: tuple[str, ...] = ()) -> None:
    """The PANELS (those named in `keys`, else all) that the runs logged, against `x`."""
    plt = png.pyplot()
    runs = {name: read_metrics(w) for name, w in zip(labels(workdirs), workdirs)}
    if without := [name for name, lines in runs.items() if all(x_value(m, x) is None for m in lines)]:
        wanted = "wall_s" if x == "minutes" else x
        raise UserError(f"{', '.join(without)} logged no {wanted} in metrics.jsonl; plot against --x=step instead.")
    chosen = [p for p in PANELS if not keys or p[0] in keys]
    panels = [p for p in chosen if any(p[0] in m for lines in runs.values() for m in lines)]  # dev BLEU if measured
    if not panels:
        raise UserError(f"{', '.join(workdirs)} logged none of {', '.join(p[0] for p in chosen)}; leave out --panels.")
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (key, title, log_scale) in zip(axes[0], panels):
        for name, lines in runs.items():
            points = [(at, m[key]) for m in lines if key in m and (at := x_value(m, x)) is not None]
            if points:
                ax.plot(
                    [p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None, label=name
                )
        if log_scale:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel(X_AXES[x])
        if len(runs) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    png.save(fig, out)


def main() -> None:
    p = cli.parser(__doc__, "fxformer.plot", config=False, compiles=False)
    p.add_argument("--workdir", action="append", required=True, help="a run directory (repeat to overlay runs)")
    p.add_argument("--out", default="", help="the PNG file (default: W/curves.png of the first workdir)")
    p.add_argument("--x", default="step", choices=sorted(X_AXES), help="the horizontal axis (default: step)")
    p.add_argument(
        "--panels",
        default="",
        help=f"comma-separated, of {', '.join(PANEL_KEYS)} (default: every one logged)",
    )
    args, _ = cli.parse(p)
    keys = tuple(k for k in args.panels.split(",") if k)
    unknown = [k for k in keys if k not in PANEL_KEYS]
    if unknown:
        raise UserError(f"--panels: {', '.join(unknown)} is not a panel; choose from {', '.join(PANEL_KEYS)}.")
    out = args.out or str(paths.as_path(args.workdir[0]) / "curves.png")
    target = paths.as_path(out)
    if args.out and not paths.is_url(out) and (target.is_dir() or not target.parent.is_dir()):
        what = "is a directory" if target.is_dir() else f"is in a folder that does not exist ({target.parent})"
        raise UserError(f"--out={out} {what}; give a PNG file in an existing folder, e.g. --out=curves.png.")
    plot(args.workdir, out, args.x, keys)
    print(f"written: {out}")


if __name__ == "__main__":
    cli.run(main)
