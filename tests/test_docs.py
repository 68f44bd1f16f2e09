"""The README and docs/ cannot rot: every `python -m <module> ... --flag` they show names a module
that exists and a flag its `--help` lists (or, for `--config.<key>`, a field of the config schema),
and every relative link and image resolves, anchors included. Cheap: every command's `--help`, in
one subprocess (JAX imported once), no training.

Every path of the checkout that they show in code (`fxformer/model.py`, `configs/table3.py:B1`)
exists. The checker is tested on itself too: a renamed flag and a broken link make it fail.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RESULTS = sorted((REPO / "experiments" / "results").glob("*/README.md"))  # links only: they keep old commands
CHECKED = ("fxformer", "experiments")  # the modules whose flags are checked (not pytest, pip, venv)
VERBS = ("experiments",)  # modules whose first argument is a verb with its own --help
SWITCH = {"experiments": "fxformer.train"}  # after a bare `--`, the flags go to this module

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")  # an inline code span, possibly across lines of a paragraph
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
COMMAND = re.compile(r"(?:^|(?<=[\s;&|(]))(?:\S*/)?python[0-9.]*\s+-m\s+([A-Za-z_][\w.]*)(.*)")
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w.<>-]*|(?=\s|$))")
REPO_PATH = re.compile(
    r"(?<![\w./~-])((?:fxformer|configs|experiments|tests|docs)/[\w./<>*-]*)"
)  # a path in the checkout
MODULE_FILE = re.compile(r"(?<![\w./-])(\w+\.py)\b")  # a file named alone, as in a map of the repository
CONSOLE = re.compile(r"(?<![\w/.~-])(fxformer-[a-z][a-z-]*)(?![\w/.-])")  # a console command's name
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def code_and_prose(text: str) -> tuple[list[str], str]:
    """The code a page shows (fenced blocks with `\\` continuations joined, and inline spans), and
    its prose with the code taken out (where its links are)."""
    blocks = [body.replace("\\\n", " ") for _, body in FENCE.findall(text)]
    prose = FENCE.sub("", text)
    spans = [span.replace("\n", " ") for span in INLINE.findall(prose)]
    return blocks + spans, INLINE.sub("", prose)


@functools.cache
def scripts() -> dict[str, str]:
    """pyproject.toml's console commands -> the module each runs (`fxformer-train` -> `fxformer.train`)."""
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", (REPO / "pyproject.toml").read_text(), re.S | re.M)
    table = re.findall(r'^([\w-]+)\s*=\s*"([\w.]+):(\w+)"', section[1] if section else "", re.M)
    ran = {name: getattr(importlib.import_module(module), attribute).module for name, module, attribute in table}
    return {name: module.removesuffix(".__main__") for name, module in ran.items()}


def commands(code: str) -> list[tuple[str, str, list[str]]]:
    """Each command in `code` as (module, verb, [flags]), the flags without their dashes and values;
    a flag after a bare `--` is the next module's (`experiments launch ... -- --workdir=W`)."""
    found = []
    console = "|".join(re.escape(name) for name in sorted(scripts(), key=len, reverse=True))
    if console:  # a console command is its module: `fxformer-train` -> `python -m fxformer.train`
        code = re.sub(rf"(?<![\w/-])({console})(?![\w-])", lambda m: "python -m " + scripts()[m[1]], code)
    for line in code.splitlines():
        for match in COMMAND.finditer(line):
            module, rest = match[1], re.split(r"&&|;|\s\|\s|\s#", match[2])[0]
            if module.split(".")[0] not in CHECKED:
                continue
            verb = ""
            if module in VERBS:
                words = rest.split()
                verb = words[0] if words and not words[0].startswith("-") else ""
            flags: list[str] = []
            for flag in FLAG.findall(rest):
                if flag == "":  # a bare `--`: what follows goes to the next module
                    found.append((module, verb, flags))
                    module, verb, flags = SWITCH.get(module, module), "", []
                    continue
                flags.append(flag.split("=")[0])
            found.append((module, verb, flags))
    return found


# The --help text of each command, all in one process so that JAX is imported once: each module's
# main() (a package's __main__.main) called with `[verb] --help`, outside the process set-up of
# `cli.run` (which moves file descriptors); the texts go to a JSON file, {"<module> <verb>": text or
# null where --help fails: no such module, verb or main()}.
HELP_PROBE = """
import contextlib, importlib, importlib.util, inspect, io, json, sys
texts, commands, target = {}, json.loads(sys.argv[1]), sys.argv[2]
for module, verb in commands:
    argv = [*([verb] if verb else []), "--help"]
    out, status = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            spec = importlib.util.find_spec(module)
            package = spec is not None and spec.submodule_search_locations is not None
            main = importlib.import_module(module + ".__main__" if package else module).main
            if inspect.signature(main).parameters:
                status = main(argv)
            else:
                sys.argv = [module, *argv]
                status = main()
    except SystemExit as e:
        status = e.code
    except BaseException as e:
        status = repr(e)
    texts[f"{module} {verb}"] = out.getvalue() if status in (0, None) else None
with open(target, "w") as f:
    json.dump(texts, f)
"""
HELP: dict[tuple[str, str], frozenset[str] | None] = {}


