"""MiniCPM-o 4.5 tail: DuplexCadence vs stock on the CPU (eager cadence path: arena views, schedule,
in-place trims). The CI gate: any differing byte on any unit fails, naming the unit and what differs."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from torch_threads import torch_threads  # noqa: E402  (tests/ is on sys.path under pytest)
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.bounded_vocoder_cadence import ArenaVocoder  # noqa: E402
from duplexcadence.adapters.flow_hift_cadence import CadenceSession  # noqa: E402
from duplexcadence.clocks import ClockError  # noqa: E402
from duplexcadence.errors import InputError  # noqa: E402
from duplexcadence.runtime import compare_units  # noqa: E402

VOICE = Path(__file__).resolve().parents[1] / "workloads" / "data" / "voice_prompts" / "ljspeech_LJ001-0001_24k.wav"
STEPS = 2

# 44 units over five turns: every final flush size 3..7 and short units at turn start (schedule test).
TURNS = [[14] + [25] * 20 + [2], [9, 25] + [25] * 17 + [0], [25, 4], [25, 3], [25, 25, 1]]
# Every kind of flow signature with the real vocoder: first, ramp, steady, short, each flush size 3..7.
SHAPE_TURNS = [[14, 25, 25, 25, 0], [25, 1], [9, 2], [25, 3], [25, 4]]


def tokens_for(unit: int, n: int) -> list[int]:
    return torch.randint(0, fh.VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(1000 + unit)).tolist()


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    with torch_threads(2):      # this module's tests at 2 intra-op threads; the count before is back after
        yield


@pytest.fixture(scope="module")
def model():
    return fh.build_model({"n_timesteps": STEPS, "voice_prompt": str(VOICE), "prompt_seconds": 2.0},
                          depth="reduced", seed=0)


def stock_layout(session) -> dict:
    c = session.caches
    return {"conformer_att": c["conformer_att_cache"], "estimator_att": c["estimator_att_cache"][:STEPS],
            "estimator_cnn": c["estimator_cnn_cache"][:STEPS], "conformer_cnn": c["conformer_cnn_cache"]}


def _mel_only(mel, last_chunk):
    """Stand-in vocoder for the schedule test: returns the flow's mel as the 'waveform', so the check
    compares the flow's output bytes while skipping the (CPU-expensive) vocoder."""
    return mel.float().reshape(1, -1).clone()


def test_schedule_and_arena_bytes_match_stock_every_unit(model):
    """44 units over five turns with every final-flush size: each region's length equals the schedule's
    (computed from the clocks alone), its bytes in the arena's logical layout equal stock's, and every
    call's mel is byte-identical. No region ever moves. (Vocoder stubbed: see the next test.)"""
    with mock.patch.object(model.t2w, "_stream_vocode", side_effect=_mel_only), \
            mock.patch.object(ArenaVocoder, "stream_vocode", lambda self, mel, last: _mel_only(mel, last)):
        _schedule_check(model)


def test_every_signature_kind_is_bit_exact_with_the_real_vocoder(model):
    stock, cad = fh.new_session(model, "stock"), fh.new_session(model, "cadence")
    unit = 0
    for turn in SHAPE_TURNS:
        stock.start_turn()
        cad.start_turn()
        for i, n in enumerate(turn):
            toks = tokens_for(unit, n)
            a = stock.speak(toks, final=i == len(turn) - 1)
            b = cad.speak(toks, final=i == len(turn) - 1)
            compare_units("minicpmo45-reduced", unit, a, b)
            assert a.samples > 0 and a.waveform.std() > 1e-4
            unit += 1


