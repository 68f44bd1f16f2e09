"""Optimizer, loss and training loop: formulas, device-count invariance, exact resume, preemption."""

import functools
import json
import math
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest
from conftest import (
    TINY,
    TINY_RUNS,
    cluster_flags,
    env_with_devices,
    final_params,
    is_gloo,
    logged,
    on_two_processes,
    run_train,
    small_config,
    snapshot,
    train_command,
    wait_while_running,
)
from jax.sharding import AxisType, Mesh

from fxformer import exitcodes, metrics, optim, parallel, train, trainstate
from fxformer.config import with_overrides
from fxformer.data import pipeline
from fxformer.model import Transformer, TransformerConfig

# ---------------------------------------------------------------------------------------------
# Formulas


@pytest.mark.parametrize("step", [1, 4000, 100_000])
def test_schedule_is_the_papers_formula(step):
    schedule = optim.paper_schedule(d_model=512, warmup_steps=4000)
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-6)  # optax counts from 0


def numpy_cross_entropy(logits, target, eps):
    """(label-smoothed, plain) cross-entropy of one position, in float64: 1 - eps on the target,
    eps / (V - 1) on every other token."""
    logits = np.asarray(logits, np.float64)
    log_p = logits - np.log(np.exp(logits).sum())
    q = np.full(len(logits), eps / (len(logits) - 1))
    q[target] = 1 - eps
    return -(q * log_p).sum(), -log_p[target]


# The loss as reductions (the default) and in one pass (optim.one_pass_cross_entropy_sums, measured on a GPU)
LOSSES = {"reductions": optim.cross_entropy_sums, "one pass": optim.one_pass_cross_entropy_sums}


@pytest.mark.parametrize("impl", LOSSES)
def test_label_smoothed_loss_equals_numpy_with_pads_ignored(impl):
    rng = np.random.default_rng(0)
    vocab, eps = 7, 0.1
    logits = rng.normal(size=(2, 5, vocab)).astype(np.float32) * 3
    targets = np.array([[4, 5, 6, 3, 0], [1, 3, 0, 0, 0]])
    logits[0, 0, 4] = logits[1, 1, 3] = logits[1, 2, 0] = 20.0  # two right guesses, and a third at a pad
    weights = (targets != 0).astype(np.float32)
    sums = LOSSES[impl](jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), eps)
    loss = nll = 0.0
    count = 0
    for b in range(2):
        for t in range(5):
            if targets[b, t] == 0:
                continue  # padding
            smoothed, plain = numpy_cross_entropy(logits[b, t], targets[b, t], eps)
            loss += smoothed
            nll += plain
            count += 1
    assert float(sums["tokens"]) == count == 6
    assert float(sums["loss"]) / count == pytest.approx(loss / count, rel=1e-5)
    assert float(sums["nll"]) / count == pytest.approx(nll / count, rel=1e-5)
    assert (logits.argmax(-1) == targets).sum() >= 3  # the pad's guess is right too: weights must leave it out
    right = (logits.argmax(-1) == targets) & (targets != 0)
    assert right.sum() == 2 and float(sums["correct"]) == 2


@pytest.mark.parametrize("impl", LOSSES)
def test_label_smoothed_loss_gradient_is_softmax_minus_the_smoothed_target(impl):
    """d loss / d logits = weight * (softmax(logits) - q), q the smoothed target, and d NLL / d logits
    = weight * (softmax(logits) - onehot), against float64 NumPy; bfloat16 logits get bfloat16
    gradients as close to it as bfloat16 allows."""
    rng = np.random.default_rng(1)
    vocab, eps = 11, 0.1
    logits = (rng.normal(size=(3, 4, vocab)) * 4).astype(np.float32)
    targets = rng.integers(1, vocab, size=(3, 4))
    targets[2, 2:] = 0
    weights = (targets != 0).astype(np.float32) * rng.uniform(0.5, 2.0, size=(3, 4)).astype(np.float32)

    def loss(x, key="loss"):
        return LOSSES[impl](x, jnp.asarray(targets), jnp.asarray(weights), eps)[key]

    x64 = logits.astype(np.float64)
    p = np.exp(x64 - x64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = np.full_like(p, eps / (vocab - 1))
    np.put_along_axis(q, targets[..., None], 1 - eps, axis=-1)
    expected = weights[..., None] * (p - q)
    grad = np.asarray(jax.grad(loss)(jnp.asarray(logits)), np.float64)
    np.testing.assert_allclose(grad, expected, atol=1e-6)
    grad16 = jax.grad(loss)(jnp.asarray(logits, jnp.bfloat16))
    assert grad16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(grad16, np.float64), expected, atol=0.02 * np.abs(expected).max())
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, targets[..., None], 1.0, axis=-1)
    nll_grad = np.asarray(jax.grad(functools.partial(loss, key="nll"))(jnp.asarray(logits)), np.float64)
    np.testing.assert_allclose(nll_grad, weights[..., None] * (p - onehot), atol=1e-6)


