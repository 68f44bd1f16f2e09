"""Bad input is refused in one sentence before anything is written (issue: nothing lost or surprising)."""

import json
import math
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import cut_short, ended, env_with_devices, left_as_is, logged, run_train, snapshot, train_command

from fxformer import cli, configfile, exitcodes, train
from fxformer.config import with_overrides
from fxformer.errors import UserError


@pytest.mark.slow
def test_a_refused_model_writes_nothing_and_the_corrected_command_trains(tmp_path, data_dir, corpus):
    import subprocess

    workdir = tmp_path / "w"
    with left_as_is(workdir):
        bad = subprocess.run(
            train_command(workdir, data_dir, **{"model.d_model": 33, "num_train_steps": 2}),
            capture_output=True,
            text=True,
        )
    assert bad.returncode == exitcodes.USER_ERROR and "error: model.d_model" in bad.stderr and "33" in bad.stderr
    assert not (workdir / "config.json").exists()
    good = subprocess.run(
        train_command(workdir, data_dir, **{"model.d_model": 32, "num_train_steps": 2}), capture_output=True, text=True
    )
    assert good.returncode == 0, good.stderr[-2000:]


@pytest.mark.slow
def test_params_counts_with_the_configs_vocabulary():
    import subprocess
    import sys

    from fxformer.params import count_parameters

    config = configfile.load_config("configs/default.py")
    out = subprocess.run(
        [sys.executable, "-m", "fxformer.params", "--config=configs/default.py", "--config.data.vocab_size=8000"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    expected = count_parameters(config.model, 8000)
    assert f"{expected:,} parameters" in out.stdout and "8,000-token" in out.stdout
    assert expected != count_parameters(config.model, 37000)


@pytest.mark.slow
def test_translate_splits_on_newlines_only_and_keeps_blank_lines(eight_device_workdir, tmp_path):
    import subprocess
    import sys

    from conftest import env_with_devices

    from fxformer.paths import split_lines

    assert split_lines("a\fb\u2028c\r\n\nd".encode(), "x") == ["a\fb\u2028c", "", "d"]
    with pytest.raises(UserError, match="line 2"):
        split_lines(b"fine\n\xff bad\n", "x")

    command = [sys.executable, "-m", "fxformer.translate", f"--workdir={eight_device_workdir}", "--step=20"]
    text = "The dog sees the man.\fToday the woman buys a book.\n\n   \nThe man sees the dog.\n"
    result = subprocess.run(command, input=text, capture_output=True, text=True, env=env_with_devices(1))
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout.split("\n")
    assert len(out) == 5 and out[1] == "" and out[2] == "" and out[0] and out[3] and out[4] == ""

    with left_as_is(eight_device_workdir):
        bad = subprocess.run(command, input=b"\xff\xfe\n", capture_output=True, env=env_with_devices(1))
    assert bad.returncode == exitcodes.USER_ERROR and b"not UTF-8" in bad.stderr and b"Traceback" not in bad.stderr

    many = tmp_path / "many.txt"
    many.write_text("The dog sees the man.\n" * 200)
    pipe = subprocess.run(
        f"{' '.join(command)} --input={many} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=env_with_devices(1),
    )
    assert len(pipe.stdout.splitlines()) == 1 and "Traceback" not in pipe.stderr and "Broken pipe" not in pipe.stderr


def test_d_k_and_d_v_follow_d_model_and_heads_unless_set():
    p = cli.parser("", "test")
    _, config = cli.parse(p, ["--config=configs/default.py", "--config.model.d_model=256"])
    assert (config.model.d_k, config.model.d_v) == (256 // config.model.num_heads,) * 2
    _, config = cli.parse(p, ["--config=configs/base.py", "--config.model.num_heads=16"])
    assert (config.model.d_k, config.model.d_v) == (32, 32)
    _, config = cli.parse(p, ["--config=configs/base.py", "--config.model.d_k=16"])
    assert (config.model.d_k, config.model.d_v) == (16, 64)  # set: kept; the other follows
    with pytest.raises(UserError, match="not divisible by model.num_heads"):
        cli.parse(p, ["--config=configs/base.py", "--config.model.num_heads=7"])
    from configs import table3

    assert [table3.get_config(r).model.d_k for r in ("base", "B1", "C4", "big")] == [64, 16, 32, 64]


def test_divergence_watch():
    watch = train.DivergenceWatch(4.0, vocab_size=1000)  # ceiling 3 ln 1000 = 20.7
    assert watch.first_bad([7.0, 5.0, 3.0, 2.5, 4.0]) is None  # healthy, noisy
    assert watch.first_bad([2.6, 11.0])[0] == 1  # 4.4 x the best 2.5
    assert train.DivergenceWatch(4.0, 1000).first_bad([6.9, 6e10])[0] == 1  # from the first steps
    assert train.DivergenceWatch(4.0, 1000).first_bad([0.2, 0.9]) is None  # 4.5x, but within 2 nats
    assert train.DivergenceWatch(0.0, 1000).first_bad([1.0, 1e9, math.nan]) == (2, "became non-finite")


@pytest.mark.slow
def test_a_finite_explosion_after_resume_stops_and_keeps_the_checkpoint_before_it(tmp_path, data_dir, corpus):
    import subprocess

    from conftest import env_with_devices, final_params, run_train

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
    assert "The training loss exploded to" in result.stderr or "non-finite" in result.stderr
    assert "the last good checkpoint (step 20) is intact" in result.stderr
    assert 20 in [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    after = final_params(workdir)
    assert all((good[k] == after[k]).all() for k in good)
    evaluated = subprocess.run(
        [sys.executable, "-m", "fxformer.evaluate", f"--workdir={workdir}", "--step=20", "--limit=5"],
        env=env_with_devices(1),
        capture_output=True,
        text=True,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]


@pytest.mark.slow
def test_a_different_tokenizer_is_named_as_a_mismatch_not_a_corrupt_checkpoint(tmp_path, data_dir, corpus):
    import shutil
    import subprocess

    from conftest import env_with_devices, run_train, small_config

    from fxformer.data import corpora, tokenizer_for

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=2)
    other = small_config(data_dir, vocab_size=300)
    shutil.copy(tokenizer_for(other.data, corpora.prepare(other.data)).path, workdir / "tokenizer.model")
    for command in ("fxformer.evaluate", "fxformer.train"):
        with left_as_is(workdir):
            result = subprocess.run(
                [sys.executable, "-m", command, f"--workdir={workdir}"],
                env=env_with_devices(1),
                capture_output=True,
                text=True,
            )
        assert result.returncode == exitcodes.USER_ERROR, result.stderr[-2000:]
        assert "holds a different model" in result.stderr and "400 x 32 in the checkpoint vs 300 x 32" in result.stderr
        assert "delete" not in result.stderr and "Traceback" not in result.stderr
    assert (workdir / "checkpoints" / "2").exists()


@pytest.mark.slow
def test_a_used_workdir_without_checkpoints_says_it_starts_from_step_0(tmp_path, data_dir, corpus):
    import shutil

    from conftest import run_train

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=2)
    shutil.rmtree(workdir / "checkpoints")
    again = run_train(workdir, data_dir, num_train_steps=2)
    assert "has metrics from an earlier run but no checkpoint: training starts from step 0" in again.stdout


@pytest.mark.slow
def test_unfinished_saves_are_removed_on_start(tmp_path, data_dir, corpus):
    from conftest import run_train

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=2)
    leftover = workdir / "checkpoints" / "4.orbax-checkpoint-tmp-1234567"
    (leftover / "state").mkdir(parents=True)
    (leftover / "state" / "big.bin").write_bytes(b"0" * 1000)
    again = run_train(workdir, data_dir, num_train_steps=4)
    assert not leftover.exists() and "a save that never finished" in again.stdout
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]


