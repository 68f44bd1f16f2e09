"""One verdict vocabulary: every verdict a committed analysis, results, regime or table file holds
is one of `stats.VERDICTS` (agrees, disagrees, equivalent, inconclusive), whichever view wrote it
(the analysis plan's Holm-corrected tests, or the uncorrected paired view of table.md), and one
function, `stats.verdict`, decides them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.analysis import rows, stats

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "experiments" / "results"
VERDICT_KEYS = {
    "verdict",
    "direction",
    "along",
}  # a JSON value under one of these is a verdict (or a dict/list of them)
VERDICT_PARENTS = {"readouts", "verdicts"}  # {readout or row: verdict} below one of these
NONE = {"", "?", "not counted", "not run"}  # no verdict: no reference figure or curve; a pilot row; a row not run


def json_verdicts(value, keys: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(key path, string) for every string a verdict key holds, anywhere in a JSON document."""
    if isinstance(value, dict):
        return [found for key, v in value.items() for found in json_verdicts(v, (*keys, key))]
    if isinstance(value, list):
        return [found for v in value for found in json_verdicts(v, keys)]
    under = any(k in VERDICT_KEYS for k in keys[-2:]) or any(k in VERDICT_PARENTS for k in keys)
    under = under and keys[:1] != ("plan",)  # the plan's settings name its readouts, not verdicts
    return [(".".join(keys), value)] if isinstance(value, str) and under else []


def table_verdicts(text: str) -> list[tuple[str, str]]:
    """(column, word) for every cell of a markdown table column whose header names a verdict; a cell
    along training is split at its arrows, one of the claims table ('A1: agrees, A2: inconclusive') at
    its commas, a '(1 seed)' note beside the word dropped."""
    found, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            for name, cell in zip(header, cells):
                if "verdict" in name:
                    words = [w.rpartition(": ")[2] for part in cell.split("→") for w in part.split(", ")]
                    found += [(name, w.replace("(1 seed)", "").strip()) for w in words]
    return found


def committed() -> list[Path]:
    names = ("analysis.json", "results.json", "regime.json", "analysis.md", "regime.md", "table.md")
    return sorted(p for name in names for p in RESULTS.glob(f"**/{name}"))


def test_every_committed_verdict_is_one_of_the_four_words():
    files = committed()
    assert len(files) >= 30 and {p.name for p in files} >= {"analysis.json", "results.json", "regime.json", "table.md"}
    bad, seen = [], 0
    for path in files:
        text = path.read_text()
        found = json_verdicts(json.loads(text)) if path.suffix == ".json" else table_verdicts(text)
        seen += len(found)
        bad += [
            f"{path.relative_to(REPO)}: {where} = {word!r}"
            for where, word in found
            if word not in {*stats.VERDICTS, *NONE}
        ]
    assert seen > 500  # the checker reads the verdicts, not nothing
    assert not bad, "\n".join(bad[:20])


def test_the_checker_finds_an_old_word_in_json_and_in_a_table():
    doc = {"rows": [{"row": "A1", "direction": {"ppl": "tie"}, "along": ["agrees", "1 seed: agree"]}]}
    assert [w for _, w in json_verdicts(doc)] == ["tie", "agrees", "1 seed: agree"]
    assert json_verdicts({"readouts": {"final": {"A1": "agree"}}}) == [("readouts.final.A1", "agree")]
    table = (
        "| row | PPL verdict, paired (uncorrected) | along verdict |\n|---|---|---|\n| A1 | tie | agrees → disagree |\n"
    )
    assert [w for _, w in table_verdicts(table)] == ["tie", "agrees", "disagree"]
    claims = "| claim | our verdict |\n|---|---|\n| heads | A1: agree, A2: inconclusive (1 seed) |\n"
    assert [w for _, w in table_verdicts(claims)] == ["agree", "inconclusive"]


@pytest.mark.parametrize(
    ("difference", "equivalent", "reference", "expected"),
    [
        (1, False, 1, "agrees"),
        (-1, False, 1, "disagrees"),
        (0, True, 1, "equivalent"),
        (0, False, 1, "inconclusive"),
        (0, True, 0, "agrees"),  # the paper ties and ours is inside the margin
        (1, False, 0, "disagrees"),
        (0, False, 0, "inconclusive"),
    ],
)
def test_one_rule_decides_the_plans_verdicts_and_the_paired_views(difference, equivalent, reference, expected):
    assert stats.verdict(difference, equivalent, reference) == expected
    if not equivalent:  # the paired view: the same rule with no equivalence test
        t = {1: 10.0, -1: -10.0, 0: 0.5}[difference]
        test = stats.Paired(mean=t / 10, se=0.1, pairs=3, t=t, df=2, p=0.01 if difference else 0.6)
        assert rows.paired_verdict(test, reference) == expected
