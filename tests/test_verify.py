"""suite.measure.verify and verify_process: the paired verify over several processes on the fake adapter of
tests/fakes.py (its audio a seeded function of the tokens; its clocks one signature per unit, prepare(None)
the steady 25-token units, so a final 10-token unit is a first occurrence). The processes run inline here,
and once as real processes through tests/fake_stage.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fakes
from fakes import workload
from suite.measure import session, verify
from suite.records import VERIFY_SCHEMA
from suite.records.paired import Protocol, Summary, unpack_pairs

ROOT = Path(__file__).resolve().parents[1]


def run(wl, **protocol):
    return verify.verify(wl, "cpu", protocol=Protocol(**protocol), launch="inline", progress=False).to_dict()


def rows(rec, which="ab"):
    return [r for r in unpack_pairs(rec["paired"]["pairs"]) if r["run"] == which]


def speak_indices(wl):
    return [u.index for u in wl.script.units if u.kind == "SPEAK"]


def test_a_verify_pairs_stock_and_cadence_in_each_of_three_processes(fake_adapter, clean_tree):
    wl = workload(turns=3, speak_per_turn=12)                  # 36 SPEAK units, 6 LISTEN units without payload
    rec = run(wl, processes=3)
    assert rec["schema"] == VERIFY_SCHEMA and rec["verdict"] == "VALID", rec["invalid_reasons"]
    assert len(fake_adapter.builds) == 3                       # one model per process
    ab = rows(rec)
    assert [r["process"] for r in ab] == [1] * 36 + [2] * 36 + [3] * 36
    assert all(r["equal"] for r in ab)
    for i in (1, 2, 3):
        mine = [r for r in ab if r["process"] == i]
        assert [r["index"] for r in mine] == speak_indices(wl)
        assert [r["measured"] for r in mine] == [False] * 4 + [True] * 32      # 4 warm-up pairs
        assert [r["order"] for r in mine[:4]] == ["ab", "ba", "ab", "ba"]
    sp = Summary.from_dict(rec["paired"]["speedup"])
    assert sp.processes == 3 and sp.pairs == 96 and not sp.flags
    assert sp.speedup == pytest.approx(rec["comparison"]["speedup_x"])
    aa = rows(rec, "aa")
    assert len(aa) == 3 * 10 and sum(r["measured"] for r in aa) == 3 * 7
    floor = Summary.from_dict(rec["paired"]["floor"])
    assert floor.pairs == 21 and isinstance(rec["paired"]["clears_floor"], bool)
    assert rec["comparison"]["units_compared"] == 108 and rec["comparison"]["mismatched_units"] == []
    # process 1's first walk per mode, for the per-unit table and tools/same_bytes.py
    units = rec["modes"]["cadence"]["units"]
    assert [u["index"] for u in units] == speak_indices(wl)
    assert all(u["sha256_f32"] == r["sha256_b"][0] for u, r in zip(units, ab))
    assert rec["modes"]["stock"]["metrics"]["units_measured"] == 96
    assert rec["parameters"]["processes"] == 3 and rec["parameters"]["launch"] == "inline"


def test_the_arms_alternate_a_b_b_a_and_the_aa_run_comes_first(fake_adapter, clean_tree, monkeypatch):
    log = []
    real_new = fake_adapter.new_session

    def new_session(model, mode, spec):
        s = real_new(model, mode, spec)
        name = f"{mode}{sum(1 for m in log if m[0] == 'open' and m[1].startswith(mode))}"
        log.append(("open", name))
        real_speak = s.speak
        s.speak = lambda p, *, final=False: log.append(("speak", name)) or real_speak(p, final=final)
        return s
    monkeypatch.setattr(fake_adapter, "new_session", new_session)
    run(workload(turns=2, speak_per_turn=6), processes=1, aa_speak_units=4, prime_speak_units=2)
    opened = [n for k, n in log if k == "open"]
    assert opened == ["stock0", "cadence0", "stock1", "stock2", "stock3"]   # prime, B, A/A x2, A
    spoken = [n for k, n in log if k == "speak"]
    assert spoken[:2] == ["stock0", "stock0"]                               # priming: 2 SPEAK units
    assert spoken[2:10] == ["stock1", "stock2", "stock2", "stock1"] * 2     # A/A: A B B A
    assert spoken[10:14] == ["stock3", "cadence0", "cadence0", "stock3"]    # A/B: A B B A
    assert len(spoken) == 2 + 8 + 24


def test_a_first_occurrence_runs_eagerly_and_is_captured_after_its_timed_call(fake_adapter, clean_tree):
    wl = workload(turns=3, speak_per_turn=12)
    rec = run(wl, processes=3)
    finals = [u.index for u in wl.script.units if u.final]
    for i in (1, 2, 3):
        mine = [r for r in rows(rec) if r["process"] == i]
        eager = [r["index"] for r in mine if r["b_eager"]]
        assert eager == finals[:1]            # the first final unit (10 tokens); the others replay its graph
        assert [r["index"] for r in mine if r["b_captured"]] == finals[:1]
        assert not any(r["a_captures"] or r["b_captures"] for r in mine)
    m = rec["modes"]["cadence"]["metrics"]
    assert m["eager_first_occurrences"] == 3 and m["captures_after_units"] == 3 and m["captures_in_timed_units"] == 0
    assert [p["cadence_eager_first"] for p in rec["paired"]["processes"]] == [1, 1, 1]
    assert rec["verdict"] == "VALID"


def test_a_capture_inside_a_timed_unit_is_invalid(fake_adapter, clean_tree):
    rec = run(workload(turns=3, speak_per_turn=12, inline=True), processes=3)
    assert rec["verdict"] == "INVALID" and set(rec["invalid_codes"]) == {"capture_in_timed_unit"}
    assert "A/B process 1 pass 0 unit" in rec["invalid_reasons"][0]


def test_a_differing_unit_makes_the_record_invalid_and_names_where(fake_adapter, clean_tree):
    wl = workload(turns=3, speak_per_turn=12)
    bad = speak_indices(wl)[9]
    wl.spec["cadence_off_units"] = [bad]
    rec = run(wl, processes=3)
    assert rec["verdict"] == "INVALID" and rec["invalid_codes"] == ["mismatch"] * 3
    assert rec["invalid_reasons"][1] == f"process 2 pass 0 unit {bad}: stock and cadence bytes differ"
    assert rec["comparison"]["mismatched_units"] == [bad]
    assert [m["process"] for m in rec["comparison"]["mismatches"]] == [1, 2, 3]
    assert verify.summary_text(rec).splitlines()[0].startswith("bytes: 105/108 units byte-identical")


def test_the_second_aa_session_runs_on_a_copy_where_the_adapter_refuses_it(fake_adapter, clean_tree):
    rec = run(workload(turns=3, speak_per_turn=12, exclusive=True), processes=3)
    assert [p["aa_copy"] for p in rec["paired"]["processes"]] == [True] * 3
    assert all(r["equal"] for r in rows(rec, "aa")) and rec["verdict"] == "VALID"
    rec = run(workload(turns=3, speak_per_turn=12), processes=3)
    assert [p["aa_copy"] for p in rec["paired"]["processes"]] == [False] * 3


def test_passes_walk_the_script_again_and_start_its_turns_again(fake_adapter, clean_tree):
    wl = workload(turns=2, speak_per_turn=20, session="carried")
    rec = run(wl, processes=3, passes=2)                     # two passes: the first is the warm-up
    mine = [r for r in rows(rec) if r["process"] == 1]
    assert [r["walk"] for r in mine] == [0] * 40 + [1] * 40
    assert [r["measured"] for r in mine] == [False] * 40 + [True] * 40       # a warm-up pass, then measured
    assert rec["modes"]["stock"]["session_stats"]["detail"] == {"turns": 4}
    # carried caches: the second walk's units meet longer histories, so they differ from the first walk's
    assert rec["modes"]["stock"]["metrics"]["units_measured"] == 120 and rec["verdict"] == "VALID"
    assert len(rec["modes"]["cadence"]["units"]) == 40                      # process 1's first walk


def test_too_few_pairs_per_process_is_invalid_and_on_cuda_too_few_processes(fake_adapter, clean_tree):
    rec = run(workload(turns=2, speak_per_turn=6), processes=1)
    assert rec["invalid_codes"] == ["few_units"]
    assert rec["invalid_reasons"] == ["process 1: 8 measured pairs < 30 (the whole script)"]
    assert "few_processes" not in rec["invalid_codes"]                     # a CPU run makes no speed claim


def test_no_cadence_mode_is_unavailable(monkeypatch, clean_tree):
    fakes.register(monkeypatch, modes=("stock",))
    with pytest.raises(session.ModeUnavailable, match="no cadence mode"):
        run(workload(), processes=1)


def test_summary_leads_with_the_bytes_and_says_a_cpu_run_is_no_speed_figure(fake_adapter, clean_tree):
    lines = verify.summary_text(run(workload(turns=3, speak_per_turn=12), processes=3)).splitlines()
    assert lines[0] == ("bytes: 108/108 units byte-identical, stock vs cadence (float32 waveform and int16 PCM); "
                        "A/A stock vs stock 30/30")
    assert lines[1].startswith("speed: not measured: a CPU run checks the pipeline and the bytes")
    assert any(line.startswith("speedup (median stock / cadence per pair): ") for line in lines)
    assert any(line.startswith("A/A floor (stock / stock): ") for line in lines)
    rows = [line.split() for line in lines if line.startswith(("stock ", "cadence "))]
    assert any("mode's own checks" in line for line in lines) and rows and all(r[-1] == "pass" for r in rows), lines
    none = verify.summary_text({"device": "cpu", "verdict": "INVALID",
                                "modes": {"stock": {"metrics": {"units_measured": 0}, "verdict": "VALID"}}})
    assert [line for line in none.splitlines() if line.startswith("stock ")][0].endswith("- (no unit measured)")


@pytest.mark.parametrize("bad", [{"processes": 0}, {"passes": 0}, {"warmup_pairs": -1}, {"aa_speak_units": 1.5},
                                 {"block": True}])
def test_a_bad_protocol_is_a_clear_error(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"{name}: expected an int >= "):
        Protocol(**bad)


def test_the_stage_runs_three_fresh_processes(tmp_path):
    """Through real processes (tests/fake_stage.py registers the fake adapter in each): three children with
    their own pids, set up at once, timed one after another, pooled into one run.json."""
    env_ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "impl"), str(ROOT), str(ROOT / "tests")])}
    out = tmp_path / "stage"
    proc = subprocess.run([sys.executable, "-m", "fake_stage", "verify", "--workload", "fake", "--device", "cpu",
                           "--out", str(out), "--processes", "3", "--aa-units", "4", "--prime-units", "1", "--quiet"],
                          cwd=ROOT, env=env_, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads((out / "run.json").read_text())
    procs = rec["paired"]["processes"]
    assert [p["index"] for p in procs] == [1, 2, 3] and len({p["pid"] for p in procs}) == 3
    assert rec["parameters"]["launch"] == "processes" and rec["comparison"]["units_compared"] == 24
    # every set-up ended before the first timed part began; the timed parts one after another
    assert max(p["started_utc"] for p in procs) < min(p["timed_utc"] for p in procs)
    assert all(procs[i]["ended_utc"] <= procs[i + 1]["timed_utc"] for i in range(2))
    assert (out / "audio_stock.wav").is_file() and (out / "audio_cadence.wav").is_file()
    assert "verify: process 3 of 3: timed part" in proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the profiled tail runs on CUDA only")
def test_cuda_verify_profiles_the_last_process_s_last_units_after_its_timing(fake_adapter, clean_tree):
    wl = workload(turns=3, speak_per_turn=14)
    rec = verify.verify(wl, "cuda", protocol=Protocol(processes=3), launch="inline", progress=False).to_dict()
    ab = rows(rec)
    profiled = [r for r in ab if r["profiled"]]
    assert [r["process"] for r in profiled] == [3] * 5 and [r["index"] for r in profiled] == speak_indices(wl)[-5:]
    assert all(r["a_kernels"] and r["b_kernels"] and not r["measured"] for r in profiled)
    m = rec["modes"]["stock"]["metrics"]
    assert m["units_profiled"] == 5 and m["kernel_launches_per_unit_p50"] >= 0
    assert [sum(r["measured"] for r in ab if r["process"] == i) for i in (1, 2, 3)] == [38, 38, 33]
    assert all(r["probe_before"] > 0 for r in ab)
    assert rec["verdict"] == "VALID", rec["invalid_reasons"]
