"""How fast a config trains and decodes on the devices at hand, and how close to their limit.

    python -m fxformer.bench --config=configs/base.py --config.model.dtype=bfloat16
    python -m fxformer.bench --config=configs/default.py --json      # last line: one JSON object

    python -m fxformer.bench --config=configs/default.py --data=real --json   # the input pipeline too

Synthetic data of the config's shapes (no dataset, no tokenizer): a training step on
`data.tokens_per_batch` target tokens (rows of `data.max_length`: with `--batch=full`, one
sentence per row; with `--batch=packed`, WMT-like sentences packed as training packs them,
`packed_batch`), and a beam search (the config's decode section) over a fixed batch of random sources. Prints
devices and dtype, parameters, tokens per step, compile time, the median step time over the
timed steps, target tokens/s, model FLOPs per step (an analytic count, `train_flops`, tested
against XLA's cost analysis), achieved TFLOP/s and MFU against the device's peak (`PEAK_TFLOPS`;
none on a CPU), peak memory, and decoding sentences/s and output tokens/s. Beside the dense
count (`flops_per_step`, `mfu`: every query-key product of every row), the count within
segments (`flops_per_step_segments`, `mfu_segments`: attention only within each sentence,
`segment_train_flops`) and the causal count (`flops_per_step_causal`, `mfu_causal`: the decoder
self-attention's masked half left out, `causal_train_flops`), each under its own name: both are
at most the dense count, so a step can only look worse by them, never better.

With --data=real the config's dataset is prepared (or found) and its training batches measured
too: the input pipeline alone (real target tokens/s for --pipeline_seconds), and training on
real batches as `fxformer.train` feeds them, timed in blocks of --steps steps alternating with
blocks of synthetic steps, so the ratio of their step rates is measured side by side on the same
machine at the same time (--steps=0: the pipeline alone).

    python -m fxformer.bench --config=configs/base.py --config.model.dtype=bfloat16 --steps=0 \\
        --decode_batch=3003 --decode_len=32    # newstest2014-sized decoding alone
"""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fxformer import cli, inference, parallel, train, trainstate
from fxformer.config import DecodeOptions, validate
from fxformer.data import corpora, packing, pipeline, token_ids
from fxformer.data.tokenizer import tokenizer_for
from fxformer.errors import UserError
from fxformer.model import TransformerConfig, init_params
from fxformer.tokens import EOS_ID

# Dense peak TFLOP/s per chip by device kind (the start of jax.Device.device_kind; the first kind
# that matches, so a longer name comes before its prefix) and dtype: vendors' figures without
# sparsity; float32 on GPUs is TF32 tensor-core math (XLA's default).
PEAK_TFLOPS = {
    "NVIDIA H200 NVL": {"bfloat16": 835.0, "float32": 418.0},
    "NVIDIA H200": {"bfloat16": 989.0, "float32": 494.0},
    "NVIDIA H100 PCIe": {"bfloat16": 756.0, "float32": 378.0},
    "NVIDIA H100 NVL": {"bfloat16": 835.0, "float32": 418.0},
    "NVIDIA H100": {"bfloat16": 989.0, "float32": 494.0},  # SXM
    "NVIDIA A100": {"bfloat16": 312.0, "float32": 156.0},
    "TPU v6": {"bfloat16": 918.0, "float32": 918.0},  # v6e (Trillium)
    "TPU v5 lite": {"bfloat16": 197.0, "float32": 197.0},  # v5e
    "TPU v5": {"bfloat16": 459.0, "float32": 459.0},  # v5p (its device_kind reads "TPU v5")
    "TPU v4": {"bfloat16": 275.0, "float32": 275.0},
}


def peak_tflops(device: jax.Device, dtype: str) -> float | None:
    """The chip's dense peak for `dtype`, or None when unknown (a CPU)."""
    for kind, peaks in PEAK_TFLOPS.items():
        if device.device_kind.startswith(kind):
            return peaks.get(dtype)
    return None