def _schedule_check(model):
    stock, cad = fh.new_session(model, "stock"), fh.new_session(model, "cadence")
    ptrs = {name: r.data_ptr() for name, r in cad.arena.regions.items()}
    P = model.prompt.mel_frames
    unit = 0
    for turn in TURNS:
        stock.start_turn()
        cad.start_turn()
        buf = [fh.SILENCE_TOKEN] * 3
        calls = []
        for i, n in enumerate(turn):
            c, buf = fh.plan_calls(buf, tokens_for(unit, n), i == len(turn) - 1)
            calls += c
        steps = iter(fh.turn_schedule(P, calls))
        for i, n in enumerate(turn):
            final = i == len(turn) - 1
            toks = tokens_for(unit, n)
            a = stock.speak(toks, final=final)
            b = cad.speak(toks, final=final)
            compare_units("minicpmo45-reduced", unit, a, b)
            for _ in a.info["calls"]:
                step = next(steps)
            if a.info["calls"]:
                want = step.after
                got = stock_layout(stock)
                assert got["conformer_att"].shape[3] == want["conformer_att"], (unit, step)
                assert got["estimator_att"].shape[4] == want["estimator_att"], (unit, step)
                assert (cad.len_conf, cad.len_est) == (want["conformer_att"], want["estimator_att"])
                for name, t in cad.state_tensors().items():
                    assert torch.equal(t, got[name]), f"unit {unit}: region {name} differs from stock"
            assert {n_: r.data_ptr() for n_, r in cad.arena.regions.items()} == ptrs
            unit += 1
    assert unit >= 40
    assert cad.stats()["eager_runs"] > 0 and cad.stats()["captures"] == 0   # CPU: eager, same code


def test_arena_is_what_the_upstream_modules_read(model):
    """Forward pre-hooks on the conformer layers and a spy on the DiT see only arena memory."""
    cad = fh.new_session(model, "cadence")
    cad.start_turn()
    lo = cad.arena.base
    hi = lo + cad.arena.bytes_reserved
    seen = []

    def in_arena(t):
        return lo <= t.data_ptr() < hi

    def hook(_mod, _args, kwargs):
        seen.append(("conformer", in_arena(kwargs["att_cache"])))

    flow = model.t2w.flow
    layers = list(flow.encoder.encoders) + list(flow.encoder.up_encoders)
    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in layers]
    dit = flow.decoder.estimator
    real = dit.forward_chunk

    def spy(*args, **kwargs):
        seen.append(("dit_cache", in_arena(kwargs["att_cache"])))
        seen.append(("dit_scratch", in_arena(dit.att_cache_buffer)))
        return real(*args, **kwargs)
    try:
        with mock.patch.object(dit, "forward_chunk", side_effect=spy):
            cad.speak(tokens_for(0, 25))
            cad.speak(tokens_for(1, 25))
    finally:
        for h in handles:
            h.remove()
    assert len(seen) == 2 * (len(layers) + 2 * STEPS)
    assert all(ok for _, ok in seen), [s for s in seen if not s[1]]


class _BigAllocs(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, threshold):
        super().__init__()
        self.threshold, self.big = threshold, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "is_view", False):      # views allocate nothing
            return out
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.numel() >= self.threshold:
                self.big.append((str(func), tuple(t.shape)))
        return out


@pytest.fixture(scope="module")
def first_units(model):
    """mode -> (session, outputs) after units 0, 1, 2 of a fresh turn (25 tokens each, none final: first,
    ramp, then steady). The outputs are read by the tests that need those units of a clean turn; the
    sessions are taken over by test_steady_unit_allocates_no_dit_cache_sized_tensor alone."""
    out = {}
    for mode in ("stock", "cadence"):
        s = fh.new_session(model, mode)
        s.start_turn()
        out[mode] = (s, [s.speak(tokens_for(u, 25)) for u in range(3)])
    return out


def test_steady_unit_allocates_no_dit_cache_sized_tensor(model, first_units):
    """Stock re-allocates the whole DiT KV cache (steps x 16 x 2 x 8 x (P+100) x 128) by torch.cat every
    steady unit; cadence does not. The detector is shown to work on stock first (control).
    (The encoder still allocates its grown conformer cache inside upstream forward_chunk: not covered.)"""
    P = model.prompt.mel_frames
    threshold = STEPS * 16 * 2 * 8 * (P + 100) * 128
    for mode, expect_big in (("stock", True), ("cadence", False)):
        s, outs = first_units[mode]             # first, ramp, then reach steady: units 0-2 spoken
        assert len(outs) == 3
        with _BigAllocs(threshold) as spy:
            s.speak(tokens_for(3, 25))          # a steady unit
        assert bool(spy.big) is expect_big, (mode, spy.big)


