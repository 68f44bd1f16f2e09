"""The Flax WMT example's training step beside fxformer's, on the same device, batch and dtype.

    python3 -m benchmarks.gpu.peer --flax_wmt=.peer --config=configs/base.py --dtype=bfloat16 --batch=packed

`--flax_wmt` is a folder holding `models.py` of google/flax's `examples/wmt` (fetched, never
part of this repository; 18f8f31 was read):

    mkdir -p .peer && git -C <google/flax clone> show 18f8f31:examples/wmt/models.py > .peer/models.py

Its `train.py` imports TensorFlow and clu, which the GPU machines lack, so its train step is
restated here from what that file does: the packed batch's positions and segmentations given to
`models.Transformer`, dropout on, the label-smoothed cross-entropy against one-hot soft targets
from `log_softmax` (minus the smoothed targets' entropy) averaged over the real targets, its
gradient, `optax.adamw(b1=0.9, b2=0.98, eps=1e-9, weight_decay=0)` with a linear warm-up then
rsqrt schedule, and the step's metrics (loss and argmax accuracy, as its `compute_metrics`);
`jax.jit` with the state donated, one device (its `jax.pmap` over one device is the same program).

The example's model at fxformer's shapes: `emb_dim` = d_model, `qkv_dim` = h d_k, `mlp_dim` =
d_ff, shared embeddings with `logits_via_embedding` (fxformer ties them too), dropout as the
config's, attention dropout as `--peer_attention_dropout` (0: the paper's and fxformer's; the
example's default is 0.1). Its layers are pre-norm with biases: the same matrix products, so
both are set against fxformer's analytic FLOP count (`bench.train_flops`).

Timed in alternating blocks (fxformer, peer, peer, fxformer, ...) of `--steps` steps each, each
step waited for, after compiling and two untimed steps; prints each one's median step time,
tokens/s, MFU, and the ratio of the peer's step time to fxformer's (above 1: fxformer is faster);
with `--json` the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fxformer import bench, configfile, parallel
from fxformer.config import with_overrides


def peer_schedule(learning_rate: float, warmup_steps: int) -> optax.Schedule:
    """Linear warm-up to `learning_rate`, then learning_rate * sqrt(warmup / step) (the example's)."""
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, learning_rate, warmup_steps),
            lambda count: learning_rate * jnp.sqrt(warmup_steps / (count + warmup_steps)),
        ],
        [warmup_steps],
    )


def smoothed_cross_entropy_sum(logits, targets, weights, label_smoothing: float):
    """Sum over weighted targets of -sum_v q(v) log_softmax(logits)_v minus q's entropy, with
    q = 1 - eps on the target and eps / (V - 1) elsewhere: the example's loss, restated."""
    vocab = logits.shape[-1]
    confidence, low = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
    entropy = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low + 1e-20))
    soft = jax.nn.one_hot(targets, vocab) * (confidence - low) + low
    loss = -(soft * jax.nn.log_softmax(logits)).sum(-1) - entropy
    return (loss * weights).sum()


def peer_step_fn(models, peer_config, tx: optax.GradientTransformation, label_smoothing: float):
    """The example's train step, restated: (state, batch, rng) -> (state, metrics), where state
    holds params, opt_state and step."""

    def step(state, batch, rng):
        targets = batch["targets"]
        weights = (targets > 0).astype(jnp.float32)
        rng = jax.random.fold_in(rng, state["step"])

        def loss_fn(params):
            logits = models.Transformer(peer_config).apply(
                {"params": params},
                batch["inputs"],
                targets,
                inputs_positions=batch["inputs_positions"],
                targets_positions=batch["targets_positions"],
                inputs_segmentation=batch["inputs_segment_ids"],
                targets_segmentation=batch["targets_segment_ids"],
                rngs={"dropout": rng},
            )
            return smoothed_cross_entropy_sum(logits, targets, weights, label_smoothing) / weights.sum(), logits

        (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {  # as the example's compute_metrics: its loss (unsmoothed there too) and accuracy
            "loss": smoothed_cross_entropy_sum(logits, targets, weights, 0.0),
            "accuracy": ((logits.argmax(-1) == targets) * weights).sum(),
            "denominator": weights.sum(),
        }
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return step


class Timed:
    """A compiled step and its state: `block(n)` runs n steps, each waited for, and keeps their seconds."""

    def __init__(self, name: str, run_one):
        self.name, self.run_one, self.times = name, run_one, []

    def block(self, steps: int, keep: bool = True) -> None:
        for _ in range(steps):
            start = time.perf_counter()
            jax.block_until_ready(self.run_one())
            if keep:
                self.times.append(time.perf_counter() - start)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flax_wmt", default=".peer", help="folder holding the Flax example's models.py")
    p.add_argument("--config", default="configs/base.py", help="fxformer config whose shapes both models take")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--batch", default="packed", choices=bench.BATCHES)
    p.add_argument("--steps", type=int, default=10, help="timed steps per block")
    p.add_argument("--rounds", type=int, default=2, help="rounds of two blocks each (ABBA order)")
    p.add_argument("--peer_attention_dropout", type=float, default=0.0)
    p.add_argument("--set", action="append", default=[], help="fxformer config override KEY=VALUE (repeatable)")
    p.add_argument("--json", action="store_true")
    return p


def load_models(folder: str):
    """The Flax example's models.py in `folder`, loaded by its path."""
    models_py = Path(folder).resolve() / "models.py"
    if not models_py.is_file():
        sys.exit(f"No models.py in {folder}: put google/flax's examples/wmt/models.py there (see {__file__}).")
    spec = importlib.util.spec_from_file_location("flax_wmt_models", models_py)
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    return models


def config_of(args) -> ml_collections.ConfigDict:
    overrides = {"model.dtype": args.dtype}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)  # numbers, true/false
        except ValueError:
            overrides[key] = value
    return with_overrides(configfile.load_config(args.config), overrides)