def load_help(commands: set[tuple[str, str]]) -> None:
    """Fill HELP with the flags each (module, verb) lists in its --help (None where --help fails)."""
    missing = sorted(commands - HELP.keys())
    if not missing:
        return
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "help.json"
        argv = [sys.executable, "-c", HELP_PROBE, json.dumps(missing), str(out)]
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert out.exists(), result.stderr[-3000:]
        texts = json.loads(out.read_text())
    for module, verb in missing:
        text = texts[f"{module} {verb}"]
        rows = re.findall(r"^  (-[^\s].*?)(?:\s{2,}|$)", text or "", re.M)
        HELP[(module, verb)] = (
            None if text is None else frozenset(flag for row in rows for flag in re.findall(r"--([\w-]+)", row))
        )


def help_flags(module: str, verb: str = "") -> frozenset[str] | None:
    """The flags `python -m module [verb] --help` lists (from its option rows), or None when it fails."""
    load_help({(module, verb)})
    return HELP[(module, verb)]


@functools.cache
def config_keys() -> frozenset[str]:
    """Every dotted key of the config schema, sections included."""
    from fxformer import config, schema

    return frozenset(config.dotted_keys(schema.defaults(), sections=True))


def flag_problems(module: str, verb: str, flags: list[str]) -> list[str]:
    """What is wrong with one command: a module or verb without --help, a flag it does not list."""
    shown = f"python -m {module}" + (f" {verb}" if verb else "")
    known = help_flags(module, verb)
    if known is None:
        return [f"`{shown} --help` fails: no such module or verb"]
    problems = []
    for flag in flags:
        if flag.startswith("config."):
            key = flag[len("config.") :]
            if "<" in key or key == "":  # a placeholder: --config.<key>=<value>
                key = key.split("<")[0].rstrip(".")
                if key and key not in config_keys():
                    problems.append(f"{shown}: --config.{key}.<...>: no such config section")
            elif key not in config_keys():
                problems.append(f"{shown}: --config.{key}: no such config field")
        elif "<" not in flag and flag not in known:
            problems.append(f"{shown}: --{flag} is not a flag of its --help")
    return problems


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a markdown page's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def link_problems(page: Path, root: Path) -> list[str]:
    """Every relative link and image of `page` that does not resolve (a file, a folder, an anchor)."""
    _, prose = code_and_prose(page.read_text())
    problems = []
    for target in LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}: ({target})"
        if not resolved.exists():
            problems.append(f"{where} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading '#{anchor}' in {resolved.name}")
    return problems


def problems(pages: list[Path], root: Path = REPO, link_pages: list[Path] = ()) -> list[str]:
    """Everything wrong with `pages` (commands and links) and with `link_pages` (links only)."""
    found = []
    per_page = []
    for page in pages:
        code, _ = code_and_prose(page.read_text())
        per_page.append((page, [cmd for snippet in code for cmd in commands(snippet)]))
        for name in sorted({name for snippet in code for name in CONSOLE.findall(snippet)} - scripts().keys()):
            found.append(f"{page.relative_to(root)}: {name} is not a command of pyproject.toml's [project.scripts]")
        for path in sorted({path.rstrip(".,") for snippet in code for path in REPO_PATH.findall(snippet)}):
            if not re.search(r"[<*]", path) and not (root / path).exists():
                found.append(f"{page.relative_to(root)}: `{path}` does not exist")
        modules = {
            p.name
            for folder in ("fxformer", "configs", "experiments", "benchmarks", "tests")
            for p in (root / folder).rglob("*.py")
        }
        for name in sorted({name for snippet in code for name in MODULE_FILE.findall(snippet)} - modules):
            found.append(
                f"{page.relative_to(root)}: no {name} in fxformer/, configs/, experiments/, benchmarks/ or tests/"
            )
    load_help({(module, verb) for _, cmds in per_page for module, verb, _ in cmds})  # one process for all
    for page, cmds in per_page:
        for module, verb, flags in cmds:
            found += [f"{page.relative_to(root)}: {p}" for p in flag_problems(module, verb, flags)]
        found += link_problems(page, root)
    for page in link_pages:
        found += link_problems(page, root)
    return sorted(set(found))


def test_every_command_flag_and_link_of_the_readme_and_docs_holds():
    assert (REPO / "docs").is_dir() and len(PAGES) > 1
    assert problems(PAGES, REPO, RESULTS) == []


def test_the_pages_show_every_command_and_the_checker_sees_them():
    """The checker reads what the pages show: the modules of the README and docs, with their flags."""
    shown = {
        module for page in PAGES for snippet in code_and_prose(page.read_text())[0] for module, *_ in commands(snippet)
    }
    assert {"fxformer.train", "fxformer.evaluate", "fxformer.translate", "fxformer.attention_maps"} <= shown
    assert {"fxformer.data", "fxformer.bench", "fxformer.params", "experiments"} <= shown
    # a bare `--` hands the rest to fxformer.train; a console command is its module
    assert commands("python -m experiments launch --backend=local -- --workdir=W --config.seed=1") == [
        ("experiments", "launch", ["backend"]),
        ("fxformer.train", "", ["workdir", "config.seed"]),
    ]
    assert commands("fxformer-evaluate --workdir=W --step=best") == [("fxformer.evaluate", "", ["workdir", "step"])]


