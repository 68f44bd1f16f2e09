"""Training: the pure `train_step`, and the loop that runs it on every device.

    python -m fxformer.train --config=configs/default.py --workdir=runs/default

The same command runs on a laptop, a GPU host or a TPU pod (add --distributed, or the
explicit --coordinator_address/--num_processes/--process_id). A workdir with checkpoints is
resumed, with the same data order. SIGTERM (a pre-emption notice) or Ctrl-C saves and exits
with status 75 (`fxformer.exitcodes.STOPPED`); a run that reached its last step exits 0.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from fxformer import checkpoint, cli, exitcodes, inference, optim, parallel, paths, trainstate
from fxformer.config import check_workdir_config, load_workdir_config, validate, write_workdir_config
from fxformer.data import corpora, pipeline, token_ids, tokenized, tokenizer_for
from fxformer.errors import UserError
from fxformer.metrics import MetricWriter, Progress, per_token
from fxformer.trainstate import TrainState

# ---------------------------------------------------------------------------------------------
# State and pure steps


def train_step(
    state: TrainState, batch: dict, *, model, tx, schedule, label_smoothing: float, accum: int, chunk: int = 0
) -> tuple[TrainState, dict]:
    """One optimizer step on a global batch, in `accum` micro-batches: (state, batch) -> (state, metrics).

    Gradients of the summed loss are added over micro-batches (and, by XLA, over devices),
    then divided by the number of target tokens: the mean over the whole global batch. The
    dropout key is the run's key folded with the step (and the micro-batch), so a resumed run
    draws the same masks. `chunk` > 0: the loss's projection `chunk` tokens at a time (`optim.loss_sums`).
    """
    rng = jax.random.fold_in(state.rng, state.step)

    def micro(x):  # [rows, ...] -> [accum, rows / accum, ...], keeping each device's rows local
        return x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)

    def accumulate(carry, inputs):
        grads_sum, sums = carry
        micro_batch, index = inputs

        def loss_fn(params):
            out = optim.loss_sums(params, micro_batch, model, label_smoothing, jax.random.fold_in(rng, index), chunk)
            return out["loss"], out

        grads, out = jax.grad(loss_fn, has_aux=True)(state.params)
        return (jax.tree.map(jnp.add, grads_sum, grads), jax.tree.map(jnp.add, sums, out)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    sums = {k: jnp.zeros((), jnp.float32) for k in optim.SUMS}
    micro_batches = (jax.tree.map(micro, batch), jnp.arange(accum))
    (grads, sums), _ = jax.lax.scan(accumulate, (zeros, sums), micro_batches)
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
    with jax.named_scope("optimizer"):  # the name `fxformer.profile` finds in the compiled step's metadata
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, {**sums, "learning_rate": schedule(state.step)}


# ---------------------------------------------------------------------------------------------
# Setup shared with evaluation


def prepare_data(config: ml_collections.ConfigDict, workdir: paths.PathLike, log=print):
    """(builder, tokenizer, folder of the token ids): process 0 builds the dataset, the tokenizer
    and the stored token ids, the others wait and find them."""
    if jax.process_index() == 0:
        builder = corpora.prepare(config.data, log=log)
        token_ids(config.data, builder, tokenizer_for(config.data, builder, workdir, log=log), log=log)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("fxformer: data prepared")
    builder = corpora.prepare(config.data, log=log)
    tokenizer = tokenizer_for(config.data, builder, workdir, log=log)
    return builder, tokenizer, token_ids(config.data, builder, tokenizer, log=log)


# ---------------------------------------------------------------------------------------------
# The loop


AGREE_EVERY = 10  # steps between the processes' stop/save agreements (a tiny collective)


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


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: paths.PathLike, log=print, stop: StopRequest | None = None
) -> Trained:
    """Train `config` in `workdir` until `num_train_steps`, resuming from its latest checkpoint.

    Returns the last state, and whether the run is finished (else a signal or the time budget
    stopped it, to be resumed).
    """
    own_stop = stop is None
    stop = stop or StopRequest()
    try:
        return _check_then_train(config, paths.Workdir(workdir), log, stop)
    finally:
        if own_stop:
            stop.uninstall()


def _check_then_train(config: ml_collections.ConfigDict, workdir: paths.Workdir, log, stop: StopRequest) -> Trained:
    """Everything up to the first step is checked before the run is recorded: a refused command
    leaves a workdir it found as it was, and one it would have created absent."""
    validate(config, jax.default_backend(), jax.process_count())
    check_workdir_config(config, workdir)
    fresh = not paths.as_path(workdir).exists() or not any(paths.as_path(workdir).iterdir())
    try:
        return _train_accepted(config, workdir, log, stop)
    except UserError:
        if (
            fresh and stop.before_training and jax.process_index() == 0
        ):  # once training goes on, the workdir is the run's
            paths.remove_tree(workdir)  # what preparing it wrote (the tokenizer copy): a refusal leaves nothing
        raise


class Trained(NamedTuple):
    """How a run ended: its last state, and whether it is finished (its last step, or early
    stopping: nothing to resume) or stopped to be resumed (a signal, the time budget)."""

    state: TrainState
    finished: bool


def _train_accepted(config: ml_collections.ConfigDict, workdir: paths.Workdir, log, stop: StopRequest) -> Trained:
    """The run itself, once its config is accepted: data, model, restore or start (`Loop.start`),
    then the loop; a refusal up to the first step still leaves nothing."""
    loop = Loop.start(config, workdir, log, stop)
    try:
        loop.run()
    except BaseException as e:
        translated = loop.failed(e)
        if translated is e:
            raise
        raise translated from None
    else:
        loop.close()
    finally:
        loop.release()
    if loop.lengths.overlong_pairs:
        log(f"length filter: {loop.lengths.report(jax.process_count())}")
    finished = int(loop.state.step) >= config.num_train_steps or bool(loop.early)
    return Trained(loop.state, finished)


@dataclasses.dataclass
class Loop:
    """The training loop: what it was built with, and its bookkeeping from step to step."""

    config: ml_collections.ConfigDict
    workdir: paths.Workdir
    log: Callable
    stop: StopRequest
    mesh: jax.sharding.Mesh
    model: Any
    jit_train_step: Callable
    jit_loss_step: Callable
    data_iterator: parallel.GlobalBatches
    lengths: pipeline.LengthReport
    train_pairs: int
    dev_examples: Any
    dev_bleu: inference.DevBleu | None
    manager: Any
    state: TrainState
    start_step: int
    writer: MetricWriter
    best: checkpoint.Best
    watch: DivergenceWatch
    progress: Progress
    step: int = 0
    recorded: bool = False  # config.json says this run's config (a new run at once, a resume once it saved)
    last_save: float = dataclasses.field(default_factory=time.time)
    pending: list = dataclasses.field(default_factory=list)  # metrics of steps not yet logged (device or host)
    early: str = ""  # why early stopping ended the run

    @classmethod
    def start(cls, config, workdir: paths.Workdir, log, stop: StopRequest) -> Loop:
        """Data, model and compiled steps; the state restored from the last checkpoint or new."""
        mesh = parallel.data_mesh()
        builder, tokenizer, ids = prepare_data(config, workdir, log)
        train_split = tokenized.load(ids, config.data.train_split)
        pipeline.check_lengths(train_split, config.data, log)
        model, tx, abstract_state = trainstate.build(config, tokenizer.vocab_size, mesh)
        rows = pipeline.rows_per_step(config.data, jax.device_count(), config.grad_accum_steps)
        train_ds, lengths = pipeline.train_dataset(
            ids, config.data, rows, config.data.shuffle_seed, jax.process_index(), jax.process_count()
        )
        data_iterator = parallel.GlobalBatches(mesh, iter(train_ds), config.data.device_prefetch, rows)
        dev_bleu = None
        if config.dev_bleu_every_steps > 0:
            dev_source = corpora.data_source(builder, config.data.eval_split)
            dev_bleu = inference.DevBleu(model, mesh, config, dev_source, tokenizer, log)
        dev_examples = tokenized.load(ids, config.data.eval_split).examples(
            config.eval_batches * config.data.eval_batch_size
        )
        restored = restore_or_start(config, workdir, model, tx, abstract_state, data_iterator, mesh, log)
        manager, state, start_step = restored
        stop.training()
        if start_step == 0 and jax.process_index() == 0:  # a new run is recorded now
            write_workdir_config(config, workdir, start_step)
        describe(config, workdir, state, model, tokenizer, rows, start_step, log)
        writer = MetricWriter(workdir, start_step, enabled=jax.process_index() == 0)
        logged = workdir.logged()
        return cls(
            config,
            workdir,
            log,
            stop,
            mesh,
            model,
            compile_train_step(config, model, tx, mesh),
            inference.loss_step(model, config.label_smoothing, mesh, config.loss_chunk_tokens),
            data_iterator,
            lengths,
            len(train_split),
            dev_examples,
            dev_bleu,
            manager,
            state,
            start_step,
            writer,
            best=checkpoint.Best(workdir.best, config.best_metric, start_step, logged, config.early_stopping_min_delta),
            watch=DivergenceWatch(config.divergence_factor, tokenizer.vocab_size, logged, start_step),
            progress=Progress(writer.last(), 60 * config.train_minutes),
            step=start_step,
            recorded=start_step == 0,
        )

    def run(self) -> None:
        """Train until the last step, a stop, or an error."""
        total = self.config.num_train_steps
        self.make_up_evaluation()
        self.early = self.early or plateau(self.config, self.best, self.step)
        if self.early:  # a resumed run that early stopping had ended
            self.log(f"{self.workdir} ended at step {self.step}: {self.early}; nothing to train")
            return
        if self.step < total and agree(self.config, self.step, self.stop, self.progress, time_due=False, now=True).stop:
            self.log(f"{self.stop.name} before the first step: nothing new to save; exiting")  # preparing, compiling
            return
        while self.step < total:
            self.train_one_step()
            due = self.due()
            logged, steps = self.evaluate(due)
            if self.early:
                due = due._replace(save=True, stop=True)
            self.report(logged, steps)
            self.save(due, logged)
            if due.stop:
                checkpoint.wait(self.manager)
                self.log(f"{self.stopped_by()}: saved step {self.step} to {self.workdir.checkpoints}; exiting")
                return

    def make_up_evaluation(self) -> None:
        """A stop on an evaluation step saves without evaluating (`what_is_due`): the resumed run
        evaluates that step first, so that metrics.jsonl, the best parameters and early stopping
        count every evaluation an uninterrupted run would. Every process decides alike, from the
        metrics file."""
        step, config = self.step, self.config
        lines = [line for line in self.workdir.logged() if line["step"] == step] if step else []
        if not lines:
            return
        line = lines[-1]
        dev_loss = step % config.eval_every_steps == 0 and "dev_loss" not in line
        dev_bleu = self.dev_bleu is not None and step % config.dev_bleu_every_steps == 0 and "dev_bleu" not in line
        if not (dev_loss or dev_bleu):
            return
        logged, _ = self.evaluate(Due(log=False, dev_loss=dev_loss, dev_bleu=dev_bleu, save=False, stop=False))
        self.writer.amend(step, logged)
        shown = ", ".join(f"{k} {v:.4g}" for k, v in logged.items() if k in ("dev_ppl", "dev_bleu"))
        self.log(f"step {step}: the dev evaluation its stop passed over, made up: {shown}")

    def train_one_step(self) -> None:
        local, batch = next(self.data_iterator)
        self.progress.pairs += pipeline.pairs_in(local) * jax.process_count()  # the processes read equal shares
        self.state, metrics = self.jit_train_step(self.state, batch)
        self.step += 1
        self.pending.append(metrics)
        if self.progress.window is None:  # the first step compiles; measure speed from the second on
            jax.block_until_ready(metrics)
            self.progress.first_step(self.step)

    def due(self) -> Due:
        """What this step does besides training, agreed by every process."""
        minutes = self.config.checkpoint_every_minutes
        time_due = 0 < minutes <= (time.time() - self.last_save) / 60
        due = what_is_due(
            self.config,
            self.step,
            agree(self.config, self.step, self.stop, self.progress, time_due=time_due),
            self.dev_bleu is not None,
        )
        if due.log and not self.workdir.tokenizer.exists():  # the workdir was removed under the run
            raise FileNotFoundError(self.workdir.tokenizer)
        return due

    def evaluate(self, due: Due) -> tuple[dict[str, float], int]:
        """(what this step logs, how many steps its training metrics cover): the pending steps'
        metrics (a diverged loss stops the run here, before a save), then the dev evaluations;
        these offer the parameters as the best, and decide early stopping."""
        logged, steps = fetch(self.pending, self.watch, self.step, self.manager) if due.log else ({}, 0)
        if due.dev_loss:
            logged.update(
                inference.dev_loss(
                    self.jit_loss_step,
                    self.state.params,
                    self.dev_examples,
                    self.config,
                    self.mesh,
                    self.model.config.max_len,
                    "dev_",
                )
            )
        if due.dev_bleu:
            logged["dev_bleu"] = self.dev_bleu(self.state.params)
        if due.dev_loss or due.dev_bleu:
            self.early = early_stop(self.config, self.best, self.step, logged, self.state.params, self.log)
        return logged, steps

    def report(self, logged: dict[str, float], steps: int) -> None:
        """The metrics file, and the console line when due."""
        if logged:
            epoch = pipeline.epoch_size(self.train_pairs, self.lengths)
            self.writer.write(self.step, self.progress.record(logged, steps, epoch))
        if self.progress.console_due(bool(logged)):
            shown = logged
            if not logged:  # the steps since the last log step: the window the next log line averages (one
                # step's loss would jump at each log line); waits for the step, so the speed is real. Kept on
                # the host: fetch() does not copy them again.
                self.pending[:] = jax.device_get(self.pending)
                shown = window_metrics(self.pending)
            self.log(self.progress.line(self.step, self.config.num_train_steps, shown))

    def save(self, due: Due, logged: dict[str, float]) -> None:
        if due.save:
            checkpoint.save(self.manager, self.step, self.state, self.data_iterator)
            self.last_save = time.time()
            if not self.recorded and jax.process_index() == 0:
                write_workdir_config(self.config, self.workdir, self.start_step)
                self.recorded = True
        elif logged:
            checkpoint.check(self.manager)  # a failed background save stops the run now, not at the next save

    def stopped_by(self) -> str:
        if self.early or self.stop.name:
            return self.early or self.stop.name
        if self.progress.out_of_time():
            return f"time budget of {self.progress.budget_s / 60:g} minutes"
        return "a signal to another process"

    def failed(self, e: BaseException) -> BaseException:
        """What the run raises for `e`, which stopped the loop (the last save finished or failed)."""
        checkpoint.close(self.manager, failing=True)
        if isinstance(e, (FileNotFoundError, UserError)) and not self.workdir.tokenizer.exists():  # removed under us
            return WorkdirRemoved(self.workdir, self.step, self.stop)
        if paths.unwritable(e):  # the disk filled under the loop's own writes (metrics) while a save was in flight
            return checkpoint.save_failed(self.workdir.checkpoints, None, e)
        return e

    def close(self) -> None:
        """After the loop: the last save finished."""
        checkpoint.close(self.manager)
        if self.workdir.removed():  # while the last save ran: it was written into a recreated directory
            raise WorkdirRemoved(self.workdir, self.step, self.stop)

    def release(self) -> None:
        """Whatever happened: the best parameters' writer and the metrics closed; what a removed
        workdir's last writes recreated, removed again."""
        self.best.close()
        if self.workdir.tokenizer.exists():  # else the workdir was removed: nothing to flush there
            self.writer.close()
        elif self.workdir.removed():  # saves in flight, the last metrics: written after the removal, not kept
            checkpoint.settle(self.manager)
            self.workdir.forget_training()