@pytest.mark.slow
def test_a_time_budget_stops_with_a_checkpoint_and_the_next_run_goes_on(tmp_path, data_dir, corpus):
    import subprocess

    from conftest import env_with_devices

    workdir = tmp_path / "w"
    command = train_command(workdir, data_dir, num_train_steps=100_000, train_minutes=0.1, eval_every_steps=1)
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == exitcodes.STOPPED, result.stderr[-2000:]
    saved = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1 and f"time budget of 0.1 minutes: saved step {saved[0]}" in result.stdout
    assert "(time budget, near step" in result.stdout  # the ETA is to the budget's end, which comes first
    dev_steps = list(logged(workdir, "dev_ppl"))
    assert saved[0] not in dev_steps  # the stop did not wait for a dev evaluation


@pytest.mark.slow
def test_averaging_after_a_time_budget_takes_checkpoints_half_an_interval_apart(tmp_path, data_dir, corpus):
    """A time budget saves at whatever step it ends, often just after a regular checkpoint: the
    average of the last 3 must still be of 3 checkpoints at least half the interval (2 steps) apart."""
    import subprocess

    from conftest import env_with_devices

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=12, checkpoint_every_steps=4)  # checkpoints 4, 8, 12
    # resumed with a budget of 0.6 s: compiling the first step takes longer, so the budget ends there (13)
    command = train_command(workdir, data_dir, num_train_steps=100_000, train_minutes=0.01, checkpoint_every_steps=4)
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == exitcodes.STOPPED, result.stderr[-2000:]
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == [4, 8, 12, 13], saved
    evaluate = [
        sys.executable,
        "-m",
        "fxformer.evaluate",
        f"--workdir={workdir}",
        "--average_last=3",
        "--limit=8",
        "--config.decode.strategy=greedy",
    ]
    result = subprocess.run(evaluate, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    steps = json.loads(next((workdir / "eval").glob("test-*.json")).read_text())["checkpoint_steps"]
    assert steps == [4, 8, 13]  # 12 is 1 step from 13: passed over, and said so
    assert "skipped step(s) 12" in result.stdout


@pytest.mark.slow
def test_damaged_workdirs_and_config_files_are_one_sentence(tmp_path, data_dir):
    import subprocess

    from conftest import env_with_devices

    def run(*argv):
        with left_as_is(tmp_path):
            result = subprocess.run(
                [sys.executable, "-m", *argv], env=env_with_devices(1), capture_output=True, text=True
            )
        assert result.returncode == exitcodes.USER_ERROR and "Traceback" not in result.stderr, result.stderr[-2000:]
        return result.stderr.strip()

    for content in ("", "{not json", "[1, 2]"):
        workdir = tmp_path / f"w{len(content)}"
        workdir.mkdir()
        (workdir / "config.json").write_text(content)
        assert "config.json is damaged" in run("fxformer.evaluate", f"--workdir={workdir}")
        assert "config.json is damaged" in run("fxformer.train", f"--workdir={workdir}")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "is a file" in run("fxformer.train", "--config=configs/default.py", f"--workdir={a_file}")
    assert "lies under the file" in run("fxformer.evaluate", f"--workdir={a_file}/w")
    assert "must be positive" in run("fxformer.evaluate", f"--workdir={tmp_path}", "--average_last=-3")

    raising = tmp_path / "raising.py"
    raising.write_text("def get_config():\n    return {}['missing']\n")
    assert "failed in get_config(): KeyError" in run("fxformer.params", f"--config={raising}")
    a_dict = tmp_path / "a_dict.py"
    a_dict.write_text("def get_config():\n    return {'model': {}}\n")
    assert "not a dict" in run("fxformer.params", f"--config={a_dict}")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module\n")
    assert "failed to load: ModuleNotFoundError" in run("fxformer.params", f"--config={broken}")


@pytest.mark.slow
def test_plot_writes_learning_curves(tmp_path):
    import json as _json
    import subprocess

    for name, scale in (("a", 1.0), ("b", 2.0)):
        w = tmp_path / name
        w.mkdir()
        lines = [
            {"step": s, "loss": scale * 5 / s, "learning_rate": 1e-3 * s, **({"dev_ppl": 9 / s} if s % 2 else {})}
            for s in range(1, 11)
        ]
        (w / "metrics.jsonl").write_text("".join(_json.dumps(m) + "\n" for m in lines))
    result = subprocess.run(
        [sys.executable, "-m", "fxformer.plot", f"--workdir={tmp_path / 'a'}", f"--workdir={tmp_path / 'b'}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    png = (tmp_path / "a" / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    width = lambda png: int.from_bytes(png[16:20], "big")  # noqa: E731 - the PNG header's image width
    (tmp_path / "c").mkdir()
    lines = [{"step": s, "loss": 5 / s, "learning_rate": 1e-3, "tokens_seen": 100 * s, "dev_bleu": s} for s in (1, 2)]
    (tmp_path / "c" / "metrics.jsonl").write_text("".join(_json.dumps(m) + "\n" for m in lines))
    by_tokens = subprocess.run(
        [sys.executable, "-m", "fxformer.plot", f"--workdir={tmp_path / 'c'}", "--x=tokens_seen"],
        capture_output=True,
        text=True,
    )
    assert by_tokens.returncode == 0, by_tokens.stderr
    assert width((tmp_path / "c" / "curves.png").read_bytes()) == width(png)  # loss, dev BLEU, lr: 3 panels as well
    one = {"step": 1, "loss": 1.0, "learning_rate": 1.0, "dev_ppl": 2.0, "dev_bleu": 1.0}
    (tmp_path / "a" / "metrics.jsonl").write_text(_json.dumps(one) + "\n")
    subprocess.run([sys.executable, "-m", "fxformer.plot", f"--workdir={tmp_path / 'a'}"], check=True)
    assert width((tmp_path / "a" / "curves.png").read_bytes()) == width(png) * 4 // 3  # a fourth panel: dev BLEU
    with left_as_is(tmp_path):
        empty = subprocess.run(
            [sys.executable, "-m", "fxformer.plot", f"--workdir={tmp_path / 'none'}"], capture_output=True, text=True
        )
    assert empty.returncode == exitcodes.USER_ERROR and "no metrics.jsonl yet" in empty.stderr


@pytest.mark.slow
def test_evaluate_reports_chrf_and_writes_no_carriage_returns_to_a_log(eight_device_workdir):
    import json as _json
    import subprocess

    import sacrebleu
    from conftest import env_with_devices

    command = [sys.executable, "-m", "fxformer.evaluate", f"--workdir={eight_device_workdir}", "--step=20", "--limit=8"]
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "\r" not in result.stderr and "beam search (test): 1/1" in result.stderr
    written = _json.loads((eight_device_workdir / "eval" / "test-20-first8.json").read_text())
    hyps = (eight_device_workdir / "eval" / "test-20-first8.hyp.txt").read_text().splitlines()
    refs = (eight_device_workdir / "eval" / "test-20-first8.ref.txt").read_text().splitlines()
    assert written["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert f"chrF {written['chrf']:.2f}" in result.stdout


@pytest.mark.slow
def test_the_best_checkpoint_by_dev_perplexity_is_kept_and_evaluates(tmp_path, data_dir, corpus):
    import json as _json
    import subprocess

    from conftest import env_with_devices, run_train

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=30, eval_every_steps=10, checkpoint_every_steps=10, keep_checkpoints=1)
    dev = logged(workdir, "dev_ppl")
    best_step = min(dev, key=dev.get)
    assert [p.name for p in (workdir / "best").iterdir() if p.name.isdigit()] == [str(best_step)]
    command = [sys.executable, "-m", "fxformer.evaluate", f"--workdir={workdir}", "--step=best", "--split=validation"]
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    written = _json.loads((workdir / "eval" / f"validation-{best_step}-best.json").read_text())
    assert written["checkpoint_steps"] == [best_step]
    assert written["ppl"] == pytest.approx(dev[best_step], rel=1e-4)  # the same parameters the loop measured
    with left_as_is(workdir):
        bad = subprocess.run(
            [sys.executable, "-m", "fxformer.evaluate", f"--workdir={workdir}", "--step=last"],
            env=env_with_devices(1),
            capture_output=True,
            text=True,
        )
    assert bad.returncode == exitcodes.USER_ERROR and "'best'" in bad.stderr


@pytest.mark.slow
def test_text_dataset_with_separate_validation_and_test_files(tmp_path, data_dir, corpus):
    import subprocess

    from conftest import TINY, env_with_devices

    _, builder, _ = corpus
    from fxformer.data import corpora as corpora_source

    files = {}
    for split, name in (("train", "train"), ("validation", "valid"), ("test", "test")):
        records = corpora_source.data_source(builder, split)
        for lang in ("en", "de"):
            lines = [records[i][lang].decode() for i in range(len(records))]
            if split == "train" and lang == "en":
                lines[5] = "   "  # a blank source: its pair is dropped, the rest stay aligned
            path = tmp_path / f"{name}.{lang}"
            path.write_text("".join(line + "\n" for line in lines))
            files[(split, lang)] = path
    data = {
        "dataset": "text",
        "source_file": files["train", "en"],
        "target_file": files["train", "de"],
        "validation_source_file": files["validation", "en"],
        "validation_target_file": files["validation", "de"],
        "test_source_file": files["test", "en"],
        "test_target_file": files["test", "de"],
        "tfds_data_dir": tmp_path / "tfds",
    }
    flags = [f"--config.{k}={v}" for k, v in TINY.items() if not k.startswith("data.num_")]
    flags += [f"--config.data.{k}={v}" for k, v in data.items()]
    workdir = tmp_path / "w"
    train_run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fxformer.train",
            "--config=configs/default.py",
            f"--workdir={workdir}",
            "--config.num_train_steps=2",
            *flags,
        ],
        env=env_with_devices(1),
        capture_output=True,
        text=True,
    )
    assert train_run.returncode == 0, train_run.stderr[-2000:]
    assert "1 of 3,000 pairs" in train_run.stdout and "have an empty side; dropped" in train_run.stdout
    assert "data: prepared in" in train_run.stdout and "Unknown size" not in train_run.stdout  # nothing downloaded
    evaluated = subprocess.run(
        [sys.executable, "-m", "fxformer.evaluate", f"--workdir={workdir}", "--split=test"],
        env=env_with_devices(1),
        capture_output=True,
        text=True,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert (workdir / "eval" / "test-2.ref.txt").read_bytes() == files["test", "de"].read_bytes()


@pytest.mark.slow
def test_metrics_record_tokens_seen_and_wall_time_across_a_resume(tmp_path, data_dir, corpus):
    from conftest import run_train

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=4, log_every_steps=2, checkpoint_every_steps=4)
    first = logged(workdir, "tokens_seen")
    resumed = run_train(workdir, data_dir, num_train_steps=8, log_every_steps=2, checkpoint_every_steps=4)
    seen, wall = logged(workdir, "tokens_seen"), logged(workdir, "wall_s")
    assert list(seen) == [2, 4, 6, 8] and {k: seen[k] for k in first} == first
    assert all(b > a for a, b in zip(list(seen.values()), list(seen.values())[1:]))  # counted on across the resume
    assert all(b >= a for a, b in zip(list(wall.values()), list(wall.values())[1:]))
    tokens_per_step = seen[2] / 2
    assert seen[8] == pytest.approx(4 * seen[4] / 2, rel=0.3) and tokens_per_step > 0
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


@pytest.mark.slow
def test_early_stopping_ends_the_run_as_done_when_dev_stops_improving(tmp_path, data_dir, corpus):
    import subprocess

    from conftest import env_with_devices

    workdir = tmp_path / "w"
    # a learning rate so small that dev perplexity barely moves: with a tiny patience it stops
    command = train_command(
        workdir,
        data_dir,
        num_train_steps=200,
        eval_every_steps=2,
        learning_rate_scale=1e-9,
        early_stopping_patience=1,
        best_metric="dev_accuracy",
    )
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == exitcodes.OK, result.stderr[-2000:]
    assert "early stopping" in result.stdout
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved < 200 and saved == max(logged(workdir, "dev_ppl"))


@pytest.mark.slow
def test_a_missing_data_position_and_a_corrupt_average_are_named_with_what_to_do(tmp_path, data_dir, corpus):
    import shutil
    import subprocess

    from conftest import env_with_devices, run_train

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=4, checkpoint_every_steps=2)
    (workdir / "checkpoints" / "4" / "data" / "process_0-of-1.json").unlink()
    with left_as_is(workdir):
        resumed = subprocess.run(
            train_command(workdir, data_dir, num_train_steps=6, checkpoint_every_steps=2),
            env=env_with_devices(1),
            capture_output=True,
            text=True,
        )
    assert resumed.returncode == exitcodes.USER_ERROR and "Traceback" not in resumed.stderr, resumed.stderr[-2000:]
    assert "different number of processes" not in resumed.stderr
    assert "checkpoints/4" in resumed.stderr and "data position" in resumed.stderr, resumed.stderr

    evaluate = [sys.executable, "-m", "fxformer.evaluate", f"--workdir={workdir}", "--average_last=2", "--limit=4"]
    assert subprocess.run(evaluate, env=env_with_devices(1), capture_output=True).returncode == 0
    averaged = workdir / "averaged" / "last2" / "4"
    for path in averaged.rglob("*"):
        if path.is_file() and path.name != "_CHECKPOINT_METADATA":
            path.write_bytes(b"garbage")
    with left_as_is(workdir):
        broken = subprocess.run(evaluate, env=env_with_devices(1), capture_output=True, text=True)
    assert broken.returncode == exitcodes.USER_ERROR and "Traceback" not in broken.stderr
    assert "it is only a cache" in broken.stderr and f"delete {averaged}" in broken.stderr
    shutil.rmtree(averaged)
    assert subprocess.run(evaluate, env=env_with_devices(1), capture_output=True).returncode == 0


