"""What guards a training run from the outside: signals, divergence, failed saves, a removed workdir.

The loop in `train.py` reads as the paper's training (step, what is due, evaluate, save, stop);
everything here is how a run begins and ends around it:

- `restore_or_start`: a run resumes from its workdir's latest checkpoint (the data iterator moved
  to its position), else starts from step 0; `describe` says on what (the content of W/run.json).
- `StopRequest`: SIGTERM (a pre-emption notice) or Ctrl-C. Before training begins it stops the
  command at once (`StoppedBeforeTraining`); after, the run saves at the next step every process
  agrees on (`agree`), and exits with 75 (`fxformer.exitcodes.STOPPED`).
- `DivergenceWatch`: a non-finite or exploding training loss stops the run (`Diverged`) before it
  saves the bad parameters.
- `guarded`: around the loop, the manager's saves finished or failed as one clear sentence
  (`checkpoint.save_failed`), and a workdir removed under the run (`WorkdirRemoved`) left removed.
- `refusal_leaves_nothing`: a command refused before training leaves the workdir it found as it was.
"""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import jax
import ml_collections
import numpy as np

from fxformer import checkpoint, exitcodes, parallel, paths, versions
from fxformer.errors import UserError
from fxformer.metrics import Progress
from fxformer.trainstate import TrainState

AGREE_EVERY = 10  # steps between the processes' stop/save agreements (a tiny collective)


# ---------------------------------------------------------------------------------------------
# The beginning: resume or start


def restore_or_start(
    config: ml_collections.ConfigDict,
    workdir: paths.Workdir,
    abstract_state,
    data_iterator: parallel.GlobalBatches,
    new_state: Callable[[], TrainState],
    log=print,
):
    """(checkpoint manager, state, its step): the latest checkpoint (the data iterator moved to its
    position), or `new_state()`; leftovers of saves that never finished are removed first."""
    manager = checkpoint.open_manager(workdir.checkpoints, config.keep_checkpoints)
    if jax.process_index() == 0:  # the manager lists the finished saves only
        checkpoint.remove_unfinished(workdir.checkpoints, manager.all_steps(), log)
    start_step = manager.latest_step() or 0
    if start_step:
        state = checkpoint.restore_training_state(manager, start_step, abstract_state, data_iterator)
        log(f"resumed from {workdir.checkpoints / str(start_step)}")
        before, rows = data_iterator.restored_rows, data_iterator.rows
        if before and before != rows:  # the data's position is a count of batches of the rows
            log(
                f"warning: this run trained with {before} rows per step and goes on with {rows} (on "
                f"{jax.device_count()} devices, whose multiple the rows are rounded to): from step {start_step} on "
                "it reads the training pairs in another order and place in the epoch than an uninterrupted run; "
                "resume on as many devices for an exact continuation"
            )
        return manager, state, start_step
    if workdir.metrics.exists():
        log(f"warning: {workdir} has metrics from an earlier run but no checkpoint: training starts from step 0")
    return manager, new_state(), 0


def describe(
    config: ml_collections.ConfigDict,
    state: TrainState,
    model,
    *,
    vocab_size: int,
    rows: int,
    start_step: int,
    log=print,
) -> dict:
    """The model and the devices on the console; returns what `W/run.json` records of them."""
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    m = model.config
    log(
        f"model: N={m.num_layers} d_model={m.d_model} d_ff={m.d_ff} h={m.num_heads} d_k={m.d_k} d_v={m.d_v}, "
        f"{num_params:,} parameters, vocabulary {vocab_size:,}; {jax.device_count()} devices "
        f"({jax.devices()[0].platform}) in {jax.process_count()} process(es); "
        f"{rows} rows x {config.data.max_length} tokens per step in {config.grad_accum_steps} micro-batch(es)"
    )
    return {
        "devices": jax.device_count(),
        "platform": jax.devices()[0].platform,
        "num_params": num_params,
        "processes": jax.process_count(),
        "rows_per_step": rows,
        "max_length": config.data.max_length,
        "tokens_per_batch": config.data.tokens_per_batch,
        "start_step": start_step,
        "device_kind": jax.devices()[0].device_kind,
        "versions": versions.versions(),
        "cpu": versions.cpu(),
    }


# ---------------------------------------------------------------------------------------------
# Signals


class StoppedBeforeTraining(UserError):
    """SIGTERM or Ctrl-C before training began (data preparation, tokenizer, restore): nothing to save."""


