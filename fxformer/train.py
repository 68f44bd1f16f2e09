"""Training: pure `train_step` / `eval_step`, and the loop that runs them on every device.

    python -m fxformer.train --config=configs/default.py --workdir=runs/default

The same command runs on a laptop, a GPU host or a TPU pod (add --distributed, or the
explicit --coordinator_address/--num_processes/--process_id). A workdir with checkpoints is
resumed, with the same data order. SIGTERM (a pre-emption notice) or Ctrl-C saves and exits
with status 75 (`fxformer.exitcodes.STOPPED`); a run that reached its last step exits 0.
"""

from __future__ import annotations

import functools
import json
import math
import signal
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from fxformer import checkpoint, cli, exitcodes, inference, optim, parallel, paths
from fxformer.data import corpora, pipeline, tokenizer_for
from fxformer.metrics import MetricWriter, duration, per_token
from fxformer.model import Transformer, TransformerConfig
from fxformer.tokens import PAD_ID

# ---------------------------------------------------------------------------------------------
# State and pure steps


@flax.struct.dataclass
class TrainState:
    """Everything a step changes, plus the run's RNG key (dropout keys are folded from it)."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def create_state(model: Transformer, tx: optax.GradientTransformation, seed: int) -> TrainState:
    """Xavier-initialised parameters and fresh Adam moments."""
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    tokens = jnp.ones((1, 8), jnp.int32)
    params = model.init(init_key, tokens, tokens)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_key)


def loss_sums(params, batch: dict, model: Transformer, label_smoothing: float, rng=None) -> dict[str, jax.Array]:
    """Summed label-smoothed loss, NLL and accuracy of a batch, packed (segment ids) or padded."""
    packed = "inputs_segment_ids" in batch
    logits = model.apply(
        {"params": params},
        batch["inputs"],
        batch["targets"],
        inputs_segmentation=batch["inputs_segment_ids"] if packed else None,
        targets_segmentation=batch["targets_segment_ids"] if packed else None,
        inputs_positions=batch["inputs_positions"] if packed else None,
        targets_positions=batch["targets_positions"] if packed else None,
        deterministic=rng is None,
        rngs={"dropout": rng} if rng is not None else None,
    )
    weights = (batch["targets"] != PAD_ID).astype(jnp.float32)
    if "example_mask" in batch:
        weights = weights * batch["example_mask"][:, None]
    return optim.cross_entropy_sums(logits, batch["targets"], weights, label_smoothing)


def train_step(
    state: TrainState, batch: dict, rng: jax.Array, *, model, tx, schedule, label_smoothing: float, accum: int
) -> tuple[TrainState, dict]:
    """One optimizer step on a global batch, in `accum` micro-batches: (state, batch, rng) -> (state, metrics).

    Gradients of the summed loss are added over micro-batches (and, by XLA, over devices),
    then divided by the number of target tokens: the mean over the whole global batch.
    """

    def micro(x):  # [rows, ...] -> [accum, rows / accum, ...], keeping each device's rows local
        return x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)

    def accumulate(carry, inputs):
        grads_sum, sums = carry
        micro_batch, index = inputs

        def loss_fn(params):
            out = loss_sums(params, micro_batch, model, label_smoothing, jax.random.fold_in(rng, index))
            return out["loss"], out

        grads, out = jax.grad(loss_fn, has_aux=True)(state.params)
        return (jax.tree.map(jnp.add, grads_sum, grads), jax.tree.map(jnp.add, sums, out)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    sums = {k: jnp.zeros((), jnp.float32) for k in ("loss", "nll", "correct", "tokens")}
    micro_batches = (jax.tree.map(micro, batch), jnp.arange(accum))
    (grads, sums), _ = jax.lax.scan(accumulate, (zeros, sums), micro_batches)
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    return new_state, {**sums, "learning_rate": schedule(state.step)}


def eval_step(params, batch: dict, *, model, label_smoothing: float) -> dict[str, jax.Array]:
    """Summed loss / NLL / accuracy over the real tokens of a padded eval batch (no dropout)."""
    return loss_sums(params, batch, model, label_smoothing)


# ---------------------------------------------------------------------------------------------
# Setup shared with evaluation


def check_config(config: ml_collections.ConfigDict) -> None:
    """Refuse, in one sentence, values the loop or the pipeline cannot run with."""
    at_least = {
        "num_train_steps": 0, "log_every_steps": 1, "eval_every_steps": 1, "checkpoint_every_steps": 1,
        "keep_checkpoints": 0, "grad_accum_steps": 1, "warmup_steps": 1, "eval_batches": 0, "beam_size": 1,
        "max_decode_extra": 0, "average_last": 1, "checkpoint_every_minutes": 0, "alpha": 0,
        "divergence_factor": 0, "train_minutes": 0, "early_stopping_patience": 0,
        "data.max_length": 2, "data.tokens_per_batch": 1, "data.eval_batch_size": 1, "data.num_shards": 0,
        "data.vocab_size": 8, "data.tokenizer_sentences": 1,
    }  # fmt: skip
    for key, low in at_least.items():
        section, _, leaf = key.rpartition(".")
        node = config[section] if section else config
        if leaf not in node:  # a field added since an older workdir's config.json was written
            continue
        value = node[leaf]
        if value < low:
            raise cli.UserError(f"{key} must be at least {low}, not {value}.")
    if not 0 <= config.label_smoothing < 1:
        raise cli.UserError(f"label_smoothing must be in [0, 1), not {config.label_smoothing}.")
    if config.data.overlong not in ("drop", "truncate"):
        raise cli.UserError(f"data.overlong must be 'drop' or 'truncate', not {config.data.overlong!r}.")
    if config.model.max_len < config.data.max_length:
        raise cli.UserError(
            f"model.max_len ({config.model.max_len}) must cover data.max_length ({config.data.max_length})."
        )
    if config.data.source_lang == config.data.target_lang:
        raise cli.UserError(
            f"data.source_lang and data.target_lang are both {config.data.source_lang!r}; "
            "a translation needs two different languages."
        )
    if not (math.isfinite(config.learning_rate_scale) and config.learning_rate_scale > 0):
        raise cli.UserError(f"learning_rate_scale must be a positive number, not {config.learning_rate_scale}.")
    for key in ("adam_b1", "adam_b2"):
        if not 0 <= config[key] < 1:
            raise cli.UserError(f"{key} must be in [0, 1), not {config[key]}.")
    if not config.adam_eps > 0:
        raise cli.UserError(f"adam_eps must be positive, not {config.adam_eps}.")
    metrics = ("", "dev_ppl", "dev_loss", "dev_nll", "dev_accuracy", "dev_bleu")
    if config.get("best_metric", "") not in metrics:
        raise cli.UserError(f"best_metric must be one of {', '.join(map(repr, metrics))}, not {config.best_metric!r}.")
    if config.get("dev_bleu_every_steps", 0) < 0 or config.get("dev_bleu_sentences", 0) < 0:
        raise cli.UserError("dev_bleu_every_steps and dev_bleu_sentences must be 0 or more.")
    if config.get("best_metric") == "dev_bleu" and not config.get("dev_bleu_every_steps", 0):
        raise cli.UserError("best_metric=dev_bleu needs dev BLEU during training: set dev_bleu_every_steps, e.g. 5000.")
    TransformerConfig.from_config(config.model, config.data.vocab_size)  # the model's own checks, before any write


def load_workdir_config(workdir: paths.PathLike) -> ml_collections.ConfigDict:
    """The resolved config a run wrote into its workdir."""
    path = paths.Workdir(workdir).config
    paths.check_workdir(workdir)
    if not path.exists():
        raise cli.UserError(f"{workdir} has no config.json; is it a training workdir?")
    try:
        loaded = json.loads(path.read_text())
        if not isinstance(loaded, dict) or "model" not in loaded:
            raise ValueError("not a config")
    except (ValueError, UnicodeDecodeError) as e:
        raise cli.UserError(
            f"{path} is damaged ({type(e).__name__}); write it again by training with the run's --config."
        ) from None
    return ml_collections.ConfigDict(loaded)


def write_workdir_config(config: ml_collections.ConfigDict, workdir: paths.PathLike) -> None:
    """Record the resolved config; refuse a workdir whose model differs from the config's."""
    paths.check_workdir(workdir)
    path = paths.Workdir(workdir).config
    if path.exists():
        old = load_workdir_config(workdir).to_dict()
        new = json.loads(config.to_json())
        changed = [k for k in set(old["model"]) | set(new["model"]) if old["model"].get(k) != new["model"].get(k)]
        if changed:
            raise cli.UserError(
                f"{workdir} holds a model with a different model.{changed[0]} "
                f"({old['model'].get(changed[0])} vs {new['model'].get(changed[0])}); use a new --workdir."
            )
    if jax.process_index() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(path, config.to_json(indent=2))  # other processes read the old file or the new one


