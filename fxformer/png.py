"""Figures written as PNG files without a display: matplotlib's Agg backend, imported only when
a figure is drawn (the commands that draw none never import matplotlib)."""

from __future__ import annotations

from fxformer import paths


def pyplot():
    """matplotlib.pyplot, drawing into files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: paths.PathLike, dpi: float = 110, tight: bool = False):
    """Write `fig` as a PNG at `path` (a local path or a URL), close it, and return `path`."""
    with paths.as_path(path).open("wb") as f:
        fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    pyplot().close(fig)
    return path