class StopRequest:
    """SIGTERM (a pre-emption notice) or a first Ctrl-C. Installed at the start of a command:
    before training begins (`training()`), it stops the command at once (StoppedBeforeTraining:
    there is nothing to save, and a refused run leaves nothing behind); from then on it is kept,
    and the run saves at the next agreed step and stops. A second Ctrl-C interrupts at once.
    """

    def __init__(self):
        self.signal: int | None = None
        self.before_training = True
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def training(self) -> None:
        """Training goes on from here: a signal now asks for a save at the next agreed step. A
        signal that came before, whose stop a library swallowed (TFDS catches what is raised in
        its logging hooks), stops the command here."""
        if self.signal is not None:
            raise StoppedBeforeTraining(f"{self.name} before training began")
        self.before_training = False

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signal == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum
        if self.before_training:
            raise StoppedBeforeTraining(f"{signal.Signals(signum).name} before training began")

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else ""

    def uninstall(self) -> None:
        """Put back the signal handlers there were before."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def stop_requests(stop: StopRequest | None) -> Iterator[StopRequest]:
    """`stop`, or one installed for the block and uninstalled after it."""
    if stop is not None:
        yield stop
        return
    own = StopRequest()
    try:
        yield own
    finally:
        own.uninstall()


class Agreed(NamedTuple):
    """What every process decided together at a step."""

    save_for_time: bool  # checkpoint_every_minutes has passed
    stop: bool  # a signal (SIGTERM, Ctrl-C) or the time budget


def agree(
    config: ml_collections.ConfigDict,
    step: int,
    stop: StopRequest,
    progress: Progress,
    *,
    time_due: bool,
    now: bool = False,
    budget: bool = True,
) -> Agreed:
    """The same decision on every process: several processes compare their flags every
    `AGREE_EVERY` steps or log steps (or `now`, a point every process reaches), so they always
    save and stop together, soon after a pre-emption notice. `budget`: whether the time budget
    counts (a signal always does)."""
    flags = np.array([time_due, stop.signal is not None or (budget and progress.out_of_time())])
    if jax.process_count() > 1:
        if step % min(config.log_every_steps, AGREE_EVERY) and not now:
            return Agreed(False, False)
        flags = parallel.any_process(flags)
    return Agreed(bool(flags[0]), bool(flags[1]))


def stopped_by(early: str, stop: StopRequest, progress: Progress) -> str:
    """Why a run stopped before its last step, in words: early stopping (`early`), a signal to
    this process or to another one, or the time budget."""
    if early or stop.name:
        return early or stop.name
    if progress.out_of_time():
        return f"time budget of {progress.budget_s / 60:g} minutes"
    return "a signal to another process"


# ---------------------------------------------------------------------------------------------
# Divergence


class Diverged(UserError):
    """The loss stopped being finite, or exploded (`DivergenceWatch`)."""


class DivergenceWatch:
    """Tells a diverged training loss from a healthy one, step by step.

    Diverged: not finite; or, with `factor` > 0, above `factor` x the best loss of this run and
    2 nats above it, or above 3 x ln(vocabulary) (three times a uniform guess), which catches a
    run that explodes from its first steps. A resumed run starts from the best logged training
    loss up to its resume step (a mean over a log interval: at most a little above the best step).
    """

    def __init__(self, factor: float, vocab_size: int, logged: Sequence[dict] = (), resume_step: int = 0):
        self.factor = factor
        losses = [line["loss"] for line in logged if "loss" in line and line["step"] <= resume_step]
        self.best = min(losses, default=math.inf)
        self.ceiling = 3 * math.log(vocab_size)

    def first_bad(self, losses: list[float]) -> tuple[int, str] | None:
        """(index, what happened) of the first diverged per-token loss, or None; updates the best."""
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                return i, "became non-finite"
            if self.factor > 0 and (loss > self.ceiling or (loss > self.factor * self.best and loss > self.best + 2)):
                return i, f"exploded to {loss:.3g} per token (best so far {self.best:.3g})"
            self.best = min(self.best, loss)
        return None

    def check(self, losses: list[float], last_step: int, manager) -> None:
        """Raise Diverged if one of the per-token `losses` of the steps ending at `last_step`
        diverged. A diverged loss at step F means the parameters after step F - 1 are bad: their
        checkpoints (and later ones) are removed first."""
        found = self.first_bad(losses)
        if found is None:
            return
        index, what = found
        first_bad = last_step - len(losses) + 1 + index
        last_good = checkpoint.remove_from(manager, first_bad - 1)
        kept = f"the last good checkpoint (step {last_good}) is intact" if last_good else "no checkpoint was kept"
        raise Diverged(
            f"The training loss {what} at step {first_bad}; {kept}: lower learning_rate_scale or raise warmup_steps "
            "and resume."
        )


# ---------------------------------------------------------------------------------------------
# The workdir, removed under the run


class WorkdirRemoved(UserError):
    """The workdir disappeared under the run: nothing more can be saved there. The exit status is
    the interruption's (75, `exitcodes.STOPPED`) when a signal asked the run to stop, before or
    while it ended; else 2."""

    def __init__(self, workdir: paths.Workdir, step: int, stop: StopRequest):
        super().__init__(
            f"The workdir {workdir} was removed while training (at step {step}); nothing more can be saved there: "
            "run the same command to train again from step 0."
        )
        self.stop = stop

    @property
    def status(self) -> int:  # read by `cli.run` as the process exits
        return exitcodes.STOPPED if self.stop.signal is not None else exitcodes.USER_ERROR


def check_present(workdir: paths.Workdir) -> None:
    """Raise FileNotFoundError if the workdir was removed under the run (`guarded` names it)."""
    if workdir.removed():
        raise FileNotFoundError(workdir.tokenizer)


@contextlib.contextmanager
def refusal_leaves_nothing(workdir: paths.Workdir, stop: StopRequest) -> Iterator[None]:
    """A command refused (UserError) before training began leaves a workdir it found as it was,
    and one it would have created absent (what preparing it wrote: the tokenizer copy). Once
    training goes on, the workdir is the run's."""
    fresh = not workdir.root.exists() or not any(workdir.root.iterdir())
    try:
        yield
    except UserError:
        if fresh and stop.before_training and jax.process_index() == 0 and workdir.root.exists():
            workdir.root.rmtree()
        raise