def run_turn(model, mode, units=4, corrupt=None, reverse_dit=False, stop=None):
    """A fresh turn of `units` 25-token units, the last one final; `stop`: speak only the first `stop`."""
    s = fh.new_session(model, mode)
    s.start_turn()
    if reverse_dit:     # negative control: DiT keys oldest-first instead of newest-first
        v = s.estimator_view(s.len_est)
        v.copy_(v.flip(4))
    outs = []
    for u in range(units if stop is None else stop):
        if corrupt is not None and u == 2:
            corrupt(s)
        outs.append(s.speak(tokens_for(u, 25), final=(u == units - 1)))
    return outs


def test_corrupting_an_arena_region_changes_the_output(model, first_units):
    clean = first_units["cadence"][1]           # units 0-2 of a clean turn, none final

    def poke(s):
        with torch.inference_mode():
            s.conformer_view(s.len_conf)[0, 0, 0, 0, 0] += 1.0
    dirty = run_turn(model, "cadence", corrupt=poke, stop=3)    # units 0-2: only 1 and 2 are compared
    assert clean[1].waveform.tobytes() == dirty[1].waveform.tobytes()
    assert clean[2].waveform.tobytes() != dirty[2].waveform.tobytes()


def test_negative_control_oldest_first_dit_keys_fails_bit_exactness(model, first_units):
    stock = first_units["stock"][1]             # unit 0 of a clean stock turn (not final)
    wrong = run_turn(model, "cadence", units=2, reverse_dit=True, stop=1)
    assert len(wrong) == 1                      # the check must already fail on the turn's first unit
    with pytest.raises(AssertionError, match="unit 0: float32 waveform differs"):
        for u, (a, b) in enumerate(zip(stock, wrong)):
            compare_units("minicpmo45-reduced", u, a, b)


def fingerprint(s) -> str:
    h = hashlib.sha256()
    for name, t in sorted(s.state_tensors().items()):
        h.update(name.encode() + t.contiguous().numpy().tobytes())
    for k, v in sorted(s._hift.items()):
        h.update(k.encode() + v.contiguous().numpy().tobytes())
    h.update(repr((s.len_conf, s.len_est, s.buffer, s.turn)).encode())
    return h.hexdigest()


BAD = [
    pytest.param([6561] + [1] * 24, "outside", id="id-too-large"),
    pytest.param([-1] + [1] * 24, "outside", id="id-negative"),
    pytest.param([1.5] + [1] * 24, "int token id", id="float"),
    pytest.param([True] + [1] * 24, "int token id", id="bool"),
    pytest.param("abc", "sequence", id="string"),
    pytest.param([1] * 27, "at most 26", id="too-many"),
    # a 0-d tensor / array raised TypeError (iteration over a 0-d ...) instead of InputError; unordered or
    # byte containers (a dict's keys, a set, a bytearray, a memoryview) were taken as token ids while bytes was not
    pytest.param(torch.tensor(5), "sequence", id="tensor-0d"),
    pytest.param(np.array(5), "sequence", id="array-0d"),
    pytest.param({1: 2, 3: 4}, "sequence", id="dict"),
    pytest.param({5, 6}, "sequence", id="set"),
    pytest.param(bytearray(b"\x01\x02"), "sequence", id="bytearray"),
    pytest.param(memoryview(b"\x01\x02"), "sequence", id="memoryview"),
]


