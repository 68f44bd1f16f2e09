#!/bin/bash
# P5: the frozen Multi30k recipe re-run (seed 0, then seed 1) with the README's commands on a fresh
# clone + fresh venv; alpha chosen on val by the rule committed in 7d6f1e9; test2016 decoded once per seed.
# Records: experiments/results/multi30k/P5-s0, P5-s1. Usage: multi30k-p5.sh [OUT=/tmp/p5] [MULTI30K=/tmp/m30k]
# (clones the checkout this script is in)
set -u
P=${1:-/tmp/p5}; C=$P/fxformer; REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel); DATA=${2:-/tmp/m30k}
mkdir -p $P
t() { date -u +%T; }
echo "clone start $(t)"
rm -rf $C && git clone -q $REPO $C && cd $C && git log -1 --format='commit %H' 
python3 -m venv .venv && .venv/bin/pip install -q -r requirements.txt > $P/pip.log 2>&1
echo "venv done $(t)"
.venv/bin/python -m fxformer.data --config=configs/multi30k.py:$DATA > $P/data.log 2>&1
echo "data done $(t) rc $?"
ev() {  # seed, name, split, evaluate flags
  local sd=$1 name=$2 split=$3; shift 3; local s=$(date +%s) W=runs/multi30k-s$sd R=$P/s$sd
  mkdir -p $R
  .venv/bin/python -m fxformer.evaluate --workdir=$W --split=$split "$@" > $P/ev-s$sd-$name.log 2>&1
  local rc=$? j=$(ls -t $W/eval/$split-*.json | head -1)
  cp $j $R/$name.json
  echo "s$sd $name rc=$rc $(( $(date +%s) - s ))s $(.venv/bin/python -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['bleu'], j['bleu_lc'], j['chrf'], j['checkpoint_steps'], j['sacrebleu'])" $R/$name.json)" >> $P/summary.txt
}
train() {  # seed, extra flags
  local sd=$1; shift; local s=$(date +%s)
  echo "train s$sd start $(t)"
  .venv/bin/python -m fxformer.train --config=configs/multi30k.py:$DATA --workdir=runs/multi30k-s$sd "$@" > $P/train-s$sd.log 2>&1
  echo "train s$sd rc $? end $(t) wall $(( $(date +%s) - s ))s" | tee -a $P/summary.txt
}
train 0
for a in 0.6 1.0 1.5 2.0; do ev 0 val-a$a validation --config.decode.alpha=$a; done
A=$(.venv/bin/python - <<PY
import json
b = {a: json.load(open(f'$P/s0/val-a{a}.json'))['bleu'] for a in ('0.6', '1.0', '1.5', '2.0')}
best = max(b, key=b.get)
print(best if b[best] >= b['1.0'] + 0.2 else '1.0')
PY
)
echo "chosen alpha $A $(t)" | tee -a $P/summary.txt
ev 0 test-a$A test --config.decode.alpha=$A
train 1 --config.seed=1 --config.data.shuffle_seed=1
ev 1 val-a$A validation --config.decode.alpha=$A
ev 1 test-a$A test --config.decode.alpha=$A
echo "done $(t)"
