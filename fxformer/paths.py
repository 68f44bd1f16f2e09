"""Paths that stay URLs, and the one place that knows a workdir's layout.

Every path that comes from a flag or a config goes through `as_path`, an `etils.epath.Path`:
a local path works as with `pathlib`, and `gs://bucket/runs/base` stays a URL all the way to
orbax, TFDS, TensorBoard and fxformer's own writers (a `pathlib.Path` would turn it into a
local folder named `gs:` on every host). This module imports no JAX.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import socket

from etils import epath

from fxformer.errors import UserError

PathLike = str | os.PathLike


def is_url(path: PathLike) -> bool:
    """True for `gs://...`, `s3://...` and other object-store URLs."""
    return "://" in os.fspath(path)


def as_path(path: PathLike) -> epath.Path:
    """A path from a flag or a config: `~` expanded for local paths, URLs kept as they are."""
    text = os.fspath(path)
    return epath.Path(text if is_url(text) else os.path.expanduser(text))


def absolute(path: PathLike) -> epath.Path:
    """`path` made absolute if local (orbax wants absolute directories); a URL unchanged."""
    path = as_path(path)
    return path if is_url(path) else epath.Path(os.path.abspath(path))


def write_atomic(path: PathLike, data: str | bytes) -> None:
    """Replace a file's content in one piece, so that a reader or a kill never sees half of it.

    A local file is written beside it and renamed over it; an object in a store (which
    cannot append or rename cheaply) is replaced whole by a single upload.
    """
    path = as_path(path)
    mode = "wb" if isinstance(data, bytes) else "w"
    if is_url(path):
        with path.open(mode) as f:
            f.write(data)
        return
    tmp = path.parent / f".{path.name}.tmp"
    try:
        with tmp.open(mode) as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise


# Why a write failed, for the errors a user fixes outside fxformer (errno -> words).
UNWRITABLE = {
    errno.ENOSPC: "no space left on the disk",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file size limit is reached",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def unwritable(error: BaseException) -> str | None:
    """Words for an OSError a user fixes by freeing space or changing permissions (else None)."""
    return UNWRITABLE.get(error.errno) if isinstance(error, OSError) else None


def check_writable(directory: PathLike, why: str) -> None:
    """Refuse, in one sentence and before any work, a local directory this process cannot write
    (read-only, full, not permitted): a probe file is created, flushed to the disk and removed,
    and so are the directories made for it. `why` says what would be written there."""
    if is_url(directory):
        return  # an object store answers on the first real write
    path = as_path(directory)
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    probe = path / f".fxformer-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        write_probe(path, probe)
    except OSError as e:
        reason = unwritable(e) or e.strerror or type(e).__name__
        raise UserError(
            f"Cannot write to {directory} ({reason}), where {why}; free space there, "
            "make it writable, or choose another directory."
        ) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        for created in made:  # one that is not empty (another process's probe or run) stays
            with contextlib.suppress(OSError):
                os.rmdir(str(created))


def write_probe(path: epath.Path, probe: epath.Path, tries: int = 5) -> None:
    """Make `path` and write `probe` in it, flushed to the disk. The processes of one launch probe
    the same new workdir at once: another one's clean-up can remove the directory between this
    one's mkdir and its write (or between the two mkdirs of parents=True), so a directory that
    vanishes or appears in between is made again."""
    for attempt in range(tries):
        try:
            path.mkdir(parents=True, exist_ok=True)
            with open(probe, "wb") as f:
                f.write(b"\0" * 65536)  # a few blocks: a disk with a few bytes left is full for a checkpoint
                f.flush()
                os.fsync(f.fileno())
            return
        except (FileNotFoundError, FileExistsError):
            if attempt == tries - 1:
                raise


def split_lines(data: bytes, where: str) -> list[str]:
    """UTF-8 text -> its lines, split on newlines only (CRLF too; a form feed or a Unicode line
    separator stays inside its line), without a final empty line; `where` names it in errors."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{where} is not UTF-8 text (line {line}); convert it, e.g. with iconv -t UTF-8.") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def check_workdir(workdir: Workdir) -> None:
    """Refuse, in one sentence, a workdir that is a file or lies under one (once per command, as
    its --workdir flag becomes a `Workdir`: `fxformer.cli.workdir`)."""
    path = workdir.root
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                what = "is a file" if candidate == path else f"lies under the file {candidate}"
                raise UserError(f"The workdir {workdir} {what}; give a directory as --workdir.")
            return


COMMIT_FILE = "commit_success.txt"  # orbax's mark of a finished save where it cannot rename (GCS)


def complete_steps(directory: epath.Path) -> list[int]:
    """The steps of an orbax directory whose saves finished: on a local disk an unfinished one is
    still named `<step>.orbax-checkpoint-tmp...`; on GCS orbax writes `<step>/` in place and marks
    it finished with `commit_success.txt`. [] if the directory is absent."""
    if not directory.exists():
        return []
    steps = [p for p in directory.iterdir() if p.name.isdigit()]
    if str(directory).startswith("gs://"):
        steps = [p for p in steps if (p / COMMIT_FILE).exists()]
    return sorted(int(p.name) for p in steps)


