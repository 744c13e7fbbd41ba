"""suite.report (a single run's REPORT.md, `python -m suite.report`) and suite.reproduce (the CLI, its
console, its exit status), on the fake adapter of tests/fakes.py."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fakes
import workloads
from duplexcadence.session import to_pcm16
from fakes import SAMPLES_PER_TOKEN, fake_wave, workload
from suite import records, reproduce
from suite.measure import session, verify as verify_harness
from suite.records.floor import FLOOR_SCHEMA
from suite.records.paired import Protocol
from suite.report import cli as report, document, single
from test_reproduce_stages import inline


@pytest.fixture
def verified(monkeypatch, clean_tree):  # noqa: F811
    fakes.register(monkeypatch)
    wl = workload(turns=2, speak_per_turn=4)
    speak = [u.index for u in wl.script.units if u.kind == "SPEAK"]
    wl.spec["cadence_off_units"] = [speak[4]]
    return wl, verify_harness.verify(wl, "cpu", protocol=Protocol(processes=3), launch="inline", progress=False)


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
    assert rec["schema"] == records.VERIFY_SCHEMA and rec["verdict"] == "INVALID"
    for key in ("tail_ms_p50", "tail_ms_p90", "tail_ms_p99", "rtf", "units_measured"):
        assert key in rec["modes"]["stock"]["metrics"], key
    assert rec["modes"]["stock"]["memory"] == {}                 # memory: the memory stages, one process per mode


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
    bad = res.to_dict()["comparison"]["mismatched_units"][0]
    assert "**Verdict: INVALID**" in text and f"process 1 pass 0 unit {bad}: stock and cadence bytes differ" in text
    assert f"differing units: [{bad}]" in text and "Bit-exactness: 21/24 SPEAK units" in text
    rows = {int(line.split("|")[1]): line for line in text.splitlines()
            if line.startswith("|") and line.split("|")[1].strip().isdigit()}
    speak = [u.index for u in wl.script.units if u.kind == "SPEAK"]
    assert sorted(rows) == speak
    for i in speak:
        cells = [c.strip() for c in rows[i].split("|")[1:-1]]
        want = fake_wave(next(u.tokens for u in wl.script.units if u.index == i))
        assert hashlib.sha256(want.astype("<f4").tobytes()).hexdigest()[:12] in cells
        assert cells[-1] == ("no" if i == bad else "yes")
    assert "## Paired speedup" in text and "3 processes" in text and "- A/A floor (stock / stock): " in text
    assert "None for this workload: the paper published figures for MiniCPM-o 4.5 at 10 Euler steps only." in text
    assert "2.85x" not in text
    assert text.rstrip().split("## ")[-1].startswith("Parameters used")
    assert "| euler_steps" in text and "| seed.weights" in text and "| processes | 3 |" in text
    rec = res.to_dict()
    rec["workload"]["model"] = records.PUBLISHED_MODEL            # the published configuration: its figures beside
    assert "| speedup (stock / cadence, median) | 2.85x |" in single.render(rec)


def test_a_one_mode_report_says_it_compared_nothing(monkeypatch, clean_tree, tmp_path):  # noqa: F811
    fakes.register(monkeypatch, modes=("stock",))
    res = session.run_workload(workload(), "stock", "cpu", progress=False)
    text = (written(res, tmp_path / "run") / "REPORT.md").read_text()
    assert "Stock only: no cadence session ran" in text


def test_rebuild_names_missing_run_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither stages.json nor run.json there"):
        report.rebuild(tmp_path)


def test_a_duplex_folder_gets_its_plots(tmp_path):
    from test_duplex import part
    records.write_duplex(tmp_path / "duplex.json", part("cadence"))
    assert report.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["wl_a_miss_rate.png", "wl_a_speak.png"]
    text = (tmp_path / "REPORT.md").read_text()
    assert text.startswith("# Duplex sessions: wl_a") and "![wl_a_speak.png](wl_a_speak.png)" in text


def _duplex_run(sessions, misses, units, **kw):
    return {"sessions": sessions, "slack": "thread",
            "metrics": {"units_run": units, "speak_units": units, "misses": misses, "speak_misses": misses,
                        "speak_ms_mean": 150.0, "speak_ms_p50": 120.0, "speak_ms_p99": 600.0,
                        "max_lateness_ms": 800.0 if misses else -300.0},
            "captures_during_cadence": 40, "captures_inside_timed_units": 0, "eager_fallbacks_during_cadence": 5,
            "warmup_runs_during_cadence": 3,
            "graph_bytes_per_session_max": 900 * 2 ** 20, "graph_bytes_end_total": 9000 * 2 ** 20,
            "slack_jobs_overrun": 2, **kw}


def test_a_duplex_folders_report_gives_the_limit_and_a_row_per_count(tmp_path):
    """Two counts: 10 clean, 12 missed 3 of 400 units with one session's bytes unlike its run alone; 14 refused."""
    rec = {"schema": "duplexcadence.duplex/3", "verdict": "INVALID", "invalid_reasons": ["w: session 3 differs"],
           "provenance": {"date_utc": "2026-12-05T00:00:00+00:00", "git_rev": "abcdef123", "impl_tree": "fedcba987",
                          "command": "['python', '-m', 'suite.measure.duplex', '--workload', 'w']",
                          "device": {"gpu_name": "NVIDIA H200"}},
           "parameters": {"seconds": 60.0, "period_s": 1.0, "traffic": "voxconverse", "recordings": "serve",
                          "prepare": "learned:64", "ar": "none"},
           "workloads": {"w": {"modes": {"cadence": {"prepare": "learned:64", "policy": "threads", "runs": [
               _duplex_run(10, 0, 300, bytes={"checked": 10, "unchecked": [], "mismatches": []}),
               _duplex_run(12, 3, 400, bytes={"checked": 12, "unchecked": [], "mismatches": [3]}),
               {"sessions": 14, "refused": True, "reason": "admission: 14 do not fit"}],
               "search": {"stopped": "bracket exact"}}}}}}
    records.write_duplex(tmp_path / "duplex.json", rec)
    assert report.main([str(tmp_path)]) == 0
    text = (tmp_path / "REPORT.md").read_text()
    assert "**INVALID**: w: session 3 differs" in text
    assert "on NVIDIA H200, commit abcdef1, impl tree fedcba9" in text
    assert "`python -m suite.measure.duplex --workload w`" in text
    assert ("Sessions per GPU: **10-11 (12 missed 3/400)** (graphs: learned:64; policy threads, slack thread); "
            "the search stopped: bracket exact") in text
    assert "| 10 | 300 | — | 0 | 150.0 / 120.0 / 600.0 | -300 | 40 / 0 | 5 + 3 | 900 / 9000 | 2 | 10 of 10 equal |" in text
    assert "| 12 | 400 | — | 3 | 150.0 / 120.0 / 600.0 | 800 | 40 / 0 | 5 + 3 | 900 / 9000 | 2 | 11 of 12 equal |" in text
    assert "| 14 | refused: admission: 14 do not fit |" in text


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
    assert "## Speed" in (folder / "REPORT.md").read_text() and (folder / "claims.json").is_file()
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
    pytest.param(["--budget-s", "-5"], "expected a finite positive float", id="budget"),
    pytest.param(["--device", "tpu"], "expected auto, cpu, cuda or cuda:N", id="device"),
    pytest.param(["--resume"], "--resume needs --run-dir", id="resume-without-dir"),
    pytest.param(["--compare", "/nonexistent"], "neither stages.json nor run.json", id="compare"),
    pytest.param(["--gpus", "0,1"], "unrecognized arguments: --gpus", id="gpus-gone"),
])
def test_reproduce_bad_input_is_a_clear_error(fake_workloads, args, message, capsys):
    assert reproduce.main(args) == 2
    assert message in capsys.readouterr().err




