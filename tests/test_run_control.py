"""What ends or steers a run besides its last step (a time budget, early stopping, a signal
while preparing or compiling, a loss that explodes) and what it keeps: the best checkpoint,
averaged checkpoints, its metrics across a resume."""

import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import env_with_devices, left_as_is, logged, run_module, run_train, snapshot, train_command

from fxformer import early, exitcodes, metrics, paths, tokens
from fxformer.data import pipeline


@pytest.mark.slow
def test_a_finite_explosion_after_resume_stops_and_keeps_the_checkpoint_before_it(tmp_path, data_dir, corpus):
    from conftest import final_params, run_train

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=20, checkpoint_every_steps=5, keep_checkpoints=2)
    good = final_params(workdir)
    result = subprocess.run(
        train_command(
            workdir, data_dir, num_train_steps=60, checkpoint_every_steps=5, keep_checkpoints=2, learning_rate_scale=1e6
        ),
        env=env_with_devices(1),
        capture_output=True,
        text=True,
    )
    assert result.returncode == exitcodes.USER_ERROR and "Traceback" not in result.stderr
    assert "The training loss exploded to" in result.stderr and "non-finite" not in result.stderr, result.stderr[-2000:]
    assert "the last good checkpoint (step 20) is intact" in result.stderr
    assert 20 in [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    after = final_params(workdir)
    assert all((good[k] == after[k]).all() for k in good)
    evaluated = run_module("fxformer.evaluate", f"--workdir={workdir}", "--step=20", "--limit=5")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]


@pytest.mark.slow
def test_a_time_budget_stops_with_a_checkpoint_and_the_next_run_goes_on(tmp_path, data_dir, corpus):
    workdir = tmp_path / "w"
    command = train_command(workdir, data_dir, num_train_steps=100_000, train_minutes=0.1, eval_every_steps=1)
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == exitcodes.STOPPED, result.stderr[-2000:]
    saved = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1 and f"time budget of 0.1 minutes: saved step {saved[0]}" in result.stdout
    assert "(time budget, near step" in result.stdout  # the ETA is to the budget's end, which comes first
    dev_steps = list(logged(workdir, "dev_ppl"))
    assert saved[0] not in dev_steps  # the stop did not wait for a dev evaluation
    # resumed, the run makes that evaluation up before its first step: as an uninterrupted run, every step evaluated
    command = train_command(workdir, data_dir, num_train_steps=saved[0] + 1, eval_every_steps=1)
    resumed = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert resumed.returncode == exitcodes.OK, resumed.stderr[-2000:]
    assert f"step {saved[0]}: the dev evaluation its stop passed over, made up: dev_ppl" in resumed.stdout
    assert list(logged(workdir, "dev_ppl")) == list(range(1, saved[0] + 2))
    steps = [line["step"] for line in metrics.logged(paths.Workdir(workdir))]
    assert len(steps) == len(set(steps)), steps  # the line of the stop's step amended, not a second one


@pytest.mark.slow
def test_averaging_after_a_time_budget_takes_checkpoints_half_an_interval_apart(tmp_path, data_dir, corpus):
    """A time budget saves at whatever step it ends, often just after a regular checkpoint: the
    average of the last 3 must still be of 3 checkpoints at least half the interval (2 steps) apart."""

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=12, checkpoint_every_steps=4)  # checkpoints 4, 8, 12
    # resumed with a budget of 6 ms: it runs out before the first step, which is still trained and saved
    # (13): a budget ends a run after a step at the earliest. (0.6 s once let a second step in, when the
    # step came compiled from the tests' shared compilation cache.)
    command = train_command(workdir, data_dir, num_train_steps=100_000, train_minutes=0.0001, checkpoint_every_steps=4)
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == exitcodes.STOPPED, result.stderr[-2000:]
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == [4, 8, 12, 13], saved
    flags = ("--average_last=3", "--limit=8", "--config.decode.strategy=greedy")
    result = run_module("fxformer.evaluate", f"--workdir={workdir}", *flags)
    assert result.returncode == 0, result.stderr[-2000:]
    steps = json.loads(next((workdir / "eval").glob("test-*.json")).read_text())["checkpoint_steps"]
    assert steps == [4, 8, 13]  # 12 is 1 step from 13: passed over, and said so
    assert "skipped step(s) 12" in result.stdout


