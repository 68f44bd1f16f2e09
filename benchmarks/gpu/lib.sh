#!/bin/bash
# Sourced by the GPU scripts (h100.sh, h100-diag.sh), run from the repository root with the
# wheels of benchmarks/gpu/wheels.txt in .whl/ and $OUT set to the output folder: installs the wheels
# (not with SKIP_INSTALL), prints the machine, and gives `bench` and `summary`.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
[ -n "$SKIP_INSTALL" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
${PY:-python3} -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
git log -1 --format='commit %H' 2>/dev/null

# bench NAME ENVIRONMENT COMMAND...: one process, in folder ${DIR:-.} (DIR=.old bench ... runs the
# previous commit's copy), at most ${BENCH_TIMEOUT:-120} s; its whole output goes to $OUT/benches.log,
# its closing JSON line to $OUT/bench.jsonl; the last lines of a run that gave none are shown.
bench() {
  local name=$1 env=$2; shift 2
  echo "=== $name ($(( $(date +%s) - start )) s)"
  (cd "${DIR:-.}" && env $env timeout "${BENCH_TIMEOUT:-120}" "$@") > /tmp/$name.log 2>&1
  (echo "=== $name: $*"; cat /tmp/$name.log) >> $OUT/benches.log
  tail -n 1 /tmp/$name.log | grep '^{' > /tmp/json.$name && echo "$name $(cat /tmp/json.$name)" >> $OUT/bench.jsonl || tail -n 3 /tmp/$name.log
}

# summary: one line per record of $OUT/bench.jsonl: step time, MFU on the dense FLOP count and within
# segments, tokens/s, memory (the device's peak, or XLA's temporaries where one process held several
# steps); decode speed; the peer's step beside fxformer's; a record's error.
summary() {
  echo "=== summary"
  python3 - <<'PY'
import json, os
pct = lambda v: "  n/a" if v is None else f"{100 * v:5.1f}%"
for line in open(os.environ["OUT"] + "/bench.jsonl"):
    name, js = line.split(" ", 1); r = json.loads(js)
    if "error" in r:
        print(f"{name:22} failed: {r['error'][:150]}")
    elif r.get("step_time_s"):
        memory = r.get("peak_memory_bytes") or r.get("temp_bytes") or 0
        print(f"{name:22} {r.get('batch', 'full'):6} step {1000*r['step_time_s']:7.1f} ms  MFU {pct(r['mfu'])} "
              f"(causal {pct(r.get('mfu_causal'))}, in segments {pct(r.get('mfu_segments'))})  {r['train_tokens_per_s']:10,.0f} tok/s  "
              f"mem {memory/2**20:7,.0f} MiB  compile {r['compile_s']:.0f} s")
    elif r.get("flax_wmt_step_time_s"):
        for who in ("fxformer", "flax_wmt"):
            print(f"{name + ' ' + who:22} {r['batch']:6} step {1000*r[who + '_step_time_s']:7.1f} ms  MFU {pct(r[who + '_mfu'])}"
                  f"  {r[who + '_tokens_per_s']:10,.0f} tok/s")
        print(f"{name:22} the Flax example's step / fxformer's: {r['flax_wmt_to_fxformer_step_time']:.3f}")
    if r.get("decode_sentences_per_s"):
        print(f"{name:22} decode {r['decode_batch']/r['decode_sentences_per_s']:.2f} s for {r['decode_batch']}, {r['decode_sentences_per_s']:.1f} sent/s, compile {r['decode_compile_s']:.0f} s")
PY
}
