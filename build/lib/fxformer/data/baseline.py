"""Monotone word-by-word translation baseline for the synthetic corpus.

A lexicon is learned from the training pairs with IBM Model 1 (EM over word-translation
probabilities, with a NULL source word), then every English token is replaced by the German
token it is most often Viterbi-aligned to, keeping the English word order.  Its BLEU shows how
much of the task is solved without reordering, agreement or case: the lexicon is easy to learn,
but German word order (verb second, verb final, dative before accusative) and inflection are
not word-by-word.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import sacrebleu

_TOKEN = re.compile(r"\w+|[^\w\s]")
_NULL = "<null>"


def tokenize(sentence: str) -> list[str]:
    """Split a sentence into words and single punctuation marks."""
    return _TOKEN.findall(sentence)


def detokenize(tokens: list[str]) -> str:
    """Join tokens with spaces, attaching punctuation to the preceding word."""
    text = " ".join(tokens)
    return re.sub(r" ([.,?!;:])", r"\1", text)


def _index(sentences: list[list[str]], vocab: dict[str, int], width: int) -> np.ndarray:
    """Pad token lists to ``width`` as vocabulary ids, -1 marking padding."""
    ids = np.full((len(sentences), width), -1, dtype=np.int64)
    for row, tokens in enumerate(sentences):
        ids[row, : len(tokens)] = [vocab[t] for t in tokens]
    return ids


def _ibm1(
    src: list[list[str]], tgt: list[list[str]], iterations: int, chunk: int = 2000
) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Train IBM Model 1 t(target | source); returns vocabularies, t and padded id arrays."""
    src = [[_NULL] + s for s in src]
    src_vocab = sorted({w for s in src for w in s})
    tgt_vocab = sorted({w for s in tgt for w in s})
    s_ids = _index(src, {w: i for i, w in enumerate(src_vocab)}, max(map(len, src)))
    t_ids = _index(tgt, {w: i for i, w in enumerate(tgt_vocab)}, max(map(len, tgt)))
    n_src, n_tgt = len(src_vocab), len(tgt_vocab)
    table = np.full((n_src, n_tgt), 1.0 / n_tgt)
    for _ in range(iterations):
        counts = np.zeros(n_src * n_tgt)
        for start in range(0, len(src), chunk):
            s, t = s_ids[start : start + chunk], t_ids[start : start + chunk]
            prob = table[s.clip(0)[:, :, None], t.clip(0)[:, None, :]] * (s >= 0)[:, :, None]
            post = prob / np.maximum(prob.sum(axis=1, keepdims=True), 1e-300)
            post *= (t >= 0)[:, None, :]
            flat = s.clip(0)[:, :, None] * n_tgt + t.clip(0)[:, None, :]
            counts += np.bincount(flat.ravel(), weights=post.ravel(), minlength=n_src * n_tgt)
        counts = counts.reshape(n_src, n_tgt)
        table = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1e-300)
    return src_vocab, tgt_vocab, table, s_ids, t_ids


def learn_lexicon(pairs: list[tuple[str, str]], iterations: int = 5) -> dict[str, str]:
    """Map each English word to the German word most often Viterbi-aligned to it ("" if none)."""
    src = [tokenize(en) for en, _ in pairs]
    tgt = [tokenize(de) for _, de in pairs]
    src_vocab, tgt_vocab, table, s_ids, t_ids = _ibm1(src, tgt, iterations)
    n_tgt = len(tgt_vocab)
    links = np.zeros(len(src_vocab) * n_tgt)
    for start in range(0, len(s_ids), 2000):
        s, t = s_ids[start : start + 2000], t_ids[start : start + 2000]
        prob = table[s.clip(0)[:, :, None], t.clip(0)[:, None, :]] * (s >= 0)[:, :, None]
        best = np.take_along_axis(s.clip(0), prob.argmax(axis=1), axis=1)  # source id per target
        links += np.bincount((best * n_tgt + t.clip(0))[t >= 0], minlength=links.size)
    links = links.reshape(len(src_vocab), n_tgt)
    return {
        word: tgt_vocab[links[i].argmax()] if links[i].any() else ""
        for i, word in enumerate(src_vocab)
        if word != _NULL
    }


def translate_monotone(lexicon: dict[str, str], sentence: str) -> str:
    """Replace each source word by its lexicon word, in source order (unknown words copied)."""
    words = [lexicon.get(token, token) for token in tokenize(sentence)]
    return detokenize([w for w in words if w])


def baseline_bleu(train_pairs: list[tuple[str, str]], test_pairs: list[tuple[str, str]]) -> float:
    """sacreBLEU (13a, cased) of the monotone word-by-word baseline on ``test_pairs``."""
    lexicon = learn_lexicon(train_pairs)
    hypotheses = [translate_monotone(lexicon, en) for en, _ in test_pairs]
    return sacrebleu.corpus_bleu(hypotheses, [[de for _, de in test_pairs]]).score


def main(argv: list[str]) -> None:
    """Print the baseline BLEU for make_splits(num_train, 1000, 1000, seed)."""
    from fxformer.data.grammar import make_splits

    num_train = int(argv[0]) if argv else 40000
    seed = int(argv[1]) if len(argv) > 1 else 0
    splits = make_splits(num_train, 1000, 1000, seed)
    print(f"monotone baseline BLEU: {baseline_bleu(splits['train'], splits['test']):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