# --- the staged run's REPORT.md, claims.json and the published reference --------------------------------------
ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "2026-12-01-h200-reproduce-9"


def test_the_complete_reference_run_renders_under_30_kb_with_honest_verdicts(tmp_path):
    """The committed H200 run of the older protocol (timing rounds; duplex sessions on one shared script,
    the flow-matching ones with graphs from the sessions' own script), re-rendered from its records."""
    run = tmp_path / REFERENCE.name
    shutil.copytree(REFERENCE, run, ignore=shutil.ignore_patterns("*.png", "REPORT.md", "claims.json"))
    text = document.write(run).read_text()
    assert len(text.encode()) < 30_000, len(text.encode())
    claims = {(r["claim"], r["workload"]): r for r in json.loads((run / "claims.json").read_text())["claims"]}
    assert len(claims) == 6 * 5 + 1
    assert all(r["run"] == REFERENCE.name and r["impl_tree"].startswith("47504c7") for r in claims.values())
    speed = claims[("speed", "minicpmo45")]
    assert (speed["verdict"], speed["published"], speed["target"]) == ("met", 2.85, ">= 2.85x (published)")
    assert speed["ci_low"] > 2.85 and "older protocol" in speed["note"]          # the rounds' min-max: 2.90-3.96
    assert claims[("speed", "stepaudio2_mini")]["verdict"] == "not met"                # 2.25x against >= 3x
    for w in ("minicpmo45_5step", "moshi", "qwen3_omni"):
        assert claims[("speed", w)]["verdict"] == "open" and "no A/A floor" in claims[("speed", w)]["note"]
    for w in ("minicpmo45", "minicpmo45_5step", "stepaudio2_mini", "moshi", "qwen3_omni"):
        row = claims[("sessions per GPU", w)]
        assert row["verdict"] == "open" and row["ours"] is None and row["oracle"]
    assert "oracle" in claims[("sessions per GPU", "minicpmo45")]["oracle"]
    assert "shared script" in claims[("sessions per GPU", "moshi")]["oracle"]
    assert claims[("mean SPEAK vs 1 s", "minicpmo45")]["verdict"] == "open"          # tail only
    assert [claims[("peak memory", w)]["verdict"] for w in ("moshi", "qwen3_omni")] == ["not met", "not met"]
    assert claims[("tail / kernel-busy", "moshi")]["verdict"] == "met"
    published = [k for k, r in claims.items() if r["published"] is not None]
    assert {w for _, w in published} == {"minicpmo45"}
    assert "| speed | minicpmo45 | 2.85x |" in text and "| speed | stepaudio2_mini | — |" in text
    for png in ("speed.png", "memory.png", "sessions.png", "speak_limit.png"):
        assert (run / png).stat().st_size > 0 and f"]({png})" in text