def test_the_checker_fails_on_a_renamed_flag_a_broken_link_and_an_unknown_config_key(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "fxformer").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# There\n\n## A section\n")
    good = tmp_path / "README.md"
    good.write_text(
        "# Try\n\n```sh\npython -m fxformer.evaluate --workdir=runs/default --split=test \\\n"
        "    --config.decode.beam_size=8\n```\n\n[there](docs/there.md#a-section) and `--config.<key>=<value>`.\n"
    )
    assert problems([good], tmp_path) == []

    bad = tmp_path / "BAD.md"
    bad.write_text(
        good.read_text()
        .replace("--split=test", "--splits=test")  # a renamed flag
        .replace("beam_size", "beam_width")  # a config field that does not exist
        .replace("docs/there.md", "docs/gone.md")  # a broken link
        + "\n![figure](docs/missing.png) [anchor](docs/there.md#no-such-section)\n"
        + "`python -m fxformer.no_such_command --help` and `fxformer-no-such-command`\n"
        + "`docs/renamed.md` and `docs/there.md` and `experiments/results/<name>/`\n"
        + "```\nfxformer/\n  renamed_module.py  what it was\n```\n"
    )
    found = problems([bad], tmp_path)
    assert any("--splits is not a flag" in p for p in found), found
    assert any("--config.decode.beam_width: no such config field" in p for p in found), found
    assert any("docs/gone.md#a-section) does not exist" in p for p in found), found
    assert any("docs/missing.png) does not exist" in p for p in found), found
    assert any("no heading '#no-such-section'" in p for p in found), found
    assert any("python -m fxformer.no_such_command --help` fails" in p for p in found), found
    assert any("fxformer-no-such-command is not a command" in p for p in found), found
    assert any("`docs/renamed.md` does not exist" in p for p in found), found
    assert any("no renamed_module.py in" in p for p in found), found
    assert len(found) == 9, found


ESTIMATE = re.compile(r"[+-]\d+\.\d+%? \[[+-]\d+\.\d+%?, [+-]\d+\.\d+%?\]")  # "+19.5% [+17.7%, +21.4%]"
CELLS = re.compile(r"([+-]\d+\.\d+%?) \| (\[[+-]\d+\.\d+%?, [+-]\d+\.\d+%?\])")  # the same in two table cells
GENERATED = ("analysis.md", "regime.md", "table.md", "split.md")  # by experiments.analysis, .regime, collect, lr-split


def quoted_estimates(text: str, printed: str) -> list[str]:
    """The estimates with their intervals that `text` quotes and `printed` (generated pages) does
    not print, in one cell or in two beside each other."""
    known = set(ESTIMATE.findall(printed)) | {f"{value} {interval}" for value, interval in CELLS.findall(printed)}
    return [found for found in ESTIMATE.findall(text) if found not in known]


COMMIT = re.compile(r"(?<![\w/.-])([0-9a-f]{7,12})(?![\w/-])")  # a commit a page names: "(5f4157f)"


