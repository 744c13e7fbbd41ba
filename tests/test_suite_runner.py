"""suite.measure (session, env, memory): records, hashes, verdicts, on the fake adapter of
tests/fakes.py (the session protocol). Expected hashes are computed from the fake decoder, independently of
the suite."""
from __future__ import annotations

import hashlib
import sys

import numpy as np
import pytest
import torch

import fakes
from fakes import SAMPLES_PER_TOKEN, fake_wave, workload
from duplexcadence.session import to_pcm16
from suite.measure import env, memory, session
from suite.records import RUN_SCHEMA

RATE = 24000


# --- records ---------------------------------------------------------------------------------------------
RECORD_FIELDS = {"index", "kind", "turn", "final", "t_start_s", "payload", "payload_size", "samples", "tail_ms",
                 "wall_ms", "measured", "sha256_f32", "sha256_pcm16", "std", "clipped_frac", "stats", "info",
                 "kernels", "host"}
COUNTER_FIELDS = {"units", "captures", "replays", "eager_runs", "warmup_runs", "eager_fallbacks", "capture_failures",
                  "graphs", "graph_bytes", "arena_bytes_reserved", "arena_bytes_mapped"}


def test_records_have_all_fields(fake_adapter):
    wl = workload(turns=2, speak_per_turn=4)
    res = session.run_workload(wl, "stock", "cpu", depth="reduced", steps=5, progress=False)
    rec = res.to_dict()
    assert rec["schema"] == RUN_SCHEMA and rec["sample_rate"] == RATE
    units = rec["modes"]["stock"]["units"]
    assert [u["index"] for u in units] == [u.index for u in wl.script.units]
    for u, src in zip(units, wl.script.units):
        assert set(u) == RECORD_FIELDS
        assert (u["kind"], u["turn"], u["final"]) == (src.kind, src.turn, src.final)
        if u["kind"] == "LISTEN":
            assert u["samples"] == 0 and u["tail_ms"] is None and u["sha256_f32"] is None and u["stats"] is None
        else:
            assert u["payload"] == "tokens" and u["payload_size"] == len(src.tokens)
            assert u["samples"] == SAMPLES_PER_TOKEN * len(src.tokens)
            assert u["tail_ms"] >= 0 and u["wall_ms"] >= 0
            assert u["std"] > 0.05 and u["clipped_frac"] == 0.0
            assert set(u["stats"]) == COUNTER_FIELDS          # SessionStats' counters, every unit, no detail
    speak = [u for u in units if u["kind"] == "SPEAK"]
    assert [u["measured"] for u in speak] == [False] * 3 + [True] * 5
    assert res.metrics["units_measured"] == 5 and res.metrics["warmup_units"] == 3
    # cumulative counters: stock runs every step eagerly
    assert [u["stats"]["units"] for u in speak] == list(range(1, 9))
    assert [u["stats"]["eager_runs"] for u in speak] == list(range(1, 9))
    mode = rec["modes"]["stock"]
    assert mode["session_stats"]["detail"] == {"turns": 2} and mode["session_stats"]["units"] == 8
    assert mode["capabilities"] == {"turn_state": "reset", "concurrent": True, "graphs": True, "payload": "tokens",
                                    "max_payload": 25}
    build = fake_adapter.builds[-1]
    assert build["depth"] == "reduced" and build["seed"] == 3 and build["spec"]["n_timesteps"] == 5
    assert build["spec"]["voice_prompt"] == "voice.wav" and build["spec"]["prompt_seconds"] == 6.0


