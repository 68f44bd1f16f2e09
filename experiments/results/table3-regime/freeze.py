"""The numbers PLAN.md's "Frozen" section takes from the noise pilot, by the rules written there
before it ran: the sd of log final dev PPL over base's pilot seeds, and the margin of the rule
(`stats.choose_margin`: the seeds the sweep runs, `REPLICATES` of configs/table3.py, whose base
count is Dunnett's allocation; the pooled model's degrees of freedom for the whole table), with
each margin's power.

    python experiments/results/table3-regime/freeze.py [experiments/results/table3-regime/pilot/records.jsonl.gz]
"""

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, run from anywhere

from configs import table3  # noqa: E402
from experiments import analysis, records, stats  # noqa: E402

ROWS = ("C1", "C3", "C5", "C7", "D1", "D2", "D3", "big")  # compared with base (PLAN.md, "Rows on the 2-core CPU")
ROW_SEEDS = table3.REPLICATES["multi30k-full"]["*"]  # a row's seeds (base's: Dunnett's allocation below)


def main(path: str) -> None:
    doc = records.read(path)
    values, diverged = analysis.log_values(doc, "validation", "ppl", "final")
    pilot = sorted(values.get("base", {}).items())
    if len(pilot) < 4 or diverged:
        raise SystemExit(f"{path}: {len(pilot)} finished base seeds, {diverged or 'none'} diverged; the rule needs 4")
    sd = statistics.stdev(v for _, v in pilot)
    base = stats.base_seeds(ROW_SEEDS, len(ROWS))  # 9 for the frozen 8 rows (the amendment's 19: 14)
    df = base + ROW_SEEDS * len(ROWS) - (1 + len(ROWS))  # the pooled model: one mean per row
    margin = stats.choose_margin(sd, ROW_SEEDS, base, df, len(ROWS))
    print(f"base seeds {[s for s, _ in pilot]}: final dev PPL {[round(math.exp(v), 3) for _, v in pilot]}")
    print(f"sd of log final dev PPL: {sd:.5f} ({len(pilot) - 1} df)")
    print(f"seeds: base {base}, rows {ROW_SEEDS}; pooled df {df}; Holm's strictest level {stats.ALPHA / len(ROWS):.5f}")
    se = stats.contrast_se(sd, ROW_SEEDS, base)
    for m in stats.MARGINS:
        power = stats.power_equivalence(math.log1p(m), se, df, stats.ALPHA / len(ROWS))
        print(f"margin {m:.0%}: TOST power {power:.3f} for a row with no true difference")
    print(f"margin by the rule: {'none reaches 0.8' if margin is None else f'{margin:.0%}'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent / "pilot" / records.NAME))
