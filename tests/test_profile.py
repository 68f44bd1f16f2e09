"""fxformer.profile: a traced training step's device time added up per part of the model."""

import json
import subprocess
import sys

import pytest
from conftest import env_with_devices

from fxformer import profile

LOGITS = "jit(train_step)/jvp(Transformer)/Transformer.decode/decoder/embed.logits/dot_general"
ATTENTION = "jit(train_step)/encoder/layer_0/self_attention/dot_product_attention"
HLO = f"""
  %fusion.1 = f32[4,8]{{1,0}} fusion(%p0), kind=kLoop, metadata={{op_name="{LOGITS}" source_file="x"}}
  ROOT %fusion.2 = f32[4]{{0}} fusion(%fusion.1), metadata={{op_name="jit(train_step)/jvp()/cross_entropy/reduce_max"}}
  %custom-call.3 = bf16[4,8]{{1,0}} custom-call(%a), metadata={{op_name="{ATTENTION}"}}
  %add.4 = f32[8]{{0}} add(%a, %b), metadata={{op_name="jit(train_step)/optimizer/add"}}
  %copy.5 = f32[8]{{0}} copy(%a)
"""


def event(pid, op, dur):
    return {"ph": "X", "pid": pid, "tid": 1, "ts": 0.0, "dur": dur, "name": f"kernel_{op}", "args": {"hlo_op": op}}


def test_device_time_is_added_per_part_and_divided_by_the_steps():
    trace = {
        "traceEvents": [
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
            event(1, "fusion.1", 30.0),
            event(1, "fusion.1", 30.0),
            event(1, "fusion.2", 6.0),
            event(1, "custom-call.3", 12.0),
            event(1, "add.4", 2.0),
            event(1, "copy.5", 4.0),
            event(2, "fusion.1", 1000.0),  # the host's launch of a kernel: not device time
        ]
    }
    names = profile.op_names(HLO)
    assert names["fusion.2"].endswith("cross_entropy/reduce_max") and "copy.5" not in names
    summary = profile.summarize(profile.device_events(trace), names, steps=2)
    assert summary["device_us_per_step"] == pytest.approx((60 + 6 + 12 + 2 + 4) / 2)
    assert summary["parts"] == pytest.approx(
        {"output projection + loss": 33.0, "attention": 6.0, "other": 2.0, "optimizer": 1.0}
    )
    assert [t["op"] for t in summary["top_ops"]] == ["fusion.1", "custom-call.3", "fusion.2", "copy.5", "add.4"]


def test_on_a_cpu_the_events_naming_an_operation_are_the_device_time():
    trace = {
        "traceEvents": [
            {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/host:CPU"}},
            event(7, "fusion.1", 5.0),
            {"ph": "X", "pid": 7, "tid": 1, "ts": 0.0, "dur": 99.0, "name": "ThunkExecutor::Execute", "args": {}},
        ]
    }
    assert [e["dur"] for e in profile.device_events(trace)] == [5.0]


@pytest.mark.slow  # compiles and traces a training step
def test_profile_of_a_step_names_the_models_parts(tmp_path):
    command = [
        sys.executable,
        "-m",
        "fxformer.profile",
        "--config=configs/default.py",
        f"--out={tmp_path}",
        "--steps=2",
        "--config.model.num_layers=1",
        "--config.data.tokens_per_batch=1024",
    ]
    result = subprocess.run(command, env=env_with_devices(1), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((tmp_path / "profile.json").read_text())
    assert sum(out["parts"].values()) == pytest.approx(out["device_us_per_step"])
    for part in ("attention", "feed-forward", "output projection + loss", "optimizer"):
        assert out["parts"].get(part, 0) > 0, part
    assert (tmp_path / "perfetto_trace.json.gz").stat().st_size > 0 and (tmp_path / "step.hlo.txt.gz").exists()
    assert "device busy" in result.stdout and "most expensive operations" in result.stdout
