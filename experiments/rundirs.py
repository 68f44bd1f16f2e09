"""A sweep's run directories as records (experiments.analysis.records) and back: `collect` reads
each replicate's workdir under the root into one records document (its state, config, final
evaluations, learning curve; the data files' SHA-256 and the package versions in the header), and
`restore` writes a committed records file's finished runs back as run directories on a new machine,
so that `run` trains only what the records lack. The running half's side of the records format."""

from __future__ import annotations

import hashlib
import json
import platform

from experiments import rowstate
from experiments.analysis.records import CURVE_KEYS, FORMAT, RUN_INFO, now
from experiments.cli import read_json
from fxformer import metrics, paths, versions
from fxformer.errors import UserError


def from_root(ctx, runs) -> dict:
    """The records of `runs` (and the baseline's, which every row is compared with) from their run
    directories under the sweep's root."""
    names = {run.name for run in runs} | {ctx.sweep.baseline}
    header = {
        "format": FORMAT,
        "sweep": ctx.sweep.name,
        "profile": ctx.profile,
        "root": str(ctx.root),
        "extra": list(ctx.extra),
        **({"seeds": ctx.seeds} if ctx.seeds else {}),  # --seeds=K: every row's count (else the sweep's own)
        "collected": now(),
        "origin": "run directories",
    }
    header["rows"] = [run.name for run in runs]  # the table's rows (the baseline's records may be extra)
    base = next((run for run in ctx.sweep.runs if run.name == ctx.sweep.baseline), None)
    header["data"] = data_files(ctx.sweep.data_source, base.resolved(ctx.extra) if base else {})
    header["environment"] = environment()
    reps = [replicate(ctx, rep) for run in ctx.sweep.runs if run.name in names for rep in ctx.replicates(run)]
    header["environment"]["platforms"] = sorted({p for rep in reps if (p := rep["run_info"].get("platform"))})
    header["environment"]["cpus"] = sorted({c for rep in reps if (c := rep["run_info"].get("cpu"))})  # unknown: none
    return {"header": header, "replicates": reps}


def replicate(ctx, rep) -> dict:
    """One replicate's record from its workdir (what is missing is simply absent)."""
    row = ctx.read(rep)
    workdir = paths.Workdir(ctx.workdir(rep))
    why = "the row's evaluation"
    evals = {split: read_json(path, why, "delete it and evaluate again") for split, path in row.finals.items()}
    info = read_json(workdir.run_info, "the run's record", "train again") if workdir.run_info.exists() else {}
    return {
        "row": rep.run.name,
        "seed": rep.seed,
        "name": rep.name,
        "state": str(row.state(ctx.options.lease_s)),
        "step": row.step,
        "config": row.config,
        "commit": row.status.get("commit", ""),
        "run_info": {key: info[key] for key in RUN_INFO if key in info},
        "evals": evals,
        "curve": curve(workdir),
    }


def data_files(source: str, config: dict) -> dict:
    """Where the data come from (the sweep's `data_source`) and the SHA-256 of each data file the
    baseline's config names that exists here (`data.*_file`), by file name."""
    digests = {}
    for key, value in sorted((config.get("data") or {}).items()):
        if key.endswith("_file") and value and (path := paths.as_path(value)).exists():
            digests[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"source": source, "sha256": digests}


def environment() -> dict:
    """The versions of the packages that computed the runs, as installed where the records are
    collected (each run's own, where it recorded them, are in its run_info), and the platform."""
    found = versions.versions()
    return {"python": found.pop("python"), "machine": platform.machine(), **found}


def curve(workdir: paths.Workdir) -> list[dict]:
    """The learning curve of a run: each logged line's step, tokens seen, train loss, dev PPL and BLEU,
    training wall seconds (`CURVE_KEYS`)."""
    points = []
    for line in metrics.logged(workdir):
        point = {key: line[key] for key in CURVE_KEYS if key in line}
        if len(point) > 1 and "step" in point:
            points.append(point)
    return points


def restore(ctx, doc: dict, source: str) -> tuple[int, int]:
    """Write each finished replicate of the records `doc` that the root lacks as a run directory,
    so that a sweep moved to a new machine trains only what its records do not hold: config.json,
    metrics.jsonl (the curve), run.json, the evaluations, and sweep.json (finished, the commit,
    where early stopping ended it); no checkpoints. `run` skips such a row and `collect` reads it
    as the records hold it. Returns (restored, already in the root)."""
    finished = {rep["name"]: rep for rep in doc["replicates"] if rep["state"] == "finished" and rep.get("config")}
    restored = kept = 0
    for rep in ctx.units(ctx.sweep.runs):
        record = finished.get(rep.name)
        if record is None:
            continue
        workdir = paths.Workdir(ctx.workdir(rep))
        if workdir.root.exists():  # a run directory wins over the records: never overwritten
            kept += 1
            continue
        end = record["evals"][ctx.eval_split]["checkpoint_steps"][-1]
        status = {"state": "finished", "commit": record["commit"], "restored_from": source}
        if end < record["config"]["num_train_steps"]:
            status["early_end"] = end  # what W/best/ told of the plateau: a restored row has no checkpoints
        workdir.root.mkdir(parents=True)
        paths.write_atomic(workdir.config, json.dumps(record["config"], indent=2) + "\n")
        paths.write_atomic(workdir.metrics, "".join(json.dumps(point) + "\n" for point in record["curve"]))
        paths.write_atomic(workdir.run_info, json.dumps(record["run_info"], indent=2) + "\n")
        workdir.eval.mkdir()
        decode = ctx.read(rep).decode  # the sweep's search, as the config just written sees it
        for split, result in record["evals"].items():
            path = workdir.eval_result(split, result["checkpoint_steps"], decode=decode)
            paths.write_atomic(path, json.dumps(result, indent=2) + "\n")
        rowstate.write_status(workdir, status)
        state = ctx.read(rep).state(ctx.options.lease_s)
        if state != rowstate.RowStatus.FINISHED:
            raise UserError(f"{rep.name} restored from {source} reads as {state}, not finished; delete {workdir.root}.")
        restored += 1
    return restored, kept
