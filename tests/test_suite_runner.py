"""suite.runner / suite.env / suite.memory: records, hashes, verdicts, verify, on a tiny fake adapter.

The fake adapter is registered through `duplexcadence.runtime.ADAPTERS` like a real one; its audio is a
seeded function of the unit's tokens, so expected hashes are computed here, independently of the suite.
One integration test runs the real `minicpmo45` workload at reduced depth for a few units.
"""
from __future__ import annotations

import hashlib
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from duplexcadence import errors, runtime, session
from suite import env, memory, runner
from torch_threads import torch_threads  # tests/ is on sys.path under pytest

RATE = 24000
SAMPLES_PER_TOKEN = 960          # 25 tokens -> 1 s @ 24 kHz


# --- the fake model, script and workload ------------------------------------------------------
def fake_wave(tokens: list[int]) -> np.ndarray:
    """The fake decoder: 960 samples per token, N(0, 0.1) seeded by the token ids."""
    rng = np.random.default_rng(sum(tokens) * 7919 + len(tokens))
    return (0.1 * rng.standard_normal(SAMPLES_PER_TOKEN * len(tokens))).astype(np.float32)


def to_pcm16(wave: np.ndarray) -> np.ndarray:
    return (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2")


class FakeSession:
    """Checks the runner's protocol: speak only inside a turn opened by start_turn()."""

    def __init__(self, model, mode):
        self.model, self.mode = model, mode
        self.turn_open = False
        self.turns = self.speaks = 0
        self.held = []                        # on CUDA: 16 MiB of device memory per unit, kept

    def start_turn(self):
        self.turn_open = True
        self.turns += 1

    def speak(self, tokens, final=False):
        model = self.model
        if not self.turn_open:
            raise errors.InputError("speak: no open turn")
        unit = tokens[0]                      # the fake script writes the unit index into its tokens
        wave = fake_wave(list(tokens))
        if unit in self.model["zero_units"]:
            wave = np.zeros_like(wave)
        if self.mode == "cadence" and unit in self.model["cadence_off_units"]:
            wave = wave.copy()
            wave[5] = np.nextafter(wave[5], np.float32(1))   # one ULP: bytes differ
        self.speaks += 1
        if model["device"].type == "cuda":
            self.held.append(torch.ones(4 * 2**20, device=model["device"]))
        if final:
            self.turn_open = False
        return session.UnitOutput(wave, to_pcm16(wave), {"tokens": len(tokens)})

    def stats(self):
        return {"turns": self.turns, "speaks": self.speaks}


def _fake_module(modes=("stock", "cadence")):
    mod = types.ModuleType("fake_suite_adapter")
    mod.SAMPLE_RATE = RATE
    mod.SUPPORTED_MODES = modes
    mod.builds = []

    def build_model(spec, *, device, depth, seed):
        mod.builds.append({"spec": dict(spec), "device": str(device), "depth": depth, "seed": seed})
        return {"device": torch.device(device), "zero_units": set(spec.get("zero_units", ())),
                "cadence_off_units": set(spec.get("cadence_off_units", ()))}

    def new_session(model, mode, spec):
        return FakeSession(model, mode)

    mod.build_model, mod.new_session = build_model, new_session
    return mod


@pytest.fixture
def fake_adapter(monkeypatch):
    mod = _fake_module()
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(runtime.ADAPTERS, "fake", mod.__name__)
    return mod


@pytest.fixture
def clean_tree(monkeypatch):
    """Provenance of a clean checkout (the shared working tree is dirty while others work in it)."""
    real = env.provenance

    def clean(command=None, *, device="cpu"):
        prov = real(command, device=device)
        prov.update(git_dirty=False, git_status=[])
        return prov
    monkeypatch.setattr(env, "provenance", clean)


@dataclass
class FakeUnit:
    index: int
    t_start_s: float
    kind: str
    turn: int
    final: bool
    tokens: list | None = None


@dataclass
class FakeScript:
    units: list

    def select(self, max_speak_units, min_turns=2):
        out, n = [], 0
        for u in self.units:
            if u.kind == "SPEAK":
                if n == max_speak_units:
                    break
                n += 1
            out.append(u)
        return FakeScript(out)


def fake_script(turns: int, speak_per_turn: int, listen_per_turn: int = 2) -> FakeScript:
    """Each turn: LISTEN units, then SPEAK units of 25 tokens (tokens[0] = unit index), the last final
    and 10 tokens long."""
    units, i = [], 0
    for turn in range(turns):
        for _ in range(listen_per_turn):
            units.append(FakeUnit(i, float(i), "LISTEN", turn, False))
            i += 1
        for k in range(speak_per_turn):
            final = k == speak_per_turn - 1
            n = 10 if final else 25
            units.append(FakeUnit(i, float(i), "SPEAK", turn, final, [i] + [(i * 31 + j) % 6561 for j in range(n - 1)]))
            i += 1
    return FakeScript(units)


@dataclass
class FakeWorkload:
    name: str = "fake"
    model: str = "Fake model"
    architecture: str = "fake"
    stock_package: str = "none"
    dtype: str = "float32"
    euler_steps: int | None = 10
    voice_prompt: str = "voice.wav"
    prompt_seconds: float = 6.0
    script: object = None
    token_source: str = "inline"
    seeds: dict = field(default_factory=lambda: {"weights": 3, "tokens": 4})
    spec: dict = field(default_factory=dict)
    notes: str = ""


def workload(turns=2, speak_per_turn=4, **spec) -> FakeWorkload:
    return FakeWorkload(script=fake_script(turns, speak_per_turn), spec=spec)


# --- records ---------------------------------------------------------------------------------
RECORD_FIELDS = {"index", "kind", "turn", "final", "t_start_s", "payload", "payload_size", "samples",
                 "tail_ms", "wall_ms", "measured", "sha256_f32", "sha256_pcm16", "std", "clipped_frac",
                 "stats", "info", "kernels", "host"}


def test_records_have_all_fields(fake_adapter):
    wl = workload(turns=2, speak_per_turn=4)
    res = runner.run_workload(wl, "stock", "cpu", depth="reduced", steps=5, progress=False)
    units = res.to_dict()["modes"]["stock"]["units"]
    assert [u["index"] for u in units] == [u.index for u in wl.script.units]
    for u, src in zip(units, wl.script.units):
        assert set(u) == RECORD_FIELDS
        assert (u["kind"], u["turn"], u["final"]) == (src.kind, src.turn, src.final)
        if u["kind"] == "LISTEN":
            assert u["samples"] == 0 and u["tail_ms"] is None and u["sha256_f32"] is None
        else:
            assert u["payload"] == "tokens" and u["payload_size"] == len(src.tokens)
            assert u["samples"] == SAMPLES_PER_TOKEN * len(src.tokens)
            assert u["tail_ms"] >= 0 and u["wall_ms"] >= 0
            assert u["std"] > 0.05 and u["clipped_frac"] == 0.0
    speak = [u for u in units if u["kind"] == "SPEAK"]
    # warm-up: the first 3 SPEAK units are timed but not measured
    assert [u["measured"] for u in speak] == [False] * 3 + [True] * 5
    assert res.metrics["units_measured"] == 5 and res.metrics["warmup_units"] == 3
    # one start_turn per turn, and the stats after each SPEAK unit are cumulative
    assert [u["stats"] for u in speak][-1] == {"turns": 2, "speaks": 8}
    assert speak[3]["stats"] == {"turns": 1, "speaks": 4} and speak[4]["stats"] == {"turns": 2, "speaks": 5}
    # what the adapter was built from
    build = fake_adapter.builds[-1]
    assert build["depth"] == "reduced" and build["seed"] == 3 and build["spec"]["n_timesteps"] == 5
    assert build["spec"]["voice_prompt"] == "voice.wav" and build["spec"]["prompt_seconds"] == 6.0


def test_sha256_matches_hashlib(fake_adapter):
    wl = workload(turns=2, speak_per_turn=3)
    res = runner.run_workload(wl, "stock", "cpu", progress=False)
    speak = [u for u in wl.script.units if u.kind == "SPEAK"]
    recs = {r.index: r for r in res.units}
    for u in speak:
        wave = fake_wave(u.tokens)
        want_f32 = hashlib.sha256(wave.astype("<f4").tobytes()).hexdigest()
        want_i16 = hashlib.sha256(to_pcm16(wave).tobytes()).hexdigest()
        assert (recs[u.index].sha256_f32, recs[u.index].sha256_pcm16) == (want_f32, want_i16)
    # the session PCM is the units' PCM in script order
    want = np.concatenate([to_pcm16(fake_wave(u.tokens)) for u in speak])
    assert res.pcm16.tobytes() == want.tobytes()


def test_metrics_from_unit_times(fake_adapter):
    res = runner.run_workload(workload(turns=3, speak_per_turn=4), "stock", "cpu", progress=False)
    tail = sorted(r.tail_ms for r in res.units if r.measured)
    audio_s = sum(r.samples for r in res.units if r.measured) / RATE
    assert res.metrics["units_measured"] == len(tail) == 9
    assert res.metrics["tail_ms_p50"] == tail[4]                       # odd count: the middle one
    assert res.metrics["tail_ms_max"] == tail[-1]
    assert res.metrics["rtf"] == pytest.approx(sum(tail) / 1e3 / audio_s, rel=1e-12)


def test_limits_cut_the_script(fake_adapter):
    wl = workload(turns=3, speak_per_turn=5)
    res = runner.run_workload(wl, "stock", "cpu", max_speak_units=6, progress=False)
    assert sum(r.kind == "SPEAK" for r in res.units) == 6
    res = runner.run_workload(wl, "stock", "cpu", seconds=9.0, progress=False)
    assert [r.index for r in res.units] == list(range(9))
    with pytest.raises(ValueError, match="max_speak_units"):
        runner.run_workload(wl, "stock", "cpu", max_speak_units=0, progress=False)


def test_unknown_mode_raises(fake_adapter):
    with pytest.raises(ValueError, match="mode: expected one of"):
        runner.run_workload(workload(), "fast", "cpu", progress=False)


# --- verdicts --------------------------------------------------------------------------------
def test_valid_run(fake_adapter, clean_tree):
    res = runner.run_workload(workload(turns=3, speak_per_turn=11), "stock", "cpu", progress=False)
    assert res.metrics["units_measured"] == 30
    assert (res.verdict, res.invalid_reasons) == ("VALID", [])


def test_few_units_is_invalid(fake_adapter, clean_tree):
    res = runner.run_workload(workload(turns=2, speak_per_turn=4), "stock", "cpu", progress=False)
    assert res.verdict == "INVALID" and res.invalid_codes == ["few_units"]
    assert "5 measured SPEAK units < 30 (the whole script)" in res.invalid_reasons[0]
    res = runner.run_workload(workload(turns=2, speak_per_turn=4), "stock", "cpu", max_speak_units=5,
                              progress=False)
    assert "run limited by --max-speak-units 5" in res.invalid_reasons[0]


def test_degenerate_unit_is_invalid(fake_adapter, clean_tree):
    wl = workload(turns=3, speak_per_turn=11)
    bad = [u.index for u in wl.script.units if u.kind == "SPEAK"][17]
    wl.spec["zero_units"] = [bad]
    res = runner.run_workload(wl, "stock", "cpu", progress=False)
    rec = next(r for r in res.units if r.index == bad)
    assert rec.std == 0.0
    assert res.verdict == "INVALID" and res.invalid_codes == ["degenerate"]
    assert f"degenerate audio at unit {bad}:" in res.invalid_reasons[0]


def test_dirty_tree_is_invalid(fake_adapter, monkeypatch):
    real = env.provenance
    monkeypatch.setattr(env, "provenance", lambda command=None, *, device="cpu": {
        **real(command, device=device), "git_dirty": True, "git_status": [" M impl/x.py"]})
    res = runner.run_workload(workload(turns=3, speak_per_turn=11), "stock", "cpu", progress=False)
    assert res.invalid_codes == ["dirty_tree"]


# --- verify ----------------------------------------------------------------------------------
def test_verify_equal(fake_adapter, clean_tree):
    res = runner.verify(workload(turns=3, speak_per_turn=11), "cpu", progress=False)
    assert len(fake_adapter.builds) == 1                 # one model instance for both modes
    assert [c["equal"] for c in res.comparison] == [True] * 33
    assert res.mismatches == [] and res.verdict == "VALID"
    s, c = res.stock.metrics["tail_ms_p50"], res.cadence.metrics["tail_ms_p50"]
    assert res.speedup_x == s / c


def test_verify_flags_mismatching_unit(fake_adapter):
    wl = workload(turns=2, speak_per_turn=4)
    speak = [u.index for u in wl.script.units if u.kind == "SPEAK"]
    wl.spec["cadence_off_units"] = [speak[5]]
    res = runner.verify(wl, "cpu", progress=False)
    assert res.mismatches == [speak[5]]
    row = next(c for c in res.comparison if c["index"] == speak[5])
    assert row["detail"].startswith(f"fake: unit {speak[5]}: float32 waveform differs: first differing sample 5")
    assert all(c["equal"] for c in res.comparison if c["index"] != speak[5])
    assert res.verdict == "INVALID" and "mismatch" in res.invalid_codes
    assert any(r.startswith(f"sha256 mismatch at unit {speak[5]}:") for r in res.invalid_reasons)
    rec = res.to_dict()
    assert rec["comparison"]["mismatched_units"] == [speak[5]]


def test_verify_stock_only_without_cadence(monkeypatch, clean_tree):
    mod = _fake_module(modes=("stock",))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(runtime.ADAPTERS, "fake", mod.__name__)
    res = runner.verify(workload(), "cpu", progress=False)
    assert res.cadence is None and res.comparison == [] and res.speedup_x is None
    assert list(res.to_dict()["modes"]) == ["stock"]
    assert "cadence mode not available" in res.notes[0]


def test_verify_stock_only_when_cadence_not_implemented(monkeypatch, clean_tree):
    mod = _fake_module()

    def new_session(model, mode, spec):
        if mode == "cadence":
            raise NotImplementedError("arena views not written yet")
        return FakeSession(model, mode)
    mod.new_session = new_session
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(runtime.ADAPTERS, "fake", mod.__name__)
    res = runner.verify(workload(), "cpu", progress=False)
    assert res.cadence is None and "arena views not written yet" in res.notes[0]


def test_verify_timing_rounds_alternate_order_and_take_the_median(fake_adapter, clean_tree, monkeypatch):
    opened = []
    real_new = fake_adapter.new_session

    def new_session(model, mode, spec):
        opened.append(mode)
        return real_new(model, mode, spec)
    monkeypatch.setattr(fake_adapter, "new_session", new_session)
    res = runner.verify(workload(turns=3, speak_per_turn=11), "cpu", progress=False, rounds=3)
    assert len(fake_adapter.builds) == 1                 # every round on the one model instance
    assert opened == ["stock", "cadence", "cadence", "stock", "stock", "cadence"]
    assert [r["round"] for r in res.rounds] == [1, 2, 3]
    assert [r["order"] for r in res.rounds] == [["stock", "cadence"], ["cadence", "stock"], ["stock", "cadence"]]
    assert all(r["units_compared"] == 33 and r["mismatched_units"] == [] for r in res.rounds)
    xs = [r["stock_tail_ms_p50"] / r["cadence_tail_ms_p50"] for r in res.rounds]
    assert res.speedup_x == pytest.approx(float(np.median(xs)))
    assert res.rounds[0]["stock_tail_ms_p50"] == res.stock.metrics["tail_ms_p50"]
    assert all(r["host_us_per_op"]["before"] > 0 and r["host_us_per_op"]["after"] > 0 for r in res.rounds)
    for r in res.rounds:                                 # per-unit host samples, p50 per mode (no GPU clock on CPU)
        for mode in ("stock", "cadence"):
            h = r["unit_host_p50"][mode]
            assert h["host_op_us_p50"] > 0 and h["cpu_loop_us_p50"] > 0 and "sm_mhz_p50" not in h, (r, mode)
    assert res.rounds[0]["unit_host_p50"]["stock"]["host_op_us_p50"] == res.stock.metrics["host_op_us_p50"]
    speak = [u for u in res.cadence.units if u.kind == "SPEAK"]
    assert all(u.host and u.host["sm_mhz"] is None for u in speak)
    assert all(u.host is None for u in res.cadence.units if u.kind != "SPEAK")
    rec = res.to_dict()
    assert rec["comparison"]["rounds"] == res.rounds and rec["parameters"]["timing_rounds"] == 3
    assert res.verdict == "VALID"


def test_verify_round_two_mismatch_makes_the_record_invalid(fake_adapter, clean_tree, monkeypatch):
    """A cadence session that differs only when it is not the first one (state left behind by an earlier
    session) is caught by the later rounds, with the round in the reason."""
    wl = workload(turns=2, speak_per_turn=16)
    speak = [u.index for u in wl.script.units if u.kind == "SPEAK"]
    cadence_sessions = []
    real_new = fake_adapter.new_session

    def new_session(model, mode, spec):
        if mode == "cadence":
            cadence_sessions.append(1)
            model["cadence_off_units"] = {speak[7]} if len(cadence_sessions) == 2 else set()
        return real_new(model, mode, spec)
    monkeypatch.setattr(fake_adapter, "new_session", new_session)
    res = runner.verify(wl, "cpu", progress=False, rounds=2)
    assert res.mismatches == []                          # round 1 equal
    assert res.rounds[1]["mismatched_units"] == [speak[7]]
    assert res.verdict == "INVALID" and res.invalid_codes.count("mismatch") == 1
    i = res.invalid_codes.index("mismatch")
    assert res.invalid_reasons[i].startswith(f"round 2: sha256 mismatch at unit {speak[7]}: fake: unit")


def test_verify_times_no_unit_under_the_profiler(fake_adapter, clean_tree, monkeypatch):
    """Every timed session runs with profile_units=0 (kineto leaves CUPTI attached after profiling, which
    slows later launches); the profile pass exists on CUDA only and comes after the timing rounds."""
    calls = []
    real = runner.run_session

    def spy(adapter, model, mode, spec, units, device, **kw):
        calls.append((mode, kw.get("profile_units")))
        return real(adapter, model, mode, spec, units, device, **kw)
    monkeypatch.setattr(runner, "run_session", spy)
    res = runner.verify(workload(turns=3, speak_per_turn=11), "cpu", progress=False, rounds=2)
    assert calls == [("stock", 0), ("cadence", 0), ("cadence", 0), ("stock", 0)]
    assert res.profile_pass is None and res.to_dict()["comparison"]["profile_pass"] is None


def test_attach_kernels_puts_profile_records_on_the_timed_units(fake_adapter, clean_tree):
    run = runner.run_workload(workload(turns=3, speak_per_turn=11), "cadence", "cpu", progress=False)
    speak = [u for u in run.units if u.kind == "SPEAK"]
    p50 = run.metrics["tail_ms_p50"]
    last = {u.index: {"kernel_launches": 7, "graph_launches": 2, "kernels": 40 + i, "kernel_busy_ms": 0.5,
                      "gpu_busy_ms": 0.6, "wall_ms": 99.0} for i, u in enumerate(speak[-3:])}
    runner.attach_kernels(run, last)
    assert [u.kernels for u in speak[-3:]] == list(last.values())
    assert all(u.kernels is None for u in speak[:-3])
    m = run.metrics
    assert m["units_profiled"] == 3 and m["kernels_per_unit_p50"] == 41 and m["tail_ms_p50"] == p50
    assert m["tail_over_kernel_busy_x"] == pytest.approx(p50 / 0.5)
    assert m["units_measured"] == sum(u.measured for u in speak)       # the timing is round 1's own


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the profile pass runs on CUDA only")
def test_cuda_verify_profiles_after_the_timing(fake_adapter, clean_tree):
    res = runner.verify(workload(turns=3, speak_per_turn=11), "cuda", progress=False, rounds=2)
    pp = res.profile_pass
    assert pp["units_compared"] == 33 and pp["mismatched_units"] == []
    assert len(pp["profiled_units"]["stock"]) == runner.PROFILED_SPEAK_UNITS
    prof = [u for u in res.cadence.units if u.kernels]
    assert [u.index for u in prof] == pp["profiled_units"]["cadence"] and all(u.measured for u in prof)
    timed = [u for run in (res.stock, res.cadence) for u in run.units if u.kind == "SPEAK"]
    assert all(u.host["op_us"] > 0 for u in timed)     # per-unit samples; the SM clock where NVML answers
    if env.nvml_handle("cuda")[1] is not None:
        assert all(isinstance(u.host["sm_mhz"], int) and u.host["sm_mhz"] > 0 for u in timed)
        assert all(r["unit_host_p50"][m]["sm_mhz_p50"] > 0 for r in res.rounds for m in ("stock", "cadence"))


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True, None])
def test_verify_rejects_bad_rounds_before_building(fake_adapter, bad):
    with pytest.raises(ValueError, match=r"rounds: expected an int >= 1, got"):
        runner.verify(workload(), "cpu", progress=False, rounds=bad)
    assert fake_adapter.builds == []


