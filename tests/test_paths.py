"""A gs:// workdir stays a URL all the way to every reader and writer, offline.

An in-memory filesystem is registered with fsspec for `gs://` (etils.epath's backend for it), so
config.json, the tokenizer copy, metrics.jsonl, TensorBoard events and evaluation outputs really
go through epath into the fake bucket. orbax writes arrays with TensorStore's own GCS driver,
which needs a real bucket: there the directories handed to orbax are recorded (and redirected to
a local mirror so the run can go on).
"""

import errno
import json
import os

import orbax.checkpoint as ocp
import pytest
from conftest import TINY, FakeBucket, small_config
from etils import epath
from test_train import read_tensorboard_scalars

import fxformer
from fxformer import checkpoint, paths, train
from fxformer.config import with_overrides
from fxformer.early import counts, ended_at
from fxformer.metrics import logged


@pytest.fixture
def fake_gcs(fake_bucket, monkeypatch, tmp_path):
    """A fresh fake bucket behind gs://, and the directories handed to orbax."""
    handed, real = [], ocp.CheckpointManager

    def recording(directory, *args, **kwargs):
        handed.append(str(directory))
        epath.Path(directory).mkdir(parents=True, exist_ok=True)  # as orbax does in a real bucket
        return real(tmp_path / "mirror" / str(directory).removeprefix("gs://"), *args, **kwargs)

    monkeypatch.setattr(ocp, "CheckpointManager", recording)
    return handed


def test_paths_keep_urls_and_expand_home():
    assert str(paths.as_path("gs://bucket/runs/base") / "checkpoints") == "gs://bucket/runs/base/checkpoints"
    assert str(paths.absolute("gs://bucket/x")) == "gs://bucket/x"
    assert not str(paths.as_path("~/runs")).startswith("~")
    run = paths.Workdir("gs://b/r")
    assert [str(p) for p in (run.config, run.tokenizer, run.checkpoints, run.averaged(5), run.eval)] == [
        "gs://b/r/config.json",
        "gs://b/r/tokenizer.model",
        "gs://b/r/checkpoints",
        "gs://b/r/averaged/last5",
        "gs://b/r/eval",
    ]


@pytest.mark.slow  # trains and evaluates in-process
def test_gs_workdir_reaches_every_writer_and_reader_as_a_url(fake_gcs, monkeypatch, tmp_path, data_dir, corpus):
    config = with_overrides(small_config(data_dir), {**TINY, "num_train_steps": 4, "checkpoint_every_steps": 2})
    monkeypatch.chdir(tmp_path)  # a stray local "gs:" folder would appear here
    run = paths.Workdir("gs://bucket/runs/tiny")
    train.train_and_evaluate(config, run, log=lambda *a, **k: None)
    results = fxformer.load(run, average_last=2).evaluate("test", limit=8)

    assert fake_gcs == [
        "gs://bucket/runs/tiny/checkpoints",
        "gs://bucket/runs/tiny/best",
        "gs://bucket/runs/tiny/checkpoints",
        "gs://bucket/runs/tiny/averaged/last2",
    ]
    files = set(FakeBucket.store)
    for name in (
        "config.json",
        "tokenizer.model",
        "metrics.jsonl",
        "eval/test-4-avg2-first8.json",
        "eval/test-4-avg2-first8.hyp.txt",
        "eval/test-4-avg2-first8.ref.txt",
    ):
        assert f"bucket/runs/tiny/{name}" in files, name
    bucket = epath.Path("gs://bucket/runs/tiny")
    assert json.loads((bucket / "config.json").read_text())["num_train_steps"] == 4
    metrics = [json.loads(line) for line in (bucket / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    events = read_tensorboard_scalars(bucket / "tensorboard", "loss")
    assert sorted(events) == [1, 2, 3, 4]
    assert events[4] == pytest.approx(metrics[-1]["loss"], rel=1e-6)
    saved = json.loads((bucket / "eval" / "test-4-avg2-first8.json").read_text())
    assert saved["bleu"] == results["bleu"] and saved["checkpoint_steps"] == [2, 4]
    assert results["path"] == "gs://bucket/runs/tiny/eval/test-4-avg2-first8.json"
    assert not list(tmp_path.rglob("gs:*")) and not list(tmp_path.rglob("bucket/runs/tiny/config.json"))


def test_the_workdir_names_its_results_and_reads_its_metrics_past_damaged_lines(tmp_path):
    w = paths.Workdir(tmp_path)
    assert logged(w) == [] and w.checkpoint_steps() == []
    lines = ['{"step": 1, "loss": 2.0}', '{"step": null}', "[3]", '{"step": true}', '{"step": 2, "loss": 1.5}', '{"st']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert logged(w) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    for name in ("10", "20", "30.orbax-checkpoint-tmp-123", "tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert w.checkpoint_steps() == [10, 20]
    assert w.eval_result("test", [20]) == tmp_path / "eval" / "test-20.json"
    assert w.eval_result("test", [10, 20], first=8).name == "test-20-avg2-first8.json"
    assert w.eval_result("validation", [10], best=True).name == "validation-10-best.json"


def test_a_checkpoint_in_a_bucket_is_complete_once_orbax_has_written_its_commit_file(fake_bucket):
    # on GCS orbax writes <step>/ in place (no rename) and marks a finished save with commit_success.txt
    run = paths.Workdir("gs://bucket/runs/r")
    (run.checkpoints / "2").mkdir(parents=True)
    (run.checkpoints / "2" / paths.COMMIT_FILE).write_text("")
    (run.checkpoints / "3" / "state").mkdir(parents=True)  # a save cut short: no commit file
    (run.checkpoints / "3" / "state" / "x").write_text("")
    assert run.checkpoint_steps() == [2]
    checkpoint.remove_unfinished(run.checkpoints, [2], log=lambda *a: None)  # as a resume does before restoring
    assert [p.name for p in run.checkpoints.iterdir()] == ["2"]


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),  # a write of our own
        ValueError(  # orbax's wrapping of TensorStore's write (its text, as a full tmpfs left it on CI)
            'RESOURCE_EXHAUSTED: Error writing "params/0.0" in OCDBT database at local file "/w/": '
            f"Failed to write 17 bytes to file 9: {os.strerror(errno.ENOSPC)} [os_error_code='28']"
        ),
    ],
)
def test_a_failed_save_says_why_in_the_same_words_however_the_error_arrives(tmp_path, error):
    for name in ("2", "3", "4.orbax-checkpoint-tmp-99"):
        (tmp_path / name).mkdir()
    message = str(checkpoint.save_failed(tmp_path, None, error))
    assert message.startswith(f"Saving step 4 to {tmp_path} failed ({paths.UNWRITABLE[errno.ENOSPC]}); ")
    assert f"the last complete checkpoint is {tmp_path}/3:" in message


