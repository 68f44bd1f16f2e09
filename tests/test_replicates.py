"""Replicated sweeps: seeds as part of a sweep (init, dropout and data order, paired by seed), the
statistics `collect` reports (checked against NumPy on hand-made results), the tie rule (a paired
t-test, checked against scipy and the closed form for 2 degrees of freedom), the raw records a
table is rebuilt from byte for byte, pilot rows, test beside dev and convergence (a fake sweep,
no training), the committed mini table, and golden dry-runs of a replicated row (seeds end to
end, rows side by side and a stopped replicate: tests/test_sweep.py, on the smoke sweep's runs).

Golden files: regenerate with `FXFORMER_UPDATE_GOLDEN=1 python -m pytest tests/test_replicates.py`.
"""

import gzip
import json
import math
import re
import shutil
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import left_as_is
from scipy import stats as scipy_stats
from test_launch import SLURM_2X8, TPU_4_WORKERS, golden_dry_run

from experiments import __main__ as experiments_main
from experiments import rundirs, runner
from experiments import status as status_module
from experiments.analysis import cells, footer, records, report, stats
from experiments.analysis import figures as sweep_figures
from experiments.analysis import rows as rows_module
from experiments.context import Context, Replicate
from experiments.rowstate import RowStatus
from fxformer import exitcodes, optim, trainstate
from fxformer.data import pipeline, token_ids
from fxformer.model import Transformer, TransformerConfig


def gather(ctx: Context, runs) -> list:
    """The rows of `runs` as `collect` builds them: the records of the root's run directories, analysed."""
    return rows_module.gather(ctx.sweep, runs, rundirs.from_root(ctx, runs))


def context(root, *flags) -> Context:
    args = runner.parser("collect").parse_args(["table3", f"--root={root}", "--profile=smoke", *flags])
    return Context(args, [])


# ---------------------------------------------------------------------------------------------
# The statistics

# Student's t, 97.5% quantile, 2 degrees of freedom: F(t) = 0.975 solved in closed form (below), 4.3026527297494637;
# the often quoted 4.302652729911275 agrees to 10 digits (F there is 0.9750000000017)
T_975_DF2 = 19 / 20 * math.sqrt(800 / 39)


def t_cdf_df2(t: float) -> float:
    """Student's t distribution with 2 degrees of freedom in closed form: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def test_the_paired_t_test_equals_scipy_and_the_closed_form_for_two_degrees_of_freedom():
    base, row = [2.00, 2.10, 1.95], [2.30, 2.31, 2.20]  # seeds 0, 1, 2 of each
    test = stats.paired(dict(enumerate(row)), dict(enumerate(base)))
    diffs = np.array(row) - np.array(base)
    se = diffs.std(ddof=1) / math.sqrt(3)
    assert test.pairs == 3 and test.df == 2
    assert test.mean == pytest.approx(diffs.mean()) and test.se == pytest.approx(se)
    assert test.matched == pytest.approx(np.mean(base))  # the base seeds Δ is measured from
    reference = scipy_stats.ttest_rel(row, base)
    interval = reference.confidence_interval(0.95)
    assert (test.t, test.p) == pytest.approx((reference.statistic, reference.pvalue), rel=1e-12)
    assert (test.low, test.high) == pytest.approx((interval.low, interval.high), rel=1e-12)
    # The same from the formula: t = mean / SE; p = 2 (1 - F(|t|)); CI = mean ± t_0.975,2 SE
    t = diffs.mean() / se
    assert test.t == pytest.approx(t, rel=1e-12)
    assert test.p == pytest.approx(2 * (1 - t_cdf_df2(abs(t))), rel=1e-9)
    assert (test.low, test.high) == pytest.approx((diffs.mean() - T_975_DF2 * se, diffs.mean() + T_975_DF2 * se))
    # ...whose quantile is q sqrt(2 / (1 - q^2)), q = 2 x 0.975 - 1 = 19/20, by inverting F: 19/20 sqrt(800/39)
    assert T_975_DF2 == pytest.approx(4.302652729911275, rel=1e-10)
    assert t_cdf_df2(T_975_DF2) == pytest.approx(0.975, rel=1e-12)
    assert scipy_stats.t.ppf(0.975, 2) == pytest.approx(T_975_DF2, rel=1e-12)
    # more pairs: scipy's test on 5 (df 4)
    row5, base5 = [1, 2.1, 3.4, 4.9, 6.6], [1.1, 2, 3, 4, 4.9]
    five = stats.paired(dict(enumerate(row5)), dict(enumerate(base5)))
    assert five.df == 4 and five.p == pytest.approx(scipy_stats.ttest_rel(row5, base5).pvalue, rel=1e-12)


def pairs_at(standard_errors: float) -> tuple[dict, dict]:
    """Three pairs whose mean difference is `standard_errors` SE: differences m - 1, m, m + 1 (sd 1)."""
    mean = standard_errors / math.sqrt(3)
    base = {0: 10.0, 1: 11.0, 2: 12.0}
    return {k: base[k] + mean + d for k, d in zip(base, (-1, 0, 1))}, base


def test_with_three_pairs_2_5_standard_errors_is_a_tie_and_5_a_direction():
    tie, direction = stats.paired(*pairs_at(2.5)), stats.paired(*pairs_at(5.0))
    assert tie.t == pytest.approx(2.5) and direction.t == pytest.approx(5.0)
    assert tie.p == pytest.approx(1 - 2.5 / math.sqrt(2 + 2.5**2)) and tie.p > 0.05  # p = 0.130
    assert direction.p == pytest.approx(1 - 5 / math.sqrt(2 + 5**2)) and direction.p < 0.05  # p = 0.038
    assert stats.sign(tie) == 0 and stats.sign(direction) == 1  # the old 2-SE rule called 2.5 SE a direction
    assert stats.sign(stats.paired(*reversed(pairs_at(5.0)))) == -1
    assert stats.sign(stats.paired({0: 3.0}, {0: 1.0})) is None  # one pair: no spread, no test
    # the paired view's verdict: the one rule with no equivalence test (a tie of the t-test is inconclusive)
    assert rows_module.paired_verdict(tie, 1) == "inconclusive" and rows_module.paired_verdict(direction, 1) == "agrees"
    assert (
        rows_module.paired_verdict(direction, -1) == "disagrees"
        and rows_module.paired_verdict(tie, 0) == "inconclusive"
    )
    assert rows_module.paired_verdict(direction, 0) == "disagrees"  # the paper ties, ours moves
    assert rows_module.paired_verdict(stats.paired({0: 3.0}, {0: 1.0}), 1) == "inconclusive"  # one pair: no test
    assert rows_module.paired_verdict(direction, None) == ""  # no reference figure: no verdict
    # The reference is a tie within 2 sqrt(2) per-run sd of its log: 4.92 -> 4.88 is 0.0082 nats
    assert stats.reference_sign(-0.04, 4.92, {"log_sd": 0.003}) == 0
    assert stats.reference_sign(0.08, 4.92, {"log_sd": 0.003}) == 1
    assert stats.reference_sign(-0.5, 25.8, {"sd": 0.2}) == 0 and stats.reference_sign(-0.6, 25.8, {"sd": 0.2}) == -1


def test_convergence_fall_and_values_along_a_curve():
    curve = {100: 10.0, 200: 6.0, 400: 4.0, 800: 3.0, 1000: 2.5}  # 3.0 at step 800, 2.5 at the end
    assert stats.late_fall(curve, 1000) == pytest.approx(0.5 / 3.0)  # a sixth lower: still falling
    assert stats.late_fall({100: 10.0, 700: 3.0, 1000: 2.5}, 1000) == pytest.approx(0.5 / 3.0)  # last point <= 800
    assert stats.late_fall({100: 50.0, 800: 2.0, 1000: 2.0}, 1000) == 0.0  # levelled off, however high it began
    assert stats.late_fall({100: 2.0, 800: 2.0, 1000: 2.5}, 1000) == pytest.approx(-0.25)  # ended worse
    assert stats.late_fall({900: 3.0, 1000: 2.5}, 1000) is None  # no point before the last 20%
    assert stats.late_fall({100: 3.0}, 1000) is None  # one point: nothing fell
    assert stats.late_fall({100: 3.0, 200: 2.0}, 1000) is None  # no point in the last 20%
    assert [stats.at_fraction(curve, 1000, f) for f in (0.25, 0.5, 1.0)] == [6.0, 4.0, 2.5]
    assert stats.at_fraction(curve, 3000, 0.25) == 4.0  # big: a quarter of its own 3,000 steps


HAND_MADE = {  # row -> dev PPL and BLEU of seeds 0, 1, 2 (base has 4 seeds: seed 3 has no partner)
    "base": ([2.00, 2.10, 1.95, 2.05], [50.0, 48.0, 51.0, 49.5]),
    "B1": ([2.30, 2.31, 2.20], [45.0, 49.5, 44.0]),
    "C1": ([2.02], [49.0]),  # one seed
}


def write_results(ctx: Context) -> None:
    """Each replicate's workdir as a finished run leaves it: config.json and its evaluation."""
    for run in ctx.sweep.select("base,B1,C1"):
        ppls, bleus = HAND_MADE[run.name]
        for k, (ppl, bleu) in enumerate(zip(ppls, bleus)):
            rep = Replicate(run, k)
            config = rep.resolved(())
            workdir = Path(ctx.root) / rep.name
            (workdir / "eval").mkdir(parents=True)
            (workdir / "config.json").write_text(json.dumps(config))
            total = config["num_train_steps"]
            result = {"ppl": ppl, "bleu": bleu, "checkpoint_steps": [total], "split": "validation"}
            (workdir / "eval" / f"validation-{total}.json").write_text(json.dumps(result))


