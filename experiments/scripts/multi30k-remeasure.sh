#!/bin/bash
# The frozen Multi30k recipe re-measured after the packing fix (c79baff) and the resume fixes: the
# README's commands on a fresh clone + fresh venv, seeds 0 and 1, alone on the 2-core CPU; val and
# test2016 decoded once each with the recipe's evaluation (configs/multi30k.py: last 5 averaged,
# beam 4, alpha 1.5). Nothing is chosen here. Records: experiments/results/multi30k/remeasure/.
# Usage: multi30k-remeasure.sh [OUT=/tmp/rm31] [MULTI30K=/tmp/m30k]  (clones the checkout this script is in)
# Resumable: run it again after an interruption; the clone, finished trainings and evaluations are
# kept, and an interrupted training resumes from its last checkpoint (metrics' wall_s counts training only).
set -u
P=${1:-/tmp/rm31}; C=$P/fxformer; REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel); DATA=${2:-/tmp/m30k}
mkdir -p $P
t() { date -u +%T; }
if [ ! -e $P/setup.done ]; then
  echo "clone start $(t)"
  rm -rf $C && git clone -q $REPO $C && cd $C && git log -1 --format='commit %H' | tee $P/commit.txt
  python3 -m venv .venv && .venv/bin/pip install -q -r requirements.txt > $P/pip.log 2>&1 && touch $P/setup.done
  echo "venv done $(t)"
fi
cd $C || exit 1
.venv/bin/python -m fxformer.data --config=configs/multi30k.py:$DATA > $P/data.log 2>&1
echo "data done $(t) rc $?"
ev() {  # seed, split
  local sd=$1 split=$2 s=$(date +%s) W=runs/multi30k-s$1 R=$P/s$1
  mkdir -p $R
  [ -e $R/$split.json ] && return 0
  .venv/bin/python -m fxformer.evaluate --workdir=$W --split=$split > $P/ev-s$sd-$split.log 2>&1
  local rc=$? j=$(ls -t $W/eval/$split-*.json | head -1)
  cp $j $R/$split.json; cp ${j%.json}.hyp.txt $R/$split.hyp.txt 2>/dev/null
  echo "s$sd $split rc=$rc $(( $(date +%s) - s ))s $(.venv/bin/python -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['bleu'], j['bleu_lc'], j['chrf'], j.get('ppl'), j['checkpoint_steps'], j['sacrebleu'])" $R/$split.json)" | tee -a $P/summary.txt
}
train() {  # seed, extra flags
  local sd=$1; shift; local s=$(date +%s)
  [ -e $P/s$sd/trained ] && return 0
  echo "train s$sd start $(t)"
  .venv/bin/python -m fxformer.train --config=configs/multi30k.py:$DATA --workdir=runs/multi30k-s$sd "$@" >> $P/train-s$sd.log 2>&1
  local rc=$?
  echo "train s$sd rc $rc end $(t) wall $(( $(date +%s) - s ))s" | tee -a $P/summary.txt
  mkdir -p $P/s$sd && cp runs/multi30k-s$sd/metrics.jsonl runs/multi30k-s$sd/config.json runs/multi30k-s$sd/run.json $P/s$sd/
  # trained: the last step (0), or the 115-minute budget (75 after "time budget"); a signal's 75 resumes next time
  if [ $rc = 0 ] || { [ $rc = 75 ] && tail -5 $P/train-s$sd.log | grep -q "time budget"; }; then touch $P/s$sd/trained; fi
  [ -e $P/s$sd/trained ]
}
train 0 || exit 1
ev 0 validation; ev 0 test
train 1 --config.seed=1 --config.data.shuffle_seed=1 || exit 1
ev 1 validation; ev 1 test
echo "done $(t)"
