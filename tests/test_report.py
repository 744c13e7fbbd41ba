"""suite.report and suite.reproduce: results folder, WAV, REPORT.md rebuilt from run.json, exit status."""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import soundfile as sf

from suite import report, reproduce, runner, stages
from test_suite_runner import (SAMPLES_PER_TOKEN, clean_tree, fake_adapter, fake_wave,  # noqa: F401
                               to_pcm16, workload)


@pytest.fixture
def verified(fake_adapter, clean_tree):  # noqa: F811
    wl = workload(turns=2, speak_per_turn=4)
    speak = [u.index for u in wl.script.units if u.kind == "SPEAK"]
    wl.spec["cadence_off_units"] = [speak[4]]
    return wl, runner.verify(wl, "cpu", progress=False)


def test_results_folder_layout(verified, tmp_path):
    wl, res = verified
    folder = report.write_results(res, tmp_path)
    rec = json.loads((folder / "run.json").read_text())
    assert folder.name == rec["run_id"] == f"{rec['provenance']['date_utc'][:10]}-cpu-fake"
    assert sorted(p.name for p in folder.iterdir()) == ["REPORT.md", "audio_cadence.wav", "audio_stock.wav",
                                                        "run.json"]
    assert rec["schema"] == runner.SCHEMA and rec["verdict"] == "INVALID"
    for key in ("tail_ms_p50", "tail_ms_p90", "tail_ms_p99", "rtf", "units_measured"):
        assert key in rec["modes"]["stock"]["metrics"], key
    assert "peak_rss_mib" in rec["modes"]["stock"]["memory"]
    # a second run of the same day goes next to the first, never over it
    assert report.write_results(res, tmp_path).name == f"{folder.name}-2"


def test_wav_sample_count_equals_unit_samples(verified, tmp_path):
    wl, res = verified
    folder = report.write_results(res, tmp_path)
    rec = json.loads((folder / "run.json").read_text())
    for mode in ("stock", "cadence"):
        total = sum(u["samples"] for u in rec["modes"][mode]["units"])
        info = sf.info(folder / f"audio_{mode}.wav")
        assert (info.frames, info.samplerate, info.channels, info.subtype) == (total, 24000, 1, "PCM_16")
        assert rec["audio"][mode]["samples"] == total
    data, _ = sf.read(folder / "audio_stock.wav", dtype="int16")
    want = np.concatenate([to_pcm16(fake_wave(u.tokens)) for u in wl.script.units if u.kind == "SPEAK"])
    assert data.tobytes() == want.tobytes()
    assert total == SAMPLES_PER_TOKEN * sum(len(u.tokens) for u in wl.script.units if u.kind == "SPEAK")


def test_report_rebuilds_from_run_json(verified, tmp_path):
    wl, res = verified
    folder = report.write_results(res, tmp_path)
    written = (folder / "REPORT.md").read_text()
    (folder / "REPORT.md").unlink()
    for wav in folder.glob("*.wav"):
        wav.unlink()                                  # run.json alone
    assert report.main([str(folder)]) == 0
    assert (folder / "REPORT.md").read_text() == written


def test_report_without_a_folder_is_an_error_and_rewrites_nothing(verified, tmp_path, monkeypatch, capsys):
    # once every results/*/ was re-rendered: committed reports of older code, silently rewritten
    wl, res = verified
    folder = report.write_results(res, tmp_path / "results")
    (folder / "REPORT.md").unlink()
    monkeypatch.chdir(tmp_path)                       # results/ here is the one just written
    assert report.main([]) == 2
    err = capsys.readouterr().err
    assert "FOLDER: none given" in err and "make report ARGS=results/<run>" in err
    assert not list(tmp_path.rglob("REPORT.md"))


def test_report_content(verified, tmp_path):
    wl, res = verified
    text = (report.write_results(res, tmp_path) / "REPORT.md").read_text()
    bad = res.mismatches[0]
    assert "**Verdict: INVALID**" in text
    assert f"sha256 mismatch at unit {bad}" in text
    assert f"differing units: [{bad}]" in text
    # one per-unit row per script unit, with the hash prefixes of both modes and the equal flag
    rows = {int(line.split("|")[1]): line for line in text.splitlines()
            if line.startswith("|") and line.split("|")[1].strip().isdigit()}
    assert sorted(rows) == [u.index for u in wl.script.units]
    for r in res.stock.units:
        if r.kind == "SPEAK":
            cad = next(c for c in res.cadence.units if c.index == r.index)
            cells = [c.strip() for c in rows[r.index].split("|")[1:-1]]
            assert r.sha256_f32[:12] in cells and cad.sha256_f32[:12] in cells
            assert cells[-1] == ("no" if r.index == bad else "yes")
    # published figures beside ours, and "Parameters used" closes the report
    assert "2.85x" in text and "-38.8%" in text and "+14% -> -2%" in text
    assert text.rstrip().split("## ")[-1].startswith("Parameters used")
    assert "| euler_steps" in text and "| seed.weights" in text


def test_stock_only_report_says_so(monkeypatch, clean_tree, tmp_path):  # noqa: F811
    from test_suite_runner import _fake_module
    from duplexcadence import runtime

    mod = _fake_module(modes=("stock",))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(runtime.ADAPTERS, "fake", mod.__name__)
    res = runner.verify(workload(), "cpu", progress=False)
    text = (report.write_results(res, tmp_path) / "REPORT.md").read_text()
    assert "Stock only: no cadence session ran" in text and "cadence mode not available" in text


def test_rebuild_names_missing_run_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither stages.json nor run.json there"):
        report.rebuild(tmp_path)


