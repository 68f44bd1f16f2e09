"""The README's and docs' code runs: every Python block, and every shell command of the kinds that
need no pod, cluster, bucket, GPU or long training (`--help`, `--dry-run`, `experiments plan`,
`collect`/`restore --from_records`, `fxformer-params`, and `translate`, `evaluate` and
`attention_maps` on a trained run), each as a reader would type it, from a folder where
`runs/default` is a small trained run (3 layers, checkpoints at steps 2, 4 and 6, the best kept).
The flag checker (test_docs.py) covers the other commands without running them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import env_with_devices, run_train

from fxformer import paths
from fxformer.config import load_workdir_config
from fxformer.data import corpora, pipeline

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
KINDS = {  # the shell commands that run, by what they are
    "help": re.compile(r"\s--help\b"),
    "dry run": re.compile(r"\s--dry[-_]run\b"),
    "plan": re.compile(r"\bexperiments\s+plan\b"),
    "records": re.compile(r"\bexperiments\s+(collect|restore)\b.*--from_records="),
    "params": re.compile(r"\bfxformer[-.]params\b"),
    "trained run": re.compile(r"\bfxformer[-.](translate|evaluate|attention_maps)\b"),
}
NEVER = re.compile(r"\bpip\b|\bgit\b")  # an install, a clone
LONG = re.compile(r"gs://|fxformer[-.]train\b|\bexperiments\s+(run|launch|setup)\b")  # unless --help or --dry-run
SAFE = re.compile(r"\s--(help|dry[-_]run)\b")
SENTENCES = "The old teacher has helped the boy.\nMy mother sees the dog.\n"


def blocks(language: str) -> list[tuple[str, str]]:
    """(page and line, text) of every fenced block in `language` ("python", or "sh" for shell)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            lang = match[1].strip()
            if lang == language or language == "sh" and lang in ("sh", "bash", "shell", "console"):
                line = text[: match.start()].count("\n") + 1
                found.append((f"{page.relative_to(REPO)}:{line}", match[2]))
    return found


def shell_commands(text: str) -> list[str]:
    """A shell block's commands that run: each line (continuations joined, comments dropped) whose
    every part is `echo` or a command of KINDS, and none needs what a test machine lacks."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        parts = [p.strip() for p in re.split(r"&&|;|\|", line) if p.strip()]
        kinds = [any(k.search(" " + p) for k in KINDS.values()) or p.startswith("echo ") for p in parts]
        blocked = NEVER.search(line) or LONG.search(line) and not SAFE.search(line)
        if parts and all(kinds) and not all(p.startswith("echo ") for p in parts) and not blocked:
            out.append(line)
    return out


COMMANDS = [(where, cmd) for where, text in blocks("sh") for cmd in shell_commands(text)]
PYTHON = blocks("python")


@pytest.fixture(scope="session")
def reader(tmp_path_factory, data_dir, corpus) -> Path:
    """A reader's folder: runs/default (runs/base, runs/multi30k, runs/seed0 and runs/seed1 the same
    run; it keeps smoothed weights), the configs, the committed records the docs collect from,
    sentences.en and a translation file of the test split.
    Its dev and test splits hold 16 sentences each: the pages' commands decode them, and an untrained
    model's search runs every sentence to its length limit."""
    here = tmp_path_factory.mktemp("reader")
    run = here / "runs" / "default"
    run_train(
        run,
        data_dir,
        num_train_steps=6,
        checkpoint_every_steps=2,
        eval_every_steps=2,
        **{"model.num_layers": 3, "data.num_validation": 16, "data.num_test": 16, "ema_decay": "0.999"},
    )
    for name in ("base", "multi30k", "seed0", "seed1"):
        (here / "runs" / name).symlink_to(run)
    (here / "configs").symlink_to(REPO / "configs")
    for records in (REPO / "experiments" / "results").glob("*/records.jsonl.gz"):
        target = here / records.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(records, target)
    (here / "sentences.en").write_text(SENTENCES)
    data = load_workdir_config(paths.Workdir(run)).data  # a system's output: the test split's references
    references = pipeline.references(corpora.data_source(corpora.prepare(data, log=lambda *a: None), "test"), data)
    (here / "my-system.de").write_text("".join(line + "\n" for line in references))
    return here


def subprocess_ok(cwd: Path, command: str, server, timeout: float = 300) -> subprocess.CompletedProcess:
    """`command` as a reader types it in `cwd` (python and the console commands are this checkout's;
    its Python commands forked from the fork server `server` where it runs them, as the suite's others)."""
    command = re.sub(r"(?<![\w/.-])(?:\S*/)?python3?(?=\s)", sys.executable, command)
    command = re.sub(r"(?<![\w/.-])fxformer-(\w+)", lambda m: f"{sys.executable} -m fxformer.{m[1]}", command)
    command = command.replace("/path/to/fxformer", str(REPO))
    env = {**env_with_devices(1), "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    if server is not None:
        command = server.in_shell(command, cwd, env)
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    return done


def test_the_pages_show_commands_of_every_kind_and_python_that_runs():
    shown = " ".join(cmd for _, cmd in COMMANDS)
    for kind, pattern in KINDS.items():
        assert pattern.search(" " + shown), f"no command of the kind '{kind}' runs from the pages"
    assert PYTHON, "no Python block in README.md or docs/"


IN_READER = re.compile(KINDS["records"].pattern + "|" + KINDS["trained run"].pattern)


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w} {c[:60]}" for w, c in COMMANDS])
def test_every_shell_command_of_the_named_kinds_runs(reader, fork_server, where, command):
    """In the reader's folder where the command reads a run or writes beside records; else in the
    checkout, as the pages say to run the launcher (the others write nothing there)."""
    subprocess_ok(reader if IN_READER.search(command) else REPO, command, fork_server)


@pytest.mark.parametrize("where,code", PYTHON, ids=[w for w, _ in PYTHON])
def test_every_python_block_runs(reader, fork_server, where, code):
    script = reader / "block.py"
    script.write_text(code)
    subprocess_ok(reader, f"python {script}", fork_server)


def test_a_renamed_method_or_flag_fails(reader, fork_server):
    where, code = next((w, c) for w, c in PYTHON if "fxformer.load" in c)
    script = reader / "renamed.py"
    script.write_text(code.replace(".translate(", ".translate_sentences("))
    with pytest.raises(AssertionError, match="AttributeError"):
        subprocess_ok(reader, f"python {script}", fork_server)
    command = next(c for _, c in COMMANDS if "fxformer.translate" in c and "--workdir" in c)
    with pytest.raises(AssertionError, match="workdirectory|Unknown flag|unrecognized"):
        subprocess_ok(reader, command.replace("--workdir", "--workdirectory"), fork_server)


def test_the_selection_leaves_out_what_needs_a_pod_or_training():
    chosen = shell_commands(
        "python -m fxformer.train --config=configs/default.py --workdir=runs/x\n"
        "python -m experiments launch --backend=tpu --tpu=t -- --workdir=gs://b/r\n"
        "python -m experiments launch --backend=tpu --tpu=t --dry-run -- --workdir=runs/r\n"
        "pip install . && fxformer-params --table3\n"
        'echo "a" | python -m fxformer.translate --workdir=runs/default  # a comment\n'
    )
    assert chosen == [
        "python -m experiments launch --backend=tpu --tpu=t --dry-run -- --workdir=runs/r",
        'echo "a" | python -m fxformer.translate --workdir=runs/default',
    ]
