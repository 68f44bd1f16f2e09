"""Where a run's numbers go (`W/metrics.jsonl`, TensorBoard event files without TensorFlow, the
console), and how they are read back: the logged lines (early stopping counts its plateau from them:
`fxformer.early`).

`metrics.jsonl` is written through `etils.epath` (object stores cannot append, so each write
replaces the whole small file, atomically); the event files through tensorboardX, whose writers
for gs:// and s3:// are routed through `etils.epath` too (`register_url_writers`), so a `gs://`
workdir works for both.
"""

from __future__ import annotations

import io
import json
import math
import sys
import time

from fxformer import paths
from fxformer.timefmt import duration

HIGHER_IS_BETTER = ("dev_accuracy", "dev_bleu")  # dev metrics whose best is the highest (the others: lowest)


def step_of(line: str) -> int | None:
    """The step of a metrics.jsonl line; None for a line without one (cut short by a kill, or
    damaged: not a JSON object with an integer step)."""
    try:
        step = json.loads(line).get("step")
    except (json.JSONDecodeError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def logged(workdir: paths.Workdir, up_to: int | None = None) -> list[dict]:
    """The lines of `W/metrics.jsonl` with an integer step (up to step `up_to`), in order ([]
    before the first log step); a line cut short by a kill or otherwise damaged is passed over."""
    if not workdir.metrics.exists():
        return []
    kept = lambda step: step is not None and (up_to is None or step <= up_to)  # noqa: E731
    return [json.loads(line) for line in workdir.metrics.read_text().splitlines() if kept(step_of(line))]


class MetricWriter:
    """One JSON object per logged step in `metrics.jsonl`, and the same scalars for TensorBoard.

    It goes on from `kept`, the lines up to `resume_step` (`logged(workdir, resume_step)`): a
    resumed run rewrites the file without what came after its checkpoint. Only the process
    `enabled` writes."""

    def __init__(self, workdir: paths.Workdir, kept: list[dict], resume_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.path = workdir.metrics
        self.lines = [json.dumps(line) for line in kept]
        if not enabled:
            return
        register_url_writers()  # and tensorboardX imported: only a process that writes metrics needs it
        if self.path.exists():  # a resumed run rewrites what came after its checkpoint
            self._save()
        from tensorboardX import SummaryWriter

        self.tensorboard = SummaryWriter(logdir=str(workdir.tensorboard), purge_step=resume_step + 1)

    def _save(self) -> None:
        """The lines so far written over the file (atomically: a kill leaves the old file or the new)."""
        paths.write_atomic(self.path, "".join(line + "\n" for line in self.lines))

    def last(self) -> dict:
        """The last line kept from before this attempt ({} for a new run)."""
        return json.loads(self.lines[-1]) if self.lines else {}

    def logged(self) -> list[dict]:
        """The run's lines so far: those up to `resume_step`, then this attempt's."""
        return [json.loads(line) for line in self.lines]

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        self.lines.append(json.dumps({"step": step, **scalars}))
        self._save()
        for name, value in scalars.items():
            self.tensorboard.add_scalar(name, value, step)
        self.tensorboard.flush()

    def amend(self, step: int, scalars: dict[str, float]) -> None:
        """Add `scalars` to the line of `step`, the last kept (a resumed run's make-up evaluation)."""
        if not self.enabled:
            return
        last = self.last()
        assert last.get("step") == step, (last.get("step"), step)
        self.lines[-1] = json.dumps({**last, **scalars})
        self._save()
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


def import_tensorboardx() -> None:
    """tensorboardX imported without torch: where torch is installed tensorboardX imports it (2 s
    on a 2-core CPU, in every training process) for the tensor type it accepts, which fxformer never
    passes it; torch is hidden from it while it is imported (unless this process imported torch
    already), and can be imported as usual afterwards."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # `import torch` raises ImportError: tensorboardX takes NumPy alone
    try:
        import tensorboardX  # noqa: F401
    finally:
        if hide:
            del sys.modules["torch"]


def register_url_writers() -> None:
    """TensorBoard event files for gs:// and s3:// workdirs through etils.epath, instead of
    tensorboardX's own clients, so every URL goes through one library (done by the first
    MetricWriter, not at import)."""
    import_tensorboardx()
    from tensorboardX import record_writer

    for scheme in ("gs", "s3"):
        record_writer.register_writer_factory(scheme, _EpathEventFiles())


def per_token(sums: dict[str, float], prefix: str = "") -> dict[str, float]:
    """Sums of loss / nll / correct over tokens (`optim.SUMS`) -> per-token loss, nll, perplexity, accuracy."""
    tokens = max(sums["tokens"], 1.0)
    nll = sums["nll"] / tokens
    return {
        f"{prefix}loss": sums["loss"] / tokens,
        f"{prefix}nll": nll,
        f"{prefix}ppl": math.exp(min(nll, 50.0)),
        f"{prefix}accuracy": sums["correct"] / tokens,
    }


class Progress:
    """What training has done, counted on across resumes from `earlier` (the last metrics line
    kept from before this attempt): target tokens, passes over the training pairs, wall time;
    and the recent speed for the console (since its previous line, not the run's average)."""

    def __init__(self, earlier: dict, budget_s: float = 0.0):
        self.tokens_before = earlier.get("tokens_seen", 0.0)
        self.wall_before = earlier.get("wall_s", 0.0)
        self.epochs_before = earlier.get("epochs", 0.0)
        self.budget_s = budget_s
        self.tokens = 0.0  # target tokens over the logged steps of this attempt
        self.logged_steps = 0
        self.pairs = 0  # training pairs read by this attempt
        self.started = self.last_console = time.time()
        self.window: tuple[float, int] | None = None  # (time, step) of the previous console line

    def out_of_time(self) -> bool:
        return 0 < self.budget_s <= time.time() - self.started

    def first_step(self, step: int) -> None:
        """Speed is measured from the end of the first step (which compiles) on."""
        if self.window is None:
            self.window = (time.time(), step)

    def record(self, logged: dict, steps: int, epoch_size: float) -> dict:
        """The metrics of a log step (`logged` with its summed `tokens`, over `steps` steps) with
        tokens_seen, wall_s and epochs added, for metrics.jsonl."""
        self.logged_steps += steps
        self.tokens += logged["tokens"]
        return {
            **{k: v for k, v in logged.items() if k != "tokens"},
            "tokens_seen": self.tokens_before + self.tokens,
            "wall_s": round(self.wall_before + time.time() - self.started, 1),
            "epochs": round(self.epochs_before + self.pairs / epoch_size, 4),
        }

    def console_due(self, logged: bool) -> bool:
        """A console line at every log step, and every few seconds between them."""
        return logged or time.time() - self.last_console >= 5.0

    def line(self, step: int, total: int, shown: dict) -> str:
        now = self.last_console = time.time()
        budget_left = self.budget_s - (now - self.started) if self.budget_s else None
        text = console_line(step, total, shown, self.window, self.tokens / max(self.logged_steps, 1), now, budget_left)
        if self.window and step > self.window[1]:
            self.window = (now, step)
        return text


def console_line(step, total, m, window, tokens_per_step, now, budget_left=None) -> str:
    """step, loss, perplexity, learning rate, tokens/s, steps/s and ETA (to the last step, or to the
    end of the time budget if that comes first) on one line."""
    parts = [f"step {step}/{total}"]
    if "loss" in m:
        parts += [f"loss {m['loss']:.3f}", f"ppl {m['ppl']:.2f}", f"lr {m['learning_rate']:.2e}"]
    if "dev_ppl" in m:
        parts += [f"dev loss {m['dev_loss']:.3f}", f"dev ppl {m['dev_ppl']:.3f}"]
    if "dev_bleu" in m:
        parts.append(f"dev BLEU {m['dev_bleu']:.2f}")
    since, since_step = window or (now, step)  # speed since the previous console line
    elapsed = now - since
    if elapsed > 0 and step > since_step:
        steps_per_s = (step - since_step) / elapsed
        if tokens_per_step:
            parts.append(f"{tokens_per_step * steps_per_s:,.0f} tgt tok/s")
        parts.append(f"{steps_per_s:.2f} steps/s")
        eta = (total - step) / steps_per_s
        if budget_left is not None and budget_left < eta:  # the budget ends first: the ETA is to it
            at_step = min(total, step + int(max(budget_left, 0) * steps_per_s))
            parts.append(f"ETA {duration(max(budget_left, 0))} (time budget, near step {at_step})")
        else:
            parts.append(f"ETA {duration(eta)}")
    return " | ".join(parts)


TOKEN_SUMS = ("loss", "nll", "correct", "tokens")  # the loss's sums over target tokens (`optim.SUMS`)
PER_TOKEN = "_sum"  # a metric `train_step` returns as a sum over target tokens: reported per token, unsuffixed
LAST = ("learning_rate",)  # the value at the window's last step


def window_metrics(fetched: list[dict]) -> dict[str, float]:
    """What a log window reports of the training steps' fetched metrics, each reduced as its name
    declares: per-token loss, nll, perplexity and accuracy from the loss's sums (over their tokens,
    not a mean of per-step means); any other `<name>_sum` per target token as `<name>`; the learning
    rate at the last step; every other metric `train_step` returns, its mean over the window's steps.
    A new metric of `train_step` reaches metrics.jsonl and TensorBoard with no other edit."""
    sums = {k: sum(float(m[k]) for m in fetched) for k in fetched[0] if k not in LAST}
    out = per_token(sums)
    tokens = max(sums["tokens"], 1.0)
    for key, total in sums.items():
        if key in TOKEN_SUMS:
            continue
        out[key.removesuffix(PER_TOKEN)] = total / tokens if key.endswith(PER_TOKEN) else total / len(fetched)
    return {**out, **{k: float(fetched[-1][k]) for k in LAST if k in fetched[0]}, "tokens": sums["tokens"]}
