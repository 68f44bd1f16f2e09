"""Bad input is refused in one sentence before anything is written, and the commands' small promises
(translate keeps blank lines, plot, chrF in evaluate logs, params, text files as datasets)."""

import json
import math
import subprocess
import sys

import pytest
from conftest import cut_short, env_with_devices, is_gloo, left_as_is, own_lines, snapshot, train_command

from fxformer import cli, configfile, exitcodes, lifecycle, plot
from fxformer.config import with_overrides
from fxformer.errors import UserError


@pytest.mark.slow
def test_a_refused_model_writes_nothing(tmp_path, data_dir, corpus):
    """A model the config refuses: one sentence, nothing written (a corrected command training in a
    workdir a refusal left absent: `test_refusals_write_nothing_and_the_corrected_command_trains`)."""
    workdir = tmp_path / "w"
    with left_as_is(workdir):
        bad = subprocess.run(
            train_command(workdir, data_dir, **{"model.d_model": 33, "num_train_steps": 2}),
            env=env_with_devices(1),
            capture_output=True,
            text=True,
        )
    assert bad.returncode == exitcodes.USER_ERROR and "error: model.d_model" in bad.stderr and "33" in bad.stderr
    assert not (workdir / "config.json").exists()


@pytest.mark.slow
def test_params_counts_with_the_configs_vocabulary():
    import sys

    from fxformer.params import count_parameters

    config = configfile.load_config("configs/default.py")
    out = subprocess.run(
        [sys.executable, "-m", "fxformer.params", "--config=configs/default.py", "--config.data.vocab_size=8000"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    m = (
        config.model
    )  # counted by hand: a shared embedding, N encoder and N decoder layers (post-norm, no biases in attention)
    assert m.norm == "post" and m.positional == "sinusoidal" and m.d_k == m.d_v == 0  # d_k = d_v = d_model / h
    V, N, d, f = 8000, m.num_layers, m.d_model, m.d_ff
    attention, ffn, norm = 4 * d * d, d * f + f + f * d + d, 2 * d  # W^Q, W^K, W^V, W^O; two layers; scale, bias
    expected = V * d + N * (attention + ffn + 2 * norm) + N * (2 * attention + ffn + 3 * norm)
    assert f"{expected:,} parameters" in out.stdout and "8,000-token" in out.stdout
    assert expected == count_parameters(m, 8000) != count_parameters(m, 37000)


@pytest.mark.slow
def test_translate_splits_on_newlines_only_and_keeps_blank_lines(eight_device_workdir, tmp_path):
    import sys

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
    watch = lifecycle.DivergenceWatch(4.0, vocab_size=1000)  # ceiling 3 ln 1000 = 20.7
    assert watch.first_bad([7.0, 5.0, 3.0, 2.5, 4.0]) is None  # healthy, noisy
    assert watch.first_bad([2.6, 11.0])[0] == 1  # 4.4 x the best 2.5
    assert lifecycle.DivergenceWatch(4.0, 1000).first_bad([6.9, 6e10])[0] == 1  # from the first steps
    assert lifecycle.DivergenceWatch(4.0, 1000).first_bad([0.2, 0.9]) is None  # 4.5x, but within 2 nats
    assert lifecycle.DivergenceWatch(0.0, 1000).first_bad([1.0, 1e9, math.nan]) == (2, "became non-finite")
    # a resumed run compares with the best loss logged up to its resume step, not with its own first steps
    logged = [{"step": 50, "loss": 6.0}, {"step": 100, "loss": 2.4, "dev_loss": 9.0}, {"step": 150, "loss": 1.0}]
    resumed = lifecycle.DivergenceWatch(4.0, 1000, logged, resume_step=100)
    assert resumed.best == 2.4  # step 150 lies past the resume: it is retrained
    assert resumed.first_bad([11.0]) == (0, "exploded to 11 per token (best so far 2.4)")
    assert lifecycle.DivergenceWatch(4.0, 1000).first_bad([11.0]) is None  # what a resume saw before


def test_runs_overlaid_by_plot_are_labelled_by_as_much_of_their_paths_as_tells_them_apart():
    from fxformer.plot import labels

    assert labels(["runs/x/default", "runs/y/default"]) == ["x/default", "y/default"]  # once both were "default"
    assert labels(["runs/a", "runs/b/"]) == ["a", "b"] and labels(["/w"]) == ["w"]
    assert labels(["gs://bucket/x/r", "/local/x/r"]) == ["bucket/x/r", "local/x/r"]
    assert labels(["w", "w"]) == ["w (1)", "w (2)"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["fxformer.data", "--config=configs/default.py", "--packing_batches=0"],
            "--packing_batches must be at least 1",
        ),
        (
            ["fxformer.data", "--config=configs/default.py", "--baseline_pairs=-1"],
            "--baseline_pairs must be at least 1",
        ),
        (["fxformer.plot", "--workdir=W", "--out=/nonexistent-folder/x.png"], "is in a folder that does not exist"),
        (["fxformer.plot", "--workdir=W", "--out=W"], "is a directory; give a PNG file"),
    ],
)
def test_bad_flags_of_data_and_plot_are_one_sentence(argv, words, tmp_path):
    argv = [a.replace("W", str(tmp_path)) for a in argv]
    result = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert words in result.stderr


