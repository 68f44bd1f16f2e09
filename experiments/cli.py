"""The small helpers both halves of experiments/ share: the launcher's messages, programs on PATH,
flags, durations, the code's commit, and the project's JSON files read with one sentence when
damaged. Imports nothing of fxformer's but its error type and duration format, and no JAX."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

from fxformer.errors import UserError
from fxformer.timefmt import duration  # noqa: F401  (the launcher's durations come from here)


def say(message: str) -> None:
    """The launcher's own messages, on stderr, marked as such."""
    print(f"[launch] {message}", file=sys.stderr, flush=True)


def which(program: str) -> str:
    """The path of `program`, or a one-sentence error naming what to install."""
    path = shutil.which(program)
    if path is None:
        raise UserError(f"'{program}' is not on PATH; install it on this machine (or use --dry-run).")
    return path


def flag_value(flags: list[str], name: str) -> str | None:
    """The value of `--name=v` or `--name v` in `flags` (the last one given), else None."""
    value = None
    for i, flag in enumerate(flags):
        if flag.startswith(f"--{name}="):
            value = flag.split("=", 1)[1]
        elif flag == f"--{name}" and i + 1 < len(flags):
            value = flags[i + 1]
    return value


def split_at_dashes(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our flags, the flags after `--` that belong to the fxformer command)."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def commit(rev: str = "HEAD") -> tuple[str, bool] | None:
    """(the full hash of `rev`, whether tracked files have uncommitted changes), or None outside
    a git checkout or for a name that is no commit."""
    out = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True)
    if out.returncode:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return out.stdout.strip(), bool(dirty.stdout.strip())


def commit_label() -> str:
    """The code's commit as a sweep records it: 12 hex digits, '-dirty' for uncommitted changes; '' outside git."""
    found = commit()
    if found is None:
        return ""
    sha, dirty = found
    return sha[:12] + ("-dirty" if dirty else "")


def read_json(path, what: str, fix: str):
    """A JSON file the project wrote, or one sentence naming it and what to do if it is damaged."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} ({what}) is damaged ({e.__class__.__name__}: {e}); {fix}.") from None


def verb_parser(verb: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The flags parser of `python -m experiments <verb>`, its description shown as written."""
    return argparse.ArgumentParser(
        prog=f"python -m experiments {verb}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