def prepare_data(config: ml_collections.ConfigDict, workdir: paths.PathLike, log=print):
    """(builder, tokenizer): process 0 builds the dataset and tokenizer, the others wait and load them."""
    if jax.process_index() == 0:
        builder = corpora.prepare(config.data, log=log)
        tokenizer_for(config.data, builder, workdir, log=log)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("fxformer: data prepared")
    builder = corpora.prepare(config.data, log=log)
    return builder, tokenizer_for(config.data, builder, workdir, log=log)


def build(config: ml_collections.ConfigDict, vocab_size: int, mesh):
    """(model, tx, abstract state placed on the mesh, jitted eval step)."""
    model = Transformer(TransformerConfig.from_config(config.model, vocab_size))
    tx = optim.optimizer(config)
    shapes = jax.eval_shape(functools.partial(create_state, model, tx, config.seed))
    abstract_state = checkpoint.abstract_like(shapes, parallel.replicated(mesh))
    p_eval_step = jax.jit(
        functools.partial(eval_step, model=model, label_smoothing=config.label_smoothing),
        in_shardings=(parallel.replicated(mesh), parallel.sharded_rows(mesh)),
        out_shardings=parallel.replicated(mesh),
    )
    return model, tx, abstract_state, p_eval_step


def evaluate_loss(
    p_eval_step, params, examples: list[dict], config, mesh, max_len: int, prefix: str = ""
) -> dict[str, float]:
    """Per-token loss, NLL, perplexity and accuracy over `examples`, each counted once."""
    length = pipeline.eval_length(examples, max_len)
    totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
    batches = pipeline.eval_batches(
        examples,
        parallel.round_to_devices(config.data.eval_batch_size),
        length,
        jax.process_index(),
        jax.process_count(),
    )
    for batch in batches:
        batch.pop("index")
        sums = jax.device_get(p_eval_step(params, parallel.global_batch(mesh, batch)))
        for key in totals:
            totals[key] += float(sums[key])
    return per_token(totals, prefix)


