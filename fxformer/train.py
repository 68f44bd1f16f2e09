"""Training: the pure `train_step`, and the loop that runs it on every device.

    python -m fxformer.train --config=configs/default.py --workdir=runs/default

The same command runs on a laptop, a GPU host or a TPU pod (add --distributed, or the
explicit --coordinator_address/--num_processes/--process_id). A workdir with checkpoints is
resumed, with the same data order. SIGTERM (a pre-emption notice) or Ctrl-C saves and exits
with status 75 (`fxformer.exitcodes.STOPPED`); a run that reached its last step exits 0.

Top to bottom: the pure step; the run's setup (stored token ids the pipeline packs, the model,
the state restored or new); the loop: train, what is due (log, evaluate on dev, save, stop),
evaluate, report, save. How a run begins and ends around the loop (resume, signals, divergence,
failed saves, a removed workdir) is `fxformer.lifecycle`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fxformer import checkpoint, cli, exitcodes, inference, lifecycle, metrics, optim, parallel, paths, trainstate
from fxformer.config import check_workdir_config, load_workdir_config, validate, write_workdir_config
from fxformer.data import corpora, pipeline, token_ids, tokenized
from fxformer.data.tokenizer import tokenizer_for
from fxformer.early import EarlyStopping
from fxformer.errors import UserError
from fxformer.lifecycle import StopRequest
from fxformer.metrics import MetricWriter, Progress, window_metrics
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
            dropout = jax.random.fold_in(rng, index)
            out = optim.loss_sums(params, micro_batch, model, label_smoothing, rng=dropout, chunk=chunk)
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


# ---------------------------------------------------------------------------------------------
# The run: what the loop is built with, and its bookkeeping


def prepare_data(config: ml_collections.ConfigDict, workdir: paths.Workdir, log=print):
    """(builder, tokenizer, folder of the token ids): process 0 builds the dataset, the tokenizer
    and the stored token ids while the others wait; then they find them."""
    with parallel.process_zero_first("fxformer: data prepared"):
        builder = corpora.prepare(config.data, log=log)
        tokenizer = tokenizer_for(config.data, builder, workdir, log=log)
        ids = token_ids(config.data, builder, tokenizer, log=log)
    return builder, tokenizer, ids


class Trained(NamedTuple):
    """A run's last state, and whether it is finished (its last step, or early stopping)."""

    state: TrainState
    finished: bool


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: paths.Workdir, log=print, stop: StopRequest | None = None
) -> Trained:
    """Train `config` in `workdir` until `num_train_steps`, resuming from its latest checkpoint.

    Everything up to the first step is checked before the run is recorded: a refused command
    leaves a workdir it found as it was, and one it would have created absent. Not finished: a
    signal or the time budget stopped the run, to be resumed."""
    with lifecycle.stop_requests(stop) as stop:
        validate(config, jax.default_backend(), jax.process_count())
        check_workdir_config(config, workdir)
        with lifecycle.refusal_leaves_nothing(workdir, stop):
            run, state, books = start(config, workdir, log, stop)
            with lifecycle.guarded(workdir, run.manager, stop, step=lambda: books.step, release=books.close):
                state = train_loop(run, state, books, stop, log)
    if run.lengths.overlong_pairs:
        log(f"length filter: {run.lengths.report(jax.process_count())}")
    return Trained(state, finished=books.step >= config.num_train_steps or bool(books.early))


class Run(NamedTuple):
    """What the loop is built with, once: the config, where it writes, its data and compiled steps."""

    config: ml_collections.ConfigDict
    workdir: paths.Workdir
    batches: parallel.GlobalBatches
    lengths: pipeline.LengthReport
    train_pairs: int  # in the training split, before the length filter
    train_step: Callable  # `compile_train_step`
    dev: inference.DevEvaluation
    manager: Any  # orbax's CheckpointManager of W/checkpoints


