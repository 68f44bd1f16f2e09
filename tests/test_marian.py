"""A Marian model built by transformers itself (random weights drawn wide, swish, scale_embedding,
<pad> last and the decoder starting from it, a SentencePiece model per side trained here, a
vocab.json in Marian's layout), written by `save_pretrained` and read by `fxformer.load`: the
teacher-forced log-probabilities and the greedy translations equal transformers' own.
Needs the interop extra (transformers, torch); skipped without it."""

import dataclasses
import importlib
import json
import math
import random
import re
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import sacrebleu  # noqa: E402
import sentencepiece as spm  # noqa: E402
from conftest import SMALL_DATA, left_as_is, refused_in_process, run_module  # noqa: E402
from flax import linen as nn  # noqa: E402
from transformers_peer import their_greedy, their_log_probs, their_search, their_token_log_probs  # noqa: E402

import fxformer  # noqa: E402
from fxformer import marian as importer  # noqa: E402
from fxformer import trainstate  # noqa: E402
from fxformer.errors import UserError  # noqa: E402
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID  # noqa: E402

WORDS = {
    "en": "the a old young teacher boy girl dog cat house garden helped saw sleeps runs quickly with in on".split(),
    "de": "der die das alte junge Lehrer Junge Mädchen Hund Katze Haus Garten half sah schläft läuft schnell".split(),
}


def sentences(lang: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS[lang]) for _ in range(rng.randint(2, 9))) + "." for _ in range(n)]


def train_spm(path, lang: str) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences(lang, 400, 0)),
        model_prefix=str(path / lang),
        vocab_size=60,
        model_type="bpe",
        pad_id=-1,
        bos_id=-1,
        eos_id=2,
        unk_id=1,  # ids inside the .spm do not matter: Marian maps pieces through vocab.json
    )


def marian_dir(root, *, activation: str = "swish", seed: int = 0):
    """A Marian directory written by transformers' save_pretrained, weights drawn wide."""
    train_spm(root, "en")
    train_spm(root, "de")
    pieces = ["</s>", "<unk>"]
    for lang in ("en", "de"):
        sp = spm.SentencePieceProcessor(model_file=str(root / f"{lang}.model"))
        pieces += [
            sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)
        ]
    pieces = list(dict.fromkeys(pieces)) + ["<pad>"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    (root / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = transformers.MarianTokenizer(str(root / "en.model"), str(root / "de.model"), str(root / "vocab.json"))
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        activation_function=activation,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=None,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0.0, 0.35 if p.ndim == 2 else 0.2)
        model.final_logits_bias.normal_(0.0, 0.5)
    out = root / "opus-mt-tiny"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    root = tmp_path_factory.mktemp("marian")
    path = marian_dir(root)
    model = transformers.MarianMTModel.from_pretrained(path).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(path)
    return path, model, tokenizer


def our_log_probs(run, pairs) -> list[np.ndarray]:
    """fxformer's per-token log-probabilities of each (source, target), the pairs padded into one batch."""
    inputs = [run.tokenizer.encode_source(s) for s, _ in pairs]
    targets = [run.tokenizer.encode_target(t) for _, t in pairs]
    pad = lambda rows: np.asarray([np.pad(r, (0, max(map(len, rows)) - len(r))) for r in rows])  # noqa: E731
    logits = jax.jit(run.restored.model.apply)({"params": run.params}, pad(inputs), pad(targets))
    log_probs = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)
    picked = np.take_along_axis(np.asarray(log_probs), pad(targets)[..., None], -1)[..., 0]
    return [row[: len(t)] for row, t in zip(picked, targets)]


PAIRS = list(zip(sentences("en", 24, 1), sentences("de", 24, 2)))


