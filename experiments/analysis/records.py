"""A sweep's raw records, one file: per replicate its state, config, final evaluations and
learning curve. `collect` writes them beside the table (`records.jsonl.gz`) and builds the table
from them alone, so `collect --from_records=FILE` rebuilds table.md, table.csv and results.json
byte for byte on any machine, with no run directory.

The file is gzip'd JSON lines (written with no timestamp: the same records, the same bytes): a
header line, then one line per replicate:

    {"format": 1, "sweep": "table3", "profile": "mini", "root": "runs/table3-mini", "extra": [],
     "collected": "2026-11-24 18:13", "origin": "run directories",
     "data": {"source": "...", "sha256": {"train.en.gz": "..."}}, "environment": {"jax": "0.8.1", ...}}
    {"row": "B1", "seed": 1, "name": "B1.s1", "state": "finished", "step": 1000,
     "config": {... W/config.json ...}, "commit": "7d07d062c5ed", "run_info": {"num_params": ..., "devices": 1},
     "evals": {"validation": {... W/eval/validation-1000.json ...}, "test": {...}},
     "curve": [{"step": 25, "tokens_seen": 23808.0, "loss": 5.1}, {"step": 100, ..., "dev_ppl": 9.8}, ...]}

`curve` keeps, of each line of W/metrics.jsonl, the step, tokens seen, train loss, dev PPL and dev
BLEU where measured, and the training wall time so far (`wall_s`; records collected before it
lack it). A results.json (an older one too) converts to records (`from_results`):
each seed's final figures, no curves, and the header says so.
"""

from __future__ import annotations

import gzip
import json
import re
import time

from experiments.cli import read_json
from fxformer import config, paths
from fxformer.errors import UserError

FORMAT = 1
NAME = "records.jsonl.gz"
CURVE_KEYS = ("step", "tokens_seen", "loss", "dev_ppl", "dev_bleu", "wall_s")  # wall_s: training seconds so far
RUN_INFO = ("num_params", "devices", "platform", "device_kind", "cpu", "versions")  # what records keep of W/run.json
FROM_RESULTS = (
    "re-collected from results.json, which holds each seed's final figures only: no learning curves and no raw "
    "records (a re-run of the sweep, or its records.jsonl.gz, has them)"
)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M")


def dev_gaps(doc: dict, rows: set[str]) -> list[str]:
    """'B2.s1 at step 1500' for each replicate of `rows` whose curve misses a dev evaluation that its
    eval_every_steps called for (a stop on an evaluation step, resumed by code before 150f6a7)."""
    out = []
    for rep in doc["replicates"]:
        every = (rep.get("config") or {}).get("eval_every_steps")
        evaluated = [point["step"] for point in rep.get("curve", []) if "dev_ppl" in point]
        if rep["row"] not in rows or not every or not evaluated:
            continue
        missing = sorted(set(range(every, evaluated[-1], every)) - set(evaluated))
        if missing:
            out.append(f"{rep['name']} at step {', '.join(f'{step:,}' for step in missing)}")
    return out


def write(path, doc: dict) -> None:
    lines = [json.dumps(doc["header"]), *(json.dumps(rep) for rep in doc["replicates"])]
    paths.write_atomic(path, gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))


def read(path) -> dict:
    """The records written by `write`, or one sentence naming the file and what is wrong with it."""
    path = paths.as_path(path)
    if not path.exists():
        raise UserError(f"--from_records: {path} does not exist; give the {NAME} that collect wrote.")
    try:
        header, *reps = (json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines())
    except (OSError, EOFError, ValueError) as e:
        raise UserError(f"{path} is not a records file collect wrote ({e.__class__.__name__}: {e}).") from None
    if header.get("format") != FORMAT:
        raise UserError(f"{path} holds records of format {header.get('format')}; this code reads format {FORMAT}.")
    return {"header": header, "replicates": reps}


def downgraded(doc: dict, known: dict) -> dict:
    """The records `doc` with each replicate's config as older code wrote it, given that code's
    defaults (`fxformer.config.downgrade`): collect records a config as the collecting code reads it,
    with the fields added since at their defaults, which older code refuses; its `restore` reads this
    copy. A field at another value is refused in one sentence naming the replicate."""
    reps = []
    for rep in doc["replicates"]:
        if rep.get("config"):
            try:
                rep = {**rep, "config": config.downgrade(rep["config"], known)}
            except UserError as e:
                raise UserError(f"{rep['name']}: {e}") from None
        reps.append(rep)
    return {"header": doc["header"], "replicates": reps}


def from_results(path) -> dict:
    """Records rebuilt from a results.json that collect wrote (an older one included): per seed,
    the final figures it holds (`seeds`, and each further split's under `more`; the whole
    evaluation of the seed it was kept for), no curves. The header says so."""
    path = paths.as_path(path)
    if not path.exists():
        raise UserError(f"--from_results: {path} does not exist.")
    document = read_json(path, "a sweep's results", "give one that collect wrote")
    if "source" in document:  # written by this code: its header, kept, but for where the figures now come from
        header = {**document["source"], "origin": FROM_RESULTS}
    else:  # an older one: its root and time of collection from its footer
        first = document.get("footer", [""])[0]
        root, collected = re.search(r"root (\S+?);", first), re.search(r"collected ([\d-]+ [\d:]+)", first)
        header = {
            "format": FORMAT,
            "sweep": document["sweep"],
            "profile": document["profile"],
            "root": root.group(1) if root else "?",
            "extra": [],
            "collected": collected.group(1) if collected else now(),
            "origin": FROM_RESULTS,
            "rows": [row["row"] for row in document["rows"]],
        }
    split = next((row["results"]["split"] for row in document["rows"] if row.get("results")), "validation")
    reps = [rep for row in document["rows"] for rep in replicates_of(row, split)]
    return {"header": header, "replicates": reps}


def replicates_of(row: dict, eval_split: str) -> list[dict]:
    """A results.json row's replicates as records: each seed's final figures on each split, and
    the whole evaluation for the seed collect kept it for (the first evaluated)."""
    state = row["state"] if " " not in row["state"] else ""  # "2 finished, 1 pending": each seed's unknown
    more = row.get("more", {})
    splits = {eval_split: row["seeds"], **{split: figures["seeds"] for split, figures in more.items()}}
    kept = {eval_split: row.get("results") or {}}
    kept |= {split: figures.get("results") or {} for split, figures in more.items()}
    reps = []
    for k in range(row["seeds_run"]):
        evals = {}
        for split, seeds in splits.items():
            values = {m: by_seed[str(k)] for m, by_seed in seeds.items() if str(k) in by_seed}
            if values and kept[split] and all(kept[split].get(m) == v for m, v in values.items()):
                values, kept[split] = kept[split], {}
            if values:
                evals[split] = values
        reps.append(
            {
                "row": row["row"],
                "seed": k,
                "name": row["row"] if k == 0 else f"{row['row']}.s{k}",
                "state": state or ("finished" if evals else "pending"),
                "step": (row.get("ends") or {}).get(str(k), row["steps"]),  # each seed's last step where recorded
                "config": None,
                "commit": row["commit"],
                "run_info": {"num_params": row["params"], "devices": row["devices"]},
                "evals": evals,
                "curve": [],
            }
        )
    return reps