def test_verify_rounds_without_cadence_say_so(monkeypatch, clean_tree):
    mod = _fake_module(modes=("stock",))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(runtime.ADAPTERS, "fake", mod.__name__)
    res = runner.verify(workload(), "cpu", progress=False, rounds=3)
    assert res.rounds == [] and any("timing rounds: 3 asked, 1 run" in n for n in res.notes)


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


def test_memory_runs_take_no_host_samples_and_verify_does(fake_adapter, clean_tree):
    res = runner.run_workload(workload(), "stock", "cpu", progress=False)
    assert all(u.host is None for u in res.units) and "host_op_us_p50" not in res.metrics
    ver = runner.verify(workload(), "cpu", progress=False)
    timed = [u for u in ver.stock.units if u.kind == "SPEAK"]
    assert timed and all(u.host and u.host["op_us"] > 0 for u in timed)


def test_cpu_loop_us_measures_and_rejects_bad_counts():
    assert 0 < env.cpu_loop_us(iters=500, repeats=3) < 1e6
    for bad in (0, -3, 0.5, "10", None, True, float("inf")):
        with pytest.raises(ValueError, match=r"^iters: expected an int >= 1, got "):
            env.cpu_loop_us(iters=bad)
        with pytest.raises(ValueError, match=r"^repeats: expected an int >= 1, got "):
            env.cpu_loop_us(repeats=bad)


