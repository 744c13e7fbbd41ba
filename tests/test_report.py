"""suite.report (a single run's REPORT.md, `python -m suite.report`) and suite.reproduce (the CLI, its
console, its exit status), on the fake adapter of tests/fakes.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

import fakes
import workloads
from duplexcadence.session import to_pcm16
from fakes import SAMPLES_PER_TOKEN, fake_wave, workload
from suite import records, reproduce
from suite.measure import verify as verify_harness
from suite.report import cli as report, single
from test_reproduce_stages import clean_tree, inline  # noqa: F401


@pytest.fixture
def verified(monkeypatch, clean_tree):  # noqa: F811
    fakes.register(monkeypatch)
    wl = workload(turns=2, speak_per_turn=4)
    speak = [u.index for u in wl.script.units if u.kind == "SPEAK"]
    wl.spec["cadence_off_units"] = [speak[4]]
    return wl, verify_harness.verify(wl, "cpu", progress=False)


def written(res, folder):
    """The stage process's files (run.json, audio) and the REPORT.md the driver renders from them."""
    records.write_run(folder, res.to_dict(), res.audio())
    single.write(folder)
    return folder


def test_results_folder_layout(verified, tmp_path):
    wl, res = verified
    folder = written(res, tmp_path / "fake.verify")
    rec = json.loads((folder / "run.json").read_text())
    assert rec["run_id"] == "fake.verify"
    assert sorted(p.name for p in folder.iterdir()) == ["REPORT.md", "audio_cadence.wav", "audio_stock.wav", "run.json"]
    assert rec["schema"] == records.RUN_SCHEMA and rec["verdict"] == "INVALID"
    for key in ("tail_ms_p50", "tail_ms_p90", "tail_ms_p99", "rtf", "units_measured"):
        assert key in rec["modes"]["stock"]["metrics"], key
    assert "peak_rss_mib" in rec["modes"]["stock"]["memory"]


def test_wav_sample_count_equals_unit_samples(verified, tmp_path):
    wl, res = verified
    folder = written(res, tmp_path / "run")
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
    folder = written(res, tmp_path / "run")
    text = (folder / "REPORT.md").read_text()
    (folder / "REPORT.md").unlink()
    for wav in folder.glob("*.wav"):
        wav.unlink()                                  # run.json alone
    assert report.main([str(folder)]) == 0
    assert (folder / "REPORT.md").read_text() == text


def test_report_without_a_folder_is_an_error_and_rewrites_nothing(verified, tmp_path, monkeypatch, capsys):
    wl, res = verified
    folder = written(res, tmp_path / "results" / "run")
    (folder / "REPORT.md").unlink()
    monkeypatch.chdir(tmp_path)
    assert report.main([]) == 2
    err = capsys.readouterr().err
    assert "FOLDER: none given" in err and "make report ARGS=results/<run>" in err
    assert not list(tmp_path.rglob("REPORT.md"))


def test_report_content(verified, tmp_path):
    wl, res = verified
    text = (written(res, tmp_path / "run") / "REPORT.md").read_text()
    bad = res.mismatches[0]
    assert "**Verdict: INVALID**" in text and f"sha256 mismatch at unit {bad}" in text
    assert f"differing units: [{bad}]" in text
    rows = {int(line.split("|")[1]): line for line in text.splitlines()
            if line.startswith("|") and line.split("|")[1].strip().isdigit()}
    assert sorted(rows) == [u.index for u in wl.script.units]
    for r in res.stock.units:
        if r.kind == "SPEAK":
            cad = next(c for c in res.cadence.units if c.index == r.index)
            cells = [c.strip() for c in rows[r.index].split("|")[1:-1]]
            assert r.sha256_f32[:12] in cells and cad.sha256_f32[:12] in cells
            assert cells[-1] == ("no" if r.index == bad else "yes")
    assert "2.85x" in text and "-38.8%" in text and "+14% -> -2%" in text
    assert text.rstrip().split("## ")[-1].startswith("Parameters used")
    assert "| euler_steps" in text and "| seed.weights" in text


def test_stock_only_report_says_so(monkeypatch, clean_tree, tmp_path):  # noqa: F811
    fakes.register(monkeypatch, modes=("stock",))
    res = verify_harness.verify(workload(), "cpu", progress=False)
    text = (written(res, tmp_path / "run") / "REPORT.md").read_text()
    assert "Stock only: no cadence session ran" in text and "cadence mode not available" in text


