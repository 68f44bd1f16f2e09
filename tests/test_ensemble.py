"""Ensembles (`fxformer.ensemble`): several runs searched and scored as one model. Their members
here are one tiny run's checkpoints at steps 2 and 4 (members may differ in step). Checked against
the members themselves: an ensemble of one is the run; two copies of a run translate as it does;
every step of the ensemble's incremental decoding is the NumPy combination of the members' own
teacher-forced distributions; `score` is the sum of those steps; the commands take a repeated
--workdir; runs with different tokenizers are refused."""

import functools
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_module
from scipy.special import logsumexp

import fxformer
from fxformer import ensemble, inference
from fxformer.data import corpora
from fxformer.data.tokenizer import train_tokenizer
from fxformer.errors import UserError
from fxformer.tokens import BOS_ID, PAD_ID

SENTENCES = ["The old teacher has helped the boy.", "", "My mother sees the dog in the garden."]


@pytest.fixture(scope="module")
def trained(tiny_run, tmp_path_factory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("ensemble") / "w", 4)  # checkpoints at 2 and 4


@functools.cache
def dev_pairs(trained: Path) -> tuple[list[str], list[str]]:
    """The first six (source, reference) pairs of the run's dev split, as two lists."""
    data = fxformer.load(trained, step=4, average_last=1).config.data
    records = corpora.data_source(corpora.prepare(data, log=lambda *a: None), "validation")
    return tuple([records[i][lang].decode() for i in range(6)] for lang in (data.source_lang, data.target_lang))


@pytest.fixture(scope="module")
def pairs(trained) -> tuple[list[str], list[str]]:
    return dev_pairs(trained)


def test_an_ensemble_of_one_is_the_run(trained, pairs):
    run, one = fxformer.load(trained, step=2), fxformer.load([trained], step=2)
    assert one.translate(SENTENCES) == run.translate(SENTENCES)
    assert one.nbest(SENTENCES, beam_size=3, nbest=3) == run.nbest(SENTENCES, beam_size=3, nbest=3)
    assert one.score(*pairs) == run.score(*pairs)


@pytest.mark.parametrize("average", ensemble.AVERAGES)
def test_two_copies_of_a_run_translate_as_it_does(trained, pairs, average):
    run = fxformer.load(trained, step=4, average_last=1)
    both = fxformer.load([(trained, 4, 1), (trained, 4, 1)], average=average)
    assert len(both.members) == 2 and both.name == "ensemble-w.4+w.4"
    searches = [{}, {"beam_size": 3, "nbest": 3}, {"strategy": "sample", "nbest": 2}]  # one step function serves all
    for options in searches if average == "probabilities" else searches[:1]:
        ours, theirs = run.nbest(SENTENCES, **options), both.nbest(SENTENCES, **options)
        assert [[t for t, _ in found] for found in ours] == [[t for t, _ in found] for found in theirs]
        scores = [s for found in ours for _, s in found], [s for found in theirs for _, s in found]
        np.testing.assert_allclose(*scores, rtol=1e-6)  # sums of up to 40 tokens' float32 log-probabilities
    np.testing.assert_allclose(
        [s.log_prob for s in run.score(*pairs)], [s.log_prob for s in both.score(*pairs)], rtol=1e-6
    )
    per_token = [teacher_forced(r, *pairs) for r in (run, both)]  # every token's, every vocabulary entry
    assert np.abs(per_token[0] - per_token[1]).max() < 1e-6


def numpy_combination(members: list[np.ndarray], average: str) -> np.ndarray:
    """The ensemble's log-probabilities, from the members', as `fxformer.ensemble` defines them."""
    stacked = np.stack(members).astype(np.float64)
    if average == "probabilities":
        return logsumexp(stacked, axis=0) - np.log(len(members))
    mean = stacked.mean(axis=0)
    return mean - logsumexp(mean, axis=-1, keepdims=True)


@functools.cache
def stepped_pairs(trained: Path, average: str) -> tuple[np.ndarray, np.ndarray]:
    """`stepped` for the ensemble of the run's steps 2 and 4 on the first dev pairs."""
    both = fxformer.load([(trained, 2, 1), (trained, 4, 1)], average=average)
    return stepped(both, *dev_pairs(trained))