@contextlib.contextmanager
def guarded(
    workdir: paths.Workdir, manager, stop: StopRequest, *, step: Callable[[], int], release: Callable[[bool], None]
) -> Iterator[None]:
    """Around the training loop: once it ends, its last save finished (or failed, as one sentence
    naming the fix); a workdir removed under it (`Workdir.removed`) is WorkdirRemoved, and what
    the run's last writes recreated there (saves in flight, metrics) is removed again. `step()`:
    the step the loop reached; `release(removed)`: closes the loop's writers, whatever happened."""
    try:
        try:
            yield
        except BaseException as e:
            checkpoint.close(manager, failing=True)
            translated = failure(e, workdir, stop, step())
            if translated is e:
                raise
            raise translated from None
        checkpoint.close(manager)
        if workdir.removed():  # while the last save ran: it was written into a recreated directory
            raise WorkdirRemoved(workdir, step(), stop)
    finally:
        removed = workdir.removed()
        release(removed)
        if removed:  # saves in flight, the last metrics: written after the removal, not kept
            checkpoint.settle(manager)
            forget_training(workdir)


def forget_training(workdir: paths.Workdir) -> None:
    """Remove what training writes in `workdir` besides config.json and tokenizer.model
    (checkpoints, the best parameters, metrics, TensorBoard events, run.json, an unfinished atomic
    write), then the directory if nothing else is in it: for a workdir removed under a run whose
    last writes recreated part of it (`Workdir.removed`). A concurrent removal's races are ignored."""
    root = workdir.root
    written = [workdir.checkpoints, workdir.best, workdir.tensorboard, workdir.metrics, workdir.run_info]
    for path in [*written, *(root.glob(".*.tmp") if root.exists() else [])]:
        with contextlib.suppress(OSError):
            path.rmtree() if path.is_dir() else path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        if root.exists() and not any(root.iterdir()):
            root.rmdir()


def failure(e: BaseException, workdir: paths.Workdir, stop: StopRequest, step: int) -> BaseException:
    """What the run raises for `e`, which stopped the loop (the last save finished or failed)."""
    if isinstance(e, (FileNotFoundError, UserError)) and workdir.removed():
        return WorkdirRemoved(workdir, step, stop)
    if paths.unwritable(e):  # the disk filled under the loop's own writes (metrics) while a save was in flight
        return checkpoint.save_failed(workdir.checkpoints, None, e)
    return e