def test_the_imported_model_scores_every_token_as_transformers_does(marian):
    path, model, tokenizer = marian
    run = fxformer.load(path)
    largest = 0.0
    for (source, target), ours in zip(PAIRS, our_log_probs(run, PAIRS)):
        theirs = their_log_probs(model, tokenizer, source, target)
        assert ours.shape == theirs.shape
        largest = max(largest, float(np.abs(ours - theirs).max()))
    print(f"largest log-probability difference over {len(PAIRS)} pairs: {largest:.2e}")
    assert largest < 1e-4
    scores = run.score([s for s, _ in PAIRS], [t for _, t in PAIRS])  # the sums, as evaluate counts them
    for (source, target), score in zip(PAIRS, scores):
        theirs = their_log_probs(model, tokenizer, source, target)
        assert score.tokens == len(theirs) and score.log_prob == pytest.approx(theirs.sum(), abs=1e-3)


def test_greedy_translations_are_transformers_generate(marian):
    path, model, tokenizer = marian
    run = fxformer.load(path)
    sources = [s for s, _ in PAIRS[:20]]
    ours = run.translate(sources, strategy="greedy", max_extra=10)
    same = 0
    for source, translation in zip(sources, ours):
        theirs = their_greedy(model, tokenizer, source, 10, barred=[model.config.pad_token_id])  # never emitted
        same += translation == theirs
        assert translation == theirs, (source, translation, theirs)
    assert len(set(ours)) >= 10, ours  # the weights are wide enough that the outputs differ
    assert same == 20


