"""Bad input to the CLIs and trace summaries: a clear error naming what was wrong, exit status 2 for flags."""
from __future__ import annotations

import pytest

from suite.measure import kernels, stage
from tools import repack_ray_wheel


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


def test_stage_bad_device_exits_2(capsys):
    assert stage.main(["verify", "--workload", "minicpmo45", "--device", "tpu", "--out", "x"]) == 2
    assert "--device" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("what", ["missing", "not-a-zip", "no-record", "own-folder"])
def test_repack_ray_wheel_bad_input_exits_2(tmp_path, capsys, what):
    import zipfile
    wheel = tmp_path / "ray-9.9.9-py3-none-any.whl"
    if what == "not-a-zip":
        wheel.write_text("x")
    elif what in ("no-record", "own-folder"):
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("ray/__init__.py", "")
            if what == "own-folder":
                z.writestr("ray-9.9.9.dist-info/RECORD", "ray/__init__.py,,\n")
    out = tmp_path if what == "own-folder" else tmp_path / "out"
    assert repack_ray_wheel.main([str(wheel), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_repack_ray_wheel_drops_the_jars_and_their_record_lines(tmp_path):
    import zipfile
    wheel = tmp_path / "ray-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("ray/__init__.py", "x = 1\n")
        z.writestr("ray/jars/ray_dist.jar", b"\0" * 1000)
        z.writestr("ray-9.9.9.dist-info/RECORD", "ray/__init__.py,sha256=a,6\nray/jars/ray_dist.jar,sha256=b,1000\n")
    assert repack_ray_wheel.main([str(wheel), "--out", str(tmp_path / "out")]) == 0
    with zipfile.ZipFile(tmp_path / "out" / wheel.name) as z:
        assert z.namelist() == ["ray/__init__.py", "ray-9.9.9.dist-info/RECORD"]
        assert z.read("ray-9.9.9.dist-info/RECORD").decode() == "ray/__init__.py,sha256=a,6\n"
        assert z.read("ray/__init__.py") == b"x = 1\n"


def test_same_bytes_compares_the_stages_both_folders_have_done(tmp_path, capsys):
    import json
    from tools import same_bytes

    def folder(name, sha, extra=()):
        run = tmp_path / name
        (run / "w.verify").mkdir(parents=True)
        (run / "stages.json").write_text(json.dumps({"schema": "duplexcadence.stages/1", "options": {"device": "cuda"},
                                                    "stages": {"w.verify": {"workload": "w", "harness": "verify",
                                                                            "status": "done"}}}))
        (run / "w.verify" / "run.json").write_text(json.dumps({"modes": {"stock": {"units": [
            {"index": 3, "sha256_f32": sha, "sha256_pcm16": "p"}, {"index": 4, "sha256_f32": None},
            *({"index": i, "sha256_f32": "z", "sha256_pcm16": "p"} for i in extra)]}}}))
        return str(run)
    a, b, c = folder("a", "x"), folder("b", "x", extra=(7, 8)), folder("c", "y")
    assert same_bytes.main([a, b]) == 0                                     # units only b has are listed, not unequal
    assert "w.verify: 1 units in both, 0 differ, 2 in one only" in capsys.readouterr().out
    assert same_bytes.main([a, c]) == 1 and "1 units in both, 1 differ, 0 in one only: [('stock', 3)]" in capsys.readouterr().out
    assert same_bytes.main([a, str(tmp_path / "nowhere")]) == 2
    capsys.readouterr()
    (tmp_path / "c" / "w.verify" / "run.json").write_text('{"modes": {"stock": {"units": [')     # truncated
    assert same_bytes.main([a, c]) == 2
    assert f"{tmp_path / 'c' / 'w.verify' / 'run.json'}: missing or not a JSON object" in capsys.readouterr().err
    (tmp_path / "c" / "w.verify" / "run.json").write_text('{"modes": {"stock": {"units": [5]}}}')  # a unit not an object
    assert same_bytes.main([a, c]) == 2 and "its units are not shaped as a run record's" in capsys.readouterr().err


def _harness_cli(name):
    from suite.measure import dropin, floor, stress
    return {"floor": (floor.main, ["--workload", "moshi", "--device", "cpu"]),
            "stage": (stage.main, ["mode", "--workload", "moshi", "--mode", "stock", "--device", "cpu"]),
            "dropin": (dropin.main, ["--dropin", "mimi", "--device", "cpu"]),
            "stress": (stress.main, ["--workloads", "moshi", "--device", "cpu", "--seconds", "1"])}[name]


@pytest.mark.parametrize("name", ["floor", "stage", "dropin", "stress"])
@pytest.mark.parametrize("extra, says", [
    (["--out", "{file}"], "--out: expected a folder (new or existing), got '{file}': {file} is a file"),
    (["--out", "{file}/sub"], "--out: expected a folder (new or existing), got '{file}/sub': {file} is a file"),
    (["--out", ""], "--out: expected a folder (new or existing), got an empty path"),
    (["--out", "{tmp}/o", "--device", "cuda:7"], "--device: expected a CUDA device this machine has"),
    (["--out", "{tmp}/o", "--device", "cpu:3"], "--device: expected cpu, cuda or cuda:N, got 'cpu:3'"),
    (["--out", "{tmp}/o", "--steps", "5"], "steps"),
])
def test_every_harness_refuses_a_bad_out_device_or_steps_before_it_runs(tmp_path, capsys, name, extra, says):
    """One line naming the flag, exit 2, nothing written: an --out that is a file, under a file or empty (it
    wrote into the current folder), a CUDA device this machine lacks, an indexed CPU, Euler steps for a codec
    decoder (recorded as euler_steps -4 before)."""
    if extra[-1] == "cuda:7" and __import__("torch").cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    (tmp_path / "f").write_text("")
    subs = {"file": str(tmp_path / "f"), "tmp": str(tmp_path)}
    main, args = _harness_cli(name)
    try:
        code = main([*args, *(e.format(**subs) for e in extra)])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert says.format(**subs) in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_floor_refuses_timeout_nan_unknown_or_no_modes_before_a_child_runs(tmp_path, capsys):
    from suite.measure import floor
    for extra, says in ((["--timeout-s", "nan"], "--timeout-s: expected finite seconds > 0, got nan"),
                        (["--timeline-modes", "bogus"], "--timeline-modes: moshi has the modes"),
                        (["--timeline-modes", ","], "--timeline-modes: expected at least one mode (or --memory)")):
        try:
            code = floor.main(["--workload", "moshi", "--device", "cpu", "--out", str(tmp_path / "o"), *extra])
        except SystemExit as exc:
            code = exc.code
        assert code == 2 and says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
