"""Training: pure `train_step` / `eval_step`, and the loop that runs them on every device.

    python -m fxformer.train --config=configs/default.py --workdir=runs/default

The same command runs on a laptop, a GPU host or a TPU pod (add --distributed, or the
explicit --coordinator_address/--num_processes/--process_id). A workdir with checkpoints is
resumed, with the same data order; SIGTERM saves and exits 0.
"""

from __future__ import annotations

import functools
import json
import math
import signal
import time
from pathlib import Path
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from fxformer import checkpoint, cli, optim, parallel
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


def load_workdir_config(workdir: Path) -> ml_collections.ConfigDict:
    """The resolved config a run wrote into its workdir."""
    path = Path(workdir) / "config.json"
    if not path.exists():
        raise cli.UserError(f"{workdir} has no config.json; is it a training workdir?")
    return ml_collections.ConfigDict(json.loads(path.read_text()))


def write_workdir_config(config: ml_collections.ConfigDict, workdir: Path) -> None:
    """Record the resolved config; refuse a workdir whose model differs from the config's."""
    path = Path(workdir) / "config.json"
    if path.exists():
        old = json.loads(path.read_text())
        new = json.loads(config.to_json())
        changed = [k for k in set(old["model"]) | set(new["model"]) if old["model"].get(k) != new["model"].get(k)]
        if changed:
            raise cli.UserError(
                f"{workdir} holds a model with a different model.{changed[0]} "
                f"({old['model'].get(changed[0])} vs {new['model'].get(changed[0])}); use a new --workdir."
            )
    if jax.process_index() == 0:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        path.write_text(config.to_json(indent=2))


def prepare_data(config: ml_collections.ConfigDict, workdir: Path, log=print):
    """(builder, tokenizer): process 0 builds the dataset and tokenizer, the others wait and load them."""
    if jax.process_index() == 0:
        builder = corpora.prepare(config.data, log=log)
        tokenizer_for(config.data, builder, workdir, log=log)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

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
    length = pipeline.eval_length(examples, config.data, max_len)
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


class Diverged(cli.UserError):
    """The loss stopped being finite."""


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: Path, log=print) -> TrainState:
    """Train `config` in `workdir` until `num_train_steps`, resuming from its latest checkpoint."""
    workdir = Path(workdir)
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
    dev_examples = pipeline.tokenize_split(
        corpora.data_source(builder, config.data.eval_split), tokenizer, config.data, dev_limit
    )

    mngr = checkpoint.manager(workdir / "checkpoints", config.keep_checkpoints)
    start_step = mngr.latest_step() or 0
    if start_step:
        state = checkpoint.restore(mngr, start_step, abstract_state, data_iterator)
        log(f"resumed from {workdir / 'checkpoints' / str(start_step)}")
    else:
        init = jax.jit(functools.partial(create_state, model, tx, config.seed), out_shardings=parallel.replicated(mesh))
        state = init()
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    log(
        f"model: {num_params:,} parameters, vocabulary {tokenizer.vocab_size:,}; {jax.device_count()} devices "
        f"({jax.devices()[0].platform}) in {jax.process_count()} process(es); "
        f"{rows} rows x {config.data.max_length} tokens per step in {accum} micro-batch(es)"
    )
    writer = MetricWriter(workdir, start_step, enabled=jax.process_index() == 0)

    stop = {"signal": None}
    previous_handler = signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(signal=signum))
    pending: list[dict] = []  # device metrics of steps not yet logged

    def flush(step: int) -> dict[str, float]:
        """Fetch pending metrics; stop the run if any loss is not finite."""
        fetched = jax.device_get(pending)
        pending.clear()
        if not fetched:
            return {}
        if not all(math.isfinite(float(m["loss"])) for m in fetched):
            last_good = mngr.latest_step()
            raise Diverged(
                f"The training loss became non-finite by step {step}; the last good checkpoint "
                f"(step {last_good}) is intact: lower learning_rate_scale or raise warmup_steps and resume."
            )
        sums = {k: sum(float(m[k]) for m in fetched) for k in ("loss", "nll", "correct", "tokens")}
        return {**per_token(sums), "learning_rate": float(fetched[-1]["learning_rate"]), "tokens": sums["tokens"]}

    step = start_step
    last_save = last_console = time.time()
    timer_start, timer_step = None, start_step
    tokens = {"seen": 0.0, "steps": 0}  # target tokens over logged steps, for tokens/s
    try:
        while step < config.num_train_steps:
            local = next(data_iterator)
            rng = jax.random.fold_in(state.rng, step)
            state, metrics = p_train_step(state, parallel.global_batch(mesh, local), rng)
            step += 1
            pending.append(metrics)
            if timer_start is None:  # the first step compiles; measure speed from the second on
                jax.block_until_ready(metrics)
                timer_start, timer_step = time.time(), step

            final = step == config.num_train_steps
            logged = {}
            evaluate_now = step % config.eval_every_steps == 0 or final
            if step % config.log_every_steps == 0 or evaluate_now:
                tokens["steps"] += len(pending)
                logged = flush(step)
                tokens["seen"] += logged["tokens"]
            if evaluate_now:
                max_len = model.config.max_len
                logged.update(evaluate_loss(p_eval_step, state.params, dev_examples, config, mesh, max_len, "dev_"))
            if logged:
                writer.write(step, {k: v for k, v in logged.items() if k != "tokens"})
            if logged or time.time() - last_console >= 5.0:  # a console line every few seconds, and at every log
                shown = logged or per_token_step(pending[-1])  # waits for the step: the speed is real
                now = last_console = time.time()
                tokens_per_step = tokens["seen"] / max(tokens["steps"], 1)
                log(console_line(step, config.num_train_steps, shown, timer_start, timer_step, tokens_per_step, now))

            now = time.time()
            save_due = (
                step % config.checkpoint_every_steps == 0 or now - last_save >= 60 * config.checkpoint_every_minutes
            )
            if save_due or final or stop["signal"]:
                flush(step)  # never save parameters that came from a non-finite loss
                checkpoint.save(mngr, step, state, data_iterator)
                last_save = now
            if stop["signal"]:
                log(f"SIGTERM: saved step {step} to {workdir / 'checkpoints'}; exiting")
                break
    finally:
        mngr.wait_until_finished()
        mngr.close()
        writer.close()
        signal.signal(signal.SIGTERM, previous_handler)
    if length_filter.overlong_pairs:
        log(f"length filter: {length_filter.report()}")
    return state