def test_collect_statistics_equal_numpy_on_hand_made_results(tmp_path):
    ctx = context(tmp_path / "t3", "--seeds=4")
    write_results(ctx)
    rows = {rec.row: rec for rec in gather(ctx, ctx.sweep.select("base,B1,C1"))}
    for row, (ppls, bleus) in HAND_MADE.items():
        for metric, values in (("ppl", ppls), ("bleu", bleus)):
            rec = rows[row]
            assert rec.n[metric] == len(values)
            assert rec.ours[metric] == pytest.approx(np.mean(values))
            if len(values) > 1:
                assert rec.sd[metric] == pytest.approx(np.std(values, ddof=1))
            else:
                assert rec.sd[metric] is None
    for metric, index in (("ppl", 0), ("bleu", 1)):
        diffs = np.array(HAND_MADE["B1"][index]) - np.array(HAND_MADE["base"][index][:3])  # seed k - seed k
        assert rows["B1"].pairs[metric] == 3
        assert rows["B1"].delta_ours[metric] == pytest.approx(diffs.mean())
        assert rows["B1"].se[metric] == pytest.approx(diffs.std(ddof=1) / np.sqrt(3))
    # B1's PPL difference is many SE above 0 and the paper's +0.24 is no tie: agree; its BLEU: a tie
    assert rows["B1"].direction["ppl"] == "agrees"
    assert rows["B1"].direction["bleu"] == "inconclusive"
    assert rows["C1"].se["ppl"] is None and rows["C1"].direction["ppl"] == "inconclusive"
    assert rows["C1"].delta_ours["ppl"] == pytest.approx(2.02 - 2.00)


def test_collected_table_shows_mean_sd_and_paired_differences(tmp_path, capsys):
    ctx = context(tmp_path / "t3", "--seeds=4")
    write_results(ctx)
    argv = ["collect", "table3", f"--root={ctx.root}", "--profile=smoke", "--seeds=4", "--only=base,B1,C1"]
    status = experiments_main.main(argv)
    assert status == 0
    table = (Path(ctx.root) / "results" / "table.md").read_text()
    b1 = next(line for line in table.splitlines() if line.startswith("| B1 |"))
    row, base = np.array(HAND_MADE["B1"][0]), np.array(HAND_MADE["base"][0][:3])  # seeds 0-2 of each: the pairs
    test, diff = scipy_stats.ttest_rel(row, base), row - base
    ci = test.confidence_interval(0.95)
    assert f"{row.mean():.3f} ± {row.std(ddof=1):.3f}" == "2.270 ± 0.061" and "2.270 ± 0.061" in b1  # mean ± sd
    assert f"{diff.mean():+.3f} [{ci.low:+.3f}, {ci.high:+.3f}]" == "+0.253 [+0.141, +0.365]" in b1  # Δ [95% CI]
    assert f"| {base.mean():.3f} |" == "| 2.017 |" in b1  # the matched base: the mean of the seeds Δ is from
    assert f"{test.statistic:.2f} ({test.df}), p={test.pvalue:.3f}" == "9.73 (2), p=0.010" in b1  # t (df), p
    c1 = next(line for line in table.splitlines() if line.startswith("| C1 |"))
    assert "2.020 ± n/a" in c1 and "| 1 |" in c1 and "| inconclusive |" in c1  # one seed: no test
    assert "paired t-test" in table and "log_sd" not in table  # the footer states the rules in words
    saved = json.loads((Path(ctx.root) / "results" / "results.json").read_text())
    assert saved["rows"][1]["seeds"]["ppl"] == {"0": 2.3, "1": 2.31, "2": 2.2}