# ---------------------------------------------------------------------------------------------
# The loop


AGREE_EVERY = 10  # steps between the processes' stop/save agreements (a tiny collective)


class Diverged(cli.UserError):
    """The loss stopped being finite, or exploded (`DivergenceWatch`)."""


class DivergenceWatch:
    """Tells a diverged training loss from a healthy one, step by step.

    Diverged: not finite; or, with `factor` > 0, above `factor` x the best loss of this run and
    2 nats above it, or above 3 x ln(vocabulary) (three times a uniform guess), which catches a
    run that explodes from its first steps.
    """

    def __init__(self, factor: float, vocab_size: int):
        self.factor, self.best = factor, math.inf
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


class StopRequest:
    """Set by SIGTERM (a pre-emption notice) or a first Ctrl-C: save at the next agreed step and stop.

    Installed at the start of a command, so a signal during data preparation or compilation is
    kept too; a second Ctrl-C interrupts at once.
    """

    def __init__(self):
        self.signal: int | None = None
        self.early = ""  # why training stopped early by itself (early stopping): then the run is done
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signal == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else ""

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: paths.PathLike, log=print, stop: StopRequest | None = None
) -> TrainState:
    """Train `config` in `workdir` until `num_train_steps`, resuming from its latest checkpoint.

    Returns the last state; its step is below `num_train_steps` if a signal stopped the run.
    """
    own_stop = stop is None
    stop = stop or StopRequest()
    try:
        return _train(config, paths.Workdir(workdir), log, stop)
    finally:
        if own_stop:
            stop.restore()


