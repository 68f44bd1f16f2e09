"""A sweep's tables: plan's layout, and `collect`'s results beside the reference (markdown, CSV,
JSON) with the statistics of its seeds, built from the sweep's raw records (experiments.records):
one Row per row (experiments.rows), written as the columns of experiments.cells, under the
footer of experiments.footer.

    python -m experiments collect table3 --root=runs/table3-mini
    python -m experiments collect table3 --from_records=experiments/results/table3-mini/records.jsonl.gz

`collect` works on a partial sweep: rows not finished show their state. Files go to R/results/
(--out=DIR elsewhere; beside the file with --from_records): table.md, table.csv, results.json
and records.jsonl.gz, the records the table was built from (per replicate: its final
evaluations and learning curve), from which `--from_records` rebuilds the three others byte
for byte, with no run directory. `--from_results=results.json` rebuilds them from the final
figures a results.json holds (no learning curves: their columns stay blank; test figures where it has them).

Per row and metric: the mean and standard deviation over its seeds, on dev and on the test set;
the difference from the baseline paired by seed (seed k of a row minus seed k of the baseline)
beside the mean of the base seeds it is measured from, with its 95% confidence interval and a
paired t-test (t, df = pairs - 1, p). Ours is a direction where p < 0.05, else a tie; the
reference's is a tie where its difference is within the noise of two single runs (the sweep's
`noise`: 2 sqrt(2) sd). Rows the recipe was chosen on (the sweep's `pilot_rows`) are marked and
left out of the count. Convergence, from the dev curves: how much each run's dev PPL fell over
its last 20% of steps, relative to its value then, and the PPL direction at 1/4, 1/2 and all of
the steps.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json

from experiments.analysis import plans, records
from experiments.analysis.cells import columns, fmt
from experiments.analysis.footer import footer
from experiments.analysis.rows import Row, gather
from fxformer import exitcodes, paths
from fxformer.config import lookup

# ---------------------------------------------------------------------------------------------
# plan


def layout(sweep, extra: tuple[str, ...], runs) -> list[str]:
    """The table in the paper's layout: the sweep's columns, a blank cell = same as the baseline."""
    configs = {run.name: run.resolved(extra) for run in sweep.runs}
    base = configs.get(sweep.baseline, {})
    metrics = list(sweep.metrics)
    header = ["row", *sweep.columns, *(f"paper {m}" for m in metrics), "paper params x1e6"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        cfg, ref = configs[run.name], sweep.reference.get(run.name, {})
        cells = [run.name]
        for key in sweep.columns.values():
            value = lookup(cfg, key)
            cells.append("" if run.name != sweep.baseline and value == lookup(base, key) else str(value))
        cells += [fmt(ref.get(m)) for m in metrics]
        cells.append(fmt(ref["params"] / 1e6, 0) if ref.get("params") else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------------------------------------
# collect


def markdown(sweep, recs: list[Row], notes: list[str]) -> str:
    shown = [c for c in columns(sweep) if c.md is not None]
    lines = ["| " + " | ".join(c.md for c in shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(c.md_cell(r) for c in shown) + " |" for r in recs]
    return "\n".join(lines) + "\n\n" + "\n".join(f"{line}  " for line in notes) + "\n"


def to_csv(sweep, recs: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    cols = columns(sweep)
    writer.writerow([name for c in cols for name in c.csv])
    writer.writerows([value for c in cols for value in c.csv_cells(r)] for r in recs)
    return out.getvalue()


def collect(sweep, runs, doc: dict, directory) -> int:
    """table.md, table.csv and results.json of `runs` (rows of `sweep`) from the records `doc`, and
    the records themselves (unless they came from a results.json, which holds no raw records)."""
    recs = gather(sweep, runs, doc)
    source = doc["header"]
    directory.mkdir(parents=True, exist_ok=True)
    notes = footer(sweep, source, recs, records.dev_gaps(doc, {r.row for r in recs}))
    table = markdown(sweep, recs, notes)
    document = {
        "sweep": sweep.name,
        "profile": source["profile"],
        "source": source,
        "footer": notes,
        "rows": [dataclasses.asdict(rec) for rec in recs],
    }
    written = ["table.md", "table.csv", "results.json"]
    others = [rep for rep in doc["replicates"] if rep["row"] != sweep.baseline and rep.get("evals")]
    if sweep.plan and others:  # the analysis plan's verdicts beside the table, once a row has results
        text, data = plans.document(sweep, doc)
        paths.write_atomic(directory / "analysis.md", text)
        paths.write_atomic(directory / "analysis.json", json.dumps(data, indent=2) + "\n")
        written += ["analysis.md", "analysis.json"]
    paths.write_atomic(directory / "table.md", table)
    paths.write_atomic(directory / "table.csv", to_csv(sweep, recs))
    paths.write_atomic(directory / "results.json", json.dumps(document, indent=2) + "\n")
    if source["origin"] != records.FROM_RESULTS:
        records.write(directory / records.NAME, doc)
        written.append(records.NAME)
    print(table, end="")
    print(f"\nwritten: {directory}/{', '.join(written)}")
    return exitcodes.OK