def test_rebuild_names_missing_run_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither stages.json nor run.json there"):
        report.rebuild(tmp_path)


def test_a_duplex_folder_gets_its_plots(tmp_path):
    from test_duplex import part
    records.write_duplex(tmp_path / "duplex.json", part("cadence"))
    assert report.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["wl_a_miss_rate.png", "wl_a_speak.png"]


# --- reproduce ------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_workloads(monkeypatch):
    fakes.register(monkeypatch)
    registry = {"fake": workload(turns=3, speak_per_turn=5), "fake_off": workload(turns=3, speak_per_turn=5,
                                                                                    name="fake_off")}
    off = [u.index for u in registry["fake_off"].script.units if u.kind == "SPEAK"][2]
    registry["fake_off"].spec["cadence_off_units"] = [off]
    monkeypatch.setattr(workloads, "get", registry.__getitem__)
    monkeypatch.setattr(workloads, "names", lambda: list(registry))
    monkeypatch.setattr(workloads, "DEFAULT", "fake")
    return registry


def _reproduce(args, tmp_path):
    return reproduce.main([*args, "--device", "cpu", "--run-dir", str(tmp_path / "run")], execute=inline)


def test_reproduce_cpu_default_leads_with_the_bytes_and_says_it_is_no_speed_measurement(fake_workloads, clean_tree,  # noqa: F811
                                                                                     tmp_path, capsys):
    rc = reproduce.main(["--device", "cpu", "--out", str(tmp_path)], execute=inline)
    (folder,) = tmp_path.glob("*-cpu-reproduce")
    state = json.loads((folder / "stages.json").read_text())
    assert list(state["stages"]) == ["fake.verify"]           # CPU default: the default workload, verify only
    rec = json.loads((folder / "fake.verify" / "run.json").read_text())
    assert rc == 0
    assert rec["parameters"]["max_speak_units"] == reproduce.CPU_DEFAULT_SPEAK_UNITS
    assert rec["verdict"] == "INVALID" and set(rec["invalid_codes"]) == {"few_units"}
    out = capsys.readouterr().out.splitlines()
    i = out.index("outcome:")
    assert out[i + 1] == "  fake.verify: 4/4 units byte-identical, stock vs cadence"
    assert out[i + 2] == f"  {reproduce.CPU_SPEED_NOTE}"
    assert out[i + 3].startswith("results:")
    line = next(x for x in out if x.startswith("stage 1 of 1 fake.verify: done in"))
    assert line.index("4/4 units byte-identical") < line.index("record verdict INVALID (few_units)")
    assert "## Speedup" in (folder / "REPORT.md").read_text()
    assert (folder / "fake.verify" / "REPORT.md").is_file()       # the stage's own report, rendered by the driver


def test_reproduce_fails_on_a_differing_unit(fake_workloads, clean_tree, tmp_path, capsys):  # noqa: F811
    assert _reproduce(["--workload", "fake_off"], tmp_path) == 1
    st = json.loads((tmp_path / "run" / "stages.json").read_text())["stages"]["fake_off.verify"]
    assert st["status"] == "done" and st["mismatched_units"] and st["units_compared"] == 4
    out = capsys.readouterr()
    assert "  fake_off.verify: 3/4 units byte-identical, stock vs cadence; DIFFERING: [" in out.out
    assert "FAIL: fake_off.verify: 1 unit(s) differ" in out.err


def test_reproduce_fails_on_dirty_tree(fake_workloads, monkeypatch, tmp_path):
    from suite.measure import env
    real = env.provenance
    monkeypatch.setattr(env, "provenance", lambda command=None, *, device="cpu": {
        **real(command, device=device), "git_dirty": True, "git_status": [" M impl/x.py"]})
    assert _reproduce(["--workload", "fake"], tmp_path) == 1


def test_reproduce_without_ray_installed_says_how_to_get_it(fake_workloads, clean_tree, tmp_path, monkeypatch,  # noqa: F811
                                                            capsys):
    import builtins
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "ray" else real(name, *a, **k))
    assert _reproduce(["--ray", "local"], tmp_path) == 2
    assert "RAY=1" in capsys.readouterr().err


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
    pytest.param(["--gpus", "0,1"], "unrecognized arguments: --gpus", id="gpus-gone"),
])
def test_reproduce_bad_input_is_a_clear_error(fake_workloads, args, message, capsys):
    assert reproduce.main(args) == 2
    assert message in capsys.readouterr().err