def test_a_pickle_is_refused_in_one_sentence(marian, tmp_path):
    path, _, _ = marian
    copy = tmp_path / "pickled"
    copy.mkdir()
    for f in path.iterdir():
        if f.name != "model.safetensors":
            (copy / f.name).write_bytes(f.read_bytes())
    (copy / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(UserError, match="is a pickle, which runs code when loaded: save the model with transformers"):
        fxformer.load(copy)


def test_the_recipe_in_the_docs_runs_on_a_marian_directory(marian, tmp_path, monkeypatch):
    """docs/interop.md's Python (its `python interop` blocks), run with the directory here."""
    path, _, _ = marian
    page = (Path(__file__).resolve().parent.parent / "docs" / "interop.md").read_text()
    recipes = re.findall(r"^```python interop\n(.*?)^```", page, re.S | re.M)
    assert recipes
    (tmp_path / "opus-mt-en-de").symlink_to(path)
    (tmp_path / "test.en").write_text("".join(s + "\n" for s, _ in PAIRS[:6]))  # the user's test set
    (tmp_path / "test.de").write_text("".join(t + "\n" for _, t in PAIRS[:6]))
    monkeypatch.chdir(tmp_path)
    for code in recipes:
        exec(compile(code, "docs/interop.md", "exec"), {})
    assert json.loads((tmp_path / "evals" / "test.en-imported.json").read_text())["num_sentences"] == 6


TOLERANCE = 1e-4  # of a per-token log-probability, float32


def largest_difference(run, model, tokenizer) -> float:
    """The largest per-token log-probability difference from transformers' over PAIRS."""
    return max(
        float(np.abs(ours - their_log_probs(model, tokenizer, source, target)).max())
        for (source, target), ours in zip(PAIRS, our_log_probs(run, PAIRS))
    )


def broken(run, params=None, **model_fields):
    """`run` with model fields changed, or other parameters: an import with one difference missed."""
    config = run.config.copy_and_resolve_references()
    config.model.update(model_fields)
    model = trainstate.model_of(config, run.tokenizer.vocab_size)
    restored = dataclasses.replace(run.restored, config=config, model=model, params=params or run.params)
    return dataclasses.replace(run, restored=restored)


def with_embed(params, **arrays):
    return {**params, "embed": {**params["embed"], **arrays}}


def test_each_difference_missed_moves_the_log_probabilities_ten_times_the_tolerance(marian):
    path, model, tokenizer = marian
    run = fxformer.load(path)
    bias, table = run.params["embed"]["output_bias"], run.params["embed"]["embedding"]
    breaks = {
        "interleaved positions": broken(run, sinusoid_layout="interleaved"),
        "ReLU for swish": broken(run, activation="relu"),
        "the output bias dropped": broken(
            run, with_embed(run.params, output_bias=jnp.zeros_like(bias).at[BOS_ID].set(importer.ABSENT))
        ),
        "<pad> as id 0 (the decoder starting from </s>)": broken(
            run, with_embed(run.params, embedding=table.at[BOS_ID].set(table[EOS_ID]))
        ),
        "the bos row's logit not lowered (pad counted twice)": broken(
            run, with_embed(run.params, output_bias=bias.at[BOS_ID].set(bias[PAD_ID]))
        ),
    }
    assert largest_difference(run, model, tokenizer) < TOLERANCE
    for name, wrong in breaks.items():
        moved = largest_difference(wrong, model, tokenizer)
        print(f"{name}: largest difference {moved:.2e} ({moved / TOLERANCE:.0f}x the tolerance)")
        assert moved >= 10 * TOLERANCE, name


def test_layer_norm_epsilon_is_transformers_on_inputs_of_variance_near_it(marian):
    path, model, _ = marian
    run = fxformer.load(path)
    theirs = model.model.encoder.layers[0].self_attn_layer_norm
    x = np.random.default_rng(0).normal(0, math.sqrt(1e-5), (8, theirs.normalized_shape[0])).astype(np.float32)
    with torch.no_grad():
        expected = theirs(torch.from_numpy(x)).numpy()
    scale_bias = {"scale": theirs.weight.detach().numpy(), "bias": theirs.bias.detach().numpy()}
    ours = lambda epsilon: np.asarray(nn.LayerNorm(epsilon=epsilon).apply({"params": scale_bias}, x))  # noqa: E731
    assert run.config.model.layer_norm_epsilon == theirs.eps == 1e-5
    assert np.abs(ours(run.config.model.layer_norm_epsilon) - expected).max() < TOLERANCE
    moved = np.abs(ours(1e-6) - expected).max()  # fxformer's default
    print(f"epsilon 1e-6 for 1e-5: largest difference {moved:.2e}")
    assert moved >= 10 * TOLERANCE


def run_command(monkeypatch, capsys, module: str, *argv: str) -> str:
    """`python -m fxformer.<module> argv` in this process: its standard output."""
    monkeypatch.setattr(sys, "argv", [module, *argv])
    capsys.readouterr()
    importlib.import_module(f"fxformer.{module}").main()
    return capsys.readouterr().out


def test_the_commands_translate_evaluate_and_draw_a_marian_directory_writing_only_under_out(
    marian, tmp_path, monkeypatch, capsys
):
    path, model, tokenizer = marian
    sources, references = [s for s, _ in PAIRS[:12]], [t for _, t in PAIRS[:12]]
    (tmp_path / "test.en").write_text("".join(s + "\n" for s in sources))
    (tmp_path / "test.de").write_text("".join(t + "\n" for t in references))
    out = tmp_path / "evals"
    run = fxformer.load(path)
    with left_as_is(path):
        translated = run_command(
            monkeypatch, capsys, "translate", f"--workdir={path}", f"--input={tmp_path / 'test.en'}"
        )
        assert translated.splitlines() == run.translate(sources)
        files = [f"--source_file={tmp_path / 'test.en'}", f"--reference_file={tmp_path / 'test.de'}"]
        run_command(monkeypatch, capsys, "evaluate", f"--workdir={path}", *files, f"--out={out}")
        drawn = run_command(
            monkeypatch,
            capsys,
            "attention_maps",
            f"--workdir={path}",
            "--source=the dog sleeps.",
            "--target=der Hund schläft.",
            f"--out={out}",
        )
    result = json.loads((out / "test.en-imported.json").read_text())
    hypotheses = (out / "test.en-imported.hyp.txt").read_text().splitlines()
    assert hypotheses == translated.splitlines()
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score, abs=1e-9)
    theirs = [their_log_probs(model, tokenizer, s, t) for s, t in zip(sources, references)]
    ppl = math.exp(-sum(t.sum() for t in theirs) / sum(len(t) for t in theirs))  # transformers' per-token perplexity
    assert result["ppl"] == pytest.approx(ppl, rel=1e-4) and result["num_sentences"] == 12
    folder = out / "the-dog-sleeps-imported"
    assert f"written in {folder}" in drawn and (folder / "cross.png").stat().st_size > 0


