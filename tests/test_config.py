"""Workdir configs written by older code still train, evaluate and translate.

tests/fixtures/config-issue21.json is the config.json a tiny run wrote before the config had one
home (issue 21); config-early.json is the same run as written before the `decode` section and
the fields added since (beam_size, alpha and max_decode_extra at top level; no
divergence_factor, train_minutes, best_metric, early_stopping_patience, dev BLEU, the text
dataset's separate files, model.attention_impl). Their `data.tfds_data_dir` is set to the
session's corpus by the test.
"""

import json
import subprocess
import sys
from pathlib import Path

import ml_collections
import pytest
from conftest import env_with_devices

from configs import base
from fxformer import config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LINES = "The dog sees the man.\nToday the woman buys a book.\n"


def run(module, *args, stdin=None):
    result = subprocess.run([sys.executable, "-m", module, *args], env=env_with_devices(1), capture_output=True,
                            text=True, input=stdin)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def workdir_from(fixture: str, tmp_path, data_dir) -> Path:
    """A workdir holding only the fixture's config.json, reading the session's corpus."""
    config = json.loads((FIXTURES / fixture).read_text())
    config["data"]["tfds_data_dir"] = str(data_dir)
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(config, indent=2))
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("fixture, beam_size", [("config-issue21.json", 4), ("config-early.json", 2)])
def test_a_config_written_by_older_code_trains_evaluates_and_translates(fixture, beam_size, tmp_path, data_dir, corpus):
    workdir = workdir_from(fixture, tmp_path, data_dir)
    trained = run("fxformer.train", f"--workdir={workdir}")  # the workdir's own config
    assert "step 4/4" in trained
    run("fxformer.evaluate", f"--workdir={workdir}", "--limit=8")
    written = json.loads((workdir / "eval" / "test-4-first8.json").read_text())
    assert written["decode"]["beam_size"] == beam_size
    out = run("fxformer.translate", f"--workdir={workdir}", "--config.decode.nbest=2", stdin=LINES)
    assert len(out.splitlines()) == 2 * 2


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_upgrade_fills_exactly_the_missing_fields_from_the_defaults_and_keeps_the_rest():
    early, defaults = fixture("config-early.json"), base.get_config().to_dict()
    upgraded = config.upgrade(ml_collections.ConfigDict(early)).to_dict()
    assert upgraded["decode"] == {**defaults["decode"], "beam_size": 2, "alpha": 0.6, "max_extra": 50}
    changes = config.config_changes(early, upgraded)
    added = {key: new for key, (old, new) in changes.items() if old is None}
    assert set(added) == {
        "decode", "dev_bleu_every_steps", "dev_bleu_sentences", "best_metric", "early_stopping_patience",
        "train_minutes", "divergence_factor", "model.attention_impl", "data.validation_source_file",
        "data.validation_target_file", "data.test_source_file", "data.test_target_file",
    }  # fmt: skip
    for key in set(added) - {"decode"}:  # the decode section: checked above
        section, _, leaf = key.rpartition(".")
        assert added[key] == (defaults[section] if section else defaults)[leaf], key
    moved = {key: old for key, (old, new) in changes.items() if new is None}
    assert moved == {"beam_size": 2, "alpha": 0.6, "max_decode_extra": 50}  # into the decode section
    assert set(changes) == set(added) | set(moved)  # every field it had keeps its value


def test_a_config_written_before_this_change_upgrades_to_itself():
    written = fixture("config-issue21.json")
    assert config.upgrade(ml_collections.ConfigDict(written)).to_dict() == written
