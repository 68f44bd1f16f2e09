#!/bin/bash
# land.sh ROOT OUT PID [THEN...]: a sweep's records committed as its runs finish. Every 5 minutes while
# the sweep's process PID lives (and once, within 10 s, after it ends), if more runs have finished since the last
# look: `python -m experiments collect table3 --root=ROOT --out=OUT` with the code of the checkout this
# script is in (OUT relative to it), then the command THEN if given (what else in OUT is computed from the
# records), and a commit of OUT alone ("records of N finished runs"), so that a new machine loses only the
# runs in flight. The 6,000-pair table (experiments/results/table3-multi30k) and the regime table's first
# 30 runs landed this way.
#   PID=$(pgrep -f "experiments run table3" | head -1)
#   nohup experiments/scripts/land.sh /tmp/t3s/root experiments/results/table3-multi30k $PID &
ROOT=$1; OUT=$2; PID=$3; shift 3; THEN=("$@")
cd "$(dirname "$0")/../.." || exit 1
then_() { [ ${#THEN[@]} = 0 ] || nice -n 19 "${THEN[@]}" >> /tmp/land-collect.log 2>&1; }
finished() { grep -l '"finished"' $ROOT/*/*/sweep.json $ROOT/*/sweep.json 2>/dev/null | wc -l; }
last=$(finished)
while true; do
  alive=1; kill -0 $PID 2>/dev/null || alive=0
  n=$(finished)
  if [ "$n" != "$last" ]; then
    nice -n 19 .venv/bin/python -m experiments collect table3 --root=$ROOT --out=$OUT > /tmp/land-collect.log 2>&1 \
      && then_ && git add -- $OUT && git commit -q -m "$(basename $(dirname $OUT))/$(basename $OUT): records of $n finished runs (collected as they land)" -- $OUT \
      && echo "$(date -u +%H:%M) landed $n"
    last=$n
  fi
  [ $alive = 0 ] && break
  for _ in $(seq 30); do kill -0 $PID 2>/dev/null || break; sleep 10; done  # 5 minutes, or until PID ends
done