def test_collect_refuses_a_hand_edited_config_json_naming_it_and_writes_nothing(tmp_path, capsys):
    ctx = context(tmp_path / "t3", "--seeds=4")
    write_results(ctx)
    edited = Path(ctx.root) / "B1.s1" / "config.json"
    config = json.loads(edited.read_text())
    edited.write_text(json.dumps({**config, "dropout_rat": 0.3}))
    argv = ["collect", "table3", f"--root={ctx.root}", "--profile=smoke", "--seeds=4", "--only=base,B1,C1"]
    with left_as_is(ctx.root):
        status = experiments_main.main(argv)
    err = capsys.readouterr().err.strip()
    assert status == exitcodes.USER_ERROR and len(err.splitlines()) == 1, err
    assert f"In {edited}, unknown config key 'dropout_rat' (did you mean 'model.dropout_rate'?)" in err


def test_collect_says_whether_runs_end_at_their_lowest_dev_perplexity(tmp_path):
    ctx = context(tmp_path / "t3", "--seeds=4")
    write_results(ctx)
    curves = {"base": [3.0, 2.0, 1.9], "base.s1": [3.0, 1.85, 1.9], "B1": [4.0, 2.5, 2.3], "B1.s2": [4.0, 2.0, 2.4]}
    for name, values in curves.items():
        lines = [json.dumps({"step": 100 * (i + 1), "dev_ppl": v}) for i, v in enumerate(values)]
        (Path(ctx.root) / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    records = gather(ctx, ctx.sweep.select("base,B1,C1"))
    rises = {rec.row: rec.end_above_lowest for rec in records}
    assert rises == {"base": pytest.approx(0.05), "B1": pytest.approx(0.4), "C1": None}  # the worst seed's rise
    note = footer.end_note(records)
    sd_b1 = np.std(HAND_MADE["B1"][0], ddof=1)  # 0.061: B1 rise of 0.4 is above it; base 0.05 below its 0.065
    assert f"B1 (+0.400, seed sd {sd_b1:.3f})" in note and "base (" not in note and "in 0 of 2 rows" in note


# ---------------------------------------------------------------------------------------------
# Raw records, pilot rows, the test set and convergence: a fake mini sweep, no training

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
FAKE = {  # row -> per seed: dev PPL at steps 200, 500 and 1000 (1/4, 1/2, all of 1,000), test (PPL, BLEU) or None
    "base": [((4.0, 2.40, 1.80), (1.90, 60.0)), ((4.1, 2.50, 1.85), (1.95, 59.0)), ((3.9, 2.30, 1.75), (1.85, 61.0))],
    "A1": [((4.10, 2.45, 1.70), None), ((4.20, 2.55, 1.73), None), ((3.95, 2.33, 1.67), None)],  # no test yet
    "C1": [((3.50, 2.40, 2.10), (2.20, 55.0)), ((3.62, 2.52, 2.14), (2.25, 54.0)), ((3.41, 2.31, 2.06), (2.15, 56.0))],
    "D1": [((4.50, 2.90, 2.30), (2.40, 50.0)), ((4.40, 2.95, 2.31), (2.41, 51.0)), ((4.70, 2.80, 2.32), (2.42, 49.0))],
}


def fake_curve(quarter: float, half: float, end: float) -> dict[int, float]:
    """Dev PPL every 100 steps through the three given points (falling throughout)."""
    curve = {100: 1.5 * quarter, 200: quarter, 300: (2 * quarter + half) / 3, 400: (quarter + 2 * half) / 3, 500: half}
    curve |= {s: half + (end - half) * (s - 500) / 500 for s in range(600, 1001, 100)}
    return curve


def fake_workdir(workdir: Path, config: dict, curve: dict[int, float], test, bleu: float, end: int = 0) -> None:
    """A replicate's workdir as fxformer.train and fxformer.evaluate (dev, then test) leave it;
    `end`: the step where early stopping ended it (its best step is kept in best/)."""
    total = end or config["num_train_steps"]
    (workdir / "eval").mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(config))
    (workdir / "run.json").write_text(json.dumps({"devices": 1, "platform": "cpu", "num_params": 411904}))
    (workdir / "sweep.json").write_text(json.dumps({"state": "finished", "attempts": 1, "commit": "0123456789ab"}))
    lines = []
    for step in range(25, total + 1, 25):
        line = {"step": step, "loss": 4.0 - step / 500, "ppl": math.exp(4.0 - step / 500), "learning_rate": 1e-3}
        if step in curve:
            line |= {"dev_loss": math.log(curve[step]), "dev_nll": math.log(curve[step]), "dev_ppl": curve[step]}
        lines.append(json.dumps({**line, "tokens_seen": 950.0 * step, "wall_s": 0.2 * step, "epochs": step / 40}))
    (workdir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if end:
        (workdir / "best" / str(min((s for s in curve if s <= end), key=curve.get))).mkdir(parents=True)
    for split, figures, n in (("validation", (curve[total], bleu), 500), ("test", test, 1000)):
        if figures is None:
            continue
        result = {
            "bleu": figures[1],
            "chrf": 70.0,
            "signature": SIGNATURE,
            "ppl": figures[0],
            "num_sentences": n,
            "split": split,
            "checkpoint_steps": [total],
            "beam_size": 4,
            "alpha": 0.6,
            "num_params": 411904,
            "devices": 1,
        }
        (workdir / "eval" / f"{split}-{total}.json").write_text(json.dumps(result))


def fake_mini_sweep(root: Path) -> Context:
    args = runner.parser("collect").parse_args(["table3", f"--root={root}", "--profile=mini", "--seeds=3"])
    ctx = Context(args, [])
    ctx.record()  # R/sweep-root.json, as `run` leaves it: the profile and the seeds
    for run in ctx.sweep.select(",".join(FAKE)):
        for k, (points, test) in enumerate(FAKE[run.name]):
            rep = Replicate(run, k)
            fake_workdir(root / rep.name, rep.resolved(()), fake_curve(*points), test, 60.0 - 10 * points[2] + k)
    return ctx


def test_collect_from_the_records_alone_rebuilds_the_table_byte_for_byte(tmp_path, capsys):
    root, elsewhere = tmp_path / "t3", tmp_path / "elsewhere"
    fake_mini_sweep(root)
    only = f"--only={','.join(FAKE)}"
    assert experiments_main.main(["collect", "table3", f"--root={root}", "--seeds=3", only]) == 0
    collected = {name: (root / "results" / name).read_bytes() for name in ("table.md", "table.csv", "results.json")}
    elsewhere.mkdir()
    records = elsewhere / "records.jsonl.gz"
    records.write_bytes((root / "results" / "records.jsonl.gz").read_bytes())
    shutil.rmtree(root)  # no run directory left
    assert experiments_main.main(["collect", "table3", f"--from_records={records}"]) == 0
    for name, data in collected.items():
        assert (elsewhere / name).read_bytes() == data, name
    assert records.stat().st_size < 20_000  # 12 runs; a whole sweep stays well under 2 MB
    lines = gzip.decompress(records.read_bytes()).decode().splitlines()
    header, first = json.loads(lines[0]), json.loads(lines[1])
    assert header["profile"] == "mini" and header["rows"] == list(FAKE) and len(lines) == 1 + 12
    assert first["name"] == "base" and set(first["evals"]) == {"validation", "test"}
    assert first["curve"][3] == {"step": 100, "tokens_seen": 95000.0, "loss": 3.8, "dev_ppl": 6.0, "wall_s": 20.0}
    assert experiments_main.main(["plot", "table3", f"--from_records={records}"]) == 0
    assert all((elsewhere / f).read_bytes().startswith(b"\x89PNG") for f in ("delta.png", "params.png", "curves.png"))
    capsys.readouterr()
    assert experiments_main.main(["collect", "table3", f"--from_records={records}", "--root=x"]) != 0
    assert "need no --root" in capsys.readouterr().err


def test_restore_moves_a_sweep_to_a_new_machine_through_its_records(tmp_path, capsys):
    """restore writes each finished run its records hold into an empty root (no checkpoints): the
    runs read as finished (so `run` skips them; an early-stopped one keeps its end), runs the
    records hold unfinished are left to `run`, and collect from the new root gives the same records."""
    root, saved = tmp_path / "t3", tmp_path / "records.jsonl.gz"
    ctx = fake_mini_sweep(root)
    early = Replicate(ctx.sweep.select("C1")[0], 1)  # ended by early stopping at step 700
    shutil.rmtree(root / early.name)
    config = early.resolved(()) | {"early_stopping_patience": 2, "best_metric": "dev_ppl"}
    curve = {s: 12.0 - min(s, 500) / 100 + max(0, s - 500) / 10_000 for s in range(100, 701, 100)}
    fake_workdir(root / early.name, config, curve, (2.2, 55.0), 54.0, end=700)
    finished = "--only=base,C1,D1"  # A1 has no test evaluation yet: trained, not finished

    def collect(out):
        assert experiments_main.main(["collect", "table3", f"--root={root}", finished, f"--out={out}"]) == 0
        table = re.sub(r"collected [\d-]+ [\d:]+", "", (out / "table.md").read_text())
        return table, [rep for rep in records.read(out / records.NAME)["replicates"] if rep["state"] == "finished"]

    before = collect(tmp_path / "before")
    assert experiments_main.main(["collect", "table3", f"--root={root}", f"--out={tmp_path}"]) == 0  # every row
    shutil.rmtree(root)
    capsys.readouterr()
    assert records.read(saved)["header"]["seeds"] == 3  # the sweep ran with --seeds=3: restore keeps it
    assert experiments_main.main(["restore", "table3", f"--from_records={saved}", f"--root={root}"]) == 0
    said = capsys.readouterr().err
    commits = {rep["commit"] for rep in records.read(saved)["replicates"] if rep["state"] == "finished"}
    assert (
        len(commits) == 1
        and f"{root}: 9 finished runs restored from {saved} (trained at commit {commits.pop()}: " in said
    )
    again = runner.parser("status").parse_args(["table3", f"--root={root}"])  # the root's record: mini, 3 seeds
    ctx = Context(again, [])
    states = {rep.name: str(ctx.read(rep).state()) for rep in ctx.units(ctx.sweep.select("base,A1,C1,D1"))}
    assert states == {name: "pending" if name.startswith("A1") else "finished" for name in states} and len(states) == 12
    assert ctx.read(early).total_steps == 700 and not (root / early.name / "checkpoints").exists()
    assert collect(tmp_path / "after") == before
    assert experiments_main.main(["restore", "table3", f"--from_records={saved}", f"--root={root}"]) == 0
    assert "0 finished runs restored" in capsys.readouterr().err  # run directories are never overwritten
    assert experiments_main.main(["restore", "table3", f"--root={root}"]) != 0
    assert "restore needs --from_records=FILE" in capsys.readouterr().err


MINI = Path(__file__).resolve().parent.parent / "experiments" / "results" / "table3-mini"


def assert_collect_rebuilds(source: str, committed: Path, out: Path) -> None:
    """`collect` from `source` (--from_results=... or --from_records=...) writes the committed tables byte for byte."""
    assert experiments_main.main(["collect", "table3", source, f"--out={out}"]) == 0
    for name in ("table.md", "table.csv", "results.json"):
        assert (out / name).read_bytes() == (committed / name).read_bytes(), f"{name}: collect it again (its README)"


def test_the_committed_mini_table_has_its_records_test_pilots_and_convergence():
    """The mini sweep, re-run with its records (which rebuild it: the parametrized test below):
    pilot rows marked, test beside dev and a convergence figure in every row."""
    assert records.read(MINI / records.NAME)["header"]["profile"] == "mini"
    table = (MINI / "table.md").read_text()
    head, *lines = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines() if line[:2] == "| "]
    rows = {cells[0]: dict(zip(head, cells, strict=True)) for cells in lines}
    assert len(rows) == 20 and "C1 (pilot)" in rows and "D1 (pilot)" in rows and "A1" in rows
    for name, row in rows.items():
        assert " ± " in row["test PPL ours (mean ± sd)"] and " ± " in row["test BLEU ours (mean ± sd)"], name
        assert row["PPL fall in the last 20%"].endswith("%") and row["state"] == "finished", name
    assert "62 of 62 runs finished" in table and "paired t-test" in table


