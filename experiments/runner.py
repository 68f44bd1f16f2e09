"""Run a sweep: plan it, run every row and seed (resumably, on any backend), show where it stands.

    python -m experiments plan   table3 --profile=mini
    python -m experiments run    table3 --root=runs/table3-mini --profile=mini [--seeds=3] [--parallel=2]
    python -m experiments status table3 --root=runs/table3-mini
    python -m experiments run    table3 --root=gs://bucket/table3 --backend=tpu --tpu=my-v4-32 --zone=us-central2-b
    python -m experiments collect table3 --root=runs/table3-mini   # R/results: table.md, .csv, .json, records.jsonl.gz
    python -m experiments collect table3 --from_records=runs/table3-mini/results/records.jsonl.gz  # no run directory
    python -m experiments restore table3 --from_records=FILE [--root=R]   # a new machine: finished runs from FILE

Each row trains in `R/<row>` (its fxformer workdir, never date-stamped), its seed k > 0 in
`R/<row>.s<k>`, then is evaluated the sweep's way (table3: on dev, then on the test set with the
same decoding). `run` is safe to repeat: finished rows are skipped, stopped rows resume from
their checkpoints, trained rows are only evaluated (on the splits still missing), failed
rows are retried up to --max_attempts, rows another launcher holds are left alone, and a row
whose resolved config changed since it started is refused (--move_changed moves the old run
aside). Flags after -- go to every row's fxformer.train (e.g. --config.data.tfds_data_dir=...)
and are remembered in R/sweep-root.json, with the profile and --seeds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import shlex
import signal
import threading
import time
from pathlib import Path

from experiments import backends, rowstate, rundirs
from experiments import status as status_verb
from experiments import sweep as sweeps
from experiments.analysis import figures, records, report
from experiments.backends import Backend, Launched, Outcome
from experiments.cli import commit_label, duration, say, split_at_dashes, verb_parser
from experiments.context import Context, Replicate
from experiments.rowstate import RowState, RowStatus
from fxformer import exitcodes, paths
from fxformer.config import config_changes
from fxformer.errors import UserError

VERBS = {
    "plan": "show the rows, the command each runs and the table in the paper's layout; runs nothing",
    "run": "train and evaluate every row not finished yet (resumable, safe to repeat)",
    "status": "per row and seed: state, step / total, attempts, ETA of running rows; the time the sweep has left",
    "collect": "the results table beside the reference (markdown, CSV, JSON) and its raw records in R/results",
    "plot": "PNG figures of the results in R/results (matplotlib)",
    "restore": "write the finished runs of --from_records into the root (no checkpoints): `run` then trains the rest",
}


def parser(verb: str) -> argparse.ArgumentParser:
    epilog = "Everything after -- is passed to every row's fxformer.train."
    p = verb_parser(verb, f"{VERBS[verb]}.\n\n{__doc__}", epilog=epilog)
    p.add_argument("sweep", help="a sweep: table3 (configs/table3.py), or a config file with sweep(profile)")
    p.add_argument("--root", default="", help="the sweep's directory, a path or URL (default: runs/<sweep>-<profile>)")
    p.add_argument(
        "--profile",
        default="",
        help="table3: paper, mini, multi30k:<folder of the Multi30k files> or smoke (default: the root's, else paper)",
    )
    p.add_argument("--only", default="", help="rows to act on: names or patterns, comma-separated (A*,base)")
    p.add_argument(
        "--seeds",
        type=int,
        default=0,
        help="replicates of every row, paired by seed (default: the root's, else the sweep's)",
    )
    p.add_argument("--parallel", type=int, default=1, help="local backend: runs side by side on this machine (1)")
    p.add_argument("--max_attempts", type=int, default=3, help="tries per row before it counts as failed (3)")
    p.add_argument("--retry_failed", action="store_true", help="try rows that failed --max_attempts times again")
    p.add_argument("--move_changed", action="store_true", help="move runs with a changed config aside, start over")
    p.add_argument(
        "--lease_s",
        type=float,
        default=rowstate.DEFAULT_LEASE_S,
        help="a row whose owner's heartbeat is older than this is taken over (300)",
    )
    p.add_argument(
        "--out",
        default="",
        help="collect, plot: where the files go (default: R/results, or beside "
        "the --from_records / --from_results file)",
    )
    p.add_argument(
        "--from_records",
        default="",
        metavar="FILE",
        help="collect, plot: from the raw records collect wrote (R/results/records.jsonl.gz) alone, with "
        "no run directory: table.md, table.csv and results.json come out byte for byte as collected; "
        "restore: the records whose finished runs go into --root (default: the root they were collected from)",
    )
    p.add_argument(
        "--from_results",
        default="",
        metavar="FILE",
        help="collect, plot: from the final figures per seed a results.json holds (an older one "
        "included): no learning curves and no raw records, so those columns stay blank",
    )
    backends.add_flags(p)
    return p


def first_difference(old: dict, new: dict) -> tuple[str, object, object] | None:
    """The first config field (in key order) set in both whose value differs: fields only one
    side has are code changes, not config changes, and are ignored."""
    changed = config_changes(old, new, shared_only=True)
    return next(((key, *values) for key, values in changed.items()), None)


# ---------------------------------------------------------------------------------------------
# plan


def plan(ctx: Context, runs) -> int:
    units = ctx.units(runs)
    seeds = f", {len(units)} runs with their seeds" if len(units) != len(runs) else ""
    print(f"# {ctx.sweep.name}, profile {ctx.profile}: {len(runs)} of {len(ctx.sweep.runs)} rows{seeds} in {ctx.root}")
    print()
    for rep in units:
        job = ctx.job(rep)
        print(f"{rep.name}:")
        print(f"  python -m fxformer.train {shlex.join(job.train_flags)}")
        print(f"  python -m {shlex.join(job.evaluation([]))}")
    print()
    print("\n".join(report.layout(ctx.sweep, ctx.extra, runs)))
    return exitcodes.OK


# ---------------------------------------------------------------------------------------------
# run


class SweepStopped(Exception):
    """SIGTERM or Ctrl-C to the sweep itself."""


def check_configs(ctx: Context, units: list[Replicate], wanted: dict[str, dict]) -> None:
    """Refuse (or with --move_changed, move aside) runs started with another config."""
    for rep in units:
        row = ctx.read(rep)
        started = row.status.get("config") or row.config
        found = first_difference(started, wanted[rep.name]) if started else None
        if not found:
            continue
        key, old, new = found
        if not ctx.options.move_changed:
            raise UserError(
                f"{ctx.workdir(rep)} was started with {key}={old!r} and the sweep now gives {new!r}: "
                "restore the config, or give --move_changed to move the old run aside and start that row over."
            )
        if holder := row.holder(ctx.options.lease_s):
            raise UserError(f"{ctx.workdir(rep)} has a changed config but {holder} runs it; stop it first.")
        old_path = ctx.workdir(rep).root
        n = 1
        while old_path.parent.joinpath(f"{rep.name}.old{n}").exists():
            n += 1
        if not ctx.options.dry_run:
            old_path.rename(old_path.parent / f"{rep.name}.old{n}")
        say(f"{rep.name}: {key} changed ({old!r} -> {new!r}); moved the old run to {rep.name}.old{n}")


def trained_part(found: RowState, ended: RowState) -> float:
    """The part of a run's steps trained between two looks at its row: 1 for a whole run, 1/7 for
    one resumed at 2,400 that ended by its plateau at 2,800, 0 for one that failed at once, was
    only evaluated, or was left to the launcher that holds it."""
    last = max(ended.step, ended.total_steps or 0)
    return max(0, ended.step - found.step) / max(last, 1)


class Pace:
    """The sweep's ETA: the wall time since the first run this invocation worked on began, per run
    it trained, times the runs left. Runs found finished and skipped take no time and count in
    neither, or a resumed sweep would read an ETA of seconds; a run resumed from a checkpoint
    counts as the part of its steps it trained (`trained_part`), or the runs in flight when the
    sweep was last stopped, finishing first, would make the ETA minutes. Evaluation is time without steps:
    a sweep that only evaluates shows no ETA."""

    def __init__(self):
        self.first: float | None = None
        self.runs = 0.0

    def began(self, now: float) -> None:
        self.first = now if self.first is None else self.first

    def ended(self, part: float = 1.0) -> None:
        """A run ended, `part` of it trained by this invocation."""
        self.runs += part

    def eta(self, left: int, now: float) -> str:
        """', ETA 1h02m03s' for `left` runs (this one included), or '' before a run ended."""
        if not self.runs or self.first is None:
            return ""
        return f", ETA {duration((now - self.first) / self.runs * left)}"


class Runs:
    """The replicates of one `run` verb, launched up to --parallel at a time, each with its own
    backend; SIGTERM or Ctrl-C to the sweep asks every running one to save and stop."""

    def __init__(self, ctx: Context, units: list[Replicate]):
        self.ctx, self.units = ctx, units
        self.wanted = {rep.name: rep.resolved(ctx.extra) for rep in units}
        self.code = commit_label()
        self.live: dict[str, Backend] = {}
        self.stopping = threading.Event()
        self.started, self.pace = time.time(), Pace()

    def one(self, i: int, rep: Replicate) -> RowStatus:
        found = self.ctx.read(rep)
        works = found.state(self.ctx.options.lease_s) != RowStatus.FINISHED
        if works:
            self.pace.began(time.time())
        eta = self.pace.eta(len(self.units) - i, time.time())
        prefix = f"[{i + 1}/{len(self.units)}] {rep.name}"
        backend = self.live[rep.name] = self.ctx.new_backend(echo=self.ctx.options.parallel == 1)
        try:
            return run_row(self.ctx, rep, backend, self.wanted[rep.name], self.code, prefix, eta, self.stopping)
        finally:
            del self.live[rep.name]
            if works:
                with contextlib.suppress(UserError):  # a damaged file is for the next look to report
                    self.pace.ended(trained_part(found, self.ctx.read(rep)))

    def all(self) -> dict[str, RowStatus]:
        """Every unit's outcome; raises SweepStopped after a signal, once the running ones stopped."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        outcomes, pending = {}, list(enumerate(self.units))
        try:
            parallel = self.ctx.options.parallel
            with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as pool:
                running: dict[concurrent.futures.Future, Replicate] = {}
                while (pending or running) and not (self.stopping.is_set() and not running):
                    while pending and len(running) < parallel and not self.stopping.is_set():
                        if running and not self.data_ready(running):
                            break  # the first run prepares the data and tokenizer alone: no two builds at once
                        i, rep = pending.pop(0)
                        running[pool.submit(self.one, i, rep)] = rep
                    done, _ = concurrent.futures.wait(running, timeout=0.5, return_when="FIRST_COMPLETED")
                    for future in done:
                        outcomes[running.pop(future).name] = future.result()
        except SweepStopped:
            self.stopping.set()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if self.stopping.is_set():
            raise SweepStopped("signal")
        return outcomes

    def data_ready(self, running: dict) -> bool:
        """Whether the runs going now are past preparing their data (their workdir holds the tokenizer)."""
        return all(self.ctx.workdir(rep).has_tokenizer() for rep in running.values())

    def _on_signal(self, signum, frame) -> None:
        say(f"{signal.Signals(signum).name}: asking every running row to save and stop")
        self.stopping.set()
        for backend in list(self.live.values()):
            backend.interrupt()


