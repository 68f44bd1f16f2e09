"""Where a config's training step spends its time on the devices at hand.

    python -m fxformer.profile --config=configs/base.py --config.model.dtype=bfloat16 --out=/tmp/prof

Compiles the training step on a synthetic batch of the config's shapes (as `fxformer.bench`
does), runs two untimed and three timed steps (their median is the wall step time), then
traces `--steps` steps with `jax.profiler` and adds up the device's time per operation. Each
operation of the compiled program is put in one part of the model by the names that JAX keeps
in its metadata (the Flax module path and the primitive): dropout (its random bits and masks),
the output projection and loss, layer norm, attention, feed-forward, embeddings, the optimizer,
and the rest (the first that matches, in that order).
On a GPU, XLA's command buffers (CUDA graphs) hide the operations inside one launch: trace with
`XLA_FLAGS=--xla_gpu_enable_command_buffer=` (on an H100 the base step took 44.7 ms so, against
bench's 43.7 ms with them). Prints the parts (milliseconds per step and share) and the most
expensive operations; writes the trace (`perfetto_trace.json.gz`, which
ui.perfetto.dev opens), the compiled HLO (`step.hlo.txt.gz`) and `profile.json` under --out.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import statistics
import sys
from pathlib import Path

import jax

from fxformer import bench, cli
from fxformer.config import validate
from fxformer.errors import UserError

# (part, patterns in an operation's metadata op_name); the first part that matches wins.
PARTS = (
    ("dropout (random bits, masks)", ("threefry", "random_bits", "rbg", "bernoulli", "random_", "dropout")),
    ("output projection + loss", ("logits", "cross_entropy")),
    ("layer norm", ("_norm/", "layernorm")),  # the sublayers' residual norms and the final ones
    ("attention", ("attention",)),
    ("feed-forward", ("feed_forward",)),
    ("embeddings", ("embed", "positional")),
    ("optimizer", ("optimizer",)),
)
OP_NAME = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?metadata=\{[^}]*op_name="([^"]*)"')


def op_names(hlo_text: str) -> dict[str, str]:
    """Instruction name -> the op_name in its metadata, for every instruction that has one."""
    names = {}
    for line in hlo_text.splitlines():
        m = OP_NAME.match(line)
        if m:
            names.setdefault(m.group(1), m.group(2))
    return names


def part_of(op_name: str) -> str:
    lowered = op_name.lower()
    for part, patterns in PARTS:
        if any(p in lowered for p in patterns):
            return part
    return "other"


def device_events(trace: dict) -> list[dict]:
    """The complete events ('X') of the trace's device processes (names holding '/device:'); on
    a CPU, which has none, the host threads' events of compiled operations (those naming an hlo_op)."""
    events = trace.get("traceEvents", [])
    devices = {
        e["pid"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name" and "/device:" in str(e.get("args", {}).get("name"))
    }
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if devices:
        return [e for e in complete if e.get("pid") in devices]
    return [e for e in complete if "hlo_op" in e.get("args", {})]


def summarize(events: list[dict], names: dict[str, str], steps: int) -> dict:
    """Device microseconds per part and per operation, per step."""
    per_op: dict[str, float] = collections.Counter()
    for e in events:
        args = e.get("args", {})
        op = args.get("hlo_op") or args.get("long_name", "").split(" ")[0].lstrip("%") or e["name"]
        per_op[op] += e["dur"] / steps
    per_part: dict[str, float] = collections.Counter()
    for op, us in per_op.items():
        per_part[part_of(names.get(op, op))] += us
    total = sum(per_part.values())
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:40]
    return {
        "device_us_per_step": total,
        "parts": dict(sorted(per_part.items(), key=lambda kv: -kv[1])),
        "top_ops": [
            {"op": op, "us": us, "op_name": names.get(op, ""), "part": part_of(names.get(op, op))} for op, us in top
        ],
    }


def table(summary: dict, step_ms: float) -> str:
    total = summary["device_us_per_step"]
    lines = [f"step {step_ms:.1f} ms (wall, median); device busy {total / 1000:.1f} ms per step"]
    for part, us in summary["parts"].items():
        lines.append(f"  {part:<30} {us / 1000:7.2f} ms  {100 * us / max(total, 1e-9):5.1f}%")
    lines.append("most expensive operations (ms per step, part, op_name):")
    for t in summary["top_ops"][:20]:
        lines.append(f"  {t['us'] / 1000:7.3f}  {t['part']:<24} {t['op']}  {t['op_name'][-90:]}")
    return "\n".join(lines)


def profile(config, steps: int, out: Path) -> dict:
    s = bench.synthetic_step(config, config.data.vocab_size)
    hlo = s.compiled.as_text()
    times = bench.timed_steps(s, 3, report=False)
    out.mkdir(parents=True, exist_ok=True)
    bench.progress(f"tracing {steps} steps into {out}")
    with jax.profiler.trace(str(out / "trace"), create_perfetto_trace=True):
        for _ in range(steps):
            s.state, metrics = s.compiled(s.state, s.batch)
        jax.block_until_ready(metrics)
    found = sorted((out / "trace").rglob("perfetto_trace.json.gz"))
    if not found:
        raise UserError(f"jax.profiler wrote no perfetto_trace.json.gz under {out / 'trace'}.")
    trace_path = out / "perfetto_trace.json.gz"
    found[-1].replace(trace_path)
    with gzip.open(trace_path, "rt") as f:
        trace = json.load(f)
    with gzip.open(out / "step.hlo.txt.gz", "wt") as f:
        f.write(hlo)
    summary = summarize(device_events(trace), op_names(hlo), steps)
    summary["step_ms"] = 1000 * statistics.median(times)
    summary["device"] = jax.devices()[0].device_kind
    (out / "profile.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> None:
    p = cli.parser(__doc__, "fxformer.profile")
    p.add_argument("--steps", type=int, default=3, help="traced training steps")
    p.add_argument("--out", required=True, help="folder for the trace, the HLO and profile.json")
    args, config = cli.parse(p)
    if config is None:
        raise UserError("Give --config=<config file>, e.g. --config=configs/base.py.")
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, not {args.steps}.")
    validate(config, jax.default_backend(), jax.process_count())
    summary = profile(config, args.steps, Path(args.out))
    print(table(summary, summary["step_ms"]), file=sys.stdout)


if __name__ == "__main__":
    cli.run(main)
