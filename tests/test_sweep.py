"""Sweeps: Table 3's plan, a smoke sweep end to end (run, skip, evaluate-only, dev then test,
refuse a changed config, collect, plot), seeds (every row k times, their statistics, rows side by
side, a stopped replicate resuming alone), resumption after SIGTERM and SIGKILL with the losses of
an uninterrupted row, leases, params.png's labels, and golden dry-runs of one row on the tpu and
slurm backends.

Golden files: regenerate with `FXFORMER_UPDATE_GOLDEN=1 python -m pytest tests/test_sweep.py`.
"""

import csv
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ended, env_with_devices, left_as_is
from test_launch import SLURM_2X8, TPU_4_WORKERS, golden_dry_run

from experiments import __main__ as experiments_main
from experiments import rowstate, runner
from experiments import sweep as sweeps
from experiments.context import Context
from experiments.rowstate import RowState, RowStatus
from fxformer import exitcodes, optim, paths
from fxformer.errors import UserError

REPO = Path(__file__).resolve().parent.parent
TABLE3_ROWS = [
    "base",
    "A1",
    "A2",
    "A3",
    "A4",
    "B1",
    "B2",
    *(f"C{i}" for i in range(1, 8)),
    "D1",
    "D2",
    "D3",
    "D4",
    "E",
    "big",
]


def sweep_command(*argv, data_dir=None, extra=()):
    tail = ["--", f"--config.data.tfds_data_dir={data_dir}", *extra] if data_dir else []
    return [sys.executable, "-m", "experiments", *argv, *tail]


def experiments(*argv, data_dir=None, extra=(), **kwargs):
    return subprocess.run(
        sweep_command(*argv, data_dir=data_dir, extra=extra),
        cwd=REPO,
        env=env_with_devices(1),
        capture_output=True,
        text=True,
        **kwargs,
    )


def started_until_checkpoint(argv, checkpoints: Path, timeout_s: float, log: Path, step: int = 10) -> subprocess.Popen:
    """A sweep command, started with its output in files (`log`.out and `log`.err: a pipe that
    nobody reads while it runs could fill and stall it), returned once `checkpoints` holds `step`
    or a later one."""
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        launcher = subprocess.Popen(argv, cwd=REPO, env=env_with_devices(1), stdout=out, stderr=err)
    deadline = time.time() + timeout_s
    while not (checkpoints.exists() and any(p.name.isdigit() and int(p.name) >= step for p in checkpoints.iterdir())):
        assert launcher.poll() is None and time.time() < deadline, "the run ended before it could be stopped"
        time.sleep(0.1)
    return launcher


def stopped(launcher: subprocess.Popen, log: Path) -> tuple[int, str]:
    """The exit status and the stderr of a command started by `started_until_checkpoint`."""
    status, _, _ = ended(launcher)
    return status, Path(f"{log}.err").read_text()


def losses(workdir: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if "loss" in line}


# ---------------------------------------------------------------------------------------------
# The description


@pytest.mark.slow
def test_plan_lists_every_table3_row_in_the_papers_layout():
    result = experiments("plan", "table3")
    assert result.returncode == 0, result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table[1:]] == TABLE3_ROWS
    header = [c.strip() for c in table[0].split("|")[1:-1]]
    assert header[:10] == ["row", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "positions"]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in table[1:]}
    assert cells["base"][1:4] == ["6", "512", "2048"]
    assert cells["B1"][1:] == ["", "", "", "", "16", "", "", "", "", "", "5.16", "25.10", "58"]  # blank = base's
    assert cells["big"][2:5] == ["1024", "4096", "16"] and cells["big"][10] == "300000"
    assert "--config=configs/table3.py:C4,paper" in result.stdout


@pytest.mark.parametrize("profile, dataset", [("mini", "embedded"), ("multi30k", "text")])
def test_profiles_keep_each_rows_change_relative_to_base(profile, dataset):
    from configs import table3

    for row in table3.ROWS:
        paper, mini = table3.get_config(row), table3.get_config(f"{row},{profile}")
        base_paper, base_mini = table3.get_config("base"), table3.get_config(f"base,{profile}")
        for key, scale in (("d_model", 8), ("d_ff", 8), ("d_k", 8), ("d_v", 8), ("num_layers", 2)):
            assert paper.model[key] == scale * mini.model[key], (row, key)
        assert paper.model.num_heads == mini.model.num_heads and paper.label_smoothing == mini.label_smoothing
        drop = lambda c, b: round(c.model.dropout_rate - b.model.dropout_rate, 6)  # noqa: E731
        assert drop(paper, base_paper) == drop(mini, base_mini), row
        assert paper.model.positional == mini.model.positional, row
        assert paper.num_train_steps / base_paper.num_train_steps == mini.num_train_steps / base_mini.num_train_steps
        assert mini.data.dataset == dataset and mini.average_last == paper.average_last == 1
        # the paper's peak learning rate at the row's width (multi30k: twice it), at the paper's share of warm-up
        peak = lambda c: float(optim.learning_rate_schedule(c)(c.warmup_steps - 1))  # count from 0
        times = {"mini": 1, "multi30k": 2}[profile]
        assert peak(mini) == pytest.approx(times * mini.model.d_model**-0.5 * 4000**-0.5, rel=1e-5), row
        assert peak(mini) / peak(base_mini) == pytest.approx(peak(paper) / peak(base_paper), rel=1e-5), row
        assert mini.warmup_steps / base_mini.num_train_steps == paper.warmup_steps / base_paper.num_train_steps
    with pytest.raises(ValueError, match="profile"):
        table3.get_config("B1,huge")