def run_rows(ctx: Context, runs) -> int:
    options = ctx.options
    if options.parallel < 1:
        raise UserError(f"--parallel must be at least 1, not {options.parallel}.")
    if options.parallel > 1 and options.backend != "local":
        raise UserError(f"--parallel is for the local backend; the {options.backend} backend runs one row at a time.")
    units = ctx.units(runs)
    jobs = Runs(ctx, units)
    check_configs(ctx, units, jobs.wanted)
    if not options.dry_run:
        ctx.record()
    try:
        outcomes = jobs.all()
    except SweepStopped as e:
        say(f"{e}: the sweep stopped; run the same command again to go on")
        return exitcodes.STOPPED
    states = list(outcomes.values())
    if RowStatus.STOPPED in states:
        return exitcodes.STOPPED
    counts = {str(state): states.count(state) for state in sorted(set(states))}
    say(
        f"{ctx.sweep.name}: "
        + ", ".join(f"{n} {state}" for state, n in counts.items())
        + f" in {duration(time.time() - jobs.started)}"
    )
    return exitcodes.FAILED if RowStatus.FAILED in states else exitcodes.OK


def run_row(
    ctx: Context,
    rep: Replicate,
    backend: Backend,
    wanted: dict,
    code: str,
    prefix: str,
    eta: str,
    stopping: threading.Event | None = None,
) -> RowStatus:
    """Bring one run as far as it goes. What its state on disk calls for:

    FINISHED             skip                        -> FINISHED
    RUNNING, SUBMITTED   leave to whoever holds it   -> that state
    FAILED, attempts up  skip (--retry_failed)       -> FAILED (a TRAINED row whose evaluation failed too)
    TRAINED              evaluate                    -> by the launch
    PENDING, STOPPED,
    FAILED with attempts train (resume), evaluate    -> by the launch: FINISHED, SUBMITTED, PENDING
                                                        (dry run); STOPPED or FAILED once the
                                                        attempts are spent, else again
    """
    options, total = ctx.options, wanted["num_train_steps"]
    while True:
        row = ctx.read(rep)
        state = row.state(options.lease_s)
        if state == RowStatus.FINISHED:
            end = row.total_steps or total
            say(f"{prefix}: finished (step {end}{'' if end == total else f'/{total}, a plateau'}); skipped")
            return state
        if state in (RowStatus.RUNNING, RowStatus.SUBMITTED):
            say(f"{prefix}: {state} by {row.holder(options.lease_s)}; left alone")
            return state
        if (pid := backend.left_running(ctx.job(rep))) is not None:
            say(f"{prefix}: its training from an earlier launch still runs (pid {pid}); left alone: let it end")
            return RowStatus.RUNNING
        failed = RowStatus.FAILED in (state, row.status.get("state"))  # trained, its evaluation failed: the same
        if failed and row.attempts >= options.max_attempts and not options.retry_failed:
            logdir = ctx.job(rep).logdir
            say(f"{prefix}: failed {row.attempts} times (see {logdir}); skipped: --retry_failed tries again")
            return RowStatus.FAILED
        if stopping is not None and stopping.is_set():
            raise SweepStopped("signal")
        outcome = attempt(ctx, rep, backend, row, state, wanted, code, prefix, eta)
        if outcome is not None:
            return outcome


