#!/bin/bash
# One lent-GPU call (device tool), second session on an H100: the base bfloat16 step at this commit
# beside what-if variants (experiments/gpu/diag.py, config flags, XLA flags), one process after
# another; then the whole test suite on the GPU with the time left. Run from the repository root
# with the wheels of experiments/gpu/wheels.txt in .whl/. Output: $OUT/bench.jsonl, benches.log, pytest.log.
# Environment: LIMIT (s), STEPS, TESTS (pytest paths), SKIP_INSTALL, SKIP_BENCHES, SKIP_TESTS.
LIMIT=${LIMIT:-570} BENCH_TIMEOUT=${BENCH_TIMEOUT:-100}
source experiments/gpu/lib.sh
BASE="--config=configs/base.py --config.model.dtype=bfloat16 --config.model.attention_impl=cudnn --steps=${STEPS:-20} --decode_batch=0 --json"
B="python3 -m fxformer.bench"; D="python3 experiments/gpu/diag.py"
if [ -z "$SKIP_BENCHES" ]; then  # SKIP_BENCHES=1: the tests alone, with the whole call's time
bench head "X=1" $B $BASE
bench mask_heads_1 "X=1" $D mask_heads_1 $BASE
bench no_mask "X=1" $D no_mask $BASE
bench one_pass_loss "X=1" $D one_pass_loss $BASE
bench no_dropout "X=1" $B $BASE --config.model.dropout_rate=0
bench triton_gemm_off "XLA_FLAGS=--xla_gpu_enable_triton_gemm=false" $B $BASE
bench batch_2x "X=1" $B $BASE --config.data.tokens_per_batch=50000
bench head_again "X=1" $B $BASE
summary
fi
left=$(( LIMIT - ($(date +%s) - start) ))
echo "=== pytest with ${left} s left"
if [ $left -gt 60 ] && [ -z "$SKIP_TESTS" ]; then
  # -o addopts= : pyproject's -q would cancel -v, and -v names each failure as it happens (a run cut
  # off by the timeout still says which failed; on 2026-11-26 it was cut off at 412 of 453 tests).
  timeout $left python3 -m pytest -o addopts= -v --tb=short -p no:cacheprovider -p no:benchmark -n 16 --dist loadfile -rfE ${TESTS:-tests} > $OUT/pytest.log 2>&1
  echo "pytest rc $?"; grep -E "passed|failed|error" $OUT/pytest.log | tail -n 3; grep -E "(FAILED|ERROR) " $OUT/pytest.log | head -n 40
fi
echo "=== end ($(( $(date +%s) - start )) s)"
