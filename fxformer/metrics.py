"""Where a run's numbers go: `W/metrics.jsonl`, TensorBoard event files (no TensorFlow), the console.

Both are written through `etils.epath`, so a `gs://` workdir works: object stores cannot
append, so each write replaces the whole (small) file, atomically.
"""

from __future__ import annotations

import io
import json
import math

from tensorboardX import SummaryWriter, record_writer

from fxformer import paths


class MetricWriter:
    """One JSON object per logged step in `metrics.jsonl`, and the same scalars for TensorBoard."""

    def __init__(self, workdir: paths.PathLike, resume_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        run = paths.Workdir(workdir)
        self.path = run.metrics
        self.lines: list[str] = []
        if not enabled:
            return
        if self.path.exists():  # a resumed run rewrites what came after its checkpoint
            self.lines = [line for line in self.path.read_text().splitlines() if _step(line) <= resume_step]
            paths.write_atomic(self.path, self._text())
        self.tensorboard = SummaryWriter(logdir=str(run.tensorboard), purge_step=resume_step + 1)

    def _text(self) -> str:
        return "".join(line + "\n" for line in self.lines)

    def last(self) -> dict:
        """The last line kept from before this attempt ({} for a new run, or on other processes)."""
        return json.loads(self.lines[-1]) if self.lines else {}

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        self.lines.append(json.dumps({"step": step, **scalars}))
        paths.write_atomic(self.path, self._text())
        for name, value in scalars.items():
            self.tensorboard.add_scalar(name, value, step)
        self.tensorboard.flush()

    def close(self) -> None:
        if self.enabled:
            self.tensorboard.close()


class _EpathEventFile:
    """A TensorBoard event file in an object store: kept in memory, uploaded whole at each flush."""

    def __init__(self, path: str):
        self.path, self.buffer = paths.as_path(path), io.BytesIO()

    def write(self, data: bytes) -> None:
        self.buffer.write(data)

    def flush(self) -> None:
        paths.write_atomic(self.path, self.buffer.getvalue())

    def close(self) -> None:
        self.flush()


class _EpathEventFiles:
    """tensorboardX's writer factory for URL schemes, routed through etils.epath (gcsfs, s3fs, ...)."""

    def open(self, path: str) -> _EpathEventFile:
        return _EpathEventFile(path)

    def directory_check(self, path: str) -> None:
        paths.as_path(path).mkdir(parents=True, exist_ok=True)


for _scheme in ("gs", "s3"):  # instead of tensorboardX's own clients, so every URL goes through one library
    record_writer.register_writer_factory(_scheme, _EpathEventFiles())


def _step(line: str) -> float:
    """The step of a metrics.jsonl line; a line cut short by a kill counts as after every step."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf


def per_token(sums: dict[str, float], prefix: str = "") -> dict[str, float]:
    """Sums of loss / nll / correct over tokens -> per-token loss, nll, perplexity, accuracy."""
    tokens = max(sums["tokens"], 1.0)
    nll = sums["nll"] / tokens
    return {
        f"{prefix}loss": sums["loss"] / tokens,
        f"{prefix}nll": nll,
        f"{prefix}ppl": math.exp(min(nll, 50.0)),
        f"{prefix}accuracy": sums["correct"] / tokens,
    }


def duration(seconds: float) -> str:
    """12345 -> '3h25m45s'."""
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