def _train(config: ml_collections.ConfigDict, workdir: paths.Workdir, log, stop: StopRequest) -> TrainState:
    check_config(config)
    write_workdir_config(config, workdir)
    mesh = parallel.data_mesh()
    builder, tokenizer = prepare_data(config, workdir, log)
    model, tx, abstract_state, p_eval_step = build(config, tokenizer.vocab_size, mesh)
    schedule = optim.learning_rate_schedule(config)
    accum = config.grad_accum_steps
    p_train_step = jax.jit(
        functools.partial(
            train_step, model=model, tx=tx, schedule=schedule, label_smoothing=config.label_smoothing, accum=accum
        ),
        in_shardings=(parallel.replicated(mesh), parallel.sharded_rows(mesh), parallel.replicated(mesh)),
        out_shardings=(parallel.replicated(mesh), parallel.replicated(mesh)),
        donate_argnums=(0,),
    )

    rows = pipeline.rows_per_step(config.data, jax.device_count(), accum)
    train_source = corpora.data_source(builder, config.data.train_split)
    train_ds, length_filter = pipeline.train_dataset(
        train_source, tokenizer, config.data, rows, config.data.shuffle_seed, jax.process_index(), jax.process_count()
    )
    data_iterator = iter(train_ds)
    dev_limit = config.eval_batches * config.data.eval_batch_size
    dev_source = corpora.data_source(builder, config.data.eval_split)
    dev_examples = pipeline.tokenize_split(dev_source, tokenizer, config.data, dev_limit)
    bleu_every = config.get("dev_bleu_every_steps", 0)  # older configs lack it
    dev_bleu = inference.DevBleu(model, mesh, config, dev_source, tokenizer, log) if bleu_every else None

    if jax.process_index() == 0:
        checkpoint.remove_unfinished(workdir.checkpoints, log)
    mngr = checkpoint.manager(workdir.checkpoints, config.keep_checkpoints)
    start_step = mngr.latest_step() or 0
    if start_step:
        state = checkpoint.restore(mngr, start_step, abstract_state, data_iterator)
        log(f"resumed from {workdir.checkpoints / str(start_step)}")
    else:
        if workdir.metrics.exists() and workdir.metrics.read_text().strip():
            log(f"warning: {workdir} has metrics from an earlier run but no checkpoint: training starts from step 0")
        init = jax.jit(functools.partial(create_state, model, tx, config.seed), out_shardings=parallel.replicated(mesh))
        state = init()
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    m = model.config
    log(
        f"model: N={m.num_layers} d_model={m.d_model} d_ff={m.d_ff} h={m.num_heads} d_k={m.d_k} d_v={m.d_v}, "
        f"{num_params:,} parameters, vocabulary {tokenizer.vocab_size:,}; {jax.device_count()} devices "
        f"({jax.devices()[0].platform}) in {jax.process_count()} process(es); "
        f"{rows} rows x {config.data.max_length} tokens per step in {accum} micro-batch(es)"
    )
    if jax.process_index() == 0:
        info = {"devices": jax.device_count(), "platform": jax.devices()[0].platform, "num_params": num_params,
                "processes": jax.process_count(), "rows_per_step": rows, "max_length": config.data.max_length,
                "tokens_per_batch": config.data.tokens_per_batch, "start_step": start_step}  # fmt: skip
        paths.write_atomic(workdir.run_info, json.dumps(info, indent=2) + "\n")
    writer = MetricWriter(workdir, start_step, enabled=jax.process_index() == 0)
    best = checkpoint.Best(workdir.best, config.get("best_metric", "dev_ppl"), start_step)
    if start_step >= config.num_train_steps:
        log(f"{workdir} is already at step {start_step} of {config.num_train_steps}; nothing to train")

    pending: list[dict] = []  # device metrics of steps not yet logged
    watch = DivergenceWatch(config.get("divergence_factor", 4.0), tokenizer.vocab_size)  # older configs lack it

    def flush(step: int) -> dict[str, float]:
        """Fetch pending metrics. A diverged loss at step F means the parameters after step
        F - 1 are bad: their checkpoints (and later ones) are removed, and the run stops."""
        fetched = jax.device_get(pending)
        pending.clear()
        found = watch.first_bad([float(m["loss"]) / max(float(m["tokens"]), 1.0) for m in fetched])
        if found is not None:
            index, what = found
            first_bad = step - len(fetched) + 1 + index
            checkpoint.wait(mngr)
            for saved in mngr.all_steps():
                if saved >= first_bad - 1:
                    mngr.delete(saved)
            last_good = mngr.latest_step()
            kept = f"the last good checkpoint (step {last_good}) is intact" if last_good else "no checkpoint was kept"
            raise Diverged(
                f"The training loss {what} at step {first_bad}; {kept}: "
                "lower learning_rate_scale or raise warmup_steps and resume."
            )
        sums = {k: sum(float(m[k]) for m in fetched) for k in ("loss", "nll", "correct", "tokens")}
        return {**per_token(sums), "learning_rate": float(fetched[-1]["learning_rate"]), "tokens": sums["tokens"]}

    def agree(step: int, time_due: bool, now: bool = False) -> tuple[bool, bool]:
        """(save for time, stop for a signal), the same on every process: several processes compare
        their flags every `AGREE_EVERY` steps or log steps (or `now`, a point every process
        reaches), so they always save and stop together, soon after a pre-emption notice."""
        flags = np.array([time_due, stop.signal is not None or out_of_time()])
        if jax.process_count() > 1:
            if step % min(config.log_every_steps, AGREE_EVERY) and not now:
                return False, False
            flags = multihost_utils.process_allgather(flags).reshape(-1, 2).any(axis=0)
        return bool(flags[0]), bool(flags[1])

    budget_s = 60 * config.get("train_minutes", 0.0)  # older configs lack it
    started = time.time()
    out_of_time = lambda: 0 < budget_s <= time.time() - started  # noqa: E731

    step = start_step
    last_save = last_console = time.time()
    window = None  # (time, step) of the previous console line: the speed shown is recent, not cumulative
    tokens = {"seen": 0.0, "steps": 0}  # target tokens over logged steps, for tokens/s
    earlier = writer.last()  # what the run had done before this attempt (metrics.jsonl up to start_step)
    tokens_before, wall_before = earlier.get("tokens_seen", 0.0), earlier.get("wall_s", 0.0)
    pairs = {"seen": 0, "total": len(train_source)}  # training pairs consumed, for epochs
    epochs_before = earlier.get("epochs", 0.0)
    if step < config.num_train_steps and agree(step, False, now=True)[1]:  # during data preparation or compiling
        log(f"{stop.name} before the first step: nothing new to save; exiting")
        step = config.num_train_steps  # skip the loop; the returned state is the checkpoint's
    try:
        while step < config.num_train_steps:
            local = next(data_iterator)
            pairs["seen"] += pairs_in(local) * jax.process_count()  # the processes read equal shares
            rng = jax.random.fold_in(state.rng, step)
            state, metrics = p_train_step(state, parallel.global_batch(mesh, local), rng)
            step += 1
            pending.append(metrics)
            if window is None:  # the first step compiles; measure speed from the second on
                jax.block_until_ready(metrics)
                window = (time.time(), step)

            final = step == config.num_train_steps
            minutes = config.checkpoint_every_minutes
            time_due, stopping = agree(step, 0 < minutes <= (time.time() - last_save) / 60)
            save_now = step % config.checkpoint_every_steps == 0 or final or time_due or stopping
            evaluate_now = (step % config.eval_every_steps == 0 and not stopping) or final  # a stop does not wait
            bleu_due = dev_bleu is not None and ((step % bleu_every == 0 and not stopping) or final)
            logged = {}
            if step % config.log_every_steps == 0 or evaluate_now or bleu_due or save_now:  # never save unchecked
                tokens["steps"] += len(pending)
                logged = flush(step)
                tokens["seen"] += logged["tokens"]
            if evaluate_now:
                max_len = model.config.max_len
                logged.update(evaluate_loss(p_eval_step, state.params, dev_examples, config, mesh, max_len, "dev_"))
            if bleu_due:
                logged["dev_bleu"] = dev_bleu(state.params)
            if evaluate_now or bleu_due:
                best.offer(step, logged, state.params, log)
                patience = config.get("early_stopping_patience", 0)
                if patience and best.stale >= patience and not final:
                    stop.early = f"no better {best.metric} in {patience} dev evaluations (early stopping)"
                    save_now = stopping = True
            if logged:
                logged["tokens_seen"] = tokens_before + tokens["seen"]
                logged["wall_s"] = round(wall_before + time.time() - started, 1)
                logged["epochs"] = round(epochs_before + pairs["seen"] / kept_pairs(pairs["total"], length_filter), 4)
                writer.write(step, {k: v for k, v in logged.items() if k != "tokens"})
            if logged or time.time() - last_console >= 5.0:  # a console line every few seconds, and at every log
                shown = logged or per_token_step(pending[-1])  # waits for the step: the speed is real
                now = last_console = time.time()
                tokens_per_step = tokens["seen"] / max(tokens["steps"], 1)
                budget_left = budget_s - (now - started) if budget_s else None
                log(console_line(step, config.num_train_steps, shown, window, tokens_per_step, now, budget_left))
                window = (now, step) if window and step > window[1] else window
            if save_now:
                checkpoint.save(mngr, step, state, data_iterator)
                last_save = time.time()
            elif logged:
                checkpoint.check(mngr)  # a failed background save stops the run now, not at the next save
            if stopping:
                checkpoint.wait(mngr)
                reason = (
                    stop.early or stop.name or (f"time budget of {budget_s / 60:g} minutes" if out_of_time() else "")
                )
                reason = reason or "a signal to another process"
                log(f"{reason}: saved step {step} to {workdir.checkpoints}; exiting")
                break
    except BaseException:
        checkpoint.close(mngr, failing=True)
        raise
    else:
        checkpoint.close(mngr)
    finally:
        best.close()
        writer.close()
    if length_filter.overlong_pairs:
        log(f"length filter: {length_filter.report()}")
    return state


