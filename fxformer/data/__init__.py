"""The data: corpora (TFDS builders), the shared sentencepiece tokenizer, the token ids stored
once beside each dataset (`tokenized`), and the grain pipeline that shuffles, filters and packs
them into training rows (`pipeline`, `packing`); training never reads text."""

from __future__ import annotations

import ml_collections

from fxformer.data import corpora, tokenized
from fxformer.data.tokenizer import Tokenizer


def token_ids(data: ml_collections.ConfigDict, builder, tokenizer: Tokenizer, log=print):
    """The folder of the dataset's token ids for `tokenizer` (`fxformer.data.tokenized`): the
    train, dev and test splits tokenized once, beside the dataset, then found."""
    splits = dict.fromkeys((data.train_split, data.eval_split, data.test_split))
    sources = {split: corpora.data_source(builder, split) for split in splits}
    return tokenized.build(builder.data_dir, tokenizer, sources, data.source_lang, data.target_lang, log=log)
