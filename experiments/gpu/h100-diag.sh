#!/bin/bash
# One lent-GPU call (device tool), second session on an H100: the base bfloat16 step at this commit
# beside what-if variants (experiments/gpu/diag.py, config flags, XLA flags), one process after
# another; then the whole test suite on the GPU with the time left. Run from the repository root
# with the wheels of experiments/gpu/wheels.txt in .whl/. Output: $OUT/bench.jsonl, benches.log, pytest.log.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s); LIMIT=${LIMIT:-570}
[ -n "$SKIP_INSTALL" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
BASE="--config=configs/base.py --config.model.dtype=bfloat16 --config.model.attention_impl=cudnn --steps=${STEPS:-20} --decode_batch=0 --json"
bench() {  # name, environment, command...
  local name=$1 env=$2; shift 2
  echo "=== $name ($(( $(date +%s) - start )) s)"
  env $env timeout 100 "$@" > /tmp/$name.log 2>&1
  (echo "=== $name: $*"; cat /tmp/$name.log) >> $OUT/benches.log
  tail -n 1 /tmp/$name.log | grep '^{' > /tmp/json.$name && echo "$name $(cat /tmp/json.$name)" >> $OUT/bench.jsonl || tail -n 3 /tmp/$name.log
}
B="python3 -m fxformer.bench"; D="python3 experiments/gpu/diag.py"
bench head "X=1" $B $BASE
bench mask_heads_1 "X=1" $D mask_heads_1 $BASE
bench no_mask "X=1" $D no_mask $BASE
bench no_dropout "X=1" $B $BASE --config.model.dropout_rate=0
bench triton_gemm_off "XLA_FLAGS=--xla_gpu_enable_triton_gemm=false" $B $BASE
bench batch_2x "X=1" $B $BASE --config.data.tokens_per_batch=50000
bench head_again "X=1" $B $BASE
echo "=== summary"
python3 - <<'PY'
import json, os
for line in open(os.environ["OUT"] + "/bench.jsonl"):
    name, js = line.split(" ", 1); r = json.loads(js)
    print(f"{name:16} step {1000*r['step_time_s']:6.1f} ms  MFU {100*(r['mfu'] or 0):5.1f}%  {r['train_tokens_per_s']:9,.0f} tok/s  mem {r['peak_memory_bytes']/2**20:7,.0f} MiB  compile {r['compile_s']:.0f} s")
PY
left=$(( LIMIT - ($(date +%s) - start) ))
echo "=== pytest with ${left} s left"
if [ $left -gt 60 ] && [ -z "$SKIP_TESTS" ]; then
  # -o addopts= : pyproject's -q would cancel -v, and -v names each failure as it happens (a run cut
  # off by the timeout still says which failed; on 2026-11-26 it was cut off at 412 of 453 tests).
  timeout $left python3 -m pytest -o addopts= -v --tb=short -p no:cacheprovider -p no:benchmark -n 16 --dist loadfile -rfE ${TESTS:-tests} > $OUT/pytest.log 2>&1
  echo "pytest rc $?"; grep -E "passed|failed|error" $OUT/pytest.log | tail -n 3; grep -E "(FAILED|ERROR) " $OUT/pytest.log | head -n 40
fi
echo "=== end ($(( $(date +%s) - start )) s)"
