"""Is system B better than A on this test set, or is it noise? Paired tests on the same sentences,
as translation papers run them: sacreBLEU's paired bootstrap resampling (Koehn 2004; 1,000
resamples) and approximate randomization (10,000 trials), for BLEU and chrF, each system against
the first (the baseline), with the numbers sacreBLEU's own `--paired-bs` and `--paired-ar` print.

    from fxformer import significance
    report = significance.compare([("base", base_hyps), ("big", big_hyps)], references)
    print(significance.table(report))

What fxformer adds to sacreBLEU's figures: the difference B - A with its 95% interval, taken from
the same bootstrap resamples sacreBLEU's test draws (its seed, `SACREBLEU_SEED`, default 12345,
recorded), and the number of comparisons made, for a reader who corrects for them. A departure,
named: a system whose translations are identical to the baseline's is reported as "identical
translations: no test", where sacreBLEU would print p = 1/(n+1) for a difference of exactly 0.
"""

from __future__ import annotations

import contextlib
import io
import os

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from fxformer.errors import UserError

RESAMPLES = 1000  # sacreBLEU's --paired-bs-n
TRIALS = 10000  # sacreBLEU's --paired-ar-n
METRICS = {"BLEU": BLEU, "chrF2": CHRF}  # sacreBLEU's names for its default BLEU and chrF


def seed() -> int | None:
    """The seed sacreBLEU's tests use: $SACREBLEU_SEED, 12345 unless set ('none': unseeded)."""
    value = os.environ.get("SACREBLEU_SEED", "12345")
    return None if value.lower() == "none" else int(value)


def paired(systems: list[tuple[str, list[str]]], references: list[str], test: str, n: int) -> dict:
    """sacreBLEU's paired test `test` ('bs' or 'ar') of every system against the first: metric ->
    [Result per system] (the baseline first, with no p-value), and the metrics' signatures."""
    metrics = {name: make() for name, make in METRICS.items()}
    with contextlib.redirect_stderr(io.StringIO()):  # its progress lines
        signatures, scores = PairedTest(systems, metrics, [references], test_type=test, n_samples=n)()
    return {name: scores[name] for name in METRICS}, {name: str(sig.format()) for name, sig in signatures.items()}


def differences(baseline: list[str], system: list[str], references: list[str], resamples: int) -> dict:
    """metric -> the bootstrap differences (system - baseline) over the resamples sacreBLEU's paired
    bootstrap draws: the same seed, the same indices (`numpy.random.default_rng(seed).choice`)."""
    n = len(references)
    indices = np.random.default_rng(seed()).choice(n, size=(resamples, n), replace=True)
    found = {}
    for name, make in METRICS.items():
        metric = make()
        stats = [np.array(metric._extract_corpus_statistics(h, [references]), "float32") for h in (baseline, system)]
        a, b = ([metric._compute_score_from_stats(s.sum(0)).score for s in x[indices]] for x in stats)
        found[name] = np.asarray(b) - np.asarray(a)
    return found


def interval(values: np.ndarray) -> tuple[float, float]:
    """The 95% interval of bootstrap values, by sacreBLEU's order statistics (the n//40-th from each end)."""
    ordered = np.sort(values)
    k = len(ordered) // 40
    return float(ordered[k]), float(ordered[len(ordered) - k - 1])


def compare(
    systems: list[tuple[str, list[str]]], references: list[str], resamples: int = RESAMPLES, trials: int = TRIALS
) -> dict:
    """The paired comparison of `systems` ((name, translations), the baseline first) on `references`:
    per system and metric its score, sacreBLEU's bootstrap mean and 95% half-width, the paired
    bootstrap and approximate randomization p-values against the baseline, and the difference to the
    baseline with its 95% interval from the same resamples."""
    if len(systems) < 2:
        raise UserError(f"A paired comparison needs two systems or more (the baseline first), not {len(systems)}.")
    for name, hypotheses in systems:
        if len(hypotheses) != len(references):
            raise UserError(
                f"{name} has {len(hypotheses):,} translations for {len(references):,} references; "
                "compare systems translated from the same sentences."
            )
    bs, signatures = paired(systems, references, "bs", resamples)
    ar, _ = paired(systems, references, "ar", trials)
    baseline = systems[0][1]
    rows = []
    for i, (name, hypotheses) in enumerate(systems):
        identical = i > 0 and hypotheses == baseline
        diffs = differences(baseline, hypotheses, references, resamples) if i > 0 and not identical else {}
        row = {"system": name, "baseline": i == 0, "identical": identical}
        for metric in METRICS:
            result = bs[metric][i]
            entry = {"score": float(result.score), "mean": float(result.mean), "ci": float(result.ci)}
            if i > 0 and not identical:
                low, high = interval(diffs[metric])
                entry |= {
                    "p_bootstrap": float(bs[metric][i].p_value),
                    "p_randomization": float(ar[metric][i].p_value),
                    "difference": float(result.score - bs[metric][0].score),
                    "difference_ci": [low, high],
                }
            row[metric] = entry
        rows.append(row)
    return {
        "systems": rows,
        "comparisons": len(systems) - 1,
        "sentences": len(references),
        "resamples": resamples,
        "trials": trials,
        "seed": seed(),
        "signatures": signatures,
    }


def table(report: dict) -> str:
    """The report as a small text table: per system and metric, score (bootstrap mean ± 95% half-width),
    the difference to the baseline [95% interval] and both p-values; the system column as wide as
    its longest name."""
    width = max(len("system"), *(len(row["system"]) for row in report["systems"]))
    lines = [
        f"{report['sentences']:,} sentences; {report['comparisons']} comparison(s) against the baseline; paired "
        f"bootstrap with {report['resamples']:,} resamples, approximate randomization with {report['trials']:,} "
        f"trials, seed {report['seed']}",
        f"{'system':<{width}} {'metric':<6} {'score (mean ± 95%)':>22} {'difference [95% interval]':>28} "
        f"{'p bootstrap':>12} {'p rand.':>8}",
    ]
    for row in report["systems"]:
        for metric in METRICS:
            e = row[metric]
            score = f"{e['score']:.2f} ({e['mean']:.2f} ± {e['ci']:.2f})"
            if row["baseline"]:
                rest = f"{'baseline':>28}"
            elif row["identical"]:
                rest = f"{'identical translations: no test':>28}"
            else:
                low, high = e["difference_ci"]
                diff = f"{e['difference']:+.2f} [{low:+.2f}, {high:+.2f}]"
                rest = f"{diff:>28} {e['p_bootstrap']:>12.4f} {e['p_randomization']:>8.4f}"
            lines.append(f"{row['system']:<{width}} {metric:<6} {score:>22} {rest}")
    return "\n".join(lines)
