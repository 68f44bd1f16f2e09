"""Token ids stored once, at preparation, so that training reads ids and never text.

Beside the dataset (`builder.data_dir`), one folder per tokenizer and direction, named by a hash
of the tokenizer's model and the languages, `ids-<hash>-<source>-<target>/`: there
`<split>.<side>.ids.npy` (every example's ids, EOS included, one after another) and
`<split>.<side>.offsets.npy` (where each example starts; n + 1 entries), for side = inputs and
targets. A changed corpus is another dataset folder, a changed tokenizer or
direction another `ids-` folder: each is built anew, never mixed (a BPE model trained on both sides
is the same for de -> en as for en -> de, so the hash alone would hand one direction the other's ids).

Why flat numpy arrays: a memory map reads any set of examples with one fancy index, with no
per-record decoding (the cost that dominated reading array_record records one at a time); the
operating system shares the pages between processes and grain workers; and an epoch's packing
needs only the lengths (`np.diff` of the offsets), never the ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import uuid

import numpy as np

from fxformer import paths
from fxformer.data.tokenizer import Tokenizer

SIDES = ("inputs", "targets")
READ_CHUNK = 8192  # records read (and encoded) at a time while building


def folder(data_dir: paths.PathLike, tokenizer: Tokenizer, source_lang: str, target_lang: str):
    """Where a dataset's ids for `tokenizer` from `source_lang` to `target_lang` live: keyed by the
    tokenizer model's bytes and the direction (which side is `inputs`)."""
    digest = hashlib.sha1(tokenizer.proto).hexdigest()[:12]
    return paths.as_path(data_dir) / f"ids-{digest}-{source_lang}-{target_lang}"


@dataclasses.dataclass
class Side:
    """One side of a split: every example's ids end to end, and where each starts."""

    ids: np.ndarray  # [total tokens], uint16 or int32
    offsets: np.ndarray  # [examples + 1], int64

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def example(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]].astype(np.int32)


@dataclasses.dataclass
class Split:
    """The token ids of one split: `inputs` (source) and `targets` sides, example-aligned."""

    inputs: Side
    targets: Side

    def __len__(self) -> int:
        return len(self.inputs.offsets) - 1

    def examples(self, limit: int = 0) -> list[dict]:
        """The first `limit` examples (all if 0) as {'inputs': ids, 'targets': ids}, int32."""
        n = len(self) if limit <= 0 else min(limit, len(self))
        return [{"inputs": self.inputs.example(i), "targets": self.targets.example(i)} for i in range(n)]


def _flat(pieces: list[list[int]], dtype) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(p) for p in pieces), np.int64, len(pieces))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.fromiter((i for p in pieces for i in p), dtype, int(offsets[-1]))
    return ids, offsets


def build_split(source, tokenizer: Tokenizer, source_lang: str, target_lang: str, log=print) -> dict:
    """Every record of a data source tokenized: {side: (ids, offsets)}, read and encoded in chunks."""
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max else np.int32
    pieces = {side: [] for side in SIDES}
    started, last = time.time(), time.time()
    for start in range(0, len(source), READ_CHUNK):
        records = source.__getitems__(list(range(start, min(start + READ_CHUNK, len(source)))))
        for side, lang in zip(SIDES, (source_lang, target_lang)):
            texts = [r[lang].decode("utf-8") if isinstance(r[lang], bytes) else str(r[lang]) for r in records]
            pieces[side] += tokenizer.encode_many(texts, side)
        if time.time() - last > 10:
            last, done = time.time(), start + len(records)
            eta = (time.time() - started) / done * (len(source) - done)
            log(f"data: tokenized {done:,}/{len(source):,} pairs (ETA {eta:.0f}s)")
    return {side: _flat(pieces[side], dtype) for side in SIDES}


def _names(split: str, side: str) -> tuple[str, str]:
    return f"{split}.{side}.ids.npy", f"{split}.{side}.offsets.npy"


def _save(path, array: np.ndarray) -> None:
    with path.open("wb") as f:
        np.save(f, array, allow_pickle=False)


def build(data_dir: paths.PathLike, tokenizer: Tokenizer, sources: dict, source_lang: str, target_lang: str, log=print):
    """Tokenize the splits of `sources` ({split: data source}) that are not stored yet. Each split is
    written to a temporary name and renamed, so a reader never sees half a split."""
    where = folder(data_dir, tokenizer, source_lang, target_lang)
    missing = {split: s for split, s in sources.items() if not (where / _names(split, "targets")[1]).exists()}
    if not missing:
        return where
    where.mkdir(parents=True, exist_ok=True)
    for split, source in missing.items():
        started = time.time()
        built = build_split(source, tokenizer, source_lang, target_lang, log)
        tag = uuid.uuid4().hex[:8]
        for side, (ids, offsets) in built.items():  # offsets of targets last: their presence marks a whole split
            for name, array in zip(_names(split, side), (ids, offsets)):
                _save(where / f"{name}.tmp-{tag}", array)
        for side in SIDES:
            for name in _names(split, side):
                (where / f"{name}.tmp-{tag}").rename(where / name)
        tokens = sum(len(ids) for ids, _ in built.values())
        log(
            f"data: stored the token ids of {split} ({len(source):,} pairs, {tokens:,} tokens) "
            f"in {time.time() - started:.1f}s -> {where}"
        )
    return where


def _load(path) -> np.ndarray:
    """A stored array: memory-mapped where the file is local, read whole elsewhere (gs://)."""
    try:
        if paths.is_url(path):
            return _read(path)
        return np.load(str(path), mmap_mode="r", allow_pickle=False).view(np.ndarray)  # no memmap overhead per read
    except ValueError:  # not an .npy file: damaged
        return _read(path)


def _read(path) -> np.ndarray:
    with path.open("rb") as f:
        return np.load(f, allow_pickle=False)


def load(where: paths.PathLike, split: str) -> Split:
    """The stored ids of `split` (built by `build`)."""
    where = paths.as_path(where)
    sides = []
    for side in SIDES:
        ids_name, offsets_name = _names(split, side)
        sides.append(Side(_load(where / ids_name), np.asarray(_load(where / offsets_name), np.int64)))
    return Split(*sides)