def test_publish_writes_the_fixed_paths_from_one_staged_run(fake_workloads, clean_tree, tmp_path, capsys):  # noqa: F811
    results = tmp_path / "results"
    run_dir = results / "run"
    assert reproduce.main(["--device", "cpu", "--workload", "fake", "--run-dir", str(run_dir), "--max-speak-units", "15"],
                          execute=inline) == 0
    assert report.main([str(run_dir), "--publish", "--results", str(results)]) == 0
    text = (results / "REPORT.md").read_text()
    assert "](run/speed.png)" in text and (run_dir / "speed.png").is_file()
    assert (run_dir / "REPORT.md").read_text() == text.replace("](run/", "](")
    data = json.loads((results / "CLAIMS.json").read_text())
    assert data == json.loads((run_dir / "claims.json").read_text()) and data["run"] == "run"
    assert set(data["claims"][0]) >= {"claim", "workload", "published", "ours", "ci_low", "ci_high", "stock", "target",
                                      "verdict", "run", "impl_tree"}
    assert report.main([str(run_dir), str(run_dir), "--publish", "--results", str(results)]) == 2
    assert report.main([str(run_dir / "fake.verify"), "--publish", "--results", str(results)]) == 2
    assert report.main([str(run_dir), "--publish", "--results", str(tmp_path / "elsewhere")]) == 1
    assert "is not inside" in capsys.readouterr().err
    (results / "CLAIMS.json").unlink()
    (results / "CLAIMS.json").mkdir()                        # a destination that cannot be written
    before = (run_dir / "REPORT.md").stat().st_mtime_ns
    assert report.main([str(run_dir), "--publish", "--results", str(results)]) == 1
    assert f"{results / 'CLAIMS.json'} cannot be written" in capsys.readouterr().err
    assert (run_dir / "REPORT.md").stat().st_mtime_ns == before      # the run's own report not rewritten either