@pytest.mark.slow
def test_metrics_record_tokens_seen_and_wall_time_across_a_resume(tmp_path, data_dir, corpus, corpus_ids):
    from conftest import run_train

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=4, log_every_steps=2, checkpoint_every_steps=4)
    first = logged(workdir, "tokens_seen")
    resumed = run_train(workdir, data_dir, num_train_steps=8, log_every_steps=2, checkpoint_every_steps=4)
    seen, wall = logged(workdir, "tokens_seen"), logged(workdir, "wall_s")
    assert list(seen) == [2, 4, 6, 8] and {k: seen[k] for k in first} == first
    assert all(b > a for a, b in zip(list(seen.values()), list(seen.values())[1:]))  # counted on across the resume
    assert all(b >= a for a, b in zip(list(wall.values()), list(wall.values())[1:]))
    # the target tokens (not pads) of the first 8 batches of the same stream (512 tokens: 16 rows of 32), counted here
    data = corpus[0].data.copy_and_resolve_references()
    data.tokens_per_batch = 512
    batches = iter(pipeline.train_dataset(corpus_ids, data, 16, data.shuffle_seed)[0])
    counted = np.cumsum([int((next(batches)["targets"] != tokens.PAD_ID).sum()) for _ in range(8)])
    assert seen == {step: counted[step - 1] for step in (2, 4, 6, 8)}
    assert "tgt tok/s" in resumed.stdout
    # epochs: passes over the kept training pairs, so about tokens seen / target tokens of the kept pairs
    config, builder, tokenizer = corpus
    from fxformer.data import corpora as corpora_source

    source = corpora_source.data_source(builder, "train")
    lengths = [
        (len(tokenizer.encode(source[i]["en"].decode())), len(tokenizer.encode(source[i]["de"].decode())))
        for i in range(len(source))
    ]
    kept_target_tokens = sum(t for s, t in lengths if max(s, t) <= config.data.max_length)
    epochs = logged(workdir, "epochs")
    assert list(epochs) == [2, 4, 6, 8] and all(b > a for a, b in zip(list(epochs.values()), list(epochs.values())[1:]))
    assert epochs[8] == pytest.approx(seen[8] / kept_target_tokens, rel=0.15)


def test_a_resume_before_the_best_checkpoint_still_counts_the_evaluations_logged_before_it(tmp_path):
    import jax.numpy as jnp
    import ml_collections

    from fxformer import checkpoint

    # dev_ppl at steps 100, 200, 300 (min_delta 10%: neither later value is an improvement); the
    # best parameters are those of step 300, saved after the last training checkpoint (250)
    logged_lines = [{"step": 100, "dev_ppl": 10.0}, {"step": 200, "dev_ppl": 9.95}, {"step": 300, "dev_ppl": 9.9}]
    rule = {"early_stopping_patience": 2, "early_stopping_min_delta": 0.1, "num_train_steps": 900}
    config = ml_collections.ConfigDict({"best_metric": "dev_ppl", **rule})
    params = {"w": jnp.ones(3)}
    first, counted = checkpoint.Best(tmp_path / "best", "dev_ppl", 0), early.EarlyStopping.of(config, (), 0)
    why = [counted.observe(line["step"], line) for line in logged_lines]
    for line in logged_lines:
        first.offer(line["step"], line, params, log=lambda *a: None)
    assert counted.stale == 2 and why == ["", "", "no better dev_ppl by 10% in 2 dev evaluations (early stopping)"]
    first.close()
    resumed = checkpoint.Best(tmp_path / "best", "dev_ppl", 250)
    assert resumed.value is None and resumed.manager.latest_step() is None  # the future best: removed, retraced
    resumed.close()
    again = early.EarlyStopping.of(config, logged_lines, 250)
    assert again.evaluations == [10.0, 9.95] and again.stale == 1  # as the uninterrupted run counted at 250
    assert again.reason(250) == "" and again.observe(300, logged_lines[2]) == why[2]  # and ends where it did
    assert early.EarlyStopping.of(config, logged_lines, 300).reason(900) == ""  # the last step ends anyway


def trained_to_a_plateau(workdir, data_dir, **early_stopping) -> tuple[list[str], subprocess.CompletedProcess]:
    """A run of 200 steps evaluated on dev every 2, which `early_stopping` ends early: (its
    command, its output)."""
    command = train_command(workdir, data_dir, num_train_steps=200, eval_every_steps=2, **early_stopping)
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == exitcodes.OK, result.stderr[-2000:]
    return command, result


