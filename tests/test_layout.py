"""The tree's shape, read with `ast` and the file system (nothing imported): results folders hold
results (no .py or .sh under experiments/results/), no module puts itself or another folder on
`sys.path` (fxformer/configfile.py's documented loading of configs by path aside), and no function
of fxformer/, experiments/, benchmarks/ (the GPU programs) or configs/ is over 60 lines."""

import ast
import re
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
    edits = [
        e for p in python_files("fxformer", "experiments", "benchmarks", "configs", "tests") for e in path_edits(p)
    ]
    assert path_edits(REPO / "fxformer" / "configfile.py"), "the allowed edit moved: the check would see nothing"
    assert not [e for e in edits if e.split(":")[0] not in PATH_EDITS_ALLOWED], edits


def test_no_function_is_over_60_lines():
    found = [f for p in python_files("fxformer", "experiments", "benchmarks", "configs") for f in long_functions(p)]
    assert not found, found


def test_the_checks_see_what_they_look_for(tmp_path):
    sample = tmp_path / "sample.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST))  # a def line and 60 lines: 61
    sample.write_text(
        f"import sys\nsys.path.insert(0, 'x')\nsite.addsitedir('y')\n\n\ndef f():\n{body}\n\n\ndef g():\n    pass\n"
    )
    assert long_functions(sample, tmp_path) == [f"sample.py:f {LONGEST + 1}"]
    assert path_edits(sample, tmp_path) == ["sample.py:2", "sample.py:3"]


def design_map() -> dict[str, str]:
    """docs/design.md's map ("Where things live"): each top-level folder's lines, by folder name."""
    text = (REPO / "docs" / "design.md").read_text()
    block = text.split("## Where things live", 1)[1].split("```", 2)[1]
    sections: dict[str, str] = {}
    folder = None
    for line in block.splitlines():
        if line and not line[0].isspace():
            folder = line.split("/")[0]
            sections[folder] = ""
        if folder is not None:
            sections[folder] += line + "\n"
    return sections


def unmapped(root: Path, sections: dict[str, str]) -> list[str]:
    """The top-level folders of `root` (tracked by git) and the modules of fxformer/, experiments/
    and benchmarks/ (its results aside, `__init__.py` aside) that the map does not name."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    folders = sorted({line.split("/")[0] for line in tracked.splitlines() if "/" in line and line[0] != "."})
    missing = [f"{folder}/" for folder in folders if folder not in sections]
    for folder in ("fxformer", "experiments", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.name == "__init__.py" or "results" in path.parts:
                continue
            if not re.search(rf"(?<![\w.]){re.escape(path.name)}\b", sections.get(folder, "")):
                missing.append(str(path.relative_to(root)))
    return missing


def test_design_md_names_every_module_and_top_level_folder():
    assert not unmapped(REPO, design_map()), "add a line for each to docs/design.md's map (Where things live)"


def test_the_map_check_sees_a_module_without_its_line():
    sections = design_map()
    assert "fxformer" in sections and "evaluation.py" in sections["fxformer"]
    without = {**sections, "fxformer": sections["fxformer"].replace("evaluation.py", "evaluation")}
    assert unmapped(REPO, without) == ["fxformer/evaluation.py"]
    assert unmapped(REPO, {k: v for k, v in sections.items() if k != "benchmarks"})[0] == "benchmarks/"