class StockState:
    """A stock session's token buffer and a copy of every cache tensor; == compares names, dtypes, shapes
    and bytes (as uint8: exact, NaN or not). Copied, not repr()'d and hashed: repr() of the bytes of the
    300 MiB 16-step DiT cache took ~10 s a call."""

    def __init__(self, s):
        self.buffer = list(s.buffer)
        self.caches = {k: v.clone(memory_format=torch.contiguous_format) for k, v in s.caches.items()}

    def __eq__(self, other):
        return self.buffer == other.buffer and self.caches.keys() == other.caches.keys() and all(
            a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            for a, b in ((self.caches[k], other.caches[k]) for k in self.caches))


@pytest.fixture(scope="module")
def spoken(model):
    """mode -> a session with an open turn after one 25-token unit, shared by the bad-token cases (one
    unit each, ~2 s, before): each case takes the session's state before and after its rejected unit, so
    a rejection that changed it still fails that case (the cases after it compare against what they find)."""
    sessions = {}

    def get(mode):
        if mode not in sessions:
            s = fh.new_session(model, mode)
            s.start_turn()
            s.speak(tokens_for(0, 25))
            sessions[mode] = s
        return sessions[mode]
    return get


@pytest.mark.parametrize("tokens,match", BAD)
@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_bad_tokens_rejected_and_state_unchanged(spoken, mode, tokens, match):
    s = spoken(mode)
    state = fingerprint if mode == "cadence" else StockState
    before = state(s)
    with pytest.raises(InputError, match=match):
        s.speak(tokens)
    assert state(s) == before


def test_after_a_rejected_unit_output_equals_a_clean_run(model):
    clean = run_turn(model, "cadence", units=3)
    s = fh.new_session(model, "cadence")
    s.start_turn()
    outs = [s.speak(tokens_for(0, 25))]
    with pytest.raises(InputError):
        s.speak([9999] * 25)
    outs += [s.speak(tokens_for(1, 25)), s.speak(tokens_for(2, 25), final=True)]
    for a, b in zip(clean, outs):
        assert a.waveform.tobytes() == b.waveform.tobytes()


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_unit_outside_a_turn_is_rejected(model, mode):
    s = fh.new_session(model, mode)
    with pytest.raises(InputError, match="no open turn"):
        s.speak(tokens_for(0, 25))
    s.start_turn()
    s.speak(tokens_for(0, 25), final=True)
    with pytest.raises(InputError, match="no open turn"):
        s.speak(tokens_for(1, 25))


def test_prompt_past_the_declared_clocks_is_rejected():
    with pytest.raises(ClockError, match="conformer_att.*5000"):
        fh.regions(4900)
    with pytest.raises(ValueError, match="even"):
        fh.regions(301)


def test_arena_is_sized_from_the_clocks_not_stock_constants(model):
    cad = fh.new_session(model, "cadence")
    P = model.prompt.mel_frames
    est = cad.arena["estimator_att"]
    assert est.capacity == STEPS * 16 * 2 * 8 * (P + 150) * 128      # only the steps in use, P+150
    stock_buffer = model.t2w.flow.decoder.att_cache_buffer
    assert stock_buffer.numel() == 16 * 16 * 2 * 8 * 1000 * 128      # the stock static constant
    assert cad.arena.bytes_reserved < stock_buffer.numel() * 4 / 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_graph_replay_is_bit_exact_and_steady_units_replay():
    m = fh.build_model({"n_timesteps": STEPS, "voice_prompt": str(VOICE), "prompt_seconds": 2.0},
                       device="cuda", depth="reduced", seed=0)
    stock, cad = fh.new_session(m, "stock"), fh.new_session(m, "cadence")
    for s in (stock, cad):
        s.start_turn()
    for u in range(7):          # P, P+50, then P+100: warm-up (eager), capture, replays
        before = cad.stats()
        a, b = stock.speak(tokens_for(u, 25)), cad.speak(tokens_for(u, 25))
        compare_units("minicpmo45-reduced-cuda", u, a, b)
        after = cad.stats()
        if u >= 4:
            assert after["captures"] == before["captures"] and after["replays"] == before["replays"] + 1
    assert np.all(np.isfinite(b.waveform))


