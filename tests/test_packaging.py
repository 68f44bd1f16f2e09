"""`pip install .` gives working commands: every console command of pyproject.toml resolves to a
callable, one runs with `--help` as its console script would, the dependencies are
requirements.txt's, and the installed distribution holds the `fxformer` package alone, which
still loads the checkout's configs by path from anywhere.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_sweep import TABLE3_ROWS  # the paper's rows, in its order

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PROJECT["project"]["scripts"]
TEST_ONLY = {"pytest", "pytest-xdist", "psutil", "ruff"}  # requirements.txt's test and lint tools


def requirement_lines(text: str) -> list[str]:
    """The requirements of a requirements file, comments and blank lines dropped."""
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def name_of(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_console_command_resolves_to_a_callable():
    assert {"fxformer-train", "fxformer-evaluate", "fxformer-translate", "fxformer-data"} <= SCRIPTS.keys()
    for name, target in SCRIPTS.items():
        module, _, attribute = target.partition(":")
        assert module.split(".")[0] == "fxformer", f"{name}: {target} is outside the installed package"
        command = getattr(importlib.import_module(module), attribute)
        assert callable(command), f"{name}: {target}"
        assert callable(importlib.import_module(command.module).main), f"{name}: {command.module} has no main"


def console(name: str, *args: str, cwd: Path, env=None) -> subprocess.CompletedProcess:
    """What pip's console script does (`sys.exit(target())` with argv[0] its name), from outside the
    checkout, in `env(cwd)`'s environment (default `installed_env`)."""
    module, _, attribute = SCRIPTS[name].partition(":")
    script = f"import sys; sys.argv[0] = {name!r}; from {module} import {attribute}; sys.exit({attribute}())"
    return subprocess.run(
        [sys.executable, "-c", script, *args], cwd=cwd, env=(env or installed_env)(cwd), capture_output=True, text=True
    )


def test_a_console_command_runs_with_help_as_its_script_would(tmp_path):
    result = console("fxformer-train", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--workdir" in result.stdout and "--config" in result.stdout
    assert result.stdout.startswith("usage: fxformer-train ")  # the help names the command that was typed


def test_an_installed_command_refuses_bad_input_in_one_sentence(tmp_path):
    """The console script runs `main` under `cli.run`: a mistake a user can fix is one line, no traceback."""
    result = console("fxformer-train", "--config=no-such-config.py", f"--workdir={tmp_path / 'w'}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "no-such-config.py" in errors[0], result.stderr[-2000:]


def installed_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose sys.path holds the fxformer package alone, as an installed one would
    (no checkout on the path, so `configs` and `experiments` are not importable)."""
    import os

    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    if not (site / "fxformer").exists():
        (site / "fxformer").symlink_to(REPO / "fxformer")
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}


def test_an_installed_command_loads_a_config_of_the_checkout_by_path(tmp_path):
    """configs/table3.py imports `from configs import base`: the loader finds it beside the file."""
    probe = "import configs"
    hidden = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=installed_env(tmp_path))
    assert hidden.returncode != 0  # the probe's path holds fxformer alone
    script = (
        "import sys; from fxformer import configfile; "
        f"config = configfile.resolve({str(REPO / 'configs' / 'table3.py')!r} + ':B1,mini', [('seed', '3')]); "
        "print(config.model.d_k, config.seed)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=installed_env(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["2", "3"]  # B1: the paper's d_k 16 at 1/8 width; the override applied


def test_the_dependencies_are_the_requirements_and_the_test_tools_an_extra():
    required = requirement_lines((REPO / "requirements.txt").read_text())
    declared = PROJECT["project"]["dependencies"]
    extra = PROJECT["project"]["optional-dependencies"]["test"]
    for wanted, have, where in (
        ([r for r in required if name_of(r) not in TEST_ONLY], declared, "[project] dependencies"),
        ([r for r in required if name_of(r) in TEST_ONLY], extra, "[project.optional-dependencies] test"),
    ):
        missing, extra_lines = sorted(set(wanted) - set(have)), sorted(set(have) - set(wanted))
        assert not missing and not extra_lines, (
            f"pyproject.toml's {where} differ from requirements.txt: add {missing}, remove {extra_lines}"
        )


def test_the_distribution_holds_the_fxformer_package_alone():
    """configs/ and experiments/ are a checkout's files; installed, they would take generic top-level names."""
    found = PROJECT["tool"]["setuptools"]["packages"]["find"]
    assert found["include"] == ["fxformer", "fxformer.*"]


def test_docs_install_lists_every_console_command():
    listed = set(re.findall(r"^\| `(fxformer-[a-z-]+)` \|", (REPO / "docs" / "install.md").read_text(), re.M))
    assert listed == SCRIPTS.keys()


def copied_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose sys.path holds a copy of the fxformer package alone, as `pip install .`
    leaves it in site-packages: no checkout beside it (the symlinked one of `installed_env` resolves
    back into the checkout)."""
    import os
    import shutil

    site = tmp_path / "copied"
    if not (site / "fxformer").exists():
        shutil.copytree(REPO / "fxformer", site / "fxformer", ignore=shutil.ignore_patterns("__pycache__"))
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}


def installed(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A console command of a copied (installed) package, run from `cwd` outside the checkout."""
    return console(name, *args, cwd=cwd, env=copied_env)


def one_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-2000:]
    return errors[0]


def test_installed_params_table3_names_the_checkouts_rows_file_or_prints_the_table(tmp_path):
    refused = one_error(installed("fxformer-params", "--table3", cwd=tmp_path))
    assert "--table3=/path/to/fxformer/configs/table3.py" in refused
    table = installed("fxformer-params", f"--table3={REPO / 'configs' / 'table3.py'}", cwd=tmp_path)
    assert table.returncode == 0, table.stderr[-2000:]
    rows = [line.split("|")[1].strip() for line in table.stdout.splitlines() if line.startswith("| ")][1:]
    assert rows == TABLE3_ROWS


def test_a_config_path_that_does_not_exist_says_where_configs_live(tmp_path):
    installed_error = one_error(
        installed("fxformer-train", "--config=configs/default.py", f"--workdir={tmp_path / 'w'}", cwd=tmp_path)
    )
    assert "files of a checkout of fxformer" in installed_error and str(tmp_path) in installed_error
    in_checkout = one_error(console("fxformer-train", "--config=configs/default.py", "--workdir=w", cwd=tmp_path))
    assert f"--config={REPO / 'configs' / 'default.py'}" in in_checkout