def test_a_failed_preparation_names_the_readme_section_of_its_dataset():
    from fxformer.data import corpora as corpora_source

    text = with_overrides(configfile.load_config("configs/default.py"), {"data.dataset": "text"}).data
    wmt = with_overrides(configfile.load_config("configs/default.py"), {"data.dataset": "wmt14_translate/de-en"}).data
    assert "WMT" not in corpora_source.prepare_failure(ValueError("bad line"), text)
    assert "'Data' section" in corpora_source.prepare_failure(ValueError("bad line"), text)
    assert "'WMT 2014' section" in corpora_source.prepare_failure(ValueError("403"), wmt)


@pytest.mark.slow
def test_dev_bleu_during_training_selects_the_best_checkpoint_and_evaluate_agrees(tmp_path, data_dir, corpus):
    import json as _json
    import subprocess

    from conftest import env_with_devices, run_train

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
    command = [
        sys.executable,
        "-m",
        "fxformer.evaluate",
        f"--workdir={workdir}",
        "--step=best",
        "--split=validation",
        "--limit=24",
    ]
    evaluated = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
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
    writer = MetricWriter(tmp_path, resume_step=2)
    writer.close()
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == [lines[0], lines[2]]
    assert writer.last() == {"step": 2, "loss": 1.5}


