"""The benchmark: its analytic FLOP count against XLA's own cost analysis, and its JSON line."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import SMALL_DATA, env_with_devices
from jax.sharding import AxisType, Mesh

from fxformer import bench, configfile, parallel, tokens, train, trainstate
from fxformer.config import with_overrides
from fxformer.data import pipeline


def xla_train_flops(config) -> float:
    """FLOPs XLA counts for one compiled training step of `config` (one CPU device: on a GPU,
    XLA's cost analysis leaves out its library calls, a sixth of the count, so it is no reference)."""
    mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("data",), axis_types=(AxisType.Auto,))
    model, tx, abstract_state = trainstate.build(config, config.data.vocab_size, mesh)
    rows, length = 16, config.data.max_length
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=parallel.sharded_rows(mesh))
        for k, v in bench.synthetic_batch(rows, length, config.data.vocab_size).items()
    }
    compiled = train.compile_train_step(config, model, tx, mesh).lower(abstract_state, batch).compile()
    cost = compiled.cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"], model.config, rows, length


def run_bench(*flags: str) -> subprocess.CompletedProcess:
    """`python -m fxformer.bench --config=configs/default.py --json` with `flags`, on one device."""
    command = [sys.executable, "-m", "fxformer.bench", "--config=configs/default.py", "--json", *flags]
    return subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)


@pytest.mark.slow  # compiles three training steps
@pytest.mark.parametrize(
    "overrides",
    [
        {},  # configs/default.py: d_model 128, 3 layers, vocabulary 1,000
        {"model.d_k": 16, "model.d_v": 48, "model.num_heads": 4, "data.vocab_size": 3000},  # Table 3 B-like heads
        {"model.d_model": 256, "model.d_ff": 1024, "model.num_layers": 2, "data.max_length": 32},
    ],
)
def test_the_analytic_flop_count_is_within_ten_percent_of_xla(overrides):
    config = with_overrides(configfile.load_config("configs/default.py"), overrides)
    xla, model_config, rows, length = xla_train_flops(config)
    ours = bench.train_flops(model_config, rows, length)
    assert ours == pytest.approx(xla, rel=0.10), (ours, xla)