def test_a_results_json_alone_rebuilds_every_seeds_figures_and_the_counts(tmp_path):
    """--from_results (a results.json: final figures, no curves) gives the same per-seed figures,
    differences, tests and counts as the records; only the convergence columns are blank."""
    assert (
        experiments_main.main(["collect", "table3", f"--from_results={MINI / 'results.json'}", f"--out={tmp_path}"])
        == 0
    )
    again = json.loads((tmp_path / "results.json").read_text())
    committed = json.loads((MINI / "results.json").read_text())
    for new, old in zip(again["rows"], committed["rows"], strict=True):
        for key in ("seeds", "ours", "sd", "delta_ours", "p", "ci", "direction"):
            assert new[key] == old[key], (old["row"], key)
        assert new["more"]["test"]["seeds"] == old["more"]["test"]["seeds"]
        assert new["late_fall"] is None and not new["along"] and old["late_fall"] > 0.05
    assert again["footer"][-2:] == committed["footer"][-2:]  # the PPL and BLEU counts
    assert "no learning curves and no raw records" in (tmp_path / "table.md").read_text()


def test_a_results_json_keeps_each_seeds_last_step_and_the_plateau_count(tmp_path):
    """Seeds that early stopping ended at different steps: --from_results reads each seed's own
    last step ('ends'), not the first seed's for all (which made base read 2100/3000 for
    2000-2200 and C4 '3 of 3 at a plateau' for 1 of 3 on the real-text table)."""
    document = json.loads((MINI / "results.json").read_text())
    base = document["rows"][0]
    base["ends"] = {"0": 700, "1": 1000, "2": 800, "3": 1000, "4": 900}  # three ended by a plateau
    edited = tmp_path / "results.json"
    edited.write_text(json.dumps(document))
    assert experiments_main.main(["collect", "table3", f"--from_results={edited}", f"--out={tmp_path / 'out'}"]) == 0
    again = json.loads((tmp_path / "out" / "results.json").read_text())["rows"][0]
    assert again["ends"] == base["ends"] and again["plateaued"] == 3  # the steps cell and the footer read these