def test_sessions_are_prepared_at_open_and_closed(fake_adapter, monkeypatch):
    """prepare(None) once, before the first unit (what a server captures at voice registration), and
    close() however the run ends."""
    calls = []
    real_new = fake_adapter.new_session

    def new_session(model, mode, spec):
        s = real_new(model, mode, spec)
        real_prepare, real_speak = s.prepare, s.speak
        s.prepare = lambda sigs=None: calls.append(("prepare", sigs)) or real_prepare(sigs)
        s.speak = lambda p, *, final=False: calls.append(("speak", len(p))) or real_speak(p, final=final)
        return s
    monkeypatch.setattr(fake_adapter, "new_session", new_session)
    res = session.run_workload(workload(), "cadence", "cpu", progress=False)
    assert calls[0] == ("prepare", None) and sum(c[0] == "prepare" for c in calls) == 1
    part = res.to_dict()["modes"]["cadence"]
    assert part["prepared"]["counters"]["captures"] == len(fakes.VOICE) and part["prepared"]["ms"] >= 0
    # the steady 25-token units replay what was prepared; a final 10-token unit was not: eager, counted
    speak = [u for u in res.units if u.kind == "SPEAK"]
    assert all(u.stats["captures"] == len(fakes.VOICE) for u in speak)
    assert speak[-1].stats["eager_fallbacks"] == 2 and speak[-1].stats["replays"] == 6
    model = {"open": []}
    monkeypatch.setattr(fake_adapter, "build_model", lambda *a, **k: model.update(
        device=torch.device("cpu"), spec={}, zero_units=set(), cadence_off_units=set()) or model)
    session.run_workload(workload(), "cadence", "cpu", progress=False)
    assert model["open"] == []                            # closed after the run


def test_a_capture_inside_a_timed_unit_makes_the_run_invalid(fake_adapter, clean_tree):
    wl = workload(turns=3, speak_per_turn=11)
    res = session.run_workload(wl, "cadence", "cpu", progress=False)
    assert res.verdict == "VALID" and res.metrics["graph_captures_measured_units"] == 0
    assert res.metrics["eager_fallbacks_measured_units"] == 3          # the three final units (10 tokens)
    wl.spec["inline"] = True                          # this adapter captures inside speak
    res = session.run_workload(wl, "cadence", "cpu", progress=False)
    finals = [u.index for u in res.units if u.final and u.measured]
    assert res.metrics["units_with_capture"] == finals[:1]            # the first measured final unit captures
    assert res.invalid_codes == ["capture_in_timed_unit"]
    assert f"graph capture inside timed unit(s) [{finals[0]}]" in res.invalid_reasons[0]


def test_sha256_matches_hashlib(fake_adapter):
    wl = workload(turns=2, speak_per_turn=3)
    res = session.run_workload(wl, "stock", "cpu", progress=False)
    speak = [u for u in wl.script.units if u.kind == "SPEAK"]
    recs = {r.index: r for r in res.units}
    for u in speak:
        wave = fake_wave(u.tokens)
        want_f32 = hashlib.sha256(wave.astype("<f4").tobytes()).hexdigest()
        want_i16 = hashlib.sha256(to_pcm16(wave).tobytes()).hexdigest()
        assert (recs[u.index].sha256_f32, recs[u.index].sha256_pcm16) == (want_f32, want_i16)
    want = np.concatenate([to_pcm16(fake_wave(u.tokens)) for u in speak])
    assert res.pcm16.tobytes() == want.tobytes()


def test_metrics_from_unit_times(fake_adapter):
    res = session.run_workload(workload(turns=3, speak_per_turn=4), "stock", "cpu", progress=False)
    tail = sorted(r.tail_ms for r in res.units if r.measured)
    audio_s = sum(r.samples for r in res.units if r.measured) / RATE
    assert res.metrics["units_measured"] == len(tail) == 9
    assert res.metrics["tail_ms_p50"] == tail[4]
    assert res.metrics["tail_ms_max"] == tail[-1]
    assert res.metrics["rtf"] == pytest.approx(sum(tail) / 1e3 / audio_s, rel=1e-12)


def test_limits_cut_the_script(fake_adapter):
    wl = workload(turns=3, speak_per_turn=5)
    res = session.run_workload(wl, "stock", "cpu", max_speak_units=6, progress=False)
    assert sum(r.kind == "SPEAK" for r in res.units) == 6
    res = session.run_workload(wl, "stock", "cpu", seconds=9.0, progress=False)
    assert [r.index for r in res.units] == list(range(9))
    with pytest.raises(ValueError, match="max_speak_units"):
        session.run_workload(wl, "stock", "cpu", max_speak_units=0, progress=False)


def test_unknown_mode_raises(fake_adapter):
    with pytest.raises(ValueError, match="mode: expected one of"):
        session.run_workload(workload(), "fast", "cpu", progress=False)


def test_progress_prints_a_line_per_decoded_unit(fake_adapter, capsys):
    session.run_workload(workload(turns=2, speak_per_turn=3), "stock", "cpu", progress=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if "fake stock: unit" in line]
    assert len(lines) == 6 and lines[0].strip().startswith("fake stock: unit 2 SPEAK")