def git(*args: str, stdin: str | None = None, text: bool = True) -> str | bytes | None:
    """git's output in the checkout (bytes with text=False), None where git is missing or refuses."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], input=stdin, capture_output=True, text=text)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def pages_at(commits: list[str]) -> str:
    """The text of every generated page of experiments/results at each of `commits` (none without
    git, or for a name that is no commit)."""
    wanted = []
    for commit in commits:
        files = git("ls-tree", "-r", "--name-only", f"{commit}^{{commit}}", "--", "experiments/results") or ""
        wanted += [f"{commit}:{path}\n" for path in files.splitlines() if path.rpartition("/")[2] in GENERATED]
    return (git("cat-file", "--batch", stdin="".join(wanted)) or "") if wanted else ""


def test_every_estimate_the_pages_quote_is_one_the_results_print():
    """An estimate with its 95% CI in the README or docs is copied by hand from the pages that
    experiments.analysis and experiments.regime generate from the records: it must be one they
    print, digit for digit, now or at a commit the page names ("24 of 33 runs (5f4157f)": a sweep
    as it stood then), so that neither a slip nor a figure left behind by later runs passes."""
    made_up = "| A1 | -9.7% | [-11.4%, -7.9%] |\n| C1 | +19.5% [+17.7%, +21.4%] |\n| +0.73 [-0.26, +1.73] |"
    quoted = "A1 -9.7% [-11.4%, -7.9%], C1 +19.5% [+17.7%, +21.4%], +0.73 [-0.26, +1.73], D3 -6.3% [-7.7%, -4.8%]"
    assert quoted_estimates(quoted, made_up) == ["-6.3% [-7.7%, -4.8%]"]
    results = REPO / "experiments" / "results"
    now = "".join(p.read_text() for name in GENERATED for p in sorted(results.glob(f"**/{name}")))  # the checkout's
    missing = {}
    for page in PAGES:  # each against the checkout's pages and those at the commits it names
        text = page.read_text()
        if found := quoted_estimates(text, now + pages_at(sorted(set(COMMIT.findall(text))))):
            missing[page.name] = found
    if missing and (git("rev-parse", "--is-shallow-repository") or "true").strip() != "false":
        pytest.skip(f"{missing} may be quoted at a commit this checkout lacks (no git, or a shallow clone)")
    assert missing == {}, f"not in any generated page ({', '.join(GENERATED)}) of experiments/results: {missing}"
    if git("rev-parse", "--verify", "-q", "8c1c744^{commit}"):  # a checkout with its history
        stale = "-6.3% [-7.7%, -4.8%]"  # D3 at 23 runs (8c1c744); at 24 (5f4157f) its lower end was -7.8%
        assert quoted_estimates(stale, pages_at(["8c1c744"])) == []
        assert quoted_estimates(stale, pages_at(["5f4157f"])) == [stale]


TABLES = {  # how the README names each Table 3 sweep, and its folder of experiments/results
    "the mini profile": "table3-mini",
    "the 6,000-pair table": "table3-multi30k",
    "this table": "table3-regime",
}
VERDICTS = ("agrees", "disagrees", "equivalent", "inconclusive")
STATED = re.compile(r"(\d+)\s+/\s+(\d+)\s+/\s+(\d+)\s+/\s+(\d+)\s+of\s+(\d+)")  # "6 / 1 / 0 / 0 of 7"
BOLD = re.compile(r"\*\*(\d+) agrees?, (\d+) disagrees?, (\d+) equivalent, (\d+) inconclusive\*\*")
RESULTS_ROWS = {
    "Table 3, mini profile": "table3-mini",
    "Table 3 on real text": "table3-multi30k",
    "Table 3 on all of Multi30k": "table3-regime",
}  # the README's Results table
REGIME_PAGE, REGIME_SECTION = REPO / "docs" / "table3.md", "### The paper's data ratio"  # the regime table's page


def regime_section() -> str:
    """docs/table3.md's section on the regime table (to its end or the next heading of its level)."""
    text = REGIME_PAGE.read_text()
    section = text[text.index(REGIME_SECTION) :]
    ends = [i for i in (section.find("\n## ", 1), section.find("\n### ", 1)) if i > 0]
    return section[: min(ends)] if ends else section


def readme_regime_summary() -> str:
    """The README's section on the regime table, its heading line first."""
    text = (REPO / "README.md").read_text()
    return text[text.index("\n## Table 3 on all of Multi30k") :].split("\n## ", 2)[1]


def table_cells(line: str) -> list[str]:
    """A markdown table row's cells, stripped ('| a | b |' -> ['a', 'b'])."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


SNAPSHOT = re.compile(r"\bAt (\d+) runs \(([0-9a-f]{7,12}):")  # "At 51 runs (5d17ce9: B2's three seeds added)"
MOVING = "table3-regime"  # the sweep whose records grow as its runs finish, each landing in its own commit


@functools.cache
def regime_snapshot() -> tuple[int, str]:
    """(runs, commit) of the regime table as docs/table3.md quotes it: its paragraph of the most runs,
    "At 51 runs (5d17ce9: ...)", names the commit of the records it was written from."""
    found = [(int(runs), commit) for runs, commit in SNAPSHOT.findall(regime_section())]
    assert found, "docs/table3.md's regime section names no 'At N runs (<commit>: ...)' paragraph"
    return max(found)


def finished_runs(analysis: dict) -> int:
    """The runs an analysis.json counts: each row's seeds, base's too."""
    return sum(row["n"] for row in analysis["rows"])


@functools.cache
def generated(folder: str, name: str) -> str:
    """A generated file of experiments/results/FOLDER. The regime table's (MOVING, the learning-rate arm
    too) as it stood at the commit docs/table3.md names, so that the pages quote one state of the records
    and a run that lands later does not make them wrong; without git or that commit, the checkout's
    where it holds that many runs."""
    path = f"experiments/results/{folder}/{name}"
    if not folder.startswith(MOVING):
        return (REPO / path).read_text()
    runs, commit = regime_snapshot()
    if (text := git("show", f"{commit}:{path}")) is not None:
        return text
    checkout = json.loads((REPO / "experiments" / "results" / MOVING / "analysis.json").read_text())
    if finished_runs(checkout) != runs:
        pytest.skip(f"docs/table3.md quotes the regime table at {commit}, which this checkout lacks (no git?)")
    return (REPO / path).read_text()


def analysis_of(folder: str) -> dict:
    """A sweep's result under its plan: analysis.json, written by experiments.analysis (the regime
    table's at the commit docs/table3.md names)."""
    return json.loads(generated(folder, "analysis.json"))


def finished_records(data: bytes) -> dict[tuple[str, int], dict]:
    """(row, seed) -> final evaluations of each finished run of a records.jsonl.gz."""
    lines = [json.loads(line) for line in gzip.decompress(data).splitlines()[1:]]
    return {(r["row"], r["seed"]): r["evals"] for r in lines if r["state"] == "finished"}