def compile_train_step(config: ml_collections.ConfigDict, model, tx, mesh):
    """`train_step` jitted over the mesh: the state replicated (and donated), the batch's rows split."""
    step = functools.partial(
        train_step,
        model=model,
        tx=tx,
        schedule=optim.learning_rate_schedule(config),
        label_smoothing=config.label_smoothing,
        accum=config.grad_accum_steps,
        chunk=config.loss_chunk_tokens,
    )
    return jax.jit(
        step,
        in_shardings=(parallel.replicated(mesh), parallel.sharded_rows(mesh)),
        out_shardings=(parallel.replicated(mesh), parallel.replicated(mesh)),
        donate_argnums=(0,),
    )


def restore_or_start(config, workdir: paths.Workdir, model, tx, abstract_state, data_iterator, mesh, log):
    """(checkpoint manager, state, its step): the latest checkpoint (the data iterator moved to its
    position), or a fresh state; leftovers of saves that never finished are removed first."""
    if jax.process_index() == 0:
        checkpoint.remove_unfinished(workdir.checkpoints, log)
    manager = checkpoint.open_manager(workdir.checkpoints, config.keep_checkpoints)
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
    if workdir.logged():
        log(f"warning: {workdir} has metrics from an earlier run but no checkpoint: training starts from step 0")
    init = functools.partial(trainstate.create_state, model, tx, config.seed)
    return manager, jax.jit(init, out_shardings=parallel.replicated(mesh))(), 0


