#!/bin/bash
# The regime table's runs after its PLAN.md amendment (experiments/results/table3-regime/PLAN.md):
# a queue of (arm, row, seed) in the amendment's order, two runs side by side (one XLA thread each),
# trained by a pinned checkout of the code so that later changes to the tree do not reach them.
#   arm full: the rows, into ROOT (records: experiments/results/table3-regime/)
#   arm lr2:  the learning-rate arm (profile multi30k-full-lr2), into ROOT-lr2 (records: .../lr2/)
# Each finished run's records are committed as it finishes, from the checkout this script is in.
# Resumable: run it again. On a new machine the finished runs of the committed records are restored
# first; a finished run is skipped, a stopped one resumes from its checkpoint. A run is started only
# if it can end before DEADLINE (seconds since the epoch), EST seconds being a base-sized run's length
# (C5, twice base's width, about 1.8 times as long: 0.93 steps a second against base's 1.6, two side by side;
# A4, 32 heads of d_k 2, about 1.5 times: 1.1 steps a second).
# Usage: regime-runs.sh PINNED [ROOT=/tmp/t3full/root] [MULTI30K=/tmp/m30k] [DEADLINE=never] [EST=3600]
#   git worktree add --detach /tmp/pin <commit>; ln -s "$PWD/.venv" /tmp/pin/.venv
#   setsid nohup experiments/scripts/regime-runs.sh /tmp/pin /tmp/t3full/root /tmp/m30k $(date -d '+2 hours' +%s) &
set -u
PIN=$(cd "$1" && pwd); ROOT=${2:-/tmp/t3full/root}; DATA=${3:-/tmp/m30k}; DEADLINE=${4:-0}; EST=${5:-3600}
REPO=$(cd "$(dirname "$0")/../.." && pwd); RESULTS=$REPO/experiments/results/table3-regime
QUEUE=(
  "full A1 0" "full A1 1" "full A1 2" "full base 9" "full A2 0" "full A2 1" "full A2 2"
  "full A3 0" "full A3 1" "full A3 2" "full base 10" "full E 0" "full E 1" "full E 2"
  "lr2 base 0" "lr2 base 1" "lr2 base 2" "lr2 C5 0" "lr2 C5 1" "lr2 C5 2" "lr2 D2 0" "lr2 D2 1" "lr2 D2 2"
  "full B1 0" "full B1 1" "full B1 2" "full base 11" "full B2 0" "full B2 1" "full B2 2"
  "full A4 0" "full A4 1" "full A4 2" "full D4 0" "full D4 1" "full D4 2" "full base 12"
  "full C2 0" "full C2 1" "full C2 2" "full C4 0" "full C4 1" "full C4 2" "full base 13"
  "full C6 0" "full C6 1" "full C6 2"
)
export XLA_FLAGS="${XLA_FLAGS:-} --xla_cpu_multi_thread_eigen=false"  # one thread a run, as the 30 runs
# the records' runs read MULTI30K/data/task1/raw (a clone of github.com/multi30k/dataset): a config that
# resolves to other paths is refused as a changed config, so the files must be there and only there
if [ ! -e "$DATA/data/task1/raw/train.en.gz" ] || [ -e "$DATA/task1/raw" ]; then
  echo "regime-runs.sh: put the Multi30k files in $DATA/data/task1/raw (a clone of multi30k/dataset), and nothing in $DATA/task1/raw" >&2
  exit 2