def test_the_regime_table_is_quoted_at_one_commit_of_its_own_records():
    """The regime table's pages quote its records at a commit docs/table3.md names: that commit's
    analysis holds the runs the paragraph says, the README's Results row says as many, and each of its
    finished runs is in the checkout's records with the same evaluations (the same sweep, grown)."""
    runs, commit = regime_snapshot()
    assert finished_runs(analysis_of(MOVING)) == runs, (runs, commit)
    (line,) = [line for line in (REPO / "README.md").read_text().splitlines() if "| Table 3 on all of Multi30k" in line]
    assert f"{runs} runs)" in line, (runs, line)
    records = REPO / "experiments" / "results" / MOVING / "records.jsonl.gz"
    if (shown := git("show", f"{commit}:{records.relative_to(REPO)}", text=False)) is None:
        pytest.skip(f"this checkout lacks {commit} (no git, or a shallow clone)")
    then, now = finished_records(shown), finished_records(records.read_bytes())
    assert len(then) == runs and {key: now.get(key) for key in then} == then


def counts_of(folder: str) -> tuple[int, ...]:
    """A sweep's verdict counts under the plan, and the number of rows they count."""
    counts = analysis_of(folder)["counts"]
    found = tuple(counts[verdict] for verdict in VERDICTS)
    return (*found, sum(found))


def test_the_verdict_counts_the_readme_states_are_the_analysis_counts():
    """The counts of each Table 3 sweep (agree / disagree / equivalent / inconclusive of the counted
    rows), in the README's Results table and in docs/table3.md's regime section, are typed by hand:
    each must be the count that sweep's analysis.json holds (the regime table's at the commit docs/table3.md
    names), so that a table that moved is not left behind."""
    text = (REPO / "README.md").read_text()
    stated = regime_section()
    stated = stated[stated.index("the tables' counts") :]
    for name, folder in TABLES.items():
        found = re.search(r"\s+".join([*map(re.escape, name.split()), STATED.pattern]), stated)
        assert found, f"docs/table3.md's regime section states no counts for {name} ('a / b / c / d of n')"
        assert tuple(map(int, found.groups())) == (counts := counts_of(folder)), (name, found.group(0), counts)
    lines = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| Table 3")}
    for start, folder in RESULTS_ROWS.items():
        (line,) = [line for cell, line in lines.items() if cell.startswith(start)]
        found = BOLD.search(line)
        assert found, f"the Results row '{start}' states no '**a agree, b disagree, c equivalent, d inconclusive**'"
        assert tuple(map(int, found.groups())) == (counts := counts_of(folder)[:4]), (start, found.group(0), counts)


NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
    "thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}  # fmt: skip
SAME_ROWS = re.compile(
    r"[Oo]n the same (\w+) rows,? the 6,000-pair table had ([^.;()]*?)(?:,? and the mini profile ([^.;()]*?))?"
    r"(?: \(([^)]*) not counted there\))?[.;]"
)  # "On the same 16 rows the 6,000-pair table had 4 agree, 8 disagree, 4 equivalent, and the mini profile ..."
COUNT = re.compile(r"(\d+) (agrees?|disagrees?|equivalent|inconclusive)\b")


def same_rows_counts(text: str) -> list[tuple[int, dict[str, int], dict[str, int] | None, list[str]]]:
    """Each 'on the same N rows' contrast a text states: (N, the 6,000-pair table's counts by verdict, the
    mini profile's or None, the rows named as not counted in mini)."""
    found = []
    for rows, six, mini, uncounted in SAME_ROWS.findall(" ".join(text.split())):
        counts = [{PLURAL.get(w, w): int(n) for n, w in COUNT.findall(part)} for part in (six, mini)]
        rows = int(rows) if rows.isdigit() else NUMBER_WORDS[rows]
        found.append((rows, counts[0], counts[1] if mini else None, re.findall(ROW, uncounted)))
    return found


def newest_snapshot_paragraph() -> str:
    """The regime section's paragraph 'At N runs (<commit>: ...)' of the most runs."""
    runs, commit = regime_snapshot()
    (paragraph,) = [p for p in regime_section().split("\n\n") if f"At {runs} runs ({commit}:" in p]
    return paragraph


def test_the_same_rows_contrasts_are_the_other_tables_verdicts_on_the_rows_this_table_counts():
    """'On the same N rows the 6,000-pair table had ...' (the README's summary, and the newest paragraph of
    docs/table3.md's regime section) is typed by hand: N must be the rows the regime table counts at the
    commit the docs name, and each count that of the 6,000-pair table's (and the mini profile's) verdicts
    on those rows, its rows without a verdict named as not counted."""
    counted = [r["row"] for r in analysis_of(MOVING)["rows"] if r["verdict"]]
    stated = {
        "README.md": same_rows_counts(readme_regime_summary()),
        "docs/table3.md": same_rows_counts(newest_snapshot_paragraph()),
    }
    assert all(stated.values()), f"no 'on the same N rows the 6,000-pair table had ...' in {stated}"
    wanted = {}
    for folder in ("table3-multi30k", "table3-mini"):
        verdicts = {r["row"]: r["verdict"] for r in analysis_of(folder)["rows"]}
        found = [verdicts[row] for row in counted]
        wanted[folder] = ({v: found.count(v) for v in VERDICTS if v in found}, [r for r in counted if not verdicts[r]])
    for page, contrasts in stated.items():
        for rows, six, mini, uncounted in contrasts:
            assert rows == len(counted), (page, rows, counted)
            assert {v: n for v, n in six.items() if n} == wanted["table3-multi30k"][0], (page, six, wanted)
            if mini is not None:
                assert ({v: n for v, n in mini.items() if n}, uncounted) == wanted["table3-mini"], (page, mini, wanted)
    text = "On the same 16 rows the 6,000-pair table had 4 agree, 8 disagree, 4 equivalent, and the mini profile "
    text += "5 agree, 2 disagree, 7 inconclusive (C1 and D1 not counted there)."
    assert same_rows_counts(text) == [
        (
            16,
            {"agrees": 4, "disagrees": 8, "equivalent": 4},
            {"agrees": 5, "disagrees": 2, "inconclusive": 7},
            ["C1", "D1"],
        )
    ]


