"""The GPU run queue: within a time limit, the next undone items of a fixed priority list, each
recorded as it finishes, so that a call cut short by its limit leaves every finished item's
records and the next call (the same command) goes on from the first undone one.

    python3 -m benchmarks.gpu.queue --out=experiments/results/gpu/h200-2026-12-02 --limit_s=480
    python3 -m benchmarks.gpu.queue --cpu --out=/tmp/rehearsal --limit_s=110   # the CPU rehearsal

The items, in order (`ITEMS`):
  1. tests: the kernels' tests and the model's (its GPU-only ones among them), `--junitxml`, each
     failure named in junit-tests.xml and tests.log;
  2. noise: the packed base step compiled three times in one process and timed in turns
     (benchmarks/gpu/variants.py): the spread of their medians is the noise floor;
  3. options: each kernel option and residual_norm=fused against the step as it is, in one
     process; each saving set against the noise floor;
  4. profile: `fxformer.profile` of the best configuration so far (per-operation table in
     profile.txt and profile/profile.json; the trace and HLO are not kept);
  5. peer: the Flax WMT example's step beside fxformer's (benchmarks/gpu/peer.py; needs .peer/);
  6. later: the best configuration beside smaller key tiles in the segment kernel (32, 16), the
     vocabulary padded to a multiple of 128, merged Q/K/V projections and one flat optimizer
     update, in one process.

Before anything runs, the packages fxformer and the items import are checked (and installed from
.whl/, benchmarks/gpu/wheels.txt, where it is there); a missing one is refused in one sentence.
`--out` gets queue.jsonl (one line per finished item: its state, exit status, wall time, the
commit, and for noise and options the step-time quartiles and savings), environment.json (the
commit, packages and device), and each item's log and records. An item starts only where its
shortest useful time is left, and is stopped at the limit; a stopped item is not finished and runs
again next time. `--cpu`: the same items on the CPU platform at tiny shapes in float32 (the
rehearsal, a test), compiled with XLA's CPU backend optimizations off (the rehearsal checks that
every item runs, not how fast: its compiles take a third less), one quick test for the tests item.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NEEDED = (  # what fxformer and the items import (xdist: the tests item's workers)
    *("jax", "flax", "optax", "orbax.checkpoint", "ml_collections", "grain", "sentencepiece", "numpy"),
    *("pytest", "xdist"),
)
BEST = "segment_attention=pallas,dropout_bits=8,residual_norm=fused,loss_impl=one_pass"  # 27.2% on an H200
OPTIONS = (  # NAME:BATCH:OPTIONS for benchmarks/gpu/variants.py, the step as it is first
    "base:packed",
    "fused_norm:packed:residual_norm=fused",
    "pallas_norm:packed:residual_norm=pallas",
    "fused_loss:packed:loss_impl=fused",
    f"best:packed:{BEST}",
    "best_new:packed:segment_attention=pallas,residual_norm=pallas,loss_impl=fused",
)
LATER = (  # the best configuration so far beside what might take it further, one process
    f"best:packed:{BEST}",
    f"keys_32:packed:{BEST},segment_block_k=32",
    f"keys_16:packed:{BEST},segment_block_k=16",
    f"vocab_128:packed:{BEST},data.vocab_size={{vocab_128}}",  # the vocabulary padded to a multiple of 128
    f"qkv_merged:packed:{BEST},qkv_projection=merged",
    f"flat_update:packed:{BEST},flat_update=true",
)
GPU = {
    "config": "configs/base.py",
    "dtype": "bfloat16",
    "attention": "cudnn",
    "steps": 10,
    "rounds": 3,
    "shapes": (),
    "vocab": 37000,
}
CPU = {
    "config": "configs/default.py",
    "dtype": "float32",
    "attention": "xla",
    "steps": 2,
    "rounds": 1,
    "shapes": (
        "model.num_layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.num_heads=2",
        "data.vocab_size=120",
        "data.tokens_per_batch=128",
        "data.max_length=16",
    ),
    "vocab": 120,
}
GPU_TESTS = ("tests/test_kernels.py", "tests/test_counter_dropout.py", "tests/test_model.py")
CPU_TESTS = ("tests/test_counter_dropout.py::test_threefry_gives_random123s_known_answer_and_jaxs_own_words",)


def variants_command(setting: dict, out: Path, specs, name: str) -> list[str]:
    sets = [f"model.dtype={setting['dtype']}", f"model.attention_impl={setting['attention']}", *setting["shapes"]]
    return [
        sys.executable,
        "-m",
        "benchmarks.gpu.variants",
        f"--config={setting['config']}",
        *[a for s in sets for a in ("--set", s)],
        f"--steps={setting['steps']}",
        f"--rounds={setting['rounds']}",
        f"--out={out / f'bench-{name}.jsonl'}",
        *specs,
    ]


def tests_command(setting: dict, out: Path, cpu: bool) -> list[str]:
    workers = ["-n", "0"] if cpu else ["-n", "4", "--dist", "loadfile"]
    return [
        sys.executable,
        "-m",
        "pytest",
        "-o",
        "addopts=",
        "-v",
        "--tb=short",
        "-p",
        "no:cacheprovider",
        "-rfEs",
        *workers,
        f"--junitxml={out / 'junit-tests.xml'}",
        *(CPU_TESTS if cpu else GPU_TESTS),
    ]


def profile_command(setting: dict, out: Path, cpu: bool) -> list[str]:
    flags = [f"--config.model.dtype={setting['dtype']}", f"--config.model.attention_impl={setting['attention']}"]
    flags += [f"--config.model.{kv}" for kv in BEST.split(",")] + [f"--config.{s}" for s in setting["shapes"]]
    steps = 1 if cpu else 3
    return [
        sys.executable,
        "-m",
        "fxformer.profile",
        f"--config={setting['config']}",
        *flags,
        f"--steps={steps}",
        f"--out={out / 'profile'}",
    ]


def peer_command(setting: dict, out: Path) -> list[str] | None:
    if not (REPO / ".peer" / "models.py").exists():
        return None
    sets = [a for s in (f"model.attention_impl={setting['attention']}", *setting["shapes"]) for a in ("--set", s)]
    return [
        sys.executable,
        "-m",
        "benchmarks.gpu.peer",
        "--flax_wmt=.peer",
        f"--config={setting['config']}",
        f"--dtype={setting['dtype']}",
        "--batch=packed",
        f"--steps={setting['steps']}",
        "--rounds=2",
        "--json",
        *sets,
    ]


def items(setting: dict, out: Path, cpu: bool) -> list[tuple[str, list[str] | None, float]]:
    """(name, command or None where it cannot run here, the shortest useful time in seconds) in priority order."""
    noise = [f"a{i}:packed" for i in (1, 2, 3)]
    padded = -(-setting["vocab"] // 128) * 128
    return [
        ("tests", tests_command(setting, out, cpu), 20 if cpu else 90),
        ("noise", variants_command(setting, out, noise, "noise"), 20 if cpu else 60),
        ("options", variants_command(setting, out, OPTIONS, "options"), 20 if cpu else 90),
        ("profile", profile_command(setting, out, cpu), 15 if cpu else 45),
        ("peer", peer_command(setting, out), 15 if cpu else 45),
        (
            "later",
            variants_command(setting, out, [spec.format(vocab_128=padded) for spec in LATER], "later"),
            20 if cpu else 60,
        ),
    ]


MISSING = """import importlib.util, sys
for name in sys.argv[1:]:
    try:
        found = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # its parent package is missing
        found = None
    if found is None:
        print(name)