def peer_step(models, config, ours, args) -> tuple[Timed, dict, float]:
    """The example's model at fxformer's shapes, its train step compiled on the same batch: (its
    Timed step, the holder of its state: {"state": ...}, compile seconds)."""
    c, vocab = ours.model.config, config.data.vocab_size
    peer_config = models.TransformerConfig(
        vocab_size=vocab,
        output_vocab_size=vocab,
        share_embeddings=True,
        logits_via_embedding=True,
        dtype=jnp.dtype(args.dtype),
        emb_dim=c.d_model,
        num_heads=c.num_heads,
        num_layers=c.num_layers,
        qkv_dim=c.num_heads * c.d_k,
        mlp_dim=c.d_ff,
        max_len=max(c.max_len, ours.length),
        dropout_rate=c.dropout_rate,
        attention_dropout_rate=args.peer_attention_dropout,
        deterministic=False,
    )
    batch = parallel.global_batch(parallel.data_mesh(), ours.host_batch)
    init_batch = jnp.ones((1, ours.length), jnp.int32)
    params = jax.jit(
        lambda: models.Transformer(peer_config).init(jax.random.key(0), init_batch, init_batch)["params"]
    )()
    tx = optax.adamw(peer_schedule(0.002, 1000), b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0)
    holder = {"state": {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}}
    rng = jax.random.key(1)
    start = time.perf_counter()
    step = jax.jit(peer_step_fn(models, peer_config, tx, config.label_smoothing), donate_argnums=(0,))
    compiled = step.lower(holder["state"], batch, rng).compile()
    compile_s = time.perf_counter() - start

    def run_peer():
        holder["state"], metrics = compiled(holder["state"], batch, rng)
        return metrics

    return Timed("flax_wmt", run_peer), holder, compile_s


def results(args, ours, a: Timed, b: Timed, peer_params, peer_compile_s: float) -> dict:
    """The record: both steps' median time, tokens/s, MFU on fxformer's FLOP count, parameters."""
    c = ours.model.config
    flops = bench.train_flops(c, ours.rows, ours.length)
    peak = bench.peak_tflops(jax.devices()[0], args.dtype)
    real = int((ours.host_batch["targets_segment_ids"] > 0).sum())
    out = {"device": jax.devices()[0].device_kind, "dtype": args.dtype, "batch": args.batch}
    out.update(rows=ours.rows, length=ours.length, flops_per_step=flops, peer_compile_s=peer_compile_s)
    out["fxformer_compile_s"] = ours.compile_s
    for t in (a, b):
        seconds = statistics.median(t.times)
        out[f"{t.name}_step_time_s"] = seconds
        out[f"{t.name}_tokens_per_s"] = ours.rows * ours.length / seconds
        out[f"{t.name}_real_target_tokens_per_s"] = real / seconds
        out[f"{t.name}_mfu"] = flops / seconds / (peak * 1e12) if peak else None
    out["fxformer_parameters"] = int(sum(x.size for x in jax.tree.leaves(ours.state.params)))
    out["flax_wmt_parameters"] = int(sum(x.size for x in jax.tree.leaves(peer_params)))
    out["flax_wmt_to_fxformer_step_time"] = out["flax_wmt_step_time_s"] / out["fxformer_step_time_s"]
    return out


def print_results(out: dict) -> None:
    mfu = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    shape = (
        f"{out['rows']} x {out['length']}, {out['dtype']}, {out['device']}, {out['flops_per_step']:.3e} FLOPs a step"
    )
    print(f"{out['batch']} batch, {shape}")
    for name in ("fxformer", "flax_wmt"):
        print(
            f"{name:9} step {1000 * out[f'{name}_step_time_s']:8.1f} ms  "
            f"{out[f'{name}_tokens_per_s']:11,.0f} tokens/s  MFU {mfu(out[f'{name}_mfu'])}  "
            f"parameters {out[f'{name}_parameters']:,}"
        )
    print(f"Flax example's step / fxformer's: {out['flax_wmt_to_fxformer_step_time']:.3f} (above 1: fxformer faster)")


def main() -> None:
    args = parser().parse_args()
    models = load_models(args.flax_wmt)
    config = config_of(args)
    ours = bench.synthetic_step(config, config.data.vocab_size, args.batch)  # the bench's own step and batch

    def run_ours():
        ours.state, metrics = ours.compiled(ours.state, ours.batch)
        return metrics

    b, holder, peer_compile_s = peer_step(models, config, ours, args)
    a = Timed("fxformer", run_ours)
    a.block(2, keep=False), b.block(2, keep=False)
    for r in range(args.rounds):
        first, second = (a, b) if r % 2 == 0 else (b, a)
        first.block(args.steps), second.block(args.steps)
        print(f"peer: round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    out = results(args, ours, a, b, holder["state"]["params"], peer_compile_s)
    print_results(out)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
