"""One shared source-target sentencepiece BPE model, trained once per dataset and cached beside
it, then copied into each run's workdir (`tokenizer_for`).

pad, unk, bos and eos have the distinct ids of `fxformer.tokens` (pad never doubles as unk).
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterable

import ml_collections
import numpy as np
import sentencepiece as spm
from etils import epath

from fxformer import marian, paths
from fxformer.data import corpora
from fxformer.errors import UserError
from fxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID, text_ids


class Tokenizer:
    """Text <-> ids with a sentencepiece model; `encode` appends EOS."""

    def __init__(self, model_path: epath.Path):
        self.path = model_path  # read through its path object: a gs:// workdir's copy works too
        try:
            self.proto = self.path.read_bytes()  # the model, read once (copied into a workdir, hashed)
            self.sp = spm.SentencePieceProcessor(model_proto=self.proto)
        except (OSError, RuntimeError):
            raise UserError(f"{self.path} is missing or not a sentencepiece model.") from None
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise UserError(f"{self.path} was not trained with fxformer's special token ids.")

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> np.ndarray:
        """Text -> int32 ids ending in EOS."""
        return np.asarray(self.sp.encode(text) + [EOS_ID], np.int32)

    # One model for both sides; an imported Marian model has one per side (`fxformer.marian`).
    encode_source = encode_target = encode

    def encode_many(self, texts: list[str], side: str = "inputs") -> list[list[int]]:
        """Texts -> id lists ending in EOS, encoded as a batch (sentencepiece's own threads); one
        model for both sides ("inputs", "targets")."""
        return [ids + [EOS_ID] for ids in self.sp.encode(texts, num_threads=2)]

    def piece(self, i: int) -> str:
        """The wordpiece of id `i`."""
        return self.sp.id_to_piece(int(i))

    def vocabulary(self) -> list[str]:
        """Every id's wordpiece, in the order of the ids (what an exported vocabulary lists)."""
        return [self.piece(i) for i in range(self.vocab_size)]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, stopping at the first EOS and skipping pad and bos."""
        return self.sp.decode(text_ids(ids))


def train_tokenizer(
    sentences: Iterable[str], vocab_size: int, model_path: epath.Path, max_sentences: int, log=print
) -> Tokenizer:
    """Train a BPE model on at most `max_sentences` sentences (source and target mixed).

    The sample is taken as it comes (the caller interleaves languages); progress is shown.
    `vocab_size` is a soft limit: a small corpus may yield fewer pieces.
    """
    model_path.parent.mkdir(parents=True, exist_ok=True)
    sample, start = [], time.time()
    last = start
    for sentence in sentences:
        if len(sample) >= max_sentences:
            break
        sample.append(sentence)
        if time.time() - last > 5.0:
            last = time.time()
            log(f"tokenizer: sampled {len(sample):,}/{max_sentences:,} sentences")
    log(f"tokenizer: training a {vocab_size:,}-piece BPE model on {len(sample):,} sentences")
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample),
        model_writer=proto,
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        character_coverage=1.0,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        num_threads=4,
        minloglevel=2,
    )
    paths.write_atomic(model_path, proto.getvalue())  # an interrupted run never leaves half a model
    tokenizer = Tokenizer(model_path)
    log(f"tokenizer: {tokenizer.vocab_size:,} pieces in {time.time() - start:.1f}s -> {model_path}")
    return tokenizer


def cached_tokenizer(
    cache_path: epath.Path,
    sentences_fn,
    vocab_size: int,
    max_sentences: int,
    log=print,
) -> Tokenizer:
    """The tokenizer at `cache_path`, trained there first if absent."""
    if not cache_path.exists():
        return train_tokenizer(sentences_fn(), vocab_size, cache_path, max_sentences, log=log)
    return Tokenizer(cache_path)


def workdir_tokenizer(workdir: paths.Workdir):
    """The tokenizer a workdir keeps: `W/tokenizer.model`, or the files of the Marian model it was
    imported from (`W/marian/`, `fxformer.importing`); None before training made one."""
    if workdir.keeps_marian_tokenizer():
        return marian.read_tokenizer(workdir.marian)
    return Tokenizer(workdir.tokenizer) if workdir.tokenizer.exists() else None


def tokenizer_for(
    data: ml_collections.ConfigDict, builder, workdir: paths.Workdir | None = None, log=print
) -> Tokenizer:
    """The dataset's shared BPE model: trained once beside the dataset, then copied into `workdir`.

    A workdir that already holds its tokenizer keeps it (a resumed run never re-tokenizes), be it
    `tokenizer.model` or an imported Marian model's (`workdir_tokenizer`).
    """
    if workdir is not None and (kept := workdir_tokenizer(workdir)) is not None:
        return kept
    source = corpora.data_source(builder, data.train_split)

    def sentences():
        """Source and target sentences of a seeded sample of training pairs, interleaved."""
        order = np.random.default_rng(0).permutation(len(source))[: (data.tokenizer_sentences + 1) // 2]
        for i in order:
            record = source[int(i)]
            for lang in (data.source_lang, data.target_lang):
                yield record[lang].decode("utf-8")

    name = f"tokenizer-bpe{data.vocab_size}-{data.source_lang}{data.target_lang}-{data.tokenizer_sentences}.model"
    cache = paths.as_path(builder.data_dir) / name
    tokenizer = cached_tokenizer(cache, sentences, data.vocab_size, data.tokenizer_sentences, log=log)
    if workdir is not None:
        workdir.root.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(workdir.tokenizer, tokenizer.proto)
    return tokenizer