def test_the_readme_results_table_says_what_the_published_claims_say():
    """README.md's matrix (a row per claim, a column per workload, the verdict in bold) against
    results/CLAIMS.json: every cell's verdict is the published row's, and every published row has its cell."""
    readme = (ROOT / "README.md").read_text().split("## Results")[1].split("\n## ")[0]
    lines = [line for line in readme.splitlines() if line.startswith("| ")]
    names = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    cells = {}
    for line in lines[1:]:
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        for name, cell in zip(names, row[1:]):
            if cell:
                cells[(row[0].split(" (")[0].split(",")[0], name)] = cell.split("**")[1]
    published = json.loads((ROOT / "results" / "CLAIMS.json").read_text())
    want = {(r["claim"], r["workload"]): r["verdict"] for r in published["claims"]}
    assert cells == want
    assert published["run"] in readme


def test_the_bar_says_which_arm_moved_and_whether_the_trees_match():
    """-12 against -10 (committed H200 records): MiniCPM-o misses the bar; stock moved 334.3 -> 292.2 ms per unit,
    DuplexCadence 97.3 -> 98.5 ms, and the two runs ran different impl/ trees (aae2167, 0d9fe8e)."""
    from suite.report import runs

    root = Path(__file__).resolve().parents[1] / "results"
    ours = json.loads((root / "2026-12-01-h200-reproduce-12" / "minicpmo45.verify" / "run.json").read_text())
    ref = json.loads((root / "2026-12-01-h200-reproduce-10" / "minicpmo45.verify" / "run.json").read_text())
    verdict, reasons = runs.bar(ours, ref, "minicpmo45")
    assert verdict == "not met"
    assert reasons[-1] == ("median per unit, the reference's -> ours: stock 334.3 -> 292.2 ms (-12.6%), "
                           "DuplexCadence 97.3 -> 98.5 ms (+1.3%); impl/ trees aae2167 and 0d9fe8e")
    assert runs.bar(ours, ours, "minicpmo45")[1][-1].endswith("+0.0%); the same impl/ tree")
    older = {**ref, "provenance": {k: v for k, v in ref["provenance"].items() if k != "impl_tree"}}
    assert runs.bar(ours, older, "minicpmo45")[1][-1].endswith("; impl/ tree not recorded in both")


SECOND_RUN = ROOT / "results" / "2026-12-02-h200-reproduce-16-second"


def test_a_floor_record_in_the_run_folder_is_rendered_as_its_timeline_and_memory_tables(tmp_path):
    """The committed second run of impl tree ccc4b7e holds the floor record its sitting made (floor/): its
    figures, typed here from that floor.json, appear in the report's floor section."""
    run = tmp_path / SECOND_RUN.name
    shutil.copytree(SECOND_RUN, run, ignore=shutil.ignore_patterns("*.png", "REPORT.md", "claims.json"))
    (run / "other").mkdir()
    (run / "other" / "floor.json").write_text(json.dumps({"schema": "something/else", "workloads": {}}))
    text = document.write(run).read_text()
    part = text[text.index("## Close to the floor"):text.index("## Sessions per GPU")]
    assert part.count("`floor/floor.json`: commit 01b503630b94, impl/ tree ccc4b7e0c639, NVIDIA H200") == 1
    assert "other/floor.json" not in part
    assert ("| stepaudio2_mini | cadence | 67.74 | 94.10 | 1.389 | 191.62 | 2.829 | eager_op 10.57, python 5.77, "
            "graph_launch 4.68 | 1758 / 10830 |") in part
    assert "| moshi | cadence | 430.8 | 8.0 / 8.0 | 2.0 | 78.0 | 19.7 | 526.8 | 34.0 | 1226.8 | 170.0 |" in part
    assert "| qwen3_omni | stock | 412.0 | 0.0 / 0.0 |" in part
    assert "Steps run eagerly in the measured units: stepaudio2_mini cadence 2, minicpmo45 cadence 2." in part