def forward_flops(c: TransformerConfig, rows: int, source_len: int, target_len: int) -> float:
    """Matrix-multiply FLOPs (2 per multiply-add) of one teacher-forced forward pass over `rows`
    rows: every projection, both attention products over all positions (masks do not save work
    in the XLA path), the feed-forward networks and the output projection to the vocabulary."""
    d, h, dk, dv, ff = c.d_model, c.num_heads, c.d_k, c.d_v, c.d_ff

    def attention(q_len: int, kv_len: int) -> float:
        projections = q_len * d * h * dk + kv_len * d * h * (dk + dv) + q_len * h * dv * d
        products = q_len * kv_len * h * (dk + dv)
        return 2.0 * (projections + products)

    feed_forward = lambda length: 2.0 * 2 * length * d * ff  # noqa: E731
    encoder = c.num_layers * (attention(source_len, source_len) + feed_forward(source_len))
    decoder = c.num_layers * (
        attention(target_len, target_len) + attention(target_len, source_len) + feed_forward(target_len)
    )
    logits = 2.0 * target_len * d * c.vocab_size
    return rows * (encoder + decoder + logits)


def train_flops(c: TransformerConfig, rows: int, length: int) -> float:
    """A training step: the forward pass and a backward pass of twice its FLOPs."""
    return 3.0 * forward_flops(c, rows, length, length)


def causal_train_flops(c: TransformerConfig, rows: int, length: int) -> float:
    """`train_flops` with the decoder self-attention's masked half left out: a query counts only the
    keys at and before its own position, length (length + 1) / 2 pairs a row and layer, not
    length squared; the encoder's and the cross-attention's products are dense, as is the rest. A
    third count beside the dense one and the one within segments: what a kernel that skipped the
    causal mask's hidden half would still do."""
    per_pair = 2.0 * c.num_heads * (c.d_k + c.d_v)  # FLOPs of both products for one query-key pair
    hidden = c.num_layers * rows * (length * length - length * (length + 1) / 2)
    return train_flops(c, rows, length) - 3.0 * per_pair * hidden


def segment_train_flops(c: TransformerConfig, batch: dict[str, np.ndarray]) -> float:
    """`train_flops` of `batch` with both attention products counted only within segments (a
    query times the keys of its own example; padding queries count nothing): the work a kernel
    that skipped what the segment mask hides would still do. Everything else is counted over all
    positions, as in `train_flops`, so this count is never above it, and equals it for rows of
    one sentence with no padding. An MFU on this count says how much of the step's time did the
    model's own work; it is reported beside the dense MFU, never in its place."""
    rows, length = batch["targets"].shape
    per_pair = 2.0 * c.num_heads * (c.d_k + c.d_v)  # FLOPs of both products for one query-key pair
    source, target = segment_lengths(batch["inputs_segment_ids"]), segment_lengths(batch["targets_segment_ids"])
    pairs = c.num_layers * ((source**2).sum() + (target**2).sum() + (target * source).sum())  # enc, dec, cross
    dense_pairs = c.num_layers * rows * 3 * length * length
    return train_flops(c, rows, length) - 3.0 * per_pair * (dense_pairs - pairs)


def segment_lengths(segment_ids: np.ndarray) -> np.ndarray:
    """[rows, ids] int64: how many positions of each row carry each segment id 1, 2, ... (0 where
    a row has fewer segments); padding (id 0) is not counted."""
    ids = np.asarray(segment_ids)
    counts = np.zeros((ids.shape[0], int(ids.max()) + 1), np.int64)
    np.add.at(counts, (np.arange(ids.shape[0])[:, None], ids), 1)
    return counts[:, 1:]


