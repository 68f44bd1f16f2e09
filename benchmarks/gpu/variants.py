"""Several configs' training steps compiled in one process and timed in turns, so that a drift of
the machine falls on all of them alike (two runs of the same step, minutes apart, once differed
by 2 ms on an H100).

    python3 -m benchmarks.gpu.variants --config=configs/base.py --out=bench.jsonl \\
        base:packed one_pass:packed:loss_impl=one_pass pallas:packed:segment_attention=pallas ...

Each variant is NAME:BATCH[:KEY=VALUE,...], BATCH `full` or `packed` (`fxformer.bench.BATCHES`),
KEY a field of the config's `model` section, a dotted key (`data.vocab_size`) or a top-level field
(`flat_update`) (`--set` gives overrides for all of them). A variant
that fails to build or compile (a kernel Triton refuses, an option this machine lacks) is
reported with its error and the rest go on. Then `--rounds` rounds, each timing `--steps` steps
of every variant in turn (the order reversed every other round), each step waited for, after two
untimed steps each. One line per variant is appended to `--out`: its name, a space, the
`fxformer.bench` record of its step (`bench.step_record`: both FLOP counts and MFUs), or
{"error": ...}. The last lines printed are a table of them.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import jax
import jax.numpy as jnp

from fxformer import bench, configfile, schema
from fxformer.config import validate, with_overrides

MODEL_FIELDS = set(schema.model_section().keys())  # a bare KEY of these is model.KEY; others are top-level


def parse_value(text: str):
    """A config value from the command line: JSON where it parses (numbers, true), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_variant(spec: str) -> tuple[str, str, dict]:
    """NAME:BATCH[:KEY=VALUE,...] -> (name, batch, {"model.KEY": value})."""
    name, batch, *rest = spec.split(":")
    if batch not in bench.BATCHES:
        raise SystemExit(f"variant {spec!r}: the batch must be one of {', '.join(bench.BATCHES)}, not {batch!r}")
    overrides = {}
    for item in rest[0].split(",") if rest and rest[0] else []:
        key, _, value = item.partition("=")
        overrides[key if "." in key or key not in MODEL_FIELDS else f"model.{key}"] = parse_value(value)
    return name, batch, overrides


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", help="NAME:BATCH[:KEY=VALUE,...]")
    p.add_argument("--config", default="configs/base.py")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE for every variant (dotted config keys)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", required=True, help="JSON lines file to append to")
    p.add_argument(
        "--budget_s", type=float, default=0, help="stop compiling new variants after this many seconds (0: none)"
    )
    return p


def compile_all(args, common: dict) -> tuple[dict, dict]:
    """({name: (step, batch, overrides)}, {name: error}): each variant built and compiled, its two
    untimed steps run, until `--budget_s` would be passed by the longest compile yet."""
    start = time.time()
    steps, errors, longest = {}, {}, 0.0
    for spec in args.variants:
        name, batch, overrides = parse_variant(spec)
        if args.budget_s and time.time() - start + longest > args.budget_s:  # the longest compile yet might not fit
            errors[name] = f"not compiled: {args.budget_s:.0f} s for compiling, {time.time() - start:.0f} s spent"
            continue
        began = time.time()
        try:
            config = with_overrides(configfile.load_config(args.config), {**common, **overrides})
            validate(config, jax.default_backend(), jax.process_count())
            s = bench.synthetic_step(config, config.data.vocab_size, batch)
            bench.timed_steps(s, 0, report=False)  # the two untimed steps
            steps[name] = (s, batch, overrides)
            bench.progress(f"{name}: compiled in {s.compile_s:.1f} s")
            longest = max(longest, time.time() - began)
        except Exception as e:  # noqa: BLE001 (one variant's failure is reported; the others go on)
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
            bench.progress(f"{name}: failed: {errors[name]}")
            traceback.print_exc()
    return steps, errors


def timed_in_turns(steps: dict, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Each variant's step times: `rounds` rounds of `per_round` steps each, the order reversed every other round."""
    times = {name: [] for name in steps}
    for r in range(rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        for name in order:
            s = steps[name][0]
            for _ in range(per_round):
                t0 = time.perf_counter()
                s.state, metrics = s.compiled(s.state, s.batch)
                jax.block_until_ready(metrics)
                times[name].append(time.perf_counter() - t0)
        bench.progress(f"round {r + 1}/{rounds} timed")
    return times


def record_of(step, batch: str, overrides: dict, times: list[float]) -> dict:
    """A variant's line: the device, its options and `bench.step_record` of its times."""
    device = jax.devices()[0]
    record = {"device": device.device_kind, "platform": device.platform, "devices": jax.device_count()}
    record.update(dtype=jnp.dtype(step.model.config.dtype).name, batch=batch, options=overrides)
    record.update(bench.step_record(step, times))
    # one process holds every variant: its peak memory is no one variant's; XLA's temporaries are
    memory = step.compiled.memory_analysis()
    record.update(peak_memory_bytes=None, decode_sentences_per_s=None)
    record["temp_bytes"] = getattr(memory, "temp_size_in_bytes", None)
    return record


def print_table(variants: list[str], steps: dict, errors: dict, times: dict) -> None:
    print(f"{'variant':18} {'step ms':>8} {'MFU':>6} {'MFU seg':>7}  batch   options")
    for spec in variants:
        name = spec.split(":")[0]
        if name not in steps:
            print(f"{name:18} failed: {errors[name]}")
            continue
        s, batch, overrides = steps[name]
        r = bench.step_record(s, times[name])
        mfu = lambda v: "  n/a" if v is None else f"{100 * v:5.1f}%"  # noqa: E731
        opts = ",".join(f"{k.split('.')[-1]}={v}" for k, v in overrides.items()) or "(as it is)"
        print(f"{name:18} {1000 * r['step_time_s']:8.1f} {mfu(r['mfu'])} {mfu(r['mfu_segments'])}  {batch:7} {opts}")


def main() -> None:
    args = parser().parse_args()
    common = {}
    for item in args.set:
        key, _, value = item.partition("=")
        common[key] = parse_value(value)
    steps, errors = compile_all(args, common)
    times = timed_in_turns(steps, args.rounds, args.steps)
    with open(args.out, "a") as f:
        for spec in args.variants:
            name = spec.split(":")[0]
            record = record_of(*steps[name], times[name]) if name in steps else {"error": errors[name]}
            f.write(f"{name} {json.dumps(record)}\n")
    print_table(args.variants, steps, errors, times)


if __name__ == "__main__":
    main()
