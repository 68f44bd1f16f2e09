"""The tree's shape, read with `ast` and the file system (nothing imported): results folders hold
results (no .py or .sh under experiments/results/), no module puts itself or another folder on
`sys.path` (fxformer/configfile.py's documented loading of configs by path aside), and no function
of fxformer/, experiments/ (its GPU scripts too) or configs/ is over 60 lines."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LONGEST = 60
PATH_EDITS_ALLOWED = {"fxformer/configfile.py"}  # make_importable: a config file's own folder, by its path


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


def long_functions(path: Path, root: Path = REPO) -> list[str]:
    """`path:name lines` of every function in `path` longer than LONGEST lines (`path` relative to `root`)."""
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(root)}:{node.name} {node.end_lineno - node.lineno + 1}"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST
    ]


def path_edits(path: Path, root: Path = REPO) -> list[str]:
    """`path:line` of every call of sys.path.insert, .append or .extend, or site.addsitedir, in `path`
    (relative to `root`)."""
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(root)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (
            node.func.attr in ("insert", "append", "extend")
            and ast.unparse(node.func.value) == "sys.path"
            or ast.unparse(node.func) == "site.addsitedir"
        )
    ]


def test_results_folders_hold_no_code():
    code = [p for p in (REPO / "experiments" / "results").rglob("*") if p.suffix in (".py", ".sh")]
    assert not code, f"code in a results folder (move it to experiments/scripts/ or a verb): {code}"


def test_no_module_puts_a_folder_on_the_path():
    edits = [e for p in python_files("fxformer", "experiments", "configs", "tests") for e in path_edits(p)]
    assert path_edits(REPO / "fxformer" / "configfile.py"), "the allowed edit moved: the check would see nothing"
    assert not [e for e in edits if e.split(":")[0] not in PATH_EDITS_ALLOWED], edits


def test_no_function_is_over_60_lines():
    found = [f for p in python_files("fxformer", "experiments", "configs") for f in long_functions(p)]
    assert not found, found


def test_the_checks_see_what_they_look_for(tmp_path):
    sample = tmp_path / "sample.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST))  # a def line and 60 lines: 61
    sample.write_text(
        f"import sys\nsys.path.insert(0, 'x')\nsite.addsitedir('y')\n\n\ndef f():\n{body}\n\n\ndef g():\n    pass\n"
    )
    assert long_functions(sample, tmp_path) == [f"sample.py:f {LONGEST + 1}"]
    assert path_edits(sample, tmp_path) == ["sample.py:2", "sample.py:3"]
