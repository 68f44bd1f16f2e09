"""The data: corpora (TFDS builders), the shared sentencepiece tokenizer, the token ids stored
once beside each dataset (`tokenized`), and the grain pipeline that shuffles, filters and packs
them into training rows (`pipeline`, `packing`); training never reads text."""

from __future__ import annotations

import ml_collections
import numpy as np

from fxformer import paths
from fxformer.data import corpora, tokenized
from fxformer.data.tokenizer import Tokenizer, cached_tokenizer


def tokenizer_for(
    data: ml_collections.ConfigDict, builder, workdir: paths.Workdir | None = None, log=print
) -> Tokenizer:
    """The dataset's shared BPE model: trained once beside the dataset, then copied into `workdir`.

    A workdir that already holds `tokenizer.model` keeps it (a resumed run never re-tokenizes).
    """
    if workdir is not None and (copy := workdir.tokenizer).exists():
        return Tokenizer(copy)
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


def token_ids(data: ml_collections.ConfigDict, builder, tokenizer: Tokenizer, log=print):
    """The folder of the dataset's token ids for `tokenizer` (`fxformer.data.tokenized`): the
    train, dev and test splits tokenized once, beside the dataset, then found."""
    splits = dict.fromkeys((data.train_split, data.eval_split, data.test_split))
    sources = {split: corpora.data_source(builder, split) for split in splits}
    return tokenized.build(builder.data_dir, tokenizer, sources, data.source_lang, data.target_lang, log=log)
