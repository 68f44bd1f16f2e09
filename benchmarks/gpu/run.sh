#!/bin/bash
# Superseded by benchmarks/gpu/queue.py (a priority list within a time limit, each item recorded as it
# finishes, its CPU rehearsal a test); kept as the script that made experiments/results/gpu/h200-2026-11-28.
# One prepared GPU call for the packing-aware options (fxformer/kernels/; model.segment_attention,
# dropout_bits, residual_norm, loss_impl): the base bf16 step as it is (fxformer.bench, the README's
# command), then in one process (benchmarks/gpu/variants.py, timed in turns) the step on the packed
# batch (and, for the options without new kernels, on one sentence a row) as it is and with each
# option, then the Flax WMT example's step beside fxformer's on the packed batch
# (benchmarks/gpu/peer.py), then the GPU tests with the time left; a summary last.
#
# On the device machine, from the repository root, carrying .whl (benchmarks/gpu/wheels.txt) and
# .peer (google/flax's examples/wmt/models.py, see benchmarks/gpu/peer.py):
#   LIMIT=420 bash benchmarks/gpu/run.sh          (a 450 s wall-clock limit; .whl and .peer beside the checkout)
# Records go to $OUT (the folder the machine returns; keep them in experiments/results/gpu/<date>/): bench.jsonl
# (one line per step measured: name, then fxformer.bench's JSON, both MFUs in it), benches.log,
# pytest.log; copy them to experiments/results/gpu/<date>/ with the commit they measured.
# Rehearsal on a CPU (tiny shapes, float32, nothing installed, the Pallas kernel interpreted, the
# cuDNN variants reported as failed):
#   CPU=1 OUT=/tmp/rehearsal bash benchmarks/gpu/run.sh
# Environment: LIMIT (s), VARIANTS (names, default all), SKIP_PEER, SKIP_TESTS, TESTS (pytest paths).
[ -n "$CPU" ] && LIMIT=${LIMIT:-2400}  # a CPU shared with other work: room for slow compiles
LIMIT=${LIMIT:-420}
export OUT=${OUT:-experiments/results/gpu/$(date -u +%F)}
mkdir -p "$OUT"
if [ -n "$CPU" ]; then  # tiny shapes: the same steps and summary in a few minutes on two cores
  export SKIP_INSTALL=1 JAX_PLATFORMS=cpu
  export BENCH_TIMEOUT=${BENCH_TIMEOUT:-900} PEER_TIMEOUT=${PEER_TIMEOUT:-900} TESTS=${TESTS:-tests/test_kernels.py} WORKERS=${WORKERS:-0}
  PY=${PY:-.venv/bin/python} DTYPE=float32 ATTN=xla STEPS=2 ROUNDS=1 CONFIG=configs/default.py
  SHAPES=(--config.model.num_layers=1 --config.data.tokens_per_batch=512 --config.data.max_length=32)
  VSHAPES=(--set model.num_layers=1 --set data.tokens_per_batch=512 --set data.max_length=32)
else
  PY=python3 DTYPE=bfloat16 ATTN=cudnn STEPS=10 ROUNDS=2 CONFIG=configs/base.py SHAPES=() VSHAPES=()
fi
source benchmarks/gpu/lib.sh  # installs the wheels (not with SKIP_INSTALL), prints the machine; bench, summary
elapsed() { echo $(( $(date +%s) - start )); }

# 1. base as it is: the README's command, one sentence a row (the records before these options)
bench base_full "X=1" $PY -m fxformer.bench --config=$CONFIG --config.model.dtype=$DTYPE \
  --config.model.attention_impl=$ATTN --steps=20 --decode_batch=0 --json "${SHAPES[@]}"

