"""The grain input pipeline: records -> token ids -> packed training rows / padded eval batches.

Training: shard(process) - shuffle(seed, reshuffled every epoch) - tokenize - length filter -
pack into fixed-length rows with segment ids and positions - batch to a token budget.
The iterator's state (`get_state`/`set_state`) is saved with each checkpoint, so a resumed
run sees exactly the batches it would have seen.

Evaluation: every example exactly once, in order, padded (not packed), the last partial batch
filled with empty rows whose `example_mask` is 0.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import grain
import ml_collections
import numpy as np

from fxformer.data.tokenizer import Tokenizer
from fxformer.errors import UserError
from fxformer.tokens import EOS_ID, PAD_ID


class LengthFilter:
    """Drops or truncates pairs longer than `max_length` tokens on either side, and counts them."""

    def __init__(self, max_length: int, overlong: str):
        assert overlong in ("drop", "truncate"), overlong  # fxformer.config.validate refuses others
        self.max_length, self.overlong = max_length, overlong
        self.seen = self.overlong_pairs = 0
        self._lock = threading.Lock()

    def __call__(self, example: dict) -> dict | None:
        too_long = max(len(example["inputs"]), len(example["targets"])) > self.max_length
        with self._lock:
            self.seen += 1
            self.overlong_pairs += too_long
        if not too_long:
            return example
        if self.overlong == "drop":
            return None
        return {key: _truncate(ids, self.max_length) for key, ids in example.items()}

    def report(self) -> str:
        verb = "dropped" if self.overlong == "drop" else "truncated"
        return f"{verb} {self.overlong_pairs:,} of {self.seen:,} pairs longer than {self.max_length} tokens"


def _truncate(ids: np.ndarray, max_length: int) -> np.ndarray:
    return np.concatenate([ids[: max_length - 1], [EOS_ID]]).astype(np.int32) if len(ids) > max_length else ids


def tokenize_fn(tokenizer: Tokenizer, source_lang: str, target_lang: str):
    """A record {lang: bytes} -> {'inputs': ids, 'targets': ids}, each ending in EOS."""

    def tokenize(record: dict) -> dict:
        text = lambda x: x.decode("utf-8") if isinstance(x, bytes) else str(x)
        return {
            "inputs": tokenizer.encode(text(record[source_lang])),
            "targets": tokenizer.encode(text(record[target_lang])),
        }

    return tokenize


LENGTH_SAMPLE = 2000  # training pairs tokenized before training to see what the length filter keeps


def check_lengths(source, tokenizer: Tokenizer, data: ml_collections.ConfigDict, log=print) -> None:
    """Before training: tokenize up to LENGTH_SAMPLE training pairs spread over the split, refuse in
    one sentence a `data.max_length` that keeps none of them (training could never fill a batch),
    and say at the start, not at the end, when it drops more than half."""
    if data.overlong != "drop" or len(source) == 0:
        return
    count = min(len(source), LENGTH_SAMPLE)
    tokenize = tokenize_fn(tokenizer, data.source_lang, data.target_lang)
    examples = [tokenize(source[int(i)]) for i in np.linspace(0, len(source) - 1, count).astype(int)]
    length_filter = LengthFilter(data.max_length, data.overlong)  # the rule training applies
    kept = sum(length_filter(example) is not None for example in examples)
    sampled = f"all {count:,}" if count == len(source) else f"a sample of {count:,}"
    if kept == 0:
        raise UserError(
            f"data.max_length={data.max_length} keeps none of {sampled} training pairs (the shortest has "
            f"{min(max(len(e['inputs']), len(e['targets'])) for e in examples)} tokens on its longer side, "
            "EOS included), so training could never fill a batch; "
            f"raise data.max_length or set data.overlong=truncate."
        )
    if kept < count / 2:
        share = 100 * (count - kept) / count
        log(
            f"warning: data.max_length={data.max_length} drops {share:.0f}% of {sampled} training pairs "
            f"({kept:,} of {count:,} kept); raise it or set data.overlong=truncate to train on more of them"
        )


def rows_per_step(data: ml_collections.ConfigDict, num_devices: int, grad_accum_steps: int = 1) -> int:
    """Global packed rows per step: the token budget over the row length, rounded up to a multiple
    of devices x micro-batches (and of the data shards)."""
    unit = math.lcm(num_devices * grad_accum_steps, data.num_shards or 1)
    rows = max(1, data.tokens_per_batch // data.max_length)
    return unit * math.ceil(rows / unit)


def train_examples(
    source,
    tokenizer: Tokenizer,
    data: ml_collections.ConfigDict,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    num_epochs: int | None = None,
    length_filter: LengthFilter | None = None,
) -> tuple[grain.MapDataset, LengthFilter]:
    """Shard `process_index` of `process_count` of the training pairs, shuffled every epoch, tokenized, filtered."""
    length_filter = length_filter or LengthFilter(data.max_length, data.overlong)
    ds = grain.MapDataset.source(source)[process_index::process_count]
    ds = ds.shuffle(seed=seed).repeat(num_epochs)  # a new permutation every epoch
    ds = ds.map(tokenize_fn(tokenizer, data.source_lang, data.target_lang))
    ds = ds.map(length_filter).filter(lambda example: example is not None)
    return ds, length_filter


def pack(examples: grain.IterDataset, max_length: int, rows: int, seed: int, drop_remainder: bool = True):
    """Pack examples into batches of `rows` rows of `max_length` slots (first fit over `rows` bins).

    Keys: inputs, targets, and for each their `_segment_ids` (1, 2, ... per packed example,
    0 = padding) and `_positions` (restarting at 0 in every example).
    """
    lengths = {"inputs": max_length, "targets": max_length}
    packed = grain.experimental.FirstFitPackIterDataset(
        examples, length_struct=lengths, num_packing_bins=rows, seed=seed, shuffle_bins=True
    )
    return packed.batch(rows, drop_remainder=drop_remainder)


def train_dataset(
    source,
    tokenizer: Tokenizer,
    data: ml_collections.ConfigDict,
    rows: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
) -> tuple[grain.IterDataset, LengthFilter]:
    """Endless packed training batches for this process: [rows / process_count, max_length] arrays.

    The records are split into `data.num_shards` shards (0 = one per process); each shard is
    shuffled, tokenized and packed into its share of the rows, and a process reads only its own
    shards. With a fixed shard count the global batches do not depend on how many processes
    read them.
    """
    num_shards = data.num_shards or process_count
    # shards per process: config.validate; rows per shard: rows_per_step rounds rows to a multiple of the
    # shards (or, with num_shards 0, of the devices, themselves a multiple of the processes)
    assert num_shards % process_count == 0 and rows % num_shards == 0, (num_shards, process_count, rows)
    per_process = num_shards // process_count
    length_filter = LengthFilter(data.max_length, data.overlong)
    packed = []
    for shard in range(process_index * per_process, (process_index + 1) * per_process):
        examples, _ = train_examples(source, tokenizer, data, seed, shard, num_shards, length_filter=length_filter)
        examples = examples.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=256))
        packed.append(pack(examples, data.max_length, rows // num_shards, seed))
    if per_process == 1:
        return packed[0], length_filter
    concat = lambda parts: {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    return grain.experimental.ZipIterDataset(packed).map(concat), length_filter


def eval_length(examples: list[dict], limit: int) -> int:
    """Padded length of eval batches: the longest example rounded up to 8, at most `limit`."""
    longest = max((max(len(e["inputs"]), len(e["targets"])) for e in examples), default=1)
    return min(limit, 8 * math.ceil(longest / 8))


def tokenize_split(source, tokenizer: Tokenizer, data: ml_collections.ConfigDict, limit: int = 0) -> list[dict]:
    """Every example of an eval split, tokenized, in order (the first `limit` if > 0)."""
    tokenize = tokenize_fn(tokenizer, data.source_lang, data.target_lang)
    n = len(source) if limit <= 0 else min(limit, len(source))
    return [tokenize(source[i]) for i in range(n)]


def references(source, data: ml_collections.ConfigDict, limit: int = 0) -> list[str]:
    """The target sentences of an eval split, in order (the first `limit` if > 0): what sacreBLEU scores against."""
    n = len(source) if limit <= 0 else min(limit, len(source))
    return [source[i][data.target_lang].decode("utf-8") for i in range(n)]


def length_bucket(longest: int, limit: int) -> int:
    """A batch's padded length by its longest example: the next power of two from 16, at most `limit`."""
    return min(limit, max(16, 1 << (longest - 1).bit_length()))


