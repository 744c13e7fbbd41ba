"""Bad input to the CLIs and trace summaries: a clear error naming what was wrong, exit status 2 for flags."""
from __future__ import annotations

import pytest

from suite import kernels, stage_run
from suite.gpu import flow_hift_check


@pytest.mark.parametrize("events,match", [
    pytest.param(None, "events: expected a list", id="none"),
    pytest.param({"traceEvents": []}, "events: expected a list", id="whole-trace"),
    pytest.param([1], r"events\[0\]: expected a dict", id="not-a-dict"),
    pytest.param([{"ph": "X", "cat": "kernel"}], r"events\[0\].*ts", id="no-ts"),
    pytest.param([{"ph": "X", "cat": "kernel", "ts": "a"}], r"events\[0\].*ts", id="ts-text"),
    pytest.param([{"ph": "X", "cat": "kernel", "ts": 5, "dur": -3}], r"events\[0\].*dur >= 0", id="negative-dur"),
    pytest.param([{"ph": "X", "cat": "gpu_memcpy", "ts": float("nan"), "dur": 3}], r"events\[0\].*finite",
                 id="nan-ts"),
])
def test_summarize_trace_rejects_odd_input_naming_the_event(events, match):
    with pytest.raises(ValueError, match=match):
        kernels.summarize_trace(events)


def test_summarize_trace_still_counts_a_good_trace():
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 10},
          {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 10},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0},
          {"ph": "i", "cat": "kernel"}]
    out = kernels.summarize_trace(ev)
    assert out["kernels"] == 2 and out["kernel_launches"] == 1 and out["kernel_busy_ms"] == pytest.approx(0.015)


@pytest.mark.parametrize("flags,match", [
    (["--device", "cpu", "--steps", "0"], "--steps"),
    (["--device", "cpu", "--steps", "2", "17"], "--steps"),
    (["--device", "tpu"], "--device"),
    (["--device", "cpu", "--max-speak-units", "0"], "--max-speak-units"),
])
def test_flow_hift_check_bad_flag_exits_2_naming_it(capsys, flags, match):
    with pytest.raises(SystemExit) as exc:
        flow_hift_check.main([*flags, "--depth", "reduced"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert match in err[-1] and "Traceback" not in "".join(err)


def test_stage_run_bad_device_exits_2(capsys):
    assert stage_run.main(["verify", "--workload", "minicpmo45", "--device", "tpu", "--out", "x"]) == 2
    assert "--device" in capsys.readouterr().err.strip().splitlines()[-1]