# --- reproduce (staged: suite.stages; stages run inline so the fake adapter is seen) ---------------
@pytest.fixture
def fake_workloads(monkeypatch, fake_adapter):  # noqa: F811
    registry = {"fake": workload(turns=3, speak_per_turn=5), "fake_off": workload(turns=3, speak_per_turn=5)}
    off = [u.index for u in registry["fake_off"].script.units if u.kind == "SPEAK"][2]
    registry["fake_off"].spec["cadence_off_units"] = [off]
    mod = types.ModuleType("workloads")
    mod.get = registry.__getitem__
    mod.names = lambda: list(registry)
    mod.DEFAULT = "fake"
    monkeypatch.setitem(sys.modules, "workloads", mod)
    return registry


def _reproduce(args, tmp_path):
    return reproduce.main([*args, "--device", "cpu", "--run-dir", str(tmp_path / "run")],
                          execute=stages.inline_executor)


def test_reproduce_cpu_default_short_run_passes(fake_workloads, clean_tree, tmp_path, capsys):  # noqa: F811
    rc = reproduce.main(["--device", "cpu", "--out", str(tmp_path)], execute=stages.inline_executor)
    (folder,) = tmp_path.glob("*-cpu-reproduce")
    state = json.loads((folder / "stages.json").read_text())
    assert list(state["stages"]) == ["fake.verify"]           # CPU default: the default workload, verify only
    rec = json.loads((folder / "fake.verify" / "run.json").read_text())
    assert rc == 0
    assert rec["parameters"]["max_speak_units"] == reproduce.CPU_DEFAULT_SPEAK_UNITS
    assert rec["verdict"] == "INVALID" and set(rec["invalid_codes"]) == {"few_units"}
    assert any(n.startswith(f"CPU default: a short run of the first {reproduce.CPU_DEFAULT_SPEAK_UNITS} SPEAK units")
               for n in rec["notes"])
    assert "results:" in capsys.readouterr().out
    assert "## Speedup" in (folder / "REPORT.md").read_text()


def test_reproduce_fails_on_a_differing_unit(fake_workloads, clean_tree, tmp_path):  # noqa: F811
    assert _reproduce(["--workload", "fake_off"], tmp_path) == 1
    state = json.loads((tmp_path / "run" / "stages.json").read_text())
    assert state["stages"]["fake_off.verify"]["status"] == "done"          # it ran; its bytes differ
    assert state["stages"]["fake_off.verify"]["mismatched_units"]


def test_reproduce_fails_on_dirty_tree(fake_workloads, monkeypatch, tmp_path):
    from suite import env
    real = env.provenance
    monkeypatch.setattr(env, "provenance", lambda command=None, *, device="cpu": {
        **real(command, device=device), "git_dirty": True, "git_status": [" M impl/x.py"]})
    assert _reproduce(["--workload", "fake"], tmp_path) == 1


def test_reproduce_rejects_cuda_without_cuda(monkeypatch):
    monkeypatch.setattr(reproduce.torch.cuda, "is_available", lambda: False)
    assert reproduce.main(["--device", "cuda"]) == 2
    assert reproduce.resolve_device("auto") == "cpu"


@pytest.mark.parametrize("args, message", [
    pytest.param(["--workload", "nosuch"], "--workload nosuch: unknown workload", id="workload"),
    pytest.param(["--stages", "nosuch.*"], "no stage matches", id="stages"),
    pytest.param(["--budget-s", "-5"], "expected a positive float", id="budget"),
    pytest.param(["--device", "tpu"], "expected auto, cpu, cuda or cuda:N", id="device"),
    pytest.param(["--resume"], "--resume needs --run-dir", id="resume-without-dir"),
    pytest.param(["--compare", "/nonexistent"], "neither stages.json nor run.json", id="compare"),
])
def test_reproduce_bad_input_is_a_clear_error(fake_workloads, args, message, capsys):
    assert reproduce.main(args) == 2
    assert message in capsys.readouterr().err


def test_round_line_gives_the_per_unit_host_samples_of_each_mode():
    from suite.report import unit_host_text
    per_mode = {"stock": {"host_op_us_p50": 10.46, "cpu_loop_us_p50": 61.2, "sm_mhz_p50": 1980.0},
                "cadence": {"host_op_us_p50": 7.27, "cpu_loop_us_p50": 60.0}}
    assert unit_host_text(per_mode) == (", per unit p50 stock / cadence: launch 10.46 / 7.27 us, "
                                        "CPU loop 61 / 60 us, SM 1980 / — MHz")
    assert unit_host_text(None) == "" and unit_host_text({"stock": {}, "cadence": {}}) == ""


def test_one_round_summary_gives_the_per_unit_host_samples_too():
    from suite.report import summary_text
    rec = {"modes": {}, "verdict": "VALID",
           "comparison": {"speedup_x": 2.0, "units_compared": 3, "mismatched_units": [],
                          "rounds": [{"round": 1, "order": ["stock", "cadence"], "speedup_x": 2.0,
                                      "stock_tail_ms_p50": 10.0, "cadence_tail_ms_p50": 5.0,
                                      "unit_host_p50": {"stock": {"host_op_us_p50": 7.3},
                                                        "cadence": {"host_op_us_p50": 10.5}}}]}}
    text = summary_text(rec)
    assert "speedup (stock p50 / cadence p50): 2.000x, per unit p50 stock / cadence: launch 7.30 / 10.50 us" in text


def test_round_line_ignores_a_malformed_round_s_samples():
    from suite.report import unit_host_text
    for bad in ([1, 2], "x", 3, {"stock": [7.3], "cadence": "10"}):
        assert unit_host_text(bad) == ""
