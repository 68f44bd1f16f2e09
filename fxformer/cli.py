"""Command-line plumbing shared by every fxformer command (the entry points import it, and
`inferflags`, the flags of the inference commands; nothing else does).

`--config=configs/x.py[:arg]` and `--config.a.b=value` overrides (read by `configfile`); an
unknown key or a value of the wrong type is refused with one sentence, and so is any other
`UserError`: no traceback for mistakes a user can fix.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence

import ml_collections
from absl import logging as absl_logging

from fxformer import compilecache, configfile, exitcodes, paths
from fxformer.errors import UserError


def parser(description: str, module: str, config: bool = True, compiles: bool = True) -> argparse.ArgumentParser:
    """An ArgumentParser for `python -m <module>` that takes `--config=file[:arg]` and `--config.key=value`
    (`config`), and `--compilation_cache` (`compiles`: a command that compiles JAX programs)."""
    typed = os.path.basename(sys.argv[0])  # an installed command (fxformer-train) or `python -m`'s path
    p = argparse.ArgumentParser(
        prog=typed if typed.startswith("fxformer-") else f"python -m {module}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Override any config field with --config.<key>=<value>, e.g. --config.model.num_heads=16."
        if config
        else None,
    )
    if config:
        p.add_argument("--config", help="config file and optional argument: configs/table3.py:B1")
    if compiles:
        compilecache.add_flag(p)
    return p


def parse(
    p: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> tuple[argparse.Namespace, ml_collections.ConfigDict | None]:
    """Parse flags; turn the compilation cache on (`compilecache`); load the config and apply its
    overrides in command-line order (`configfile`)."""
    args, rest = p.parse_known_args(argv)
    if hasattr(args, "compilation_cache"):
        compilecache.enable(args.compilation_cache)
    overrides = configfile.overrides(rest)
    config = None
    if getattr(args, "config", None):
        config = configfile.resolve(args.config, overrides)
    elif overrides:
        raise UserError("Overrides --config.<key>=<value> need a --config file.")
    return args, config


def workdir(flag: str) -> paths.Workdir:
    """--workdir, refused in one sentence if it is a file or lies under one, as the `Workdir` the
    command passes on (converted here once)."""
    run = paths.Workdir(flag)
    paths.check_workdir(run)
    return run


def read_flag_file(flag: str, value: str) -> bytes:
    """The bytes of the file that `--flag=value` names (a local path or a URL), or one sentence why not."""
    try:
        return paths.as_path(value).read_bytes()
    except OSError as e:
        raise UserError(f"Cannot read --{flag} '{value}': {e.strerror or e}.") from None


def log_to_stderr(*args, **kwargs) -> None:
    """Progress output for commands whose stdout is data."""
    print(*args, file=sys.stderr, **kwargs)


def setup_process() -> None:
    """What a command changes in its process, in one place (importing fxformer changes nothing):
    quiet logs of TFDS, TensorFlow and orbax, no TFDS progress bars, silence about what a failed
    background save leaves behind (fxformer reports it in one sentence), and what libraries write
    to the standard output kept out of the command's own (`keep_library_output_apart`)."""
    keep_library_output_apart()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    absl_logging.set_verbosity(absl_logging.ERROR)  # TFDS and orbax chatter; our own output is print()
    # orbax logs each background thread's failure with a traceback; fxformer reports a failed save itself
    absl_logging.get_absl_logger().addFilter(lambda record: "/orbax/" not in record.pathname)
    if "tensorflow_datasets" in sys.modules:  # a command that reads data (plot does not: no import for it)
        sys.modules["tensorflow_datasets"].disable_progress_bar()
    quiet_failed_saves()


def keep_library_output_apart() -> None:
    """The command's standard output holds what fxformer prints (`sys.stdout`) and nothing else:
    what native libraries write to file descriptor 1 goes to stderr instead, beside their other
    messages. On a CPU cluster, gloo writes its connection lines there from its own threads, cut
    into fragments by other writes ('... 3 peer ranks. Expected number of connected peer ranks is
    : 3'); they would land among the results, or the translations, of a multi-process command.
    Nothing changes where either stream is closed."""
    if sys.stdout is None or sys.stderr is None:
        return
    try:
        sys.stdout.flush()
        own = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError):  # closed descriptors, or a stream without one (a test's capture)
        return
    before = sys.stdout
    sys.stdout = open(own, "w", encoding=before.encoding, errors=before.errors)  # noqa: SIM115 - the process's
    sys.stdout.reconfigure(line_buffering=before.line_buffering)