def per_token_step(metrics: dict) -> dict[str, float]:
    """Per-token values of one step's device metrics (a sync: only for the console)."""
    fetched = {k: float(v) for k, v in jax.device_get(metrics).items()}
    return {**per_token(fetched), "learning_rate": fetched["learning_rate"]}


def console_line(step, total, m, timer_start, timer_step, tokens_per_step, now) -> str:
    """step, loss, perplexity, learning rate, tokens/s, steps/s and ETA on one line."""
    parts = [f"step {step}/{total}"]
    if "loss" in m:
        parts += [f"loss {m['loss']:.3f}", f"ppl {m['ppl']:.2f}", f"lr {m['learning_rate']:.2e}"]
    if "dev_ppl" in m:
        parts += [f"dev loss {m['dev_loss']:.3f}", f"dev ppl {m['dev_ppl']:.3f}"]
    elapsed = now - (timer_start or now)
    if elapsed > 0 and step > timer_step:
        steps_per_s = (step - timer_step) / elapsed
        if tokens_per_step:
            parts.append(f"{tokens_per_step * steps_per_s:,.0f} tgt tok/s")
        parts.append(f"{steps_per_s:.2f} steps/s")
        parts.append(f"ETA {duration((total - step) / steps_per_s)}")
    return " | ".join(parts)


def main() -> None:
    p = cli.parser(__doc__, "fxformer.train")
    p.add_argument("--workdir", required=True, help="run directory: config, tokenizer, checkpoints, metrics")
    p.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() (TPU pods, SLURM)")
    p.add_argument("--coordinator_address", default="", help="host:port of process 0, for a manual cluster")
    p.add_argument("--num_processes", type=int, default=0)
    p.add_argument("--process_id", type=int, default=-1)
    args, config = cli.parse(p)
    workdir = Path(args.workdir)
    if config is None:
        config = load_workdir_config(workdir)  # resume a run with the config it was started with
    if args.distributed or args.coordinator_address:
        parallel.initialize(args.coordinator_address, args.num_processes, args.process_id)
    log = print if jax.process_index() == 0 else (lambda *a, **k: None)
    train_and_evaluate(config, workdir, log=lambda *a, **k: log(*a, **k, flush=True))


if __name__ == "__main__":
    cli.run(main)