def describe(config, workdir: paths.Workdir, state, model, tokenizer, rows: int, start_step: int, log) -> None:
    """The model and the devices on the console, and in `W/run.json`."""
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    m = model.config
    log(
        f"model: N={m.num_layers} d_model={m.d_model} d_ff={m.d_ff} h={m.num_heads} d_k={m.d_k} d_v={m.d_v}, "
        f"{num_params:,} parameters, vocabulary {tokenizer.vocab_size:,}; {jax.device_count()} devices "
        f"({jax.devices()[0].platform}) in {jax.process_count()} process(es); "
        f"{rows} rows x {config.data.max_length} tokens per step in {config.grad_accum_steps} micro-batch(es)"
    )
    if jax.process_index() == 0:
        info = {
            "devices": jax.device_count(),
            "platform": jax.devices()[0].platform,
            "num_params": num_params,
            "processes": jax.process_count(),
            "rows_per_step": rows,
            "max_length": config.data.max_length,
            "tokens_per_batch": config.data.tokens_per_batch,
            "start_step": start_step,
        }
        paths.write_atomic(workdir.run_info, json.dumps(info, indent=2) + "\n")
    if start_step >= config.num_train_steps:
        log(f"{workdir} is already at step {start_step} of {config.num_train_steps}; nothing to train")