READOUTS_HEADER = "| row | the change | the paper | Δ dev PPL here [95% CI] | step 2,500 | step 3,750 | last step |"
READOUTS = {"step 2,500": "step:2500", "step 3,750": "step:3750", "last step": "final"}  # column -> analysis.json


def test_the_readouts_table_gives_each_counted_rows_verdict_at_the_three_readouts():
    """docs/table3.md's table of each counted row at steps 2,500 and 3,750 and the last (the plan's
    readouts) is typed by hand: each verdict must be analysis.json's at the commit the section names, and
    every counted row must be in it once."""
    section = regime_section()
    assert section.count(READOUTS_HEADER) == 1, "docs/table3.md's regime section has no readouts table"
    lines = section[section.index(READOUTS_HEADER) :].split("\n\n", 1)[0].splitlines()[2:]
    analysis = analysis_of(MOVING)
    columns = table_cells(READOUTS_HEADER)
    shown = {}
    for line in lines:
        cells = dict(zip(columns, table_cells(line)))
        shown[cells["row"]] = {column: cells[column] for column in READOUTS}
    wanted = {
        r["row"]: {column: analysis["readouts"][key][r["row"]] for column, key in READOUTS.items()}
        for r in analysis["rows"]
        if r["verdict"]
    }
    assert len(shown) == len(lines) and shown == wanted, {
        r: (shown.get(r), v) for r, v in wanted.items() if shown.get(r) != v
    }
    assert all(wanted[row]["last step"] == r["verdict"] for r in analysis["rows"] if (row := r["row"]) in wanted)


ROW = r"(?:A\d|B\d|C\d|D\d|E|big)"
ROWS_CELL = re.compile(rf"^({ROW}(?:, {ROW})*)(?::|$)")  # "C1: N=1", "C2, C4, C6: ...", "big"
VERDICT_WORD = re.compile(r"\b(disagrees?|agrees?|equivalent|inconclusive|not counted|not run)\b")
PLURAL = {"agree": "agrees", "disagree": "disagrees"}  # "C1, C4: agree"


def claimed_verdicts(folder: str) -> dict[str, str]:
    """Each row's verdict in a sweep's analysis.json: against its claim where the paper states one
    (the claims table's verdict), else against the paper's direction; 'not run' without seeds."""
    analysis = analysis_of(folder)
    found = {r["row"]: r["verdict"] or ("not counted" if r["n"] else "not run") for r in analysis["rows"]}
    for claim in analysis["claims"]:
        found.update(claim["verdicts"])
    return found


def test_the_claims_table_gives_each_tables_verdicts():
    """docs/table3.md's table of the paper's claims gives, for each row it names, the verdict of the
    mini, the 6,000-pair and the regime table under their plans ('agree' for 'agrees' where a cell
    names several rows): the words are typed by hand, the verdicts are analysis.json's."""
    section = regime_section()
    tables = [claimed_verdicts(folder) for folder in TABLES.values()]
    checked = set()
    for line in section.splitlines():
        cells = table_cells(line) if line.startswith("|") else []
        if len(cells) < 5 or not (named := ROWS_CELL.match(cells[1])):
            continue
        rows = named.group(1).split(", ")
        for verdicts, cell in zip(tables, cells[2:5]):
            words = [PLURAL.get(word, word) for word in VERDICT_WORD.findall(cell)]
            expected = [verdicts[row] for row in rows]
            assert words[: len(rows)] == expected or words == ["not run"] == sorted(set(expected)), (line, expected)
        checked.update(rows)
    regime = analysis_of(TABLES["this table"])
    wanted = {row for claim in regime["claims"] for row in claim["verdicts"]}  # every row a claim names,
    wanted |= {r["row"] for r in regime["rows"] if r["n"] and r["row"] != "base"}  # and every row the sweep ran
    assert checked >= wanted, f"rows the claims table leaves out: {sorted(wanted - checked)}"


PERCENT = re.compile(r"^[;,\s]*([+-]\d+\.\d+%)")  # the change a verdict cell gives before its word


def regime_rows() -> dict[str, list[str]]:
    """regime.md's table at the commit docs/table3.md quotes: each row's cells (the changes and verdicts
    in both tables, the interaction)."""
    text = generated(MOVING, "regime.md")
    cells = [table_cells(line) for line in text.splitlines() if line.startswith("| ")]
    return {row[0]: row[1:] for row in cells[1:]}