def test_the_real_text_profile_reads_its_folder_and_trains_to_a_plateau(tmp_path):
    from configs import table3

    raw = tmp_path / "task1" / "raw"
    raw.mkdir(parents=True)
    (raw / "train.en.gz").write_bytes(b"")
    config = table3.get_config(f"C1,multi30k:{tmp_path}")
    assert config.data.source_file == f"{raw}/train.en.gz" and config.data.test_target_file.endswith(
        "2016_flickr.de.gz"
    )
    assert config.data.validation_source_file == f"{raw}/val.en.gz" and config.model.num_layers == 1
    assert config.early_stopping_patience == 3 and config.best_metric == "dev_ppl" and config.num_train_steps == 3000
    assert config.eval_every_steps == 100 and config.data.train_pairs == 6000 and config.warmup_steps == 120
    assert config.early_stopping_min_delta == 0.01 and config.learning_rate_scale == pytest.approx(
        2 * (120 / 4000) ** 0.5
    )
    mini = table3.get_config("C1,mini")
    assert mini.early_stopping_min_delta == 0.0 and mini.learning_rate_scale == pytest.approx((40 / 4000) ** 0.5)
    assert table3.get_config("big,multi30k").num_train_steps == 9000
    assert "configs/table3.py:D2,multi30k:/data/m30k" in table3.sweep("multi30k:/data/m30k")["runs"]["D2"]
    assert table3.sweep("multi30k:/data/m30k")["replicates"] == {"base": 5, "*": 3}
    with pytest.raises(ValueError, match="reads no folder"):
        table3.get_config("B1,mini:/data")
    with pytest.raises(ValueError, match="No Multi30k files"):
        table3.get_config(f"B1,multi30k:{tmp_path / 'nothing'}")


def test_grids_product_and_zip():
    heads = sweeps.axis("model.num_heads", [4, 8])
    seeds = sweeps.axis("seed", [0, 1])
    assert sweeps.product(heads, seeds) == [{"model.num_heads": h, "seed": s} for h in (4, 8) for s in (0, 1)]
    assert sweeps.zipit(heads, seeds) == [{"model.num_heads": 4, "seed": 0}, {"model.num_heads": 8, "seed": 1}]
    runs = sweeps.from_dict("g", "paper", {"runs": sweeps.grid("configs/default.py", sweeps.zipit(heads, seeds))})
    assert [r.name for r in runs.runs] == ["num_heads=4,seed=0", "num_heads=8,seed=1"]
    assert runs.runs[1].resolved()["model"]["num_heads"] == 8 and runs.runs[1].resolved()["seed"] == 1
    assert [r.name for r in sweeps.load("table3", "mini").select("A*,base")] == ["base", "A1", "A2", "A3", "A4"]
    with pytest.raises(UserError, match="matches no run"):
        sweeps.load("table3", "mini").select("Z9")


def test_first_difference_ignores_fields_only_one_side_has():
    old = {"model": {"d_k": 16, "d_v": 16}, "seed": 0}
    assert runner.first_difference(old, {"model": {"d_k": 32, "d_v": 16}, "seed": 0}) == ("model.d_k", 16, 32)
    assert runner.first_difference(old, {"model": {"d_k": 16, "d_v": 16, "new": 1}, "seed": 0}) is None


def test_a_resumed_sweeps_eta_is_paced_by_the_runs_it_worked_on():
    """Runs found finished are skipped in no time: the ETA is the wall time per run that this
    invocation trained, times the runs left, not zero because 37 were skipped first; a resumed
    run counts as the part of its steps trained now."""
    pace = runner.Pace()
    assert pace.eta(25, 100.0) == ""  # nothing ended yet: no ETA
    pace.began(100.0)
    pace.began(160.0)  # a second run in parallel: the clock started with the first
    pace.ended()
    assert pace.eta(4, 700.0) == ", ETA 40m00s"  # (700 - 100) s per run x 4 runs
    pace.ended()
    assert pace.eta(3, 1300.0) == ", ETA 30m00s"  # 1200 s for two runs x 3
    resumed = runner.Pace()
    resumed.began(0.0)
    resumed.ended(400 / 2800)  # a run in flight when the sweep last stopped: 1/7 of a run
    resumed.ended(1.0)  # one trained whole
    assert resumed.eta(7, 1600.0) == ", ETA 2h43m20s"  # 1600 s per 8/7 run = 1400 s per run, x 7 = 9800 s


def test_the_part_of_a_run_trained_is_its_steps_between_two_looks_over_its_last_step(tmp_path):
    def row(step: int, early_end: int | None = None) -> RowState:
        status = {"config": {"num_train_steps": 2800}, "attempts": 1}  # what an attempt writes first
        return RowState(paths.Workdir(tmp_path), status, [step] if step else [], step, early_end=early_end)

    part = runner.trained_part
    assert part(row(2400), row(2800)) == pytest.approx(1 / 7)  # resumed at 2,400, ended at the cap
    assert part(row(0), row(2100, early_end=2100)) == 1.0  # a whole run that its plateau ended early
    assert part(row(0), row(1400)) == 0.5  # stopped half way: half a run
    assert part(row(0), row(0)) == 0.0  # failed at once: it trained nothing, whatever its config's steps
    assert part(row(1000), row(1000)) == 0.0  # left to the launcher that holds it, or only evaluated