def test_unit_host_sampler_reads_the_sm_clock_through_nvml(monkeypatch):
    assert env.nvml_handle("cpu") == (None, None)
    cpu = env.UnitHostSampler("cpu")()
    assert cpu["sm_mhz"] is None and cpu["op_us"] > 0 and cpu["cpu_loop_us"] > 0

    class FakeNVML:
        NVML_CLOCK_SM = 1
        mhz = 1410

        def nvmlDeviceGetClockInfo(self, handle, clock):
            assert handle == "h0" and clock == self.NVML_CLOCK_SM
            if self.mhz is None:
                raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
            return self.mhz
    nvml = FakeNVML()
    monkeypatch.setattr(env, "nvml_handle", lambda device: (nvml, "h0"))
    sampler = env.UnitHostSampler("cpu")
    assert sampler()["sm_mhz"] == 1410
    nvml.mhz = None                                   # an NVML error mid-run: "unknown", not a crash
    assert sampler()["sm_mhz"] is None


def test_host_p50_takes_each_sample_s_median_over_the_units_that_have_it():
    def rec(i, host):
        return runner.UnitRecord(index=i, kind="SPEAK", turn=0, final=False, t_start_s=float(i),
                                 payload="tokens", payload_size=1, host=host)
    units = [rec(0, {"op_us": 7.0, "cpu_loop_us": 50.0, "sm_mhz": 1980}),
             rec(1, {"op_us": 10.0, "cpu_loop_us": 70.0, "sm_mhz": None}),
             rec(2, {"op_us": 11.0, "cpu_loop_us": 60.0, "sm_mhz": 1410}),
             rec(3, None)]
    assert runner.host_p50(units) == {"host_op_us_p50": 10.0, "cpu_loop_us_p50": 60.0, "sm_mhz_p50": 1695.0}
    assert runner.host_p50([rec(0, None)]) == {}


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
from suite import memory
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
from suite import memory
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


