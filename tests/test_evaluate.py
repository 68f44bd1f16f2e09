"""Checkpoint averaging, evaluate and translate on a run trained with 8 fake devices."""

import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import cluster_flags, cut_short, is_gloo, left_as_is, on_two_processes, own_lines, refused_in_process
from conftest import run_module as run

import fxformer
from fxformer import checkpoint, exitcodes, parallel, paths, trainstate
from fxformer.config import load_workdir_config
from fxformer.data import corpora
from fxformer.data.tokenizer import Tokenizer


@pytest.mark.slow
def test_averaging_two_checkpoints_is_the_numpy_mean(eight_device_workdir):
    workdir = eight_device_workdir
    config = load_workdir_config(paths.Workdir(workdir))
    vocab = Tokenizer(workdir / "tokenizer.model").vocab_size
    mesh = parallel.data_mesh()
    _, _, abstract_state = trainstate.build(config, vocab, mesh)
    with checkpoint.open_manager(workdir / "checkpoints", asynchronous=False) as manager:
        assert list(manager.all_steps()) == [10, 20]
        restored = (checkpoint.restore_training_state(manager, s, abstract_state) for s in (10, 20))
        ten, twenty = (jax.device_get(state.params) for state in restored)
    with checkpoint.open_manager(
        workdir / "checkpoints", asynchronous=False
    ) as manager:  # parameters alone: another manager
        mean = jax.device_get(checkpoint.average_params(manager, [10, 20], abstract_state.params))
    assert jax.tree.structure(mean) == jax.tree.structure(ten)
    for a, b, m in zip(jax.tree.leaves(ten), jax.tree.leaves(twenty), jax.tree.leaves(mean)):
        assert not np.array_equal(a, b)
        np.testing.assert_allclose(m, np.mean(np.stack([np.asarray(a), np.asarray(b)]), axis=0), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_a_saved_average_is_not_reused_once_one_of_its_checkpoints_is_written_again(eight_device_workdir, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(eight_device_workdir, workdir)
    config = load_workdir_config(paths.Workdir(workdir))
    _, _, abstract_state = trainstate.build(
        config, Tokenizer(workdir / "tokenizer.model").vocab_size, parallel.data_mesh()
    )
    said = []

    def average():
        params, _ = checkpoint.checkpoint_params(paths.Workdir(workdir), 20, 2, abstract_state.params, said.append)
        return jax.device_get(params)

    first = average()
    assert said == ["averaging the parameters of steps [10, 20]"] and (workdir / "averaged" / "last2" / "20").exists()
    np.testing.assert_array_equal(jax.tree.leaves(average())[0], jax.tree.leaves(first)[0])
    assert len(said) == 1  # the saved average, reused
    shutil.rmtree(workdir / "checkpoints" / "20")  # step 20 written again (a retrained run): here, step 10's state
    shutil.copytree(workdir / "checkpoints" / "10", workdir / "checkpoints" / "20")
    meta = workdir / "checkpoints" / "20" / "_CHECKPOINT_METADATA"
    written = json.loads(meta.read_text())
    meta.write_text(json.dumps({**written, "commit_timestamp_nsecs": written["commit_timestamp_nsecs"] + 1}))
    again = average()
    assert said[1:] == ["averaging the parameters of steps [10, 20]"]  # computed anew, not the stale one
    with checkpoint.open_manager(workdir / "checkpoints", asynchronous=False) as manager:
        ten = jax.device_get(checkpoint.restore_training_state(manager, 10, abstract_state).params)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(ten)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # the mean of two copies of step 10


@pytest.mark.slow
def test_evaluate_on_one_device_writes_what_sacrebleu_computes(eight_device_workdir, corpus, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(eight_device_workdir, workdir)
    beam_2 = "--config.decode.beam_size=2"
    result = run("fxformer.evaluate", f"--workdir={workdir}", "--average_last=2", beam_2, devices=1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in result.stdout
    assert (workdir / "averaged" / "last2" / "20").exists()  # the averaged checkpoint, saved for later use
    # the trained run decodes with beam 4: the file names the search that differs, no default result is overwritten
    written = json.loads((workdir / "eval" / "test-20-avg2-beam_size=2.json").read_text())
    assert not (workdir / "eval" / "test-20-avg2.json").exists()
    assert written["num_sentences"] == 52 and written["checkpoint_steps"] == [10, 20]
    assert written["ppl"] > 1 and 0 <= written["bleu"] <= 100
    hyps = (workdir / "eval" / "test-20-avg2-beam_size=2.hyp.txt").read_text().splitlines()
    assert len(hyps) == 52
    _, builder, _ = corpus
    test = corpora.data_source(builder, "test")  # the references are the raw German sentences, in order
    raw = [test[i]["de"].decode("utf-8") for i in range(len(test))]
    assert (workdir / "eval" / "test-20-avg2-beam_size=2.ref.txt").read_text().splitlines() == raw
    # sacreBLEU's own command on the files evaluate wrote
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "sacrebleu",
            str(workdir / "eval" / "test-20-avg2-beam_size=2.ref.txt"),
            "-i",
            str(workdir / "eval" / "test-20-avg2-beam_size=2.hyp.txt"),
            "-b",
            "-w",
            "6",
        ],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    assert float(cli.stdout.strip()) == pytest.approx(written["bleu"], abs=1e-6)
    assert f"BLEU {written['bleu']:.2f}" in result.stdout
    both = ["--average_last=1", "--limit=3", "--split=validation,test"]  # two splits from one restore
    again = run("fxformer.evaluate", f"--workdir={workdir}", *both, devices=1)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((workdir / "eval" / "test-20-avg2-beam_size=2.json").read_text()) == written
    for split in ("validation", "test"):  # a partial run keeps its own file
        partial = json.loads((workdir / "eval" / f"{split}-20-first3.json").read_text())
        assert partial["split"] == split and partial["num_sentences"] == 3
        assert f"results in {workdir}/eval/{split}-20-first3.json" in again.stdout
        source = corpora.data_source(builder, split)
        assert (workdir / "eval" / f"{split}-20-first3.ref.txt").read_text().splitlines() == [
            source[i]["de"].decode("utf-8") for i in range(3)
        ]


def test_several_splits_are_checked_before_the_first_is_evaluated(eight_device_workdir, monkeypatch):
    from fxformer import evaluate

    for flag, refusal in [
        ("--split=validation,tset", "has no split 'tset'; it has "),
        ("--split=test,,validation", "give split names separated by commas, each once"),
        ("--split=test,test", "give split names separated by commas, each once"),
    ]:
        argv = [f"--workdir={eight_device_workdir}", flag, "--limit=2"]
        assert refusal in refused_in_process(monkeypatch, evaluate.main, argv, eight_device_workdir / "eval")
    argv = [f"--workdir={eight_device_workdir}", "--split=validation,test", "--hypotheses=h.txt"]
    assert "--hypotheses scores one split's translations, not 2" in refused_in_process(monkeypatch, evaluate.main, argv)


@pytest.mark.slow
def test_evaluate_reads_the_runs_config_once_and_keeps_the_decode_options_once(
    eight_device_workdir, tmp_path, monkeypatch
):
    from fxformer import evaluate

    workdir = paths.Workdir(tmp_path / "w")
    shutil.copytree(eight_device_workdir, workdir.root)
    reads = []
    read_text = type(workdir.config).read_text

    def counted(path, *args, **kwargs):
        if path.name == "config.json":
            reads.append(str(path))
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(type(workdir.config), "read_text", counted)
    alpha = [("decode.alpha", "1.5")]
    results = fxformer.load(workdir, 20, 1, alpha).evaluate("test", limit=4)
    assert reads == [str(workdir.config)]  # once, for the restore and the result's name alike
    assert results["path"] == str(workdir.eval / "test-20-alpha=1.5-first4.json")
    written = json.loads((workdir.eval / "test-20-alpha=1.5-first4.json").read_text())
    assert written["decode"]["alpha"] == 1.5 and written["decode"]["beam_size"] == 4
    assert "alpha" not in written and "beam_size" not in written  # the decode options, held once
    reads.clear()  # the command, on two splits: still one read
    argv = [f"--workdir={workdir}", "--split=validation,test", "--step=20", "--limit=4", "--config.decode.alpha=1.5"]
    monkeypatch.setattr(sys, "argv", ["fxformer.evaluate", *argv])
    evaluate.main()
    assert reads == [str(workdir.config)]
    assert (workdir.eval / "validation-20-alpha=1.5-first4.json").exists()


@pytest.mark.slow
def test_translate_writes_one_line_each_alike_on_any_devices_or_processes_and_refuses_stdin_on_two(
    eight_device_workdir, tmp_path
):
    lines = "The dog sees the man.\nToday the woman buys a book.\nThe man sleeps.\n"
    (tmp_path / "in.txt").write_text(lines)
    alone = run("fxformer.translate", f"--workdir={eight_device_workdir}", "--step=20", stdin=lines)
    assert alone.returncode == 0, alone.stderr[-3000:]
    two = run("fxformer.translate", f"--workdir={eight_device_workdir}", "--step=20", devices=2, stdin=lines)
    assert two.returncode == 0, two.stderr[-3000:]
    assert len(alone.stdout.splitlines()) == 3 and two.stdout == alone.stdout  # however many devices share them
    command = [sys.executable, "-m", "fxformer.translate", f"--workdir={eight_device_workdir}", "--step=20"]
    for flags in ([f"--input={tmp_path / 'in.txt'}"], []):
        ended = on_two_processes(lambda port, i: [*command, *cluster_flags(port, i), *flags], stdin=lines)  # noqa: B023
        if flags:  # process 0 writes the translations of the lone process; process 1 writes nothing
            assert [status for status, _, _ in ended] == [0, 0], ended[0][2][-3000:] + ended[1][2][-3000:]
            assert ended[0][1] == alone.stdout and ended[1][1] == ""
        else:
            for status, out, err in ended:
                assert status == exitcodes.USER_ERROR and out == "", err[-3000:]
                assert (
                    err.strip().splitlines()[-1]
                    == "error: With 2 processes give --input=FILE, which every process reads."
                )


@pytest.mark.slow
def test_evaluate_and_attention_maps_on_two_processes_print_their_results_once(eight_device_workdir, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(eight_device_workdir, workdir)
    source = "Today the woman buys a book."
    commands = {
        "fxformer.evaluate": ["--average_last=2", "--limit=5"],  # it says what it averages, too
        "fxformer.attention_maps": ["--step=20", f"--source={source}", "--view=grid", "--name=n"],
    }
    for module, flags in commands.items():
        alone = run(module, f"--workdir={workdir}", *flags)
        assert alone.returncode == 0, alone.stderr[-3000:]
        command = [sys.executable, "-m", module, f"--workdir={workdir}", *flags]
        shutil.rmtree(workdir / "averaged", ignore_errors=True)  # averaged again, and said so again
        ended = on_two_processes(lambda port, i: [*command, *cluster_flags(port, i)])  # noqa: B023
        assert [status for status, _, _ in ended] == [0, 0], ended[0][2][-3000:] + ended[1][2][-3000:]
        assert not [line for _, out, _ in ended for line in out.splitlines() if is_gloo(line)]  # kept off stdout
        said = [own_lines(out) for _, out, _ in ended]
        assert said == [own_lines(alone.stdout), []], module  # the lone process's report, once
        assert alone.stdout.count("perplexity" if module == "fxformer.evaluate" else "translation: ") == 1


@pytest.mark.slow
def test_missing_and_corrupt_checkpoints_are_one_sentence(eight_device_workdir, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(eight_device_workdir, workdir)
    cut_short(workdir / "checkpoints" / "20" / "state")  # the array data truncated
    with left_as_is(workdir):
        result = run("fxformer.evaluate", f"--workdir={workdir}", "--step=20")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1].startswith(f"error: Checkpoint {workdir}/checkpoints/20 is unreadable")
    )
    result = run("fxformer.evaluate", f"--workdir={workdir}", "--step=10", "--limit=5")
    assert result.returncode == 0, result.stderr[-3000:]

    shutil.rmtree(workdir / "checkpoints")
    with left_as_is(workdir):
        result = run("fxformer.evaluate", f"--workdir={workdir}")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {workdir}/checkpoints holds no checkpoint; train first."
    with left_as_is(tmp_path / "nowhere"):
        result = run("fxformer.evaluate", f"--workdir={tmp_path}/nowhere")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path}/nowhere has no config.json; is it a training workdir?"