def test_what_the_commands_cannot_do_with_a_marian_directory_is_one_sentence(marian, tmp_path, monkeypatch):
    from fxformer import attention_maps, evaluate, plot

    path, _, _ = marian
    (tmp_path / "a.en").write_text("the dog.\n")
    (tmp_path / "a.de").write_text("der Hund.\n")
    files = [f"--source_file={tmp_path / 'a.en'}", f"--reference_file={tmp_path / 'a.de'}"]
    cases = [
        (evaluate.main, [*files], "is an imported model, whose directory is not written to: give --out=DIR"),
        (evaluate.main, [f"--out={tmp_path / 'o'}"], "is an imported model with no data splits: give --source_file"),
        (evaluate.main, [*files, f"--out={tmp_path / 'o'}", "--step=best"], "has no steps to choose or average"),
        (attention_maps.main, ["--source=the dog."], "is an imported model, whose directory is not written to"),
        (plot.main, [], "has no training curves to plot"),
    ]
    for main, flags, message in cases:
        assert message in refused_in_process(monkeypatch, main, [f"--workdir={path}", *flags], path, tmp_path / "o")


def damaged(path, tmp_path, name: str, change) -> Path:
    """A copy of the Marian directory `path` with one file changed (`change(bytes) -> bytes`)."""
    copy = tmp_path / name
    copy.mkdir()
    for f in path.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / change[0]).write_bytes(change[1]((copy / change[0]).read_bytes()))
    return copy


def without(field: str):
    return lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != field}).encode()