def stepped(run, sources: list[str], targets: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The run's search step function fed each reference token in turn (its decoder cache growing
    as a search's does): the next-token log-probabilities at every target position [b, l, vocab],
    and the targets [b, l] (PAD after each one's end)."""
    tok = run.tokenizer
    sources_ids, targets_ids = [tok.encode_source(s) for s in sources], [tok.encode_target(t) for t in targets]
    inputs = np.full((len(sources), max(map(len, sources_ids))), PAD_ID, np.int32)
    for row, ids in zip(inputs, sources_ids):
        row[: len(ids)] = ids
    length = max(map(len, targets_ids))
    model = run.restored.model
    config = model if isinstance(model, ensemble.Ensemble) else model.config
    d = inference.start_decoding(config, run.params, jnp.asarray(inputs), copies=1, max_extra=length)
    cache, previous, out = d.grow(d.cache, d.max_len), np.full(len(sources), BOS_ID, np.int32), []
    targets_array = np.full((len(sources), length), PAD_ID, np.int32)
    for row, ids in zip(targets_array, targets_ids):
        row[: len(ids)] = ids
    step = jax.jit(d.step)
    for t in range(length):
        log_probs, cache = step(jnp.asarray(previous), cache)
        out.append(np.asarray(log_probs))
        previous = targets_array[:, t]
    return np.stack(out, axis=1), targets_array


def teacher_forced(run, sources: list[str], targets: list[str]) -> np.ndarray:
    """The run's own full next-token log-probabilities [b, l, vocab] from one teacher-forced pass."""
    tok = run.tokenizer
    batch = [(tok.encode_source(s), tok.encode_target(t)) for s, t in zip(sources, targets)]
    pad = lambda rows: np.array([np.pad(r, (0, max(map(len, rows)) - len(r))) for r in rows], np.int32)  # noqa: E731
    inputs, targets_array = pad([s for s, _ in batch]), pad([t for _, t in batch])
    return np.asarray(inference.log_probs(run.restored.model, run.params, inputs, targets_array))


@pytest.mark.parametrize("average", ensemble.AVERAGES)
def test_each_step_is_the_numpy_combination_of_the_members_own_distributions(trained, pairs, average):
    members = [fxformer.load(trained, step=s, average_last=1) for s in (2, 4)]
    sources, targets = pairs
    steps, targets_array = stepped_pairs(trained, average)
    expected = numpy_combination([teacher_forced(m, sources, targets) for m in members], average)
    real = targets_array != PAD_ID
    expected[..., [PAD_ID, BOS_ID]] = -np.inf  # what every search leaves out
    assert np.array_equal(np.isinf(steps[real]), np.isinf(expected[real]))
    finite = ~np.isinf(expected[real])
    np.testing.assert_allclose(steps[real][finite], expected[real][finite], atol=2e-5, rtol=0)
    # and the members differ, so that the combination is not one of them
    assert (
        np.abs(teacher_forced(members[0], sources, targets) - teacher_forced(members[1], sources, targets)).max() > 0.1
    )


@pytest.mark.parametrize("average", ensemble.AVERAGES)
def test_score_is_the_sum_of_the_ensembles_step_log_probabilities(trained, pairs, average):
    both = fxformer.load([(trained, 2, 1), (trained, 4, 1)], average=average)
    steps, targets_array = stepped_pairs(trained, average)
    picked = np.take_along_axis(steps, targets_array[..., None], axis=-1)[..., 0]
    summed = np.where(targets_array != PAD_ID, picked, 0.0).sum(-1)
    scores = both.score(*pairs)
    assert [s.tokens for s in scores] == (targets_array != PAD_ID).sum(-1).tolist()
    np.testing.assert_allclose([s.log_prob for s in scores], summed, atol=1e-4, rtol=0)


def test_the_commands_take_a_repeated_workdir_and_name_the_members(trained, tmp_path):
    w = str(trained)
    flags = [f"--workdir={w}", f"--workdir={w}", "--step=4", "--average_last=1"]
    both = fxformer.load([(trained, 4, 1), (trained, 4, 1)])
    printed = run_module("fxformer.translate", *flags, stdin="".join(s + "\n" for s in SENTENCES))
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert printed.stdout.splitlines() == both.translate(SENTENCES) and "an ensemble of 2" in printed.stderr
    evaluated = run_module("fxformer.evaluate", *flags, "--split=validation", "--limit=6")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    result = json.loads((trained / "eval" / "validation-ensemble-w.4+w.4-first6.json").read_text())
    assert result["ensemble"]["average"] == "probabilities"
    assert [m["checkpoint_steps"] for m in result["ensemble"]["members"]] == [[4], [4]]
    ppl = both.evaluate("validation", limit=6, out=tmp_path / "mine")["ppl"]
    assert result["ppl"] == pytest.approx(ppl, rel=1e-6)
    refused = run_module("fxformer.attention_maps", *flags, "--source=The dog sleeps.")
    assert refused.returncode == 2 and "takes one --workdir, not 2" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_runs_with_different_tokenizers_are_refused_naming_both(trained, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    run = fxformer.load(trained, step=4, average_last=1)
    sentences = [run.tokenizer.decode(run.tokenizer.encode(s)) for s in SENTENCES * 50 if s]
    train_tokenizer(sentences, 60, other / "tokenizer.model", 1000, log=lambda *a: None)
    with pytest.raises(UserError, match=f"^{trained} and {other} have different tokenizers"):
        fxformer.load([trained, other])
    with pytest.raises(UserError, match="no attention weights of its own"):
        fxformer.load([trained, trained]).attention("The dog sleeps.")
