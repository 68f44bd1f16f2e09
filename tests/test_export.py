"""A run trained here, exported by `fxformer.export` to transformers and to CTranslate2, and read
by each library itself: no missing or unexpected weights, the same per-token log-probabilities,
the same greedy translations, and the import of the transformers export gives the run's
parameters back bit for bit (their features in transformers' order). Needs the interop extra
(transformers, torch, ctranslate2); skipped without it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")

import jax  # noqa: E402
from conftest import env_with_devices, left_as_is, refused_in_process, run_train  # noqa: E402
from transformers_peer import their_greedy, their_token_log_probs  # noqa: E402

import fxformer  # noqa: E402
from fxformer import api, ct2, evaluation, exitcodes, export  # noqa: E402
from fxformer.data import pipeline  # noqa: E402
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID  # noqa: E402

# A run that learns enough in some 20 s to translate the dev sentences differently from one another
# and end most of them (dev accuracy about 0.69 at step 150; at the default learning rate and
# dropout, 0.10): epsilon 1e-5, Marian's. Its output projection has no bias (fxformer's default).
MODEL = {"num_layers": 2, "d_model": 64, "d_ff": 128, "num_heads": 4, "d_k": 16, "d_v": 16}
RUN = {
    **{f"model.{k}": v for k, v in MODEL.items()},
    "model.layer_norm_epsilon": 1e-5,
    "num_train_steps": 150,
    "data.tokens_per_batch": 2048,
    "warmup_steps": 40,
    "learning_rate_scale": 0.5,
    "model.dropout_rate": 0.0,
}
SENTENCES = 24


def export_to(workdir, to: str, out, *flags) -> None:
    monkey = pytest.MonkeyPatch()
    monkey.setattr(sys, "argv", ["export", f"--workdir={workdir}", f"--to={to}", *flags, str(out)])
    export.main()
    monkey.undo()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_dir, corpus):
    """(the trained run, the transformers export's folder, its model and tokenizer, loading info,
    the CTranslate2 export's folder, the first dev sentences)."""
    root = tmp_path_factory.mktemp("export")
    run_train(root / "w", data_dir, **RUN)
    export_to(root / "w", "transformers", root / "hf")
    export_to(root / "w", "ctranslate2", root / "ct2")
    model, info = transformers.MarianMTModel.from_pretrained(root / "hf", output_loading_info=True)
    tokenizer = transformers.MarianTokenizer.from_pretrained(root / "hf")
    run = fxformer.load(root / "w")
    test = evaluation.split_test_set(run.config, "validation", SENTENCES, log=lambda *a: None)
    return run, root / "hf", model.eval(), tokenizer, info, root / "ct2", test.sources


def fxformer_token_log_probs(run, sources: list[str], targets: list[str]) -> list[np.ndarray]:
    """fxformer's per-token log-probabilities of each target (its ids ending in </s>) given its source."""
    examples = pipeline.tokenize_pairs(run.tokenizer, sources, targets)
    length = pipeline.eval_length(examples, run.config.model.max_len)
    picked = api.token_log_probs(run.restored.model)
    out = [None] * len(examples)
    for batch in pipeline.eval_batches(examples, 8, length):
        log_probs = np.asarray(jax.device_get(picked(run.params, batch["inputs"], batch["targets"])))
        for j, row, targets_row in zip(batch["index"], log_probs, batch["targets"]):
            if j >= 0:
                out[j] = row[targets_row != PAD_ID]
    return out


def text_of(run, found: list[str]) -> str:
    """CTranslate2's output pieces as fxformer decodes their ids."""
    ids = {piece: i for i, piece in enumerate(run.tokenizer.vocabulary())}
    return run.tokenizer.decode([ids[p] for p in found])


def pieces(run, text: str, end: bool) -> list[str]:
    """`text` as the tokenizer's pieces, its </s> left to CTranslate2 (`end` False) or kept."""
    ids = run.tokenizer.encode_source(text).tolist()
    return [run.tokenizer.piece(i) for i in (ids if end else ids[:-1])]


def test_transformers_reads_every_weight_and_the_tokenizer_as_fxformer_encodes(exported):
    run, _, _, tokenizer, info, _, sources = exported
    assert all(not info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    embedding = np.asarray(run.params["embed"]["embedding"])
    assert np.abs(embedding[BOS_ID]).min() > 0 and not np.allclose(embedding[BOS_ID], embedding[PAD_ID])  # learned
    for source in sources:
        assert tokenizer(source)["input_ids"] == run.tokenizer.encode_source(source).tolist()


def test_every_token_has_the_same_log_probability_in_transformers_and_ctranslate2(exported):
    """Teacher-forced on the dev sentences' references and on fxformer's own translations."""
    run, _, model, _, _, ct2_dir, sources = exported
    references = evaluation.split_test_set(run.config, "validation", SENTENCES, log=lambda *a: None).references
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    largest = {"transformers": 0.0, "ctranslate2": 0.0}
    for targets in (references, run.translate(sources, strategy="greedy")):
        ours = fxformer_token_log_probs(run, sources, targets)
        scored = translator.score_batch(
            [pieces(run, s, end=False) for s in sources], [pieces(run, t, end=False) for t in targets]
        )
        for source, target, mine, theirs in zip(sources, targets, ours, scored):
            ids = run.tokenizer.encode_target(target).tolist()
            hf = their_token_log_probs(model, run.tokenizer.encode_source(source).tolist(), ids)
            assert len(hf) == len(theirs.log_probs) == len(mine) and ids[-1] == EOS_ID
            largest["transformers"] = max(largest["transformers"], float(np.abs(hf - mine).max()))
            largest["ctranslate2"] = max(largest["ctranslate2"], float(np.abs(np.array(theirs.log_probs) - mine).max()))
    print(f"largest per-token log-probability difference over {2 * len(sources)} pairs: {largest}")
    assert max(largest.values()) < 1e-4


def test_greedy_translations_are_transformers_generate_and_ctranslate2s_translate_batch(exported):
    run, _, model, tokenizer, _, ct2_dir, sources = exported
    max_extra = run.config.decode.max_extra
    ours = run.translate(sources, strategy="greedy")
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    options = json.loads((ct2_dir / "fxformer.json").read_text())["translate_batch"]
    assert options["suppress_sequences"] == [["<pad>"], ["<s>"]]
    for source, translation in zip(sources, ours):
        assert translation == their_greedy(model, tokenizer, source, max_extra, barred=[PAD_ID, BOS_ID]), source
        limit = len(run.tokenizer.encode_source(source)) + max_extra  # fxformer's: the source's length + max_extra
        found = translator.translate_batch(
            [pieces(run, source, end=False)],
            beam_size=1,
            max_decoding_length=limit,
            min_decoding_length=0,
            suppress_sequences=options["suppress_sequences"],
        )[0].hypotheses[0]
        assert text_of(run, found) == translation, source
    print(f"greedy: {len(ours)} sentences equal in all three, {len(set(ours))} distinct")
    assert len(set(ours)) >= 10


def test_the_recipes_in_the_docs_run_on_the_exports(exported, tmp_path, monkeypatch, capsys):
    """docs/interop.md's export Python (its `python export` blocks), run where exported/ and
    exported-ct2/ are this run's exports, on a dev sentence whose greedy search ends before
    fxformer's length limit: the pipeline and CTranslate2 translate it as fxformer does."""
    run, hf, _, _, _, ct2_dir, sources = exported
    (tmp_path / "exported").symlink_to(hf)
    (tmp_path / "exported-ct2").symlink_to(ct2_dir)
    monkeypatch.chdir(tmp_path)
    limit = run.config.decode.max_extra
    translations = run.translate(sources, strategy="greedy")
    sentence, ours = next(
        (s, t)
        for s, t in zip(sources, translations)
        if len(run.tokenizer.encode_target(t)) < len(run.tokenizer.encode_source(s)) + limit
    )
    page = (Path(__file__).resolve().parent.parent / "docs" / "interop.md").read_text()
    recipes = re.findall(r"^```python export\n(.*?)^```", page, re.S | re.M)
    assert len(recipes) == 2
    scope = {}
    for code in recipes:
        code = code.replace("The old teacher has helped the boy.", sentence.replace('"', '\\"'))
        exec(compile(code, "docs/interop.md", "exec"), scope)
    assert scope["translate"](sentence, num_beams=1)[0]["translation_text"] == ours
    assert capsys.readouterr().out.strip() == ours


def test_importing_the_export_gives_the_parameters_back_bit_for_bit(exported):
    """The run's parameters and the import's of the export, each written as the export writes them
    (the run's features reordered, the import's already in that order): equal, bit for bit."""
    run, hf, _, _, _, _, _ = exported
    back = fxformer.load(hf)
    layers, d_model = run.config.model.num_layers, run.config.model.d_model
    order = export.feature_order(d_model, run.config.model.sinusoid_layout)
    ours = export.tensors_of(jax.device_get(run.params), order, layers, layers)
    theirs = export.tensors_of(jax.device_get(back.params), np.arange(d_model), layers, layers)
    assert sorted(ours) == sorted(theirs) and all(np.array_equal(ours[k], theirs[k]) for k in ours)
    fields = ("num_layers", "d_model", "d_ff", "num_heads", "d_k", "d_v", "activation", "layer_norm_epsilon")
    fields += ("max_len", "scale_embedding", "norm", "positional")
    assert {f: back.config.model[f] for f in fields} == {f: run.config.model[f] for f in fields}
    assert back.tokenizer.vocab_size == run.tokenizer.vocab_size
    assert json.loads((hf / "generation_config.json").read_text())["bad_words_ids"] == [[PAD_ID], [BOS_ID]]


def test_an_int8_export_is_smaller_and_scores_the_dev_references_near_float32(exported, tmp_path):
    run, _, _, _, _, ct2_dir, sources = exported
    export_to(run.workdir.root, "ctranslate2", tmp_path / "int8", "--quantization=int8")
    references = evaluation.split_test_set(run.config, "validation", SENTENCES, log=lambda *a: None).references
    batch = [pieces(run, s, end=False) for s in sources], [pieces(run, t, end=False) for t in references]
    summed = {}
    for name, folder in (("float32", ct2_dir), ("int8", tmp_path / "int8")):
        translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=name)
        summed[name] = sum(sum(r.log_probs) for r in translator.score_batch(*batch))
    size = {
        name: (folder / "model.bin").stat().st_size
        for name, folder in (("float32", ct2_dir), ("int8", tmp_path / "int8"))
    }
    print(f"int8: summed log-probability of {SENTENCES} dev references {summed}, model.bin bytes {size}")
    tokens = sum(len(t) + 1 for t in batch[1])
    assert size["int8"] < 0.6 * size["float32"]
    # int8 weights move a d_model-64 model's log-probabilities by a few percent (7.9% here): far
    # from another model's, a uniform guess being -log(vocabulary) a token
    assert abs(summed["int8"] - summed["float32"]) < 0.15 * abs(summed["float32"])
    assert summed["int8"] > 0.5 * tokens * -np.log(run.tokenizer.vocab_size)


def test_what_cannot_be_exported_is_refused_in_one_sentence(exported, tiny_run, tmp_path, monkeypatch):
    run, hf, *_ = exported
    workdir = tiny_run(tmp_path / "w")  # the paper's epsilon, 1e-6
    out = tmp_path / "out"
    refused = refused_in_process(monkeypatch, export.main, [f"--workdir={workdir}", "--to=transformers", str(out)])
    assert "transformers' Marian fixes it at 1e-5: give --allow_epsilon_change" in refused and not out.exists()
    refused = refused_in_process(
        monkeypatch, export.main, [f"--workdir={run.workdir.root}", "--to=transformers", str(hf)], hf
    )
    assert "is not empty: give --overwrite" in refused
    refused = refused_in_process(
        monkeypatch, export.main, [f"--workdir={run.workdir.root}", "--step=7", "--to=ctranslate2", str(out)]
    )
    assert "7" in refused and not out.exists()
    model = fxformer.load(workdir).config.model
    for field, value, words in (
        ("norm", "pre", "post"),
        ("positional", "learned", "no learned positions"),
        ("d_k", 8, "d_k 8"),
    ):
        changed = model.copy_and_resolve_references()
        changed[field] = value
        assert words in export.refusal(changed, allow_epsilon_change=True)
        if field != "positional":  # CTranslate2 takes any position table
            assert ct2.refusal(changed) and words in ct2.refusal(changed)
    command = [sys.executable, "-m", "fxformer.export", f"--workdir={workdir}", "--to=ctranslate2", str(out)]
    changed = workdir / "config.json"
    config = json.loads(changed.read_text())
    config["model"]["norm"] = "pre"
    changed.write_text(json.dumps(config))
    with left_as_is(workdir):
        done = subprocess.run(command, capture_output=True, text=True, env=env_with_devices(1))
    assert done.returncode == exitcodes.USER_ERROR and "post-norm" in done.stderr and not out.exists()
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