@pytest.mark.slow
def test_a_lease_holds_a_row_until_its_heartbeat_is_stale_or_its_process_is_gone(tmp_path):
    workdir = paths.Workdir(tmp_path / "row")
    rowstate.write_status(workdir, {"owner": "elsewhere:12", "heartbeat": time.time()})
    assert rowstate.read(workdir, "validation").state() == "running"
    rowstate.write_status(workdir, {"owner": "elsewhere:12", "heartbeat": time.time() - 1000})
    assert rowstate.read(workdir, "validation").state(lease_s=300) == "stopped"  # stale: taken over
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    rowstate.write_status(workdir, {"owner": f"{socket.gethostname()}:{dead.stdout.strip()}", "heartbeat": time.time()})
    assert rowstate.read(workdir, "validation").state() == "stopped"  # this host, process gone
    # this host, a live process (this one's parent) with a day-old heartbeat: a pid reused after a reboot
    stale = {"owner": f"{socket.gethostname()}:{os.getppid()}", "heartbeat": time.time() - 86400}
    rowstate.write_status(workdir, stale)
    assert rowstate.read(workdir, "validation").state() == "stopped"
    rowstate.write_status(workdir, {**stale, "heartbeat": time.time()})
    assert rowstate.read(workdir, "validation").state() == "running"  # the same live process, beating
    lease = rowstate.Lease(workdir, {"attempts": 1}, every_s=0.1)
    assert lease.claim()
    time.sleep(0.35)
    beat = json.loads(workdir.sweep_status.read_text())["heartbeat"]
    assert time.time() - beat < 0.3
    lease.release(state="finished")
    assert json.loads(workdir.sweep_status.read_text())["owner"] is None


