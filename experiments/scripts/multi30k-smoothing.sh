#!/usr/bin/env bash
# Smoothed weights on the Multi30k recipe (configs/multi30k.py, seed 0, its 115-minute budget),
# three decays kept in the one run, beside its last checkpoint and the recipe's average of the last
# five, compared on test2016 with sacreBLEU's paired tests (experiments/results/smoothing/README.md).
#
#   nohup experiments/scripts/multi30k-smoothing.sh /tmp/m30k/data > /tmp/m30k-smoothing.log 2>&1 &
#
# $1: the folder holding task1/raw of github.com/multi30k/dataset. Resumable: an interrupted
# training resumes from its last checkpoint (with a fresh time budget: train_minutes counts one
# attempt), evaluations are made again. The workdir goes under $ROOT (default /tmp/smoothing); the
# small records (evaluations' JSON, the comparisons' JSON and tables) to
# experiments/results/smoothing/multi30k/.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:?the Multi30k folder (task1/raw)}
ROOT=${ROOT:-/tmp/smoothing}
PY=${PY:-$PWD/.venv/bin/python}
export PYTHONPATH=$PWD
OUT=$PWD/experiments/results/smoothing/multi30k
W=$ROOT/multi30k-s0
mkdir -p "$ROOT" "$OUT"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

stamp "prepare"
$PY -m fxformer.data --config=configs/multi30k.py:"$DATA"
stamp "train $W"
set +e
$PY -m fxformer.train --config=configs/multi30k.py:"$DATA" --workdir="$W" --config.ema_decay=0.9999,0.999,0.995 \
    2>&1 | tee -a "$ROOT/multi30k-train.log"
rc=${PIPESTATUS[0]}
set -e
stamp "train ended with $rc"
# finished: its last step (0), or its time budget (75 after "time budget"); another stop (75) resumes next time
if [ "$rc" != 0 ] && ! { [ "$rc" = 75 ] && tail -5 "$ROOT/multi30k-train.log" | grep -q "time budget"; }; then
    exit "$rc"
fi

E=$ROOT/multi30k-eval
rm -rf "$E" && mkdir -p "$E"
for system in last avg5 ema0.9999 ema0.999 ema0.995; do
    case $system in
        last) choice=(--step=latest --average_last=1) ;;
        avg5) choice=(--step=latest --average_last=5) ;;
        *) choice=(--step="$system") ;;
    esac
    stamp "evaluate $system"
    $PY -m fxformer.evaluate --workdir="$W" "${choice[@]}" --split=test --out="$E/$system"
    cp "$E/$system"/test-*.hyp.txt "$E/$system.hyp.txt"
    cp "$E/$system"/test-*.ref.txt "$E/reference.txt"
    cp "$E/$system"/test-*.json "$OUT/test-$system.json"
done
stamp "compare"
(cd "$E" && $PY -m fxformer.compare --references=reference.txt last.hyp.txt avg5.hyp.txt ema0.9999.hyp.txt \
    ema0.999.hyp.txt ema0.995.hyp.txt --out="$OUT/vs-last.json") | tee "$OUT/vs-last.txt"
(cd "$E" && $PY -m fxformer.compare --references=reference.txt avg5.hyp.txt ema0.9999.hyp.txt ema0.999.hyp.txt \
    ema0.995.hyp.txt --out="$OUT/vs-avg5.json") | tee "$OUT/vs-avg5.txt"
cp "$W"/metrics.jsonl "$W"/run.json "$W"/config.json "$OUT/"
stamp "done"
