"""Replicated sweeps: seeds as part of a sweep (init, dropout and data order, paired by seed), the
statistics `collect` reports (checked against NumPy on hand-made results), the tie rule, rows side
by side (`--parallel`), a stopped replicate resuming alone, and golden dry-runs of a replicated row.

Golden files: regenerate with `FXFORMER_UPDATE_GOLDEN=1 python -m pytest tests/test_replicates.py`.
"""

import json
import signal
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import left_as_is
from test_launch import check_golden, head_commit
from test_sweep import LONGER, experiments, losses, started_until_checkpoint, sweep_command

from experiments import __main__ as experiments_main
from experiments import report, runner, stats
from experiments.context import Context, Replicate
from fxformer import exitcodes, optim, trainstate
from fxformer.data import pipeline
from fxformer.model import Transformer, TransformerConfig


def context(root, *flags) -> Context:
    args = runner.parser("collect").parse_args(["table3", f"--root={root}", "--profile=smoke", *flags])
    return Context(args, [])


# ---------------------------------------------------------------------------------------------
# The statistics


def test_tie_rule_is_two_standard_errors():
    assert stats.sign(1.0, 1.0) == 0 and stats.sign(-1.0, 1.0) == 0  # 1 SE: a tie
    assert stats.sign(2.0, 1.0) == 0  # exactly 2 SE is still a tie
    assert stats.sign(3.0, 1.0) == 1 and stats.sign(-3.0, 1.0) == -1  # 3 SE: a direction
    assert stats.sign(3.0, None) is None  # one pair: no SE, no direction
    assert stats.verdict(1, 1, 3) == "agree" and stats.verdict(-1, 1, 3) == "disagree"
    assert stats.verdict(0, 1, 3) == "tie" and stats.verdict(1, 0, 3) == "paper tie, ours not"
    # The reference is a tie within 2 sqrt(2) per-run sd of its log: 4.92 -> 4.88 is 0.0082 nats
    assert stats.reference_sign(-0.04, 4.92, {"log_sd": 0.003}) == 0
    assert stats.reference_sign(0.08, 4.92, {"log_sd": 0.003}) == 1
    assert stats.reference_sign(-0.5, 25.8, {"sd": 0.2}) == 0 and stats.reference_sign(-0.6, 25.8, {"sd": 0.2}) == -1


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
    rows = {rec["row"]: rec for rec in report.gather(ctx, ctx.sweep.select("base,B1,C1"))}
    for row, (ppls, bleus) in HAND_MADE.items():
        for metric, values in (("ppl", ppls), ("bleu", bleus)):
            rec = rows[row]
            assert rec["n"][metric] == len(values)
            assert rec["ours"][metric] == pytest.approx(np.mean(values))
            if len(values) > 1:
                assert rec["sd"][metric] == pytest.approx(np.std(values, ddof=1))
            else:
                assert rec["sd"][metric] is None
    for metric, index in (("ppl", 0), ("bleu", 1)):
        diffs = np.array(HAND_MADE["B1"][index]) - np.array(HAND_MADE["base"][index][:3])  # seed k - seed k
        assert rows["B1"]["pairs"][metric] == 3
        assert rows["B1"]["delta_ours"][metric] == pytest.approx(diffs.mean())
        assert rows["B1"]["se"][metric] == pytest.approx(diffs.std(ddof=1) / np.sqrt(3))
    # B1's PPL difference is many SE above 0 and the paper's +0.24 is no tie: agree; its BLEU: a tie
    assert rows["B1"]["direction"]["ppl"] == "agree"
    assert rows["B1"]["direction"]["bleu"] == "tie"
    assert rows["C1"]["se"]["ppl"] is None and rows["C1"]["direction"]["ppl"].startswith("1 seed")
    assert rows["C1"]["delta_ours"]["ppl"] == pytest.approx(2.02 - 2.00)


def test_collected_table_shows_mean_sd_and_paired_differences(tmp_path, capsys):
    ctx = context(tmp_path / "t3", "--seeds=4")
    write_results(ctx)
    argv = ["collect", "table3", f"--root={ctx.root}", "--profile=smoke", "--seeds=4", "--only=base,B1,C1"]
    status = experiments_main.main(argv)
    assert status == 0
    table = (Path(ctx.root) / "results" / "table.md").read_text()
    b1 = next(line for line in table.splitlines() if line.startswith("| B1 |"))
    assert "2.270 ± 0.061" in b1 and "+0.253 ± 0.026" in b1  # mean ± sd; paired Δ ± SE (NumPy above)
    c1 = next(line for line in table.splitlines() if line.startswith("| C1 |"))
    assert "2.020 ± n/a" in c1 and "1 seed" in c1
    assert "2 SE" in table and "log_sd" not in table  # the footer states the rules in words
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
    records = report.gather(ctx, ctx.sweep.select("base,B1,C1"))
    rises = {rec["row"]: rec["end_above_lowest"] for rec in records}
    assert rises == {"base": pytest.approx(0.05), "B1": pytest.approx(0.4), "C1": None}  # the worst seed's rise
    note = report.end_note(records)
    sd_b1 = np.std(HAND_MADE["B1"][0], ddof=1)  # 0.061: B1 rise of 0.4 is above it; base 0.05 below its 0.065
    assert f"B1 (+0.400, seed sd {sd_b1:.3f})" in note and "base (" not in note and "in 0 of 2 rows" in note


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
    source = builder.as_data_source(split="train")
    batches, _ = pipeline.train_dataset(source, tokenizer, config.data, rows=8, seed=shuffle_seed)
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
# End to end: --seeds, skip, resume one replicate, --parallel


