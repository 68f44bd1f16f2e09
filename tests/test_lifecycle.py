"""How a run begins and ends around its loop (`fxformer.lifecycle`), without training: signals,
the processes' agreement, early stopping's words, a workdir removed under the run, a full disk,
and a refused command that leaves nothing behind."""

import errno
import os
import signal

import pytest

from fxformer import checkpoint, early, exitcodes, lifecycle, paths
from fxformer.errors import UserError
from fxformer.metrics import Progress


class FakeManager:
    """What `guarded` asks of orbax's CheckpointManager: wait, close, and the directory it names."""

    def __init__(self, directory):
        self.directory, self.closed, self.failure = directory, 0, None

    def wait_until_finished(self):
        if self.failure:
            raise self.failure

    def close(self):
        self.closed += 1


def workdir_of_a_run(tmp_path) -> paths.Workdir:
    """A workdir as training leaves it before its first step: config.json and tokenizer.model."""
    run = paths.Workdir(tmp_path / "w")
    run.checkpoints.mkdir(parents=True)
    run.config.write_text("{}")
    run.tokenizer.write_text("a model")
    return run


def guarded_run(run: paths.Workdir, body, stop=None):
    """`body()` inside `guarded`: what it raised (or None), the manager, and what release was told."""
    manager, released = FakeManager(run.checkpoints), []
    stop = stop or lifecycle.StopRequest()
    try:
        with lifecycle.guarded(run, manager, stop, step=lambda: 7, release=released.append):
            body()
    except BaseException as e:  # noqa: BLE001 - the test looks at what came out
        return e, manager, released
    finally:
        stop.uninstall()
    return None, manager, released


def test_a_loop_that_ends_closes_the_manager_and_releases_the_writers(tmp_path):
    run = workdir_of_a_run(tmp_path)
    raised, manager, released = guarded_run(run, lambda: None)
    assert raised is None and manager.closed == 1 and released == [False]
    assert run.config.exists() and run.tokenizer.exists()


def test_a_workdir_removed_under_the_loop_is_one_sentence_and_stays_removed(tmp_path):
    run = workdir_of_a_run(tmp_path)

    def removed_then_written():  # the loop's next writes recreate part of it (a checkpoint, metrics)
        run.tokenizer.unlink()
        run.config.unlink()
        (run.checkpoints / "7").mkdir()
        run.metrics.write_text("{}\n")
        lifecycle.check_present(run)  # what the loop asks at a log step

    raised, _, released = guarded_run(run, removed_then_written)
    assert isinstance(raised, lifecycle.WorkdirRemoved) and raised.status == exitcodes.USER_ERROR
    assert str(raised).startswith(f"The workdir {run} was removed while training (at step 7)")
    assert released == [True] and not run.root.exists()  # what the run wrote after the removal: gone again


def test_a_workdir_removed_before_a_signal_exits_with_the_stopped_status(tmp_path):
    run = workdir_of_a_run(tmp_path)
    stop = lifecycle.StopRequest()
    stop.training()

    def removed_then_stopped():
        run.tokenizer.unlink()
        os.kill(os.getpid(), signal.SIGTERM)  # kept: the run saves at its next agreed step
        raise FileNotFoundError(run.checkpoints / "7")

    raised, _, _ = guarded_run(run, removed_then_stopped, stop)
    assert isinstance(raised, lifecycle.WorkdirRemoved) and raised.status == exitcodes.STOPPED


def test_a_full_disk_under_the_loops_own_writes_is_a_failed_save(tmp_path):
    run = workdir_of_a_run(tmp_path)

    def disk_full():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run.metrics))

    raised, manager, released = guarded_run(run, disk_full)
    assert isinstance(raised, checkpoint.SaveFailed) and "no space left on the disk" in str(raised)
    assert manager.closed == 1 and released == [False]


def test_another_error_comes_out_as_it_was(tmp_path):
    run = workdir_of_a_run(tmp_path)
    error = RuntimeError("a bug")

    def bug():
        raise error

    raised, _, released = guarded_run(run, bug)
    assert raised is error and released == [False]