def test_a_run_without_floor_records_has_no_floor_section_and_a_broken_one_is_named(tmp_path):
    run = tmp_path / SECOND_RUN.name
    shutil.copytree(SECOND_RUN, run, ignore=shutil.ignore_patterns("*.png", "REPORT.md", "claims.json", "floor"))
    assert "## Close to the floor" not in document.write(run).read_text()
    (run / "floor").mkdir()
    (run / "floor" / "floor.json").write_text(json.dumps({"schema": FLOOR_SCHEMA,
                                                          "workloads": {"moshi": {"timeline": {"cadence": {}}}}}))
    with pytest.raises(ValueError, match="wrong shape"):
        document.prepare(run)


def test_a_sitting_without_a_budget_says_so_and_one_with_a_budget_gives_it():
    from suite.report import runs
    sittings = [{"started_utc": "t0", "ended_utc": "t1", "budget_s": None, "git_rev": "abc", "impl_tree": "def"},
                {"started_utc": "t2", "budget_s": 570.0, "git_rev": "abc", "impl_tree": "def"}]
    lines = [x for x in runs.provenance_list({"workloads": {}, "state": {"sittings": sittings}}) if "sitting" in x]
    assert lines[0].startswith("- sitting 1: t0 -> t1, no budget, commit abc") and "—" not in lines[0], lines
    assert lines[1].startswith("- sitting 2: t2 -> unfinished, budget 570") and lines[1].count(" s,") == 1, lines


def test_memory_measured_without_a_peak_says_no_peak_recorded():
    from suite.report import figures
    rec = {"modes": {m: {"memory": {}, "session_stats": {}} for m in ("stock", "cadence")}}
    m = figures.memory_figures({"verify": {"record": rec}})
    assert m["cadence"]["peak"] is None and m["cadence"]["how"] == f"{figures.BOTH_MODES}; no peak recorded", m


def test_a_mode_with_no_measured_unit_shows_no_verdict_of_its_own():
    from suite.report import single
    rec = {"modes": {"stock": {"metrics": {"units_measured": 0}, "memory": {}, "verdict": "VALID"},
                     "cadence": {"metrics": {"units_measured": 31, "tail_ms_p50": 90.0}, "memory": {},
                                 "verdict": "VALID"}}}
    text = single.summary(rec)
    stock, cadence = [line for line in text.splitlines() if line.startswith(("| stock", "| cadence"))]
    assert stock.rstrip(" |").endswith("— (no unit measured)") and "VALID" not in stock
    assert cadence.rstrip(" |").endswith("VALID") and "the mode's own checks" in text


@pytest.mark.parametrize("stages, text, verdict", [
    pytest.param({"duplex_cadence": ("done", [])}, "duplex: every session equal to itself alone", "met", id="done"),
    pytest.param({"duplex_cadence": ("failed", ["partial"])},
                 "duplex: not all compared in duplex_cadence: unfinished", "open", id="unfinished-alone"),
    pytest.param({"duplex_stock": ("done", []), "duplex_cadence": ("failed", ["partial"])},
                 "duplex: every session equal to itself alone (not all compared in duplex_cadence: unfinished)", "met",
                 id="one-of-two-unfinished"),
    pytest.param({"duplex_cadence": ("failed", ["partial", "mismatch"])},
                 "duplex: sessions DIFFER from themselves alone in duplex_cadence", "not met", id="unfinished-differs"),
])
def test_bytes_equal_claims_no_equality_for_a_duplex_stage_that_did_not_finish(stages, text, verdict):
    """A duplex stage cut before its last count's sessions ran alone (a PARTIAL checkpoint) compared not every
    session: the bytes claim says so, and does not call the bytes equal on its account."""
    from suite.report import claims
    entry = {h: {"duplex": {"record": {}}, "state": {"status": st, "invalid_codes": codes}}
             for h, (st, codes) in stages.items()}
    row = claims.bytes_equal("fake", entry)
    assert (row.ours_text, row.verdict) == (text, verdict)