"""


def missing_packages(env: dict) -> list[str]:
    """The modules of NEEDED that Python with `env` (its PYTHONPATH) cannot find, asked in a child process."""
    child = subprocess.run(
        [sys.executable, "-c", MISSING, *NEEDED], env=env, capture_output=True, text=True, check=True
    )
    return child.stdout.split()


def install_wheels(env: dict) -> list[str]:
    """Install .whl/ into /tmp/site (on the items' PYTHONPATH) where packages are missing; what is missing after."""
    missing = missing_packages(env)
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if missing and wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
             "--target", "/tmp/site", *map(str, wheels)],
            check=True,
        )  # fmt: skip
        env["PYTHONPATH"] = os.pathsep.join(filter(None, ["/tmp/site", env.get("PYTHONPATH")]))
        missing = missing_packages(env)
    return missing


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        return head.stdout.strip() + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("FXFORMER_COMMIT", "unknown (no git)")


ENVIRONMENT = """import json, sys, jax
from fxformer import versions
d = jax.devices()[0]
facts = {"backend": jax.default_backend(), "device": d.device_kind, "platform": d.platform}
facts["devices"] = jax.device_count()
facts.update(packages=versions.versions(), cpu=versions.cpu(), python=sys.version.split()[0])
print(json.dumps(facts))
"""


def environment(env: dict) -> dict:
    """The device and packages the items will see (a child process with their environment), and the commit."""
    child = subprocess.run([sys.executable, "-c", ENVIRONMENT], cwd=REPO, env=env, capture_output=True, text=True)
    if child.returncode != 0:
        raise SystemExit(f"benchmarks.gpu.queue: jax did not start: {child.stderr.strip().splitlines()[-1:]}")
    return {"commit": commit(), **json.loads(child.stdout.strip().splitlines()[-1])}


def quartiles(times: list[float]) -> list[float]:
    """Step time quartiles in ms (the 25th, 50th and 75th percentiles, `statistics.quantiles`' inclusive method)."""
    if len(times) < 2:
        return [1000 * times[0]] * 3 if times else []
    return [round(1000 * q, 3) for q in statistics.quantiles(times, n=4, method="inclusive")]