# --- verdicts ----------------------------------------------------------------------------------------------
def test_valid_run(fake_adapter, clean_tree):
    res = session.run_workload(workload(turns=3, speak_per_turn=11), "stock", "cpu", progress=False)
    assert res.metrics["units_measured"] == 30
    assert (res.verdict, res.invalid_reasons) == ("VALID", [])


def test_few_units_is_invalid(fake_adapter, clean_tree):
    res = session.run_workload(workload(turns=2, speak_per_turn=4), "stock", "cpu", progress=False)
    assert res.verdict == "INVALID" and res.invalid_codes == ["few_units"]
    assert "5 measured SPEAK units < 30 (the whole script)" in res.invalid_reasons[0]
    res = session.run_workload(workload(turns=2, speak_per_turn=4), "stock", "cpu", max_speak_units=5, progress=False)
    assert "run limited by --max-speak-units 5" in res.invalid_reasons[0]


def test_degenerate_unit_is_invalid(fake_adapter, clean_tree):
    wl = workload(turns=3, speak_per_turn=11)
    bad = [u.index for u in wl.script.units if u.kind == "SPEAK"][17]
    wl.spec["zero_units"] = [bad]
    res = session.run_workload(wl, "stock", "cpu", progress=False)
    assert next(r for r in res.units if r.index == bad).std == 0.0
    assert res.verdict == "INVALID" and res.invalid_codes == ["degenerate"]
    assert f"degenerate audio at unit {bad}:" in res.invalid_reasons[0]


def test_dirty_tree_is_invalid(fake_adapter, monkeypatch):
    real = env.provenance
    monkeypatch.setattr(env, "provenance", lambda command=None, *, device="cpu": {
        **real(command, device=device), "git_dirty": True, "git_status": [" M impl/x.py"]})
    res = session.run_workload(workload(turns=3, speak_per_turn=11), "stock", "cpu", progress=False)
    assert res.invalid_codes == ["dirty_tree"]


# --- env and memory ------------------------------------------------------------------------------------------
def test_host_op_us_measures_and_rejects_bad_counts():
    assert 0 < env.host_op_us("cpu", ops=200, repeats=3) < 1e5
    for bad in (0, -3, 2.5, "10", None, True, float("nan")):
        with pytest.raises(ValueError, match=r"^ops: expected an int >= 1, got "):
            env.host_op_us("cpu", ops=bad)
        with pytest.raises(ValueError, match=r"^repeats: expected an int >= 1, got "):
            env.host_op_us("cpu", repeats=bad)


def test_host_op_us_uses_the_buffers_it_is_given():
    x, y = torch.full((1,), 2.0), torch.zeros(1)
    assert env.host_op_us("cpu", ops=10, repeats=1, buffers=(x, y), warmup=0) > 0
    assert y.item() == 3.0                               # the probe wrote its given output: nothing allocated
    for bad in (-1, 2.5, "5", None, True):
        with pytest.raises(ValueError, match=r"^warmup: expected an int >= 0, got "):
            env.host_op_us("cpu", ops=10, warmup=bad)


def test_nvml_handle_is_none_without_a_cuda_device():
    assert env.nvml_handle("cpu") == (None, None)


# --- env and memory --------------------------------------------------------------------------
def test_provenance_fields():
    prov = env.provenance(["python", "-m", "x"])
    for key in ("date_utc", "git_rev", "git_dirty", "git_status", "impl_tree", "impl_dirty", "command",
                "python", "torch", "cuda", "packages", "device"):
        assert key in prov, key
    assert prov["command"] == ["python", "-m", "x"]
    assert prov["packages"]["torch"] == torch.__version__
    assert set(prov["packages"]) >= {"minicpmo-utils", "moshi", "transformers", "cuda-bindings",
                                     "cuda-python"}   # a version or "absent"
    assert prov["device"]["cpu_cores"] >= 1
    load = prov["device"]["load_avg"]          # host contention beside a host-bound measurement
    assert load is None or (len(load) == 3 and all(x >= 0 for x in load))
    assert len(prov["impl_tree"]) == 40
    assert prov["capture_gate"] in ("concurrent", "exclusive")


def test_provenance_names_the_capture_gate_mode(monkeypatch):
    from duplexcadence import gate
    monkeypatch.setattr(gate.GATE, "mode", "exclusive")
    assert env.provenance([])["capture_gate"] == "exclusive"
    monkeypatch.setattr(gate.GATE, "mode", "concurrent")
    assert env.provenance([])["capture_gate"] == "concurrent"