def test_damaged_files_are_refused_in_one_sentence_with_nothing_written(marian, tmp_path, monkeypatch):
    from fxformer import evaluate

    path, _, _ = marian
    vocab = json.loads((path / "vocab.json").read_text())
    cases = {
        "truncated": (("model.safetensors", lambda b: b[: len(b) // 2]), "model.safetensors is unreadable"),
        "no-field": (("config.json", without("d_model")), "config.json has no d_model"),
        "vocab": (
            ("vocab.json", lambda b: json.dumps({**vocab, "extra": len(vocab)}).encode()),
            f"vocab.json holds {len(vocab) + 1} pieces, config.json's vocab_size is {len(vocab)}",
        ),
    }
    (tmp_path / "a.en").write_text("the dog.\n")
    (tmp_path / "a.de").write_text("der Hund.\n")
    out = tmp_path / "out"
    for name, (change, message) in cases.items():
        copy = damaged(path, tmp_path, name, change)
        flags = [f"--workdir={copy}", f"--source_file={tmp_path / 'a.en'}", f"--reference_file={tmp_path / 'a.de'}"]
        refused = refused_in_process(monkeypatch, evaluate.main, [*flags, f"--out={out}"], copy, out)
        print(f"{name}: {refused}")
        assert message in refused, refused
    done = run_module("fxformer.evaluate", *flags, f"--out={out}")  # the last one, as a user's shell sees it
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.strip().splitlines()[-1].endswith("they belong to different models."), done.stderr


def test_an_imported_model_fine_tunes_stops_resumes_and_evaluates_as_any_run(
    marian, data_dir, corpus, tmp_path, monkeypatch
):
    """`fxformer.importing`, then training on the embedded corpus: 20 steps, stopped by a SIGTERM
    after the 6th and resumed; the run starts from the imported parameters (Adam's small steps move
    them a little, where a fresh start is far off), and evaluate reads it as any run."""
    from fxformer import evaluation, importing, paths, train
    from fxformer.config import load_workdir_config
    from fxformer.lifecycle import StopRequest
    from fxformer.model import init_params

    path, _, _ = marian
    workdir = paths.Workdir(tmp_path / "ft")
    flags = {
        **{f"data.{key}": value for key, value in SMALL_DATA.items()},
        "data.tfds_data_dir": str(data_dir),
        "num_train_steps": 20,
        "warmup_steps": 20,
        "learning_rate_scale": 0.1,  # a fine-tuning rate: a tenth of the paper's schedule
        "log_every_steps": 1,
        "eval_every_steps": 1000,
        "checkpoint_every_steps": 1000,
        "checkpoint_every_minutes": 1000.0,
        "decode.max_extra": 10,
        "model.dropout_rate": 0.0,  # the command line may set the rates
    }
    argv = [str(path), f"--workdir={workdir.root}", "--config=configs/default.py"]
    argv += [f"--config.{key}={value}" for key, value in flags.items()]
    refused = refused_in_process(
        monkeypatch, importing.main, [*argv, "--config.model.d_model=64"], path, tmp_path / "ft"
    )
    assert "--config.model.d_model is the imported model's (config.json)" in refused
    monkeypatch.setattr(sys, "argv", ["importing", *argv])
    with left_as_is(path):
        importing.main()
    config = load_workdir_config(workdir)
    assert (config.model.activation, config.model.sinusoid_layout, config.model.layer_norm_epsilon) == (
        "swish",
        "halves",
        1e-5,
    )
    assert config.model.dropout_rate == 0.0 and config.learning_rate_scale == 0.1
    imported = fxformer.load(path)

    stop = StopRequest()

    def log(*args, **kwargs):  # a SIGTERM, as a scheduler sends it, after the 6th step
        if args and str(args[0]).startswith("step 6/"):
            stop._handle(signal.SIGTERM, None)

    try:
        stopped = train.train_and_evaluate(config, workdir, log=log, stop=stop)
    finally:
        stop.uninstall()
    saved = workdir.checkpoint_steps()
    assert not stopped.finished and saved and 6 <= saved[-1] < 20, saved

    def farthest(a, b) -> float:
        return max(
            float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
        )

    moved = farthest(fxformer.load(workdir, step=saved[-1]).params, imported.params)
    fresh = farthest(init_params(imported.restored.model, jax.random.key(config.seed)), imported.params)
    print(f"stopped at step {saved[-1]}: parameters {moved:.2e} from the imported ones (a fresh start: {fresh:.2f})")
    assert 0 < moved < 0.05 < 0.5 < fresh

    resumed = train.train_and_evaluate(config, workdir, log=lambda *a, **k: None)
    assert resumed.finished and workdir.checkpoint_steps()[-1] == 20
    run = fxformer.load(workdir)
    assert type(run.tokenizer).__name__ == "MarianTokenizer" and run.steps == [20]
    result = run.evaluate("test", limit=8)
    test = evaluation.split_test_set(run.config, "test", 8, log=lambda *a: None)
    scores = run.score(test.sources, test.references)
    ppl = math.exp(-sum(s.log_prob for s in scores) / sum(s.tokens for s in scores))
    assert result["num_sentences"] == 8 and result["ppl"] == pytest.approx(ppl, rel=1e-4)
    assert Path(result["path"]).parent == workdir.root / "eval"


def our_sequence_log_probs(run, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
    """fxformer's summed log-probability of each target (its ids, ending in EOS) given its source,
    the pairs padded into one batch."""
    pad = lambda rows: np.asarray([r + [PAD_ID] * (max(map(len, rows)) - len(r)) for r in rows])  # noqa: E731
    sources, targets = pad([s for s, _ in pairs]), pad([t for _, t in pairs])
    logits = jax.jit(run.restored.model.apply)({"params": run.params}, sources, targets)
    log_probs = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64), -1))
    picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    return [float(row[: len(t)].sum()) for row, (_, t) in zip(picked, pairs)]


def test_beam_search_finds_hypotheses_scoring_at_least_as_high_as_transformers(marian):
    """Beam 4 without length normalisation on both sides (fxformer alpha 0; transformers
    length_penalty 0), compared as token sequences: the share of identical best hypotheses is
    printed; where they differ, both implementations score both hypotheses alike (within 1e-3 for a
    sum), and fxformer's scores at least as high as transformers' pick."""
    from fxformer import inference
    from fxformer.config import DecodeOptions

    path, model, tokenizer = marian
    run = fxformer.load(path)
    options = DecodeOptions.of({**run.config.decode.to_dict(), "beam_size": 4, "alpha": 0.0, "max_extra": 10})
    to_ours = lambda ids: [run.tokenizer.ids[p] for p in tokenizer.convert_ids_to_tokens(ids)]  # noqa: E731
    to_theirs = lambda ids: tokenizer.convert_tokens_to_ids([run.tokenizer.pieces[i] for i in ids])  # noqa: E731
    sources = [s for s, _ in PAIRS[:20]]
    encoded = [run.tokenizer.encode_source(s).tolist() for s in sources]
    padded = np.asarray([e + [PAD_ID] * (max(map(len, encoded)) - len(e)) for e in encoded])
    search = jax.jit(lambda params, inputs: inference.search(run.restored.model.config, params, inputs, options))
    outputs, scores = jax.device_get(search(run.params, padded))  # one batch, as the commands search
    picks = []
    for source, ours_source, row in zip(sources, encoded, outputs[:, 0].tolist()):
        theirs_source = tokenizer(source)["input_ids"]
        assert to_ours(theirs_source) == ours_source
        ours = row[: row.index(EOS_ID) + 1] if EOS_ID in row else [t for t in row if t != PAD_ID]  # at the limit
        generated = their_search(model, theirs_source, 10, [model.config.pad_token_id], num_beams=4, length_penalty=0.0)
        picks.append((ours_source, theirs_source, ours, to_ours(generated[1:])))  # after the decoder's start
    ours_scores = our_sequence_log_probs(run, [(s, ours) for s, _, ours, _ in picks])
    assert np.allclose(scores[:, 0], ours_scores, atol=1e-3)  # alpha 0: the search's score is log p
    differ = [p for p in picks if p[2] != p[3]]
    same = len(picks) - len(differ)
    for ours_source, theirs_source, ours, theirs in differ:
        ours_by = our_sequence_log_probs(run, [(ours_source, ours), (ours_source, theirs)])
        theirs_by = [float(their_token_log_probs(model, theirs_source, to_theirs(t)).sum()) for t in (ours, theirs)]
        print(
            f"  differ: fxformer's pick {ours_by[0]:.4f} (transformers: {theirs_by[0]:.4f}), transformers' "
            f"{ours_by[1]:.4f} (transformers: {theirs_by[1]:.4f})"
        )
        assert ours_by == pytest.approx(theirs_by, abs=1e-3)
        assert ours_by[0] >= ours_by[1] - 1e-3
    print(f"beam 4: {same} of {len(picks)} best hypotheses identical")
    assert same >= len(picks) // 2


def test_text_is_transformers_decode_for_every_kind_of_piece(marian):
    """Target pieces, a piece only the source model has (the vocabulary is shared), <unk>, </s>."""
    path, _, tokenizer = marian
    run = fxformer.load(path)
    target = spm.SentencePieceProcessor(model_file=str(path / "target.spm"))
    known = {target.id_to_piece(i) for i in range(target.get_piece_size())}
    source_only = next(p for p in tokenizer.get_vocab() if p not in known and not p.startswith("<"))
    words = tokenizer("der Hund schläft im Garten")["input_ids"][:-1]
    cases = [words, [*words[:2], tokenizer.convert_tokens_to_ids(source_only), *words[2:]], [1, *words, 1]]
    for ids in cases:
        theirs = tokenizer.decode([*ids, 0], skip_special_tokens=True)
        ours = run.tokenizer.decode([run.tokenizer.ids[p] for p in tokenizer.convert_ids_to_tokens([*ids, 0])])
        assert ours == theirs, (ids, ours, theirs)