def read_bench(path: Path) -> dict[str, dict]:
    found = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        name, _, record = line.partition(" ")
        found[name] = json.loads(record)
    return found


def summarise(name: str, out: Path) -> dict:
    """What queue.jsonl says of a timing item: each step's quartiles; the noise floor; each option's saving."""
    if name not in ("noise", "options", "later"):
        return {}
    records = read_bench(out / f"bench-{name}.jsonl")
    ms = {k: quartiles(r["step_times_s"]) for k, r in records.items() if "step_times_s" in r}
    summary = {"quartiles_ms": ms, "errors": {k: r["error"] for k, r in records.items() if "error" in r}}
    if name == "noise" and len(ms) >= 2:
        summary["noise_floor_ms"] = round(max(q[1] for q in ms.values()) - min(q[1] for q in ms.values()), 3)
    first = next(iter(ms), None)  # the step each is set against: the first of the list
    if name in ("options", "later") and first:
        floor = noise_floor(out)
        summary["saving_ms"] = {k: round(ms[first][1] - q[1], 3) for k, q in ms.items() if k != first}
        summary["beyond_noise"] = None if floor is None else {k: s > floor for k, s in summary["saving_ms"].items()}
    return summary


def noise_floor(out: Path) -> float | None:
    """The noise item's floor in ms, from queue.jsonl (None before it has run)."""
    return done_items(out).get("noise", {}).get("noise_floor_ms")


def done_items(out: Path) -> dict[str, dict]:
    """The finished items of queue.jsonl (the last line of each): done, failed or not runnable here."""
    found = {}
    path = out / "queue.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        found[record["item"]] = record
    return {k: r for k, r in found.items() if r["state"] != "stopped at the limit"}


def run_item(name: str, command: list[str] | None, left: float, out: Path, env: dict, head: str) -> dict:
    record = {"item": name, "commit": head, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if command is None:
        return {**record, "state": "cannot run here", "why": "no .peer/models.py (benchmarks/gpu/peer.py says how)"}
    began = time.time()
    with open(out / f"{name}.log", "w") as log:
        log.write("+ " + " ".join(command) + "\n")
        log.flush()
        try:
            rc = subprocess.run(
                command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=left
            ).returncode
            state = "done" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            rc, state = None, "stopped at the limit"
    record.update(state=state, rc=rc, wall_s=round(time.time() - began, 1), command=command[1:])
    if name == "profile" and state == "done":
        keep_profile(out, log_path=out / "profile.log")
    return {**record, **summarise(name, out)}


def keep_profile(out: Path, log_path: Path) -> None:
    """The per-operation table (the profile's printed lines) as profile.txt; the large trace and HLO removed."""
    text = log_path.read_text()
    (out / "profile.txt").write_text(text[text.find("step ") :] if "step " in text else text)
    for name in ("trace", "perfetto_trace.json.gz", "step.hlo.txt.gz"):
        target = out / "profile" / name
        shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.queue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="folder for queue.jsonl and the items' records (kept between calls)")
    p.add_argument(
        "--limit_s", type=float, default=480, help="wall-clock limit of this call (480: 8 of a 10-minute run)"
    )
    p.add_argument("--cpu", action="store_true", help="the rehearsal: the CPU platform, tiny shapes, float32")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    start, out = time.time(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if args.cpu:
        env["JAX_PLATFORMS"] = os.environ["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
    missing = install_wheels(env)
    if missing:
        print(
            f"benchmarks.gpu.queue: {', '.join(missing)} missing: pip install -r requirements.txt, "
            "or put the wheels of benchmarks/gpu/wheels.txt in .whl/.",
            file=sys.stderr,
        )
        return 2
    facts = environment(env)
    if not args.cpu and facts["backend"] != "gpu":
        print(f"benchmarks.gpu.queue: jax sees no GPU (backend {facts['backend']}): --cpu rehearses.", file=sys.stderr)
        return 2
    (out / "environment.json").write_text(json.dumps(facts, indent=1) + "\n")
    done = done_items(out)
    for name, command, shortest in items(CPU if args.cpu else GPU, out, args.cpu):
        left = args.limit_s - (time.time() - start)
        if name in done:
            print(f"{name}: {done[name]['state']} before; skipped")
            continue
        if left < shortest:
            print(f"{name}: not started ({left:.0f} s left, it needs {shortest} s at least); the next call starts here")
            break
        record = run_item(name, command, left, out, env, facts["commit"])
        with open(out / "queue.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"{name}: {record['state']} ({record.get('wall_s', 0)} s)" + _brief(record))
    return 0


def _brief(record: dict) -> str:
    if "noise_floor_ms" in record:
        return f", noise floor {record['noise_floor_ms']} ms"
    if "saving_ms" in record:
        return ", savings (ms): " + ", ".join(f"{k} {v}" for k, v in record["saving_ms"].items())
    return ""


if __name__ == "__main__":
    sys.exit(main())
