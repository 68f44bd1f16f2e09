"""The numbers an analysis plan freezes from its noise pilot, by rules written before the pilot ran:
the sd of the log final dev metric over base's pilot seeds, base's seeds by Dunnett's allocation
(`stats.base_seeds`: ceil(3 sqrt(k)) for k compared rows), the pooled model's degrees of freedom,
TOST's power at each margin for a row with no true difference, and the smallest margin with 80%
power (`stats.choose_margin`). The regime table's PLAN.md ("Frozen") took its figures from this:

    python -m experiments freeze experiments/results/table3-regime/pilot/records.jsonl.gz \\
        --rows=C1,C3,C5,C7,D1,D2,D3,big
"""

from __future__ import annotations

import math
import statistics

from experiments import sweep as sweep_module
from experiments.analysis import plans, records, stats
from experiments.cli import verb_parser
from fxformer import exitcodes
from fxformer.errors import UserError


def frozen(doc: dict, rows: list[str], row_seeds: int, split: str = "validation", metric: str = "ppl") -> list[str]:
    """The lines the rule prints for the pilot `doc`, `rows` compared with base at `row_seeds` each."""
    values, diverged = plans.log_values(doc, split, metric, "final")
    pilot = sorted(values.get("base", {}).items())
    if len(pilot) < 4 or diverged:
        raise UserError(
            f"the pilot has {len(pilot)} finished base seeds, {diverged or 'none'} diverged; the rule needs 4."
        )
    sd = statistics.stdev(v for _, v in pilot)
    base = stats.base_seeds(row_seeds, len(rows))
    df = base + row_seeds * len(rows) - (1 + len(rows))  # the pooled model: one mean per row
    level = stats.ALPHA / len(rows)  # Holm's strictest
    se = stats.contrast_se(sd, row_seeds, base)
    margin = stats.choose_margin(sd, row_seeds, base, df, len(rows))
    name = metric.upper()
    lines = [
        f"base seeds {[s for s, _ in pilot]}: final dev {name} {[round(math.exp(v), 3) for _, v in pilot]}",
        f"sd of log final dev {name}: {sd:.5f} ({len(pilot) - 1} df)",
        f"seeds: base {base}, rows {row_seeds}; pooled df {df}; Holm's strictest level {level:.5f}",
    ]
    for m in stats.MARGINS:
        power = stats.power_equivalence(math.log1p(m), se, df, level)
        lines.append(f"margin {m:.0%}: TOST power {power:.3f} for a row with no true difference")
    lines.append(f"margin by the rule: {'none reaches 0.8' if margin is None else f'{margin:.0%}'}")
    return lines


def main(argv: list[str]) -> int:
    """The `freeze` verb of `python -m experiments`."""
    parser = verb_parser("freeze", __doc__.split("\n\n")[0])
    parser.add_argument("pilot", help="records.jsonl.gz of the noise pilot (base's seeds, collected)")
    parser.add_argument("--rows", required=True, help="the rows the sweep compares with base, comma-separated")
    args = parser.parse_args(argv)
    doc = records.read(args.pilot)
    header = doc["header"]
    sweep = sweep_module.of_records(header)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in {run.name for run in sweep.runs}]
    if unknown:
        raise UserError(
            f"--rows: {', '.join(unknown)} not rows of {sweep.name}; its rows are {', '.join(header['rows'])}."
        )
    seeds = {sweep.replicates_of(r) for r in rows}
    if len(seeds) != 1:
        raise UserError(f"--rows: the rows run different seed counts ({sorted(seeds)}); the rule takes one count.")
    print("\n".join(frozen(doc, rows, seeds.pop())))
    return exitcodes.OK
