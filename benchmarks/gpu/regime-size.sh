#!/bin/bash
# Sizing the Table 3 regime sweep (experiments/results/table3-regime/PLAN.md) for a GPU machine. A
# model this small (0.6M parameters, 32 rows of 64 tokens) is dispatch-bound on one GPU, so how many
# runs share the device decides the sweep's wall time. Base of the multi30k-full profile, STEPS steps
# a run (default 500: two dev evaluations), at --parallel P for each P of PARALLEL (default 1 4 8 16):
# P seeds at once, each P in its own root, one after another. Per P it prints and writes to
# $OUT/size.jsonl: each run's training pace (steps/s over its last logged interval, after compiling),
# their sum, the call's wall time (start, compile and the final evaluation with beam search included),
# and what the profile's 66 runs would take at that pace (63 runs of 5,300 steps and big's 3 of 15,900,
# all at base's pace: a lower bound for big).
#
# On the device machine, from the repository root, carrying .whl (benchmarks/gpu/wheels.txt) and
# .m30k (Multi30k's data/task1/raw/*.gz, as in docs/data.md):
#   LIMIT=540 bash benchmarks/gpu/regime-size.sh
# Rehearsal on a CPU (nothing installed; two cores):
#   CPU=1 STEPS=20 PARALLEL="1 2" OUT=/tmp/size M30K=/tmp/m30k bash benchmarks/gpu/regime-size.sh
# Environment: LIMIT (s), STEPS, PARALLEL, M30K (the Multi30k folder, default .m30k).
LIMIT=${LIMIT:-540} STEPS=${STEPS:-500} PARALLEL=${PARALLEL:-1 4 8 16}
export OUT=${OUT:-experiments/results/gpu/regime-size-$(date -u +%F)}
mkdir -p "$OUT"
if [ -n "$CPU" ]; then
  export SKIP_INSTALL=1 JAX_PLATFORMS=cpu PY=${PY:-.venv/bin/python}
else
  export PY=python3
fi
source benchmarks/gpu/lib.sh  # installs the wheels (not with SKIP_INSTALL), prints the machine
M30K=$(cd "${M30K:-.m30k}" && pwd) || { echo "no Multi30k folder: put data/task1/raw/*.gz under .m30k (docs/data.md)"; exit 1; }
PROFILE=multi30k-full:$M30K
elapsed() { echo $(( $(date +%s) - start )); }

# the profile's data once (sentencepiece and the TFDS files), shared by every run
$PY -m fxformer.data --config=configs/table3.py:base,$PROFILE > $OUT/data.log 2>&1 || { tail -n 5 $OUT/data.log; exit 1; }
echo "=== data ready ($(elapsed) s)"

for P in $PARALLEL; do
  left=$(( LIMIT - $(elapsed) ))
  [ $left -gt 60 ] || { echo "=== P=$P: skipped, ${left} s left"; continue; }
  ROOT=/tmp/size/p$P; rm -rf $ROOT
  t0=$(date +%s)
  timeout -s TERM $(( left - 20 )) $PY -m experiments run table3 --root=$ROOT --profile=$PROFILE --only=base \
    --seeds=$P --parallel=$P -- --config.num_train_steps=$STEPS > $OUT/p$P.log 2>&1
  rc=$?; wall=$(( $(date +%s) - t0 ))
  $PY - "$ROOT" "$P" "$STEPS" "$wall" "$rc" <<'PY' | tee -a $OUT/size.jsonl
import glob, json, re, sys
root, p, steps, wall, rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
rates = []
for log in sorted(glob.glob(f"{root}/*/logs/process_0/worker.log")):
    found = re.findall(r"step (\d+)/\d+ .*?\| ([\d.]+) steps/s", open(log).read())
    if found:
        rates.append(float(found[-1][1]))
each = sum(rates) / len(rates) if rates else None
overhead = wall - steps / each if each else None  # start, compile, evaluations: per run, paid once
runs, table_steps = 66, 63 * 5300 + 3 * 15_900
hours = (table_steps / each + runs * overhead) / min(p, runs) / 3600 if each else None
print(json.dumps({"parallel": p, "steps": steps, "rc": rc, "wall_s": wall, "runs_logged": len(rates),
                  "steps_per_s_each": each, "steps_per_s_all": sum(rates), "overhead_s": overhead,
                  "table_hours": hours}))
PY
done
echo "=== summary"
$PY - <<'PY'
import json, os
for line in open(os.environ["OUT"] + "/size.jsonl"):
    r = json.loads(line)
    if r["steps_per_s_each"] is None:
        print(f"P={r['parallel']:2}: no pace logged (rc {r['rc']}, {r['wall_s']:.0f} s)"); continue
    print(f"P={r['parallel']:2}: {r['steps_per_s_each']:6.1f} steps/s a run, {r['steps_per_s_all']:7.1f} in all; "
          f"{r['overhead_s']:5.0f} s a run besides training; the table's 66 runs: about {r['table_hours']:.1f} h")
PY
echo "=== end ($(elapsed) s); records in $OUT"
