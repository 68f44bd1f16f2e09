"""n-best and sampling from the command line, decode overrides, scoring a translation file,
and a workdir written before the decode section (on the run trained with 8 fake devices)."""

import json
import shutil
import subprocess
import sys

import pytest
from conftest import env_with_devices, left_as_is, on_two_processes, own_lines, refused_in_process

from fxformer import exitcodes

LINES = "The dog sees the man.\nToday the woman buys a book.\n\nThe children are reading.\n"


def run(module, *args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env_with_devices(1), capture_output=True, text=True, input=stdin
    )


def translate(workdir, *flags):
    result = run("fxformer.translate", f"--workdir={workdir}", "--step=20", *flags, stdin=LINES)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_nbest_prints_k_scored_translations_per_line_best_first(eight_device_workdir):
    out = translate(eight_device_workdir, "--config.decode.nbest=3").splitlines()
    assert len(out) == 4 * 3
    rows = [line.split("\t") for line in out]
    assert all(len(row) == 3 for row in rows)
    assert [int(row[0]) for row in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [row[1:] for row in rows[6:9]] == [["", ""]] * 3  # the blank line: no translation, no score
    for i in (0, 1, 3):
        scores = [float(row[1]) for row in rows[3 * i : 3 * i + 3]]
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
    best = translate(eight_device_workdir).splitlines()  # nbest 1: the plain best translation per line
    assert [best[i] for i in (0, 1, 3)] == [rows[3 * i][2] for i in (0, 1, 3)] and best[2] == ""


@pytest.mark.slow
def test_sampling_with_a_seed_repeats_and_another_seed_differs(eight_device_workdir):
    flags = ["--config.decode.strategy=sample", "--config.decode.temperature=0.7", "--config.decode.seed=5"]
    first, again = translate(eight_device_workdir, *flags), translate(eight_device_workdir, *flags)
    assert first == again and len(first.splitlines()) == 4
    many = translate(eight_device_workdir, *flags[:2], "--config.decode.nbest=8", "--config.decode.temperature=2.0")
    texts = {line.split("\t")[2] for line in many.splitlines() if line.startswith("0\t")}
    assert len(texts) > 1  # hot samples of one sentence differ


@pytest.mark.slow
def test_inference_refuses_model_fields_and_bad_decode_values_in_one_sentence(
    eight_device_workdir, tmp_path, monkeypatch
):
    """The first through the command (one line, status 2, no traceback: `cli.run`); the others
    in-process, as the UserError the command prints."""
    from fxformer import translate

    w = f"--workdir={eight_device_workdir}"
    with left_as_is(eight_device_workdir):
        result = run("fxformer.translate", w, "--config.model.d_model=8", stdin=LINES)
    assert result.returncode == exitcodes.USER_ERROR and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "fixed by the trained run" in result.stderr, result.stderr
    (tmp_path / "in.txt").write_text(LINES)
    for flag, words in (
        ("--config.decode.strategy=nucleus", "decode.strategy must be one of"),
        ("--config.decode.max_extra=1000", "decode.max_extra (1000) must be below model.max_len (96)"),
        ("--config.decode.nbest=5", "cannot exceed decode.beam_size"),
        ("--config.decode.beam_sise=2", "did you mean 'decode.beam_size'"),
    ):
        argv = [w, f"--input={tmp_path / 'in.txt'}", flag]
        assert words in refused_in_process(monkeypatch, translate.main, argv, eight_device_workdir), flag


@pytest.mark.slow
def test_hypotheses_file_is_scored_as_sacrebleu_scores_it(eight_device_workdir, tmp_path):
    evaluated = run("fxformer.evaluate", f"--workdir={eight_device_workdir}", "--step=20", "--limit=30")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    hyps = eight_device_workdir / "eval" / "test-20-first30.hyp.txt"
    refs = eight_device_workdir / "eval" / "test-20-first30.ref.txt"
    edited = tmp_path / "mine.txt"
    references = refs.read_text().splitlines()  # a translation partly right: BLEU far from 0 and 100
    lines = [" ".join(line.split()[::-1]) if i % 2 else line for i, line in enumerate(references)]
    edited.write_text("".join(line + "\n" for line in lines))
    assert hyps.exists()
    scored = run("fxformer.evaluate", f"--workdir={eight_device_workdir}", f"--hypotheses={edited}", "--limit=30")
    assert scored.returncode == 0, scored.stderr[-3000:]
    bleu, lowercased, chrf = (
        subprocess.run(
            [sys.executable, "-m", "sacrebleu", str(refs), "-i", str(edited), "-m", metric, "-b", "-w", "2", *flags],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for metric, flags in (("bleu", []), ("bleu", ["-lc"]), ("chrf", []))
    )
    assert f"BLEU {bleu} (lowercased {lowercased}), chrF {chrf}" in scored.stdout and 20 < float(bleu) < 90
    with left_as_is(eight_device_workdir):
        short = run("fxformer.evaluate", f"--workdir={eight_device_workdir}", f"--hypotheses={edited}")
    assert short.returncode == exitcodes.USER_ERROR and "has 30 lines but the test split has" in short.stderr


@pytest.mark.slow
def test_a_workdir_from_before_the_decode_section_still_evaluates(eight_device_workdir, tmp_path):
    workdir = tmp_path / "old"
    shutil.copytree(eight_device_workdir, workdir)
    config = json.loads((workdir / "config.json").read_text())
    decode = config.pop("decode")
    config.update(beam_size=2, alpha=decode["alpha"], max_decode_extra=decode["max_extra"])  # the old layout
    (workdir / "config.json").write_text(json.dumps(config))
    result = run("fxformer.evaluate", f"--workdir={workdir}", "--step=20", "--limit=8")
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((workdir / "eval" / "test-20-first8.json").read_text())
    assert written["decode"]["beam_size"] == 2 and "beam_size" not in written  # taken from the old field; held once


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["t2t"])
def test_the_t2t_beam_variant_runs_from_the_command_line_and_names_its_results(eight_device_workdir, variant):
    out = translate(eight_device_workdir, f"--config.decode.beam_variant={variant}")
    assert len(out.splitlines()) == 4
    flags = ("--step=20", "--limit=8", f"--config.decode.beam_variant={variant}")
    evaluated = run("fxformer.evaluate", f"--workdir={eight_device_workdir}", *flags)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    written = json.loads((eight_device_workdir / "eval" / f"test-20-beam_variant={variant}-first8.json").read_text())
    assert written["decode"]["beam_variant"] == variant  # beside the default search's test-20-first8.json, not over it


def test_averaging_passes_over_checkpoints_closer_than_half_the_interval():
    from fxformer.checkpoint import apart

    # a time budget saved step 2101 just after the regular 2100: 2100 is passed over, not counted twice
    assert apart([1500, 1700, 1800, 1900, 2000, 2100, 2101], 5, 100) == ([1700, 1800, 1900, 2000, 2101], [2100])
    assert apart([100, 200, 300], 5, 100) == ([100, 200, 300], [])  # fewer than asked: all there are
    assert apart([100, 149, 150, 200], 2, 100) == ([150, 200], [])  # 50 apart is half the interval: kept
    assert apart([100, 151, 152, 200], 3, 100) == ([100, 200], [151, 152])  # apart from the last one kept
    assert apart([7], 1, 100) == ([7], [])


# One process of two on loopback, each with 2 CPU devices, on a mesh whose device order alternates
# between the processes (as a TPU pod's physical order may): every translation must come back to its
# example. The search here copies its input (so a misplaced row shows), the tokenizer's decode joins ids.
INTERLEAVED = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
port, process = sys.argv[1], int(sys.argv[2])
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)
from fxformer import inference
from fxformer.tokens import EOS_ID
local = [[d for d in jax.devices() if d.process_index == p] for p in (0, 1)]
devices = [local[p][k] for k in (0, 1) for p in (0, 1)]
mesh = Mesh(np.array(devices), ("data",))
examples = [{"inputs": [10 + j] * (1 + j % 3) + [EOS_ID], "targets": [EOS_ID]} for j in range(13)]
copy = jax.jit(lambda params, inputs, key: (inputs[:, None, :], jnp.zeros((inputs.shape[0], 1))))
class Joined:
    def decode(self, ids):
        return " ".join(str(int(t)) for t in ids if t > EOS_ID)
out = inference.translate_examples(translate=copy, params=None, examples=examples, tokenizer=Joined(),
                                   batch_size=8, length=8, mesh=mesh)
print(json.dumps({"order": [d.process_index for d in devices], "out": [o[0][0] for o in out]}))
"""


@pytest.mark.slow
def test_translations_come_back_to_their_examples_when_the_mesh_interleaves_processes():
    ended = on_two_processes(lambda port, i: [sys.executable, "-c", INTERLEAVED, str(port), str(i)])
    for status, _, stderr in ended:
        assert status == 0, stderr[-3000:]
    got = json.loads(own_lines(ended[0][1])[-1])
    assert got["order"] == [0, 1, 0, 1]  # the processes' devices alternate on the mesh
    assert got["out"] == [" ".join([str(10 + j)] * (1 + j % 3)) for j in range(13)]
