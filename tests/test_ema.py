"""Smoothed weights (`ema_decay`): the moving average the optimizer state keeps equals its closed
form, a run that keeps two of them resumes bit for bit, `--step=ema` evaluates them beside the last
checkpoint, and what cannot be asked of them is refused in one sentence."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import run_module, run_train

import fxformer
from fxformer import checkpoint, optim, paths
from fxformer.errors import UserError

DECAYS = (0.9, 0.5)
SMOOTHED = {"ema_decay": "0.9,0.5", "num_train_steps": 6, "checkpoint_every_steps": 3}


def test_the_smoothed_weights_after_n_steps_equal_the_closed_form():
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(7, 5)).astype(np.float32)  # a toy sequence: theta_k = theta_(k-1) + u_k
    start = rng.normal(size=5).astype(np.float32)
    tx = optim.with_smoothed_weights(optax.sgd(-1.0), DECAYS)  # sgd(-1): the update is the "gradient" itself
    params, state = {"w": jnp.asarray(start)}, None
    state = tx.init(params)
    thetas = []
    for u in updates:
        step, state = tx.update({"w": jnp.asarray(u)}, state, params)
        params = optax.apply_updates(params, step)
        thetas.append(np.asarray(params["w"], np.float64))
    n = len(updates)
    for d in DECAYS:
        weights = np.array([(1 - d) * d ** (n - k) for k in range(1, n + 1)]) / (1 - d**n)
        expected = (weights[:, None] * np.array(thetas)).sum(0)  # no weight on the initial parameters
        got = optim.smoothed(state["ema"][optim.ema_key(d)], d, n)["w"]
        np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-6)
        assert abs(weights.sum() - 1) < 1e-12
    assert np.abs(np.asarray(params["w"]) - start).max() > 1  # the parameters moved


def state_at(workdir, step: int) -> dict:
    """The parameters and both smoothed averages a checkpoint holds."""
    params = fxformer.load(workdir, step=step, average_last=1).params
    held = {"params": params}
    for d in DECAYS:
        held[f"ema{d}"] = checkpoint.smoothed_params(paths.Workdir(workdir), optim.ema_key(d), params)[0]
    return jax.tree.map(np.asarray, held)


@pytest.fixture(scope="module")
def smoothed_run(tmp_path_factory, data_dir, corpus):
    workdir = tmp_path_factory.mktemp("ema") / "w"
    run_train(workdir, data_dir, **SMOOTHED)
    return workdir


def test_a_run_keeping_two_averages_resumes_bit_for_bit(smoothed_run, tmp_path, data_dir):
    resumed = tmp_path / "resumed"
    run_train(resumed, data_dir, **{**SMOOTHED, "num_train_steps": 3})
    result = run_train(resumed, data_dir, **SMOOTHED)
    assert "resumed from" in result.stdout
    a, b = state_at(smoothed_run, 6), state_at(resumed, 6)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    smoothed, raw = jax.tree.leaves(a["ema0.5"]), jax.tree.leaves(a["params"])
    assert max(np.abs(s - r).max() for s, r in zip(smoothed, raw)) > 0  # an average, not the last step


def test_step_ema_evaluates_the_smoothed_weights_and_refuses_what_it_cannot(smoothed_run, tmp_path, tiny_run):
    w = str(smoothed_run)
    done = run_module("fxformer.evaluate", f"--workdir={w}", "--step=ema", "--split=validation", "--limit=4")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((smoothed_run / "eval" / "validation-6-ema0.9-first4.json").read_text())
    assert result["checkpoint_steps"] == [6]
    run = fxformer.load(smoothed_run, step="ema0.5")
    assert run.name == "6-ema0.5"
    ema = checkpoint.smoothed_params(paths.Workdir(smoothed_run), optim.ema_key(0.5), run.params)[0]
    expected = jax.tree.map(lambda e: np.asarray(e) / (1 - 0.5**6), ema)
    for x, y in zip(jax.tree.leaves(run.params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(x), y, rtol=1e-6)  # debiased: divided by 1 - 0.5^6
    refusals = {
        "are an average already": dict(step="ema", average_last=5),
        "keeps smoothed weights ema0.9, ema0.5, not ema0.99": dict(step="ema0.99"),
    }
    for words, kwargs in refusals.items():
        with pytest.raises(UserError, match=words):
            fxformer.load(smoothed_run, **kwargs)
    plain = tiny_run(tmp_path / "plain", 2)
    refused = run_module("fxformer.evaluate", f"--workdir={plain}", "--step=ema")
    assert refused.returncode == 2 and "trained without smoothed weights (ema_decay 0)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    bad = run_module(
        "fxformer.train", "--config=configs/default.py", f"--workdir={tmp_path / 'x'}", "--config.ema_decay=1.5"
    )
    assert bad.returncode == 2 and "ema_decay=1.5 is not a decay" in bad.stderr and not (tmp_path / "x").exists()