@pytest.mark.slow
def test_refusals_write_nothing_and_the_corrected_command_trains(tmp_path, data_dir, corpus):
    """A fresh workdir refused before training is left absent (then another d_model trains there);
    refused resumes leave config.json and every file byte for byte; a resume's changes are recorded
    in config-history.jsonl once it has saved a step, never by a refusal."""
    import json
    import subprocess

    from conftest import env_with_devices, run_train

    def train(workdir, **overrides):
        return subprocess.run(
            train_command(workdir, data_dir, **overrides), env=env_with_devices(1), capture_output=True, text=True
        )

    fresh = tmp_path / "fresh"
    with left_as_is(fresh):
        refused = train(fresh, **{"data.max_length": 3})
    assert refused.returncode == exitcodes.USER_ERROR and "keeps none of" in refused.stderr
    assert train(fresh, **{"model.d_model": 64, "num_train_steps": 2}).returncode == 0

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=4, checkpoint_every_steps=2)
    before = snapshot(workdir)
    arrays = cut_short(workdir / "checkpoints" / "4" / "state")  # the array data truncated
    with left_as_is(workdir):  # config.json keeps the schedule the run trained with
        result = train(workdir, num_train_steps=8, learning_rate_scale=3.0)
    assert result.returncode == exitcodes.USER_ERROR and "is unreadable" in result.stderr, result.stderr[-2000:]
    assert "resume from the one before it" in result.stderr and "--step" not in result.stderr  # train has no --step
    for path in arrays:
        path.write_bytes(before[str(path.relative_to(workdir))])

    config = (workdir / "config.json").read_bytes()
    (workdir / "config.json").unlink()  # then a resume with another model is refused by the checkpoint
    with left_as_is(workdir):
        result = train(workdir, **{"model.d_model": 64})
    assert result.returncode == exitcodes.USER_ERROR and "holds a different model" in result.stderr
    (workdir / "config.json").write_bytes(config)

    exploded = train(workdir, num_train_steps=8, learning_rate_scale=1e6)  # diverges before its first save
    assert exploded.returncode == exitcodes.USER_ERROR, exploded.stderr[-2000:]
    assert (workdir / "config.json").read_bytes() == config and not (workdir / "config-history.jsonl").exists()

    assert train(workdir, num_train_steps=6, checkpoint_every_steps=2).returncode == 0  # a resume that trains
    assert json.loads((workdir / "config.json").read_text())["num_train_steps"] == 6
    history = [json.loads(line) for line in (workdir / "config-history.jsonl").read_text().splitlines()]
    assert history == [{"step": 4, "time": history[0]["time"], "changed": {"num_train_steps": [4, 6]}}]


