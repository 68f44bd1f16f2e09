#!/bin/bash
# One GPU run: profile of the base bfloat16 step, bench variants side by side
# (the same machine, one after another), big, the newstest2014-sized decode, the GPU tests.
# Run from the repository root with the wheels in .whl/ and the previous commit's fxformer in .old/.
source benchmarks/gpu/lib.sh
BASE=${BASE:-"--config=configs/base.py --config.model.dtype=bfloat16"}
BIG=${BIG:-"--config=configs/big.py --config.model.dtype=bfloat16"}
STEPS=${STEPS:-20} DECODE=${DECODE:-3003}
B="python3 -m fxformer.bench --json"
echo "=== profile ($(( $(date +%s) - start )) s)"
timeout 150 python3 -m fxformer.profile $BASE --config.model.attention_impl=${ATTN:-cudnn} --out=/tmp/prof 2>&1 | tail -n 30
cp /tmp/prof/profile.json $OUT/ ; cp /tmp/prof/perfetto_trace.json.gz /tmp/prof/step.hlo.txt.gz $OUT/ 2>/dev/null
DIR=.old bench old_cudnn "X=1" $B $BASE --config.model.attention_impl=cudnn --steps=$STEPS --decode_batch=0
bench new_cudnn "X=1" $B $BASE --config.model.attention_impl=cudnn --steps=$STEPS --decode_batch=0
bench new_cudnn_rbg "JAX_DEFAULT_PRNG_IMPL=rbg" $B $BASE --config.model.attention_impl=cudnn --steps=$STEPS --decode_batch=0
bench new_xla_rbg "JAX_DEFAULT_PRNG_IMPL=rbg" $B $BASE --config.model.attention_impl=xla --steps=$STEPS --decode_batch=0
bench new_cudnn_rbg_chunk "JAX_DEFAULT_PRNG_IMPL=rbg" $B $BASE --config.model.attention_impl=cudnn --config.loss_chunk_tokens=8192 --steps=$STEPS --decode_batch=0
bench big_cudnn_rbg "JAX_DEFAULT_PRNG_IMPL=rbg" $B $BIG --config.model.attention_impl=cudnn --steps=10 --decode_batch=0
bench decode3003 "X=1" $B $BASE --steps=0 --decode_batch=$DECODE --decode_len=32 --decode_repeats=2
left=$(( 585 - ($(date +%s) - start) ))
echo "=== pytest with ${left} s left"
if [ $left -gt 30 ] && [ -z "$SKIP_TESTS" ]; then
  timeout $left python3 -m pytest -n 8 -q -p no:cacheprovider tests/test_model.py tests/test_train.py > $OUT/pytest.log 2>&1
  echo "pytest rc $?"; tail -n 15 $OUT/pytest.log
fi
summary