@pytest.mark.slow
def test_plot_writes_learning_curves(tmp_path):
    import json as _json

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
    timed = [{"step": s, "loss": 1.0 / s, "dev_bleu": float(s), "wall_s": 90.0 * s} for s in (1, 2, 3)]
    (tmp_path / "c" / "metrics.jsonl").write_text("".join(_json.dumps(m) + "\n" for m in timed))
    command = [sys.executable, "-m", "fxformer.plot", f"--workdir={tmp_path / 'c'}", "--x=minutes"]
    subprocess.run([*command, "--panels=dev_bleu", f"--out={tmp_path / 'bleu.png'}"], check=True)
    assert width((tmp_path / "bleu.png").read_bytes()) == width(png) // 3  # the one panel asked for
    assert [plot.x_value(m, "minutes") for m in timed] == [1.5, 3.0, 4.5]
    bad = subprocess.run([*command, "--panels=dev_bleu,bleu"], capture_output=True, text=True)
    assert bad.returncode == exitcodes.USER_ERROR and "--panels: bleu is not a panel" in bad.stderr
    no_axis = subprocess.run([*command[:-1], "--x=epochs"], capture_output=True, text=True)  # no line has epochs
    assert no_axis.returncode == exitcodes.USER_ERROR and "c logged no epochs in metrics.jsonl" in no_axis.stderr


@pytest.mark.slow
def test_evaluate_reports_chrf_and_writes_no_carriage_returns_to_a_log(eight_device_workdir):
    import json as _json

    import sacrebleu

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
def test_text_dataset_with_separate_validation_and_test_files(tmp_path, data_dir, corpus):
    from conftest import TINY

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


def test_a_failed_preparation_names_the_docs_section_of_its_dataset():
    from fxformer.data import corpora as corpora_source

    text = with_overrides(configfile.load_config("configs/default.py"), {"data.dataset": "text"}).data
    wmt = with_overrides(configfile.load_config("configs/default.py"), {"data.dataset": "wmt14_translate/de-en"}).data
    assert "WMT" not in corpora_source.prepare_failure(ValueError("bad line"), text)
    assert corpora_source.prepare_failure(ValueError("bad line"), text).endswith("; see docs/data.md.")
    assert corpora_source.prepare_failure(ValueError("403"), wmt).endswith("; see docs/data.md, 'WMT 2014'.")


@pytest.mark.slow
def test_refusals_write_nothing_and_the_corrected_command_trains(tmp_path, data_dir, tiny_run):
    """A fresh workdir refused before training is left absent (then another d_model trains there);
    refused resumes leave config.json and every file byte for byte; a resume's changes are recorded
    in config-history.jsonl once it has saved a step, never by a refusal."""
    import subprocess

    def train(workdir, **overrides):
        return subprocess.run(
            train_command(workdir, data_dir, **overrides), env=env_with_devices(1), capture_output=True, text=True
        )

    fresh = tmp_path / "fresh"
    with left_as_is(fresh):
        refused = train(fresh, **{"data.max_length": 3})
    assert refused.returncode == exitcodes.USER_ERROR and "keeps none of" in refused.stderr
    assert train(fresh, **{"model.d_model": 64, "num_train_steps": 2}).returncode == 0

    workdir = tiny_run(tmp_path / "w", steps=4)
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


@pytest.mark.parametrize("closed, words", [(0, "Standard input is closed"), (1, "Standard output is closed")])
def test_translate_with_a_closed_stdin_or_stdout_says_so_before_any_work(closed, words, tmp_path):
    import os

    argv = [sys.executable, "-m", "fxformer.translate", f"--workdir={tmp_path}"]  # no run there: refused later
    result = subprocess.run(
        argv,
        capture_output=closed == 0,
        stderr=subprocess.PIPE if closed else None,
        preexec_fn=lambda: os.close(closed),
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and words in result.stderr, result.stderr


def test_the_output_check_passes_over_gloo_lines_whole_and_in_fragments():
    out = "\n".join(
        [
            "test: 5 sentences, checkpoint step(s) [10, 20]",
            "[Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3",
            "3 peer ranks. Expected number of connected peer ranks is : 3",  # what another write left of one
            "[Gloo] Rank 0 is connected to ",
            "",
            "perplexity (per wordpiece): 3.214",
            "7",  # a line of the command's own, however short
        ]
    )
    assert own_lines(out) == [
        "test: 5 sentences, checkpoint step(s) [10, 20]",
        "perplexity (per wordpiece): 3.214",
        "7",
    ]
    assert is_gloo("is : 12") and not is_gloo("perplexity (per wordpiece): 3.214")


NATIVE_WRITES = """
import os
from fxformer import cli

def main():
    print("result 1", flush=True)
    os.write(1, b"[Gloo] Rank 1 is connected to 1 peer ranks. ")  # a native library's write, cut short
    print("result 2")
    os.write(1, b"Expected number of connected peer ranks is : 1\\n")

cli.run(main)
"""


def test_a_command_keeps_what_native_libraries_write_off_its_standard_output():
    result = subprocess.run([sys.executable, "-c", NATIVE_WRITES], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "result 1\nresult 2\n"  # fxformer's own lines alone
    assert "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number" in result.stderr  # beside the others