fi
cd "$PIN" || exit 1
arm() {  # arm -> "root profile records"
  case $1 in
    full) echo "$ROOT multi30k-full:$DATA $RESULTS/records.jsonl.gz" ;;
    lr2) echo "$ROOT-lr2 multi30k-full-lr2:$DATA $RESULTS/lr2/records.jsonl.gz" ;;
  esac
}
forget_seeds() {  # the root remembers the last --seeds; collect must see the sweep's own counts
  [ -e "$1/sweep-root.json" ] && .venv/bin/python -c "
import json, sys; p = sys.argv[1]; r = json.load(open(p)); r.pop('seeds', None); json.dump(r, open(p, 'w'), indent=2)" "$1/sweep-root.json"
}
pinned_copy() {  # records -> copy: each run's config as the pinned code reads it. `collect` records a config
  # as the collecting code reads it, so records collected by newer code hold fields the pinned code refuses;
  # the copy drops those, each at today's default (experiments.analysis.records.downgraded)
  local known; known=$(.venv/bin/python -c "import json; from fxformer import schema; print(json.dumps(schema.defaults().to_dict()))")
  (cd "$REPO" && .venv/bin/python -c "import json, sys; from experiments.analysis import records
records.write(sys.argv[2], records.downgraded(records.read(sys.argv[1]), json.loads(sys.argv[3])))" "$1" "$2" "$known")
}
for a in full lr2; do  # a new machine: the finished runs of the committed records, not trained again
  read -r root profile records <<< "$(arm $a)"
  if [ -e "$records" ]; then
    mkdir -p "$(dirname "$root")"; pinned_copy "$records" "$root.records.jsonl.gz" || exit 1
    .venv/bin/python -m experiments restore table3 --from_records="$root.records.jsonl.gz" --root="$root" --seeds=14
  fi
  forget_seeds "$root"
done
LOCK="$ROOT.queue.lock"; NEXT="$ROOT.queue.next"; echo 0 > "$NEXT"
worker() {  # its own open file of LOCK (fd 9): flock excludes other processes' opens, not a shared one
  exec 9> "$LOCK"
  while true; do
    flock 9; i=$(cat "$NEXT"); echo $((i + 1)) > "$NEXT"; flock -u 9
    [ "$i" -lt ${#QUEUE[@]} ] || return 0
    read -r a row seed <<< "${QUEUE[$i]}"; read -r root profile _ <<< "$(arm "$a")"
    dir=$root/$row; [ "$seed" = 0 ] || dir=$root/$row.s$seed  # the run directory `run` names
    if grep -qs '"finished"' "$dir/sweep.json"; then  # finished (or restored): no start, no wait
      echo "$(date -u +%H:%M) worker $1: $a $row seed $seed: finished"; continue
    fi
    case $row in C5) length=$((EST * 18 / 10)) ;; A4) length=$((EST * 15 / 10)) ;; *) length=$EST ;; esac
    if [ "$DEADLINE" != 0 ] && [ $(( $(date +%s) + length )) -gt "$DEADLINE" ]; then
      echo "$(date -u +%H:%M) worker $1: $a $row seed $seed not started: it would end after the deadline"; return 0
    fi
    echo "$(date -u +%H:%M) worker $1: $a $row seed $seed"
    # `run --seeds=N` writes N into the root's record as it starts; under the lock until it is taken
    # out again, so that a collection (`land`, which takes the lock) never sees it
    flock 9
    .venv/bin/python -m experiments run table3 --root="$root" --profile="$profile" --only="$row" --seeds=$((seed + 1)) --parallel=1 &
    pid=$!; sleep 30; forget_seeds "$root"; flock -u 9
    wait $pid; rc=$?; echo "$(date -u +%H:%M) worker $1: $a $row seed $seed: exited $rc"
  done
}
running() { for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }  # any of these PIDs
finished() { grep -l '"finished"' "$1"/*/sweep.json 2>/dev/null | wc -l; }
land() {  # every 5 minutes: where more runs have finished, collect the arm's records in the checkout this script
  # is in (its code), rewrite the figures (regime.md, the learning-rate arm's split.md), and commit those folders alone
  exec 9> "$LOCK"
  local repo alive=1; repo=$(git -C "$(dirname "$RESULTS")" rev-parse --show-toplevel)
  declare -A seen=([full]=$(finished "$ROOT") [lr2]=$(finished "$ROOT-lr2"))
  while [ $alive = 1 ]; do
    for _ in $(seq 30); do running "$@" || { alive=0; break; }; sleep 10; done  # 5 minutes, or the end
    for a in full lr2; do
      read -r root _ records <<< "$(arm $a)"; out=$(dirname "$records"); n=$(finished "$root")
      [ "$n" != "${seen[$a]}" ] || continue
      flock 9; forget_seeds "$root"
      (cd "$repo" && nice .venv/bin/python -m experiments collect table3 --root="$root" --out="$out" \
        && nice .venv/bin/python -m experiments plot table3 --from_records="$records" --out="$out" \
        && { [ $a != full ] || nice .venv/bin/python -m experiments regime \
             experiments/results/table3-multi30k/records.jsonl.gz "$records"; } \
        && nice .venv/bin/python -m experiments lr-split experiments/results/table3-multi30k/records.jsonl.gz \
             "$RESULTS/records.jsonl.gz" "$RESULTS/lr2/records.jsonl.gz" \
        && git add -- "$out" "$RESULTS/lr2" && { git diff --cached --quiet -- "$out" "$RESULTS/lr2" \
             || git commit -q -m "results/table3-regime: records of $n finished runs ($a)" -- "$out" "$RESULTS/lr2"; } \
        && echo "$(date -u +%H:%M) land $a: $n finished runs landed") > /tmp/regime-land.log 2>&1 \
        || echo "$(date -u +%H:%M) land $a: collect failed (/tmp/regime-land.log)"
      flock -u 9; seen[$a]=$n
    done
  done
}
worker 1 & first=$!; sleep 90; worker 2 & second=$!
land $first $second & wait