def packed_batch(rows: int, length: int, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of several sentences each, as training feeds them: sentence pairs of WMT-like
    lengths, packed first fit by `fxformer.data.packing` (the pipeline's own packer and fill)
    into `rows` rows of `length` per side, random tokens, EOS last in every sentence.

    The lengths (EOS included) are log-normal: source median 24 tokens (mean about 29, the
    WMT14 en-de training sentences' mean in a 37,000-token shared BPE vocabulary is about 28-30),
    target = source x exp(N(0.05, 0.15)) (German a little longer), each clipped to [2, length];
    a row of 256 then holds about 8 sentences, about 95% of its slots real tokens."""
    rng = np.random.default_rng(seed)
    n = rows * length // 8  # more pairs than one batch takes: the first closed batch is used
    source = np.clip(np.round(np.exp(rng.normal(np.log(24.0), 0.6, n))), 2, length).astype(np.int64)
    target = np.clip(np.round(source * np.exp(rng.normal(0.05, 0.15, n))), 2, length).astype(np.int64)

    def side(lengths: np.ndarray) -> SimpleNamespace:
        ids = rng.integers(4, vocab_size, size=int(lengths.sum())).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        ids[offsets[1:] - 1] = EOS_ID
        return SimpleNamespace(ids=ids, offsets=offsets)

    split = SimpleNamespace(inputs=side(source), targets=side(target))
    plan = packing.first_fit({"inputs": source, "targets": target}, np.arange(n), rows, length, rng)
    return packing.fill(split, plan, 0, rows, length)


BATCHES = ("full", "packed")  # --batch: one sentence filling each row, or WMT-like sentences packed


def bench_batch(kind: str, rows: int, length: int, vocab_size: int) -> dict[str, np.ndarray]:
    """The synthetic batch `kind` names (`BATCHES`)."""
    return packed_batch(rows, length, vocab_size) if kind == "packed" else synthetic_batch(rows, length, vocab_size)


def synthetic_batch(rows: int, length: int, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Packed-format rows of random tokens, one sentence filling each row."""
    rng = np.random.default_rng(seed)
    tokens = lambda: rng.integers(4, vocab_size, size=(rows, length)).astype(np.int32)  # noqa: E731
    ones = np.ones((rows, length), np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
    return {
        "inputs": tokens(),
        "targets": tokens(),
        "inputs_segment_ids": ones,
        "targets_segment_ids": ones,
        "inputs_positions": positions,
        "targets_positions": positions,
    }


def peak_memory() -> tuple[int | None, str]:
    """(bytes, what was measured): the first device's peak allocation where the runtime reports
    it (GPU, TPU), else this process's peak resident memory (CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process RSS"


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class SyntheticStep:
    """A config's training step compiled for a synthetic batch of its shapes, with a fresh state."""

    model: Any
    compiled: Any
    state: Any
    batch: dict
    rows: int
    length: int
    compile_s: float
    host_batch: dict  # the batch as NumPy arrays: what the segment FLOP count reads


def synthetic_step(config, vocab: int, kind: str = "full") -> SyntheticStep:
    """Build the model, its state and the synthetic batch `kind` (`BATCHES`) on the data mesh,
    and compile the step."""
    mesh = parallel.data_mesh()
    model, tx, _ = trainstate.build(config, vocab, mesh)
    rows = pipeline.rows_per_step(config.data, jax.device_count(), config.grad_accum_steps)
    length = config.data.max_length
    state = jax.jit(lambda: trainstate.create_state(model, tx, config.seed), out_shardings=parallel.replicated(mesh))()
    step = train.compile_train_step(config, model, tx, mesh)
    host = bench_batch(kind, rows, length, vocab)
    batch = parallel.global_batch(mesh, host)
    progress(f"compiling the train step ({rows} rows x {length} tokens, {kind} rows)")
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    return SyntheticStep(model, compiled, state, batch, rows, length, time.perf_counter() - start, host)


def timed_steps(s: SyntheticStep, steps: int, report: bool = True) -> list[float]:
    """Seconds of each of `steps` steps on the synthetic batch, after two untimed ones (s.state
    moves on); `report`: a progress line per timed step."""
    times = []
    for i in range(steps + 2):  # two untimed steps first
        start = time.perf_counter()
        s.state, metrics = s.compiled(s.state, s.batch)
        jax.block_until_ready(metrics)
        if i >= 2:
            times.append(time.perf_counter() - start)
            if report:
                progress(f"train step {i - 1}/{steps}: {times[-1] * 1000:.1f} ms")
    return times


def bench_train(config, steps: int, vocab: int, ids=None, kind: str = "full") -> dict:
    s = synthetic_step(config, vocab, kind)
    times = timed_steps(s, steps)
    loops = config.grad_accum_steps > 1 or config.loss_chunk_tokens > 0
    real = bench_real_train(config, ids, s.compiled, s.state, s.batch, steps) if ids is not None else {}
    return {**real, **step_record(s, times, xla_count=not loops)}


def step_record(s: SyntheticStep, times: list[float], xla_count: bool = True) -> dict:
    """The training figures of a compiled step `s` timed `times` (seconds): step time (median),
    tokens, the three FLOP counts, achieved TFLOP/s and MFU by each (`mfu`: the dense count, as always;
    `mfu_causal`: the decoder's masked half left out; `mfu_segments`: within segments; each under its
    own name, never in the dense one's place)."""
    cost = s.compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    targets = s.host_batch["targets_segment_ids"]
    step_time = statistics.median(times)
    r = {
        "num_params": int(sum(x.size for x in jax.tree.leaves(s.state.params))),
        "rows_per_step": s.rows,
        "tokens_per_step": s.rows * s.length,
        "real_target_tokens_per_step": int((targets > 0).sum()),
        "segments_per_row": float(targets.max(axis=1).mean()),
        "flops_per_step_segments": segment_train_flops(s.model.config, s.host_batch),
        "compile_s": s.compile_s,
        "step_time_s": step_time,
        "step_times_s": times,
        "flops_per_step": train_flops(s.model.config, s.rows, s.length),
        "flops_per_step_causal": causal_train_flops(s.model.config, s.rows, s.length),
        # XLA's cost analysis counts a loop's body once: no check where the step loops (micro-batches, loss chunks)
        "xla_flops_per_step": float(cost.get("flops", 0.0)) * jax.device_count() if cost and xla_count else None,
    }
    r["train_tokens_per_s"] = r["tokens_per_step"] / step_time  # slots, padding included
    r["real_target_tokens_per_s"] = r["real_target_tokens_per_step"] / step_time
    peak = peak_tflops(jax.devices()[0], jnp.dtype(s.model.config.dtype).name)
    r["peak_tflops"] = peak * jax.device_count() if peak else None
    counts = (("", r["flops_per_step"]), ("_causal", r["flops_per_step_causal"]))
    for suffix, flops in (*counts, ("_segments", r["flops_per_step_segments"])):
        achieved = flops / step_time
        r[f"achieved_tflops{suffix}"] = achieved / 1e12
        r[f"mfu{suffix}"] = achieved / (r["peak_tflops"] * 1e12) if peak else None
    return r


def real_data(config):
    """(vocabulary size, folder of the stored token ids) of the config's dataset, prepared if needed."""
    builder = corpora.prepare(config.data, log=progress)
    tokenizer = tokenizer_for(config.data, builder, log=progress)
    return tokenizer.vocab_size, token_ids(config.data, builder, tokenizer, log=progress)


def real_batches(config, ids, rows: int):
    """This process's training batches of the config's dataset, as training makes them."""
    dataset, _ = pipeline.train_dataset(
        ids, config.data, rows, config.data.shuffle_seed, jax.process_index(), jax.process_count()
    )
    return iter(dataset)


def bench_pipeline(config, ids, seconds: float) -> dict:
    """The input pipeline alone: real target tokens (and batches) per second, after its first batch."""
    rows = pipeline.rows_per_step(config.data, jax.device_count(), config.grad_accum_steps)
    batches = real_batches(config, ids, rows)
    next(batches)  # the first plans the epoch and starts the workers
    progress(f"reading training batches for {seconds:g} s ({rows} rows x {config.data.max_length} tokens)")
    count, tokens, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += int((next(batches)["targets_segment_ids"] > 0).sum())
        count += 1
    elapsed = time.perf_counter() - start
    return {
        "pipeline_target_tokens_per_s": tokens / elapsed,
        "pipeline_batches_per_s": count / elapsed,
        "pipeline_fill": tokens / (count * rows * config.data.max_length),
    }


def bench_real_train(config, ids, compiled, state, synthetic, steps: int, rounds: int = 4) -> dict:
    """Training on real batches (`parallel.GlobalBatches`, as the loop takes them) against the
    synthetic batch, in blocks of `steps` steps each waited for only at its end (as the loop waits
    only when it logs), alternating which goes first (ABBA) so that a change in the machine's load
    falls on both: the median ratio of their step rates, and real target tokens/s."""
    mesh = parallel.data_mesh()
    rows = pipeline.rows_per_step(config.data, jax.device_count(), config.grad_accum_steps)
    batches = parallel.GlobalBatches(mesh, real_batches(config, ids, rows), config.data.device_prefetch)
    tokens = 0

    def block(real: bool) -> float:
        nonlocal state, tokens
        start = time.perf_counter()
        for _ in range(steps):
            if real:
                local, batch = next(batches)
                tokens += int((local["targets_segment_ids"] > 0).sum())
            state, metrics = compiled(state, batch if real else synthetic)
        jax.block_until_ready(metrics)
        return time.perf_counter() - start

    ratios, real_s = [], 0.0
    for r in range(rounds):
        first_real = r % 2 == 1
        seconds = {first_real: block(first_real), not first_real: block(not first_real)}
        real_s += seconds[True]
        ratios.append(seconds[False] / seconds[True])
        progress(f"round {r + 1}/{rounds}: {steps} steps: synthetic {seconds[False]:.2f} s, real {seconds[True]:.2f} s")
    return {"real_to_synthetic_step_rate": statistics.median(ratios), "real_train_target_tokens_per_s": tokens / real_s}


def bench_decode(config, model_config: TransformerConfig, batch_size: int, source_len: int, repeats: int) -> dict:
    mesh = parallel.data_mesh()
    model, _, _ = trainstate.build(config, model_config.vocab_size, mesh)
    params = jax.jit(lambda: init_params(model, jax.random.key(0)))()
    options = dataclasses.replace(DecodeOptions.of(config.decode), nbest=1)
    translate = inference.translator(model, mesh, options)
    rng = np.random.default_rng(1)
    sources = rng.integers(4, model_config.vocab_size, size=(batch_size, source_len)).astype(np.int32)
    sources[:, -1] = EOS_ID
    inputs = parallel.global_batch(mesh, {"inputs": sources})["inputs"]
    key = jax.random.key(0)
    progress(f"compiling {options.strategy} search (beam {options.beam_size}) for {batch_size} x {source_len}")
    start = time.perf_counter()
    compiled = translate.lower(params, inputs, key).compile()
    compile_s = time.perf_counter() - start
    times, produced = [], 0
    for i in range(repeats + 1):
        start = time.perf_counter()
        outputs, _ = compiled(params, inputs, key)
        outputs = jax.block_until_ready(outputs)
        if i:
            times.append(time.perf_counter() - start)
            produced = int((np.asarray(outputs)[:, 0] > 0).sum())
            progress(f"decode {i}/{repeats}: {times[-1]:.2f} s")
    seconds = statistics.median(times)
    return {
        "decode_compile_s": compile_s,
        "decode_batch": batch_size,
        "decode_source_len": source_len,
        "decode_beam_size": options.beam_size,
        "decode_sentences_per_s": batch_size / seconds,
        "decode_tokens_per_s": produced / seconds,
    }


def run(
    config,
    steps: int,
    decode_batch: int,
    decode_len: int,
    decode_repeats: int,
    data: str = "synthetic",
    pipeline_seconds: float = 10.0,
    batch: str = "full",
) -> dict:
    device = jax.devices()[0]
    dtype = config.model.dtype
    out = {
        "device": device.device_kind,
        "platform": device.platform,
        "devices": jax.device_count(),
        "dtype": dtype,
        "data": data,
        "batch": batch,
    }
    vocab, ids = real_data(config) if data == "real" else (config.data.vocab_size, None)
    if ids is not None:
        out.update(bench_pipeline(config, ids, pipeline_seconds))
        if not steps:
            return out
    if steps:  # else decoding alone
        out.update(bench_train(config, steps, vocab, ids, batch))
    if decode_batch:
        model_config = trainstate.model_of(config, vocab).config
        out.update(bench_decode(config, model_config, decode_batch, decode_len, decode_repeats))
    else:
        out.update(decode_sentences_per_s=None, decode_tokens_per_s=None)
    out["peak_memory_bytes"], out["peak_memory_of"] = peak_memory()
    return out


def pipeline_rows(r: dict) -> list[tuple[str, str]]:
    """The real-data lines of the table (none for synthetic data)."""
    if "pipeline_target_tokens_per_s" not in r:
        return []
    alone = (
        f"{r['pipeline_target_tokens_per_s']:,.0f} real target tokens/s ({r['pipeline_batches_per_s']:,.1f} "
        f"batches/s, {100 * r['pipeline_fill']:.1f}% of slots real)"
    )
    rows = [("input pipeline alone", alone)]
    if "real_to_synthetic_step_rate" in r:
        rows.append(
            (
                "training on real batches",
                f"{r['real_train_target_tokens_per_s']:,.0f} real target tokens/s, "
                f"step rate {r['real_to_synthetic_step_rate']:.3f} x the synthetic one (same run)",
            )
        )
    return rows


def decode_rows(r: dict) -> list[tuple[str, str]]:
    """The decoding line of the table (none when decoding was skipped)."""
    if not r.get("decode_sentences_per_s"):
        return []
    seconds = r["decode_batch"] / r["decode_sentences_per_s"]
    return [
        (
            f"decode (beam {r['decode_beam_size']}, {r['decode_batch']} x {r['decode_source_len']})",
            f"{r['decode_sentences_per_s']:,.1f} sentences/s, {r['decode_tokens_per_s']:,.0f} tokens/s, "
            f"{seconds:.2f} s for the batch",
        )
    ]


def table(r: dict) -> str:
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    if "step_time_s" not in r:  # the pipeline alone, or decoding alone
        rows = pipeline_rows(r) + decode_rows(r)
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    rows = [
        ("devices", f"{r['devices']} x {r['device']} ({r['platform']}), {r['dtype']}"),
        ("parameters", f"{r['num_params']:,}"),
        ("tokens per step", f"{r['tokens_per_step']:,} ({r['rows_per_step']} rows)"),
        ("compile", f"{r['compile_s']:.1f} s"),
        ("step time (median)", f"{r['step_time_s'] * 1000:.1f} ms"),
        ("batch", f"{r['batch']} rows: {r['segments_per_row']:.1f} sentences a row on average"),
        ("target tokens/s", f"{r['train_tokens_per_s']:,.0f} ({r['real_target_tokens_per_s']:,.0f} real, not padding)"),
        ("model FLOPs per step", f"{r['flops_per_step']:.3e} dense (XLA: {fmt(r['xla_flops_per_step'], '.3e')})"),
        ("  causal", f"{r['flops_per_step_causal']:.3e} (the decoder's masked half left out)"),
        ("  within segments", f"{r['flops_per_step_segments']:.3e} (attention only within each sentence)"),
        (
            "achieved",
            f"{r['achieved_tflops']:.2f} TFLOP/s dense, {r['achieved_tflops_causal']:.2f} causal, "
            f"{r['achieved_tflops_segments']:.2f} within segments",
        ),
        (
            "MFU (dense count)",
            "n/a (no known peak)" if r["mfu"] is None else f"{100 * r['mfu']:.1f}% of {r['peak_tflops']:.0f}",
        ),
        ("MFU (causal)", "n/a" if r["mfu_causal"] is None else f"{100 * r['mfu_causal']:.1f}%"),
        ("MFU (within segments)", "n/a" if r["mfu_segments"] is None else f"{100 * r['mfu_segments']:.1f}%"),
        (
            "peak memory",
            f"{fmt(r['peak_memory_bytes'] and r['peak_memory_bytes'] / 2**20, ',.0f')} MiB ({r['peak_memory_of']})",
        ),
    ]
    rows += pipeline_rows(r) + decode_rows(r)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> None:
    p = cli.parser(__doc__, "fxformer.bench")
    p.add_argument(
        "--steps",
        type=int,
        default=10,
        help="timed training steps (after compiling and two more); 0: no training (decoding alone, or "
        "with --data=real the pipeline alone)",
    )
    p.add_argument("--decode_batch", type=int, default=32, help="sentences in the decoding batch (0 = skip)")
    p.add_argument("--decode_len", type=int, default=24, help="source tokens per sentence in the decoding batch")
    p.add_argument("--decode_repeats", type=int, default=2, help="timed decoding runs")
    p.add_argument(
        "--data",
        choices=("synthetic", "real"),
        default="synthetic",
        help="real: also the config's dataset: the input pipeline alone, and training on its batches",
    )
    p.add_argument("--pipeline_seconds", type=float, default=10.0, help="--data=real: how long to read batches")
    p.add_argument(
        "--batch",
        choices=BATCHES,
        default="full",
        help="the synthetic training batch: full (one sentence filling each row) or packed (WMT-like "
        "sentences packed as training packs them, about 8 a row of 256)",
    )
    p.add_argument("--json", action="store_true", help="end with the results as one JSON line")
    args, config = cli.parse(p)
    if config is None:
        raise UserError("Give --config=<config file>, e.g. --config=configs/base.py.")
    if args.steps < 0 or args.decode_batch < 0 or args.decode_len < 2 or args.decode_repeats < 1:
        raise UserError(
            "--steps and --decode_batch must be 0 or more, --decode_repeats at least 1, --decode_len 2 or more."
        )
    if args.steps == 0 and args.data == "synthetic" and args.decode_batch == 0:
        raise UserError("--steps=0 and --decode_batch=0 leave nothing to measure: give either a positive value.")
    if args.pipeline_seconds <= 0:
        raise UserError(f"--pipeline_seconds must be positive, not {args.pipeline_seconds}.")
    validate(config, jax.default_backend(), jax.process_count())
    results = run(
        config,
        args.steps,
        args.decode_batch,
        args.decode_len,
        args.decode_repeats,
        args.data,
        args.pipeline_seconds,
        args.batch,
    )
    print(table(results))
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    cli.run(main)