@pytest.mark.slow
def test_early_stopping_ends_the_run_as_done_when_dev_stops_improving(tmp_path, data_dir, corpus):
    workdir = tmp_path / "w"
    # a learning rate so small that dev perplexity barely moves: with a tiny patience it stops
    command, result = trained_to_a_plateau(
        workdir, data_dir, learning_rate_scale=1e-9, early_stopping_patience=1, best_metric="dev_accuracy"
    )
    assert "early stopping" in result.stdout
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved < 200 and saved == max(logged(workdir, "dev_ppl"))
    assert early.ended_at(paths.Workdir(workdir), "dev_accuracy", 1) == saved
    before = snapshot(workdir)
    again = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)  # the same command
    assert again.returncode == exitcodes.OK, again.stderr[-2000:]
    assert f"ended at step {saved}: no better dev_accuracy in 1 dev evaluations" in again.stdout
    assert "| loss" not in again.stdout  # not one step trained
    after = snapshot(workdir)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not {k for k in changed if k.startswith(("checkpoints", "best", "metrics"))}, changed


# the last commit whose code counted early stopping inside checkpoint.Best (before fxformer/early.py)
BEFORE_EARLY_MODULE = "4567b0b18d1d2afb0e75c3bf9d991f4444803b85"


def code_at(commit: str, into: Path) -> Path:
    """fxformer/ and configs/ as they were at `commit`, written under `into`; skips where the
    checkout lacks that commit (no git, or a shallow clone)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        command = ["git", "-C", str(repo), "archive", commit, "fxformer", "configs"]
        archive = subprocess.run(command, capture_output=True)
    except FileNotFoundError:
        archive = None
    if archive is None or archive.returncode:
        pytest.skip(f"{commit} is not in this checkout (no git, or a shallow clone)")
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


@pytest.mark.slow
def test_a_workdir_written_before_early_stopping_moved_resumes_with_its_best_and_its_count(tmp_path, data_dir, corpus):
    """A run the older code trained to step 4 (two dev evaluations counted, its best kept) goes on
    under this code exactly as an uninterrupted run of this code: the same dev perplexities, early
    stopping at the same step (it counts the older code's evaluations), the same best kept."""
    rule = dict(eval_every_steps=2, checkpoint_every_steps=2, best_metric="dev_ppl", learning_rate_scale=1e-9)
    rule.update(early_stopping_patience=2, early_stopping_min_delta=0.99)  # the plateau: the third evaluation
    old = code_at(BEFORE_EARLY_MODULE, tmp_path / "old")
    resumed, whole = tmp_path / "resumed", tmp_path / "whole"
    env = {**env_with_devices(1), "PYTHONPATH": str(old)}
    first = subprocess.run(
        train_command(resumed, data_dir, num_train_steps=4, **rule), cwd=old, env=env, capture_output=True, text=True
    )
    assert first.returncode == exitcodes.OK, first.stderr[-2000:]
    assert [p.name for p in (resumed / "best").iterdir() if p.name.isdigit()], "the older run kept no best"
    results = [subprocess.run(train_command(w, data_dir, num_train_steps=200, **rule), env=env_with_devices(1),
                              capture_output=True, text=True) for w in (resumed, whole)]  # fmt: skip
    for result in results:
        assert result.returncode == exitcodes.OK, result.stderr[-2000:]
        assert "no better dev_ppl by 99% in 2 dev evaluations (early stopping): saved step 6" in result.stdout
    assert logged(resumed, "dev_ppl") == pytest.approx(logged(whole, "dev_ppl"), rel=1e-6)
    kept = [[int(p.name) for p in (w / "best").iterdir() if p.name.isdigit()] for w in (resumed, whole)]
    ppl = logged(whole, "dev_ppl")
    assert kept[0] == kept[1] == [min(ppl, key=ppl.get)]
    assert early.ended_at(paths.Workdir(resumed), "dev_ppl", 2, min_delta=0.99) == 6


@pytest.mark.slow
def test_a_smallest_improvement_ends_the_run_while_the_best_parameters_stay_the_lowest_and_evaluate(
    tmp_path, data_dir, corpus
):
    workdir = tmp_path / "w"
    # early_stopping_min_delta 0.99: only a 100-fold drop of dev perplexity would count, so the
    # plateau is reached at the third evaluation (step 6), whatever the run learns; the best
    # parameters are kept apart from the last checkpoint, the only one kept
    _, result = trained_to_a_plateau(
        workdir,
        data_dir,
        early_stopping_patience=2,
        early_stopping_min_delta=0.99,
        best_metric="dev_ppl",
        keep_checkpoints=1,
    )
    assert "no better dev_ppl by 99% in 2 dev evaluations (early stopping)" in result.stdout
    ppl = logged(workdir, "dev_ppl")
    assert list(ppl) == [2, 4, 6]
    assert early.ended_at(paths.Workdir(workdir), "dev_ppl", 2, min_delta=0.99) == 6
    kept = [int(p.name) for p in (workdir / "best").iterdir() if p.name.isdigit()]
    assert min(ppl, key=ppl.get) != 2  # the 99% rule's one improvement is step 2: a lower point later tells them apart
    assert kept == [min(ppl, key=ppl.get)]  # model selection still takes any lower perplexity
    best_step = kept[0]
    result = run_module("fxformer.evaluate", f"--workdir={workdir}", "--step=best", "--split=validation")
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads((workdir / "eval" / f"validation-{best_step}-best.json").read_text())
    assert written["checkpoint_steps"] == [best_step]
    assert written["ppl"] == pytest.approx(ppl[best_step], rel=1e-4)  # the same parameters the loop measured
    with left_as_is(workdir):
        bad = run_module("fxformer.evaluate", f"--workdir={workdir}", "--step=last")
    assert bad.returncode == exitcodes.USER_ERROR and "'best'" in bad.stderr


@pytest.mark.slow
def test_dev_bleu_during_training_selects_the_best_checkpoint_and_evaluate_agrees(tmp_path, data_dir, corpus):
    import json as _json

    from conftest import run_train

    workdir = tmp_path / "w"
    # The tiny model's dev BLEU stays below 1 (it must only be above 0, so that agreeing means
    # something); 60 steps at 3x the learning rate gave 0 at every check once float rounding moved.
    result = run_train(
        workdir,
        data_dir,
        num_train_steps=120,
        eval_every_steps=60,
        dev_bleu_every_steps=40,
        dev_bleu_sentences=24,
        best_metric="dev_bleu",
        checkpoint_every_steps=40,
    )
    bleu = logged(workdir, "dev_bleu")
    assert list(bleu) == [40, 80, 120] and "dev BLEU" in result.stdout
    assert list(logged(workdir, "dev_ppl")) == [60, 120]  # each at its own interval
    best_step = max(bleu, key=bleu.get)
    assert [p.name for p in (workdir / "best").iterdir() if p.name.isdigit()] == [str(best_step)]
    flags = ("--step=best", "--split=validation", "--limit=24")
    evaluated = run_module("fxformer.evaluate", f"--workdir={workdir}", *flags)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    written = _json.loads((workdir / "eval" / f"validation-{best_step}-best-first24.json").read_text())
    assert written["bleu"] == pytest.approx(bleu[best_step], abs=1e-6) and bleu[best_step] > 0
    with left_as_is(tmp_path / "x"):
        no_bleu = subprocess.run(
            train_command(tmp_path / "x", data_dir, best_metric="dev_bleu"),
            env=env_with_devices(1),
            capture_output=True,
            text=True,
        )
    assert no_bleu.returncode == exitcodes.USER_ERROR and "set dev_bleu_every_steps" in no_bleu.stderr


def test_a_metrics_line_without_an_integer_step_is_dropped_on_resume(tmp_path):
    from fxformer.metrics import MetricWriter

    lines = ['{"step": 1, "loss": 2.0}', '{"step": null}', '{"step": 2, "loss": 1.5}', '{"step": "x"}', '{"step": 9']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    kept = metrics.logged(paths.Workdir(tmp_path), up_to=2)
    assert kept == [json.loads(lines[0]), json.loads(lines[2])]
    assert metrics.logged(paths.Workdir(tmp_path), up_to=1) == [json.loads(lines[0])]
    writer = MetricWriter(paths.Workdir(tmp_path), kept, resume_step=2)
    writer.close()
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == [lines[0], lines[2]]
    assert writer.last() == {"step": 2, "loss": 1.5} and writer.logged() == kept


@pytest.mark.slow
def test_sigterm_during_data_preparation_stops_at_once_and_keeps_nothing(tmp_path, data_dir, tiny_run):
    """Before training begins a signal stops the command as soon as Python runs again (here within
    seconds, during data preparation): 2 for a new run, whose workdir is removed; 75 for a resume,
    whose workdir is left byte for byte."""
    import time

    def stopped_while_preparing(workdir, fresh_data_dir, **overrides):
        command = train_command(workdir, fresh_data_dir, **overrides)
        process = subprocess.Popen(command, env=env_with_devices(1), stdout=subprocess.PIPE, text=True)
        for line in process.stdout:
            if line.startswith("data: preparing"):
                break
        start = time.time()
        process.send_signal(signal.SIGTERM)
        rest = process.stdout.read()
        status = process.wait(timeout=60)
        process.stdout.close()
        return status, time.time() - start, rest

    fresh = tmp_path / "fresh"
    status, seconds, out = stopped_while_preparing(fresh, tmp_path / "tfds-a", num_train_steps=2)
    assert status == exitcodes.USER_ERROR and seconds < 30 and not fresh.exists(), out

    workdir = tiny_run(tmp_path / "w", steps=2)
    before = snapshot(workdir)
    status, seconds, out = stopped_while_preparing(workdir, tmp_path / "tfds-b", num_train_steps=4)
    assert status == exitcodes.STOPPED and seconds < 30, out
    assert "SIGTERM before training began: nothing new to save" in out
    assert snapshot(workdir) == before


@pytest.mark.slow
def test_sigterm_during_compilation_stops_after_the_first_step_with_nothing_half_written(tmp_path, data_dir, corpus):
    """The first step compiles the model (XLA: no Python runs until it returns, so the signal is
    handled then): the run saves that step and exits 75 within seconds; no unfinished save is
    left, and the same command resumes from it. (A loaded machine may deliver the signal a
    moment before the first step: then nothing is saved, still 75, and the resume trains.)"""
    import time

    workdir = tmp_path / "w"
    command = train_command(workdir, data_dir, num_train_steps=50, log_every_steps=10)
    env = {**env_with_devices(1), "JAX_ENABLE_COMPILATION_CACHE": "false"}  # a real compilation, seconds long
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("model:"):  # printed just before the first step, which compiles
            break
    time.sleep(0.3)
    start = time.time()
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    seconds = time.time() - start
    assert process.returncode == exitcodes.STOPPED and seconds < 30, err[-2000:]
    checkpoints = workdir / "checkpoints"
    saved = sorted(p.name for p in checkpoints.iterdir()) if checkpoints.exists() else []
    if saved:  # the signal came while a step ran in XLA (the first compiles): that step is saved, and only it
        assert len(saved) == 1 and saved[0].isdigit(), saved  # no unfinished save
        assert f"SIGTERM: saved step {saved[0]} to {checkpoints}; exiting" in out, out
    else:  # on a loaded machine it may come before the first step began
        assert "SIGTERM before the first step: nothing new to save" in out, out
    resumed = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not saved or f"resumed from {checkpoints / saved[0]}" in resumed.stdout


@pytest.mark.slow
def test_a_resume_on_a_device_count_that_changes_the_rows_per_step_says_so(tmp_path, data_dir, corpus):
    workdir = tmp_path / "w"
    run_train(workdir, data_dir, devices=1, num_train_steps=2, checkpoint_every_steps=2)  # 512 tokens: 16 rows of 32
    same = run_train(workdir, data_dir, devices=2, num_train_steps=4, checkpoint_every_steps=2)  # 16 rows again
    assert "resumed from" in same.stdout and "rows per step" not in same.stdout
    other = run_train(workdir, data_dir, devices=3, num_train_steps=6, checkpoint_every_steps=2)  # 18 rows
    assert "warning: this run trained with 16 rows per step and goes on with 18 (on 3 devices" in other.stdout
    info = json.loads((workdir / "run.json").read_text())
    assert info["rows_per_step"] == 18
    import jax
    import numpy as np

    from fxformer import versions

    # what the run computed with: the versions the packages report themselves, and the device
    assert info["versions"]["jax"] == jax.__version__ and info["versions"]["numpy"] == np.__version__
    assert info["device_kind"] == jax.devices()[0].device_kind and info["platform"] == "cpu"
    assert info["cpu"] == versions.cpu()  # the host CPU, whose instruction set XLA compiled for


def test_the_data_state_records_its_rows_per_step_and_reads_an_older_one_without_them(corpus, corpus_ids):
    from fxformer import parallel

    def batches(rows):  # grain's iterator over the small corpus's packed batches, 16 rows each
        dataset, _ = pipeline.train_dataset(corpus_ids, corpus[0].data, 16, seed=0)
        return parallel.GlobalBatches(parallel.data_mesh(), iter(dataset), rows=rows)

    straight = batches(16)
    fourth = [next(straight)[0] for _ in range(4)][3]
    taken = batches(16)
    for _ in range(3):
        next(taken)
    saved = taken.get_state()
    assert json.loads(saved) == {"rows_per_step": 16, "iterator": json.loads(json.dumps(taken.batches.get_state()))}
    for state, rows in ((saved, 16), (json.dumps(json.loads(saved)["iterator"]).encode(), None)):  # new, older
        restored = batches(18)
        restored.set_state(state)
        assert restored.restored_rows == rows
        local, _ = next(restored)
        for key, value in fourth.items():  # the batch after the saved position, made again
            np.testing.assert_array_equal(local[key], value, err_msg=key)