@pytest.mark.released
def test_released_configuration_first_ramp_steady_and_flush_bit_exact():
    """The released architecture (6 + 4 conformer blocks, DiT depth 16, 10 Euler steps, full vocoder) with
    the workload's 6 s prompt (P = 300): first, ramp and steady units and a final flush, byte-identical."""
    m = fh.build_model({"n_timesteps": 10, "voice_prompt": str(VOICE), "prompt_seconds": 6.0},
                       depth="released", seed=0)
    assert m.prompt.mel_frames == 300 and len(m.t2w.flow.decoder.estimator.blocks) == 16
    stock, cad = fh.new_session(m, "stock"), fh.new_session(m, "cadence")
    for s in (stock, cad):
        s.start_turn()
    for u, n in enumerate([25, 25, 25, 2]):
        final = u == 3
        a, b = stock.speak(tokens_for(u, n), final=final), cad.speak(tokens_for(u, n), final=final)
        compare_units("minicpmo45-released", u, a, b)
        assert a.waveform.std() > 1e-4


def test_prepare_runs_synthetic_turns_without_touching_real_turns(model):
    """Ahead-of-time capture (prepare) runs synthetic turns; the next real turn starts from the voice's
    base state, so its units stay byte-identical to stock. On CPU prepare is forced (no graphs) to run the
    same code. A control shows the synthetic turn would matter without the restore."""
    stock = fh.new_session(model, "stock")
    cad = CadenceSession(model.t2w, model.prompt, prepare_turns=0)
    assert cad.prepared is None
    done = cad.prepare(turns=1, units=2)
    assert done["eager_runs"] > 0 and cad.buffer is None and cad.len_conf is None
    with pytest.raises(InputError):
        cad.speak(tokens_for(0, 25))                   # no open turn after prepare
    stock.start_turn()
    cad.start_turn()
    for u in range(2):
        compare_units("minicpmo45-reduced", u, stock.speak(tokens_for(u, 25)), cad.speak(tokens_for(u, 25)))
    # control: the same session continuing a turn (no restore) gives other bytes than a fresh turn
    fresh = fh.new_session(model, "stock")
    fresh.start_turn()
    a = fresh.speak(tokens_for(0, 25))
    b = stock.speak(tokens_for(0, 25))
    assert a.sha256() != b.sha256()
    with pytest.raises(ValueError, match="prepare"):
        cad.prepare(turns=-1)


def test_flow_output_is_an_arena_view(model):
    """The flow step's mel is returned from the arena (not a graph-pool tensor that another graph's
    intermediates may overwrite while the vocoder reads it block by block)."""
    cad = fh.new_session(model, "cadence")
    cad.start_turn()
    tok = torch.tensor([tokens_for(0, 28)], dtype=torch.int32)
    mel = cad._flow_step(tok, False, cad.len_conf, cad.len_est)
    lo, hi = cad.arena.base, cad.arena.base + cad.arena.bytes_reserved
    assert lo <= mel.data_ptr() < hi and mel.shape == (1, 80, 50)


def test_vocoder_regions_are_read_stay_put_and_bad_mel_changes_nothing(model):
    """The vocoder's history regions are what it reads (corrupting the source history changes the next
    unit), they never move, and a malformed mel is rejected with the state and offsets unchanged."""
    a, b = fh.new_session(model, "cadence"), fh.new_session(model, "cadence")
    names = ("vocoder_mel", "vocoder_source", "vocoder_phase")
    ptrs = {n: b.arena[n].data_ptr() for n in names}
    for s in (a, b):
        s.start_turn()
        s.speak(tokens_for(0, 25))
    before = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in b.vocoder.state().items()}
    with pytest.raises(ValueError, match="shape"):
        b.vocoder.stream(torch.zeros(1, 79, 5))
    after = b.vocoder.state()
    for k, v in before.items():
        assert torch.equal(v, after[k]) if torch.is_tensor(v) else v == after[k], k
    assert before["source"].numel() > 0
    b.vocoder.state()["source"].add_(1e-3)                # corrupt the source history only
    ua, ub = a.speak(tokens_for(1, 25)), b.speak(tokens_for(1, 25))
    assert ua.sha256() != ub.sha256()
    assert {n: b.arena[n].data_ptr() for n in names} == ptrs