@pytest.mark.slow
def test_sigterm_during_data_preparation_stops_at_once_and_keeps_nothing(tmp_path, data_dir, corpus):
    """Before training begins a signal stops the command as soon as Python runs again (here within
    seconds, during data preparation): 2 for a new run, whose workdir is removed; 75 for a resume,
    whose workdir is left byte for byte."""
    import subprocess
    import time

    from conftest import env_with_devices, run_train

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

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=2)
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
    import subprocess
    import time

    from conftest import env_with_devices

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
def test_a_damaged_checkpoint_is_one_line_every_time(tmp_path, data_dir, corpus):
    """orbax's reads of a damaged checkpoint's other arrays used to be collected with their errors
    unretrieved, printing hundreds of lines of TensorStore specs after the one-sentence error in
    about a third of the runs; 10 runs each of evaluate and of a resume must all be one line."""
    import subprocess

    from conftest import env_with_devices, run_train

    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=4, checkpoint_every_steps=2)
    # Every data file cut short: which file holds the parameters varies from save to save, and
    # evaluate reads the parameters alone (damage to Adam's moments alone is rightly no error there).
    cut_short(workdir / "checkpoints" / "4" / "state", "d/*", keep=1000)
    evaluate = [sys.executable, "-m", "fxformer.evaluate", f"--workdir={workdir}", "--step=4"]
    resume = train_command(workdir, data_dir, num_train_steps=8)
    for argv in [evaluate] * 10 + [resume] * 10:
        with left_as_is(workdir):
            result = subprocess.run(argv, env=env_with_devices(1), capture_output=True, text=True)
        assert result.returncode == exitcodes.USER_ERROR
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr[:3000]
        assert f"Checkpoint {workdir}/checkpoints/4 is unreadable" in result.stderr


