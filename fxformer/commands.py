"""The installed console commands (`pip install .` puts them on the PATH): each runs its module's
`main` under `cli.run`, as `python -m <module>` does, so that a refusal is one sentence, not a
traceback. The module is imported when its command runs, not when another one does."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from fxformer import cli


def _command(module: str) -> Callable[[], None]:
    def command() -> None:
        cli.run(importlib.import_module(module).main)

    command.__doc__ = f"`python -m {module}`, as an installed command."
    command.module = module  # what it runs (the docs' checker reads it)
    return command


train = _command("fxformer.train")
evaluate = _command("fxformer.evaluate")
translate = _command("fxformer.translate")
attention_maps = _command("fxformer.attention_maps")
data = _command("fxformer.data.__main__")
plot = _command("fxformer.plot")
params = _command("fxformer.params")
bench = _command("fxformer.bench")
profile = _command("fxformer.profile")
compare = _command("fxformer.compare")
import_marian = _command("fxformer.importing")
export = _command("fxformer.export")