def test_cadence_needs_none_of_the_stock_module_buffers():
    """A cadence-only process frees the stock 16-step DiT buffers (for_mode): the voice set-up and every
    step run on the arena, bytes still equal stock's (computed on the same instance before the release);
    a stock session on the released model is refused with the reason."""
    m = fh.build_model({"n_timesteps": STEPS, "voice_prompt": str(VOICE), "prompt_seconds": 2.0},
                       depth="reduced", seed=0)
    script = [(tokens_for(500 + u, n), u == 2) for u, n in enumerate((25, 25, 4))]
    stock = fh.new_session(m, "stock")
    stock.start_turn()
    want = [stock.speak(t, final=f) for t, f in script]
    del stock
    done = fh.for_mode(m, "cadence")
    assert done["stock_buffers_released_bytes"] >= 16 * 16 * 2 * 8 * 1000 * 128 * 4
    assert m.t2w.flow.decoder.att_cache_buffer.stride() == (0,) * 6
    with pytest.raises(RuntimeError, match="released"):
        fh.new_session(m, "stock")
    cad = fh.new_session(m, "cadence")
    cad.start_turn()
    for u, ((t, f), a) in enumerate(zip(script, want)):
        compare_units("minicpmo45-reduced-released-buffers", u, a, cad.speak(t, final=f))


@pytest.mark.parametrize("bad,match", [
    pytest.param(lambda: torch.zeros(1, 80, 5, dtype=torch.int64), "floating-point", id="int64"),
    pytest.param(lambda: torch.zeros(1, 80, 5, dtype=torch.complex64), "floating-point", id="complex"),
    pytest.param(lambda: torch.zeros(1, 80, 5, dtype=torch.bool), "floating-point", id="bool"),
    pytest.param(lambda: np.zeros((1, 80, 5), np.float32), "torch.Tensor", id="numpy"),
])
def test_vocoder_rejects_non_float_mel_and_changes_nothing(model, bad, match):
    s = CadenceSession(model.t2w, model.prompt, prepare_turns=0)
    s.start_turn()
    v = s.vocoder
    before = {k: (x.clone() if torch.is_tensor(x) else x) for k, x in v.state().items()}
    with pytest.raises(ValueError, match=match):
        v.stream(bad())
    after = v.state()
    for k, x in before.items():
        assert torch.equal(x, after[k]) if torch.is_tensor(x) else x == after[k], k


def test_session_arguments_prepare_and_close_misuse_are_clear_errors(model):
    for kwargs, match in (({"vocoder": "stock", "noise": "bogus"}, "noise"),
                          ({"prepare_turns": -1}, "prepare_turns"), ({"prepare_turns": 1.5}, "prepare_turns")):
        with pytest.raises(ValueError, match=match):
            CadenceSession(model.t2w, model.prompt, **kwargs)
    s = CadenceSession(model.t2w, model.prompt, prepare_turns=0)
    with pytest.raises(ValueError, match="prepare"):
        s.prepare(True, 1)
    s.start_turn()
    s.speak(tokens_for(0, 25))
    before = (list(s.buffer), s.turn, s.len_conf, s.len_est)
    with pytest.raises(InputError, match="turn is open"):
        s.prepare(0)                                   # would discard the open turn
    assert (list(s.buffer), s.turn, s.len_conf, s.len_est) == before
    s.close()
    s.close()                                          # a second close does nothing
    for call in (s.start_turn, lambda: s.speak(tokens_for(1, 25)), lambda: s.prepare(1, 1)):
        with pytest.raises(InputError, match="closed"):
            call()


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_non_bool_final_is_rejected_and_the_turn_stays_open(model, mode):
    s = fh.new_session(model, mode)
    s.start_turn()
    buffer = list(s.buffer)
    for final in ("no", None, 1):
        with pytest.raises(InputError, match="final: expected a bool"):
            s.speak(tokens_for(0, 25), final=final)      # "no" would have flushed and closed the turn
    assert s.buffer == buffer