def test_dirty_rules():
    assert not env.is_dirty([])
    assert not env.is_dirty(["?? results/2026-11-30-cpu-x/"])      # outputs are not code
    assert env.is_dirty(["?? suite/new.py"])
    assert env.is_dirty([" M impl/duplexcadence/runtime.py"])
    assert env.is_dirty(["M  results/old/run.json"])                # a tracked result edited


def test_deterministic_sets_and_restores():
    before = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with env.deterministic() as flags:
        inside = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
                  torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    after = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    assert inside == (True, False, False, False)
    assert after == before
    assert flags["set"]["cudnn_deterministic"] is True and flags["set"]["cudnn_allow_tf32"] is False


# Resident-set figures depend on what the process did before (freed but still resident memory, the
# high-water mark): each memory-probe check runs in a fresh interpreter.
_PROBE_SEES_ALLOCATION = """
import numpy as np, pytest
from suite.measure import memory
probe = memory.MemoryProbe("cpu")
probe.model_loaded()
probe.begin_session()
block = np.ones(96 * 2**20, dtype=np.uint8)      # 96 MiB, touched
probe.observe()
del block
mem = probe.end_session()
assert all(k.endswith("_mib") or k.endswith("_source") for k in mem)
assert mem["session_rss_mib"] >= 90, mem
with pytest.raises(RuntimeError, match="no session"):
    probe.observe()
"""

_PROBE_DISCOUNTS_LEFTOVER = """
import numpy as np
from suite.measure import memory
probe = memory.MemoryProbe("cpu")
probe.model_loaded()
kept = []
probe.begin_session()
kept.append(np.ones(96 * 2**20, dtype=np.uint8))   # the first session leaves 96 MiB behind
first = probe.end_session()
probe.begin_session()
second = probe.end_session()                        # the second allocates nothing
assert second["leftover_rss_mib"] >= 90, second
assert second["session_rss_mib"] < 30, second
assert second["peak_over_idle_rss_mib"] < first["peak_over_idle_rss_mib"] - 60, (first, second)
"""


def _fresh(code: str, timeout: float = 120) -> None:
    import os
    import subprocess
    path = os.pathsep.join([os.path.dirname(__file__), *sys.path])          # tests/ for fakes
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, PYTHONPATH=path))
    assert out.returncode == 0, out.stderr[-2000:]


def test_cpu_memory_probe_sees_a_session_allocation():
    _fresh(_PROBE_SEES_ALLOCATION)


def test_cpu_memory_probe_discounts_what_an_earlier_session_left():
    _fresh(_PROBE_DISCOUNTS_LEFTOVER)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: allocator and driver-level memory")
def test_cuda_memory_probe_sees_a_session_allocation():
    probe = memory.MemoryProbe("cuda")
    probe.model_loaded()
    probe.begin_session()
    block = torch.ones(256 * 2**20, dtype=torch.uint8, device="cuda")
    probe.observe()
    del block
    mem = probe.end_session()
    assert mem["session_alloc_mib"] >= 256 and mem["session_driver_mib"] >= 250, mem


# Blocks cached by earlier CUDA tests in this process (free space inside segments still partly in use,
# which empty_cache keeps) would serve the fake session's 16 MiB per SPEAK unit with no driver allocation.
_CUDA_RUN_MEASURES_MEMORY = """
import fakes
from suite.measure import session
fakes.register()
res = session.run_workload(fakes.workload(turns=3, speak_per_turn=4), "stock", "cuda", progress=False)
speak = [r for r in res.units if r.kind == "SPEAK"]
assert speak and all(r.tail_ms > 0 and r.kernels is None for r in speak)       # a memory run: no profiler
mem = res.memory
assert mem["driver_source"] in ("nvml", "cuda_mem_get_info"), mem
assert all(r.host is None for r in res.units)
assert mem["session_alloc_mib"] >= 16 * len(speak) and mem["session_driver_mib"] >= 16 * len(speak), mem
assert res.provenance["device"]["gpu_name"] and res.provenance["cuda"] != "none"
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA-event timing, driver memory")
def test_cuda_run_times_and_measures_memory():
    _fresh(_CUDA_RUN_MEASURES_MEMORY, timeout=300)