@pytest.mark.slow  # compiles a model
def test_batch_loss_counts_only_real_tokens_of_real_examples(data_dir):
    """loss_sums on a padded eval batch equals NumPy over its non-pad tokens of unmasked rows."""
    config = tiny_config(data_dir)
    model = Transformer(TransformerConfig.from_config(config.model, 20))
    inputs = jnp.array([[5, 6, 7, 3, 0], [8, 3, 0, 0, 0], [9, 9, 3, 0, 0]])
    targets = jnp.array([[10, 11, 3, 0, 0], [12, 13, 14, 15, 3], [16, 3, 0, 0, 0]])
    params = model.init(jax.random.key(0), inputs, targets)["params"]
    batch = {"inputs": inputs, "targets": targets, "example_mask": jnp.array([1.0, 1.0, 0.0])}  # row 3 is filler
    sums = jax.device_get(optim.loss_sums(params, batch, model, label_smoothing=0.1))
    logits = np.asarray(model.apply({"params": params}, inputs, targets), np.float64)
    loss, count = 0.0, 0
    for b in range(2):
        for t in range(5):
            if targets[b, t] != 0:
                loss += numpy_cross_entropy(logits[b, t], int(targets[b, t]), 0.1)[0]
                count += 1
    assert float(sums["tokens"]) == count == 8
    assert float(sums["loss"]) == pytest.approx(loss, rel=1e-5)


@pytest.mark.slow  # compiles a model
@pytest.mark.parametrize("chunk", [1, 7, 64])  # one token; a chunk that does not divide the 30; more than all
def test_chunked_loss_and_gradients_equal_the_whole_projections(data_dir, chunk):
    """loss_chunk_tokens: the projection and loss a chunk at a time give the sums and the
    gradients of projecting every position at once (same dropout masks), within float32 rounding."""
    config = tiny_config(data_dir)
    model = Transformer(TransformerConfig.from_config(config.model, 20))
    rng = np.random.default_rng(0)
    inputs = jnp.asarray(rng.integers(4, 20, size=(3, 10)))
    targets = jnp.asarray(rng.integers(4, 20, size=(3, 10))).at[1, 6:].set(0)  # row 2 padded, row 3 filler
    params = model.init(jax.random.key(0), inputs, targets)["params"]
    batch = {"inputs": inputs, "targets": targets, "example_mask": jnp.array([1.0, 1.0, 0.0])}

    def loss(params, chunk):
        out = optim.loss_sums(params, batch, model, 0.1, rng=jax.random.key(1), chunk=chunk)
        return out["loss"], out

    (_, whole), whole_grads = jax.value_and_grad(loss, has_aux=True)(params, 0)
    (_, chunked), chunked_grads = jax.value_and_grad(loss, has_aux=True)(params, chunk)
    assert float(chunked["tokens"]) == float(whole["tokens"]) == 16
    for key in optim.SUMS:
        assert float(chunked[key]) == pytest.approx(float(whole[key]), rel=1e-5), key
    flat_whole, flat_chunked = jax.tree.leaves_with_path(whole_grads), jax.tree.leaves(chunked_grads)
    assert len(flat_whole) == len(flat_chunked)
    for (path, a), b in zip(flat_whole, flat_chunked, strict=True):
        assert float(jnp.abs(a).max()) > 0, path  # every parameter gets a gradient: the comparison means something
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6, err_msg=str(path))


# ---------------------------------------------------------------------------------------------
# The step on 8 devices, 1 device, micro-batches