# What marks an exception as raised by checkpoint I/O (orbax, and the TensorStore reads and
# writes under it, whose tasks may hold no orbax frame): fxformer reports those failures itself.
CHECKPOINT_IO = ("/orbax/", "tensorstore", "array_serialization")


def _quiet_checkpoint_leftovers(hook):
    """`hook` (sys.excepthook / sys.unraisablehook), silent about what orbax leaves behind when a
    save or a restore fails: write callbacks that land on an event loop already closed, and the
    read coroutines of a damaged checkpoint's other arrays, collected with their exception
    unretrieved ("Exception ignored in: <coroutine ...>", hundreds of lines of TensorStore specs,
    in some runs only); everything else is reported as before. fxformer names the failure itself."""

    def quiet(*args):
        error = args[1] if len(args) == 3 else getattr(args[0], "exc_value", None)
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        if len(args) == 1 and _raised_in_checkpoint_io(getattr(args[0], "exc_traceback", None)):
            return
        hook(*args)

    return quiet


def _raised_in_checkpoint_io(tb) -> bool:
    return tb is not None and any(
        mark in frame.filename for frame in traceback.extract_tb(tb) for mark in CHECKPOINT_IO
    )


# What a TensorStore error of a checkpoint write names when its future carries no traceback
# (it is set from C++): the OCDBT store and the temporary directory of a save in progress.
CHECKPOINT_WRITE = ("OCDBT database", ".orbax-checkpoint-tmp")


# orbax's coroutines that a failed save or restore leaves unawaited (their "coroutine ... was never
# awaited" RuntimeWarning, at exit): a write's serialization, a damaged checkpoint's array metadata.
ORBAX_COROUTINES = ("async_serialize", "Store._get_array_metadatas")


# asyncio logs orbax's failed background writes when their tasks are collected; `check` and
# `wait` report the failed save itself, in one sentence.
def _orbax_write_left_behind(record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if "exception was never retrieved" not in text:
        return False
    if record.exc_info and record.exc_info[2] is not None:
        text += "".join(traceback.format_tb(record.exc_info[2]))
    return any(mark in text for mark in CHECKPOINT_IO + CHECKPOINT_WRITE)


def quiet_failed_saves() -> None:
    """Silence what a failed background save or a damaged checkpoint's restore leaves behind
    (closed event loops, orbax's never-awaited coroutines, asyncio's "never retrieved"): fxformer
    reports the failure in one sentence. Part of `setup_process`."""
    sys.excepthook = _quiet_checkpoint_leftovers(sys.excepthook)
    sys.unraisablehook = _quiet_checkpoint_leftovers(sys.unraisablehook)
    names = "|".join(map(re.escape, ORBAX_COROUTINES))
    warnings.filterwarnings("ignore", f"coroutine '({names}).*' was never awaited", RuntimeWarning)
    logging.getLogger("asyncio").addFilter(_keep_asyncio_record)


def _keep_asyncio_record(record: logging.LogRecord) -> bool:
    return not _orbax_write_left_behind(record)


def run(main: Callable[[], int | None]) -> None:
    """Run a command's main after `setup_process`; a UserError becomes one line on stderr and exit
    status 2 (`exitcodes`), or the `status` it carries."""
    setup_process()
    try:
        sys.exit(main() or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(getattr(e, "status", exitcodes.USER_ERROR))  # a refusal may name its own (lifecycle.WorkdirRemoved)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as e:
        from fxformer.paths import unwritable

        if unwritable(e) is None:
            raise
        print(
            f"error: cannot write {e.filename or 'a file'} ({unwritable(e)}); free space there or make it "
            "writable (or choose another --workdir), then run the same command again.",
            file=sys.stderr,
        )
        sys.exit(exitcodes.USER_ERROR)