@dataclasses.dataclass
class Books:
    """The loop's bookkeeping from step to step."""

    step: int
    start_step: int
    writer: MetricWriter
    best: checkpoint.Best
    stopping: EarlyStopping
    watch: lifecycle.DivergenceWatch
    progress: Progress
    recorded: bool  # config.json says this run's config (a new run at once, a resume once it saved)
    pending: list = dataclasses.field(default_factory=list)  # metrics of steps not yet logged (device or host)
    last_save: float = dataclasses.field(default_factory=time.time)
    early: str = ""  # why early stopping ends the run ("": it goes on)

    @classmethod
    def start(cls, config: ml_collections.ConfigDict, workdir: paths.Workdir, start_step: int, vocab_size: int):
        """The books of a run that starts (or resumes) at `start_step`: its metrics so far count."""
        logged = metrics.logged(workdir, up_to=start_step)
        writer = MetricWriter(workdir, logged, start_step, enabled=jax.process_index() == 0)
        stopping = EarlyStopping.of(config, logged, start_step)
        return cls(
            step=start_step,
            start_step=start_step,
            writer=writer,
            best=checkpoint.Best(workdir.best, config.best_metric, start_step),
            stopping=stopping,
            early=stopping.reason(start_step),  # a resumed run that early stopping had ended
            watch=lifecycle.DivergenceWatch(config.divergence_factor, vocab_size, logged, start_step),
            progress=Progress(writer.last(), 60 * config.train_minutes),
            recorded=start_step == 0,
        )

    def stepped(self, step_metrics: dict, pairs: int) -> None:
        """A step was dispatched: its metrics pending (on the devices), its training pairs counted."""
        self.step += 1
        self.progress.pairs += pairs
        self.pending.append(step_metrics)
        if self.progress.window is None:  # the first step compiles; measure speed from the second on
            jax.block_until_ready(step_metrics)
            self.progress.first_step(self.step)

    def evaluated(self, logged: dict, params, log) -> None:
        """A dev evaluation at this step: its parameters kept if they are the best so far, and
        early stopping asked whether the run ends here (`fxformer.early`)."""
        self.best.offer(self.step, logged, params, log)
        self.early = self.stopping.observe(self.step, logged)

    def save_for_time(self, config: ml_collections.ConfigDict) -> bool:
        """Whether `checkpoint_every_minutes` have passed since the last save."""
        minutes = config.checkpoint_every_minutes
        return 0 < minutes <= (time.time() - self.last_save) / 60

    def close(self, removed: bool) -> None:
        """The best parameters' writer and the metrics closed (not the metrics of a removed workdir)."""
        self.best.close()
        if not removed:
            self.writer.close()


def start(config: ml_collections.ConfigDict, workdir: paths.Workdir, log, stop: StopRequest):
    """(Run, state, Books): data, model and compiled steps; the state restored from the last
    checkpoint or new; a new run recorded in W/config.json at once (a resume at its first save)."""
    mesh = parallel.data_mesh()
    builder, tokenizer, ids = prepare_data(config, workdir, log)
    train_split = tokenized.load(ids, config.data.train_split)
    pipeline.check_lengths(train_split, config.data, log)
    model, tx, abstract_state = trainstate.build(config, tokenizer.vocab_size, mesh)
    rows = pipeline.rows_per_step(config.data, jax.device_count(), config.grad_accum_steps)
    train_ds, lengths = pipeline.train_dataset(
        ids, config.data, rows, config.data.shuffle_seed, jax.process_index(), process_count=jax.process_count()
    )
    batches = parallel.GlobalBatches(mesh, iter(train_ds), config.data.device_prefetch, rows)
    dev = inference.DevEvaluation.of(config, model, mesh, (builder, tokenizer, ids), log=log)
    fresh = trainstate.fresh_state(model, tx, config.seed, parallel.replicated(mesh))  # where no checkpoint is
    if workdir.imported.exists():  # fine-tuning an imported model (`fxformer.importing`): its parameters first
        params = lambda: checkpoint.imported_params(workdir, abstract_state.params)  # noqa: E731
        fresh = trainstate.imported_state(fresh, tx, params)
    manager, state, start_step = lifecycle.restore_or_start(config, workdir, abstract_state, batches, fresh, log=log)
    stop.training()
    info = lifecycle.describe(
        config, state, model, vocab_size=tokenizer.vocab_size, rows=rows, start_step=start_step, log=log
    )
    if jax.process_index() == 0:
        if start_step == 0:  # a new run is recorded now
            write_workdir_config(config, workdir)
        paths.write_atomic(workdir.run_info, json.dumps(info, indent=2) + "\n")
    books = Books.start(config, workdir, start_step, tokenizer.vocab_size)
    train_step = compile_train_step(config, model, tx, mesh)
    run = Run(config, workdir, batches, lengths, len(train_split), train_step=train_step, dev=dev, manager=manager)
    return run, state, books


