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

import pytest
from conftest import env_with_devices

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
