#!/bin/bash
# The regime table's first 30 runs (experiments/results/table3-regime/PLAN.md), resumable: run it again after an interruption; `experiments run` skips
# finished runs and resumes a stopped one from its checkpoint. Alone on the 2-core CPU, two runs side
# by side; each finished run's records are committed as they land (land.sh, beside this script).
# The runs after PLAN.md's amendment are regime-runs.sh's.
#   regime-sweep.sh pilot   base seeds 0-3 (the noise pilot), records into experiments/results/table3-regime/pilot
#   regime-sweep.sh sweep   the rows of PLAN.md (base's 9 seeds, 3 of each other row) in its order, records
#                  into experiments/results/table3-regime: two rows a call (seed by seed within it), so that two runs
#                  always share the cores and each call ends with its rows complete; big, a row
#                  alone, runs its three seeds at once (two side by side would leave the third
#                  alone on one core for half the row's time); with each landing, the figures
#                  and regime.md: the rows set against the 6,000-pair table
# On a new machine it first restores the finished runs of the committed records into ROOT
# (`experiments restore`; a run directory already there is left as it is).
# Usage: regime-sweep.sh pilot|sweep [ROOT=/tmp/t3full/root] [MULTI30K=/tmp/m30k]
set -u
STAGE=$1; ROOT=${2:-/tmp/t3full/root}; DATA=${3:-/tmp/m30k}
cd "$(dirname "$0")/../.." || exit 1
PROFILE=multi30k-full:$DATA
# Two runs share the two cores: each XLA computation on one thread. Measured on a 2-core machine
# (base of this profile, fxformer.bench, 25 steps): two processes at once 600-680 ms a step with
# XLA's thread pool, 566-572 ms with one thread each; the losses of 30 training steps are
# bit-identical either way, so the records do not depend on it.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_cpu_multi_thread_eigen=false"
case $STAGE in
  pilot) CALLS=("--only=base --seeds=4"); OUT=experiments/results/table3-regime/pilot ;;
  sweep) CALLS=(--only=base,D1 --only=D2,D3 --only=C1,C3 --only=C7,C5 "--only=big --parallel=3"); OUT=experiments/results/table3-regime ;;
  *) echo "usage: regime-sweep.sh pilot|sweep [ROOT] [MULTI30K]" >&2; exit 2 ;;
esac
.venv/bin/python -m fxformer.data --config=configs/table3.py:base,$PROFILE > /tmp/t3full-data.log 2>&1 || exit 1
restore() {  # a new machine (an empty ROOT): the finished runs of committed records, so that they are not trained again
  [ ! -e "$1" ] || .venv/bin/python -m experiments restore table3 --from_records="$1" --root="$ROOT" || exit 1
}
restore experiments/results/table3-regime/pilot/records.jsonl.gz
if [ "$STAGE" = sweep ] && [ -e "$ROOT/sweep-root.json" ]; then  # the pilot's --seeds=4 is remembered by the root:
  .venv/bin/python - "$ROOT/sweep-root.json" <<'PY'  # drop it, so that every row gets the sweep's own count
import json, sys
record = json.load(open(sys.argv[1])); record.pop("seeds", None); json.dump(record, open(sys.argv[1], "w"), indent=2)
PY
fi
[ "$STAGE" = pilot ] || restore "$OUT/records.jsonl.gz"
for call in "${CALLS[@]}"; do
  # shellcheck disable=SC2086  # a call is its flags, split on spaces
  .venv/bin/python -m experiments run table3 --root=$ROOT --profile=$PROFILE --parallel=2 $call &  # a call's own --parallel wins
  PID=$!
  # with each landing: the figures, and the rows set against the 6,000-pair table's (regime.md)
  THEN=(bash -c ".venv/bin/python -m experiments plot table3 --from_records=$OUT/records.jsonl.gz --out=$OUT")
  [ "$STAGE" = pilot ] || THEN[2]+=" && .venv/bin/python -m experiments regime experiments/results/table3-multi30k/records.jsonl.gz $OUT/records.jsonl.gz"
  bash experiments/scripts/land.sh $ROOT $OUT $PID "${THEN[@]}" &
  wait $PID; rc=$?
  wait
  echo "regime-sweep.sh $STAGE: experiments run $call exited $rc"
  [ $rc = 0 ] || exit $rc
done