# ---------------------------------------------------------------------------------------------
# The loop


def train_loop(run: Run, state: TrainState, books: Books, stop: StopRequest, log) -> TrainState:
    """Train until the last step, early stopping, or a stop (saved first): each step trains on a
    global batch, then does what is due (log, evaluate on dev, save, stop), as every process agreed."""
    config = run.config
    if not ready_to_train(run, state, books, stop, log):
        return state
    while books.step < config.num_train_steps:
        local, batch = next(run.batches)
        pairs = pipeline.pairs_in(local) * jax.process_count()  # the processes read equal shares
        state, step_metrics = run.train_step(state, batch)
        books.stepped(step_metrics, pairs)

        agreed = lifecycle.agree(config, books.step, stop, books.progress, time_due=books.save_for_time(config))
        due = what_is_due(config, books.step, agreed, measures_bleu=run.dev.bleu is not None)
        if due.log:
            lifecycle.check_present(run.workdir)
        logged, steps = fetch(books, run.manager) if due.log else ({}, 0)  # a diverged loss stops the run here
        if due.dev_loss or due.dev_bleu:
            logged.update(run.dev(state.params, loss=due.dev_loss, bleu=due.dev_bleu))
            books.evaluated(logged, state.params, log)
            if books.early:
                due = due._replace(save=True, stop=True)

        report(run, books, logged, steps, log)
        save(run, books, state, due, logged)
        if due.stop:
            checkpoint.wait(run.manager)
            why = lifecycle.stopped_by(books.early, stop, books.progress)
            log(f"{why}: saved step {books.step} to {run.workdir.checkpoints}; exiting")
            return state
    return state


def ready_to_train(run: Run, state: TrainState, books: Books, stop: StopRequest, log) -> bool:
    """A resumed run first makes up the dev evaluation its stop passed over (`make_up_evaluation`);
    False where there is nothing to train: early stopping had ended the run, or a signal came while
    it prepared (a time budget spent preparing still lets one step train and save: resumes move on)."""
    make_up_evaluation(run, state.params, books, log)
    if books.early:  # a resumed run that early stopping had ended
        log(f"{run.workdir} ended at step {books.step}: {books.early}; nothing to train")
        return False
    if books.step >= run.config.num_train_steps:
        log(f"{run.workdir} is already at step {books.step} of {run.config.num_train_steps}; nothing to train")
        return False
    now = lifecycle.agree(run.config, books.step, stop, books.progress, time_due=False, now=True, budget=False)
    if now.stop:
        log(f"{stop.name} before the first step: nothing new to save; exiting")
        return False
    return True


def make_up_evaluation(run: Run, params, books: Books, log) -> None:
    """A stop on an evaluation step saves without evaluating (`what_is_due`): the resumed run
    evaluates that step first, so that metrics.jsonl, the best parameters and early stopping
    count every evaluation an uninterrupted run would. Every process decides alike, from the
    metrics file."""
    step, config = books.step, run.config
    lines = [line for line in books.writer.logged() if line["step"] == step] if step else []
    if not lines:
        return
    line = lines[-1]
    dev_loss = step % config.eval_every_steps == 0 and "dev_loss" not in line
    dev_bleu = run.dev.bleu is not None and step % config.dev_bleu_every_steps == 0 and "dev_bleu" not in line
    if not (dev_loss or dev_bleu):
        return
    logged = run.dev(params, loss=dev_loss, bleu=dev_bleu)
    books.evaluated(logged, params, log)
    books.writer.amend(step, logged)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in logged.items() if k in ("dev_ppl", "dev_bleu"))
    log(f"step {step}: the dev evaluation its stop passed over, made up: {shown}")


