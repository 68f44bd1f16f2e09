"""python -m experiments <verb> ...: launch runs and sweeps anywhere (local processes, a TPU pod, SLURM).

    launch   start one fxformer run: --backend=local|tpu|slurm, fxformer.train's flags after --
    setup    prepare the machines (tpu: code and virtual environment on every worker)
    logs     fetch and show a run's per-process logs
    stop     ask a run's processes to save and stop

    plan     a sweep's rows, commands and table, e.g. `plan table3 --profile=mini`
    run      run a sweep's rows (resumable): `run table3 --root=R --profile=mini [--only=A*,base] [--seeds=3]`
    status   per row and seed: state, step / total, attempts, ETA; the time the sweep has left
    collect  the results table beside the paper's (markdown, CSV, JSON), with mean, sd and paired differences
    plot     PNG figures of the results, with error bars
    restore  a sweep moved to a new machine: its finished runs from the committed records (no checkpoints)

    regime   two sweeps' records side by side: each row's change from its baseline in both, and how it moves
    freeze   the numbers an analysis plan freezes from its noise pilot's records (sd, seeds, margin, power)
    lr-split the regime table's learning-rate arm: C5's and D2's interaction split into its two parts

Running (launch, the backends, the sweep runner and its workers, status) is this package's top level;
analysing (records, statistics, the plans' verdicts, tables, figures, the regime comparison) is
experiments.analysis, fed by a records file and a sweep's description alone.

`python -m experiments <verb> --help` explains each. Imports no JAX: safe on a login or head node.
"""

from __future__ import annotations

import sys

from experiments import launch, runner
from experiments.analysis import freeze, lrsplit, regime
from fxformer import exitcodes
from fxformer.errors import UserError


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return exitcodes.OK if argv else exitcodes.USER_ERROR
    verb, rest = argv[0], argv[1:]
    analyses = {"regime": regime.main, "freeze": freeze.main, "lr-split": lrsplit.main}
    verbs = {**launch.VERBS, **runner.VERBS, **analyses}
    if verb not in verbs:
        print(f"error: unknown verb '{verb}'; choose one of {', '.join(verbs)}.", file=sys.stderr)
        return exitcodes.USER_ERROR
    try:
        if verb in analyses:
            return verbs[verb](rest)
        return launch.main(verb, rest) if verb in launch.VERBS else runner.main(verb, rest)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return exitcodes.USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