REAL = MINI.parent / "table3-multi30k"
COMMITTED_RECORDS = sorted(MINI.parent.glob(f"**/{records.NAME}"))


@pytest.mark.parametrize("saved", COMMITTED_RECORDS, ids=lambda p: str(p.parent.relative_to(MINI.parent)))
def test_every_committed_table_is_what_its_records_collect_to(saved, tmp_path):
    """Every table committed with its raw records (the real-text sweep as runs land, its pilots):
    the records alone (no run directory) rebuild every committed file byte for byte, and stay small."""
    assert_collect_rebuilds(f"--from_records={saved}", saved.parent, tmp_path / "out")
    assert saved.stat().st_size < 2_000_000


FOLDER_RECORDS = [p for p in COMMITTED_RECORDS if ":" in records.read(p)["header"]["profile"]]


@pytest.mark.parametrize("saved", FOLDER_RECORDS, ids=lambda p: str(p.parent.relative_to(MINI.parent)))
def test_real_text_records_rebuild_their_table_on_a_machine_without_the_multi30k_files(saved, tmp_path):
    """The profile names a data folder; its configs need the files to resolve, the records do not,
    rows without records (pending) included: the folder the records name is made absent."""
    folder = records.read(saved)["header"]["profile"].partition(":")[2]
    absent = str(tmp_path / "no-multi30k-here")
    text = gzip.decompress(saved.read_bytes()).decode().replace(folder, absent)
    moved = tmp_path / records.NAME
    moved.write_bytes(gzip.compress(text.encode()))
    assert experiments_main.main(["collect", "table3", f"--from_records={moved}", f"--out={tmp_path / 'out'}"]) == 0
    rebuilt, committed = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "out", saved.parent))
    assert json.dumps(rebuilt["rows"]).replace(absent, folder) == json.dumps(committed["rows"])


def test_the_real_text_records_are_the_multi30k_sweep_and_its_pilots():
    assert REAL / records.NAME in COMMITTED_RECORDS and len(COMMITTED_RECORDS) >= 8
    assert records.read(REAL / records.NAME)["header"]["profile"].startswith("multi30k:")
    # pilot 1 was collected while its two runs trained: no convergence figure from a curve still growing
    table = (REAL / "pilot-1" / "table.md").read_text()
    assert "no run's training is over yet, so the convergence columns are blank" in table
    assert "0 of 2 runs finished" in table