# 2. the packed batch (and one sentence a row), as it is and with each option: two processes, each
# timing its steps in turns against its own copy of the step as it is; the new kernels (Triton,
# cuDNN's packed layout) in the second, so that a kernel that brings its process down leaves the
# first's records standing
XLA_ONLY=(  # the options without new kernels, on the packed batch and on one sentence a row (_f)
  base:packed
  fused_norm:packed:residual_norm=fused
  one_pass:packed:loss_impl=one_pass
  bytes:packed:dropout_bits=8
  base_f:full
  fused_norm_f:full:residual_norm=fused
  one_pass_f:full:loss_impl=one_pass
  bytes_f:full:dropout_bits=8
)
KERNELS=(
  base_k:packed
  offsets:packed:segment_attention=cudnn_offsets
  pallas:packed:segment_attention=pallas
  all_offsets:packed:segment_attention=cudnn_offsets,loss_impl=one_pass,dropout_bits=8,residual_norm=fused
  all_pallas:packed:segment_attention=pallas,loss_impl=one_pass,dropout_bits=8,residual_norm=fused
  pallas_full:full:segment_attention=pallas
)
variants() {  # variants NAME LATER SPEC...: one process of benchmarks/gpu/variants.py over the chosen
  # SPECs, leaving LATER seconds for later groups
  local group=$1 later=$2; shift 2; local chosen=()
  for v in "$@"; do
    if [ -z "$VARIANTS" ] || [[ " $VARIANTS " == *" ${v%%:*} "* ]]; then chosen+=("$v"); fi
  done
  [ ${#chosen[@]} -eq 0 ] && return
  # compile no new variant once the time for what follows is reached (the peer 90 s, the tests 120 s)
  local budget=$(( LIMIT - $(elapsed) - ${RESERVE:-210} - later ))
  echo "=== $group: ${#chosen[@]} steps ($(elapsed) s, compiling for at most ${budget} s)"
  (echo "=== $group: ${chosen[*]}"; timeout $(( budget + 150 )) $PY -m benchmarks.gpu.variants --config=$CONFIG \
    --set model.dtype=$DTYPE --set model.attention_impl=$ATTN "${VSHAPES[@]}" --steps=$STEPS --rounds=$ROUNDS \
    --budget_s=$budget --out=$OUT/bench.jsonl "${chosen[@]}" 2>&1) > /tmp/$group.log
  cat /tmp/$group.log >> $OUT/benches.log
  grep -A 20 "^variant " /tmp/$group.log || tail -n 5 /tmp/$group.log
}
variants xla_only ${LATER:-130} "${XLA_ONLY[@]}"
variants kernels 0 "${KERNELS[@]}"

# 3. the peer: the Flax WMT example's step and fxformer's, same process, packed batch
if [ -z "$SKIP_PEER" ]; then
  PEERSET=(); for s in "${VSHAPES[@]}"; do [ "$s" != "--set" ] && PEERSET+=(--set "$s"); done
  BENCH_TIMEOUT=${PEER_TIMEOUT:-150} bench peer "X=1" $PY -m benchmarks.gpu.peer --flax_wmt=.peer --config=$CONFIG --dtype=$DTYPE \
    --batch=packed --steps=$STEPS --rounds=$ROUNDS --json --set model.attention_impl=$ATTN "${PEERSET[@]}"
fi
[ -s $OUT/bench.jsonl ] && summary

# 4. the GPU tests, with the time left: the kernels' and the model's first
left=$(( LIMIT - $(elapsed) ))
echo "=== pytest with ${left} s left"
if [ $left -gt 45 ] && [ -z "$SKIP_TESTS" ]; then
  # -o addopts= : pyproject's -q would cancel -v, and -v names each test as it ends (a run cut off still says which failed)
  # tests/conftest.py keeps its compile flags (FAST_COMPILE) only where this jaxlib knows them: say which it is
  PYTHONPATH=tests:$PWD${PYTHONPATH:+:$PYTHONPATH} $PY -c "from conftest import FAST_COMPILE, xla_knows; \
print('XLA', 'knows' if xla_knows(FAST_COMPILE) else 'refuses (the tests go without)', 'the tests\' compile flags', FAST_COMPILE)"
  # SIGINT at the limit: pytest then prints its summary of the tests that ran (SIGTERM ends it silently)
  timeout -s INT -k 15 $left $PY -m pytest -o addopts= -v --tb=short -p no:cacheprovider -n ${WORKERS:-8} --dist loadfile -rfEs \
    ${TESTS:-tests/test_kernels.py tests/test_model.py tests/test_bench.py} > $OUT/pytest.log 2>&1
  echo "pytest rc $?"; [ -s $OUT/pytest.log ] || echo "pytest wrote nothing"; grep -E "passed|failed|error" $OUT/pytest.log | tail -n 2; grep -E "(FAILED|ERROR) " $OUT/pytest.log | head -n 20
fi
echo "=== end ($(elapsed) s); records in $OUT"