def attempt(
    ctx: Context,
    rep: Replicate,
    backend: Backend,
    row: rowstate.RowState,
    state: RowStatus,
    wanted: dict,
    code: str,
    prefix: str,
    eta: str,
) -> RowStatus | None:
    """Launch one attempt (training and evaluation, or evaluation alone) under a lease; the row's
    outcome, or None where another attempt should follow."""
    options, total = ctx.options, wanted["num_train_steps"]
    train = state != RowStatus.TRAINED
    saved = max(row.checkpoint_steps, default=0)  # where training goes on from
    what = "evaluate" if not train else f"resume from step {saved}" if saved else "train"
    say(f"{prefix}: {what} (step {saved}/{total}, attempt {row.attempts + 1}){eta}")
    job = ctx.job(rep, train, None if train else row.unevaluated)  # evaluate alone: the splits still to do
    if options.dry_run:
        backend.launch(job, True)
        return RowStatus.PENDING
    status = {
        **row.status,
        "sweep": ctx.sweep.name,
        "profile": ctx.profile,
        "row": rep.run.name,
        "seed": rep.seed,
        "config": wanted,
        "commit": code,
        "backend": options.backend,
    }
    lease = rowstate.Lease(ctx.workdir(rep), status, every_s=min(30.0, options.lease_s / 4))
    if not lease.claim():
        say(f"{prefix}: another launcher claimed it just now; left alone")
        return RowStatus.RUNNING
    lease.update(state=RowStatus.RUNNING, attempts=row.attempts + 1, started=time.time(), start_step=saved)
    launched = None
    try:
        launched = backend.launch(job, False)
    finally:
        if launched is None:  # an exception: the row keeps its checkpoints
            lease.release(state=RowStatus.STOPPED)
    return judge_attempt(ctx, rep, row, lease, launched, job.logdir, prefix)


