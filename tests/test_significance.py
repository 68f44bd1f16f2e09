"""The paired comparison (fxformer/significance.py, fxformer/compare.py) against sacreBLEU's own
command line on the same files: scores, bootstrap means and 95% half-widths, and both tests'
p-values; the difference's interval against a NumPy recomputation from the same resamples with
sacreBLEU's public corpus_score; identical systems named, not tested; bad input in one sentence."""

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from conftest import refused_in_process

from fxformer import compare, evaluation, paths, significance
from fxformer.config import load_workdir_config

WORDS = "der die das hund katze mann frau sieht hat gibt ein eine alte junge lehrer mutter".split()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A reference file and two systems' translations of it (B closer to the references than A)."""
    rng = random.Random(0)
    references = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(60)]

    def system(p: float) -> list[str]:
        return [" ".join(w if rng.random() > p else rng.choice(WORDS) for w in r.split()) for r in references]

    here = tmp_path_factory.mktemp("systems")
    texts = {"ref.txt": references, "a.txt": system(0.35), "b.txt": system(0.3)}
    for name, lines in texts.items():
        (here / name).write_text("".join(line + "\n" for line in lines))
    return {name: here / name for name in texts}


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def sacrebleu_cli(files, test: str) -> str:
    command = [sys.executable, "-m", "sacrebleu", str(files["ref.txt"]), "-i", str(files["a.txt"]), str(files["b.txt"])]
    command += ["-m", "bleu", "chrf", f"--paired-{test}", "-f", "json" if test == "ar" else "text", "-w", "4"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_figures_are_sacrebleus_command_lines_on_the_same_files(files):
    report = significance.compare([("a", lines(files["a.txt"])), ("b", lines(files["b.txt"]))], lines(files["ref.txt"]))
    printed = sacrebleu_cli(files, "bs")  # '33.3802 (33.4483 ± 7.2911)' per system and metric, then '(p = 0.0010)'
    cells = re.findall(r"(\d+\.\d+) \((\d+\.\d+) ± (\d+\.\d+)\)", printed)
    p_values = [float(p) for p in re.findall(r"\(p = (\d\.\d+)\)", printed)]
    ours = [(row[m]["score"], row[m]["mean"], row[m]["ci"]) for row in report["systems"] for m in ("BLEU", "chrF2")]
    assert len(cells) == 4 and len(p_values) == 2
    for theirs, mine in zip(cells, ours, strict=True):
        assert [f"{x:.4f}" for x in mine] == list(theirs)
    b = report["systems"][1]
    assert [round(b[m]["p_bootstrap"], 4) for m in ("BLEU", "chrF2")] == p_values
    ar = json.loads(sacrebleu_cli(files, "ar"))  # full precision
    assert [b[m]["p_randomization"] for m in ("BLEU", "chrF2")] == [ar[1][m]["p_value"] for m in ("BLEU", "chrF2")]
    assert 0 < b["BLEU"]["p_randomization"] < 1 and report["comparisons"] == 1 and report["seed"] == 12345
    assert b["BLEU"]["difference"] == pytest.approx(b["BLEU"]["score"] - report["systems"][0]["BLEU"]["score"])


def test_the_differences_interval_is_a_numpy_recomputation_from_the_same_resamples(files):
    references, a, b = (lines(files[name]) for name in ("ref.txt", "a.txt", "b.txt"))
    n, resamples = len(references), 200
    report = significance.compare([("a", a), ("b", b)], references, resamples=resamples, trials=100)
    indices = np.random.default_rng(12345).choice(n, size=(resamples, n), replace=True)  # sacreBLEU's draw

    def bleu(hyps, rows):
        return sacrebleu.corpus_bleu([hyps[i] for i in rows], [[references[i] for i in rows]]).score

    diffs = np.sort([bleu(b, rows) - bleu(a, rows) for rows in indices])
    k = resamples // 40  # the 2.5% from each end, as sacreBLEU's own intervals
    low, high = report["systems"][1]["BLEU"]["difference_ci"]
    # sacreBLEU sums its statistics in float32: the scores agree to about 1e-6 of a BLEU point
    assert (low, high) == pytest.approx((diffs[k], diffs[resamples - k - 1]), abs=1e-4)
    assert low < report["systems"][1]["BLEU"]["difference"] < high


def test_a_system_identical_to_the_baseline_is_named_and_not_tested(files):
    a = lines(files["a.txt"])
    report = significance.compare([("a", a), ("a again", list(a))], lines(files["ref.txt"]), resamples=50, trials=50)
    again = report["systems"][1]
    assert again["identical"] and "p_bootstrap" not in again["BLEU"] and "difference_ci" not in again["chrF2"]
    assert "identical translations: no test" in significance.table(report)


def test_the_command_prints_the_table_writes_the_report_and_refuses_in_one_sentence(files, tmp_path, monkeypatch):
    out = tmp_path / "report.json"
    argv = [f"--references={files['ref.txt']}", str(files["a.txt"]), str(files["b.txt"]), f"--out={out}"]
    monkeypatch.setattr(sys, "argv", ["fxformer.compare", *argv])
    compare.main()
    report = json.loads(out.read_text())
    assert [row["system"] for row in report["systems"]] == [str(files["a.txt"]), str(files["b.txt"])]
    short = tmp_path / "short.txt"
    short.write_text("ein hund\n")
    for flags, words in [
        ([f"--references={files['ref.txt']}", str(files["a.txt"]), str(short)], "1 translations for 60 references"),
        ([f"--references={files['ref.txt']}", str(files["a.txt"])], "needs two systems or more"),
        ([str(files["a.txt"]), str(files["b.txt"])], "Give the runs (--workdir=A --workdir=B) or the files"),
        (["--workdir=w", str(files["a.txt"])], "go with --references, not --workdir"),
    ]:
        assert words in refused_in_process(monkeypatch, compare.main, flags, tmp_path / "none")


@pytest.mark.slow  # evaluates a tiny run in-process
def test_two_runs_are_compared_on_their_evaluations_translations(tiny_run, tmp_path, monkeypatch, capsys):
    """a's evaluation is already written (here by hand, as evaluate names it) and is read, not made
    again; b has none, so it is evaluated now; the report scores both as sacreBLEU does."""
    a, b = tiny_run(tmp_path / "a", 2), tiny_run(tmp_path / "b", 2)  # one trained run, twice
    config = load_workdir_config(paths.Workdir(a))
    references = evaluation.references_of(config, "validation", 6, log=lambda *x: None)[2]
    kept = ["ein hund", "der mann", "die frau", "das kind", "ein lehrer", "die katze"]
    (a / "eval").mkdir()
    for suffix, text in ((".json", "{}\n"), (".hyp.txt", kept), (".ref.txt", references)):
        body = text if isinstance(text, str) else "".join(line + "\n" for line in text)
        (a / "eval" / f"validation-2-first6{suffix}").write_text(body)
    flags = [f"--workdir={a}", f"--workdir={b}", "--split=validation", "--limit=6"]
    monkeypatch.setattr(sys, "argv", ["fxformer.compare", *flags])
    compare.main()
    report = json.loads((a / "eval" / "compare-validation-a-b.json").read_text())
    hyp_b = (b / "eval" / "validation-2-first6.hyp.txt").read_text().splitlines()  # written by the command
    assert (b / "eval" / "validation-2-first6.ref.txt").read_text().splitlines() == references
    assert report["systems"][0]["BLEU"]["score"] == pytest.approx(sacrebleu.corpus_bleu(kept, [references]).score)
    assert report["systems"][1]["BLEU"]["score"] == pytest.approx(sacrebleu.corpus_bleu(hyp_b, [references]).score)
    assert "baseline" in capsys.readouterr().out