@pytest.fixture(scope="module")
def replicated(tmp_path_factory, data_dir):
    """base and B1 of the smoke profile with 2 seeds each, one run at a time: (root, output)."""
    root = tmp_path_factory.mktemp("replicated") / "t3"
    result = experiments("run", "table3", f"--root={root}", "--profile=smoke", "--only=base,B1", "--seeds=2",
                         "--backend=local", data_dir=data_dir)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result


@pytest.mark.slow
def test_seeds_run_every_row_k_times_and_collect_their_statistics(replicated):
    root, result = replicated
    assert result.stderr.count(": train (step 0/8") == 4
    for name in ("base", "base.s1", "B1", "B1.s1"):
        assert (root / name / "eval" / "validation-8.json").exists()
    assert json.loads((root / "sweep-root.json").read_text())["seeds"] == 2
    assert losses(root / "base") != losses(root / "base.s1")  # another init, dropout and data order
    collected = experiments("collect", "table3", f"--root={root}")
    assert collected.returncode == 0, collected.stderr[-2000:]
    lines = {line.split("|")[1].strip(): line for line in collected.stdout.splitlines() if line.startswith("| ")}
    assert lines["base"].count(" ± ") >= 2 and "| 2 |" in lines["base"]
    assert lines["B1"].count(" ± ") >= 4  # mean ± sd of PPL and BLEU, paired Δ ± SE of both
    again = experiments("run", "table3", f"--root={root}", "--only=base,B1")  # the root remembers the rest
    assert again.returncode == 0 and again.stderr.count("skipped") == 4 and ": train" not in again.stderr


@pytest.mark.slow
def test_the_same_seed_gives_the_same_losses_in_another_root(replicated, tmp_path, data_dir):
    root, _ = replicated
    other = tmp_path / "t3"
    result = experiments("run", "table3", f"--root={other}", "--profile=smoke", "--only=B1", "--seeds=2",
                         data_dir=data_dir)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert losses(other / "B1.s1") == losses(root / "B1.s1") and losses(other / "B1") == losses(root / "B1")


@pytest.mark.slow
def test_sigterm_during_the_second_replicate_resumes_that_replicate_only(replicated, tmp_path, data_dir):
    root = tmp_path / "t3"
    argv = sweep_command("run", "table3", f"--root={root}", "--profile=smoke", "--only=B1", "--seeds=2",
                         data_dir=data_dir, extra=LONGER)  # fmt: skip
    checkpoints = root / "B1.s1" / "checkpoints"
    launcher = started_until_checkpoint(argv, checkpoints, timeout_s=300, stdout=subprocess.DEVNULL)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=120) == exitcodes.STOPPED
    launcher.stderr.close()
    stopped_at = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    result = experiments("run", "table3", f"--root={root}", "--only=B1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "B1: finished (step 30); skipped" in result.stderr
    assert f"B1.s1: resume from step {stopped_at}" in result.stderr
    assert json.loads((root / "B1.s1" / "sweep.json").read_text())["attempts"] == 2
    assert json.loads((root / "B1" / "sweep.json").read_text())["attempts"] == 1


@pytest.mark.slow
def test_parallel_runs_two_rows_at_once_with_the_same_losses(replicated, tmp_path, data_dir):
    root, _ = replicated
    side = tmp_path / "t3"
    result = experiments("run", "table3", f"--root={side}", "--profile=smoke", "--only=base,B1", "--seeds=2",
                         "--parallel=2", data_dir=data_dir)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("base", "base.s1", "B1", "B1.s1"):
        assert losses(side / name) == losses(root / name), name
    spans = {}  # when each run's lease was taken and when its evaluation was written
    for name in ("base", "B1"):
        started = json.loads((side / name / "sweep.json").read_text())["started"]
        spans[name] = (started, (side / name / "eval" / "validation-8.json").stat().st_mtime)
    assert spans["B1"][0] < spans["base"][1] and spans["base"][0] < spans["B1"][1]  # they overlapped
    assert (side / "B1" / "logs" / "process_0" / "worker.log").exists()


# ---------------------------------------------------------------------------------------------
# Golden dry-runs of a replicated row


def test_tpu_dry_run_of_a_replicated_row_matches_golden_file(fake_bucket, capsys):
    status = experiments_main.main(["run", "table3", "--root=gs://bucket/table3", "--only=B1", "--seeds=2",
                                    "--backend=tpu", "--tpu=my-v4-32", "--zone=us-central2-b", "--workers=4",
                                    "--dry-run"])  # fmt: skip
    out = capsys.readouterr()
    assert status == 0, out.err
    text = out.out.replace(head_commit(), "<commit>")
    check_golden("sweep_table3_B1_seeds2_tpu.txt", text)
    assert "--workdir=gs://bucket/table3/B1.s1 --config.seed=1 --config.data.shuffle_seed=1" not in text
    assert "--config.seed=1 --config.data.shuffle_seed=1 --workdir=gs://bucket/table3/B1.s1" in text
    assert not fake_bucket.store


@pytest.mark.slow
def test_slurm_dry_run_of_a_replicated_row_matches_golden_file():
    result = experiments("run", "table3", "--root=/shared/table3", "--only=B1", "--seeds=2", "--backend=slurm",
                         "--nodes=2", "--gpus_per_node=8", "--time=24:00:00", "--dry-run")  # fmt: skip
    assert result.returncode == 0, result.stderr
    check_golden("sweep_table3_B1_seeds2_slurm.txt", result.stdout)
    assert "--config.seed=1 --config.data.shuffle_seed=1 --workdir=/shared/table3/B1.s1" in result.stdout