@pytest.mark.parametrize("damage", ["no metrics", "no parameters", "runs not a list", "other schema"])
def test_a_damaged_duplex_record_is_refused_naming_its_file_and_nothing_is_written(tmp_path, capsys, damage):
    from test_duplex import part
    rec = part("cadence")
    run = rec["workloads"]["wl_a"]["modes"]["cadence"]["runs"][0]
    if damage == "no metrics":
        del run["metrics"]
    elif damage == "no parameters":
        del rec["parameters"]
    elif damage == "runs not a list":
        rec["workloads"]["wl_a"]["modes"]["cadence"]["runs"] = 5
    else:
        rec["schema"] = "garbage/9"
    records.write_duplex(tmp_path / "duplex.json", rec)
    (tmp_path / "REPORT.md").write_text("before")
    assert report.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'duplex.json'}: not a duplex record this report can read" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["REPORT.md", "duplex.json"]
    assert (tmp_path / "REPORT.md").read_text() == "before"


def test_a_done_stages_damaged_record_is_refused_not_left_out(tmp_path, capsys):
    """A truncated run.json of a done stage: the report names it and rewrites nothing (it used to drop the
    stage and call its claims 'its stage ran and gave no figure')."""
    run = tmp_path / "run"
    shutil.copytree(REFERENCE, run, ignore=shutil.ignore_patterns("*.png", "*.wav"))
    record = run / "moshi.verify" / "run.json"
    record.write_text(record.read_text()[:100])
    before = (run / "REPORT.md").read_text()
    assert report.main([str(run)]) == 1
    assert f"{record}: stage moshi.verify is done but its record is not a JSON object" in capsys.readouterr().err
    assert (run / "REPORT.md").read_text() == before


@pytest.mark.parametrize("damage, says", [
    ("no modes", "not a run record (IndexError"),
    ("other schema", "schema 'garbage/9', expected 'duplexcadence.run/1' or 'duplexcadence.verify/1'"),
    ("verdict NaN", "verdict nan, expected 'VALID' or 'INVALID'"),
])
def test_a_damaged_run_record_is_refused_naming_it(tmp_path, capsys, damage, says):
    rec = json.loads((REFERENCE / "moshi.memory_stock" / "run.json").read_text())
    if damage == "no modes":
        rec["modes"] = {}
    elif damage == "other schema":
        rec["schema"] = "garbage/9"
    else:
        rec["verdict"] = float("nan")
    (tmp_path / "run.json").write_text(json.dumps(rec))
    assert report.main([str(tmp_path)]) == 1
    assert f"{tmp_path / 'run.json'}: {says}" in capsys.readouterr().err
    assert not (tmp_path / "REPORT.md").exists()


def test_a_truncated_dropin_record_is_refused_not_left_out(tmp_path, capsys):
    folder = ROOT / "results" / "2026-12-01-h200-dropin-1"
    for p in folder.glob("dropin_*.json"):
        shutil.copy(p, tmp_path / p.name)
    first = sorted(tmp_path.glob("dropin_*.json"))[0]
    first.write_text(first.read_text()[:200])
    assert report.main([str(tmp_path)]) == 1
    assert f"{tmp_path}: {first.name}: not a JSON object (truncated or damaged)" in capsys.readouterr().err


def test_a_later_folder_refused_leaves_no_plots_drawn_aside_for_an_earlier_one(tmp_path, monkeypatch, capsys):
    from test_duplex import part
    import tempfile
    aside = tmp_path / "tmp"
    aside.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(aside))
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    records.write_duplex(good / "duplex.json", part("cadence"))
    (bad / "duplex.json").write_text("{")
    assert report.main([str(good), str(bad)]) == 1
    assert list(aside.iterdir()) == [] and sorted(p.name for p in good.iterdir()) == ["duplex.json"]
