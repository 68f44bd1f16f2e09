"""Where a run's numbers go: `W/metrics.jsonl`, TensorBoard event files (no TensorFlow), the console."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tensorboardX import SummaryWriter


class MetricWriter:
    """One JSON object per logged step in `metrics.jsonl`, and the same scalars for TensorBoard."""

    def __init__(self, workdir: Path, resume_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(workdir) / "metrics.jsonl"
        if not enabled:
            return
        if self.path.exists():  # a resumed run rewrites what came after its checkpoint
            kept = [line for line in self.path.read_text().splitlines() if _step(line) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.tensorboard = SummaryWriter(logdir=str(Path(workdir) / "tensorboard"), purge_step=resume_step + 1)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **scalars}) + "\n")
        for name, value in scalars.items():
            self.tensorboard.add_scalar(name, value, step)
        self.tensorboard.flush()

    def close(self) -> None:
        if self.enabled:
            self.tensorboard.close()


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
