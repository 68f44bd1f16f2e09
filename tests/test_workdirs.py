"""Damaged, edited, half-written or removed workdirs and checkpoints: each is one sentence that
says what to do, and nothing more is lost."""

import json
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import (
    cut_short,
    ended,
    env_with_devices,
    left_as_is,
    refused_in_process,
    run_train,
    train_command,
    wait_while_running,
)

from fxformer import exitcodes


@pytest.mark.slow
def test_a_different_tokenizer_is_named_as_a_mismatch_not_a_corrupt_checkpoint(tmp_path, data_dir, tiny_run):
    import shutil
    import subprocess

    from conftest import env_with_devices, small_config

    from fxformer.data import corpora
    from fxformer.data.tokenizer import tokenizer_for

    workdir = tiny_run(tmp_path / "w", steps=2)
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
def test_a_used_workdir_without_checkpoints_says_it_starts_from_step_0(tmp_path, data_dir, tiny_run):
    import shutil

    workdir = tiny_run(tmp_path / "w", steps=2)
    shutil.rmtree(workdir / "checkpoints")
    again = run_train(workdir, data_dir, num_train_steps=2)
    assert "has metrics from an earlier run but no checkpoint: training starts from step 0" in again.stdout


@pytest.mark.slow
def test_unfinished_saves_are_removed_on_start(tmp_path, data_dir, tiny_run):
    workdir = tiny_run(tmp_path / "w", steps=2)
    leftover = workdir / "checkpoints" / "4.orbax-checkpoint-tmp-1234567"
    (leftover / "state").mkdir(parents=True)
    (leftover / "state" / "big.bin").write_bytes(b"0" * 1000)
    again = run_train(workdir, data_dir, num_train_steps=4)
    assert not leftover.exists() and "a save that never finished" in again.stdout
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]


@pytest.mark.slow
def test_damaged_workdirs_and_config_files_are_one_sentence(tmp_path, data_dir, monkeypatch):
    """Through the commands (one line, status 2, no traceback: `cli.run`) where the workdir is
    damaged; the other refusals in-process, as the UserError the command prints."""
    from fxformer import config, evaluate, params, paths
    from fxformer.errors import UserError

    def run(*argv):
        with left_as_is(tmp_path):
            result = subprocess.run(
                [sys.executable, "-m", *argv], env=env_with_devices(1), capture_output=True, text=True
            )
        assert result.returncode == exitcodes.USER_ERROR and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
        return result.stderr.strip()

    def refusal(main, *argv):
        return refused_in_process(monkeypatch, main, argv, tmp_path)

    for i, content in enumerate(("", "[1, 2]", "{not json")):
        workdir = tmp_path / f"w{i}"
        workdir.mkdir()
        (workdir / "config.json").write_text(content)
        with pytest.raises(UserError, match="config.json is damaged"):
            config.load_workdir_config(paths.Workdir(workdir))
    assert "config.json is damaged" in run("fxformer.evaluate", f"--workdir={workdir}")  # "{not json"
    assert "config.json is damaged" in run("fxformer.train", f"--workdir={workdir}")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "is a file" in run("fxformer.train", "--config=configs/default.py", f"--workdir={a_file}")
    assert "lies under the file" in run("fxformer.evaluate", f"--workdir={a_file}/w")
    assert "must be positive" in refusal(evaluate.main, f"--workdir={tmp_path}", "--average_last=-3")

    raising = tmp_path / "raising.py"
    raising.write_text("def get_config():\n    return {}['missing']\n")
    assert "failed in get_config(): KeyError" in refusal(params.main, f"--config={raising}")
    a_dict = tmp_path / "a_dict.py"
    a_dict.write_text("def get_config():\n    return {'model': {}}\n")
    assert "not a dict" in refusal(params.main, f"--config={a_dict}")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module\n")
    assert "failed to load: ModuleNotFoundError" in refusal(params.main, f"--config={broken}")


@pytest.mark.slow
def test_a_missing_data_position_and_a_corrupt_average_are_named_with_what_to_do(tmp_path, data_dir, tiny_run):
    import shutil
    import subprocess

    from conftest import env_with_devices

    workdir = tiny_run(tmp_path / "w", steps=4)
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


@pytest.mark.slow
def test_a_damaged_checkpoint_is_one_line_every_time(tmp_path, data_dir, tiny_run):
    """orbax's reads of a damaged checkpoint's other arrays used to be collected with their errors
    unretrieved, printing hundreds of lines of TensorStore specs after the one-sentence error in
    about a third of the runs; 4 runs each of evaluate and of a resume must all be one line (the
    leftovers' filters alone: test_disks.py, deterministic)."""
    import subprocess

    from conftest import env_with_devices

    workdir = tiny_run(tmp_path / "w", steps=4)
    # Every data file cut short: which file holds the parameters varies from save to save, and
    # evaluate reads the parameters alone (damage to Adam's moments alone is rightly no error there).
    cut_short(workdir / "checkpoints" / "4" / "state", "d/*", keep=1000)
    evaluate = [sys.executable, "-m", "fxformer.evaluate", f"--workdir={workdir}", "--step=4"]
    resume = train_command(workdir, data_dir, num_train_steps=8)
    for argv in [evaluate] * 4 + [resume] * 4:
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
    wait_while_running(process, (workdir / "checkpoints" / "10").exists, deadline, every_s=0.1)
    shutil.rmtree(workdir, ignore_errors=True)  # the run goes on writing: some files may stay
    status, _, err = ended(process)
    assert status == exitcodes.USER_ERROR and len(err.strip().splitlines()) == 1, err[:3000]
    assert f"The workdir {workdir} was removed while training" in err


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


# Every command with one edit (each reads config.json through `load_workdir_config`), and every
# edit with one command (the sentence each edit gets there).
EDITED_BY = [(edit, "evaluate") for edit in CONFIG_EDITS] + [("num_heads=0", c) for c in COMMANDS if c != "evaluate"]


@pytest.mark.slow
@pytest.mark.parametrize("edit, command", EDITED_BY)
def test_a_hand_edited_config_json_is_one_sentence_from_every_command_and_changes_nothing(
    edit, command, tiny_run, tmp_path
):
    workdir = tiny_run(tmp_path / "w", steps=2)
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
    process = subprocess.Popen(  # `executable`: a fresh process (not forked), which SIGSTOP itself pauses
        command,
        executable=command[0],
        env=env_with_devices(1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    wait_while_running(process, (workdir / "checkpoints" / "3").exists, deadline)
    saving = lambda: any((workdir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))  # noqa: E731 - the next save
    wait_while_running(process, saving, deadline, every_s=0.005)
    process.send_signal(signal.SIGSTOP)
    shutil.rmtree(workdir)
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGCONT)
    status, _, err = ended(process)
    assert status == exitcodes.STOPPED and len(err.strip().splitlines()) == 1, err[:3000]
    assert f"The workdir {workdir} was removed while training" in err
    assert not workdir.exists(), sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))[:20]