# ---------------------------------------------------------------------------------------------
# A smoke sweep, end to end


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, data_dir):
    """Rows base, B1 and E of the smoke profile, run once: (root, the run's output)."""
    root = tmp_path_factory.mktemp("sweep") / "table3"
    result = experiments("run", "table3", f"--root={root}", "--profile=smoke", "--only=base,B1,E", data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result


@pytest.mark.slow
def test_smoke_sweep_trains_and_evaluates_each_row_the_papers_way(smoke):
    root, result = smoke
    for row in ("base", "B1", "E"):
        results = json.loads((root / row / "eval" / "validation-8.json").read_text())
        assert (
            results["split"] == "validation"
            and results["decode"]["beam_size"] == 4
            and results["decode"]["alpha"] == 0.6
        )
        assert results["checkpoint_steps"] == [8]  # no averaging
        test = json.loads((root / row / "eval" / "test-8.json").read_text())  # the test set, decoded the same way
        assert test["split"] == "test" and test["decode"]["beam_size"] == 4 and test["decode"]["alpha"] == 0.6
        status = json.loads((root / row / "sweep.json").read_text())
        assert status["state"] == "finished" and status["attempts"] == 1 and status["owner"] is None
    assert json.loads((root / "B1" / "config.json").read_text())["model"]["d_k"] == 1  # 16 / 16, the smoke scale
    assert not (root / "A1").exists()
    assert json.loads((root / "sweep-root.json").read_text())["profile"] == "smoke"


@pytest.mark.slow
def test_a_second_run_skips_finished_rows(smoke):
    root, _ = smoke
    before = {row: (root / row / "metrics.jsonl").stat().st_mtime for row in ("base", "B1", "E")}
    result = experiments("run", "table3", f"--root={root}", "--only=base,B1,E")  # profile and flags remembered
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("finished (step 8); skipped") == 3
    assert {row: (root / row / "metrics.jsonl").stat().st_mtime for row in before} == before


@pytest.mark.slow
def test_a_changed_config_is_refused_in_one_sentence(smoke):
    root, _ = smoke
    remembered = json.loads((root / "sweep-root.json").read_text())["extra"]
    with left_as_is(root):
        result = experiments("run", "table3", f"--root={root}", "--only=B1", "--", *remembered, "--config.seed=7")
    assert result.returncode == exitcodes.USER_ERROR
    assert result.stderr.count("\n") == 1 and "seed=0" in result.stderr and "--move_changed" in result.stderr
    moved = experiments(
        "run",
        "table3",
        f"--root={root}",
        "--only=B1",
        "--move_changed",
        "--dry-run",
        "--",
        *remembered,
        "--config.seed=7",
    )
    assert moved.returncode == 0 and "moved the old run to B1.old1" in moved.stderr
    assert (root / "B1").exists()  # a dry run moves nothing


@pytest.mark.slow
def test_a_trained_but_unevaluated_row_is_only_evaluated(smoke):
    root, _ = smoke
    for path in (root / "E" / "eval").iterdir():
        path.unlink()
    log = root / "E" / "logs" / "process_0" / "worker.log"
    size = log.stat().st_size
    result = experiments("run", "table3", f"--root={root}", "--only=E")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "E: evaluate (step 8/8" in result.stderr
    new = log.read_text()[size:]
    assert "fxformer.evaluate" in new and "fxformer.train" not in new
    assert (root / "E" / "eval" / "validation-8.json").exists() and (root / "E" / "eval" / "test-8.json").exists()
    for path in (root / "E" / "eval").glob("test-*"):  # evaluated on dev only (a root from before the test set)
        path.unlink()
    size = log.stat().st_size
    result = experiments("run", "table3", f"--root={root}", "--only=E")
    assert result.returncode == 0 and "E: evaluate (step 8/8" in result.stderr, result.stderr[-2000:]
    new = log.read_text()[size:]
    assert "--split=test" in new and "--split=validation" not in new  # the missing split alone
    assert (root / "E" / "eval" / "test-8.json").exists()


@pytest.mark.slow
def test_collect_on_a_partial_sweep_and_plot(smoke):
    root, _ = smoke
    result = experiments("collect", "table3", f"--root={root}")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader((root / "results" / "table.csv").open()))
    assert [r["row"] for r in rows] == TABLE3_ROWS
    by_row = {r["row"]: r for r in rows}
    for name in ("base", "B1", "E"):
        ours = json.loads((root / name / "eval" / "validation-8.json").read_text())
        assert float(by_row[name]["dev PPL ours"]) == pytest.approx(ours["ppl"], abs=0.006)
        assert float(by_row[name]["dev BLEU ours"]) == pytest.approx(ours["bleu"], abs=0.006)
        assert by_row[name]["state"] == "finished" and by_row[name]["steps"] == "8/8"
        test = json.loads((root / name / "eval" / "test-8.json").read_text())
        assert float(by_row[name]["test PPL ours"]) == pytest.approx(test["ppl"], abs=0.006)
    delta = float(by_row["B1"]["dev PPL ours"]) - float(by_row["base"]["dev PPL ours"])
    assert float(by_row["B1"]["ΔPPL ours"]) == pytest.approx(delta, abs=0.011)
    assert by_row["B1"]["ΔPPL paper"] == "+0.24" and by_row["B1"]["params paper (M)"] == "58"
    assert by_row["B1"]["changes vs base"] == "d_k=1"
    others = [r for r in rows if r["row"] not in ("base", "B1", "E")]
    assert {r["state"] for r in others} == {"pending"} and {r["dev PPL ours"] for r in others} == {""}
    table = (root / "results" / "table.md").read_text()
    assert "nrefs:1|case:mixed" in table and "beam 4, alpha 0.6" in table
    assert "3 of 20 runs finished (every seed of 3 of 20 rows)" in table
    assert "global batch 256 tokens" in table and "Devices: 1" in table
    assert (root / "results" / "records.jsonl.gz").exists()  # the raw records the table was built from

    result = experiments("plot", "table3", f"--root={root}")
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("delta.png", "params.png", "curves.png"):
        data = (root / "results" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_params_figure_labels_overlap_no_other_label_nor_marker():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.analysis import figures

    # the mini table's crowd: ten rows at base's parameter count, several a few hundredths apart
    points = [
        (0.412, y, name)
        for y, name in zip(
            (1.675, 1.567, 1.582, 2.135, 3.255, 2.086, 4.03, 1.656, 1.871, 1.719),
            ("base", "A1", "A2", "A3", "A4", "D1", "D2", "D3", "D4", "E"),
        )
    ]
    points += [(0.428, 1.719, "E2"), (0.375, 2.143, "B2"), (0.357, 3.349, "B1"), (1.12, 1.254, "C5")]
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.plot([p[0] for p in points], [p[1] for p in points], "o")
    figures.log_axis(ax.xaxis)
    ax.margins(x=0.15, y=0.12)
    fig.tight_layout()
    boxes = figures.place_labels(ax, points)
    markers = [ax.transData.transform((x, y)) for x, y, _ in points]
    frame = ax.get_window_extent()
    plt.close(fig)
    assert len(boxes) == len(points)
    for i, box in enumerate(boxes):
        assert figures.overlap(box, frame) == pytest.approx(box.width * box.height)  # inside the axes
        assert all(figures.overlap(box, other) == 0 for other in boxes[i + 1 :])
        assert all(figures.marker_overlap(box, m) == 0 for m in markers)


def test_delta_bars_that_dwarf_the_rest_are_cut_where_the_next_reaches():
    from experiments.analysis import figures

    # D1 of the real-text sweep: +183.5% [180, 187] beside bars that reach 17.3% at most
    ours = [(183.5, 180.0, 187.0), (10.0, 8.0, 12.0), (None, None, None)]
    assert figures.cut_at(ours, [17.3, 5.0, None]) == pytest.approx(1.2 * 17.3)
    assert figures.cut_at(ours, [17.3, 5.0, 80.0]) == pytest.approx(1.2 * 17.3)  # 80 dwarfs 17.3: both cut
    assert figures.cut_at([(50.0, 45.0, 55.0), (30.0, 28.0, 32.0)], [20.0, 10.0]) is None  # no bar dwarfs the next
    assert figures.cut_at([(-100.0, -110.0, -90.0), (90.0, 85.0, 95.0)], [10.0, 5.0]) == pytest.approx(12.0)
    assert figures.cut_at([], []) is None
    # the largest dwarfs the second and the second the rest: both are cut where the third reaches
    assert figures.cut_at([(200.0, 190.0, 210.0), (50.0, 45.0, 55.0), (10.0, 9.0, 11.0)], []) == pytest.approx(13.2)


def test_a_rows_final_result_is_its_last_checkpoints_alone_or_an_average_ending_there(tmp_path):
    """A sweep whose evaluation averages (the paper's last 5 checkpoints; a config's average_last)
    finds evaluate's `-avg<k>` result for the last step (it looked for the plain name only, and
    such a row never finished): the k it averages, or fewer where fewer were saved; a partial, a
    best-checkpoint, another search's or another average's result is not it."""
    w = paths.Workdir(tmp_path / "row")
    w.eval.mkdir(parents=True)
    assert rowstate.final_result(w, "validation", 8, {}, 2) is None
    for name in ("validation-8-avg2-first5", "validation-8-best", "validation-8-avg2-alpha=1.5", "test-8-avg2"):
        (w.eval / f"{name}.json").write_text("{}")
    assert rowstate.final_result(w, "validation", 8, {}, 2) is None
    assert rowstate.final_result(w, "validation", 8, {"alpha": 1.5}, 2).name == "validation-8-avg2-alpha=1.5.json"
    assert rowstate.final_result(w, "test", 8, {}, 5).name == "test-8-avg2.json"  # two checkpoints were saved
    assert rowstate.final_result(w, "test", 8, {}, 1) is None  # the sweep evaluates the checkpoint alone
    (w.eval / "test-8-avg10.json").write_text("{}")  # another average (a manual evaluate) is not the sweep's
    assert rowstate.final_result(w, "test", 8, {}, 5).name == "test-8-avg2.json"
    (w.eval / "test-8.json").write_text("{}")
    assert rowstate.final_result(w, "test", 8, {}, 1).name == "test-8.json"
    assert rowstate.final_result(w, "test", 80, {}, 1) is None


@pytest.mark.slow
def test_a_sweep_whose_evaluation_averages_finishes_its_rows(tmp_path, data_dir):
    sweep_file = tmp_path / "averaged.py"
    sweep_file.write_text(
        "def sweep(profile='paper'):\n"
        "    return {'runs': {'avg': ('configs/table3.py:base,smoke', {'average_last': 2})},\n"
        "            'metrics': {'ppl': 'lower', 'bleu': 'higher'}}\n"
    )
    root = tmp_path / "r"
    result = experiments("run", str(sweep_file), f"--root={root}", data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 finished" in result.stderr and list((root / "avg" / "eval").glob("test-*-avg2.json"))


def test_a_stop_asked_while_a_row_is_being_claimed_starts_no_processes(tmp_path):
    """Ctrl-C or SIGTERM in the half second a row's lease is being claimed, before its launch has
    processes to pass it to: the launch starts none (it started them and trained the whole row)."""
    from experiments.backends.local import Local

    args = runner.parser("run").parse_args(["table3", f"--root={tmp_path}", "--profile=smoke", "--only=C1"])
    ctx = Context(args, [])
    [rep] = ctx.units(ctx.sweep.select("C1"))
    backend = Local(args, echo=False, handle_signals=False)
    backend.interrupt()  # the sweep's signal handler, before launch
    launched = backend.launch(ctx.job(rep), False)
    assert launched.interrupted and launched.status == exitcodes.STOPPED
    assert not (Path(ctx.job(rep).logdir) / "process_0").exists() and not (tmp_path / "C1").exists()


@pytest.mark.slow
def test_a_row_whose_training_outlived_its_launcher_is_left_alone(tmp_path):
    """A closed terminal ends the sweep, not its workers' commands (they ignore SIGHUP): run again,
    the row is left to that command, not launched beside it (its worker refused to start, and the
    row counted as failed)."""
    root = tmp_path / "t3"
    args = runner.parser("run").parse_args(["table3", f"--root={root}", "--profile=smoke", "--only=C1"])
    ctx = Context(args, [])
    [rep] = ctx.units(ctx.sweep.select("C1"))
    rundir = Path(ctx.job(rep).logdir) / "process_0"
    from experiments import worker

    # the pid where the worker keeps it: in /tmp while train has not yet accepted the run (no rundir yet), then
    # in the rundir
    for pid_file in (worker.held_pid(rundir), rundir / "pid"):
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        still = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fxformer.train"])
        try:
            pid_file.write_text(str(still.pid))
            result = experiments("run", "table3", f"--root={root}", "--profile=smoke", "--only=C1")
        finally:
            still.kill()
            pid_file.unlink()
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"C1: its training from an earlier launch still runs (pid {still.pid}); left alone" in result.stderr
        assert not (root / "C1" / "checkpoints").exists() and "failed" not in result.stderr


@pytest.mark.slow
def test_a_trained_row_whose_evaluation_failed_its_attempts_is_skipped(tmp_path):
    """Trained to its last step, evaluation failed --max_attempts times: skipped like any failed row
    (it read as trained and every plain `run` tried its evaluation again)."""
    root = tmp_path / "t3"
    args = runner.parser("run").parse_args(["table3", f"--root={root}", "--profile=smoke", "--only=C1"])
    ctx = Context(args, [])
    [rep] = ctx.units(ctx.sweep.select("C1"))
    config = rep.resolved(())
    workdir = paths.Workdir(root / "C1")
    (root / "C1" / "checkpoints" / str(config["num_train_steps"])).mkdir(parents=True)
    (root / "C1" / "config.json").write_text(json.dumps(config))
    rowstate.write_status(workdir, {"state": "failed", "attempts": 3, "owner": None})
    assert str(ctx.read(rep).state()) == "trained"
    result = experiments("run", "table3", f"--root={root}", "--profile=smoke", "--only=C1")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "C1: failed 3 times" in result.stderr and "skipped: --retry_failed tries again" in result.stderr


@pytest.mark.slow
def test_a_row_another_launcher_runs_is_left_alone(tmp_path):
    root = tmp_path / "t3"
    rowstate.write_status(paths.Workdir(root / "C1"), {"owner": "another-host:42", "heartbeat": time.time()})
    result = experiments("run", "table3", f"--root={root}", "--profile=smoke", "--only=C1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "running by another-host:42; left alone" in result.stderr
    assert not (root / "C1" / "checkpoints").exists()
    status = experiments("status", "table3", f"--root={root}", "--only=C1")
    assert "| C1 | running | 0/8 | 0 |" in status.stdout


# ---------------------------------------------------------------------------------------------
# Stopped rows resume exactly


LONGER = ["--config.num_train_steps=30", "--config.checkpoint_every_steps=5", "--config.log_every_steps=1"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("straight") / "t3"
    result = experiments(
        "run", "table3", f"--root={root}", "--profile=smoke", "--only=base", data_dir=data_dir, extra=LONGER
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return root, losses(root / "base")


@pytest.mark.slow
def test_a_row_stopped_then_crashed_resumes_each_time_with_the_same_losses(tmp_path, data_dir, uninterrupted):
    """SIGTERM to the sweep (it asks the row to save and stop), then a crash (the launcher and the
    training process killed at once): the same sweep again resumes the row each time from its last
    checkpoint, and it ends with the losses of a row never stopped."""
    root = tmp_path / "t3"
    argv = sweep_command(
        "run", "table3", f"--root={root}", "--profile=smoke", "--only=base", data_dir=data_dir, extra=LONGER
    )
    checkpoints = root / "base" / "checkpoints"
    last = lambda: max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())  # noqa: E731
    attempts = lambda: json.loads((root / "base" / "sweep.json").read_text())["attempts"]  # noqa: E731
    launcher = started_until_checkpoint(argv, checkpoints, timeout_s=120, log=tmp_path / "first")
    launcher.send_signal(signal.SIGTERM)  # the sweep asks the row to save and stop
    status, err = stopped(launcher, tmp_path / "first")
    assert status == exitcodes.STOPPED, err[-3000:]
    stopped_at = last()
    assert 10 <= stopped_at <= 20 and attempts() == 0  # a stop asked of the sweep spends no attempt of the row's

    again = sweep_command("run", "table3", f"--root={root}", "--only=base")  # the same sweep again
    launcher = started_until_checkpoint(again, checkpoints, timeout_s=120, log=tmp_path / "second", step=stopped_at + 5)
    trainer = int((root / "base" / "logs" / "process_0" / "pid").read_text())
    os.kill(launcher.pid, signal.SIGKILL)  # a crash: the launcher and the training process die at once
    os.kill(trainer, signal.SIGKILL)
    launcher.wait()
    assert f"resume from step {stopped_at}" in Path(f"{tmp_path / 'second'}.err").read_text()
    crashed_at = last()
    assert stopped_at < crashed_at < 30

    result = experiments("run", "table3", f"--root={root}", "--only=base")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resume from step {crashed_at}" in result.stderr
    assert losses(root / "base") == uninterrupted[1]
    assert attempts() == 2  # the crash spent one, the run that finished another (--max_attempts counts them)


# ---------------------------------------------------------------------------------------------
# End to end: --seeds, skip, resume one replicate, --parallel


@pytest.fixture(scope="module")
def replicated(smoke, tmp_path_factory):
    """base and B1 of the smoke profile with 2 seeds each, one run at a time: a copy of the smoke
    sweep's root (its seed-0 runs of base and B1, finished), where seed 1 of each runs: (root, output)."""
    root = tmp_path_factory.mktemp("replicated") / "t3"
    shutil.copytree(smoke[0], root, ignore=shutil.ignore_patterns("E", "results"))
    result = experiments("run", "table3", f"--root={root}", "--only=base,B1", "--seeds=2", "--backend=local")
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result


def base_and_b1(root: Path, data_dir, *flags: str):
    """`run` of the smoke profile's base and B1 into `root`, with `flags`: its output."""
    result = experiments(
        "run", "table3", f"--root={root}", "--profile=smoke", "--only=base,B1", *flags, data_dir=data_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_seeds_run_every_row_k_times_and_collect_their_statistics(replicated):
    root, result = replicated
    assert result.stderr.count(": train (step 0/8") == 2 and result.stderr.count("finished (step 8); skipped") == 2
    for name in ("base", "base.s1", "B1", "B1.s1"):
        assert (root / name / "eval" / "validation-8.json").exists()
    assert json.loads((root / "sweep-root.json").read_text())["seeds"] == 2
    assert losses(root / "base") != losses(root / "base.s1")  # another init, dropout and data order
    collected = experiments("collect", "table3", f"--root={root}")
    assert collected.returncode == 0, collected.stderr[-2000:]
    lines = {line.split("|")[1].strip(): line for line in collected.stdout.splitlines() if line.startswith("| ")}
    assert lines["base"].count(" ± ") >= 4 and "| 2 |" in lines["base"]  # mean ± sd of PPL and BLEU, dev and test
    assert lines["B1"].count(" ± ") >= 4 and lines["B1"].count(" [") >= 2  # and paired Δ [95% CI] of both
    again = experiments("run", "table3", f"--root={root}", "--only=base,B1")  # the root remembers the rest
    assert again.returncode == 0 and again.stderr.count("skipped") == 4 and ": train" not in again.stderr


@pytest.mark.slow
def test_sigterm_during_the_second_replicate_resumes_that_replicate_only(uninterrupted, tmp_path):
    root = tmp_path / "t3"  # a copy of a finished 30-step base: its second seed is stopped, then resumed
    shutil.copytree(uninterrupted[0], root)
    argv = sweep_command("run", "table3", f"--root={root}", "--only=base", "--seeds=2")  # profile, flags remembered
    checkpoints = root / "base.s1" / "checkpoints"
    launcher = started_until_checkpoint(argv, checkpoints, timeout_s=300, log=tmp_path / "launcher")
    launcher.send_signal(signal.SIGTERM)
    status, err = stopped(launcher, tmp_path / "launcher")
    assert status == exitcodes.STOPPED, err[-3000:]
    stopped_at = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    result = experiments("run", "table3", f"--root={root}", "--only=base")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "base: finished (step 30); skipped" in result.stderr
    resumed = next(line for line in result.stderr.splitlines() if "base.s1: resume from step" in line)
    assert "ETA" not in resumed, resumed  # the run skipped before it paces nothing (it made this 'ETA 0m00s')
    assert f"base.s1: resume from step {stopped_at}" in result.stderr
    assert json.loads((root / "base.s1" / "sweep.json").read_text())["attempts"] == 1  # the stop spent no attempt
    assert json.loads((root / "base" / "sweep.json").read_text())["attempts"] == 1


@pytest.mark.slow
def test_parallel_runs_two_rows_at_once_with_the_same_losses_in_another_root(replicated, tmp_path, data_dir):
    """The same seed gives the same losses in another root, one run at a time or two side by side."""
    root, _ = replicated
    side = tmp_path / "t3"
    base_and_b1(side, data_dir, "--parallel=2")  # one seed each: the two rows side by side
    assert not (side / "base.s1").exists()
    for name in ("base", "B1"):
        assert losses(side / name) == losses(root / name), name
    spans = {}  # when each run's lease was taken and when its evaluation was written
    for name in ("base", "B1"):
        started = json.loads((side / name / "sweep.json").read_text())["started"]
        spans[name] = (started, (side / name / "eval" / "validation-8.json").stat().st_mtime)
    assert spans["B1"][0] < spans["base"][1] and spans["base"][0] < spans["B1"][1]  # they overlapped
    assert (side / "B1" / "logs" / "process_0" / "worker.log").exists()


# ---------------------------------------------------------------------------------------------
# Every row on dev, then on the test set


def test_every_row_is_evaluated_on_dev_then_on_the_test_set_with_the_same_decoding():
    sweep = sweeps.load("table3", "mini")
    (dev_split, dev), (test_split, test) = sweep.evaluations()
    assert (dev_split, test_split) == ("validation", "test")
    assert test == tuple(flag.replace("--split=validation", "--split=test") for flag in dev)
    assert "--config.decode.beam_size=4" in test and "--average_last=1" in test
    assert sweeps.with_split(("--split", "validation", "--x=1"), "test") == ("--split=test", "--x=1")
    assert sweeps.with_split(("--x=1",), "test") == ("--x=1", "--split=test")  # evaluate's default was test


def evaluate_commands(flags: list[str]) -> list[list[str]]:
    """The fxformer commands a worker's flags run, in order: the one after --, then each --then."""
    first = flags[flags.index("--") + 1 :]
    thens = [shlex.split(f.removeprefix("--then=")) for f in flags if f.startswith("--then=")]
    return [first, *thens]


def test_a_row_evaluated_on_dev_but_not_on_test_is_trained_and_only_test_is_evaluated(tmp_path):
    args = runner.parser("run").parse_args(["table3", f"--root={tmp_path}", "--profile=smoke", "--only=B1"])
    ctx = Context(args, [])
    [rep] = ctx.units(ctx.sweep.select("B1"))
    train, both = evaluate_commands(ctx.job(rep).worker_flags("rundir", []))  # train, then dev and test in one
    assert train[0] == "fxformer.train" and both[0] == "fxformer.evaluate" and "--split=validation,test" in both
    workdir = tmp_path / "B1"
    (workdir / "eval").mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(rep.resolved(())))
    total = rep.resolved(())["num_train_steps"]
    (workdir / "eval" / f"validation-{total}.json").write_text(json.dumps({"ppl": 2.0, "bleu": 50.0}))
    row = ctx.read(rep)
    assert row.state() == RowStatus.TRAINED and row.unevaluated == ["test"]
    [only] = evaluate_commands(ctx.job(rep, False, row.unevaluated).worker_flags("rundir", []))
    assert only[0] == "fxformer.evaluate" and "--split=test" in only and "--split=validation" not in only
    (workdir / "eval" / f"test-{total}.json").write_text(json.dumps({"ppl": 2.1, "bleu": 49.0}))
    assert ctx.read(rep).state() == RowStatus.FINISHED


# ---------------------------------------------------------------------------------------------
# Golden dry-runs of one row


def test_tpu_dry_run_of_one_row_matches_golden_file(fake_bucket, capsys):
    text, err = golden_dry_run(
        "sweep_table3_B1_tpu.txt",
        "run",
        "table3",
        "--root=gs://bucket/table3",
        "--only=B1",
        *TPU_4_WORKERS,
        capsys=capsys,
    )
    assert "B1: train (step 0/100000, attempt 1)" in err
    assert "--config=configs/table3.py:B1,paper --workdir=gs://bucket/table3/B1" in text
    # dev, then test, from one restore
    assert "--then=fxformer.evaluate --distributed --workdir=gs://bucket/table3/B1 --split=validation,test " in text
    assert not fake_bucket.store  # a dry run writes nothing


@pytest.mark.slow
def test_slurm_dry_run_of_one_row_matches_golden_file(tmp_path):
    out, _ = golden_dry_run(
        "sweep_table3_B1_slurm.txt", "run", "table3", "--root=/shared/table3", "--only=B1", *SLURM_2X8
    )
    assert "--config=configs/table3.py:B1,paper --workdir=/shared/table3/B1 --distributed" in out
    assert out.count("fxformer.evaluate") == 1 and " --split=validation,test " in out  # dev, then test, one restore


@pytest.mark.slow
def test_a_failing_row_is_retried_up_to_the_limit_then_skipped(tmp_path, data_dir):
    root = tmp_path / "t3"
    refused = ["--config.model.max_len=8"]  # fxformer.train refuses it: the row fails each time
    result = experiments(
        "run",
        "table3",
        f"--root={root}",
        "--profile=smoke",
        "--only=C1",
        "--max_attempts=2",
        data_dir=data_dir,
        extra=refused,
    )
    assert result.returncode == 1
    assert result.stderr.count("C1: exited with status 2") == 2
    assert json.loads((root / "C1" / "sweep.json").read_text())["attempts"] == 2
    again = experiments("run", "table3", f"--root={root}", "--only=C1", "--max_attempts=2")
    assert again.returncode == 1 and "failed 2 times" in again.stderr and "--retry_failed" in again.stderr
    retried = experiments("run", "table3", f"--root={root}", "--only=C1", "--max_attempts=2", "--retry_failed")
    assert "attempt 3" in retried.stderr
    status = experiments("status", "table3", f"--root={root}", "--only=C1")
    assert "| C1 | failed | 0/8 | 3 |" in status.stdout and "last exit status 2" in status.stdout


@pytest.mark.slow
def test_sweep_verbs_import_no_jax(tmp_path):
    code = (
        "import sys; from experiments import __main__ as m; "
        f"m.main(['plan', 'table3']); m.main(['status', 'table3', '--root={tmp_path}/r']); "
        f"m.main(['collect', 'table3', '--root={tmp_path}/r']); "
        "m.main(['run', 'table3', '--backend=slurm', '--only=B1', '--root=/shared/t3', '--dry-run']); "
        "assert 'jax' not in sys.modules and 'jaxlib' not in sys.modules, 'jax imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_slurm_row_is_held_while_squeue_lists_its_job(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"  # a stand-in scheduler: job 123 runs, every other job is gone
    squeue.write_text('#!/bin/sh\n[ "$3" = 123 ] && echo RUNNING\nexit 0\n')
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    workdir = paths.Workdir(tmp_path / "row")
    rowstate.write_status(workdir, {"owner": "login-node:1", "job_id": "123", "attempts": 1})
    row = rowstate.read(workdir, "validation")
    assert row.state() == "submitted" and row.holder() == "slurm job 123"
    rowstate.write_status(workdir, {"owner": "login-node:1", "job_id": "124", "attempts": 1})
    assert rowstate.read(workdir, "validation").state() == "stopped"  # ended without results: run again


def test_a_sweep_that_decodes_otherwise_than_its_rows_config_finds_the_results_evaluate_names_so(tmp_path):
    from fxformer import configfile

    workdir = paths.Workdir(tmp_path / "row")
    workdir.root.mkdir()
    config = configfile.resolve("configs/default.py", [])  # trained to decode with beam 4, alpha 0.6
    paths.write_atomic(workdir.config, config.to_json())
    steps = config.num_train_steps
    flags = ["--config.decode.beam_size=4", "--config.decode.alpha=1.5"]  # the same beam, another alpha
    assert configfile.decode_changes(config, configfile.overrides(flags), workdir) == {"alpha": 1.5}
    assert configfile.decode_changes(config, configfile.overrides(flags[:1]), workdir) == {}
    workdir.eval.mkdir()
    for split in ("validation", "test"):  # as fxformer.evaluate --config.decode.alpha=1.5 names them
        paths.write_atomic(workdir.eval / f"{split}-{steps}-alpha=1.5.json", json.dumps({"bleu": 1.0}))
    row = rowstate.read(workdir, "validation", ["test"], flags)
    assert row.decode == {"alpha": 1.5} and row.results == {"bleu": 1.0} and row.unevaluated == []
    default = rowstate.read(workdir, "validation", ["test"])  # the default search's results are not those
    assert default.results is None and default.unevaluated == ["validation", "test"]


def test_status_collect_and_plot_of_a_root_that_does_not_exist_are_refused(tmp_path, capsys):
    for verb in ("status", "collect", "plot"):
        with left_as_is(tmp_path / "mistyped"):
            assert experiments_main.main([verb, "table3", f"--root={tmp_path}/mistyped"]) == exitcodes.USER_ERROR
        assert f"{tmp_path}/mistyped does not exist" in capsys.readouterr().err


def test_a_root_written_with_the_old_record_name_is_found_and_the_record_renamed(tmp_path, capsys):
    root = tmp_path / "t3"
    root.mkdir()
    record = {"sweep": "table3", "profile": "smoke", "extra": ["--config.seed=3"]}
    (root / "sweep.json").write_text(json.dumps(record))  # R/sweep.json: the root record's name before
    assert experiments_main.main(["status", "table3", f"--root={root}", "--only=base"]) == 0
    out = capsys.readouterr()
    assert "profile smoke" in out.out and "moved from sweep.json to sweep-root.json" in out.err
    assert json.loads((root / "sweep-root.json").read_text()) == record and not (root / "sweep.json").exists()
    assert experiments_main.main(["status", "table3", f"--root={root}", "--only=base", "--dry-run"]) == 0


def test_a_damaged_sweep_status_file_is_one_sentence_for_every_verb(tmp_path, capsys):
    root = tmp_path / "t3"
    (root / "base").mkdir(parents=True)
    (root / "sweep-root.json").write_text('{"sweep": "table3", "profile": "smoke", "extra": []}')
    (root / "base" / "sweep.json").write_text('{"owner": "host:1", "attem')  # cut short by a storage fault
    for verb in ("status", "collect", "run"):
        with left_as_is(root):
            assert experiments_main.main([verb, "table3", f"--root={root}", "--only=base"]) == exitcodes.USER_ERROR
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "sweep.json (the sweep's record of this row) is damaged" in err[0], err
    (root / "sweep-root.json").write_text('{"sweep": "tab')
    with left_as_is(root):
        assert experiments_main.main(["status", "table3", f"--root={root}"]) == exitcodes.USER_ERROR
    assert "sweep-root.json (the sweep's root record) is damaged" in capsys.readouterr().err
