#!/bin/bash
# Sourced by the lent-GPU scripts (h100.sh, h100-diag.sh), run from the repository root with the
# wheels of experiments/gpu/wheels.txt in .whl/ and $OUT set by the device tool: installs the wheels
# (not with SKIP_INSTALL), prints the machine, and gives `bench` and `summary`.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
[ -n "$SKIP_INSTALL" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
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

# summary: one line per bench of $OUT/bench.jsonl (step time, MFU, tokens/s, memory; decode speed).
summary() {
  echo "=== summary"
  python3 - <<'PY'
import json, os
for line in open(os.environ["OUT"] + "/bench.jsonl"):
    name, js = line.split(" ", 1); r = json.loads(js)
    if r.get("step_time_s"):
        print(f"{name:22} step {1000*r['step_time_s']:7.1f} ms  MFU {100*(r['mfu'] or 0):5.1f}%  {r['train_tokens_per_s']:10,.0f} tok/s  mem {r['peak_memory_bytes']/2**20:8,.0f} MiB  compile {r['compile_s']:.0f} s")
    if r.get("decode_sentences_per_s"):
        print(f"{name:22} decode {r['decode_batch']/r['decode_sentences_per_s']:.2f} s for {r['decode_batch']}, {r['decode_sentences_per_s']:.1f} sent/s, compile {r['decode_compile_s']:.0f} s")
PY
}
