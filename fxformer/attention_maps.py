"""What the heads of a trained run attend to, as the paper's appendix shows it (Figures 3 to 5).

    python -m fxformer.attention_maps --workdir=runs/default --source="The woman has seen the man who loves the dog."
    python -m fxformer.attention_maps --workdir=runs/base --average_last=5 --source="..." --target="..." --json
    python -m fxformer.attention_maps --workdir=runs/default --source="..." --view=lines --layer=2 --head=all

The weights are those of the teacher-forced pass on (source, target), dropout off, as in
training: every layer and head of encoder self-attention, decoder self-attention and
encoder-decoder attention. Without --target the model's own translation is printed and used:
the search `fxformer.translate` runs, with the same checkpoint choice and --config.decode.*
settings. Layers and heads are numbered from 1, as in the paper ("layer 5 of 6").

Writes into W/attention/<name>/ only (--name, else the source's first words and the checkpoint;
--out=DIR: into DIR/<name>/ instead, as a Marian directory transformers wrote needs):
  encoder.png decoder.png cross.png   a heatmap per layer (rows of panels) and head (columns);
                                      in a panel each row is a query, each column a key
  lines-<kind>-layer<L>-<head>.png    Figure 3's view: the tokens in two columns, a line from each
                                      query (left) to each key (right), opacity = weight (under 0.1 left
                                      out), a colour a head
  summary.json                        per head: the entropy of its attention and where it looks most
  weights.json (with --json)          the weights themselves, per kind, layer and head, with the tokens
Decoder positions are labelled by the token they read (`<s>` first) in decoder self-attention,
and by the token they predict in encoder-decoder attention. In a notebook, the weights and a figure:
`w = fxformer.load("runs/default").attention("The dog sleeps.")`, then
`attention_maps.draw_grid(w, "cross", "cross.png", title="")`.
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import jax
import numpy as np

from fxformer import api, attention_weights, cli, inferflags, marian, parallel, paths, png
from fxformer.attention_weights import KINDS, Weights, check_sentences
from fxformer.config import load_workdir_config
from fxformer.errors import UserError

AXES = {  # (queries, keys) of each kind, as the figures name them
    "encoder": ("source wordpiece", "source wordpiece"),
    "decoder": ("decoder position (the token it reads)", "decoder position (the token it reads)"),
    "cross": ("decoder position (the token it predicts)", "source wordpiece"),
}
MIN_LINE = 0.1  # the line view leaves out weaker weights: a diffuse head would grey the whole figure


# ---------------------------------------------------------------------------------------------
# A summary of each head


def position_name(kind: str, query: int, key: int, num_keys: int) -> str:
    """Words for where a query's strongest key lies: the sentence's end or start, or an offset."""
    if kind != "decoder" and key == num_keys - 1:
        return "end of sentence"  # the source's </s>
    if kind == "decoder" and key == 0:
        return "start of sentence"  # <s>
    offset = key - query
    names = {0: "same position"} if kind == "cross" else {0: "self", -1: "previous token", 1: "next token"}
    return names.get(offset, f"{-offset} back" if offset < 0 else f"{offset} ahead")


def head_summary(w: Weights) -> list[dict]:
    """Per kind, layer and head (from 1): the mean entropy of its queries' attention in bits, and
    the place (`position_name`) most of its queries attend to most, with the share of queries that do."""
    rows = []
    for kind in KINDS:
        a = w.of(kind).astype(np.float64)  # [N, h, q, k]
        logs = np.log2(np.where(a > 0, a, 1.0))  # masked keys (weight 0) add nothing
        entropy = -(a * logs).sum(-1).mean(-1)  # [N, h]
        for layer in range(a.shape[0]):
            for head in range(a.shape[1]):
                strongest = a[layer, head].argmax(-1)
                places = collections.Counter(
                    position_name(kind, i, int(j), a.shape[-1]) for i, j in enumerate(strongest)
                )
                most, count = places.most_common(1)[0]
                rows.append(
                    {
                        "kind": kind,
                        "layer": layer + 1,
                        "head": head + 1,
                        "entropy_bits": round(float(entropy[layer, head]), 4),
                        "attends_most_to": most,
                        "share": round(count / len(strongest), 4),
                    }
                )
    return rows


def summary_table(rows: list[dict]) -> str:
    """The summary as aligned text, one head a line."""
    lines = [f"{'attention':<26} {'layer':>5} {'head':>4} {'entropy':>8}  attends most to (share of queries)"]
    for r in rows:
        lines.append(
            f"{KINDS[r['kind']]:<26} {r['layer']:>5} {r['head']:>4} {r['entropy_bits']:>6.2f} b  "
            f"{r['attends_most_to']} ({r['share']:.0%})"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Figures


def fitting_dpi(fig, dpi: float, most: int = 16000) -> float:
    """`dpi`, lowered if the figure would be wider or taller than `most` pixels."""
    return min(dpi, most / max(fig.get_size_inches()))


def draw_grid(w: Weights, kind: str, path: paths.PathLike, title: str, dpi: float = 100) -> None:
    """One heatmap per layer (rows) and head (columns), wordpieces on the outer panels' axes,
    weights from 0 (white) to 1 (dark) on one scale for every panel."""
    plt = png.pyplot()
    a = w.of(kind)
    layers, heads, q, k = a.shape
    queries, keys = w.axes(kind)
    cell = max(0.14, 1.4 / max(q, k))  # inches a wordpiece (7.5 pt labels), panels at least 1.4 in
    font = min(9.0, 72 * cell * 0.75)
    gap, left, right, bottom, top = 0.12, 1.0, 1.0, 1.0, 0.7  # inches; labels beyond are kept by savefig
    width = left + heads * k * cell + (heads - 1) * gap + right
    height = bottom + layers * q * cell + (layers - 1) * gap + top
    fig, axes = plt.subplots(layers, heads, figsize=(width, height), squeeze=False)
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=gap / (k * cell),
        hspace=gap / (q * cell),
    )  # square cells, panels close together
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            image = ax.imshow(a[layer, head], cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
            ax.set_xticks(range(k), keys if layer == layers - 1 else [], rotation=90, fontsize=font)
            ax.set_yticks(range(q), queries if head == 0 else [], fontsize=font)
            ax.tick_params(length=0, pad=1)
            if layer == 0:
                ax.set_title(f"head {head + 1}", fontsize=9)
            if head == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=9)
    bar_height = min(2.5, height - bottom - top)
    bar = fig.add_axes((1 - (right - 0.15) / width, bottom / height, 0.12 / width, bar_height / height))
    fig.colorbar(image, cax=bar, label="attention weight")
    fig.suptitle(
        f"{KINDS[kind]} ({title})\nrows: {AXES[kind][0]}; columns: {AXES[kind][1]}",
        fontsize=10,
        y=1 - 0.08 / height,
        va="top",
    )
    png.save(fig, path, fitting_dpi(fig, dpi), tight=True)


def draw_lines(w: Weights, kind: str, layer: int, heads: list[int], path: paths.PathLike, title: str, dpi=100) -> None:
    """Figure 3's view of one layer (from 1): queries in the left column, keys in the right, a line
    from each query to each key whose opacity is the weight (from `MIN_LINE`), one colour a head."""
    plt = png.pyplot()
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Patch

    a = w.of(kind)[layer - 1]  # [h, q, k]
    queries, keys = w.axes(kind)
    n = max(len(queries), len(keys))
    y = lambda count: -np.arange(count) - (n - count) / 2  # noqa: E731  (top to bottom, centred)
    palette = plt.get_cmap("tab10" if a.shape[0] <= 10 else "hsv", max(a.shape[0], 1))
    segments, colours = [], []
    for head in heads:
        r, g, b, _ = palette(head - 1)
        for i, j in zip(*np.nonzero(a[head - 1] >= MIN_LINE)):
            segments.append([(0.0, y(len(queries))[i]), (1.0, y(len(keys))[j])])
            colours.append((r, g, b, float(a[head - 1, i, j])))
    fig, ax = plt.subplots(figsize=(5.0, 0.22 * n + 1.2))
    ax.add_collection(LineCollection(segments, colors=colours, linewidths=1.6))
    for x, tokens, align in ((-0.04, queries, "right"), (1.04, keys, "left")):
        for pos, token in zip(y(len(tokens)), tokens):
            ax.text(x, pos, token, ha=align, va="center", fontsize=9)
    ax.set_xlim(-0.75, 1.75)
    ax.set_ylim(-n + 0.5, 0.5)
    ax.axis("off")
    which = f"head {heads[0]}" if len(heads) == 1 else "all heads"
    ax.set_title(f"{KINDS[kind]}, layer {layer} of {w.of(kind).shape[0]}, {which}\n({title})", fontsize=9)
    if len(heads) > 1:
        handles = [Patch(color=palette(h - 1), label=f"head {h}") for h in heads]
        ax.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(len(heads), 8),
            fontsize=7,
            frameon=False,
        )
    png.save(fig, path, fitting_dpi(fig, dpi), tight=True)


# ---------------------------------------------------------------------------------------------
# The command


def default_name(source: str, steps: list[int], step: int | str) -> str:
    """A folder name from the source's first words and the checkpoint(s): `the-man-who-sees-600`
    (`-imported` for a model imported from transformers' files)."""
    words = "-".join(re.findall(r"\w+", source.lower())[:6]) or "sentence"
    return f"{words}-{paths.checkpoint_label(steps, step == 'best') if steps else 'imported'}"


def heads_of(flag: str, num_heads: int) -> list[int]:
    """--head: a number from 1, or all."""
    if flag == "all":
        return list(range(1, num_heads + 1))
    if not flag.isdigit() or not 1 <= int(flag) <= num_heads:
        raise UserError(
            f"--head={flag} does not exist: this model has {num_heads} heads a layer (1 to {num_heads}), "
            "or give --head=all."
        )
    return [int(flag)]


def main() -> None:
    p = inferflags.parser(__doc__, "fxformer.attention_maps")
    p.add_argument("--source", required=True, help="the source sentence")
    p.add_argument("--target", default=None, help="its translation (default: the model's own, printed)")
    p.add_argument("--name", default="", help="the folder under W/attention/ (default: the source's first words)")
    p.add_argument(
        "--out",
        default="",
        help="write the folder under this one instead of W/attention/ (needed for an imported model)",
    )
    p.add_argument(
        "--view",
        default="all",
        choices=("all", "grid", "lines"),
        help="the grids, the line view, or both (default); the summary always",
    )
    p.add_argument("--kind", default="encoder", choices=tuple(KINDS), help="the attention the line view shows")
    p.add_argument("--layer", type=int, default=None, help="the line view's layer, from 1 (default: the last but one)")
    p.add_argument("--head", default="all", help="the line view's head, from 1, or all (default)")
    p.add_argument("--json", action="store_true", help="also write the weights themselves (weights.json)")
    p.add_argument("--dpi", type=float, default=100, help="resolution of the PNG files (default: 100)")
    args = inferflags.parse(p)
    log = cli.log_to_stderr

    run_dir = inferflags.trained_run(args.workdir)
    if isinstance(run_dir, paths.Workdir):  # layers and heads checked before any restore
        model = load_workdir_config(run_dir).model
        num_layers, num_heads = model.num_layers, model.num_heads
    else:
        num_layers, num_heads = marian.layers_and_heads(Path(run_dir))
    parent = inferflags.out_folder(run_dir, args.out, "attention")
    layer = max(1, num_layers - 1) if args.layer is None else args.layer
    if not 1 <= layer <= num_layers:
        raise UserError(f"--layer={layer} does not exist: this model has {num_layers} layers (1 to {num_layers}).")
    heads = heads_of(args.head, num_heads)
    if args.name and (not re.fullmatch(r"[\w.-]+", args.name) or args.name in (".", "..")):
        raise UserError(f"--name={args.name} is not a plain folder name; use letters, digits, '-', '_' and '.'.")
    if not 0 < args.dpi < 2000:  # a NaN too
        raise UserError(f"--dpi={args.dpi:g} is not a resolution; give dots per inch above 0 and below 2000, e.g. 100.")
    check_sentences(args.source, args.target)
    paths.check_writable(parent, "the figures are written")

    run = api.load(run_dir, args.step, args.average_last, args.overrides, log, keep_average=False)
    w = attention_weights.pair_weights(run.restored, args.source, args.target, log)
    if w.translated:
        parallel.print_once(f"translation: {w.target}")
    rows = head_summary(w)
    if jax.process_index() == 0:
        out = parent / (args.name or default_name(args.source, run.steps, args.step))
        steps = run.steps
        title = f"{'best ' if args.step == 'best' else ''}checkpoint step {steps[-1]}" if steps else "imported"
        title += f", average of {len(steps)}" if len(steps) > 1 else ""
        written = write_outputs(w, rows, out, args.view, (args.kind, layer, heads), title, steps, args.dpi, args.json)
        print(summary_table(rows))
        print(f"written in {out}: {', '.join(written)}")


def write_outputs(
    w: Weights,
    rows: list[dict],
    out,
    view: str,
    line_view: tuple,
    title: str,
    steps: list[int],
    dpi: float,
    weights_too: bool,
) -> list[str]:
    """The figures `view` asks for (`line_view`: kind, layer, heads), summary.json and (`weights_too`)
    weights.json in the directory `out`, made if needed; the names written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if view in ("all", "grid"):
        for kind in KINDS:
            draw_grid(w, kind, out / f"{kind}.png", title, dpi)
            written.append(f"{kind}.png")
    if view in ("all", "lines"):
        kind, layer, heads = line_view
        name = f"lines-{kind}-layer{layer}-{'all' if len(heads) > 1 else f'head{heads[0]}'}.png"
        draw_lines(w, kind, layer, heads, out / name, title, dpi)
        written.append(name)
    about = {"source": w.source, "target": w.target, "translated": w.translated, "checkpoint_steps": steps}
    paths.write_atomic(out / "summary.json", json.dumps({**about, "heads": rows}, indent=1) + "\n")
    written.append("summary.json")
    if weights_too:
        paths.write_atomic(out / "weights.json", json.dumps({**w.to_json(), "checkpoint_steps": steps}) + "\n")
        written.append("weights.json")
    return written


if __name__ == "__main__":
    cli.run(main)
