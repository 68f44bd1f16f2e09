"""`fxformer.load`, the Python API for a trained run, against the commands it shares its code path
with: its translations are `fxformer.translate`'s, its scores give `evaluate`'s perplexity, and a
workdir it cannot load is refused in the commands' sentence. `import fxformer` stays free of JAX."""

import ast
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_module

import fxformer
from fxformer.data import corpora
from fxformer.errors import UserError

SENTENCES = ["The old teacher has helped the boy.", "", "My mother sees the dog."]


@pytest.fixture(scope="module")
def trained(tiny_run, tmp_path_factory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("api") / "w", 4)


def test_translate_is_what_the_command_prints_for_the_same_input_and_options(trained, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    for options in ({}, {"beam_size": 2, "alpha": 1.0}):
        flags = [f"--config.decode.{key}={value}" for key, value in options.items()]
        printed = run_module("fxformer.translate", f"--workdir={trained}", f"--input={source}", *flags)
        assert printed.returncode == 0, printed.stderr[-2000:]
        ours = fxformer.load(str(trained)).translate(SENTENCES, **options)
        assert printed.stdout.splitlines() == ours and ours[1] == ""
    assert fxformer.load(trained).translate(SENTENCES[0]) == fxformer.load(trained).translate(SENTENCES)[0]


def test_the_scores_of_a_split_give_the_perplexity_evaluate_reports(trained, tmp_path):
    run = fxformer.load(trained, step=4, average_last=1)
    data = run.config.data
    records = corpora.data_source(corpora.prepare(data, log=lambda *a: None), "validation")
    n = 40
    sources = [records[i][data.source_lang].decode() for i in range(n)]
    targets = [records[i][data.target_lang].decode() for i in range(n)]
    scores = run.score(sources, targets)
    assert all(s.tokens == len(run.tokenizer.encode(t)) for s, t in zip(scores, targets))
    ppl = math.exp(-sum(s.log_prob for s in scores) / sum(s.tokens for s in scores))
    reported = run.evaluate("validation", limit=n)
    assert reported["num_sentences"] == n and Path(reported["path"]).is_file()
    assert ppl == pytest.approx(reported["ppl"], rel=1e-6)
    # the same pairs as two text files, evaluated into a folder of one's own: the same scores, W/eval/ untouched
    (tmp_path / "dev.en").write_text("".join(s + "\n" for s in sources))
    (tmp_path / "dev.de").write_text("".join(t + "\n" for t in targets))
    before = sorted(p.name for p in (trained / "eval").iterdir())
    files = run.evaluate((str(tmp_path / "dev.en"), str(tmp_path / "dev.de")), out=tmp_path / "mine")
    assert (
        Path(files["path"]) == tmp_path / "mine" / "dev.en-4.json"
        and sorted(p.name for p in (trained / "eval").iterdir()) == before
    )
    assert (files["ppl"], files["bleu"], files["chrf"]) == (reported["ppl"], reported["bleu"], reported["chrf"])
    # each sentence's own: the log-softmax of the model's logits at its targets, computed here with NumPy
    logits = np.asarray(
        run.restored.model.apply(
            {"params": run.params}, run.tokenizer.encode(sources[0])[None], run.tokenizer.encode(targets[0])[None]
        )[0],
        np.float64,
    )
    ids = run.tokenizer.encode(targets[0])
    top = logits.max(-1, keepdims=True)
    log_softmax = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    assert scores[0].log_prob == pytest.approx(log_softmax[np.arange(len(ids)), ids].sum(), rel=1e-5)


def test_the_checkpoint_choices_and_attention(trained):
    latest, at_two = fxformer.load(trained), fxformer.load(trained, step="2")
    assert latest.steps == [4] and at_two.steps == [2] and fxformer.load(trained, step=2).steps == [2]
    assert latest.config.model.num_layers == at_two.config.model.num_layers
    w = latest.attention("The dog sleeps.")
    layers, heads = latest.config.model.num_layers, latest.config.model.num_heads
    assert w.cross.shape[:2] == (layers, heads) and np.allclose(w.cross.sum(-1), 1.0, atol=1e-5)
    assert w.target == latest.translate("The dog sleeps.")


def test_a_workdir_that_is_no_run_is_refused_in_the_commands_sentence(trained, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="config.json") as raised:
        fxformer.load(tmp_path / "empty")
    printed = run_module("fxformer.translate", f"--workdir={tmp_path / 'empty'}", "--input=/dev/null")
    assert printed.returncode != 0 and str(raised.value) in printed.stderr
    with pytest.raises(UserError, match="'latest', 'best', 'ema' or a step number"):
        fxformer.load(tmp_path / "empty", step="last")
    with pytest.raises(UserError, match="only --config.decode"):
        fxformer.load(trained, overrides=[("model.d_model", "8")])
    with pytest.raises(UserError, match="beam_size"):
        fxformer.load(trained).translate(SENTENCES, beam_size=0)


def test_importing_fxformer_imports_no_jax_until_load_is_used():
    code = (
        "import sys, fxformer; assert 'jax' not in sys.modules, 'jax'; "
        "assert 'load' in dir(fxformer); fxformer.load; assert 'jax' in sys.modules; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


REPO = Path(__file__).resolve().parent.parent


def restore_calls(tree: ast.AST) -> list[ast.AST]:
    """The calls of `inference.restore` in a module: `inference.restore(...)`, `fxformer.inference.restore(...)`
    or a bare `restore(...)` imported from `fxformer.inference`."""
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "fxformer.inference"
        for alias in node.names
        if alias.name == "restore"
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "restore" and ast.unparse(f.value).endswith("inference"):
            found.append(node)
        elif isinstance(f, ast.Name) and f.id in imported:
            found.append(node)
    return found


def test_inference_restore_has_one_caller_fxformer_load():
    callers = []
    for path in sorted(REPO.glob("**/*.py")):
        if any(part.startswith(".") for part in path.relative_to(REPO).parts):  # .venv, .git
            continue
        tree = ast.parse(path.read_text(), str(path))
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
        for call in restore_calls(tree):
            inside = [f.name for f in functions if f.lineno <= call.lineno <= (f.end_lineno or f.lineno)]
            callers.append(f"{path.relative_to(REPO)}:{inside[-1] if inside else '<module>'}")
        for node in ast.walk(tree) if path.parts[-2] != "tests" else ():  # docstring recipes: what readers copy
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "inference.restore(" in node.value:
                callers.append(f"{path.relative_to(REPO)}: a string shows inference.restore(...)")
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if "inference.restore(" in page.read_text():
            callers.append(f"{page.relative_to(REPO)}: shows inference.restore(...)")
    assert callers == ["fxformer/api.py:load"]


class Loaded(Exception):
    """Raised by the stand-in for `fxformer.api.load`: the command reached it, with these arguments."""


@pytest.mark.parametrize(
    "module, flags",
    [
        ("evaluate", ["--split=test", "--limit=2", "--config.decode.beam_size=2"]),
        ("attention_maps", ["--source=The dog sleeps."]),
        ("translate", ["--input=/dev/null"]),
    ],
)
def test_the_commands_load_their_run_through_fxformer_load(trained, monkeypatch, module, flags):
    import importlib

    from fxformer import api

    calls = []

    def load(*args, **kwargs):
        calls.append((args, kwargs))
        raise Loaded

    monkeypatch.setattr(api, "load", load)
    monkeypatch.setattr(sys, "argv", [module, f"--workdir={trained}", "--step=2", *flags])
    with pytest.raises(Loaded):
        importlib.import_module(f"fxformer.{module}").main()
    ((args, kwargs),) = calls
    runs = args[0] if module != "attention_maps" else [args[0]]  # translate and evaluate take a list (an ensemble)
    assert [str(run.root) for run in runs] == [str(trained)] and args[1] == 2
    if module == "evaluate":
        assert ("decode.beam_size", "2") in args[3]
    if module == "attention_maps":  # an average it makes is not written outside W/attention/
        assert kwargs == {"keep_average": False}
    else:
        assert kwargs == {"average": "probabilities"}