def judge_attempt(
    ctx: Context,
    rep: Replicate,
    row: rowstate.RowState,
    lease: rowstate.Lease,
    launched: Launched,
    logdir: Path,
    prefix: str,
) -> RowStatus | None:
    """What an attempt that ended (or was submitted) leaves the row in, recorded as the lease is
    released; None where another attempt should follow."""
    options = ctx.options
    last_try = row.attempts + 1 >= options.max_attempts
    if launched.outcome == Outcome.SUBMITTED:  # the scheduler holds the row now
        lease.release(state=RowStatus.SUBMITTED, job_id=launched.job_id, owner=rowstate.owner_id())
        return RowStatus.SUBMITTED
    if ctx.read(rep).state(options.lease_s) == RowStatus.FINISHED:
        lease.release(state=RowStatus.FINISHED, last_status=launched.status)
        say(f"{prefix}: finished")
        return RowStatus.FINISHED
    if launched.interrupted:  # Ctrl-C or SIGTERM to the sweep: not a try of the row's, so no attempt spent
        lease.release(state=RowStatus.STOPPED, last_status=launched.status, attempts=row.attempts)
        raise SweepStopped("signal")
    if launched.outcome == Outcome.STOPPED:
        lease.release(state=RowStatus.STOPPED, last_status=launched.status)
        if last_try:
            times = "once" if row.attempts == 0 else f"{row.attempts + 1} times"
            say(f"{prefix}: stopped before its last step {times}; run again to resume")
            return RowStatus.STOPPED
        say(f"{prefix}: stopped before its last step (pre-empted?); trying again")
        return None
    lease.release(state=RowStatus.FAILED, last_status=launched.status)
    reason = "ended without results" if launched.status == exitcodes.OK else f"exited with status {launched.status}"
    say(f"{prefix}: {reason}; its log: {logdir}")
    return RowStatus.FAILED if last_try else None