class Agreed(NamedTuple):
    """What every process decided together at a step."""

    save_for_time: bool  # checkpoint_every_minutes has passed
    stop: bool  # a signal (SIGTERM, Ctrl-C) or the time budget


def agree(config, step: int, stop: StopRequest, progress: Progress, *, time_due: bool, now: bool = False) -> Agreed:
    """The same decision on every process: several processes compare their flags every
    `AGREE_EVERY` steps or log steps (or `now`, a point every process reaches), so they always
    save and stop together, soon after a pre-emption notice."""
    flags = np.array([time_due, stop.signal is not None or progress.out_of_time()])
    if jax.process_count() > 1:
        if step % min(config.log_every_steps, AGREE_EVERY) and not now:
            return Agreed(False, False)
        flags = parallel.any_process(flags)
    return Agreed(bool(flags[0]), bool(flags[1]))


class Due(NamedTuple):
    """What a step does besides training."""

    log: bool
    dev_loss: bool
    dev_bleu: bool
    save: bool
    stop: bool


def what_is_due(config, step: int, agreed: Agreed, measures_bleu: bool) -> Due:
    """Log, evaluate on dev, save and stop, by the config's intervals (big_vision's `itstime`);
    the last step does everything, and a stop saves without waiting for a dev evaluation."""
    final = step == config.num_train_steps
    itstime = lambda every: (step % every == 0 and not agreed.stop) or final  # noqa: E731
    dev_loss = itstime(config.eval_every_steps)
    dev_bleu = measures_bleu and itstime(config.dev_bleu_every_steps)
    save = step % config.checkpoint_every_steps == 0 or final or agreed.save_for_time or agreed.stop
    log = step % config.log_every_steps == 0 or dev_loss or dev_bleu or save
    return Due(log, dev_loss, dev_bleu, save, agreed.stop)