def one_step(config, batch, devices, accum=1):
    mesh = Mesh(np.array(devices), ("data",), axis_types=(AxisType.Auto,))
    model = Transformer(TransformerConfig.from_config(config.model, 400))
    tx = optim.optimizer(config)
    state = jax.jit(functools.partial(trainstate.create_state, model, tx, 0), out_shardings=parallel.replicated(mesh))()
    step = jax.jit(
        functools.partial(
            train.train_step,
            model=model,
            tx=tx,
            schedule=optim.learning_rate_schedule(config),
            label_smoothing=0.1,
            accum=accum,
        ),
        in_shardings=(parallel.replicated(mesh), parallel.sharded_rows(mesh)),
    )
    batch = {k: jax.device_put(v, parallel.sharded_rows(mesh)) for k, v in batch.items()}
    for _ in range(3):  # several steps, so that Adam's update depends on the gradients' values
        state, metrics = step(state, batch)
    return jax.device_get(state.params), jax.device_get(metrics)


@pytest.fixture(scope="module")
def packed_batch(corpus, corpus_ids):
    config, _, _ = corpus
    return next(iter(pipeline.train_dataset(corpus_ids, config.data, 16, seed=0)[0]))


def tiny_config(data_dir, **overrides):
    return with_overrides(small_config(data_dir), {**TINY, **overrides})


def test_logged_and_console_losses_are_their_steps_sums_over_their_tokens():
    """A log line and the console lines between log lines average the same way: the steps' summed
    loss over their summed tokens (a 2-token step weighs a quarter of an 8-token one)."""
    steps = [
        {"loss": 6.0, "nll": 5.0, "correct": 1.0, "tokens": 2.0, "learning_rate": 1e-3},
        {"loss": 30.0, "nll": 20.0, "correct": 4.0, "tokens": 8.0, "learning_rate": 2e-3},
    ]
    shown = metrics.window_metrics(steps)
    assert shown["loss"] == pytest.approx(3.6) and shown["nll"] == pytest.approx(2.5)
    assert shown["ppl"] == pytest.approx(math.exp(2.5)) and shown["accuracy"] == pytest.approx(0.5)
    assert shown["learning_rate"] == 2e-3 and shown["tokens"] == 10.0
    assert metrics.window_metrics(steps[1:])["loss"] == pytest.approx(30.0 / 8.0)  # one step: its own mean


def test_a_metric_is_reduced_as_its_name_declares():
    steps = [
        {"loss": 6.0, "nll": 5.0, "correct": 1.0, "tokens": 2.0, "learning_rate": 1e-3, "x_sum": 4.0, "gnorm": 1.0},
        {"loss": 30.0, "nll": 20.0, "correct": 4.0, "tokens": 8.0, "learning_rate": 2e-3, "x_sum": 16.0, "gnorm": 3.0},
    ]
    shown = metrics.window_metrics(steps)
    assert shown["x"] == pytest.approx(20.0 / 10.0) and "x_sum" not in shown  # per target token
    assert shown["gnorm"] == pytest.approx(2.0)  # the mean over the window's steps
    assert shown["learning_rate"] == 2e-3


ADDED_METRIC = """
import sys
import jax.numpy as jnp
from fxformer import cli, train

step = train.train_step

def with_more(*args, **kwargs):  # two metrics added to train_step's, nothing else changed
    state, found = step(*args, **kwargs)
    return state, {**found, "twice_sum": 2.0 * found["tokens"], "constant": jnp.float32(7.0)}

train.train_step = with_more
sys.argv = ["fxformer.train", *sys.argv[1:]]
cli.run(train.main)
"""


