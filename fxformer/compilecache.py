"""JAX's persistent compilation cache, on for every command: a program compiled once (a train
step, a beam search, the dev loss) is read back from disk by the next process that compiles it
with the same shapes, options, devices and jax version (a sweep row's next seed, `evaluate` after
`train`, every test process).

Where: `--compilation_cache=DIR` on any command; else `$FXFORMER_COMPILATION_CACHE`; else
`$JAX_COMPILATION_CACHE_DIR` (JAX's own variable); else the per-user folder
`$XDG_CACHE_HOME/fxformer/jax` (`~/.cache/fxformer/jax`). `off` turns it off.

The choices, in one place:
- A cache entry is an executable that JAX loads and runs, so the cache is trusted code: a folder
  that other users can write to (group or world writable, or owned by someone else) is refused
  in one sentence, and the default folder is made private (mode 700).
- Programs that compile in `MIN_COMPILE_S` (0.2 s) or more are kept, below JAX's default of 1 s:
  on a CPU most of a small model's programs (the dev loss, a decoder step, the tests' tiny models)
  compile in well under a second, and together they are most of a short command's start.
- At most `MAX_BYTES` (4 GiB) on disk: past it JAX evicts the least recently read entries (JAX
  keeps everything by default). Eviction takes a file lock (`filelock`) around every read and
  write, so that two sweep runs, or a test's processes, can share the folder at once.
- In a multi-process run only process 0 writes (JAX's rule: one writer per shared file system);
  every process reads.
- A miss costs the compile and nothing else: an entry JAX cannot load (some CPUs reject entries
  written by an earlier process, an open JAX issue) is compiled again and a warning names it.
- Clear it with `rm -r ~/.cache/fxformer/jax` (or the folder named); nothing else is kept there.
  The test suite keeps its own, `~/.cache/fxformer/jax-tests`, with other settings (every program,
  no size limit): JAX's size limit cannot evict entries written without it.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from fxformer.errors import UserError

MIN_COMPILE_S = 0.2
MAX_BYTES = 4 << 30
OFF = "off"
ENV = "FXFORMER_COMPILATION_CACHE"


def user_folder(name: str = "jax") -> str:
    """`$XDG_CACHE_HOME/fxformer/<name>`, else `~/.cache/fxformer/<name>`: this user's own."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fxformer", name)


def default_folder() -> str:
    """The folder the flag defaults to: `$FXFORMER_COMPILATION_CACHE`, `$JAX_COMPILATION_CACHE_DIR`,
    else the per-user cache folder (`user_folder()`)."""
    for name in (ENV, "JAX_COMPILATION_CACHE_DIR"):
        if os.environ.get(name):
            return os.environ[name]
    return user_folder()


def add_flag(p) -> None:
    """`--compilation_cache` on a command's parser."""
    p.add_argument(
        "--compilation_cache",
        default=None,
        help="JAX's persistent compilation cache: a private folder, or off (default: $FXFORMER_COMPILATION_CACHE, "
        "else ~/.cache/fxformer/jax); programs compiled once are read back by later runs",
    )


def checked_folder(where: str) -> Path:
    """`where` made (private) if absent, or refused in one sentence if others could write code into it."""
    if "://" in where:
        raise UserError(f"--compilation_cache={where}: give a local folder (or off); the cache is read on every start.")
    folder = Path(where).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"The compilation cache {folder} is not a folder; give another with --compilation_cache=DIR.")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError as e:
        raise UserError(
            f"Cannot use {folder} as the compilation cache ({e.strerror or e}); "
            "give another folder with --compilation_cache=DIR, or off."
        ) from None
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or info.st_uid != os.getuid():
        raise UserError(
            f"The compilation cache {folder} can be written by other users, and its entries are code this process "
            f"runs; make it private (chmod 700 {folder}), or give another folder with --compilation_cache=DIR."
        )
    return folder


def settings(where: str | None) -> dict[str, object]:
    """JAX's config values for the cache at `where` (None: the default folder; "off": none)."""
    where = default_folder() if where is None else where
    if where == OFF:
        return {"jax_enable_compilation_cache": False}
    return {
        "jax_enable_compilation_cache": True,
        "jax_compilation_cache_dir": str(checked_folder(where)),
        "jax_persistent_cache_min_compile_time_secs": MIN_COMPILE_S,
        "jax_compilation_cache_max_size": MAX_BYTES,
    }


def enable(where: str | None = None) -> dict[str, object]:
    """Turn the cache on at `where` for this process (or off), before its first compile; the
    settings made. Values set by the environment for the size and time thresholds are kept
    (the tests keep every program)."""
    values = settings(where)
    kept = {"jax_persistent_cache_min_compile_time_secs", "jax_compilation_cache_max_size"}
    values = {k: v for k, v in values.items() if not (k in kept and k.upper() in os.environ)}
    if "jax" in sys.modules:
        import jax

        for key, value in values.items():
            jax.config.update(key, value)
    else:  # read by jax when it is imported (a command that imports it later, or never)
        for key, value in values.items():
            os.environ[key.upper()] = str(value)
    return values


class Counts:
    """Hits and misses of the persistent cache in this process from now on (JAX's own events)."""

    def __init__(self):
        from jax import monitoring

        self.hits = self.misses = 0
        monitoring.register_event_listener(self._event)

    def _event(self, name: str, **_kwargs) -> None:
        if name == "/jax/compilation_cache/cache_hits":
            self.hits += 1
        elif name == "/jax/compilation_cache/cache_misses":
            self.misses += 1


def size(folder: str | Path) -> tuple[int, int]:
    """(entries, bytes) of the cache folder."""
    entries = [p for p in Path(folder).glob("*-cache") if p.is_file()]
    return len(entries), sum(p.stat().st_size for p in entries)
