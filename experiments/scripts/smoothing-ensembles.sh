#!/usr/bin/env bash
# Smoothed weights beside checkpoint averaging, and a two-seed ensemble beside its seeds, each
# compared on the test split with sacreBLEU's paired tests (experiments/results/smoothing/README.md).
#
#   nohup experiments/scripts/smoothing-ensembles.sh > /tmp/smoothing.log 2>&1 &
#
# Resumable: a finished training run is only resumed (it ends at once), an evaluation is made
# again (minutes). Workdirs go under $ROOT (default /tmp/smoothing); the small records (each
# evaluation's JSON, the comparisons' JSON and tables) are copied to experiments/results/smoothing/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=${ROOT:-/tmp/smoothing}
OUT=experiments/results/smoothing
PY=${PY:-$PWD/.venv/bin/python}
export PYTHONPATH=$PWD  # the compare commands run inside the eval folders, so that systems are named by file
OUT=$PWD/$OUT
mkdir -p "$ROOT" "$OUT"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

# 1. The quick start's config (configs/default.py, 600 steps), three decays kept in the same run,
#    a checkpoint every 100 steps so that the last five can be averaged.
QS=$ROOT/quickstart
stamp "train $QS"
$PY -m fxformer.train --config=configs/default.py --workdir="$QS" \
    --config.ema_decay=0.999,0.995,0.99 --config.checkpoint_every_steps=100 --config.checkpoint_every_minutes=0
for choice in "--step=latest --average_last=1" "--step=latest --average_last=5" --step=ema0.999 --step=ema0.995 --step=ema0.99; do
    stamp "evaluate $QS $choice"
    # shellcheck disable=SC2086  # two flags in one word
    $PY -m fxformer.evaluate --workdir="$QS" $choice --split=test
done
E=$QS/eval
stamp "compare (quick start)"
(cd "$E" && $PY -m fxformer.compare --references=test-600.ref.txt test-600.hyp.txt test-600-avg5.hyp.txt \
    test-600-ema0.999.hyp.txt test-600-ema0.995.hyp.txt test-600-ema0.99.hyp.txt \
    --out="$OUT/quickstart-vs-last.json") | tee "$OUT/quickstart-vs-last.txt"
(cd "$E" && $PY -m fxformer.compare --references=test-600.ref.txt test-600-avg5.hyp.txt \
    test-600-ema0.999.hyp.txt test-600-ema0.995.hyp.txt test-600-ema0.99.hyp.txt \
    --out="$OUT/quickstart-vs-avg5.json") | tee "$OUT/quickstart-vs-avg5.txt"
mkdir -p "$OUT/quickstart"
cp "$E"/test-*.json "$OUT/quickstart/"

# 2. Table 3's mini profile, base, seeds 0 and 1 (one per core), each alone and as an ensemble.
MINI=$ROOT/mini
for seed in 0 1; do
    stamp "train $MINI/base-s$seed"
    taskset -c "$seed" $PY -m fxformer.train --config=configs/table3.py:base,mini --workdir="$MINI/base-s$seed" \
        --config.seed="$seed" > "$ROOT/mini-s$seed.log" 2>&1 &
done
wait
for seed in 0 1; do
    stamp "evaluate $MINI/base-s$seed"
    $PY -m fxformer.evaluate --workdir="$MINI/base-s$seed" --split=test
done
stamp "evaluate the ensemble"
$PY -m fxformer.evaluate --workdir="$MINI/base-s0" --workdir="$MINI/base-s1" --split=test
M=$MINI/base-s0/eval
last=$(cd "$M" && ls test-[0-9]*.hyp.txt | grep -v ensemble | head -1)
both=$(cd "$M" && ls test-ensemble-*.hyp.txt | head -1)
other=$(cd "$MINI/base-s1/eval" && ls test-[0-9]*.hyp.txt | head -1)
cp "$MINI/base-s1/eval/$other" "$M/s1-$other"  # beside the others, named apart
stamp "compare (mini)"
(cd "$M" && $PY -m fxformer.compare --references="${last%.hyp.txt}.ref.txt" "$both" "$last" "s1-$other" \
    --out="$OUT/mini-ensemble.json") | tee "$OUT/mini-ensemble.txt"
mkdir -p "$OUT/mini"
cp "$M"/test-*.json "$OUT/mini/"
cp "$MINI/base-s1/eval"/test-*.json "$OUT/mini/s1-$(cd "$MINI/base-s1/eval" && ls test-*.json | head -1)"
stamp "done"