def claims_table_numbers(section: str) -> list[tuple[str, str, str]]:
    """(row, column, figure) for each change and interaction the claims table gives: the change before a
    row's verdict in the 6,000-pair and all-pairs columns, the interaction ('A2: +3.4% [...]; A3: ...')."""
    found = []
    for line in section.splitlines():
        cells = table_cells(line) if line.startswith("|") else []
        if len(cells) < 6 or not (named := ROWS_CELL.match(cells[1])):
            continue
        rows = named.group(1).split(", ")
        for column, cell in (("6,000 pairs", cells[3]), ("all pairs", cells[4])):
            start = 0
            for row, word in zip(rows, VERDICT_WORD.finditer(cell)):
                if change := PERCENT.match(cell[start : word.start()]):
                    found.append((row, column, change.group(1)))
                start = word.end()
        for part in filter(None, cells[5].split("; ")):
            row, _, figure = part.rpartition(": ")
            found.append((row or rows[0], "interaction", figure))
    return found


def test_the_claims_table_gives_each_change_and_interaction_as_regime_md_prints_it_at_the_named_commit():
    """The claims table's changes (the 6,000-pair and all-pairs columns) and interactions are typed by
    hand: each must be regime.md's at the records the section quotes, not a figure from fewer runs."""
    columns = {"6,000 pairs": 0, "all pairs": 2, "interaction": 4}
    printed = regime_rows()
    figures = claims_table_numbers(regime_section())
    wrong = [
        (row, column, figure, printed[row][columns[column]])
        for row, column, figure in figures
        if not printed[row][columns[column]].startswith(figure) or (column == "interaction") != ("[" in figure)
    ]
    assert figures and wrong == [], wrong
    assert {row for row, column, _ in figures if column == "interaction"} >= {
        row for row, cells in printed.items() if cells[4]
    }, "an interaction regime.md prints is missing"
    line = "| x | A2, A3: h=4 | inconclusive | -5.5%, disagrees; +5.3%, disagrees | x | A2: +3.4% [+1.0%, +5.8%] |"
    assert claims_table_numbers(line) == [
        ("A2", "6,000 pairs", "-5.5%"),
        ("A3", "6,000 pairs", "+5.3%"),
        ("A2", "interaction", "+3.4% [+1.0%, +5.8%]"),
    ]


WORKED_ON = re.compile(
    r"the call\b|\bcalls? ran|carried|background time|compile budget|\bgoal\b|this CPU|stretch|\blande(d|r)\b", re.I
)


def test_the_pages_speak_of_the_software_not_of_how_the_repository_was_worked_on():
    """A results page gives the commit, date, machine and wall time of what it reports; not calls,
    carried files, stretches, landings or budgets. PLAN.md files are dated records, left as written."""
    pages = [*PAGES, *(p for p in (REPO / "experiments" / "results").rglob("*.md") if p.name != "PLAN.md")]
    found = [f"{p.relative_to(REPO)}: {m[0]}" for p in pages for m in WORKED_ON.finditer(p.read_text())]
    assert found == []
    assert [m[0] for m in WORKED_ON.finditer("4 more hours of this CPU; the lander stopped")] == ["this CPU", "lander"]


def test_the_readme_summary_of_the_regime_table_is_at_most_150_words_and_its_figure():
    section = readme_regime_summary()
    figures = [line for line in section.splitlines() if line.startswith("![")]
    prose = " ".join(line for line in section.splitlines()[1:] if not line.startswith("!["))
    assert len(prose.split()) <= 150 and len(figures) == 1, (len(prose.split()), figures)


def test_the_learning_rate_split_docs_table3_shows_is_the_generated_one():
    """docs/table3.md's table of the learning-rate arm is lr2/split.md's, row for row, at the records
    the regime section quotes (its Δ on all pairs at factor 1 moves with base's seeds)."""
    split = generated(f"{MOVING}/lr2", "split.md")
    page = (REPO / "docs" / "table3.md").read_text()
    section = page[page.index("#### The learning rate's share") :]
    rows = [line for line in split.splitlines() if line.startswith(("| row |", "| C5 |", "| D2 |"))]
    assert len(rows) == 3 and all(section.count(row + "\n") == 1 for row in rows), "copy lr2/split.md's table"


def test_the_readme_is_at_most_200_lines_and_1600_words_and_its_map_names_what_newcomers_look_for():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200 and len(text.split()) <= 1600, (len(text.splitlines()), len(text.split()))
    block = text.split("## The repository", 1)[1].split("```", 2)[1]
    named = {line.split()[0] for line in block.splitlines() if line.strip()}
    assert {"api.py", "kernels/", "analysis/", "scripts/", "benchmarks/gpu/"} <= named, sorted(named)


HEADS = {"A1": 1, "A2": 4, "A3": 16, "A4": 32}  # the head rows, with base's eight


def relative(estimate: float) -> str:
    """A log-scale estimate as the pages print a change: '+4.6%'."""
    return f"{100 * math.expm1(estimate):+.1f}%"


def referee_paragraph() -> str:
    section = regime_section()
    return section[section.index("**What a referee asks first.**") :].split("\n\n", 1)[0]


