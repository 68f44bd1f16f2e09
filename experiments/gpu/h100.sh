#!/bin/bash
# One lent-GPU call (device tool): profile of the base bfloat16 step, bench variants side by side
# (the same machine, one after another), big, the newstest2014-sized decode, the GPU tests.
# Run from the repository root with the wheels in .whl/ and the previous commit's fxformer in .old/.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
[ -n "$SKIP_INSTALL" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
git log -1 --format='commit %H' 2>/dev/null
BASE=${BASE:-"--config=configs/base.py --config.model.dtype=bfloat16"}
BIG=${BIG:-"--config=configs/big.py --config.model.dtype=bfloat16"}
STEPS=${STEPS:-20} DECODE=${DECODE:-3003}
bench() {  # name, folder, environment, bench arguments...
  local name=$1 dir=$2 env=$3; shift 3
  echo "=== $name ($(( $(date +%s) - start )) s)"
  (cd $dir && env $env timeout 120 python3 -m fxformer.bench "$@" --json) > /tmp/$name.log 2>&1
  (echo "=== $name"; cat /tmp/$name.log) >> $OUT/benches.log
  tail -n 14 /tmp/$name.log | grep -v '^{'
  tail -n 1 /tmp/$name.log | grep '^{' > /tmp/json.$name && echo "$name $(cat /tmp/json.$name)" >> $OUT/bench.jsonl
}
echo "=== profile ($(( $(date +%s) - start )) s)"
timeout 150 python3 -m fxformer.profile $BASE --config.model.attention_impl=${ATTN:-cudnn} --out=/tmp/prof 2>&1 | tail -n 30
cp /tmp/prof/profile.json $OUT/ ; cp /tmp/prof/perfetto_trace.json.gz /tmp/prof/step.hlo.txt.gz $OUT/ 2>/dev/null
bench old_cudnn .old "X=1" $BASE --config.model.attention_impl=cudnn --steps=$STEPS --decode_batch=0
bench new_cudnn . "X=1" $BASE --config.model.attention_impl=cudnn --steps=$STEPS --decode_batch=0
bench new_cudnn_rbg . "JAX_DEFAULT_PRNG_IMPL=rbg" $BASE --config.model.attention_impl=cudnn --steps=$STEPS --decode_batch=0
bench new_xla_rbg . "JAX_DEFAULT_PRNG_IMPL=rbg" $BASE --config.model.attention_impl=xla --steps=$STEPS --decode_batch=0
bench new_cudnn_rbg_chunk . "JAX_DEFAULT_PRNG_IMPL=rbg" $BASE --config.model.attention_impl=cudnn --config.loss_chunk_tokens=8192 --steps=$STEPS --decode_batch=0
bench big_cudnn_rbg . "JAX_DEFAULT_PRNG_IMPL=rbg" $BIG --config.model.attention_impl=cudnn --steps=10 --decode_batch=0
bench decode3003 . "X=1" $BASE --steps=0 --decode_batch=$DECODE --decode_len=32 --decode_repeats=2
left=$(( 585 - ($(date +%s) - start) ))
echo "=== pytest with ${left} s left"
if [ $left -gt 30 ] && [ -z "$SKIP_TESTS" ]; then
  timeout $left python3 -m pytest -n 8 -q -p no:cacheprovider tests/test_model.py tests/test_train.py > $OUT/pytest.log 2>&1
  echo "pytest rc $?"; tail -n 15 $OUT/pytest.log
fi
echo "=== summary"
python3 - <<'PY'
import json, os
for line in open(os.environ["OUT"] + "/bench.jsonl"):
    name, js = line.split(" ", 1); r = json.loads(js)
    if "step_time_s" in r:
        print(f"{name:22} step {1000*r['step_time_s']:7.1f} ms  MFU {100*(r['mfu'] or 0):5.1f}%  {r['train_tokens_per_s']:10,.0f} tok/s  mem {r['peak_memory_bytes']/2**20:8,.0f} MiB  compile {r['compile_s']:.0f} s")
    if r.get("decode_sentences_per_s"):
        print(f"{name:22} decode {r['decode_batch']/r['decode_sentences_per_s']:.2f} s for {r['decode_batch']}, {r['decode_sentences_per_s']:.1f} sent/s, compile {r['decode_compile_s']:.0f} s")
PY
