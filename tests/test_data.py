"""Corpora, tokenizer and grain pipeline, each checked against an independent computation."""

import gzip
import json
import math
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import left_as_is, small_config
from tensorflow_datasets.translate import wmt14

from fxformer import paths
from fxformer.config import validate
from fxformer.data import corpora, packing, pipeline, token_ids, tokenized
from fxformer.data.tokenizer import tokenizer_for
from fxformer.errors import UserError
from fxformer.tokens import EOS_ID, PAD_ID


def texts(builder, split, lang):
    source = corpora.data_source(builder, split)
    return [source[i][lang].decode("utf-8") for i in range(len(source))]


def first_batches(it, n):
    return [next(it) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_no_validation_or_test_sentence_occurs_in_train(corpus):
    _, builder, _ = corpus
    for lang in ("en", "de"):
        train = set(texts(builder, "train", lang))
        held_out = texts(builder, "validation", lang) + texts(builder, "test", lang)
        assert len(train) == 3000 and len(held_out) == 2 * 52
        assert not train.intersection(held_out)


def test_tokenizer_round_trips_the_corpus_with_distinct_special_ids(corpus):
    _, builder, tokenizer = corpus
    sp = tokenizer.sp
    assert len({sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()}) == 4
    for split in ("train", "validation", "test"):
        for lang in ("en", "de"):
            for sentence in texts(builder, split, lang):
                ids = tokenizer.encode(sentence)
                assert ids[-1] == EOS_ID and PAD_ID not in ids and sp.unk_id() not in ids
                assert tokenizer.decode(ids) == sentence


def unpacked(batches: list[dict]) -> Counter:
    """Every packed example of `batches`, rebuilt from its segment ids, as (inputs, targets); asserts
    that padding is PAD and positions count 0, 1, 2, ... in every example."""
    found = Counter()
    for batch in batches:
        for row in range(batch["inputs"].shape[0]):
            segments = {}
            for side in ("inputs", "targets"):
                seg, pos, tok = (batch[side + k][row] for k in ("_segment_ids", "_positions", ""))
                assert (tok[seg == 0] == PAD_ID).all()
                for s in np.unique(seg[seg > 0]):
                    np.testing.assert_array_equal(pos[seg == s], np.arange((seg == s).sum()))
                    segments.setdefault(s, {})[side] = tuple(tok[seg == s])
            for parts in segments.values():
                found[parts["inputs"], parts["targets"]] += 1
    return found


def one_epoch(ids, split: str, data, rows: int, shard: int = 0, num_shards: int = 1) -> tuple[list[dict], list[int]]:
    """Epoch 0's batches, and the indices of the examples its unfinished last batch carried into
    epoch 1 (every example of the epoch is in one or the other)."""
    load = lambda: tokenized.load(ids, split)
    packer = packing.Shard(load, shard, num_shards, rows, data.max_length, data.overlong, seed=3)
    plan = packer.plan(0)
    return [packer[k] for k in range(plan.batches)], plan.carry.tolist()


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_packing_keeps_every_token_once_with_its_segment_and_position(corpus, corpus_ids, overlong):
    config, builder, tokenizer = corpus
    data = config.data.copy_and_resolve_references()  # the fixture is shared: change a copy
    data.overlong, data.max_length = overlong, 20  # some pairs are longer: dropped or truncated
    source = corpora.data_source(builder, "validation")
    # Independently: tokenize every pair from its text; keep those that fit, or cut them to 19 + EOS.
    expected, pair, overlong_pairs = Counter(), {}, 0
    for i in range(len(source)):
        src, tgt = (list(tokenizer.encode(source[i][lang].decode())) for lang in ("en", "de"))
        if max(len(src), len(tgt)) <= data.max_length:
            pair[i] = tuple(src), tuple(tgt)
        elif overlong == "truncate":
            cut = lambda ids: tuple(ids[:19] + [EOS_ID]) if len(ids) > 20 else tuple(ids)
            pair[i] = cut(src), cut(tgt)
        overlong_pairs += max(len(src), len(tgt)) > data.max_length
    expected.update(pair.values())
    assert overlong_pairs > 0
    batches, carried = one_epoch(corpus_ids, "validation", data, rows=4)
    assert (
        0 < len(carried) < sum(expected.values()) and unpacked(batches) + Counter(pair[i] for i in carried) == expected
    )
    data.train_split = "validation"  # the report training logs counts them in either mode
    _, report = pipeline.train_dataset(corpus_ids, data, rows=4, seed=3)
    assert (report.seen, report.overlong_pairs) == (len(source), overlong_pairs), report
    verb = "dropped" if overlong == "drop" else "truncated"
    assert report.report() == f"{verb} {overlong_pairs:,} of {len(source):,} pairs longer than 20 tokens"
    # on two processes each counts its own shard: the report says whose pairs it counted
    halves = [
        pipeline.train_dataset(corpus_ids, data, rows=4, seed=3, process_index=i, process_count=2)[1] for i in (0, 1)
    ]
    assert sum(h.seen for h in halves) == len(source) and sum(h.overlong_pairs for h in halves) == overlong_pairs
    assert (
        halves[0]
        .report(2)
        .endswith(f"of {halves[0].seen:,} pairs longer than 20 tokens in this process's shards (1 of 2 processes)")
    )


def test_no_batch_is_part_empty_where_one_epoch_ends_and_the_next_begins(corpus, corpus_ids):
    """An epoch's last, unfinished batch is not trained on as it is (a few rows whose gradient
    takes a whole step: the mini Table 3's base lost 14% of its dev perplexity to one such batch
    an epoch); its examples open the next epoch, and every epoch still holds each example once."""
    config, _, _ = corpus
    data = config.data.copy_and_resolve_references()
    data.max_length = 128  # keep every pair
    shard = packing.Shard(lambda: tokenized.load(corpus_ids, "validation"), 0, 1, 4, 128, data.overlong, seed=3)
    plans = [shard.plan(epoch) for epoch in range(4)]
    stream = [shard[k] for k in range(sum(p.batches for p in plans))]
    assert all((batch["targets_segment_ids"] > 0).any(axis=1).all() for batch in stream)  # every row holds pairs
    for previous, plan in zip(plans, plans[1:]):
        np.testing.assert_array_equal(plan.example[: len(previous.carry)], previous.carry)
    seen = unpacked(stream)
    assert set(seen.values()) <= {3, 4} and sum(v == 3 for v in seen.values()) == len(plans[-1].carry) > 0


def test_stored_ids_are_the_tokenized_text(corpus, corpus_ids):
    config, builder, tokenizer = corpus
    for split in ("train", "validation", "test"):
        stored = tokenized.load(corpus_ids, split).examples()
        source = corpora.data_source(builder, split)
        assert len(stored) == len(source)
        for example, i in zip(stored, range(len(source))):
            for side, lang in (("inputs", "en"), ("targets", "de")):
                np.testing.assert_array_equal(example[side], tokenizer.encode(source[i][lang].decode()))


def test_another_tokenizer_or_corpus_gets_its_own_stored_ids(tmp_path, corpus, corpus_ids):
    config, builder, tokenizer = corpus
    other = tokenizer_for(small_config(config.data.tfds_data_dir, vocab_size=200).data, builder)  # another BPE model
    assert other.path != tokenizer.path
    sources = {"test": corpora.data_source(builder, "test")}
    where = tokenized.build(builder.data_dir, other, sources, "en", "de", log=lambda *a: None)
    assert where != corpus_ids and where.parent == corpus_ids.parent
    first = corpora.data_source(builder, "test")[0]["en"].decode()
    np.testing.assert_array_equal(tokenized.load(where, "test").examples(1)[0]["inputs"], other.encode(first))
    config = small_config(tmp_path, num_train=300)  # another corpus: its own dataset folder, its own ids
    builder = corpora.prepare(config.data)
    built = token_ids(config.data, builder, tokenizer_for(config.data, builder), log=lambda *a: None)
    assert tmp_path in built.parents and len(tokenized.load(built, "train")) == 300


def test_the_other_direction_with_the_same_tokenizer_gets_its_own_stored_ids(corpus, corpus_ids):
    config, builder, tokenizer = corpus  # one BPE model serves both directions: its hash cannot tell them apart
    sources = {"test": corpora.data_source(builder, "test")}
    where = tokenized.build(builder.data_dir, tokenizer, sources, "de", "en", log=lambda *a: None)
    assert where != corpus_ids and where.parent == corpus_ids.parent
    first = sources["test"][0]
    example = tokenized.load(where, "test").examples(1)[0]  # once the en -> de ids: inputs were English
    np.testing.assert_array_equal(example["inputs"], tokenizer.encode(first["de"].decode()))
    np.testing.assert_array_equal(example["targets"], tokenizer.encode(first["en"].decode()))


@pytest.mark.parametrize("by_length", [False, True])
@pytest.mark.parametrize("process_count", [1, 2])
def test_eval_batches_cover_every_example_exactly_once(corpus, process_count, by_length):
    config, builder, tokenizer = corpus
    examples = pipeline.tokenize_split(corpora.data_source(builder, "test"), tokenizer, config.data)
    length = pipeline.eval_length(examples, limit=64)
    seen = Counter()
    num_batches, widths = [], []
    for p in range(process_count):
        batches = list(pipeline.eval_batches(examples, 12, length, p, process_count, by_length))
        num_batches.append(len(batches))
        widths.append([b["inputs"].shape[1] for b in batches])
        for batch in batches:
            for row, index in enumerate(batch["index"]):
                assert batch["example_mask"][row] == (index >= 0)
                if index >= 0:
                    seen[index] += 1
                    ids = examples[index]["inputs"]
                    np.testing.assert_array_equal(batch["inputs"][row, : len(ids)], ids)
                    assert (batch["inputs"][row, len(ids) :] == PAD_ID).all()
                else:
                    assert (batch["inputs"][row] == PAD_ID).all()
    full, rest = divmod(len(examples), 12)
    assert rest and num_batches == [full + 1] * process_count  # the last part-filled; every process as many steps
    assert seen == Counter(range(len(examples)))
    assert all(w == widths[0] for w in widths)  # every process pads a batch alike
    if not by_length:
        assert widths[0] == [length] * (full + 1)
    else:  # longest first, each batch as long as the power of two (from 16) that holds its longest source
        lengths = sorted((len(e["inputs"]) for e in examples), reverse=True)
        want = [min(length, max(16, 2 ** math.ceil(math.log2(lengths[12 * b])))) for b in range(full + 1)]
        assert widths[0] == want and want[-1] < want[0]


def test_same_seed_same_batches_and_another_seed_others(corpus, corpus_ids):
    config, _, _ = corpus
    make = lambda seed: iter(pipeline.train_dataset(corpus_ids, config.data, 8, seed)[0])
    a, b, c = first_batches(make(0), 5), first_batches(make(0), 5), first_batches(make(1), 5)
    assert_same_batches(a, b)
    assert not np.array_equal(a[0]["inputs"], c[0]["inputs"])


@pytest.mark.parametrize("workers", [0, 2])
def test_restored_iterator_continues_as_if_never_stopped(corpus, corpus_ids, workers):
    config, _, _ = corpus
    data = config.data.copy_and_resolve_references()
    data.workers = workers

    def make():
        return iter(pipeline.train_dataset(corpus_ids, data, 8, seed=5)[0])

    epoch = one_epoch_batches(corpus_ids, data)
    uninterrupted = first_batches(make(), epoch + 30)  # past the end of the first epoch
    stopped = make()
    first_batches(stopped, epoch - 10)
    state = stopped.get_state()
    resumed = make()
    resumed.set_state(json.loads(json.dumps(state)))
    assert_same_batches(first_batches(resumed, 40), uninterrupted[epoch - 10 :])
    if workers:  # the workers make the batches the training process would have made
        in_process = iter(pipeline.train_dataset(corpus_ids, config.data, 8, seed=5)[0])
        assert_same_batches(uninterrupted, first_batches(in_process, epoch + 30))


def one_epoch_batches(ids, data, rows: int = 8) -> int:
    shard = packing.Shard(lambda: tokenized.load(ids, "train"), 0, 1, rows, data.max_length, data.overlong, seed=5)
    return shard.plan(0).batches


def test_process_shards_are_disjoint_and_complete(corpus, corpus_ids):
    config, builder, tokenizer = corpus
    data = config.data.copy_and_resolve_references()
    data.max_length = 128  # keep every pair
    sources = [tuple(tokenizer.encode(t)) for t in texts(builder, "validation", "en")]
    seen = Counter()
    for shard in range(2):
        batches, carried = one_epoch(corpus_ids, "validation", data, rows=4, shard=shard, num_shards=2)
        assert all(i % 2 == shard for i in carried)  # a shard carries its own examples
        seen += Counter(src for src, _ in unpacked(batches).elements()) + Counter(sources[i] for i in carried)
    assert sum(seen.values()) == len(sources) == 52 and seen == Counter(sources)


class FakeWmt14(wmt14.Wmt14Translate, skip_registration=True):
    """The real WMT14 builder's name, features and layout, generating made-up sentences offline."""

    name = "wmt14_translate"

    def _split_generators(self, dl_manager):
        def generate(n, tag):
            for i in range(n):
                yield i, {"de": f"Das ist Satz {i} aus {tag}.", "en": f"This is sentence {i} from {tag}."}

        return {"train": generate(300, "train"), "validation": generate(20, "dev"), "test": generate(30, "test")}


def test_wmt14_path_produces_batches_from_generated_data(tmp_path):
    FakeWmt14(config="de-en", data_dir=tmp_path).download_and_prepare(file_format="array_record")
    config = small_config(tmp_path, dataset="wmt14_translate/de-en", vocab_size=100, tokenizer_sentences=600)
    builder = corpora.prepare(config.data)  # the registered tfds builder, reading what is on disk
    assert type(builder).__name__ == "Wmt14Translate" and builder.info.supervised_keys == ("de", "en")
    tokenizer = tokenizer_for(config.data, builder, paths.Workdir(tmp_path / "work"))
    assert (tmp_path / "work" / "tokenizer.model").exists()
    ids = token_ids(config.data, builder, tokenizer, log=lambda *a: None)
    batch = next(iter(pipeline.train_dataset(ids, config.data, 8, seed=0)[0]))
    assert batch["inputs"].shape == (8, 32) and (batch["inputs_segment_ids"] > 0).mean() > 0.5
    row = batch["inputs"][0][batch["inputs_segment_ids"][0] == 1]
    assert tokenizer.decode(row).startswith("This is sentence")  # en is the source, as in the paper
    test = pipeline.tokenize_split(corpora.data_source(builder, "test"), tokenizer, config.data)
    assert sum(b["example_mask"].sum() for b in pipeline.eval_batches(test, 8, 32)) == 30


def test_wmt17_is_an_option(tmp_path):
    config = small_config(tmp_path, dataset="wmt17_translate/de-en")
    assert corpora.get_builder(config.data).name == "wmt17_translate"


def test_own_parallel_text_files(tmp_path):
    with gzip.open(tmp_path / "train.en.gz", "wt") as f:
        f.writelines(f"sentence number {i}\n" for i in range(50))
    (tmp_path / "train.de").write_text("".join(f"Satz Nummer {i}\n" for i in range(50)))
    config = small_config(
        tmp_path,
        dataset="text",
        source_file=str(tmp_path / "train.en.gz"),
        target_file=str(tmp_path / "train.de"),
        heldout=5,
    )
    builder = corpora.prepare(config.data)
    assert texts(builder, "train", "en")[:2] == ["sentence number 0", "sentence number 1"]
    assert texts(builder, "validation", "de") == [f"Satz Nummer {i}" for i in range(40, 45)]
    assert texts(builder, "test", "de") == [f"Satz Nummer {i}" for i in range(45, 50)]
    config.data.train_pairs = 12  # the first 12 training pairs: another dataset, the same held-out pairs
    subset = corpora.prepare(config.data)
    assert subset.builder_config.name != builder.builder_config.name
    assert texts(subset, "train", "de") == [f"Satz Nummer {i}" for i in range(12)]
    assert texts(subset, "validation", "de") == texts(builder, "validation", "de")
    config.data.train_pairs = 41
    with pytest.raises(UserError, match="data.train_pairs is 41 but .* gives 40 training pairs"):
        corpora.prepare(config.data)


def test_making_a_local_builder_leaves_no_temporary_directory(tmp_path, monkeypatch):
    """TFDS looks up a builder's precomputed info in its GCS bucket by first making a temporary
    directory, left empty; local builders skip the lookup (none of theirs is in the bucket)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    (tmp_path / "a.en").write_text("x\n" * 30)
    (tmp_path / "a.de").write_text("y\n" * 30)
    for overrides in ({}, dict(dataset="text", source_file=str(tmp_path / "a.en"), target_file=str(tmp_path / "a.de"))):
        builder = corpora.get_builder(small_config(tmp_path / "data", **overrides).data)
        assert isinstance(builder.info, corpora.LocalInfo) and not builder.info.splits  # not prepared yet
    assert list(scratch.iterdir()) == []
    # the registered datasets keep TFDS's own lookup (which leaves the directory)
    corpora.get_builder(small_config(tmp_path / "data", dataset="wmt17_translate/de-en").data)
    assert [p.name.endswith("tfds") for p in scratch.iterdir()] == [True]


@pytest.mark.slow
def test_missing_data_is_one_sentence(tmp_path):
    with left_as_is(tmp_path):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "fxformer.data",
                "--config=configs/default.py",
                "--config.data.dataset=text",
                f"--config.data.source_file={tmp_path}/nope.en",
                f"--config.data.target_file={tmp_path}/nope.de",
            ],
            capture_output=True,
            text=True,
        )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: data.source_file '{tmp_path}/nope.en' does not exist."


def test_grain_iterator_state_is_json(corpus, corpus_ids):
    config, _, _ = corpus
    it = iter(pipeline.train_dataset(corpus_ids, config.data, 8, 0)[0])
    next(it)
    assert json.loads(json.dumps(it.get_state())) == it.get_state()


def test_a_length_limit_that_keeps_no_pair_is_refused_before_training(corpus, corpus_ids):
    config, builder, tokenizer = corpus
    source = builder.as_data_source(split="train")
    lengths = []  # the longer side of every pair, counted independently of check_lengths
    for record in source:
        ids = [tokenizer.encode(record[lang].decode()) for lang in ("en", "de")]
        lengths.append(max(len(x) for x in ids))
    split = tokenized.load(corpus_ids, "train")
    data = config.data.copy_and_resolve_references()
    data.max_length = min(lengths) - 1  # below every pair: training could never fill a batch
    with pytest.raises(pipeline.UserError, match=f"keeps none of all {len(source):,} training pairs"):
        pipeline.check_lengths(split, data)
    said = []
    data.max_length = int(np.percentile(lengths, 25))  # drops most pairs: said at the start
    pipeline.check_lengths(split, data, log=said.append)
    kept = sum(length <= data.max_length for length in lengths)
    assert len(said) == 1 and f"({kept:,} of {len(source):,} kept)" in said[0]
    said.clear()
    data.max_length = max(lengths)  # keeps them all: nothing to say
    pipeline.check_lengths(split, data, log=said.append)
    assert said == []


def test_an_unknown_dataset_of_a_known_tfds_family_is_one_sentence(tmp_path):
    config = small_config(tmp_path)
    for name in ("wmt99_translate/xx-yy", "wmt14_translate/xx-yy", "no_such_dataset"):
        config.data.dataset = name
        with pytest.raises(corpora.UserError, match=f"TFDS has no dataset '{name}'"):
            corpora.get_builder(config.data)


def test_broken_gzip_files_and_directories_are_named_in_one_sentence(tmp_path):
    whole = gzip.compress(b"a line\n" * 1000)
    (tmp_path / "cut.en.gz").write_bytes(whole[: len(whole) // 2])  # cut short: EOFError inside gzip
    (tmp_path / "plain.en.gz").write_bytes(b"not gzip at all\n")  # BadGzipFile
    for name in ("cut.en.gz", "plain.en.gz"):
        with pytest.raises(corpora.UserError, match=f"{tmp_path}/{name} is not a whole gzip file"):
            corpora._read_lines(str(tmp_path / name))
    config = small_config(tmp_path)
    config.data.dataset, config.data.source_file, config.data.target_file = "text", str(tmp_path), "x.de"
    with pytest.raises(corpora.UserError, match=f"data.source_file '{tmp_path}' is a directory"):
        corpora.get_builder(config.data)


def test_an_empty_embedded_split_and_a_long_preparation_error_are_one_readable_sentence(tmp_path):
    config = small_config(tmp_path)
    config.data.num_train = 0
    with pytest.raises(corpora.UserError, match="data.num_train must be at least 1 for the embedded corpus, not 0"):
        validate(config)
    long = "Failed to establish a new connection: " + "HTTPSConnectionPool(host='statmt.org', port=443) " * 10
    message = corpora.prepare_failure(ConnectionError(long + "\nsecond line"), config.data, "/data")
    inner = message.split("(ConnectionError: ", 1)[1].rsplit("); see docs/data.md", 1)[0]
    assert inner.endswith(" ...") and len(inner) <= 244 and "second line" not in message
    assert long.startswith(inner.removesuffix(" ...")) and long[len(inner) - 4] == " "  # cut at a word boundary


def test_two_processes_preparing_one_dataset_at_once_both_go_on(tmp_path, monkeypatch):
    """The other process's preparation lands while this one's runs (a real process, run in full
    after this one wrote its files and before TFDS renames them into place): the rename finds
    the other's folder, and this process reads those files instead of failing."""
    config = small_config(tmp_path)
    config.data.num_train = 200  # a dataset of its own: the session's corpus is prepared already
    builder_class = type(corpora.get_builder(config.data))
    theirs = builder_class._download_and_prepare  # writes the files into TFDS's incomplete folder

    def after_another_process(builder, *args, **kwargs):
        done = theirs(builder, *args, **kwargs)
        overrides = [
            f"--config.data.{k}={config.data[k]}" for k in ("tfds_data_dir", "num_train", "num_validation", "num_test")
        ]
        other = subprocess.run(
            [sys.executable, "-m", "fxformer.data", "--config=configs/default.py", *overrides],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
        )
        assert other.returncode == 0, other.stderr[-2000:]
        return done  # then TFDS renames the incomplete folder onto the other's

    monkeypatch.setattr(builder_class, "_download_and_prepare", after_another_process)
    said = []
    builder = corpora.prepare(config.data, log=said.append)
    assert "another process prepared the same dataset meanwhile" in " ".join(said)
    assert len(corpora.data_source(builder, "train")) == 200