@pytest.mark.slow
def test_a_workdir_removed_while_training_is_one_sentence(tmp_path, data_dir, corpus):
    import shutil
    import subprocess
    import time

    from conftest import env_with_devices

    workdir = tmp_path / "w"
    command = train_command(workdir, data_dir, num_train_steps=5000, checkpoint_every_steps=5, log_every_steps=1)
    process = subprocess.Popen(
        command, env=env_with_devices(1), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while not (workdir / "checkpoints" / "10").exists():
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.1)
    shutil.rmtree(workdir, ignore_errors=True)  # the run goes on writing: some files may stay
    status, _, err = ended(process)
    assert status == exitcodes.USER_ERROR and len(err.strip().splitlines()) == 1, err[:3000]
    assert f"The workdir {workdir} was removed while training" in err


@pytest.fixture(scope="module")
def two_step_workdir(tmp_path_factory, data_dir, corpus):
    """The smallest run (conftest's TINY, 2 steps), trained once for this module's cases: each copies it."""
    workdir = tmp_path_factory.mktemp("two-steps") / "w"
    run_train(workdir, data_dir, num_train_steps=2)
    return workdir


CONFIG_EDITS = {  # an edit of W/config.json by hand: (section or "", key, value), the words its refusal names
    "num_heads=0": (("model", "num_heads", 0), "model.num_heads must be positive, not 0"),
    "d_model=sixty-four": (("model", "d_model", "sixty-four"), "config key 'model.d_model' takes an integer"),
    "unknown key": (("", "dropout_rat", 0.3), "unknown config key 'dropout_rat' (did you mean 'model.dropout_rate'?)"),
}
COMMANDS = {  # what reads a workdir's config.json: (module and flags besides --workdir, stdin)
    "evaluate": (["fxformer.evaluate", "--limit=4"], None),
    "translate": (["fxformer.translate"], "The dog sees the man.\n"),
    "attention": (["fxformer.attention_maps", "--source=The dog sees the man."], None),
    "train-resume": (["fxformer.train"], None),  # no --config: the workdir's own
}


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("edit", CONFIG_EDITS)
def test_a_hand_edited_config_json_is_one_sentence_from_every_command_and_changes_nothing(
    edit, command, two_step_workdir, tmp_path
):
    workdir = tmp_path / "w"
    shutil.copytree(two_step_workdir, workdir)
    path = workdir / "config.json"
    written = json.loads(path.read_text())
    (section, key, value), words = CONFIG_EDITS[edit]
    (written[section] if section else written)[key] = value
    path.write_text(json.dumps(written, indent=2))
    argv, stdin = COMMANDS[command]
    with left_as_is(workdir):
        result = subprocess.run(
            [sys.executable, "-m", argv[0], f"--workdir={workdir}", *argv[1:]],
            input=stdin,
            env=env_with_devices(1),
            capture_output=True,
            text=True,
        )
    err = result.stderr.strip()
    assert result.returncode == exitcodes.USER_ERROR and len(err.splitlines()) == 1, err[-3000:]
    assert err.startswith(f"error: In {path}, {words}") and "Traceback" not in err, err