# ---------------------------------------------------------------------------------------------
# The command


def main(verb: str, argv: list[str]) -> int:
    ours, extra = split_at_dashes(argv)
    args = parser(verb).parse_args(ours)
    if args.max_attempts < 1:
        raise UserError(f"--max_attempts must be at least 1, not {args.max_attempts}.")
    if args.seeds < 0:
        raise UserError(f"--seeds must be 0 (the root's, else the sweep's counts) or more, not {args.seeds}.")
    if verb == "restore":
        return restore(args, extra)
    if verb in ("collect", "plot") and (args.from_records or args.from_results):
        sweep, runs, doc, folder = records_file(args)
        return tables(verb, sweep, runs, doc, paths.as_path(args.out or folder))
    ctx = Context(args, extra)
    if verb in ("status", "collect", "plot") and not paths.as_path(ctx.root).exists():
        raise UserError(f"{ctx.root} does not exist, so no sweep has run there; give the --root that `run` used.")
    runs = ctx.sweep.select(args.only)
    if verb == "plan":
        return plan(ctx, runs)
    if verb == "run":
        return run_rows(ctx, runs)
    if verb == "status":
        return status_verb.show(ctx, runs)
    return tables(verb, ctx.sweep, runs, rundirs.from_root(ctx, runs), paths.as_path(args.out or f"{ctx.root}/results"))


def restore(args, extra: list[str]) -> int:
    """A sweep moved to a new machine: its finished runs from the committed records, into --root."""
    if not args.from_records:
        raise UserError("restore needs --from_records=FILE, the records.jsonl.gz that collect wrote.")
    doc = records.read(args.from_records)
    header = doc["header"]
    if args.profile and args.profile != header["profile"]:
        raise UserError(
            f"{args.from_records} holds the {header['profile']} profile, not {args.profile}; leave out --profile."
        )
    args.profile, args.root = header["profile"], args.root or header["root"]
    args.seeds = args.seeds or header.get("seeds", 0)  # a sweep run with --seeds=K keeps K seeds
    ctx = Context(args, list(header.get("extra", [])) or extra)
    if ctx.sweep.name != header["sweep"]:
        raise UserError(f"{args.from_records} holds records of the sweep {header['sweep']}, not {ctx.sweep.name}.")
    ctx.record()
    restored, kept = rundirs.restore(ctx, doc, str(args.from_records))
    commits = sorted({rep.get("commit") or "?" for rep in doc["replicates"] if rep["state"] == "finished"})
    say(
        f"{ctx.root}: {restored} finished runs restored from {args.from_records}"
        + (f" (trained at commit {', '.join(commits)}: train the rest with the same code)" if commits else "")
        + (f", {kept} left as they were (their run directories exist)" if kept else "")
        + "; `run` trains and evaluates the rest"
    )
    return exitcodes.OK


def tables(verb: str, sweep, runs, doc: dict, directory) -> int:
    """collect or plot the records `doc` of `runs` (rows of `sweep`) into `directory`: the
    analysis half, fed by the records and the sweep's description alone."""
    if verb == "collect":
        return report.collect(sweep, runs, doc, directory)
    return figures.plot(sweep, runs, doc, directory)


def records_file(args) -> tuple[sweeps.Sweep, list, dict, str]:
    """(the sweep as the file's records describe it, its rows, the records, the file's folder) for
    --from_records (a records.jsonl.gz collect wrote) or --from_results (a results.json)."""
    if args.root:
        raise UserError("--from_records and --from_results need no --root: the records name it; give one or the other.")
    if args.from_records and args.from_results:
        raise UserError("give --from_records or --from_results, not both.")
    path = args.from_records or args.from_results
    doc = records.read(path) if args.from_records else records.from_results(path)
    found = doc["header"]
    if args.profile and args.profile != found["profile"]:
        raise UserError(f"{path} holds the {found['profile']} profile, not {args.profile}; leave out --profile.")
    sweep = sweeps.load(args.sweep, found["profile"])
    if sweep.name != found["sweep"]:
        raise UserError(f"{path} holds records of the sweep {found['sweep']}, not {sweep.name}.")
    rows = set(found["rows"])
    return sweep, [run for run in sweep.select(args.only) if run.name in rows], doc, str(paths.as_path(path).parent)