def test_a_failed_save_into_a_removed_directory_is_still_one_sentence(tmp_path):
    # the workdir removed while a save runs: orbax's error reaches save_failed after the folder is gone
    message = str(checkpoint.save_failed(tmp_path / "gone", None, FileNotFoundError("no such directory")))
    assert message.startswith(f"A save to {tmp_path / 'gone'} failed (FileNotFoundError: no such directory); ")
    assert "no checkpoint is complete" in message


def test_early_stopping_counts_the_dev_evaluations_after_the_best_one(tmp_path):
    run = paths.Workdir(tmp_path)
    lines = [
        {"step": 10, "loss": 3.0},
        {"step": 20, "dev_ppl": 9.0},
        {"step": 40, "dev_ppl": 8.0},  # the best, kept in best/40
        {"step": 50, "loss": 2.0},
        {"step": 60, "dev_ppl": 8.5, "dev_bleu": 20.0},
        {"step": 80, "dev_ppl": 8.1},
    ]
    run.metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert ended_at(run, "dev_ppl", 2) is None  # no best/ yet: nothing to count from
    (run.best / "40").mkdir(parents=True)
    assert ended_at(run, "dev_ppl", 2) == 80 and ended_at(run, "dev_ppl", 1) == 60
    assert ended_at(run, "dev_ppl", 3) is None and ended_at(run, "dev_ppl", 0) is None
    assert ended_at(run, "", 2) is None
    # a smallest improvement of 10%: 8.0 is 11% better than 9.0, 8.1 is not 10% better than 8.0
    assert ended_at(run, "dev_ppl", 2, min_delta=0.1) == 80
    assert ended_at(run, "dev_ppl", 2, min_delta=0.2) == 60  # 8.0 is not 20% better than 9.0 either


def test_the_plateau_count_restarts_only_at_an_improvement_by_the_smallest_share():
    values = [10.0, 9.0, 8.95, 8.92, 8.0, 8.1, 7.96]
    assert counts(values, higher=False) == [0, 0, 0, 0, 0, 1, 0]  # any better value
    # 1%: 8.95 and 8.92 are within 1% of 9.0 (8.91 is the bound); 8.0 is not; 7.96 is 0.5% below 8.0
    assert counts(values, higher=False, min_delta=0.01) == [0, 0, 1, 2, 0, 1, 2]
    bleu = [20.0, 20.1, 21.0, 20.5, 21.1]
    assert counts(bleu, higher=True) == [0, 0, 0, 1, 0]
    assert counts(bleu, higher=True, min_delta=0.02) == [0, 1, 0, 1, 2]  # 21.0 is 5% above 20.0
    assert counts([], higher=False) == []


PROBES = """
import sys, time
from fxformer import paths
base, start = sys.argv[1], float(sys.argv[2])
for r in range(40):  # 40 new workdirs, each probed by every process at the same moment
    while time.time() < start + 0.05 * r:
        pass
    paths.check_writable(f"{base}/w{r}/run", "a test writes")
"""


def test_the_processes_of_one_launch_probe_one_new_workdir_at_once(tmp_path):
    """Every process of a launch checks that the new workdir is writable, at the same moment:
    one's clean-up met another's probe (epath's rmdir raised ValueError: a traceback, CI
    2026-11-26) or removed the directory between another's mkdir and its write (a false 'Cannot
    write to ... (No such file or directory)'). Four processes, 40 workdirs: none fails."""
    import subprocess
    import sys
    import time

    start = time.time() + 5  # after every process has imported fxformer.paths
    argv = [sys.executable, "-c", PROBES, str(tmp_path), str(start)]
    processes = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
