"""The learning-rate arm's split (experiments/analysis/lrsplit.py) against numpy and scipy: each
arm's Welch Δ, the two parts with SEs in quadrature and the Welch-Satterthwaite df of the four
groups, their 95% intervals; an arm without two seeds of a row is 'not yet'; and the verb on the
committed records (the regime table standing in for the arm: its learning rate's part is 0)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments import __main__ as experiments_main
from experiments.analysis import lrsplit

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"


def doc(groups: dict[str, list[float]]) -> dict:
    """Records of finished runs with these dev perplexities ({row: [ppl per seed]})."""
    reps = [
        {"row": row, "seed": seed, "state": "finished", "evals": {"validation": {"ppl": ppl}}}
        for row, values in groups.items()
        for seed, ppl in enumerate(values)
    ]
    return {"replicates": reps}


SIX = doc({"base": [25.1, 24.8, 25.3, 24.9], "C5": [26.0, 25.9, 26.4], "D2": [20.5, 20.9, 20.2]})
FULL = doc({"base": [10.2, 10.3, 10.1, 10.4, 10.25], "C5": [7.3, 7.35, 7.4], "D2": [11.7, 11.8, 11.75]})
LR2 = doc({"base": [10.6, 10.5, 10.8], "C5": [7.9, 7.7, 7.8], "D2": [11.0, 11.3, 11.1]})


def welch_by_hand(row: list[float], base: list[float]) -> tuple[float, list[float], list[int]]:
    """(Δ of the logs, the two groups' s^2 / n, their n - 1)."""
    r, b = np.log(row), np.log(base)
    return r.mean() - b.mean(), [r.var(ddof=1) / r.size, b.var(ddof=1) / b.size], [r.size - 1, b.size - 1]


@pytest.mark.parametrize("row", lrsplit.ROWS)
def test_each_part_is_the_difference_of_two_welch_deltas_with_the_four_groups_df(row):
    found = lrsplit.split(SIX, FULL, LR2)[row]
    by_hand = {}
    for arm, d in zip(lrsplit.ARMS, (SIX, FULL, LR2), strict=True):
        groups = {
            r: [rep["evals"]["validation"]["ppl"] for rep in d["replicates"] if rep["row"] == r] for r in (row, "base")
        }
        by_hand[arm] = welch_by_hand(groups[row], groups["base"])
        assert found["deltas"][arm].estimate == pytest.approx(by_hand[arm][0], abs=1e-12)
    six, full, lr2 = (by_hand[arm] for arm in lrsplit.ARMS)
    for part, (a, b) in {"learning rate": (full, lr2), "data and stopping": (lr2, six)}.items():
        v, dfs = a[1] + b[1], a[2] + b[2]
        se = math.sqrt(sum(v))
        df = sum(v) ** 2 / sum(x * x / k for x, k in zip(v, dfs, strict=True))  # Welch-Satterthwaite, four groups
        got = found[part]
        assert got.estimate == pytest.approx(a[0] - b[0], abs=1e-12) and got.se == pytest.approx(se, rel=1e-12)
        assert got.df == pytest.approx(df, rel=1e-12)
        half = scipy_stats.t.ppf(0.975, df) * se
        assert got.interval() == pytest.approx((a[0] - b[0] - half, a[0] - b[0] + half), rel=1e-9)
    total = found["learning rate"].estimate + found["data and stopping"].estimate
    assert total == pytest.approx(full[0] - six[0], abs=1e-12)  # the interaction, split


def test_an_arm_without_two_seeds_is_not_yet_and_its_parts_are_absent():
    early = doc({"base": [10.6], "C5": [7.9, 7.7]})
    found = lrsplit.split(SIX, FULL, early)
    assert found["C5"]["learning rate"] is None and found["C5"]["data and stopping"] is None
    text, data = lrsplit.document((SIX, FULL, early), found)
    assert "not yet (C5 2, base 1 finished)" in text and data["C5"]["learning rate"] is None
    assert data["C5"]["deltas"]["all pairs, factor 1"]["interval"][0] < 0
    assert data["finished seeds"]["all pairs, factor 2"] == {"base": 1, "C5": 2, "D2": 0}
    assert "all pairs, factor 1: base 5, C5 3, D2 3; all pairs, factor 2: base 1, C5 2, D2 0." in text


def test_the_verb_writes_split_md_and_json_and_the_same_arm_twice_has_no_learning_rate_part(tmp_path, capsys):
    six, full = RESULTS / "table3-multi30k" / "records.jsonl.gz", RESULTS / "table3-regime" / "records.jsonl.gz"
    assert experiments_main.main(["lr-split", str(six), str(full), str(full), f"--out={tmp_path}"]) == 0
    data = json.loads((tmp_path / "split.json").read_text())
    regime = json.loads((RESULTS / "table3-regime" / "regime.json").read_text())["rows"]
    for row in lrsplit.ROWS:
        assert data[row]["learning rate"]["estimate"] == 0
        moved = data[row]["data and stopping"]["estimate"]  # Welch's Δs here, the pooled model's in regime.json
        assert moved == pytest.approx(regime[row]["interaction"]["estimate"], abs=0.01)
    text = (tmp_path / "split.md").read_text()
    assert text.count("\n| C5 |") == 1 and text.count("\n| D2 |") == 1
    assert not any(word in text for word in ("agrees", "disagrees", "equivalent", "inconclusive"))  # no verdicts
    assert "written:" in capsys.readouterr().out


def test_the_committed_split_is_what_the_three_records_give(tmp_path, capsys):
    folder = RESULTS / "table3-regime"
    inputs = [RESULTS / "table3-multi30k", folder, folder / "lr2"]
    assert lrsplit.main([*(str(p / "records.jsonl.gz") for p in inputs), f"--out={tmp_path}"]) == 0
    for name in ("split.md", "split.json"):
        assert (tmp_path / name).read_bytes() == (folder / "lr2" / name).read_bytes(), f"lr2/{name}: write it again"
