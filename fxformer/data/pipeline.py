"""The grain input pipeline: token ids -> packed training rows / padded eval batches.

Training reads the token ids stored at preparation (`fxformer.data.tokenized`), never text:
shard(process) - shuffle(seed, reshuffled every epoch) - length filter - pack into
fixed-length rows with segment ids and positions (`fxformer.data.packing`) - a batch per step,
made in this process or in `data.workers` grain processes. The iterator's state
(`get_state`/`set_state`) is saved with each checkpoint, so a resumed run sees exactly the
batches it would have seen.

Evaluation: every example exactly once, in order, padded (not packed), the last partial batch
filled with empty rows whose `example_mask` is 0.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import os
import signal
from collections.abc import Iterator

import grain
import ml_collections
import numpy as np
from absl import flags as absl_flags

from fxformer import paths
from fxformer.data import packing, tokenized
from fxformer.data.tokenizer import Tokenizer
from fxformer.errors import UserError
from fxformer.tokens import EOS_ID, PAD_ID


@dataclasses.dataclass(frozen=True)
class LengthReport:
    """What `data.max_length` does to a process's training pairs: `seen` of them, `overlong_pairs`
    longer than `max_length` on either side, dropped or truncated (`overlong`)."""

    max_length: int
    overlong: str
    seen: int
    overlong_pairs: int

    def report(self, processes: int = 1) -> str:
        """What was dropped or truncated, of this process's pairs (one of `processes` shares)."""
        verb = "dropped" if self.overlong == "drop" else "truncated"
        whose = f" in this process's shards (1 of {processes} processes)" if processes > 1 else ""
        return f"{verb} {self.overlong_pairs:,} of {self.seen:,} pairs longer than {self.max_length} tokens{whose}"


def _truncate(ids: np.ndarray, max_length: int) -> np.ndarray:
    return np.concatenate([ids[: max_length - 1], [EOS_ID]]).astype(np.int32) if len(ids) > max_length else ids


def tokenize_fn(tokenizer: Tokenizer, source_lang: str, target_lang: str):
    """A record {lang: bytes} -> {'inputs': ids, 'targets': ids}, each ending in EOS."""

    def tokenize(record: dict) -> dict:
        text = lambda x: x.decode("utf-8") if isinstance(x, bytes) else str(x)
        return {
            "inputs": tokenizer.encode_source(text(record[source_lang])),
            "targets": tokenizer.encode_target(text(record[target_lang])),
        }

    return tokenize


def check_lengths(split: tokenized.Split, data: ml_collections.ConfigDict, log=print) -> None:
    """Before training, from the stored lengths of every training pair: refuse in one sentence a
    `data.max_length` that keeps none of them (training could never fill a batch), and say at the
    start, not at the end, when it drops more than half."""
    if data.overlong != "drop" or len(split) == 0:
        return
    longer = np.maximum(split.inputs.lengths, split.targets.lengths)  # EOS included
    count, kept = len(longer), int((longer <= data.max_length).sum())
    if kept == 0:
        raise UserError(
            f"data.max_length={data.max_length} keeps none of all {count:,} training pairs (the shortest has "
            f"{int(longer.min())} tokens on its longer side, EOS included), so training could never fill a batch; "
            f"raise data.max_length or set data.overlong=truncate."
        )
    if kept < count / 2:
        share = 100 * (count - kept) / count
        log(
            f"warning: data.max_length={data.max_length} drops {share:.0f}% of all {count:,} training pairs "
            f"({kept:,} of {count:,} kept); raise it or set data.overlong=truncate to train on more of them"
        )