def fetch(pending: list[dict], watch: DivergenceWatch, step: int, manager) -> tuple[dict[str, float], int]:
    """(per-token metrics of the pending steps, how many), fetched from the devices. A diverged
    loss at step F means the parameters after step F - 1 are bad: their checkpoints (and later
    ones) are removed, and the run stops with Diverged."""
    fetched = jax.device_get(pending)
    pending.clear()
    found = watch.first_bad([float(m["loss"]) / max(float(m["tokens"]), 1.0) for m in fetched])
    if found is not None:
        index, what = found
        first_bad = step - len(fetched) + 1 + index
        last_good = checkpoint.remove_from(manager, first_bad - 1)
        kept = f"the last good checkpoint (step {last_good}) is intact" if last_good else "no checkpoint was kept"
        raise Diverged(
            f"The training loss {what} at step {first_bad}; {kept}: lower learning_rate_scale or raise warmup_steps "
            "and resume."
        )
    return window_metrics(fetched), len(fetched)


def window_metrics(fetched: list[dict]) -> dict[str, float]:
    """Per-token loss, nll, perplexity and accuracy over steps' fetched metrics (their sums over
    their tokens, not a mean of per-step means), the last one's learning rate, the tokens."""
    sums = {k: sum(float(m[k]) for m in fetched) for k in optim.SUMS}
    return {**per_token(sums), "learning_rate": float(fetched[-1]["learning_rate"]), "tokens": sums["tokens"]}


