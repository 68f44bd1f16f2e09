"""budget.png's numbers: the regime table's rows read at every dev evaluation of their budget. At
each step a row's estimate is the difference of the mean log dev perplexities of its seeds and
base's (the pooled model's row effect), computed here again from the raw records with NumPy; at the
plan's readouts (steps 2,500 and 3,750, and the last step, its `final`) each verdict is the one
analysis.json gives. A plateau-stopped table (the 6,000-pair one) has no common budget: no figure."""

import dataclasses
import gzip
import json
import math
from pathlib import Path

import numpy as np

from experiments import sweep as sweep_module
from experiments.analysis import budget, plans, records

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"


def load(folder: str):
    doc = records.read(RESULTS / folder / "records.jsonl.gz")
    header = doc["header"]
    return sweep_module.of_records(header), doc


def test_each_step_is_the_difference_of_mean_log_perplexities_and_the_readouts_are_the_analysis():
    sweep, doc = load("table3-regime")
    steps, by_row = budget.over_budget(sweep, doc, plans.Plan.of(sweep))
    assert steps[0] == 250 and steps[-1] == 5300 and {2500, 3750} <= set(steps)
    lines = gzip.decompress((RESULTS / "table3-regime" / "records.jsonl.gz").read_bytes()).decode().splitlines()
    finished = [r for r in map(json.loads, lines[1:]) if r["state"] == "finished"]

    def mean_log(row: str, step: int) -> float:
        values = [p["dev_ppl"] for r in finished if r["row"] == row for p in r["curve"] if p["step"] == step]
        return float(np.mean(np.log(values)))

    for row, judged in by_row.items():
        for step, j in zip(steps, judged):
            assert math.isclose(j.estimate, mean_log(row, step) - mean_log("base", step), abs_tol=1e-12), (row, step)
            assert j.low < j.estimate < j.high
    readouts = json.loads((RESULTS / "table3-regime" / "analysis.json").read_text())["readouts"]
    for readout, step in (("step:2500", 2500), ("step:3750", 3750), ("final", 5300)):
        assert {row: judged[steps.index(step)].verdict for row, judged in by_row.items()} == readouts[readout]


def test_a_plateau_stopped_table_has_no_common_budget_to_draw(tmp_path):
    sweep, doc = load("table3-multi30k")
    assert budget.over_budget(sweep, doc, plans.Plan.of(sweep))[0] == []
    assert budget.budget_figure(sweep, doc, tmp_path / "budget.png") is None


def test_a_running_seed_enters_no_step_before_its_row_is_complete():
    """A row with a seed still running is shown, not modelled (the stop rule): its curve's early
    steps must not count it in a step's model, nor in Holm's family there."""
    sweep, doc = load("table3-regime")
    plan = plans.Plan.of(sweep)
    _, before = budget.over_budget(sweep, doc, plan)
    running = next(r for r in doc["replicates"] if r["row"] == "A1" and r["state"] == "finished")
    running["state"], running["evals"] = "running", {}  # its curve stays, as a running run's does
    steps, after = budget.over_budget(sweep, doc, plan)
    assert "A1" in before and "A1" not in after and steps
    at_first = {j.row: j for j in plans.judge(sweep, doc, dataclasses.replace(plan, readout=f"step:{steps[0]}"))}
    assert not at_first["A1"].counted and at_first["A1"].n == 2
