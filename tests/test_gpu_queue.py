"""The GPU run queue (benchmarks/gpu/queue.py) rehearsed on the CPU: the same script and items
at tiny shapes, writing the records the GPU call would (queue.jsonl, junit XML, step-time
quartiles, the noise floor, each option's saving, the profile's table), a second call finding
everything finished, a stopped item run again, and a missing package refused before anything runs."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import env_with_devices

from benchmarks.gpu import queue

REPO = Path(__file__).resolve().parent.parent


def rehearse(out: Path, limit_s: float = 1200) -> subprocess.CompletedProcess:
    """One call of the queue, its limit far above the rehearsal's length (about 70 s on two free cores)
    so that a slow or loaded machine runs every item; the limit's own rule is tested with a limit below any item's.
    On one CPU device, as a CPU without XLA_FLAGS has (the tests' eight fake devices made it 94 s instead of 70)."""
    command = [sys.executable, "-m", "benchmarks.gpu.queue", "--cpu", f"--out={out}", f"--limit_s={limit_s}"]
    env = env_with_devices(1)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit_s + 300)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("rehearsal")
    return out, rehearse(out)


def lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "queue.jsonl").read_text().splitlines()]


def test_the_rehearsal_runs_every_item_in_order_and_records_each(rehearsal):
    out, done = rehearsal
    assert done.returncode == 0, done.stderr[-3000:]
    records = lines(out)
    assert [r["item"] for r in records] == ["tests", "noise", "options", "profile", "peer", "later"]
    assert [r["state"] for r in records] == ["done"] * 4 + ["cannot run here", "done"]  # no .peer/ in a checkout
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    facts = json.loads((out / "environment.json").read_text())
    assert facts["platform"] == "cpu" and facts["commit"].startswith(head) and facts["packages"]["jax"]
    assert all(r["commit"] == facts["commit"] for r in records)


def test_the_tests_item_leaves_a_junit_record_naming_each_test(rehearsal):
    out, _ = rehearsal
    suite = ET.parse(out / "junit-tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    assert int(suite.get("tests")) == len(queue.CPU_TESTS) and suite.get("failures") == "0"
    names = [case.get("name") for case in suite.iter("testcase")]
    assert names == [t.split("::")[-1] for t in queue.CPU_TESTS]


def test_the_noise_and_options_items_give_quartiles_the_floor_and_each_saving(rehearsal):
    out, _ = rehearsal
    noise, options = (r for r in lines(out) if r["item"] in ("noise", "options"))
    assert set(noise["quartiles_ms"]) == {"a1", "a2", "a3"}
    medians = [q[1] for q in noise["quartiles_ms"].values()]
    assert noise["noise_floor_ms"] == pytest.approx(max(medians) - min(medians), abs=1e-3)
    names = [spec.split(":")[0] for spec in queue.OPTIONS]
    assert list(options["quartiles_ms"]) == names and not options["errors"]
    for q in [*noise["quartiles_ms"].values(), *options["quartiles_ms"].values()]:
        assert 0 < q[0] <= q[1] <= q[2]
    base = options["quartiles_ms"]["base"][1]
    for name in names[1:]:
        assert options["saving_ms"][name] == pytest.approx(base - options["quartiles_ms"][name][1], abs=1e-3)
        assert options["beyond_noise"][name] == (options["saving_ms"][name] > noise["noise_floor_ms"])
    bench = queue.read_bench(out / "bench-options.jsonl")  # the raw records, one per variant
    assert list(bench) == names and all(r["options"] is not None for r in bench.values())


def test_the_later_item_sets_each_later_option_against_the_best(rehearsal):
    out, _ = rehearsal
    later = next(r for r in lines(out) if r["item"] == "later")
    assert list(later["saving_ms"]) == ["keys_32", "keys_16", "vocab_128", "qkv_merged", "flat_update"]
    assert not later["errors"]
    bench = queue.read_bench(out / "bench-later.jsonl")
    assert bench["keys_16"]["options"]["model.segment_block_k"] == 16
    assert bench["vocab_128"]["options"]["data.vocab_size"] == 128  # 120 padded to a multiple of 128
    assert bench["flat_update"]["options"]["flat_update"] is True  # a top-level field
    assert bench["qkv_merged"]["options"]["model.qkv_projection"] == "merged"


def test_the_profile_item_keeps_its_table_and_drops_the_trace(rehearsal):
    out, _ = rehearsal
    table = (out / "profile.txt").read_text()
    assert table.startswith("step ") and "attention" in table and "most expensive operations" in table
    assert json.loads((out / "profile" / "profile.json").read_text())["parts"]
    assert not (out / "profile" / "perfetto_trace.json.gz").exists() and not (out / "profile" / "trace").exists()


def test_a_second_call_finds_every_item_finished(rehearsal):
    out, _ = rehearsal
    before = (out / "queue.jsonl").read_text()
    again = rehearse(out)
    assert again.returncode == 0 and (out / "queue.jsonl").read_text() == before
    assert again.stdout.count("before; skipped") == 6


def test_an_item_stopped_at_the_limit_is_not_finished_and_comes_first_next_time(tmp_path):
    stopped = {"item": "tests", "state": "stopped at the limit"}
    (tmp_path / "queue.jsonl").write_text(json.dumps(stopped) + "\n")
    assert queue.done_items(tmp_path) == {}
    (tmp_path / "queue.jsonl").write_text(
        json.dumps(stopped) + "\n" + json.dumps({"item": "tests", "state": "failed"}) + "\n"
    )
    assert list(queue.done_items(tmp_path)) == ["tests"]  # failed: finished, its junit record says why


def test_a_missing_package_is_refused_in_one_sentence_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(queue, "NEEDED", (*queue.NEEDED, "no_such_package_fxformer"))
    monkeypatch.setattr(queue, "REPO", tmp_path)  # no .whl/ to install from
    assert queue.main(["--cpu", f"--out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no_such_package_fxformer missing" in err and "requirements.txt" in err
    assert not (tmp_path / "out" / "queue.jsonl").exists()


def test_a_call_whose_limit_is_shorter_than_the_first_item_starts_nothing(tmp_path):
    done = rehearse(tmp_path, limit_s=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tests: not started" in done.stdout and "the next call starts here" in done.stdout
    assert not (tmp_path / "queue.jsonl").exists()
