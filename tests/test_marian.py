"""A Marian model built by transformers itself (random weights drawn wide, swish, scale_embedding,
<pad> last and the decoder starting from it, a SentencePiece model per side trained here, a
vocab.json in Marian's layout), written by `save_pretrained` and read by `fxformer.load`: the
teacher-forced log-probabilities and the greedy translations equal transformers' own.
Needs the interop extra (transformers, torch); skipped without it."""

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import sentencepiece as spm  # noqa: E402

import fxformer  # noqa: E402
from fxformer.errors import UserError  # noqa: E402

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


def their_log_probs(model, tokenizer, source: str, target: str) -> np.ndarray:
    enc = tokenizer(source, text_target=target, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=enc["input_ids"], labels=enc["labels"]).logits[0]
    log_probs = torch.log_softmax(logits.double(), -1)
    return log_probs.gather(-1, enc["labels"][0][:, None])[:, 0].numpy()


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
        ids = tokenizer(source, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids,
                num_beams=1,
                do_sample=False,
                max_new_tokens=ids.shape[1] + 10,  # fxformer's limit: the source's tokens + max_extra
                forced_eos_token_id=None,
                bad_words_ids=[[model.config.pad_token_id]],  # fxformer never emits <pad>
            )
        theirs = tokenizer.decode(out[0], skip_special_tokens=True)
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
    monkeypatch.chdir(tmp_path)
    for code in recipes:
        exec(compile(code, "docs/interop.md", "exec"), {})
