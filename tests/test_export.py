"""A run trained here, exported by `fxformer.export --to=transformers` and read by transformers
itself: no missing or unexpected weights, the same per-token log-probabilities and greedy
translations, and the import of the export gives the run's parameters back bit for bit (their
features in transformers' order). Needs the interop extra (transformers, torch); skipped without it."""

import json
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
from conftest import refused_in_process, run_train  # noqa: E402
from transformers_peer import their_greedy, their_log_probs  # noqa: E402

import fxformer  # noqa: E402
from fxformer import evaluation, export  # noqa: E402
from fxformer.tokens import BOS_ID, PAD_ID  # noqa: E402

STEPS = 200


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_dir, corpus):
    """(the trained run, its export, transformers' model and tokenizer of it, 40 dev sentences)."""
    root = tmp_path_factory.mktemp("export")
    model = {
        "num_layers": 2,
        "d_model": 64,
        "d_ff": 128,
        "num_heads": 4,
        "d_k": 16,
        "d_v": 16,
        "layer_norm_epsilon": 1e-5,
    }
    run_train(root / "w", data_dir, num_train_steps=STEPS, **{f"model.{k}": v for k, v in model.items()})
    monkey = pytest.MonkeyPatch()
    monkey.setattr(sys, "argv", ["export", f"--workdir={root / 'w'}", "--to=transformers", str(root / "hf")])
    export.main()
    monkey.undo()
    model, info = transformers.MarianMTModel.from_pretrained(root / "hf", output_loading_info=True)
    tokenizer = transformers.MarianTokenizer.from_pretrained(root / "hf")
    run = fxformer.load(root / "w")
    test = evaluation.split_test_set(run.config, "validation", 40, log=lambda *a: None)
    return run, root / "hf", model.eval(), tokenizer, info, test.sources


def test_transformers_reads_every_weight_and_the_tokenizer_as_fxformer_encodes(exported):
    run, _, _, tokenizer, info, sources = exported
    assert all(not info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    embedding = np.asarray(run.params["embed"]["embedding"])
    assert np.abs(embedding[BOS_ID]).min() > 0 and not np.allclose(embedding[BOS_ID], embedding[PAD_ID])  # learned
    for source in sources:
        assert tokenizer(source)["input_ids"] == run.tokenizer.encode_source(source).tolist()


def test_the_log_probabilities_are_transformers(exported):
    run, _, model, tokenizer, _, sources = exported
    targets = run.translate(sources, strategy="greedy")
    largest = 0.0
    for source, target, score in zip(sources, targets, run.score(sources, targets)):
        largest = max(largest, abs(their_log_probs(model, tokenizer, source, target).sum() - score.log_prob))
    print(f"largest summed log-probability difference over {len(sources)} sentences: {largest:.2e}")
    assert largest < 1e-3


def test_greedy_translations_are_transformers_generate(exported):
    run, _, model, tokenizer, _, sources = exported
    max_extra = run.config.decode.max_extra
    ours = run.translate(sources, strategy="greedy")
    for source, translation in zip(sources, ours):
        assert translation == their_greedy(model, tokenizer, source, max_extra, barred=[PAD_ID, BOS_ID]), source
    print(f"greedy: {len(ours)} sentences equal, {len(set(ours))} distinct")  # a barely trained model: few


def test_importing_the_export_gives_the_parameters_back_bit_for_bit(exported):
    """The run's parameters and the import's of the export, each written as the export writes them
    (the run's features reordered, the import's already in that order): equal, bit for bit."""
    run, hf, _, _, _, _ = exported
    back = fxformer.load(hf)
    layers, d_model = run.config.model.num_layers, run.config.model.d_model
    order = export.feature_order(d_model, run.config.model.sinusoid_layout)
    ours = export.tensors_of(jax.device_get(run.params), order, layers, layers)
    theirs = export.tensors_of(jax.device_get(back.params), np.arange(d_model), layers, layers)
    assert sorted(ours) == sorted(theirs) and all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert json.loads((hf / "generation_config.json").read_text())["bad_words_ids"] == [[PAD_ID], [BOS_ID]]


def test_a_run_marian_cannot_hold_is_refused_in_one_sentence(tiny_run, tmp_path, monkeypatch):
    workdir = tiny_run(tmp_path / "w")  # the paper's epsilon, 1e-6
    argv = [f"--workdir={workdir}", "--to=transformers", str(tmp_path / "out")]
    refused = refused_in_process(monkeypatch, export.main, argv, workdir, tmp_path / "out")
    assert "transformers' Marian fixes it at 1e-5: give --allow_epsilon_change" in refused
    model = fxformer.load(workdir).config.model
    for field, value, words in (
        ("norm", "pre", "post"),
        ("positional", "learned", "no learned positions"),
        ("d_k", 8, "d_k 8"),
    ):
        changed = model.copy_and_resolve_references()
        changed[field] = value
        assert words in export.refusal(changed, allow_epsilon_change=True)