def test_a_metric_added_to_train_step_reaches_metrics_jsonl_and_tensorboard(tmp_path, data_dir, corpus):
    from conftest import env_with_devices, train_command

    script = tmp_path / "added.py"
    script.write_text(ADDED_METRIC)
    workdir = tmp_path / "w"
    command = train_command(workdir, data_dir, num_train_steps=4, log_every_steps=2)
    done = subprocess.run(
        [sys.executable, str(script), *command[3:]],
        env={**env_with_devices(1), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    logged = [line for line in lines if "loss" in line]
    assert [line["step"] for line in logged] == [2, 4]
    assert all(line["twice"] == pytest.approx(2.0) and line["constant"] == pytest.approx(7.0) for line in logged)
    assert read_tensorboard_scalars(workdir / "tensorboard", "twice") == pytest.approx({2: 2.0, 4: 2.0})
    assert read_tensorboard_scalars(workdir / "tensorboard", "constant") == pytest.approx({2: 7.0, 4: 7.0})


# Adam's epsilon for comparing two ways of computing the same step: with the paper's 1e-9, a
# parameter whose gradient is float noise (~1e-8) moves by about the learning rate in a direction
# the noise picks, so summation order alone can move it by 2e-4 (seen once in 2,048 parameters of
# a packed batch); 1e-4 keeps every other update as it is and makes those ones small.
COMPARE_EPS = {"adam_eps": 1e-4}


@pytest.mark.slow  # compiles the model several times
def test_eight_devices_equal_one_device(data_dir, packed_batch):
    cpus = jax.devices("cpu")  # conftest's 8 fake CPU devices, also where a GPU is the default backend
    assert len(cpus) == 8
    config = tiny_config(data_dir, **COMPARE_EPS)  # dropout on: its masks must not depend on the sharding either
    params8, metrics8 = one_step(config, packed_batch, cpus)
    params1, metrics1 = one_step(config, packed_batch, cpus[:1])
    assert float(metrics8["tokens"]) == float(metrics1["tokens"]) > 0
    assert float(metrics8["loss"]) == pytest.approx(float(metrics1["loss"]), rel=1e-5)
    for a, b in zip(jax.tree.leaves(params8), jax.tree.leaves(params1)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow  # compiles the model several times
def test_micro_batches_equal_one_batch(data_dir, packed_batch):
    config = tiny_config(data_dir, **{"model.dropout_rate": 0.0}, **COMPARE_EPS)
    params2, metrics2 = one_step(config, packed_batch, jax.devices("cpu")[:2], accum=2)
    params1, metrics1 = one_step(config, packed_batch, jax.devices("cpu")[:2], accum=1)
    assert float(metrics2["loss"]) == pytest.approx(float(metrics1["loss"]), rel=1e-5)
    for a, b in zip(jax.tree.leaves(params2), jax.tree.leaves(params1)):
        np.testing.assert_allclose(a, b, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The command: resume, preemption, divergence, device counts, processes


def read_tensorboard_scalars(logdir, tag):
    """{step: value} of `tag` from TensorBoard event files, parsed and CRC-checked by hand (TFRecord framing)."""
    from tensorboardX.crc32c import crc32c
    from tensorboardX.proto import event_pb2

    masked = lambda data: (((crc32c(data) >> 15) | (crc32c(data) << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    values = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            header = data[offset : offset + 8]
            (length,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[offset + 8 : offset + 12])[0] == masked(header)
            record = data[offset + 12 : offset + 12 + length]
            assert struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])[0] == masked(record)
            offset += 16 + length
            event = event_pb2.Event()
            event.ParseFromString(record)
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = value.simple_value
    return values


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, data_dir, corpus):
    """60 steps without interruption, batches made in the training process, none placed ahead: (its
    workdir, its final parameters)."""
    straight = tmp_path_factory.mktemp("straight")
    run_train(straight, data_dir, num_train_steps=60, checkpoint_every_steps=30)
    return straight, final_params(straight)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline_flags", [{}, {"data.workers": 1, "data.device_prefetch": 2}], ids=["off", "on"])
def test_resume_after_sigkill_is_exact(tmp_path, data_dir, straight_run, pipeline_flags):
    """Killed at a random step after its first checkpoint and resumed, a run trains exactly as one
    never stopped; with grain workers and batches placed ahead of their step too."""
    (straight, pa), killed = straight_run, tmp_path / "killed"
    events = read_tensorboard_scalars(straight / "tensorboard", "loss")
    assert sorted(events) == list(range(1, 61))
    for step, value in logged(straight).items():
        assert events[step] == pytest.approx(value, rel=1e-6)  # TensorBoard stores float32
    command = train_command(killed, data_dir, num_train_steps=60, checkpoint_every_steps=30, **pipeline_flags)
    process = subprocess.Popen(  # `executable`: a fresh process (not forked), whose children are grain's workers
        command,
        executable=command[0],
        env=env_with_devices(1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    wait_while_running(process, (killed / "checkpoints" / "30" / "_CHECKPOINT_METADATA").exists, deadline, every_s=0.02)
    workers = psutil.Process(process.pid).children(recursive=True)  # grain's, if any
    assert len(workers) >= pipeline_flags.get("data.workers", 0)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert 30 <= max(logged(killed)) < 60  # killed part-way, after the step-30 checkpoint
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive  # no worker outlives the training process
    result = run_train(killed, data_dir, num_train_steps=60, checkpoint_every_steps=30, **pipeline_flags)
    assert "resumed from" in result.stdout
    a, b = logged(straight), logged(killed)
    assert sorted(b) == list(range(1, 61))
    for step in range(31, 61):
        assert f"{a[step]:.3f}" == f"{b[step]:.3f}", step
        assert a[step] == pytest.approx(b[step], rel=1e-6)
    pb = final_params(killed)
    assert pa.keys() == pb.keys()
    for key in pa:
        np.testing.assert_allclose(pa[key], pb[key], rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_saves_and_exits_with_the_stopped_status(sig, tmp_path, data_dir, corpus):
    workdir, out, err = tmp_path / "w", tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout_file, err.open("w") as stderr_file:  # files, not pipes: nothing unread fills up
        process = subprocess.Popen(
            train_command(workdir, data_dir, num_train_steps=100_000),
            env=env_with_devices(1),
            stdout=stdout_file,
            stderr=stderr_file,
        )
        deadline = time.time() + 300
        three_logged = lambda: (workdir / "metrics.jsonl").exists() and len(logged(workdir)) >= 3  # noqa: E731
        wait_while_running(process, three_logged, deadline)
        process.send_signal(sig)
        process.wait(timeout=120)
    stdout, stderr = out.read_text(), err.read_text()
    assert process.returncode == exitcodes.STOPPED != exitcodes.OK, stderr[-2000:]  # a finished run exits 0
    assert "Traceback" not in stderr
    saved = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1 and saved[0] == max(logged(workdir)) >= 3
    assert f"{sig.name}: saved step {saved[0]}" in stdout
    resumed = run_train(workdir, data_dir, num_train_steps=saved[0] + 1)
    assert f"resumed from {workdir / 'checkpoints' / str(saved[0])}" in resumed.stdout


@pytest.mark.slow
def test_a_finished_run_started_again_trains_nothing_and_changes_nothing(tmp_path, data_dir, tiny_run):
    workdir = tiny_run(tmp_path / "w", 2)
    kept = ("metrics.jsonl", "config.json", "best", "checkpoints")  # run.json and TensorBoard: each attempt's own
    before = [snapshot(workdir / name) for name in kept]
    again = run_train(workdir, data_dir, **TINY_RUNS[2])
    assert f"{workdir} is already at step 2 of 2; nothing to train" in again.stdout
    assert [snapshot(workdir / name) for name in kept] == before


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, data_dir, corpus):
    workdir = tmp_path / "w"
    run_train(workdir, data_dir, num_train_steps=5)
    good = final_params(workdir)
    result = subprocess.run(
        train_command(workdir, data_dir, num_train_steps=40, learning_rate_scale=1e30, checkpoint_every_steps=1),
        env=env_with_devices(1),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "The training loss became non-finite at step 7" in result.stderr  # params after step 6 are bad
    assert "the last good checkpoint (step 5) is intact" in result.stderr
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [5]
    after = final_params(workdir)
    for key in good:
        np.testing.assert_array_equal(good[key], after[key])


@pytest.mark.slow
def test_checkpoint_from_eight_devices_restores_on_one_and_four(eight_device_workdir):
    on8, on1, on4 = (final_params(eight_device_workdir, n) for n in (8, 1, 4))
    assert on8.keys() == on1.keys() == on4.keys()
    for key in on8:
        np.testing.assert_array_equal(on8[key], on1[key])
        np.testing.assert_array_equal(on8[key], on4[key])


@pytest.mark.slow
def test_two_processes_train_like_one_process_with_four_devices(tmp_path, data_dir, corpus):
    common = {"num_train_steps": 8, "data.num_shards": 2}
    single = tmp_path / "single"
    run_train(single, data_dir, devices=4, **common)
    multi = tmp_path / "multi"
    ended = on_two_processes(lambda port, i: train_command(multi, data_dir, **common) + cluster_flags(port, i), 600)
    for status, _, stderr in ended:
        assert status == 0, stderr[-3000:]
    assert "4 devices (cpu) in 2 process(es)" in ended[0][1]
    assert not [line for _, out, _ in ended for line in out.splitlines() if is_gloo(line)]  # gloo's: on stderr
    a, b = logged(single), logged(multi)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5), step
    assert math.isfinite(a[8])