def test_a_refused_command_removes_the_workdir_it_created_and_keeps_one_it_found(tmp_path):
    stop = lifecycle.StopRequest()
    try:
        new = paths.Workdir(tmp_path / "new")
        with pytest.raises(UserError), lifecycle.refusal_leaves_nothing(new, stop):
            new.root.mkdir()
            new.tokenizer.write_text("a copy")  # what preparing it wrote
            raise UserError("refused")
        assert not new.root.exists()
        found = workdir_of_a_run(tmp_path)
        with pytest.raises(UserError), lifecycle.refusal_leaves_nothing(found, stop):
            raise UserError("refused")
        assert found.config.exists() and found.tokenizer.exists()
    finally:
        stop.uninstall()


def test_a_signal_before_training_stops_at_once_and_after_asks_for_a_save():
    stop = lifecycle.StopRequest()
    try:
        with pytest.raises(lifecycle.StoppedBeforeTraining, match="SIGTERM before training began"):
            os.kill(os.getpid(), signal.SIGTERM)
        stop.signal = None
        stop.training()
        os.kill(os.getpid(), signal.SIGTERM)  # kept now: no exception
        assert stop.name == "SIGTERM"
        progress = Progress({})
        agreed = lifecycle.agree(Config(log_every_steps=5), 3, stop, progress, time_due=True)
        assert agreed == lifecycle.Agreed(save_for_time=True, stop=True)  # one process: at every step
        assert lifecycle.stopped_by("", stop, progress) == "SIGTERM"
        assert lifecycle.agree(Config(log_every_steps=5), 3, stop, progress, time_due=False, budget=False).stop
    finally:
        stop.uninstall()


def test_a_spent_time_budget_stops_where_it_counts_and_not_before_the_first_step():
    stop = lifecycle.StopRequest()  # no signal
    try:
        spent = Progress({}, budget_s=1e-9)  # over by the time it is asked
        ask = lambda **kw: lifecycle.agree(Config(log_every_steps=5), 3, stop, spent, time_due=False, **kw)  # noqa: E731
        assert ask().stop and ask(budget=True).stop and not ask(budget=False).stop  # before the first step: False
        assert not lifecycle.agree(Config(log_every_steps=5), 3, stop, Progress({}), time_due=False).stop  # no budget
        assert lifecycle.stopped_by("", stop, spent) == "time budget of 1.66667e-11 minutes"
    finally:
        stop.uninstall()


class Config(dict):
    """A config's fields as attributes (the few these tests need)."""

    __getattr__ = dict.__getitem__


def test_early_stopping_says_why_and_lets_the_last_step_end_the_run_itself():
    rule = early.EarlyStopping("dev_ppl", patience=2, min_delta=0.0, last_step=10)
    said = [rule.observe(step, {"dev_ppl": ppl}) for step, ppl in ((2, 5.0), (4, 6.0), (6, 6.5))]
    assert said == ["", "", "no better dev_ppl in 2 dev evaluations (early stopping)"]
    assert rule.reason(10) == ""  # the last step ends the run anyway
    assert early.EarlyStopping("dev_ppl", 3, 0.0, 10, rule.evaluations).reason(6) == ""
    assert early.EarlyStopping("", 2, 0.0, 10).observe(6, {"dev_ppl": 9.0}) == ""  # no best_metric: never
    assert rule.observe(8, {"loss": 1.0}) == said[-1]  # a log step without a dev value counts nothing


def test_a_removed_workdir_loses_only_what_training_wrote_after_the_removal(tmp_path):
    run = paths.Workdir(tmp_path / "w")
    for path in (run.checkpoints / "4" / "state", run.best / "2", run.tensorboard):
        path.mkdir(parents=True)
    for path in (run.metrics, run.run_info, run.root / ".metrics.jsonl.tmp"):
        path.write_text("{}")
    assert run.removed()  # neither config.json nor tokenizer.model: what is there, the run recreated
    lifecycle.forget_training(run)
    assert not run.root.exists()

    (run.checkpoints / "4").mkdir(parents=True)
    (run.root / "notes.txt").write_text("someone else's")
    lifecycle.forget_training(run)
    assert [p.name for p in run.root.iterdir()] == ["notes.txt"]  # not the run's: kept, and the directory with it
    run.tokenizer.write_text("x")
    assert not run.removed()  # a workdir that keeps its tokenizer (or its config) is no removed one
