"""The small-corpus route (configs/multi30k.py) end to end, on a made-up corpus in Multi30k's file
names and layout: prepare, train a few steps, evaluate on test2016 with the chosen decoding. No
real data is read or downloaded."""

import gzip
import json
import subprocess
import sys

import pytest
from conftest import env_with_devices

from fxformer import configfile, exitcodes

NOUNS = ["dog", "man", "woman", "child", "ball", "street", "boat", "horse"]
NOMEN = ["Hund", "Mann", "Frau", "Kind", "Ball", "Straße", "Boot", "Pferd"]
VERBS = [("runs", "läuft"), ("sits", "sitzt"), ("plays", "spielt"), ("waits", "wartet")]


def made_up_pairs(n: int, offset: int) -> list[tuple[str, str]]:
    """Image-description-like pairs, cased and punctuated like Multi30k's raw files."""
    pairs = []
    for i in range(offset, offset + n):
        a, b, (en, de) = i % len(NOUNS), (i // 3) % len(NOUNS), VERBS[i % len(VERBS)]
        pairs.append((f"A {NOUNS[a]} {en} near the {NOUNS[b]}.", f"Ein {NOMEN[a]} {de} nahe {NOMEN[b]}."))
    return pairs


@pytest.fixture(scope="module")
def multi30k_folder(tmp_path_factory):
    """<folder>/task1/raw/{train,val,test_2016_flickr}.{en,de}.gz, as the multi30k/dataset repository has them."""
    folder = tmp_path_factory.mktemp("multi30k")
    raw = folder / "task1" / "raw"
    raw.mkdir(parents=True)
    for stem, n, offset in (("train", 400, 0), ("val", 24, 400), ("test_2016_flickr", 20, 424)):
        pairs = made_up_pairs(n, offset)
        for index, lang in enumerate(("en", "de")):
            with gzip.open(raw / f"{stem}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.writelines(pair[index] + "\n" for pair in pairs)
    return folder


def test_the_config_finds_the_files_under_the_folder_and_names_a_missing_one(multi30k_folder, tmp_path):
    for arg in (multi30k_folder, multi30k_folder / "task1" / "raw"):
        config = configfile.load_config(f"configs/multi30k.py:{arg}")
        assert config.data.dataset == "text"
        assert config.data.test_target_file == str(multi30k_folder / "task1" / "raw" / "test_2016_flickr.de.gz")
        assert config.data.validation_source_file.endswith("/val.en.gz")
    with pytest.raises(configfile.UserError, match="No Multi30k files under"):
        configfile.load_config(f"configs/multi30k.py:{tmp_path}")


TINY = [
    "--config.model.num_layers=1",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_heads=2",
    "--config.data.vocab_size=120",
    "--config.data.tokens_per_batch=512",
    "--config.num_train_steps=6",
    "--config.checkpoint_every_steps=3",
    "--config.eval_every_steps=3",
    "--config.dev_bleu_every_steps=6",
    "--config.log_every_steps=3",
    "--config.warmup_steps=3",
    "--config.decode.max_extra=8",
]


@pytest.mark.slow
def test_prepare_train_and_evaluate_on_test2016(multi30k_folder, tmp_path):
    config = f"--config=configs/multi30k.py:{multi30k_folder}"
    data_dir = f"--config.data.tfds_data_dir={tmp_path / 'tfds'}"
    run = lambda *argv: subprocess.run(
        [sys.executable, "-m", *argv], env=env_with_devices(1, as_users=True), capture_output=True, text=True
    )
    prepared = run("fxformer.data", config, data_dir, *TINY)
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    assert "| train | 400 |" in prepared.stdout and "| test | 20 |" in prepared.stdout
    workdir = tmp_path / "w"
    trained = run("fxformer.train", config, data_dir, f"--workdir={workdir}", *TINY)
    assert trained.returncode == exitcodes.OK, trained.stderr[-2000:]
    dev = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [d["step"] for d in dev if "dev_bleu" in d] == [6]  # dev BLEU on val during training
    assert (workdir / "best").exists()  # the best by dev BLEU, the recipe's best_metric
    evaluated = run(
        "fxformer.evaluate",
        f"--workdir={workdir}",
        "--split=test",
        "--average_last=2",
        "--config.decode.beam_size=2",
        "--config.decode.alpha=1.0",
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    result = json.loads((workdir / "eval" / "test-6-avg2-alpha=1.0-beam_size=2.json").read_text())
    assert result["checkpoint_steps"] == [3, 6] and result["num_sentences"] == 20
    assert result["decode"]["beam_size"] == 2 and result["decode"]["alpha"] == 1.0
    assert 0 <= result["bleu"] <= result["bleu_lc"] <= 100  # lowercasing can only match more
    references = (workdir / "eval" / "test-6-avg2-alpha=1.0-beam_size=2.ref.txt").read_text()
    expected = gzip.open(multi30k_folder / "task1" / "raw" / "test_2016_flickr.de.gz", "rt").read()
    assert references == expected  # the written references are the test file, byte for byte
