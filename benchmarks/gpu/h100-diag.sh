#!/bin/bash
# One GPU run on an H100: the base bfloat16 step at this commit
# beside what-if variants (benchmarks/gpu/diag.py, config flags, XLA flags), one process after
# another; then the whole test suite on the GPU with the time left. Run from the repository root
# with the wheels of benchmarks/gpu/wheels.txt in .whl/. Output: $OUT/bench.jsonl, benches.log, pytest.log.
# Environment: LIMIT (s), STEPS, BENCHES (names, default all), TESTS (pytest paths), SKIP_INSTALL,
# SKIP_BENCHES, SKIP_TESTS. Both in one run of about 8 minutes:
#   BENCHES="head one_pass_loss head_again" LIMIT=480 bash benchmarks/gpu/h100-diag.sh   (the wheels in .whl/)
LIMIT=${LIMIT:-570} BENCH_TIMEOUT=${BENCH_TIMEOUT:-100}
source benchmarks/gpu/lib.sh
BASE="--config=configs/base.py --config.model.dtype=bfloat16 --config.model.attention_impl=cudnn --steps=${STEPS:-20} --decode_batch=0 --json"
B="python3 -m fxformer.bench"; D="python3 -m benchmarks.gpu.diag"
ALL="head mask_heads_1 no_mask one_pass_loss no_dropout triton_gemm_off batch_2x head_again"
[ -n "$SKIP_BENCHES" ] && BENCHES=""  # SKIP_BENCHES=1: the tests alone, with the whole call's time
for name in ${BENCHES-$ALL}; do  # BENCHES="head one_pass_loss head_again": those alone, in that order
  case $name in
    head|head_again) bench $name "X=1" $B $BASE ;;
    mask_heads_1|no_mask|one_pass_loss) bench $name "X=1" $D $name $BASE ;;
    no_dropout) bench $name "X=1" $B $BASE --config.model.dropout_rate=0 ;;
    triton_gemm_off) bench $name "XLA_FLAGS=--xla_gpu_enable_triton_gemm=false" $B $BASE ;;
    batch_2x) bench $name "X=1" $B $BASE --config.data.tokens_per_batch=50000 ;;
    *) echo "unknown bench $name (one of: $ALL)"; exit 2 ;;
  esac
done
[ -s $OUT/bench.jsonl ] && summary
left=$(( LIMIT - ($(date +%s) - start) ))
echo "=== pytest with ${left} s left"
if [ $left -gt 60 ] && [ -z "$SKIP_TESTS" ]; then
  # -o addopts= : pyproject's -q would cancel -v, and -v names each failure as it happens (a run cut
  # off by the timeout still says which failed; on 2026-11-26 it was cut off at 412 of 453 tests).
  timeout $left python3 -m pytest -o addopts= -v --tb=short -p no:cacheprovider -p no:benchmark -n 16 --dist loadfile -rfE ${TESTS:-tests} > $OUT/pytest.log 2>&1
  echo "pytest rc $?"; grep -E "passed|failed|error" $OUT/pytest.log | tail -n 3; grep -E "(FAILED|ERROR) " $OUT/pytest.log | head -n 40
fi
echo "=== end ($(( $(date +%s) - start )) s)"