def _fresh(code: str) -> None:
    import subprocess
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
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


# --- the real workload -----------------------------------------------------------------------
def _real_workload():
    try:
        import workloads
        wl = workloads.get("minicpmo45")
    except Exception as exc:  # noqa: BLE001 - the reason goes into the skip message
        pytest.skip(f"workloads.get('minicpmo45') unavailable: {exc!r}")
    adapter = runtime.adapter(wl.architecture)
    if not callable(getattr(adapter, "build_model", None)):
        pytest.skip(f"{adapter.__name__} has no build_model yet")
    return wl


@pytest.fixture
def two_threads():
    with torch_threads(2):      # the count before is back after the test
        yield


def test_minicpmo45_reduced_runs_through_the_adapter(monkeypatch, two_threads):
    monkeypatch.setattr(torch._dynamo.config, "disable", True)   # TORCHDYNAMO_DISABLE=1, after import
    wl = _real_workload()
    res = runner.verify(wl, "cpu", depth="reduced", max_speak_units=4, steps=5, progress=False)
    speak = [r for r in res.stock.units if r.kind == "SPEAK"]
    assert len(speak) == 4 and len({r.turn for r in speak}) >= 2
    assert all(r.samples > 0 and r.std >= runner.STD_MIN for r in speak)
    assert res.stock.pcm16.size == sum(r.samples for r in speak)
    if res.cadence is not None:
        assert res.mismatches == [], res.comparison


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA-event timing, driver memory")
def test_cuda_run_times_and_measures_memory(fake_adapter):
    res = runner.run_workload(workload(turns=3, speak_per_turn=4), "stock", "cuda", progress=False)
    speak = [r for r in res.units if r.kind == "SPEAK"]
    n = len(speak)
    prof = speak[-runner.PROFILED_SPEAK_UNITS:]         # the last units run under the profiler, untimed
    assert all(r.kernels and r.kernels["kernels"] > 0 and r.tail_ms is None for r in prof)
    assert all(r.tail_ms > 0 for r in speak[:-runner.PROFILED_SPEAK_UNITS])
    assert [r.measured for r in speak] == [False] * runner.WARMUP_SPEAK_UNITS + [True] * (
        n - runner.WARMUP_SPEAK_UNITS - runner.PROFILED_SPEAK_UNITS) + [False] * runner.PROFILED_SPEAK_UNITS
    mem = res.memory
    assert mem["driver_source"] in ("nvml", "cuda_mem_get_info")
    assert all(r.host is None for r in res.units)      # no per-unit host samples in a memory run
    assert mem["session_alloc_mib"] >= 16 * n and mem["session_driver_mib"] >= 16 * n, mem
    assert res.provenance["device"]["gpu_name"] and res.provenance["cuda"] != "none"
