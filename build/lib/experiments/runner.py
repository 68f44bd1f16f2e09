"""Run a sweep: plan it, run every row (resumably, on any backend), show where it stands.

    python -m experiments plan   table3 --profile=mini
    python -m experiments run    table3 --root=runs/table3-mini --profile=mini
    python -m experiments status table3 --root=runs/table3-mini
    python -m experiments run    table3 --root=gs://bucket/table3 --backend=tpu --tpu=my-v4-32 --zone=us-central2-b

Each row trains in `R/<row>` (its fxformer workdir, never date-stamped), then is evaluated the
sweep's way. `run` is safe to repeat: finished rows are skipped, stopped rows resume from
their checkpoints, trained rows are only evaluated, failed rows are retried up to
--max_attempts, rows another launcher holds are left alone, and a row whose resolved config
changed since it started is refused (--move_changed moves the old run aside). Flags after --
go to every row's fxformer.train (e.g. --config.data.tfds_data_dir=gs://bucket/tfds) and are
remembered in R/sweep.json, with the profile.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import time
from pathlib import Path

from experiments import launch, rowstate
from experiments import sweep as sweeps
from experiments.group import LaunchError, say
from experiments.worker import flag_value, split_at_dashes
from fxformer import exitcodes, paths
from fxformer.metrics import duration

VERBS = {
    "plan": "show the rows, the command each runs and the table in the paper's layout; runs nothing",
    "run": "train and evaluate every row not finished yet (resumable, safe to repeat)",
    "status": "per row: state, step / total, attempts, ETA of running rows",
    "collect": "the results table beside the reference (markdown, CSV, JSON) in R/results",
    "plot": "PNG figures of the results in R/results (matplotlib)",
}


def parser(verb: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m experiments {verb}",
        description=f"{VERBS[verb]}.\n\n{__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Everything after -- is passed to every row's fxformer.train.",
    )
    p.add_argument("sweep", help="a sweep: table3 (configs/table3.py), or a config file with sweep(profile)")
    p.add_argument("--root", default="", help="the sweep's directory, a path or URL (default: runs/<sweep>-<profile>)")
    p.add_argument("--profile", default="", help="paper, mini or smoke for table3 (default: the root's, else paper)")
    p.add_argument("--only", default="", help="rows to act on: names or patterns, comma-separated (A*,base)")
    p.add_argument("--max_attempts", type=int, default=3, help="tries per row before it counts as failed (3)")
    p.add_argument("--retry_failed", action="store_true", help="try rows that failed --max_attempts times again")
    p.add_argument("--move_changed", action="store_true", help="move runs with a changed config aside, start over")
    p.add_argument("--lease_s", type=float, default=rowstate.DEFAULT_LEASE_S,
                   help="a row whose owner's heartbeat is older than this is taken over (300)")  # fmt: skip
    p.add_argument("--out", default="", help="collect, plot: where the files go (default: R/results)")
    launch.add_backend_flags(p)
    return p


class Context:
    """A sweep, its root and the per-row flags, as the verbs see them."""

    def __init__(self, args: argparse.Namespace, extra: list[str]):
        root_file = None
        if args.root:
            root_file = paths.as_path(args.root) / "sweep.json"
        recorded = json.loads(root_file.read_text()) if root_file is not None and root_file.exists() else {}
        if recorded and args.profile and args.profile != recorded["profile"]:
            raise LaunchError(
                f"{args.root} holds the {recorded['profile']} profile of {recorded['sweep']}; "
                f"give another --root for --profile={args.profile}."
            )
        self.profile = args.profile or recorded.get("profile") or "paper"
        self.sweep = sweeps.load(args.sweep, self.profile)
        self.root = args.root or f"runs/{self.sweep.name}-{self.profile}"
        self.root_file = paths.as_path(self.root) / "sweep.json"
        self.extra = tuple(extra) if extra else tuple(recorded.get("extra", ()))
        self.args = args

    def record(self) -> None:
        """R/sweep.json: which sweep and profile this root holds, and the flags every row gets."""
        self.root_file.parent.mkdir(parents=True, exist_ok=True)
        record = {"sweep": self.sweep.name, "profile": self.profile, "extra": list(self.extra)}
        paths.write_atomic(self.root_file, json.dumps(record, indent=2) + "\n")

    def workdir(self, run: sweeps.Run) -> str:
        return str(paths.as_path(self.root) / run.name)

    @property
    def eval_split(self) -> str:
        return flag_value(list(self.sweep.eval_flags), "split") or "test"

    def read(self, run: sweeps.Run) -> rowstate.RowState:
        return rowstate.read(paths.Workdir(self.workdir(run)), self.eval_split)

    def job(self, run: sweeps.Run, train: bool = True) -> launch.Job:
        workdir = self.workdir(run)
        if paths.is_url(workdir):
            logdir = Path("logs") / self.sweep.name / run.name
        else:
            logdir = Path(workdir) / "logs"
        flags = (*run.flags(self.extra), f"--workdir={workdir}")
        return launch.Job(f"{self.sweep.name}-{run.name}", flags, True, self.sweep.eval_flags, logdir, train)


def first_difference(old: dict, new: dict, prefix: str = "") -> tuple[str, object, object] | None:
    """The first config field set in both whose value differs (fields only one side has are code
    changes, not config changes, and are ignored)."""
    for key in old:
        if key not in new:
            continue
        if isinstance(old[key], dict) and isinstance(new[key], dict):
            found = first_difference(old[key], new[key], f"{prefix}{key}.")
            if found:
                return found
        elif old[key] != new[key]:
            return f"{prefix}{key}", old[key], new[key]
    return None


def commit() -> str:
    """The code's git commit (with '-dirty' for uncommitted changes), or '' outside a checkout."""
    out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if out.returncode:
        return ""
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


