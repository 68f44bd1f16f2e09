"""Every committed sweep figure is what its records draw, byte for byte: `experiments plot` (delta,
curves, params, budget) and `experiments regime` (regime.png) from the committed records alone,
into a new folder. A PNG carries the matplotlib version that drew it (its `Software` text chunk);
Agg draws the same bytes for the same figure at the same version (the regime table's figures,
drawn on an AMD EPYC, are redrawn identically on an Intel Xeon), so a committed figure is compared
where the installed matplotlib is the one that drew it and reported as to be redrawn where not."""

import struct
from pathlib import Path

import matplotlib
import pytest

from experiments import __main__ as experiments_main
from experiments.analysis import regime

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"
PLOTTED = sorted(p.parent for p in RESULTS.glob("**/delta.png") if (p.parent / "records.jsonl.gz").exists())
PLOTS = ("delta.png", "curves.png", "params.png", "budget.png")


def software(png: bytes) -> str | None:
    """The PNG's `Software` text chunk (matplotlib writes "Matplotlib version<v>, <url>"), or None."""
    assert png.startswith(b"\x89PNG\r\n\x1a\n"), "not a PNG"
    i = 8
    while i < len(png):
        (n,), kind = struct.unpack(">I", png[i : i + 4]), png[i + 4 : i + 8]
        if kind == b"tEXt":
            key, value = png[i + 8 : i + 8 + n].split(b"\0", 1)
            if key == b"Software":
                return value.decode("latin-1")
        i += 12 + n
    return None


def same_figure(drawn: Path, committed: Path) -> None:
    want = committed.read_bytes()
    version = software(want) or ""
    if f"version{matplotlib.__version__}," not in version:
        pytest.skip(
            f"{committed} was drawn by {version or 'an unnamed program'}; matplotlib "
            f"{matplotlib.__version__} is installed: draw it again with this one to compare"
        )
    assert drawn.read_bytes() == want, f"{committed}: draw it again from its records (its folder's README)"


def test_the_png_reader_finds_matplotlibs_own_stamp(tmp_path):
    from fxformer import png

    plt = png.pyplot()
    fig = plt.figure(figsize=(1, 1))
    png.save(fig, tmp_path / "a.png", dpi=20)
    assert (
        software((tmp_path / "a.png").read_bytes())
        == f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/"
    )
    assert software(b"\x89PNG\r\n\x1a\n") is None


@pytest.mark.parametrize("folder", PLOTTED, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_committed_sweep_figure_is_what_its_records_draw(folder, tmp_path):
    records = folder / "records.jsonl.gz"
    assert experiments_main.main(["plot", "table3", f"--from_records={records}", f"--out={tmp_path}"]) == 0
    committed = [name for name in PLOTS if (folder / name).exists()]
    assert {"delta.png", "curves.png", "params.png"} <= set(committed)
    for name in committed:
        assert (tmp_path / name).exists(), f"{folder / name} is committed but `plot` no longer draws it"
        same_figure(tmp_path / name, folder / name)


def test_the_committed_regime_figure_is_what_the_two_records_draw(tmp_path):
    folder = RESULTS / "table3-regime"
    first = RESULTS / "table3-multi30k" / "records.jsonl.gz"
    assert regime.main([str(first), str(folder / "records.jsonl.gz"), f"--out={tmp_path}"]) == 0
    same_figure(tmp_path / "regime.png", folder / "regime.png")