def rows_per_step(data: ml_collections.ConfigDict, num_devices: int, grad_accum_steps: int = 1) -> int:
    """Global packed rows per step: the token budget over the row length, rounded up to a multiple
    of devices x micro-batches (and of the data shards)."""
    unit = math.lcm(num_devices * grad_accum_steps, data.num_shards or 1)
    rows = max(1, data.tokens_per_batch // data.max_length)
    return unit * math.ceil(rows / unit)


ENDLESS = 1 << 62  # batch indices: training never runs out


class ProcessBatches:
    """A process's batch k: batch k of each of its shards, their rows stacked (picklable, for grain workers)."""

    def __init__(self, shards: list[packing.Shard]):
        self.shards = shards

    def __call__(self, k: int) -> dict[str, np.ndarray]:
        parts = [shard[k] for shard in self.shards]
        return parts[0] if len(parts) == 1 else {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def die_with_parent(worker_index: int, worker_count: int) -> None:
    """In a grain worker: end when the training process ends, even by `kill -9` (Linux; elsewhere
    grain's own check of its parent stops it later)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(0)


def train_dataset(
    ids: paths.PathLike,
    data: ml_collections.ConfigDict,
    rows: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
) -> tuple[grain.IterDataset, LengthReport]:
    """Endless packed training batches for this process, [rows / process_count, max_length] arrays,
    from the token ids stored in the folder `ids` (`fxformer.data.tokenized`).

    The training pairs are split into `data.num_shards` shards (0 = one per process); each shard
    is shuffled every epoch and packed into its share of the rows (`fxformer.data.packing`), and a
    process reads only its own shards. With a fixed shard count the global batches do not depend
    on how many processes read them. Batch k is a pure function of k, so `data.workers` grain
    processes can make them in parallel, and the iterator's state is the next k.
    """
    num_shards = data.num_shards or process_count
    # shards per process: config.validate; rows per shard: rows_per_step rounds rows to a multiple of the
    # shards (or, with num_shards 0, of the devices, themselves a multiple of the processes)
    assert num_shards % process_count == 0 and rows % num_shards == 0, (num_shards, process_count, rows)
    per_process = num_shards // process_count
    load = functools.partial(tokenized.load, str(ids), data.train_split)
    shards = [
        packing.Shard(load, shard, num_shards, rows // num_shards, data.max_length, data.overlong, seed)
        for shard in range(process_index * per_process, (process_index + 1) * per_process)
    ]
    counts = [shard.counts() for shard in shards]
    report = LengthReport(data.max_length, data.overlong, sum(c[0] for c in counts), sum(c[1] for c in counts))
    dataset = grain.MapDataset.range(ENDLESS).map(ProcessBatches(shards))
    dataset = dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
    if data.workers:
        if not absl_flags.FLAGS.is_parsed():  # grain 0.2 reads an absl flag in its workers (google/grain#1355)
            absl_flags.FLAGS.mark_as_parsed()
        options = grain.MultiprocessingOptions(num_workers=data.workers)
        dataset = dataset.mp_prefetch(options, worker_init_fn=die_with_parent)
    return dataset, report


def eval_length(examples: list[dict], limit: int) -> int:
    """Padded length of eval batches: the longest example rounded up to 8, at most `limit`."""
    longest = max((max(len(e["inputs"]), len(e["targets"])) for e in examples), default=1)
    return min(limit, 8 * math.ceil(longest / 8))


def tokenize_split(source, tokenizer: Tokenizer, data: ml_collections.ConfigDict, limit: int = 0) -> list[dict]:
    """Every example of an eval split, tokenized, in order (the first `limit` if > 0)."""
    tokenize = tokenize_fn(tokenizer, data.source_lang, data.target_lang)
    n = len(source) if limit <= 0 else min(limit, len(source))
    return [tokenize(source[i]) for i in range(n)]


def tokenize_pairs(tokenizer: Tokenizer, sources: list[str], targets: list[str]) -> list[dict]:
    """Sentence pairs as examples {'inputs': ids, 'targets': ids}, each ending in EOS, in order."""
    return [
        {"inputs": tokenizer.encode_source(s), "targets": tokenizer.encode_target(t)} for s, t in zip(sources, targets)
    ]


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


def epoch_size(total: int, lengths: LengthReport) -> float:
    """Training pairs in one epoch: the split's pairs less those the length filter drops (the
    share this process drops stands for the share of the whole split)."""
    if lengths.overlong != "drop" or not lengths.seen:
        return float(max(total, 1))
    return max(total * (1 - lengths.overlong_pairs / lengths.seen), 1.0)