# ---------------------------------------------------------------------------------------------
# plan


def layout(ctx: Context, runs: list[sweeps.Run]) -> list[str]:
    """The table in the paper's layout: the sweep's columns, a blank cell = same as the baseline."""
    sweep = ctx.sweep
    configs = {run.name: run.resolved(ctx.extra) for run in sweep.runs}
    base = configs.get(sweep.baseline, {})
    metrics = list(sweep.metrics)
    header = ["row", *sweep.columns, *(f"paper {m}" for m in metrics), "paper params x1e6"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        cfg, ref = configs[run.name], sweep.reference.get(run.name, {})
        cells = [run.name]
        for key in sweep.columns.values():
            value = lookup(cfg, key)
            cells.append("" if run.name != sweep.baseline and value == lookup(base, key) else str(value))
        cells += [fmt(ref.get(m)) for m in metrics]
        cells.append(fmt(ref["params"] / 1e6, 0) if ref.get("params") else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def lookup(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def fmt(value, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def plan(ctx: Context, runs: list[sweeps.Run]) -> int:
    print(f"# {ctx.sweep.name}, profile {ctx.profile}: {len(runs)} of {len(ctx.sweep.runs)} rows in {ctx.root}")
    print()
    for run in runs:
        job = ctx.job(run)
        print(f"{run.name}:")
        print(f"  python -m fxformer.train {shlex.join(job.train_flags)}")
        print(f"  python -m fxformer.evaluate --workdir={job.workdir} {shlex.join(job.eval_flags)}")
    print()
    print("\n".join(layout(ctx, runs)))
    return exitcodes.OK


# ---------------------------------------------------------------------------------------------
# run


class SweepStopped(Exception):
    """SIGTERM or Ctrl-C to the sweep itself between rows."""


def _raise_stopped(signum, frame):
    raise SweepStopped(signal.Signals(signum).name)


def check_configs(ctx: Context, runs: list[sweeps.Run], wanted: dict[str, dict]) -> None:
    """Refuse (or with --move_changed, move aside) rows started with another config."""
    for run in runs:
        row = ctx.read(run)
        started = row.status.get("config") or row.config
        found = first_difference(started, wanted[run.name]) if started else None
        if not found:
            continue
        key, old, new = found
        if not ctx.args.move_changed:
            raise LaunchError(
                f"{ctx.workdir(run)} was started with {key}={old!r} and the sweep now gives {new!r}: "
                "restore the config, or give --move_changed to move the old run aside and start that row over."
            )
        if row.holder(ctx.args.lease_s):
            raise LaunchError(f"{ctx.workdir(run)} has a changed config but {row.holder()} runs it; stop it first.")
        old_path = paths.as_path(ctx.workdir(run))
        n = 1
        while old_path.parent.joinpath(f"{run.name}.old{n}").exists():
            n += 1
        if not ctx.args.dry_run:
            old_path.rename(old_path.parent / f"{run.name}.old{n}")
        say(f"{run.name}: {key} changed ({old!r} -> {new!r}); moved the old run to {run.name}.old{n}")


def run_rows(ctx: Context, runs: list[sweeps.Run]) -> int:
    args = ctx.args
    wanted = {run.name: run.resolved(ctx.extra) for run in runs}
    check_configs(ctx, runs, wanted)
    if not args.dry_run:
        ctx.record()
    backend = launch.backend_for(args)
    code = commit()
    start, done, outcomes = time.time(), 0, {}
    previous = {s: signal.signal(s, _raise_stopped) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i, run in enumerate(runs):
            elapsed = time.time() - start
            eta = f", ETA {duration(elapsed / done * (len(runs) - i))}" if done else ""
            prefix = f"[{i + 1}/{len(runs)}] {run.name}"
            outcomes[run.name] = run_row(ctx, run, backend, wanted[run.name], code, prefix, eta)
            done += outcomes[run.name] in ("finished", "failed")
    except SweepStopped as e:
        say(f"{e}: the sweep stopped; run the same command again to go on")
        return exitcodes.STOPPED
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if "stopped" in outcomes.values():
        return exitcodes.STOPPED
    counts = {state: list(outcomes.values()).count(state) for state in sorted(set(outcomes.values()))}
    say(f"{ctx.sweep.name}: " + ", ".join(f"{n} {state}" for state, n in counts.items()) +
        f" in {duration(time.time() - start)}")  # fmt: skip
    return 1 if "failed" in outcomes.values() else exitcodes.OK


def run_row(ctx: Context, run, backend, wanted: dict, code: str, prefix: str, eta: str) -> str:
    """Bring one row as far as it goes: skip, evaluate, or train (then evaluate); its outcome."""
    args = ctx.args
    while True:
        row = ctx.read(run)
        state = row.state(args.lease_s)
        total = wanted["num_train_steps"]
        if state == "finished":
            say(f"{prefix}: finished (step {total}); skipped")
            return "finished"
        if state in ("running", "submitted"):
            say(f"{prefix}: {state} by {row.holder(args.lease_s)}; left alone")
            return "elsewhere"
        if state == "failed" and row.attempts >= args.max_attempts and not args.retry_failed:
            logdir = ctx.job(run).logdir
            say(f"{prefix}: failed {row.attempts} times (see {logdir}); skipped: --retry_failed tries again")
            return "failed"
        train = state != "trained"
        saved = max(row.checkpoint_steps, default=0)  # where training goes on from
        what = "evaluate" if not train else f"resume from step {saved}" if saved else "train"
        say(f"{prefix}: {what} (step {saved}/{total}, attempt {row.attempts + 1}){eta}")
        job = ctx.job(run, train)
        if args.dry_run:
            backend.launch(job, True)
            return "planned"
        status = {**row.status, "sweep": ctx.sweep.name, "profile": ctx.profile, "row": run.name,
                  "config": wanted, "commit": code, "backend": args.backend}  # fmt: skip
        lease = rowstate.Lease(paths.Workdir(ctx.workdir(run)), status, every_s=min(30.0, args.lease_s / 4))
        if not lease.claim():
            say(f"{prefix}: another launcher claimed it just now; left alone")
            return "elsewhere"
        lease.update(state="running", attempts=row.attempts + 1, started=time.time(), start_step=saved)
        result = None
        try:
            result = backend.launch(job, False)
        finally:
            if result is None:  # interrupted: the row keeps its checkpoints
                lease.release(state="stopped")
        if args.backend == "slurm":  # sbatch returned at once: the scheduler holds the row now
            job_id = (job.logdir / "job_id").read_text().strip()
            lease.release(state="submitted", job_id=job_id, owner=rowstate.owner_id())
            return "submitted"
        interrupted = backend.group is not None and backend.group.interrupted
        if ctx.read(run).state(args.lease_s) == "finished":
            lease.release(state="finished", last_status=result)
            say(f"{prefix}: finished")
            return "finished"
        if result == exitcodes.STOPPED or interrupted:
            lease.release(state="stopped", last_status=result)
            if interrupted:
                raise SweepStopped("signal")
            if row.attempts + 1 >= args.max_attempts:
                say(f"{prefix}: stopped before its last step {row.attempts + 1} times; run again to resume")
                return "stopped"
            say(f"{prefix}: stopped before its last step (pre-empted?); trying again")
            continue
        lease.release(state="failed", last_status=result)
        reason = "ended without results" if result == exitcodes.OK else f"exited with status {result}"
        say(f"{prefix}: {reason}; its log: {job.logdir}")
        if row.attempts + 1 >= args.max_attempts:
            return "failed"


# ---------------------------------------------------------------------------------------------
# status


def status(ctx: Context, runs: list[sweeps.Run]) -> int:
    lines = ["| row | state | step | attempts | ETA | note |", "|---|---|---|---|---|---|"]
    counts: dict[str, int] = {}
    for run in runs:
        row = ctx.read(run)
        state = row.state(ctx.args.lease_s)
        counts[state] = counts.get(state, 0) + 1
        total = row.total_steps or run.resolved(ctx.extra)["num_train_steps"]
        eta = row.eta_s() if state == "running" else None
        note = row.holder(ctx.args.lease_s) or ""
        if state == "failed" and "last_status" in row.status:
            note = f"last exit status {row.status['last_status']}"
        if state == "finished":
            note = ", ".join(f"{m} {row.results[m]:.2f}" for m in ctx.sweep.metrics if m in row.results)
        cells = [run.name, state, f"{row.step}/{total}", str(row.attempts), duration(eta) if eta else "", note]
        lines.append("| " + " | ".join(cells) + " |")
    print(f"# {ctx.sweep.name}, profile {ctx.profile}, in {ctx.root}")
    print("\n".join(lines))
    print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    return exitcodes.OK


# ---------------------------------------------------------------------------------------------
# The command


def main(verb: str, argv: list[str]) -> int:
    ours, extra = split_at_dashes(argv)
    args = parser(verb).parse_args(ours)
    if args.max_attempts < 1:
        raise LaunchError(f"--max_attempts must be at least 1, not {args.max_attempts}.")
    ctx = Context(args, extra)
    runs = ctx.sweep.select(args.only)
    if verb == "plan":
        return plan(ctx, runs)
    if verb == "run":
        return run_rows(ctx, runs)
    if verb == "status":
        return status(ctx, runs)
    from experiments import collect  # matplotlib only where needed

    return collect.main(verb, ctx, runs)
