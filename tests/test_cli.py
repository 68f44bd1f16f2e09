"""Config loading and overrides, through the real command line."""

import subprocess
import sys

import pytest
from conftest import left_as_is

from fxformer import configfile
from fxformer.errors import UserError


def run(*args):
    return subprocess.run([sys.executable, "-m", "fxformer.params", *args], capture_output=True, text=True)


def test_wrong_config_key_is_one_sentence_without_traceback():
    result = run("--config=configs/table3.py:B1", "--config.model.num_head=4")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: Unknown config key 'model.num_head' (did you mean 'model.num_heads'?)."
    ]


@pytest.mark.slow  # counts the base model
def test_override_changes_the_count():
    base = run("--config=configs/table3.py:base")
    wider = run("--config=configs/table3.py:base", "--config.model.d_ff=4096")
    c7 = run("--config=configs/table3.py:C7")
    assert base.returncode == wider.returncode == 0
    assert wider.stdout.split(": ")[1] == c7.stdout.split(": ")[1] != base.stdout.split(": ")[1]


@pytest.mark.parametrize(
    "key, raw, message",
    [
        ("model.num_heads", "four", "takes an integer"),
        ("model.dropout_rate", "high", "takes a number"),
        ("model.attention_bias", "maybe", "takes true or false"),
        ("model", "3", "is a section"),
    ],
)
def test_wrong_types_are_refused(key, raw, message):
    config = configfile.load_config("configs/base.py")
    with pytest.raises(UserError, match=message):
        configfile.apply_override(config, key, raw)


def test_overrides_are_typed():
    config = configfile.load_config("configs/table3.py:E")
    configfile.apply_override(config, "model.dropout_rate", "1")
    configfile.apply_override(config, "model.attention_bias", "true")
    configfile.apply_override(config, "model.dtype", "bfloat16")
    assert config.model.dropout_rate == 1.0 and isinstance(config.model.dropout_rate, float)
    assert config.model.attention_bias is True
    assert config.model.dtype == "bfloat16" and config.model.positional == "learned"


def test_unknown_row_and_missing_file_are_refused():
    for args, message in (
        ("--config=configs/table3.py:Z", "Unknown Table 3 row 'Z'"),
        ("--config=configs/nope.py", "does not exist"),
    ):
        result = run(args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_small_parameter_counts_keep_three_significant_figures():
    from fxformer.params import millions

    assert [millions(n) for n in (34_304, 411_904, 9_990_000, 63_021_568)] == ["0.0343M", "0.412M", "9.99M", "63.0M"]


@pytest.mark.slow
def test_translate_refuses_a_negative_batch_size_before_restoring(tmp_path):
    with left_as_is(tmp_path):
        result = subprocess.run(
            [sys.executable, "-m", "fxformer.translate", f"--workdir={tmp_path}", "--batch_size=-4"],
            input="a line\n",
            capture_output=True,
            text=True,
        )
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --batch_size must be a number of sentences (0: the config's), not -4."
