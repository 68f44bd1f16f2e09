"""Importing fxformer changes nothing in the process: no error hooks, warning filters, log filters,
writer registrations or progress-bar settings until a command runs `cli.setup_process`."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import asyncio, importlib, logging, pkgutil, sys, warnings
from tensorboardX import record_writer
from tensorflow_datasets.core.utils import tqdm_utils

def state():
    return {
        "sys.excepthook": sys.excepthook,
        "sys.unraisablehook": sys.unraisablehook,
        "warnings.filters": list(warnings.filters),
        "asyncio logger filters": list(logging.getLogger("asyncio").filters),
        "tensorboardX writer factories": dict(record_writer.REGISTERED_FACTORIES),
        "TFDS progress bars": tqdm_utils._active,
    }

import fxformer
names = sorted(m.name for m in pkgutil.walk_packages(fxformer.__path__, "fxformer."))
before = state()
changed = []
for name in names:
    importlib.import_module(name)
    after = state()
    changed += [f"{name}: {key}" for key in before if after[key] != before[key]]
    before = after
print(len(names), "modules")
print("\\n".join(changed) or "nothing changed")

from fxformer import cli
cli.setup_process()
after = state()
print("set-up:", ", ".join(key for key in before if after[key] != before[key]))
"""


def test_importing_every_module_changes_no_global_state():
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert int(lines[0].split()[0]) >= 20, lines  # every module was imported
    assert lines[1] == "nothing changed", lines
    # and the commands' set-up does change each of them (the probe can see a change)
    for key in ("sys.excepthook", "sys.unraisablehook", "warnings.filters", "asyncio logger filters"):
        assert key in lines[2], lines


def test_the_library_imports_nothing_from_configs_or_experiments():
    """Arrows point down only: configs/ and experiments/ import fxformer, never the reverse."""
    import ast

    offenders = []
    for path in sorted((REPO / "fxformer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            upward = [n for n in names if n.split(".")[0] in ("configs", "experiments")]
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in upward]
    assert offenders == []


def test_the_suite_compiles_fast_only_with_xla_flags_this_jaxlib_knows():
    """An unknown XLA flag ends a process silently under pytest's capture: conftest tries its
    compile flags in a child first and keeps them only where the child started."""
    from conftest import FAST_COMPILE, xla_knows

    assert not xla_knows("--xla_no_such_flag_anywhere=1")
    assert os.environ["FXFORMER_TEST_FAST_COMPILE"] == ("1" if xla_knows(FAST_COMPILE) else "0")


TENSORBOARDX_PROBE = """
import importlib.util, sys
from fxformer import metrics
metrics.register_url_writers()  # what a training process does before its first event file
print("tensorboardX" in sys.modules, "torch" in sys.modules)
if importlib.util.find_spec("torch") is not None:  # installed (the interop extra): still importable after
    import torch
    print(float(torch.ones(3).sum()))
"""


def test_tensorboardx_is_imported_without_torch_which_stays_importable():
    """tensorboardX imports torch where it is installed (2 s in every training process on a 2-core
    CPU); fxformer hides it during that import, and a later `import torch` works as usual."""
    result = subprocess.run([sys.executable, "-c", TENSORBOARDX_PROBE], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "True False", lines
    assert lines[1:] in ([], ["3.0"]), lines