def early_stop(config, best: checkpoint.Best, step: int, logged: dict, params, log) -> str:
    """Offer the parameters as the best by dev metric; why the run stops early ("" if it goes
    on): `early_stopping_patience` dev evaluations have passed without a better one."""
    best.offer(step, logged, params, log)
    return plateau(config, best, step)


def plateau(config, best: checkpoint.Best, step: int) -> str:
    """Why early stopping ends the run at `step` ("" if it goes on): `early_stopping_patience` dev
    evaluations have passed without a better one (better by `early_stopping_min_delta` of the last
    improvement, if set; at the last step the run ends anyway)."""
    patience = config.early_stopping_patience
    if patience and best.stale >= patience and step < config.num_train_steps:
        by = f" by {100 * config.early_stopping_min_delta:g}%" if config.early_stopping_min_delta else ""
        return f"no better {best.metric}{by} in {patience} dev evaluations (early stopping)"
    return ""


def main() -> int:
    p = cli.parser(__doc__, "fxformer.train")
    p.add_argument("--workdir", required=True, help="run directory: config, tokenizer, checkpoints, metrics")
    parallel.add_cluster_flags(p)
    stop = StopRequest()  # from the start: a pre-emption during data preparation is kept too
    args, config = cli.parse(p)
    paths.check_workdir(args.workdir)
    paths.check_writable(args.workdir, "the run's config, checkpoints and metrics are written")
    workdir = paths.Workdir(args.workdir)
    if config is None:  # resume a run with the config it was started with
        if not workdir.config.exists():
            raise UserError(f"Give --config=<config file>: {workdir} holds no run to resume.")
        config = load_workdir_config(workdir)
    parallel.join_cluster(args)
    log = parallel.print_once
    try:
        trained = train_and_evaluate(config, workdir, log=lambda *a, **k: log(*a, **k, flush=True), stop=stop)
    except StoppedBeforeTraining as e:
        if workdir.checkpoint_steps():
            log(f"{e}: nothing new to save; run the same command to resume", flush=True)
            return exitcodes.STOPPED
        raise UserError(f"{e}: nothing was kept; run the same command again to train.") from None
    if not trained.finished:
        return exitcodes.STOPPED  # a scheduler or a sweep can tell "run it again" from "done"
    return exitcodes.OK


if __name__ == "__main__":
    cli.run(main)