def test_pilot_rows_test_set_and_convergence_in_the_table(tmp_path):
    ctx = fake_mini_sweep(tmp_path / "t3")
    rows = {rec.row: rec for rec in gather(ctx, ctx.sweep.select(",".join(FAKE)))}
    recs, header = list(rows.values()), rundirs.from_root(ctx, [])["header"]
    table = report.markdown(ctx.sweep, recs, footer.footer(ctx.sweep, header, recs))
    shown = {line.split("|")[1].strip(): line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ")}
    assert rows["C1"].pilot and rows["D1"].pilot and not rows["A1"].pilot
    assert "C1 (pilot)" in shown and "D1 (pilot)" in shown
    # test beside dev: C1's mean ± sd of its three test runs, A1's blank (no test evaluation yet)
    assert rows["C1"].more["test"].ours["ppl"] == pytest.approx(2.20)
    assert shown["C1 (pilot)"][6].strip() == "2.200 ± 0.050" and shown["A1"][6].strip() == ""
    assert "and test, 1000 sentences, decoded the same way (3 of 4 rows)" in table
    # the matched base is the mean of the base seeds Δ is measured from: row mean - matched base = Δ
    a1 = rows["A1"]
    assert a1.ours["ppl"] - a1.matched["ppl"] == pytest.approx(a1.delta_ours["ppl"])
    # C1 learns faster at first (better at 1/4), level at 1/2, worse at the end, as in the paper
    assert rows["C1"].along == ["disagrees", "inconclusive", "agrees"]
    assert "disagrees → inconclusive → agrees" in shown["C1 (pilot)"][-4]
    for name, rec in rows.items():
        curves = [fake_curve(*points) for points, _ in FAKE[name]]
        fall = np.mean([(c[800] - c[1000]) / c[800] for c in curves])
        assert rec.late_fall == pytest.approx(fall), name
        assert shown[f"{name} (pilot)" if rec.pilot else name][-3].strip() == f"{100 * fall:.0f}%"
    # the headline counts A1 alone: the pilot rows are named, with their verdicts, and not counted
    count = next(line for line in table.splitlines() if line.startswith("PPL direction as the paper's"))
    assert "0 agrees, 1 disagrees, 0 inconclusive, of the 1 rows" in count and "(A1)" in count
    assert "not counted: the pilot rows" in count and "C1 agrees, D1 agrees" in count


# ---------------------------------------------------------------------------------------------
# Seeds: init, dropout and data order


def test_a_replicate_sets_both_seeds():
    ctx = context("/tmp/unused")
    run = ctx.sweep.select("B1")[0]
    config = run.resolved(())
    for k in (0, 1, 3):
        resolved = Replicate(run, k).resolved(())
        assert resolved["seed"] == config["seed"] + k
        assert resolved["data"]["shuffle_seed"] == config["data"]["shuffle_seed"] + k
        flags = Replicate(run, k).flags(())
        assert (f"--config.seed={config['seed'] + k}" in flags) == (k > 0)
        assert (f"--config.data.shuffle_seed={config['data']['shuffle_seed'] + k}" in flags) == (k > 0)
    assert Replicate(run, 0).name == "B1" and Replicate(run, 2).name == "B1.s2"


def first_batch(corpus, shuffle_seed: int) -> dict:
    config, builder, tokenizer = corpus
    ids = token_ids(config.data, builder, tokenizer, log=lambda *a: None)
    batches, _ = pipeline.train_dataset(ids, config.data, rows=8, seed=shuffle_seed)
    return next(iter(batches))


def initial_state(corpus, seed: int):
    config, _, tokenizer = corpus
    model = Transformer(TransformerConfig.from_config(config.model, tokenizer.vocab_size))
    return trainstate.create_state(model, optim.optimizer(config), seed)


@pytest.mark.slow  # trains and compiles several times (the fast set stays under a minute)
def test_seeds_change_the_data_order_init_and_dropout_and_the_same_seed_repeats(corpus):
    a, b, again = first_batch(corpus, 0), first_batch(corpus, 1), first_batch(corpus, 0)
    assert not np.array_equal(a["targets"], b["targets"])
    assert all(np.array_equal(a[key], again[key]) for key in a)
    s0, s1, s0_again = initial_state(corpus, 0), initial_state(corpus, 1), initial_state(corpus, 0)
    leaves = lambda state: jax.tree_util.tree_leaves(state.params)
    assert all(not np.array_equal(x, y) for x, y in zip(leaves(s0), leaves(s1)) if x.size > 1 and np.std(x) > 0)
    assert all(np.array_equal(x, y) for x, y in zip(leaves(s0), leaves(s0_again)))
    dropout = lambda state: np.asarray(jax.random.key_data(state.rng))
    assert not np.array_equal(dropout(s0), dropout(s1)) and np.array_equal(dropout(s0), dropout(s0_again))


# ---------------------------------------------------------------------------------------------
# Golden dry-runs of a replicated row


def test_tpu_dry_run_of_a_replicated_row_matches_golden_file(fake_bucket, capsys):
    text, _ = golden_dry_run(
        "sweep_table3_B1_seeds2_tpu.txt",
        *("run", "table3", "--root=gs://bucket/table3", "--only=B1", "--seeds=2", *TPU_4_WORKERS),
        capsys=capsys,
    )
    assert "--workdir=gs://bucket/table3/B1.s1 --config.seed=1 --config.data.shuffle_seed=1" not in text
    assert "--config.seed=1 --config.data.shuffle_seed=1 --workdir=gs://bucket/table3/B1.s1" in text
    assert not fake_bucket.store


@pytest.mark.slow
def test_slurm_dry_run_of_a_replicated_row_matches_golden_file():
    out, _ = golden_dry_run(
        "sweep_table3_B1_seeds2_slurm.txt",
        *("run", "table3", "--root=/shared/table3", "--only=B1", "--seeds=2", *SLURM_2X8),
    )
    assert "--config.seed=1 --config.data.shuffle_seed=1 --workdir=/shared/table3/B1.s1" in out


def test_the_plateau_note_leads_with_the_common_criterion_and_names_the_others():
    row = lambda name, criterion: types.SimpleNamespace(row=name, criterion=criterion)  # noqa: E731
    recs = [row("base", "X"), row("A1", "Y"), row("A2", "X"), row("B1", ""), row("big", "Z")]
    assert footer.plateau_note(recs) == "X (for A1: Y) (for big: Z) (for B1: no early stopping, the steps set)"
    assert footer.plateau_note([row("base", ""), row("A1", "")]) == ""


def test_convergence_is_read_at_fractions_of_each_runs_own_steps_and_from_trained_runs(tmp_path):
    """A run that early stopping ended at step 400 is judged at 100 and 200 (1/4, 1/2 of its own
    steps), not at its end for every fraction past 400; a seed still training adds no curve, no
    end and no share until its training is over."""
    curves = {
        0: {s: 10.0 - s / 100 for s in range(100, 401, 100)},
        1: {s: 20.0 - s / 100 for s in range(100, 1001, 100)},
    }
    assert rows_module.at_fraction(curves, {0: 400, 1: 1000}, 1000, 0.25) == {0: 9.0, 1: 18.0}  # steps 100, 200
    assert rows_module.at_fraction(curves, {0: 400, 1: 1000}, 1000, 0.5) == {0: 8.0, 1: 15.0}  # steps 200, 500
    assert rows_module.at_fraction(curves, {}, 1000, 0.5) == {0: 6.0, 1: 15.0}  # no ends known: the cap's 500

    ctx = fake_mini_sweep(tmp_path / "t3")
    stopped = ctx.workdir(Replicate(ctx.sweep.select("A1")[0], 2))
    shutil.rmtree(Path(stopped) / "eval")  # seed 2 of A1 trained on (its curve is there) but is not finished
    rows = {rec.row: rec for rec in gather(ctx, ctx.sweep.select(",".join(FAKE)))}
    assert rows["A1"].state == "1 stopped, 2 trained"  # A1's runs have no test evaluation yet
    assert set(rows["A1"].ends) == {0, 1} and set(rows["A1"].late_fall_seeds) == {0, 1}
    assert rows["C1"].ends.keys() == rows["C1"].late_fall_seeds.keys() == {0, 1, 2}
    # the directions along training pair the seeds whose training is over: one, while the other runs
    curve = lambda start: [{"step": s, "dev_ppl": start - s / 1000} for s in range(100, 1001, 100)]  # noqa: E731
    base_reps = [{"seed": k, "state": "finished", "curve": curve(3.0)} for k in (0, 1)]
    reps = [{"seed": 0, "state": "finished", "curve": curve(3.1)}]
    reps.append({"seed": 1, "state": "running", "curve": curve(3.101)})
    along = lambda: rows_module.along(ctx.sweep, rows["A1"], rows["base"], reps, base_reps)  # noqa: E731
    assert along() == ["inconclusive"] * 3  # one pair: no test
    reps[1]["state"] = "trained"
    assert along() == ["agrees"] * 3  # two pairs now (differences 0.1 and 0.101): the t-test finds it, as the paper


def test_status_says_how_long_the_unfinished_runs_will_take(tmp_path, capsys):
    """A run not yet running takes its row's median training time so far (C1's seeds took 400 s),
    else the median of every finished run (200 s, A2's three seeds); a run trained but not yet
    evaluated (A1's, no test evaluation) takes none."""
    root = tmp_path / "t3"
    ctx = fake_mini_sweep(root)
    for k in (0, 1):
        metrics = root / f"C1{'' if k == 0 else f'.s{k}'}" / "metrics.jsonl"
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        metrics.write_text("".join(json.dumps({**x, "wall_s": 2 * x["wall_s"]}) + "\n" for x in lines))
    shutil.rmtree(Path(ctx.workdir(Replicate(ctx.sweep.select("C1")[0], 2))) / "eval")  # C1.s2: to train again
    args = ["status", "table3", f"--root={root}", "--seeds=3", "--only=base,A1,A2,C1,D1"]
    assert experiments_main.main(args) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("8 finished, 3 pending, 1 stopped, 3 trained; about 16m40s left, 1 at a time"), last


def test_the_time_left_counts_runs_outside_only_and_scales_by_the_step_budget(tmp_path, capsys):
    """A run of a row with no finished seed takes the median of every finished run times its step
    budget over theirs (big: three times the steps); the runs --only leaves out count."""
    left = status_module.Left()
    for row, wall in (("A1", 100.0), ("A1", 200.0), ("C1", 300.0)):
        left.add(row, RowStatus.FINISHED, wall, None, 1000)
    left.add("A1", RowStatus.PENDING, None, None, 1000)  # its row's median: 150 s
    left.add("big", RowStatus.PENDING, None, None, 3000)  # the median of all, 200 s, x 3000 / 1000
    assert left.seconds() == 150.0 + 600.0
    left.add("C1", RowStatus.RUNNING, None, 50.0, 1000)  # now shared by the one running
    assert left.seconds() == 800.0
    root = tmp_path / "t3"
    fake_mini_sweep(root)  # finished runs of 1,000 steps; E and big have none: E's 1,000 steps, big's 3,000
    left_of = {}
    for row in ("E", "big"):
        assert experiments_main.main(["status", "table3", f"--root={root}", "--seeds=3", f"--only={row}"]) == 0
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.startswith("3 pending; about ") and "1 at a time" in last, last
        minutes, seconds = re.search(r"about (?:(\d+)m)?(\d+)s left", last).groups()
        left_of[row] = 60 * int(minutes or 0) + int(seconds)
    assert left_of["E"] > 0 and abs(left_of["big"] - 3 * left_of["E"]) <= 3, left_of


def test_a_rows_curve_is_the_mean_of_its_trained_seeds_up_to_where_the_first_ended():
    curve = lambda start, steps: [{"step": s, "dev_ppl": start - s / 100} for s in steps]  # noqa: E731
    reps = [
        {"seed": 0, "state": "finished", "curve": curve(10.0, (100, 200, 300))},
        {"seed": 1, "state": "trained", "curve": curve(12.0, (100, 200))},  # ended at 200 (early stopping)
        {"seed": 2, "state": "running", "curve": curve(50.0, (100,))},  # still training: not in the curve yet
    ]
    assert sweep_figures.band(reps) == ([100, 200], [10.0, 9.0], [9.0, 8.0], [11.0, 10.0])
    # and each trained seed's own line runs to its end (seed 0 past where seed 1 stopped)
    assert sweep_figures.seed_lines(reps) == [([100, 200, 300], [9.0, 8.0, 7.0]), ([100, 200], [11.0, 10.0])]


def test_a_diverged_seed_makes_a_tie_wherever_its_nan_falls():
    nan = float("nan")
    base = {0: 1.0, 1: 1.0, 2: 1.5}
    for row in ({0: nan, 1: 2.0, 2: 2.5}, {0: 2.0, 1: nan, 2: 2.5}, {0: 2.0, 1: 2.0, 2: nan}):
        test = stats.paired(row, base)  # max/min of [1, nan, 1] is 1: once read as a difference without spread
        assert math.isnan(test.p) and stats.sign(test) == 0, row
        assert rows_module.paired_verdict(test, 1) == "inconclusive"
    assert stats.sign(stats.paired({0: 2.0, 1: nan}, {0: 1.0, 1: 1.0})) == 0  # was p = 0: "disagree"
    assert rows_module.paired_verdict(stats.paired({0: nan}, {0: 1.0}), -1) == "inconclusive"  # once "agree"
    shown = types.SimpleNamespace(t={"ppl": None}, p={"ppl": nan}, df={"ppl": 2})
    assert cells.t_cell(shown, "ppl") == "n/a (2), p=nan"  # not "no spread": that is differences all equal


def test_a_curve_that_misses_a_dev_evaluation_is_named_under_the_table():
    def rep(name, steps, every=100):
        return {
            "row": name.split(".")[0],
            "name": name,
            "config": {"eval_every_steps": every},
            "curve": [{"step": s, "loss": 1.0, **({"dev_ppl": 9.0} if s % every == 0 else {})} for s in steps],
        }

    whole = rep("A1.s0", range(50, 1001, 50))
    gap = rep("B2.s1", [s for s in range(50, 2201, 50) if s != 1500])  # the first real-text sweep's B2
    doc = {"replicates": [whole, gap, rep("C1.s0", [50, 100, 200])]}
    assert records.dev_gaps(doc, {"A1", "B2", "C1"}) == ["B2.s1 at step 1,500"]  # C1 ended at 200: whole
    assert records.dev_gaps(doc, {"A1", "B2"}) == ["B2.s1 at step 1,500"]
    assert records.dev_gaps(doc, {"A1"}) == []  # rows not in the table are not named


def test_a_rows_config_comes_from_its_first_seed_that_recorded_one():
    """A row whose seed 0 is pending and seed 1 finished: the config is seed 1's (collect --from_records
    needs no data files then), not None (which made collect resolve the profile's config)."""
    pending, finished = {"name": "C5", "config": None}, {"name": "C5.s1", "config": {"model": {"d_model": 128}}}
    assert rows_module.recorded_config([pending, finished]) == finished["config"]
    assert rows_module.recorded_config([pending]) is None and rows_module.recorded_config([]) is None


def test_the_table_names_the_curves_that_miss_a_dev_evaluation(tmp_path):
    ctx = fake_mini_sweep(tmp_path / "t3")
    recs, header = gather(ctx, ctx.sweep.select(",".join(FAKE))), rundirs.from_root(ctx, [])["header"]
    gaps = ["B2.s1 at step 1,500"]
    named = footer.footer(ctx.sweep, header, recs, gaps)
    assert sum("early stopping counted one fewer there): B2.s1 at step 1,500." in line for line in named) == 1
    assert not any("Dev evaluations missing" in line for line in footer.footer(ctx.sweep, header, recs))


def test_shares_spreads_and_the_headline_in_corner_cases():
    assert cells.share(-0.004) == "0%" and cells.share(-0.08) == "-8%" and cells.share(0.2) == "20%"
    assert [cells.p_value(p) for p in (0.0004, 0.0123, 0.0497, 0.0503, 0.0506, 0.04996, 0.05, 0.0499999)] == [
        "p<0.001",
        "p=0.012",
        "p=0.0497",
        "p=0.0503",
        "p=0.051",
        "p=0.04996",  # never "p=0.050" (or 0.0500) beside "agree"
        "p=0.05",  # the level itself: a tie
        "p<0.05",  # below the level by less than six decimals show
    ]
    mean, sd = stats.mean_sd([float("nan"), 1.0])  # a diverged seed's NaN is shown, not a crash
    assert math.isnan(mean) and math.isnan(sd)
    assert stats.sign(stats.Paired(mean=1.0, pairs=3, p=float("nan"))) == 0  # no evidence: a tie
    assert stats.mean_sd([1.0, 2.0, 4.0])[1] == pytest.approx(np.std([1.0, 2.0, 4.0], ddof=1))

    def row(name, reference, delta, pairs=1):
        verdict = "inconclusive" if pairs < 2 or not reference else "agrees"
        fields = {"direction": verdict, "reference": reference, "delta_ours": delta, "pairs": pairs}
        return types.SimpleNamespace(row=name, pilot=False, **{k: {"ppl": v} for k, v in fields.items()})

    singles = [row("A1", 1, 0.2), row("A2", 0, 0.1), row("B1", 1, -0.3)]
    assert footer.count_line(singles, "ppl") == (  # a paper tie cannot agree: not in the denominator
        "PPL direction as the paper's (single seeds, no spread: the raw sign, no verdict): 1 of the 2 rows with a "
        "paper difference beyond its noise."
    )
    two_seed_ties = [row("A1", 1, 0.2), row("A3", 0, 0.0, pairs=2)]
    assert "no row has 2 or more paired seeds and a paper difference beyond its noise" in footer.count_line(
        two_seed_ties, "ppl"
    )


def test_rows_ended_by_early_stopping_are_finished_at_their_plateau_and_say_so(tmp_path, capsys):
    root = tmp_path / "t3"
    args = runner.parser("collect").parse_args(["table3", f"--root={root}", "--profile=mini", "--seeds=3"])
    ctx = Context(args, [])
    ctx.record()
    ends = {"base": [800, 1000, 700], "A1": [1000, 1000, 1000], "A2": [1000, 1000, 1000]}
    for run in ctx.sweep.select("base,A1,A2"):
        for k, end in enumerate(ends[run.name]):
            rep = Replicate(run, k)
            patience = 2 if run.name == "base" else 3  # A1 and A2 share theirs; base's is named beside it
            config = rep.resolved(()) | {"early_stopping_patience": patience, "best_metric": "dev_ppl"}
            best = end - 200 if end < 1000 else end  # dev PPL falls to `best`, then rises a little
            curve = {s: 12.0 - min(s, best) / 100 + max(0, s - best) / 10_000 for s in range(100, end + 1, 100)}
            fake_workdir(root / rep.name, config, curve, (2.0, 50.0), 50.0 + k, end=end if end < 1000 else 0)
    base_rows = [ctx.read(rep) for rep in ctx.replicates(ctx.sweep.select("base")[0])]
    assert [row.total_steps for row in base_rows] == [800, 1000, 700]  # early stopping's end, else the cap
    assert [str(row.state()) for row in base_rows] == ["finished"] * 3
    rows = {rec.row: rec for rec in gather(ctx, ctx.sweep.select("base,A1,A2"))}
    assert rows["base"].ends == {0: 800, 1: 1000, 2: 700} and rows["base"].plateaued == 2
    assert cells.steps_cell(rows["base"]) == "700-1000/1000, 2 of 3 at a plateau"
    assert cells.steps_cell(rows["A1"]) == "1000/1000, 0 of 3 at a plateau"  # a criterion, and every seed at the cap
    recs, header = list(rows.values()), rundirs.from_root(ctx, [])["header"]
    table = report.markdown(ctx.sweep, recs, footer.footer(ctx.sweep, header, recs))
    assert (
        "finds no better dev_ppl in 3 dev evaluations (one every 100 steps), or the cap of 1000 steps "
        "(for base: no better dev_ppl in 2 dev evaluations (one every 100 steps), or the cap of 1000 steps), and is"
    ) in table
    reps = ctx.replicates(ctx.sweep.select("base")[0])  # `run` skips them, naming the step each ended at
    for rep, say in [(reps[0], "finished (step 800/1000, a plateau)"), (reps[1], "finished (step 1000)")]:
        assert runner.run_row(ctx, rep, None, rep.resolved(()), "c", f"[1/3] {rep.name}", "") == "finished"
        assert f"[1/3] {rep.name}: {say}; skipped" in capsys.readouterr().err


def test_the_footer_names_each_commit_once_across_rows_trained_at_several():
    row = lambda commit, devices: types.SimpleNamespace(commit=commit, devices=devices)  # noqa: E731
    recs = [row("b2, f0", 1), row("6d, f0", 1), row("", None)]
    assert footer.distinct(recs, "commit") == "6d, b2, f0" and footer.distinct(recs, "devices") == "1"
    assert footer.distinct([row("", None)], "commit") == "?"
