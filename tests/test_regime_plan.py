"""The regime table's pre-registration holds in git: PLAN.md since its freeze only gained appended
sections (one clarification inside a frozen section, named here), and every run the table took in
after its amendment was trained by code that descends from the amendment's commit. Both read the
checkout's history; a clone without it (no git, or shallow) skips them."""

import gzip
import io
import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDER = "experiments/results/table3-regime"
PLAN = f"{FOLDER}/PLAN.md"
FROZEN = "7608aee"  # PLAN.md frozen after the noise pilot, before the sweep's first run
AMENDED = "557530f"  # the amendment (every row, base's seeds, big alone, the learning-rate arm)
# The one edit inside a frozen section since the freeze: a parenthesis of "The pilot" given the
# commits it spoke of (81106ad); its meaning unchanged.
CLARIFIED = (
    "  plan had a pilot of the learning rate's factor; it was dropped before any run, for the\n  paper's factor.)\n",
    "  plan, c0a52c5, had a pilot of the learning rate's factor; 31b27a2 dropped it for the paper's\n"
    "  factor one minute later, before any run: the noise pilot, the first run, is of 6d7711f.)\n",
)
RECORDS = (f"{FOLDER}/records.jsonl.gz", f"{FOLDER}/lr2/records.jsonl.gz")


def git(*args: str) -> bytes | None:
    """git's output in the checkout; None where git is missing or refuses (a shallow clone)."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True)
    except FileNotFoundError:
        return None
    return done.stdout if done.returncode == 0 else None


def at(commit: str, path: str) -> bytes:
    """A file as it was at `commit`; skips where the checkout lacks that commit."""
    content = git("show", f"{commit}:{path}")
    if content is None:
        pytest.skip(f"{commit} is not in this checkout (no git, or a shallow clone)")
    return content


def appended_only(before: str, after: str) -> bool:
    """`after` is `before` with text added at its end, after a line break."""
    return after.startswith(before) and (after == before or before.endswith("\n"))


def test_the_plan_only_gained_appended_sections_since_its_freeze():
    frozen = at(FROZEN, PLAN).decode().replace(*CLARIFIED)
    now = (REPO / PLAN).read_text()
    assert appended_only(frozen, now), "a frozen section of PLAN.md changed: append an erratum instead"
    assert appended_only(at(AMENDED, PLAN).decode(), now), "PLAN.md changed above its amendment"


def test_a_plan_edited_in_place_fails_the_check():
    now = (REPO / PLAN).read_text()
    frozen = at(FROZEN, PLAN).decode().replace(*CLARIFIED)
    assert not appended_only(frozen, now.replace("5,300 steps", "5,400 steps", 1))
    assert not appended_only(frozen, now.replace("## The regime", "## The regime ", 1))


def runs(content: bytes) -> dict[tuple[str, int], str]:
    """(row, seed) -> the commit of each finished run in a records file's content."""
    lines = gzip.open(io.BytesIO(content), "rt").read().splitlines()[1:]
    return {(r["row"], r["seed"]): r["commit"] for r in map(json.loads, lines) if r["state"] == "finished"}


def descends(commit: str, ancestor: str) -> bool:
    return git("merge-base", "--is-ancestor", ancestor, commit) is not None


def test_every_run_since_the_amendment_was_trained_by_code_that_descends_from_it():
    before = runs(at(AMENDED, RECORDS[0]))  # the 30 runs the amendment saw
    assert len(before) == 30
    new = {}
    for path in RECORDS:
        if (REPO / path).exists():
            found = runs((REPO / path).read_bytes())
            assert all(found[key] == commit for key, commit in before.items() if path == RECORDS[0])
            new |= {(path, *key): commit for key, commit in found.items() if path != RECORDS[0] or key not in before}
    late = {key: commit for key, commit in new.items() if not descends(commit, AMENDED)}
    assert not late, f"runs trained by code older than the amendment {AMENDED}: {late}"


def test_the_ancestry_check_refuses_a_run_of_older_code():
    old = runs(at(AMENDED, RECORDS[0]))[("base", 0)]  # the noise pilot's commit, before the amendment
    assert descends(AMENDED, old) and not descends(old, AMENDED)


def test_the_frozen_numbers_are_what_freeze_prints_from_the_pilot(capsys):
    """PLAN.md's "Frozen" figures are what `python -m experiments freeze` prints from the pilot's
    records; its sd computed here again from the raw records with NumPy, and base's seeds as
    ceil(3 sqrt(8))."""
    import math

    import numpy as np

    from experiments.__main__ import main

    pilot = REPO / FOLDER / "pilot" / "records.jsonl.gz"
    assert main(["freeze", str(pilot), "--rows=C1,C3,C5,C7,D1,D2,D3,big"]) == 0
    lines = capsys.readouterr().out.splitlines()
    _, *reps = (json.loads(line) for line in gzip.decompress(pilot.read_bytes()).decode().splitlines())
    ppl = [r["evals"]["validation"]["ppl"] for r in reps if r["row"] == "base" and r["state"] == "finished"]
    assert len(ppl) == 4 and math.ceil(3 * math.sqrt(8)) == 9
    sd = float(np.std(np.log(ppl), ddof=1))
    assert lines[1] == f"sd of log final dev PPL: {sd:.5f} (3 df)"
    assert lines[2].startswith("seeds: base 9, rows 3; pooled df 24;")  # 9 + 8 x 3 - 9 means
    plan = " ".join((REPO / PLAN).read_text().split())
    assert f"sd of log final dev PPL {sd:.5f}** (3 df)" in plan
    power = {m: line.split("power ")[1][:5] for m, line in zip(("2%", "5%", "10%"), lines[3:6])}
    assert f"{power['2%']} at 2%, {power['5%']} at 5%, {power['10%']} at 10%" in plan
    assert lines[-1] == "margin by the rule: 5%" and "**Margin by the rule: 5%**" in plan