@pytest.mark.slow
def test_bench_prints_a_table_and_a_json_line(tmp_path):
    result = run_bench(
        "--steps=2",
        "--decode_batch=4",
        "--decode_len=8",
        "--decode_repeats=1",
        "--config.model.num_layers=1",
        "--config.data.tokens_per_batch=1024",
        "--config.decode.max_extra=4",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for key in (
        "train_tokens_per_s",
        "step_time_s",
        "flops_per_step",
        "mfu",
        "peak_memory_bytes",
        "decode_sentences_per_s",
    ):
        assert key in out, key
    assert out["mfu"] is None and out["platform"] == "cpu"  # no known peak for a CPU
    assert out["tokens_per_step"] == 16 * 64 and out["train_tokens_per_s"] == pytest.approx(
        out["tokens_per_step"] / out["step_time_s"]
    )
    assert out["flops_per_step"] == pytest.approx(out["xla_flops_per_step"], rel=0.10)
    assert out["decode_sentences_per_s"] > 0 and out["peak_memory_bytes"] > 0
    assert "target tokens/s" in result.stdout and "bench: train step 2/2" in result.stderr


@pytest.mark.slow
def test_bench_measures_the_input_pipeline_and_training_on_real_batches(tmp_path, data_dir, corpus, corpus_ids):
    result = run_bench(
        "--steps=2",
        "--data=real",
        "--pipeline_seconds=1",
        "--decode_batch=0",
        "--config.model.num_layers=1",
        f"--config.data.tfds_data_dir={data_dir}",
        *(f"--config.data.{k}={v}" for k, v in SMALL_DATA.items()),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["data"] == "real" and out["pipeline_target_tokens_per_s"] > 0 and 0.5 < out["pipeline_fill"] <= 1
    # its fill against the target tokens (not pads) of the same stream's batches 2-301, counted here
    data, slots = corpus[0].data, out["tokens_per_step"]  # SMALL_DATA's 256 tokens per batch: 8 rows of 32
    batches = iter(pipeline.train_dataset(corpus_ids, data, slots // data.max_length, data.shuffle_seed)[0])
    next(batches)
    fill = np.mean([(next(batches)["targets"] != tokens.PAD_ID).mean() for _ in range(300)])
    assert out["pipeline_fill"] == pytest.approx(fill, abs=0.02)
    assert out["pipeline_target_tokens_per_s"] / out["pipeline_batches_per_s"] == pytest.approx(fill * slots, rel=0.02)
    assert out["real_to_synthetic_step_rate"] > 0 and out["real_train_target_tokens_per_s"] > 0
    assert "input pipeline alone" in result.stdout and "training on real batches" in result.stdout


@pytest.mark.slow
def test_bench_with_no_steps_decodes_alone():
    result = run_bench(
        "--steps=0",
        "--decode_batch=6",
        "--decode_len=8",
        "--decode_repeats=1",
        "--config.model.num_layers=1",
        "--config.decode.max_extra=4",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert "step_time_s" not in out and "compiling the train step" not in result.stderr
    assert out["decode_batch"] == 6 and out["decode_sentences_per_s"] > 0
    assert "decode (beam 4, 6 x 8)" in result.stdout and "s for the batch" in result.stdout


def test_each_chip_gets_its_own_peak_and_a_longer_name_comes_before_its_prefix():
    from types import SimpleNamespace

    from fxformer.bench import peak_tflops

    def peak(kind, dtype="bfloat16"):
        return peak_tflops(SimpleNamespace(device_kind=kind), dtype)

    assert peak("NVIDIA H100 80GB HBM3") == 989.0 and peak("NVIDIA H100 PCIe") == 756.0
    assert peak("NVIDIA H100 NVL") == 835.0 and peak("NVIDIA H200") == 989.0 and peak("NVIDIA H200 NVL") == 835.0
    assert peak("TPU v5 lite") == 197.0 and peak("TPU v5") == 459.0  # v5e, and v5p as JAX names it
    assert peak("NVIDIA A100-SXM4-80GB", "float32") == 156.0 and peak("cpu") is None


def test_the_packed_bench_batch_holds_several_sentences_a_row_as_training_packs_them():
    batch = bench.packed_batch(97, 256, 37000)
    assert all(v.shape == (97, 256) and v.dtype == np.int32 for v in batch.values())
    for side in ("inputs", "targets"):
        ids, segments, positions = batch[side], batch[f"{side}_segment_ids"], batch[f"{side}_positions"]
        for row in range(97):
            real = segments[row] > 0
            n = real.sum()
            assert real[:n].all() and not real[n:].any()  # sentences first, padding after them
            assert (np.diff(segments[row, :n]) >= 0).all() and segments[row, 0] == 1  # 1, 1, ..., 2, 2, ...
            starts = np.flatnonzero(np.diff(segments[row, :n], prepend=0))
            ends = np.append(starts[1:], n) - 1
            assert (positions[row, starts] == 0).all() and (ids[row, ends] == tokens.EOS_ID).all()
            assert (positions[row, :n] == np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))).all()
            assert (ids[row, n:] == tokens.PAD_ID).all() and (ids[row, :n] != tokens.PAD_ID).all()
        assert (segments > 0).mean() > 0.85  # first fit leaves little padding
    assert (batch["inputs_segment_ids"].max(1) == batch["targets_segment_ids"].max(1)).all()  # pairs
    assert 6 <= batch["targets_segment_ids"].max(1).mean() <= 11  # a WMT row of 256 holds about 8


def test_the_segment_flop_count_counts_the_query_key_pairs_of_the_segment_mask():
    c = trainstate.model_of(configfile.load_config("configs/default.py"), 1000).config
    full, packed = bench.synthetic_batch(8, 64, 1000), bench.packed_batch(8, 64, 1000)
    dense = bench.train_flops(c, 8, 64)
    assert bench.segment_train_flops(c, full) == pytest.approx(dense, rel=1e-12)  # one sentence a row
    source, target = packed["inputs_segment_ids"], packed["targets_segment_ids"]

    def pairs(q, k):  # the mask the reference attention applies, counted
        return ((q[:, :, None] == k[:, None, :]) & (q[:, :, None] > 0)).sum()

    hidden = 8 * 3 * 64 * 64 - pairs(source, source) - pairs(target, target) - pairs(target, source)
    want = dense - 3 * c.num_layers * 2.0 * c.num_heads * (c.d_k + c.d_v) * hidden
    assert bench.segment_train_flops(c, packed) == pytest.approx(want, rel=1e-12) and want < dense


@pytest.mark.slow
def test_bench_on_the_packed_batch_reports_both_flop_counts():
    result = run_bench(
        "--steps=1",
        "--decode_batch=0",
        "--batch=packed",
        "--config.model.num_layers=1",
        "--config.data.tokens_per_batch=1024",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["batch"] == "packed" and out["segments_per_row"] > 1
    assert out["flops_per_step_segments"] < out["flops_per_step"] and out["mfu"] is None and out["mfu_segments"] is None
    assert out["real_target_tokens_per_step"] < out["tokens_per_step"]
    assert "MFU (dense count)" in result.stdout and "MFU (within segments)" in result.stdout
    assert out["flops_per_step_segments"] < out["flops_per_step_causal"] < out["flops_per_step"]  # packed rows
    assert out["mfu_causal"] is None and "MFU (causal)" in result.stdout


def test_the_causal_flop_count_leaves_out_the_decoders_masked_half():
    c = trainstate.model_of(configfile.load_config("configs/default.py"), 1000).config
    dense = bench.train_flops(c, 8, 64)
    hidden = 8 * c.num_layers * (64 * 64 - np.tril(np.ones((64, 64))).sum())  # the causal mask, counted
    want = dense - 3 * 2.0 * c.num_heads * (c.d_k + c.d_v) * hidden
    assert bench.causal_train_flops(c, 8, 64) == pytest.approx(want, rel=1e-12) and want < dense
    assert bench.causal_train_flops(c, 8, 1) == bench.train_flops(c, 8, 1)  # one position: nothing is masked
