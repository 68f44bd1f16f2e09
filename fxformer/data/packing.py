"""Packing pre-tokenized examples into training rows, one epoch planned at a time.

A batch is `rows` rows of `max_length` slots per side. Examples are taken in the epoch's
shuffled order and placed first fit: into the first row with room on both sides; when one fits
none of the rows, the batch is closed and the example opens the next one (the semantics of
grain's FirstFitPackIterDataset with `rows` bins). Every example of a shard appears once per
epoch, and epochs follow one another as one stream: the examples of an epoch's last, unfinished
batch are carried to the front of the next epoch's order, so no batch is left part empty at an
epoch's end (a shard small enough to fit one batch makes one batch an epoch). A part-empty batch
every epoch cost the mini Table 3's base 14% of its dev perplexity at step 1,000: its few rows'
gradient took a whole step. Keys of a batch: inputs, targets and, for
each, `_segment_ids` (1, 2, ... per packed example, 0 = padding) and `_positions` (restarting at
0 in every example).

Planning needs only the examples' lengths, so it is cheap; filling a batch is a handful of
vectorized copies from the stored ids (`fxformer.data.tokenized`). A batch is a pure function
of (seed, shard, epoch, batch): any process or grain worker makes the same one, and a resumed
run makes the same batches from the same position.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from fxformer.data.tokenized import Split
from fxformer.tokens import EOS_ID, PAD_ID

KEYS = ("inputs", "targets")


@dataclasses.dataclass(frozen=True)
class Plan:
    """One epoch of one shard: each placed example's index, row, segment and columns, in the
    order placed; `starts[b]:starts[b + 1]` are batch b's entries; `carry`, the examples of the
    unfinished batch after them, which open the next epoch."""

    example: np.ndarray
    row: np.ndarray
    segment: np.ndarray
    column: dict  # key -> np.ndarray
    starts: np.ndarray
    carry: np.ndarray

    @property
    def batches(self) -> int:
        return len(self.starts) - 1


def first_fit(lengths: dict, order: np.ndarray, rows: int, max_length: int, rng: np.random.Generator) -> Plan:
    """Place `order`'s examples (their per-key `lengths`, each at most max_length) first fit into
    batches of `rows` rows; each closed batch's rows are shuffled (grain's shuffle_bins)."""
    length_in, length_out = lengths["inputs"][order].tolist(), lengths["targets"][order].tolist()
    n = len(order)
    row, segment, col_in, col_out = (np.empty(n, np.int32) for _ in range(4))
    starts = [0]
    free_in, free_out, used = [max_length] * rows, [max_length] * rows, [0] * rows
    for i in range(n):
        a, b = length_in[i], length_out[i]
        for r in range(rows):
            if free_in[r] >= a and free_out[r] >= b:
                break
        else:  # fits no row: close the batch, open the next
            starts.append(i)
            free_in, free_out, used = [max_length] * rows, [max_length] * rows, [0] * rows
            r = 0
        row[i], col_in[i], col_out[i] = r, max_length - free_in[r], max_length - free_out[r]
        used[r] += 1
        segment[i] = used[r]
        free_in[r] -= a
        free_out[r] -= b
    if len(starts) == 1:  # every example fits one batch: that batch is the epoch
        starts.append(n)
    end = starts[-1]  # the unfinished batch from here on is carried to the next epoch
    starts = np.asarray(starts, np.int64)
    for s, e in zip(starts[:-1], starts[1:]):  # shuffled rows: the fullest are not all on one device
        row[s:e] = rng.permutation(rows)[row[s:e]]
    column = {"inputs": col_in[:end], "targets": col_out[:end]}
    return Plan(order[:end], row[:end], segment[:end], column, starts, carry=order[end:])


def fill(split: Split, plan: Plan, batch: int, rows: int, max_length: int) -> dict[str, np.ndarray]:
    """Batch `batch` of `plan`, filled from the stored ids: [rows, max_length] int32 arrays."""
    s, e = plan.starts[batch], plan.starts[batch + 1]
    example, segment = plan.example[s:e], plan.segment[s:e]
    row_start = plan.row[s:e].astype(np.int64) * max_length
    out = {}
    for key in KEYS:
        side = getattr(split, key)
        begin = side.offsets[example]
        full = side.offsets[example + 1] - begin
        length = np.minimum(full, max_length)  # truncated examples keep max_length - 1 tokens and EOS
        each = np.repeat(np.arange(len(example)), length)  # [tokens]: which example a token belongs to
        within = np.arange(len(each)) - np.repeat(np.cumsum(length) - length, length)
        first = row_start + plan.column[key][s:e]  # where each example starts in the flattened batch
        at = first[each] + within
        ids = np.full(rows * max_length, PAD_ID, np.int32)
        ids[at] = side.ids[begin[each] + within]
        ids[(first + max_length - 1)[full > max_length]] = EOS_ID
        segment_ids, positions = np.zeros(rows * max_length, np.int32), np.zeros(rows * max_length, np.int32)
        segment_ids[at], positions[at] = segment[each], within
        shape = (rows, max_length)
        out |= {
            key: ids.reshape(shape),
            f"{key}_segment_ids": segment_ids.reshape(shape),
            f"{key}_positions": positions.reshape(shape),
        }
    return out


class Shard:
    """The training batches of one shard, endless: batch k of the shard (across epochs) made on
    demand. Picklable (grain workers make their own copy): it holds a loader of the ids, not them."""

    def __init__(self, load_split, shard: int, num_shards: int, rows: int, max_length: int, overlong: str, seed: int):
        self.load_split, self.shard, self.num_shards = load_split, shard, num_shards
        self.rows, self.max_length, self.overlong, self.seed = rows, max_length, overlong, seed
        self._epochs: list[tuple[int, np.ndarray]] = []  # (batches, carry) of epochs 0, 1, ... planned so far

    def __getstate__(self):
        state = dict(self.__dict__)
        for cached in ("split", "_overlong", "_kept"):  # rebuilt from the loader: not pickled
            state.pop(cached, None)
        return state

    @functools.cached_property
    def split(self) -> Split:
        return self.load_split()

    @functools.cached_property
    def _overlong(self) -> tuple[np.ndarray, np.ndarray]:
        """(indices of this shard's examples, whether each is longer than `max_length` on either side)."""
        mine = np.arange(self.shard, len(self.split), self.num_shards)
        return mine, np.maximum(self.split.inputs.lengths[mine], self.split.targets.lengths[mine]) > self.max_length

    @functools.cached_property
    def _kept(self) -> tuple[np.ndarray, dict]:
        """(indices of this shard's examples training keeps, every example's lengths clipped)."""
        lengths = {key: getattr(self.split, key).lengths for key in KEYS}
        mine, overlong = self._overlong
        if self.overlong == "drop":
            mine = mine[~overlong]
        return mine, {key: np.minimum(value, self.max_length) for key, value in lengths.items()}

    def counts(self) -> tuple[int, int]:
        """(examples of the shard, those longer than `max_length` on either side: dropped or truncated)."""
        mine, overlong = self._overlong
        return len(mine), int(overlong.sum())

    @functools.lru_cache(maxsize=2)  # noqa: B019 - a shard lives as long as its pipeline
    def plan(self, epoch: int) -> Plan:
        """Epoch `epoch`: the examples the epoch before carried, then its own permutation of the
        kept examples, packed (the epochs before are planned first, once, for their carries)."""
        while len(self._epochs) < epoch:
            self.plan(len(self._epochs))
        kept, lengths = self._kept
        rng = np.random.default_rng([self.seed, self.shard, self.num_shards, epoch])
        carried = self._epochs[epoch - 1][1] if epoch else kept[:0]
        plan = first_fit(lengths, np.concatenate([carried, rng.permutation(kept)]), self.rows, self.max_length, rng)
        if len(self._epochs) == epoch:
            self._epochs.append((plan.batches, plan.carry))
        return plan

    def locate(self, k: int) -> tuple[int, int]:
        """(epoch, batch within it) of the shard's batch `k`."""
        epoch = 0
        while True:
            if epoch == len(self._epochs):
                self.plan(epoch)
            if k < self._epochs[epoch][0]:
                return epoch, k
            k -= self._epochs[epoch][0]
            epoch += 1

    def __getitem__(self, k: int) -> dict[str, np.ndarray]:
        epoch, batch = self.locate(k)
        return fill(self.split, self.plan(epoch), batch, self.rows, self.max_length)