def test_the_head_rows_are_stated_with_their_d_k_and_changes_from_analysis_json():
    """The d_k confound: each head row's d_k (d_model / h, from the regime table's config) and its change
    against base (analysis.json at the named commit), in the order of d_k, with base's 0 among them."""
    text = " ".join(referee_paragraph().split())
    rows = {r["row"]: r for r in analysis_of(MOVING)["rows"]}
    d_model = 64
    order = sorted([*HEADS, "base"], key=lambda row: -d_model // HEADS.get(row, 8))
    d_k = ", ".join(str(d_model // HEADS.get(row, 8)) for row in order[:-1]) + f" and {d_model // HEADS[order[-1]]}"
    heads = ", ".join(str(HEADS.get(row, 8)) for row in order[:-1]) + f" and {HEADS[order[-1]]}"
    assert f"d_k = d_model/h is {d_k} for h = {heads}" in text
    changes = [relative(rows[row]["estimate"]) if row != "base" else "0" for row in order]
    assert f"{', '.join(changes[:-1])} and {changes[-1]} against base" in text, changes
    for row in ("B1", "B2"):
        assert relative(rows[row]["estimate"]) in text
    readme = " ".join(readme_regime_summary().split())
    assert "one head of d_k 64 and four of d_k 16 beat base's eight of d_k 8, sixteen of d_k 4 worse" in readme


def base_seeds(records: bytes, seeds=(0, 1, 2)) -> tuple[float, float]:
    """(geometric mean dev perplexity, mean test BLEU) of base's `seeds` in a records.jsonl.gz."""
    evals = finished_records(records)
    found = [evals[("base", seed)] for seed in seeds]
    ppl = math.exp(sum(math.log(e["validation"]["ppl"]) for e in found) / len(found))
    return ppl, sum(e["test"]["bleu"] for e in found) / len(found)


def test_the_learning_rate_finding_is_base_at_both_rates_on_the_same_three_seeds():
    runs, commit = regime_snapshot()
    arms = {}
    for arm, path in (("paper", "records.jsonl.gz"), ("twice", "lr2/records.jsonl.gz")):
        name = f"experiments/results/{MOVING}/{path}"
        data = git("show", f"{commit}:{name}", text=False) or (REPO / name).read_bytes()
        arms[arm] = base_seeds(data)
    (ppl1, bleu1), (ppl2, bleu2) = arms["paper"], arms["twice"]
    text = " ".join(referee_paragraph().split())
    assert f"dev perplexity {ppl2:.2f} instead of {ppl1:.2f} ({relative(math.log(ppl2 / ppl1))})" in text
    assert f"test BLEU {bleu2:.2f} instead of {bleu1:.2f}, on the same three seeds (0-2)" in text
    lr2 = {r["row"]: r["verdict"] for r in json.loads(generated(f"{MOVING}/lr2", "analysis.json"))["rows"]}
    main = {r["row"]: r["verdict"] for r in analysis_of(MOVING)["rows"]}
    assert sorted(row for row, verdict in lr2.items() if verdict) == ["C5", "D2"]
    assert all(lr2[row] == main[row] for row in ("C5", "D2")) and f"({main['C5']}, {main['D2']})" in text
    readme = " ".join(readme_regime_summary().split())
    assert f"twice the learning rate is {-round(100 * (ppl2 / ppl1 - 1))}% better" in readme


def test_label_changes_are_set_apart_from_the_interactions_regime_md_prints():
    """The rows whose verdict label moved but whose interaction's interval includes 0 (E, C2), and A3,
    are named with regime.md's interaction and p; the section no longer says the regime 'explains'."""
    printed = regime_rows()  # row -> [Δ first, verdict, Δ second, verdict, interaction, p, ...]
    section = " ".join(regime_section().split())
    not_significant = []
    for row, cells in printed.items():
        if not cells[4]:
            continue
        low, high = (float(x.rstrip("%]")) for x in cells[4].split("[")[1].split(", "))
        if low <= 0 <= high:
            not_significant.append(row)
            assert f"{row} ({cells[4]}" in section, (row, cells[4])
            moved = cells[1] != cells[3]
            assert moved == (row in ("E", "C2")), (row, cells[1], cells[3])
    assert sorted(not_significant) == ["A3", "C2", "E"]
    assert "What the regime explains" not in section and "**What changed between the two tables.**" in section
    readme = " ".join(readme_regime_summary().split())
    assert "the interaction test finds E's and C2's changes not significant" in readme


def test_the_convergence_readout_is_labelled_by_the_step_it_starts_from():
    """'the last 20%' is measured from the last dev evaluation at or before 80% of the steps: the regime
    section names that step and the share it covers."""
    name = f"experiments/results/{MOVING}/records.jsonl.gz"
    records = [json.loads(line) for line in gzip.decompress((REPO / name).read_bytes()).splitlines()[1:]]
    base = next(r for r in records if r["row"] == "base" and r["state"] == "finished")
    total = base["step"]
    evals = [p["step"] for p in base["curve"] if "dev_ppl" in p or "dev_loss" in p]
    start = max(step for step in evals if step <= 0.8 * total)
    section = " ".join(regime_section().split())
    assert f"step {start:,} of {total:,}, the last {100 * (total - start) / total:.1f}%" in section
    assert "over the last 20% of the steps" not in section