class Due(NamedTuple):
    """What a step does besides training."""

    log: bool
    dev_loss: bool
    dev_bleu: bool
    save: bool
    stop: bool


def what_is_due(config: ml_collections.ConfigDict, step: int, agreed: lifecycle.Agreed, measures_bleu: bool) -> Due:
    """Log, evaluate on dev, save and stop, by the config's intervals (big_vision's `itstime`);
    the last step does everything, and a stop saves without waiting for a dev evaluation."""
    final = step == config.num_train_steps
    itstime = lambda every: (step % every == 0 and not agreed.stop) or final  # noqa: E731
    dev_loss = itstime(config.eval_every_steps)
    dev_bleu = measures_bleu and itstime(config.dev_bleu_every_steps)
    save = step % config.checkpoint_every_steps == 0 or final or agreed.save_for_time or agreed.stop
    log = step % config.log_every_steps == 0 or dev_loss or dev_bleu or save
    return Due(log, dev_loss, dev_bleu, save, agreed.stop)


def fetch(books: Books, manager) -> tuple[dict[str, float], int]:
    """(per-token metrics of the pending steps, how many), fetched from the devices; a diverged
    loss among them stops the run (`DivergenceWatch.check`)."""
    fetched = jax.device_get(books.pending)
    books.pending.clear()
    books.watch.check([float(m["loss"]) / max(float(m["tokens"]), 1.0) for m in fetched], books.step, manager)
    return window_metrics(fetched), len(fetched)


def report(run: Run, books: Books, logged: dict[str, float], steps: int, log) -> None:
    """The metrics file, and the console line when due."""
    if logged:
        epoch = pipeline.epoch_size(run.train_pairs, run.lengths)
        books.writer.write(books.step, books.progress.record(logged, steps, epoch))
    if books.progress.console_due(bool(logged)):
        shown = logged
        if not logged:  # the steps since the last log step: the window the next log line averages (one
            # step's loss would jump at each log line); waits for the step, so the speed is real. Kept on
            # the host: fetch() does not copy them again.
            books.pending[:] = jax.device_get(books.pending)
            shown = window_metrics(books.pending)
        log(books.progress.line(books.step, run.config.num_train_steps, shown))


def save(run: Run, books: Books, state: TrainState, due: Due, logged: dict[str, float]) -> None:
    """A checkpoint when due (a resumed run's config recorded at its first); on another log step,
    a failed background save stops the run now, not at the next save."""
    if due.save:
        checkpoint.save(run.manager, books.step, state, run.batches)
        books.last_save = time.time()
        if not books.recorded and jax.process_index() == 0:
            write_workdir_config(run.config, run.workdir, books.start_step)
            books.recorded = True
    elif logged:
        checkpoint.check(run.manager)


def main() -> int:
    p = cli.parser(__doc__, "fxformer.train")
    p.add_argument("--workdir", required=True, help="run directory: config, tokenizer, checkpoints, metrics")
    parallel.add_cluster_flags(p)
    stop = StopRequest()  # from the start: a pre-emption during data preparation is kept too
    args, config = cli.parse(p)
    workdir = cli.workdir(args.workdir)
    paths.check_writable(workdir, "the run's config, checkpoints and metrics are written")
    if config is None:  # resume a run with the config it was started with
        if not workdir.config.exists():
            raise UserError(f"Give --config=<config file>: {workdir} holds no run to resume.")
        config = load_workdir_config(workdir)
    parallel.join_cluster(args)
    log = parallel.print_once
    try:
        trained = train_and_evaluate(config, workdir, log=lambda *a, **k: log(*a, **k, flush=True), stop=stop)
    except lifecycle.StoppedBeforeTraining as e:
        if workdir.checkpoint_steps():
            log(f"{e}: nothing new to save; run the same command to resume", flush=True)
            return exitcodes.STOPPED
        raise UserError(f"{e}: nothing was kept; run the same command again to train.") from None
    return exitcodes.OK if trained.finished else exitcodes.STOPPED  # a scheduler tells "run it again" from "done"


if __name__ == "__main__":
    cli.run(main)