def pairs_in(batch: dict) -> int:
    """Sentence pairs in a packed batch: each row numbers its pairs 1, 2, ... in its segment ids."""
    return int(batch["targets_segment_ids"].max(axis=1).sum())


def kept_pairs(total: int, length_filter) -> float:
    """Training pairs in one epoch: the split's pairs less those the length filter drops (the
    share dropped so far estimates the share of the whole split)."""
    if length_filter.overlong != "drop" or not length_filter.seen:
        return float(max(total, 1))
    return max(total * (1 - length_filter.overlong_pairs / length_filter.seen), 1.0)


def per_token_step(metrics: dict) -> dict[str, float]:
    """Per-token values of one step's device metrics (a sync: only for the console)."""
    fetched = {k: float(v) for k, v in jax.device_get(metrics).items()}
    return {**per_token(fetched), "learning_rate": fetched["learning_rate"]}


def console_line(step, total, m, window, tokens_per_step, now, budget_left=None) -> str:
    """step, loss, perplexity, learning rate, tokens/s, steps/s and ETA (to the last step, or to the
    end of the time budget if that comes first) on one line."""
    parts = [f"step {step}/{total}"]
    if "loss" in m:
        parts += [f"loss {m['loss']:.3f}", f"ppl {m['ppl']:.2f}", f"lr {m['learning_rate']:.2e}"]
    if "dev_ppl" in m:
        parts += [f"dev loss {m['dev_loss']:.3f}", f"dev ppl {m['dev_ppl']:.3f}"]
    if "dev_bleu" in m:
        parts.append(f"dev BLEU {m['dev_bleu']:.2f}")
    since, since_step = window or (now, step)  # speed since the previous console line
    elapsed = now - since
    if elapsed > 0 and step > since_step:
        steps_per_s = (step - since_step) / elapsed
        if tokens_per_step:
            parts.append(f"{tokens_per_step * steps_per_s:,.0f} tgt tok/s")
        parts.append(f"{steps_per_s:.2f} steps/s")
        eta = (total - step) / steps_per_s
        if budget_left is not None and budget_left < eta:
            parts.append(f"time budget ends in {duration(max(budget_left, 0))} (ETA {duration(eta)})")
        else:
            parts.append(f"ETA {duration(eta)}")
    return " | ".join(parts)


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
            raise cli.UserError(f"Give --config=<config file>: {workdir} holds no run to resume.")
        config = load_workdir_config(workdir)
    parallel.join_cluster(args)
    log = print if jax.process_index() == 0 else (lambda *a, **k: None)
    state = train_and_evaluate(config, workdir, log=lambda *a, **k: log(*a, **k, flush=True), stop=stop)
    if int(state.step) < config.num_train_steps and not stop.early:
        return exitcodes.STOPPED  # a scheduler or a sweep can tell "run it again" from "done"
    return exitcodes.OK


if __name__ == "__main__":
    cli.run(main)