def eval_batches(
    examples: list[dict],
    batch_size: int,
    length: int,
    process_index: int = 0,
    process_count: int = 1,
    by_length: bool = False,
) -> Iterator[dict]:
    """This process's part of each global eval batch of `batch_size` examples, padded to `length`.

    Every process yields the same number of batches; `example_mask` marks real rows and
    `index` their position in the split (-1 for filler), so each example counts once.
    Longer examples are truncated to `length` (ending in EOS). With `by_length` (for searches),
    batches take the examples longest source first, each padded to its `length_bucket` (at most
    `length`): sentences of similar length end their search together, and short ones are cheap.
    """
    if batch_size % process_count:
        raise UserError(f"eval batch size {batch_size} does not split over {process_count} processes.")
    local = batch_size // process_count
    order = list(range(len(examples)))
    if by_length:
        order.sort(key=lambda i: -len(examples[i]["inputs"]))
    for start in range(0, len(examples), batch_size):
        members = order[start : start + batch_size]
        padded = length
        if by_length:
            padded = length_bucket(max(len(examples[i]["inputs"]) for i in members), length)
        batch = {key: np.full((local, padded), PAD_ID, np.int32) for key in ("inputs", "targets")}
        batch["index"] = np.full((local,), -1, np.int32)
        for row, i in enumerate(members[process_index * local : (process_index + 1) * local]):
            for key in ("inputs", "targets"):
                ids = _truncate(examples[i][key], padded)
                batch[key][row, : len(ids)] = ids
            batch["index"][row] = i
        batch["example_mask"] = (batch["index"] >= 0).astype(np.float32)
        yield batch


def pairs_in(batch: dict) -> int:
    """Sentence pairs in a packed batch: each row numbers its pairs 1, 2, ... in its segment ids."""
    return int(batch["targets_segment_ids"].max(axis=1).sum())


def epoch_size(total: int, length_filter: LengthFilter) -> float:
    """Training pairs in one epoch: the split's pairs less those the length filter drops (the
    share dropped so far estimates the share of the whole split)."""
    if length_filter.overlong != "drop" or not length_filter.seen:
        return float(max(total, 1))
    return max(total * (1 - length_filter.overlong_pairs / length_filter.seen), 1.0)