def test_rehearsal_turns_cut_steady_runs_and_drop_repeats():
    """Pure: runs of equal counts longer than STEADY_UNITS are cut (the final unit kept), repeats dropped,
    order kept; bad turns are ValueErrors naming the turn."""
    from duplexcadence.adapters.flow_hift_cadence import STEADY_UNITS, rehearsal_turns
    assert STEADY_UNITS == 4
    turns = [[16, 0], [20] + [25] * 15 + [1], [25] * 9 + [2], [25, 25, 3], [25] * 6 + [4], [16, 0],
             [25] * 12 + [2], [14, 25, 9, 25, 25, 25, 25, 25, 0]]
    assert rehearsal_turns(turns) == [(16, 0), (20, 25, 25, 25, 25, 1), (25, 25, 25, 25, 2), (25, 25, 3),
                                      (25, 25, 25, 25, 4), (14, 25, 9, 25, 25, 25, 25, 0)]
    assert rehearsal_turns([[25] * 9 + [2]], steady_units=2) == [(25, 25, 2)]
    for bad, what in (([[]], r"turns\[0\]"), ([[25], [27]], r"turns\[1\]"), ([[25, -1]], r"turns\[0\]"),
                      ([[True]], r"turns\[0\]")):
        with pytest.raises(ValueError, match=what):
            rehearsal_turns(bad)


def test_rehearsal_turns_rejects_non_iterables_and_accepts_numpy_counts():
    """Pure: turns that are not an iterable of sequences, and a bad steady_units, are ValueErrors naming the
    argument (not a bare TypeError); numpy int counts (as speak() takes numpy token ids) are ints."""
    from duplexcadence.adapters.flow_hift_cadence import rehearsal_turns
    for bad, what in ((None, r"turns: expected"), (5, r"turns: expected"), ("25", r"turns: expected"),
                      ([5], r"turns\[0\]: expected a sequence"), ([[3], "25"], r"turns\[1\]: expected a sequence")):
        with pytest.raises(ValueError, match=what):
            rehearsal_turns(bad)
    for steady in (0, -1, True, 2.5, "4"):
        with pytest.raises(ValueError, match="steady_units"):
            rehearsal_turns([[25] * 8 + [3]], steady_units=steady)
    shapes = rehearsal_turns([np.array([25, 25, 3]), [np.int64(4)]])
    assert shapes == [(25, 25, 3), (4,)] and all(type(c) is int for t in shapes for c in t)


def test_rehearse_rejects_a_non_bool_freeze_before_anything_runs(model):
    """freeze="no" would have closed the graph set (a truthy string), as final="no" once flushed a turn."""
    cad = CadenceSession(model.t2w, model.prompt, prepare_turns=0)
    before = cad.graphs.stats.snapshot()
    for freeze in ("no", None, 1):
        with pytest.raises(ValueError, match="freeze: expected a bool"):
            cad.rehearse([[3]], freeze=freeze)
    assert not cad.graphs.closed and cad.graphs.stats.snapshot() == before and cad.buffer is None