def checkpoint_label(steps: list[int], best: bool = False) -> str:
    """How a result names the parameters it came from: the last step, `-avg<k>` for an average of
    k checkpoints, `-best` for the best by dev metric (`600`, `600-avg5`, `600-best`)."""
    return f"{steps[-1]}" + (f"-avg{len(steps)}" if len(steps) > 1 else "") + ("-best" if best else "")


def eval_result(folder, name: str, label: str, first: int = 0, decode: dict | None = None) -> epath.Path:
    """`<folder>/<name>-<label>[-<field>=<value>...][-first<n>].json`: where an evaluation of the test
    set `name` (a split, or a source file's name) by the parameters `label` names (`checkpoint_label`,
    or `imported`) is written, with the decode fields that differ from the run's (`alpha=1.5`)."""
    searched = "".join(f"-{key}={value}" for key, value in (decode or {}).items())
    return as_path(folder) / (f"{name}-{label}{searched}" + (f"-first{first}" if first else "") + ".json")


@dataclasses.dataclass(frozen=True)
class Workdir:
    """A run directory: `W/config.json`, `W/tokenizer.model`, `W/checkpoints/<step>`,
    `W/averaged/last<k>/<step>`, `W/eval/`, `W/metrics.jsonl`, `W/tensorboard/`, and
    `W/sweep.json` when a sweep runs it (experiments/rowstate.py)."""

    root: epath.Path  # absolute (a URL as given): every part of it goes to orbax as it is

    def __init__(self, root: PathLike):
        object.__setattr__(self, "root", absolute(root))

    def __str__(self) -> str:
        return os.fspath(self.root)

    def __fspath__(self) -> str:
        return os.fspath(self.root)

    @property
    def config(self) -> epath.Path:
        """The resolved config the run trains with (JSON)."""
        return self.root / "config.json"

    @property
    def config_history(self) -> epath.Path:
        """What resumes changed in config.json: one JSON line each, {step, time, changed: {key: [old, new]}}."""
        return self.root / "config-history.jsonl"

    @property
    def tokenizer(self) -> epath.Path:
        """The run's copy of the sentencepiece model."""
        return self.root / "tokenizer.model"

    @property
    def marian(self) -> epath.Path:
        """A run fine-tuning a Marian model: its tokenizer files (config.json, source.spm,
        target.spm, vocab.json), instead of tokenizer.model (`fxformer.importing`)."""
        return self.root / "marian"

    @property
    def imported(self) -> epath.Path:
        """A run fine-tuning an imported model: the parameters its first step starts from."""
        return self.root / "imported"

    def keeps_marian_tokenizer(self) -> bool:
        """Whether the run's tokenizer is an imported Marian model's (in W/marian/)."""
        return (self.marian / "vocab.json").exists()

    def has_tokenizer(self) -> bool:
        """Whether the run keeps its tokenizer: tokenizer.model, or an imported model's files."""
        return self.tokenizer.exists() or self.keeps_marian_tokenizer()

    @property
    def checkpoints(self) -> epath.Path:
        """Training checkpoints, one orbax step directory each."""
        return self.root / "checkpoints"

    def averaged(self, k: int) -> epath.Path:
        """Parameters averaged over the last `k` checkpoints, one step directory per last step."""
        return self.root / "averaged" / f"last{k}"

    @property
    def best(self) -> epath.Path:
        """The parameters with the best dev metric so far (one step directory), apart from the last K."""
        return self.root / "best"

    @property
    def eval(self) -> epath.Path:
        """Evaluation results (JSON) and translations."""
        return self.root / "eval"

    def eval_result(
        self, split: str, steps: list[int], best: bool = False, first: int = 0, decode: dict | None = None
    ) -> epath.Path:
        """`W/eval/<split>-<checkpoint label>[-<field>=<value>...][-first<n>].json`: evaluate's results
        on a split (its translations beside it, `.hyp.txt` and `.ref.txt`); `decode`: the decode
        fields that differ from the trained run's (`alpha=1.5`), so that another search, or a
        partial run (the first n sentences), never overwrites the default full one."""
        return eval_result(self.eval, split, checkpoint_label(steps, best), first, decode)

    def checkpoint_steps(self) -> list[int]:
        """The training checkpoints whose saves finished."""
        return complete_steps(self.checkpoints)

    @property
    def metrics(self) -> epath.Path:
        """One JSON object per logged step."""
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> epath.Path:
        """TensorBoard event files."""
        return self.root / "tensorboard"

    @property
    def run_info(self) -> epath.Path:
        """Where and how the last training attempt ran: devices, processes, parameters, batch."""
        return self.root / "run.json"

    def removed(self) -> bool:
        """Whether the workdir of a running training was removed: every process of a run finds
        its tokenizer there before its first step and never writes it again, so a workdir that
        lacks it was removed under the run (what is there now, the run's own later writes recreated)."""
        return not self.has_tokenizer()

    @property
    def sweep_status(self) -> epath.Path:
        """A sweep's record of this run: attempts, its config, who runs it now (a lease)."""
        return self.root / "sweep.json"
