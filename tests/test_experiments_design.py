"""The launcher's design, checked without starting anything: the import graph between the
`experiments` modules (read with `ast`, nothing imported) has no cycle and never runs back up
(the analysis half, experiments.analysis, importing nothing of the running half; backends below
the sweep runner; nobody importing `__main__`),
and `runner.run_row` acts on every outcome of a launch the way its docstring says, driven
through a fake backend.

`python -m pytest -s tests/test_experiments_design.py` prints the import graph.
"""

import ast
import json
import time
from pathlib import Path

import pytest

from experiments import rowstate, runner
from experiments.backends import Launched, Outcome
from experiments.context import Context
from experiments.job import Job
from experiments.rowstate import RowStatus
from fxformer import paths

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# The import graph


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(node: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The `experiments` modules one import statement names (a package means its __init__)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:  # relative: from the module's own package, one level up per extra dot
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    found = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return found & modules


def import_graph() -> dict[str, set[str]]:
    """Every module under experiments/ -> the experiments modules it imports (anywhere in it)."""
    files = {module_name(path): path for path in sorted((REPO / "experiments").rglob("*.py"))}
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[module] = set().union(*(imports_of(node, module, is_package, set(files)) for node in ast.walk(tree)))
    return graph


def graph_lines(graph: dict[str, set[str]]) -> list[str]:
    """The graph as sorted text lines, `module -> dep1, dep2`."""
    return [f"{module} -> {', '.join(sorted(deps)) or '(nothing)'}" for module, deps in sorted(graph.items())]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    done: set[str] = set()

    def visit(path: list[str]) -> list[str] | None:
        for dep in sorted(graph.get(path[-1], ())):
            if dep in path:
                return [*path[path.index(dep) :], dep]
            if dep not in done and (cycle := visit([*path, dep])):
                return cycle
        done.add(path[-1])
        return None

    return next((cycle for module in sorted(graph) if module not in done and (cycle := visit([module]))), None)


UPWARD = {f"experiments.{m}" for m in ("launch", "runner", "status", "context", "rundirs", "__main__")}
SHARED = {
    "experiments",
    "experiments.cli",
    "experiments.sweep",
}  # what both halves read: helpers, a sweep's description


def analysing(module: str) -> bool:
    return module == "experiments.analysis" or module.startswith("experiments.analysis.")


# The analysis half, bottom up: the records format and the statistics; a row's record, its cells,
# the footer, the report; the plans' verdicts, the figures and the regime comparison beside them.
# Each may import only what sits below it here (and nothing of the running half).
TABLES = [f"experiments.analysis.{m}" for m in ("rows", "cells", "footer", "report", "figures")]


def forbidden(module: str, modules: set[str]) -> set[str]:
    """What `module` may not import: nothing imports __main__; the analysis half imports nothing of
    the running half (only itself and SHARED), its tables only what sits below them; backends sit
    below the verbs, status below the runner."""
    banned = {"experiments.__main__"}
    if analysing(module):
        banned |= {m for m in modules if not analysing(m)} - SHARED
    if module == "experiments.backends" or module.startswith("experiments.backends."):
        banned |= UPWARD
    if module in TABLES:
        banned |= set(TABLES[TABLES.index(module) :]) - {module}
    if module == "experiments.status":  # a verb beside the tables, below the runner
        banned |= {"experiments.runner", *TABLES}
    return banned


def test_the_experiments_import_graph_has_no_cycle_and_never_runs_back_up():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the finder finds one
    graph = import_graph()
    print("\n" + "\n".join(graph_lines(graph)))
    assert {"experiments.backends", "experiments.analysis.report", "experiments.context"} <= graph["experiments.runner"]
    assert "experiments.backends.base" in graph["experiments.backends"]  # the parser sees real edges
    banned = forbidden("experiments.analysis.cells", set(graph))
    assert {"experiments.runner", "experiments.context", "experiments.rowstate", *TABLES[2:]} <= banned
    assert not banned & {"experiments.analysis.stats", "experiments.cli", "experiments.sweep"}
    assert set(TABLES) <= graph.keys()  # a table module renamed would leave its rule checking nothing
    assert sum(map(analysing, graph)) >= 9 and len(graph) - sum(map(analysing, graph)) >= 15  # two real halves
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"
    upward = [
        f"{module} -> {dep}"
        for module, deps in sorted(graph.items())
        for dep in sorted(deps & forbidden(module, set(graph)))
    ]
    assert not upward, f"imports that run back up: {upward}"
    # the rule is live: the analysis half importing the launcher's context would be refused
    assert "experiments.context" in forbidden("experiments.analysis.rows", set(graph))
    assert {"experiments.backends.local", "experiments.backends.tpu"} <= forbidden(
        "experiments.analysis.figures", set(graph)
    )


# ---------------------------------------------------------------------------------------------
# run_row through a fake backend


class FakeBackend:
    """A `Backend` that starts nothing: each launch records its job, runs `effect` and returns `launched`."""

    def __init__(self, launched: Launched, effect=lambda job: None):
        self.launched, self.effect, self.jobs = launched, effect, []

    def launch(self, job: Job, dry_run: bool) -> Launched:
        self.jobs.append(job)
        self.effect(job)
        return self.launched

    def setup(self, job: Job, dry_run: bool) -> int:
        return 0

    def logs(self, job: Job, dry_run: bool) -> int:
        return 0

    def stop(self, job: Job, dry_run: bool) -> int:
        return 0

    def before_retry(self, job: Job) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def left_running(self, job: Job) -> int | None:
        return None


# case: what launch returns, what run_row returns, launches, fields of the lease afterwards
CASES = {
    "finished": (Launched(Outcome.FINISHED, 0), RowStatus.FINISHED, 1, {"state": "finished", "last_status": 0}),
    "stopped": (Launched(Outcome.STOPPED, 75), RowStatus.STOPPED, 1, {"state": "stopped", "last_status": 75}),
    "failed": (Launched(Outcome.FAILED, 2), RowStatus.FAILED, 1, {"state": "failed", "last_status": 2}),
    "submitted": (
        Launched(Outcome.SUBMITTED, 0, job_id="4242"),
        RowStatus.SUBMITTED,
        1,
        {"state": "submitted", "job_id": "4242", "owner": rowstate.owner_id()},  # the scheduler holds it now
    ),
    "held": (Launched(Outcome.FINISHED, 0), RowStatus.RUNNING, 0, {"owner": "another-host:42", "attempts": 0}),
}


@pytest.mark.parametrize("case", CASES)
def test_run_row_acts_on_each_outcome_of_a_launch(case, tmp_path):
    launched, expected, launches, lease = CASES[case]
    args = runner.parser("run").parse_args(
        ["table3", f"--root={tmp_path}", "--profile=smoke", "--only=base", "--max_attempts=1"]
    )
    ctx = Context(args, [])
    [rep] = ctx.units(ctx.sweep.select(args.only))
    runs = runner.Runs(ctx, [rep])  # what run_row gets from the run verb: the config wanted, the commit
    total = runs.wanted[rep.name]["num_train_steps"]
    workdir = paths.Workdir(ctx.workdir(rep))

    def evaluate(job: Job) -> None:  # the evaluations' result files (dev, then test), which make the row finished
        for split in (ctx.eval_split, *ctx.more_splits):
            result = paths.Workdir(job.workdir).eval / f"{split}-{total}.json"
            result.parent.mkdir(parents=True, exist_ok=True)
            result.write_text(json.dumps({"ppl": 5.0, "bleu": 25.0}))

    backend = FakeBackend(launched, evaluate if case == "finished" else lambda job: None)
    if case == "held":
        rowstate.write_status(workdir, {"owner": "another-host:42", "heartbeat": time.time(), "attempts": 0})

    state = runner.run_row(ctx, rep, backend, runs.wanted[rep.name], runs.code, f"[1/1] {rep.name}", "", runs.stopping)
    assert state == expected
    assert len(backend.jobs) == launches
    assert all(job.workdir == str(workdir) and job.train for job in backend.jobs)
    status = json.loads(workdir.sweep_status.read_text())
    assert {key: status.get(key) for key in lease} == lease
    if launches:
        assert status["attempts"] == 1 and status["config"] == runs.wanted[rep.name] and status["token"] is None
    if case == "finished":
        assert ctx.read(rep).state() == RowStatus.FINISHED


# ---------------------------------------------------------------------------------------------
# No JAX under experiments/: it runs on a login node


def experiments_modules() -> list[str]:
    """Every module under experiments/ (its results hold no code), by import name."""
    return sorted(module_name(p) for p in (REPO / "experiments").rglob("*.py") if "results" not in p.parts)


def jax_imports(path: Path) -> list[str]:
    """`path:line` of every import of jax or jaxlib (or a submodule) in `path`, at any depth of the code."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        if any(n.split(".")[0] in ("jax", "jaxlib") for n in names):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_module_under_experiments_imports_jax():
    """Read (an import inside a function counts) and run (every module imported in one fresh process,
    what each imports in turn included): neither finds JAX."""
    found = [hit for p in sorted((REPO / "experiments").rglob("*.py")) for hit in jax_imports(p)]
    assert not found, f"JAX imported under experiments/ (the GPU programs live in benchmarks/): {found}"
    modules = experiments_modules()
    assert "experiments.runner" in modules and "experiments.analysis.stats" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'jax' not in sys.modules and 'jaxlib' not in sys.modules, name\n"
        "print(len(sys.modules))\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_jax_check_sees_an_import_inside_a_function(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\ndef f():\n    from jax import numpy\n    import jaxlib.xla\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert jax_imports(tmp_path / "m.py") == ["m.py:4", "m.py:5"]
    finally:
        REPO = saved
