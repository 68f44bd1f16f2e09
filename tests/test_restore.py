"""Inference restores parameters alone: no optimizer state is built or read, and the parameters
equal those of the full training state (one checkpoint, an average, the best), on the run
trained with 8 fake devices; the checkpoint choice and its flags."""

import functools
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

import fxformer
from fxformer import checkpoint, configfile, inferflags, parallel, paths, trainstate
from fxformer.config import load_workdir_config
from fxformer.data.tokenizer import Tokenizer
from fxformer.errors import UserError


def bytes_read() -> int:
    """Bytes this process has read from local files through TensorStore (orbax's array reads)."""
    metrics = ts.experimental_collect_matching_metrics("/tensorstore/kvstore/file/bytes_read")
    return sum(value["value"] for metric in metrics for value in metric["values"])


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def tiny_model_config():
    config = configfile.load_config("configs/default.py")
    for key, value in {"num_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 2, "d_k": 16, "d_v": 16}.items():
        config.model[key] = value
    return config


@pytest.mark.slow  # trains, saves and restores (the fast set stays under a minute)
def test_the_parameters_are_read_alone_from_a_training_checkpoint(tmp_path):
    config, mesh = tiny_model_config(), parallel.data_mesh()
    model, tx, abstract_state = trainstate.build(config, 100, mesh)
    state = jax.jit(functools.partial(trainstate.create_state, model, tx, 0))()
    noise = lambda x: x + jax.random.normal(jax.random.key(1), x.shape) if x.dtype == jnp.float32 else x  # noqa: E731
    state = state.replace(opt_state=jax.tree.map(noise, state.opt_state))  # moments as incompressible as parameters
    with checkpoint.open_manager(tmp_path, asynchronous=False) as manager:
        checkpoint.save(manager, 5, state)
    before = bytes_read()
    with checkpoint.open_manager(tmp_path, asynchronous=False) as manager:
        params = checkpoint.training_params(manager, 5, trainstate.abstract_params(model, mesh))
    partial = bytes_read() - before
    with checkpoint.open_manager(tmp_path, asynchronous=False) as manager:
        full = checkpoint.restore_training_state(manager, 5, abstract_state)
    whole = bytes_read() - before - partial
    assert jax.tree.structure(params) == jax.tree.structure(state.params)
    for got, want in zip(leaves(params), leaves(state.params), strict=True):
        np.testing.assert_array_equal(got, want)
    assert jax.tree.leaves(params)[0].sharding == parallel.replicated(mesh)  # placed as the mesh wants
    assert jax.tree.structure(full.opt_state) == jax.tree.structure(state.opt_state)
    assert 0 < partial < whole / 2  # the Adam moments (2 x the parameters) are not read


def test_the_checkpoint_choice_is_refused_in_one_sentence_before_any_restore(tmp_path):
    assert [inferflags.checkpoint_choice(flag) for flag in ("latest", "best", "20")] == ["latest", "best", 20]
    for flag in ("last", "-3", "0x10"):
        with pytest.raises(UserError, match="'latest', 'best', 'ema' or a step number"):
            inferflags.checkpoint_choice(flag)
    nowhere = tmp_path / "nowhere"  # refused before the workdir is read
    with pytest.raises(UserError, match="average_last must be positive"):
        fxformer.load(paths.Workdir(nowhere), average_last=0)
    with pytest.raises(UserError, match="keeps one checkpoint: the best is not averaged"):
        fxformer.load(paths.Workdir(nowhere), "best", average_last=2)
    with pytest.raises(UserError, match="'latest', 'best', 'ema' or a step number, not 'last'"):
        fxformer.load(paths.Workdir(nowhere), "last")


@pytest.mark.slow  # restores a trained run in-process
def test_restore_holds_the_parameters_of_the_full_state_and_nothing_else(eight_device_workdir, tmp_path):
    workdir = tmp_path / "w"
    shutil.copytree(eight_device_workdir, workdir)  # the average is saved into it
    config = load_workdir_config(paths.Workdir(workdir))
    vocab_size = Tokenizer(workdir / "tokenizer.model").vocab_size
    model, _, abstract_state = trainstate.build(config, vocab_size, parallel.data_mesh())
    tokens = jnp.ones((1, 4), jnp.int32)
    init = jax.eval_shape(model.init, jax.random.key(0), tokens, tokens)["params"]
    with checkpoint.open_manager(
        workdir / "checkpoints", asynchronous=False
    ) as manager:  # the whole state, as train reads it
        restored = {step: checkpoint.restore_training_state(manager, step, abstract_state) for step in (10, 20)}
        full = {step: leaves(state.params) for step, state in restored.items()}
    (best_step,) = [int(p.name) for p in (workdir / "best").iterdir() if p.name.isdigit()]
    mean = [np.mean(np.stack([a, b]), axis=0) for a, b in zip(full[10], full[20])]
    quiet = lambda *a, **k: None  # noqa: E731
    cases = {  # (step, average_last): (steps, expected parameters)
        ("latest", None): ([20], full[20]),  # the config's average_last: 1
        ("latest", 1): ([20], full[20]),
        (10, None): ([10], full[10]),
        ("best", None): ([best_step], full[best_step]),
        ("latest", 2): ([10, 20], mean),  # averaged, and saved
        (20, 2): ([10, 20], mean),  # read from W/averaged/last2/20
    }
    for (step, k), (steps, expected) in cases.items():
        run = fxformer.load(paths.Workdir(workdir), step, k, log=quiet)
        assert run.steps == steps, (step, k)
        assert jax.tree.structure(run.params) == jax.tree.structure(init), (step, k)  # no optimizer state
        for got, want in zip(leaves(run.params), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=str((step, k)))
    assert (workdir / "averaged" / "last2" / "20").exists()
    shutil.rmtree(workdir / "averaged")
    run = fxformer.load(paths.Workdir(workdir), average_last=2, log=quiet, keep_average=False)  # as attention's
    assert run.steps == [10, 20] and not (workdir / "averaged").exists()
    with pytest.raises(UserError, match="No checkpoint at step 15 in"):
        fxformer.load(paths.Workdir(workdir), 15, log=quiet)