def test_rehearse_covers_every_signature_of_a_long_turn(model):
    """rehearse() on the cut shape of a long turn (20 tokens, then 25 x 6, then a 1-token flush) meets every
    signature the real turn meets (flow and vocoder blocks): the steady state is reached within
    STEADY_UNITS units. It leaves no open turn; misuse raises before anything runs."""
    cad = CadenceSession(model.t2w, model.prompt, prepare_turns=0)
    seen, run = [], cad.graphs.run

    def logged(sig, step):
        seen.append(sig)
        return run(sig, step)

    cad.graphs.run = logged
    turn = [20] + [25] * 6 + [1]
    done = cad.rehearse([turn, turn])
    assert done["shapes"] == [[20, 25, 25, 25, 25, 1]] and done["eager_runs"] > 0 and not done["frozen"]
    assert cad.buffer is None and cad.len_conf is None
    rehearsed, seen[:] = set(seen), []
    cad.start_turn()
    for k, n in enumerate(turn):
        cad.speak(tokens_for(k, n), final=k == len(turn) - 1)
    real = set(seen)
    assert real <= rehearsed, f"signatures the rehearsal missed: {sorted(map(str, real - rehearsed))}"
    assert any(s[0] == "vocoder" for s in real) and any(s[0] == "flow" for s in real)
    cad.start_turn()
    with pytest.raises(InputError, match="rehearse"):
        cad.rehearse([turn])                          # a turn is open
    with pytest.raises(ValueError, match="passes"):
        CadenceSession(model.t2w, model.prompt, prepare_turns=0).rehearse([turn], passes=0)


def test_graph_cache_shares_warm_up_and_locks_only_eager_runs_and_captures():
    """GraphCache (capture stubbed, CPU): a signature warmed by one cache is captured by a second cache
    sharing `warmed` on its first occurrence; the lock is held for warm-up runs and captures, not replays."""
    from duplexcadence.graphs import GraphCache, GraphEntry

    class CountingLock:
        def __init__(self):
            self.entered = 0

        def __enter__(self):
            self.entered += 1

        def __exit__(self, *exc):
            return False

    class FakeGraph:
        def __init__(self):
            self.replays = 0

        def replay(self):
            self.replays += 1

    def make(warmed, lock):
        g = GraphCache("cpu", enabled=False, warmup=1, warmed=warmed, lock=lock)
        g.enabled = True                               # drive the CUDA path's bookkeeping on the CPU

        def capture(sig, step):
            g.entries[sig] = GraphEntry(sig, FakeGraph(), step(), 0)
            g.stats.captures += 1
            return g.entries[sig].outputs
        g._capture = capture
        return g

    warmed, lock = set(), CountingLock()
    a, b = make(warmed, lock), make(warmed, lock)
    assert a.run("s", lambda: 1) == 1 and a.stats.warmup_runs == 1 and "s" in warmed
    assert a.run("s", lambda: 2) == 2 and a.stats.captures == 1
    entered = lock.entered
    a.run("s", lambda: 3)
    assert a.stats.replays == 1 and lock.entered == entered           # replay: no lock
    assert b.run("s", lambda: 4) == 4 and b.stats.captures == 1 and b.stats.warmup_runs == 0
    alone = make(None, None)                                           # no shared set: warms itself
    alone.run("s", lambda: 5)
    assert alone.stats.warmup_runs == 1 and alone.stats.captures == 0
    assert lock.entered == entered + 1


def test_a_model_with_cadence_sessions_deep_copies_without_their_shared_state(model):
    """A stock deployment copies the model per session (suite.duplex, instance_per_session). The cadence
    sessions' per-model state (lock, warmed signatures, voice base) lives beside the model, so a copy made
    after cadence sessions opened works (it raised 'cannot pickle _thread.RLock' on the H200) and starts
    with none of it: its own lock, nothing warmed, no voice base."""
    import copy

    from duplexcadence.adapters.flow_hift_cadence import model_lock, warmed_signatures
    from duplexcadence.runtime import model_state

    CadenceSession(model.t2w, model.prompt, prepare_turns=0)
    warmed_signatures(model.t2w, "k").add("sig")
    assert model_state(model.t2w)["voice_base"] and model_lock(model.t2w) is model_lock(model.t2w)
    twin = copy.deepcopy(model.t2w)
    assert model_lock(twin) is not model_lock(model.t2w)
    assert warmed_signatures(twin, "k") == set() and "sig" in warmed_signatures(model.t2w, "k")
    assert "voice_base" not in model_state(twin)
    assert not any(k.startswith("_duplexcadence") for k in vars(twin))