@pytest.mark.slow
def test_a_workdir_removed_before_sigterm_is_not_recreated(tmp_path, data_dir, corpus):
    """The workdir is removed while a save is in flight, then the run gets SIGTERM: what it wrote
    after the removal (orbax recreates the directories it writes into: without the clean-up, the
    finished save of that step was left at the deleted path) is removed again, one sentence says
    why nothing was saved, and the exit status is the interruption's (75). The run is paused
    (SIGSTOP) for the removal and the signal, so that it cannot find the workdir gone before the
    signal comes (it then ends with 2, as without one)."""
    import time

    workdir = tmp_path / "w"
    command = train_command(workdir, data_dir, num_train_steps=5000, checkpoint_every_steps=1, keep_checkpoints=2)
    process = subprocess.Popen(
        command, env=env_with_devices(1), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while not (workdir / "checkpoints" / "3").exists():
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.05)
    while not list((workdir / "checkpoints").glob("*.orbax-checkpoint-tmp*")):  # the next save has begun
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.005)
    process.send_signal(signal.SIGSTOP)
    shutil.rmtree(workdir)
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGCONT)
    status, _, err = ended(process)
    assert status == exitcodes.STOPPED and len(err.strip().splitlines()) == 1, err[:3000]
    assert f"The workdir {workdir} was removed while training" in err
    assert not workdir.exists(), sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))[:20]
