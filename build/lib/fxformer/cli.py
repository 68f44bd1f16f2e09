"""Command-line plumbing shared by every fxformer command (the entry points import it; nothing else does).

`--config=configs/x.py[:arg]` and `--config.a.b=value` overrides (read by `configfile`); an
unknown key or a value of the wrong type is refused with one sentence, and so is any other
`UserError`: no traceback for mistakes a user can fix.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import ml_collections
from absl import logging as absl_logging

from fxformer import configfile, exitcodes
from fxformer.errors import UserError


def parser(description: str, module: str, config: bool = True) -> argparse.ArgumentParser:
    """An ArgumentParser for `python -m <module>` that takes `--config=file[:arg]` and `--config.key=value`."""
    p = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Override any config field with --config.<key>=<value>, e.g. --config.model.num_heads=16."
        if config
        else None,
    )
    if config:
        p.add_argument("--config", help="config file and optional argument: configs/table3.py:B1")
    return p


def parse(
    p: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> tuple[argparse.Namespace, ml_collections.ConfigDict | None]:
    """Parse flags; load the config and apply its overrides in command-line order (`configfile`)."""
    args, rest = p.parse_known_args(argv)
    overrides = configfile.overrides(rest)
    config = None
    if getattr(args, "config", None):
        config = configfile.resolve(args.config, overrides)
    elif overrides:
        raise UserError("Overrides --config.<key>=<value> need a --config file.")
    return args, config


def log_to_stderr(*args, **kwargs) -> None:
    """Progress output for commands whose stdout is data."""
    print(*args, file=sys.stderr, **kwargs)


def run(main: Callable[[], int | None]) -> None:
    """Run a command's main; a UserError becomes one line on stderr and exit status 2 (`exitcodes`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    absl_logging.set_verbosity(absl_logging.ERROR)  # TFDS and orbax chatter; our own output is print()
    # orbax logs each background thread's failure with a traceback; fxformer reports a failed save itself
    absl_logging.get_absl_logger().addFilter(lambda record: "/orbax/" not in record.pathname)
    try:
        sys.exit(main() or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(exitcodes.USER_ERROR)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as e:
        from fxformer.paths import unwritable  # paths imports this module

        if unwritable(e) is None:
            raise
        print(
            f"error: cannot write {e.filename or 'a file'} ({unwritable(e)}); free space there or make it "
            "writable (or choose another --workdir), then run the same command again.",
            file=sys.stderr,
        )
        sys.exit(exitcodes.USER_ERROR)
