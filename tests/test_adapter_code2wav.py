"""duplexcadence.adapters.code2wav: Qwen3-Omni Code2Wav on its chunk schedule, stock vs cadence, byte for byte.

CPU tests use the reduced config (2 transformer layers, hidden 128, decoder dim 64; same classes, same
16 x 2048 codes) in bfloat16, the workload's dtype; one test runs the released config (float32: bfloat16
convolutions are ~8x slower on CPU) on a short turn.
Cadence runs eagerly on CPU through the same code path as on CUDA (arena views, prepared masks handed over
through bind); the GPU class (graph capture and replay) skips on CPU. Expected lengths and schedules are
written out by hand from the stock code (transformers 5.17.0 `chunked_decode`, vllm-omni
`talker2code2wav_async_chunk`).
"""
from __future__ import annotations

import functools
import gc
import json
import re
import random
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

import cuda_checks  # tests/ is on sys.path under pytest
import threaded
from session_state import same_state, snapshot
from torch_threads import one_thread  # noqa: F401  (autouse: this module's tests at one intra-op thread)
from duplexcadence import bind
from duplexcadence.adapters import code2wav as c2w
from duplexcadence.adapters.code2wav import schedule as cs
from duplexcadence.errors import ClosedError, InputError, LimitError
from duplexcadence.runtime import BitMismatch, compare_units

SCRIPT = Path(__file__).resolve().parents[1] / "workloads" / "data" / "sessions" / "code2wav.jsonl"
SPF, LOSS = 1920, 555                       # samples per 12.5 Hz frame; samples lost per call
TURN = [12, 13, 12, 13, 5]                  # initial + ramp, ramp, steady, steady, final
# Reduced-config checkpoint layout in the released naming, kept as data (written from transformers 5.17.0).
MANIFEST = Path(__file__).parent / "data" / "code2wav_manifest.json"


@pytest.fixture(scope="module")
def model():
    return c2w.build_model({"dtype": "bfloat16"}, device="cpu", depth="reduced", seed=0)


def make_units(frames, seed=7):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2048, (16, n), generator=gen) for n in frames]


class WindowSpy:
    """Records the codes tensor every forward of the model receives (shape, strides, bytes, address)."""

    def __init__(self, model):
        self.seen = []
        self.handle = model.register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        codes = args[0]
        self.seen.append((tuple(codes.shape), codes.stride(), codes.is_contiguous(), codes.dtype,
                          codes.numpy().tobytes(), codes.data_ptr()))

    def take(self):
        out, self.seen = self.seen, []
        return out


def record_steps(session, log: list) -> None:
    """Record every signature the session's steps run under, through its GraphCache."""
    run = session.graphs.run

    def recording(sig, step):
        log.append(sig)
        return run(sig, step)
    session.graphs.run = recording


@pytest.fixture(scope="module")
def turn_run(model):
    """One turn of TURN through stock and cadence (interleaved, one model), every window and signature
    recorded."""
    stock, cadence = c2w.new_session(model, "stock"), c2w.new_session(model, "cadence")
    stock.start_turn()
    cadence.start_turn()
    ptrs = {n: r.data_ptr() for n, r in cadence.arena.regions.items()}
    spy, used, predicted = WindowSpy(model), [], []
    record_steps(cadence, used)
    outs, windows = [], []
    try:
        for k, codes in enumerate(make_units(TURN)):
            final = k == len(TURN) - 1
            predicted.append(cadence.signatures(codes.shape[1], final))
            a = stock.speak(codes, final=final)
            wa = spy.take()
            b = cadence.speak(codes.tolist() if k % 2 else codes, final=final)
            outs.append((a, b))
            windows.append((wa, spy.take()))
    finally:
        spy.handle.remove()
    return {"stock": stock, "cadence": cadence, "outs": outs, "windows": windows, "ptrs": ptrs,
            "used": used, "predicted": predicted}


# --- the schedule ---------------------------------------------------------------------------------
def schedule(frames, **spec):
    clock = cs.Turn(spec)
    clock.start_turn()
    return [clock.calls(n, k == len(frames) - 1) for k, n in enumerate(frames)]


def test_schedule_matches_the_serving_code():
    # vllm-omni: chunk 0 = the initial 4 frames, chunk 1 has left context = 4; then min(25, frames so far)
    got = [[(c.phase, c.ctx, c.new, c.offset) for c in unit] for unit in schedule(TURN)]
    assert got == [[("initial", 0, 4, 0), ("ramp", 4, 8, 4)], [("ramp", 12, 13, 0)],
                   [("steady", 25, 12, 0)], [("steady", 25, 13, 0)], [("final", 25, 5, 0)]]
    assert [[(c.ctx, c.new) for c in u] for u in schedule([3])] == [[(0, 3)]]
    assert [[(c.ctx, c.new) for c in u] for u in schedule([12, 13], initial_frames=0)] == [[(0, 12)], [(12, 13)]]


def test_region_is_declared_with_its_bound():
    region = cs.codes_region()
    assert region.clock == "codec" and region.policy.bound() == 25 + 13
    assert region.step(25, 13) == (38, 25) and region.step(4, 8) == (12, 12)


def test_every_window_a_turn_needs_from_the_clocks():
    """prepare(None)'s set: units of 12 or 13 frames in any order, final or not (context 0, 4, then 12 or
    13, then 24 or 25), written out by hand: 11 windows at C = 25, initial 4."""
    want = {(0, 4), (4, 8), (4, 9)} | {(c, n) for c in (12, 13, 24, 25) for n in (12, 13)}
    sigs = cs.Turn({}).turn_signatures()
    assert len(sigs) == 11 and {(s.get("context"), s.size) for s in sigs} == want
    assert all(s.step == "window" and s.get("keep") == s.get("context") * SPF for s in sigs)
    seamless = cs.Turn({}, seamless=True).turn_signatures()
    assert {s.get("keep") for s in seamless} == {0} | {c * SPF - LOSS for c in (4, 12, 13, 24, 25)}


# --- bit-exactness over every shape kind ----------------------------------------------------------
def test_cadence_equals_stock_for_every_shape_kind(turn_run):
    phases = set()
    for k, (a, b) in enumerate(turn_run["outs"]):
        compare_units("qwen3_omni", k, a, b)
        assert a.info["calls"] == b.info["calls"]
        phases |= {c["phase"] for c in a.info["calls"]}
        assert a.waveform.std() > 0.05 and np.mean(np.abs(a.waveform) >= 0.99) < 0.01   # not degenerate
    assert phases == {"initial", "ramp", "steady", "final"}


def test_windows_have_stock_layout_and_bytes(turn_run):
    shapes = []
    window_base = turn_run["cadence"].arena["codes.window"].data_ptr()
    for stock_calls, cadence_calls in turn_run["windows"]:
        assert len(stock_calls) == len(cadence_calls)
        for s, c in zip(stock_calls, cadence_calls):
            assert s[:4] == c[:4]                       # shape, strides, contiguous, dtype
            assert s[2] is True and s[3] == torch.int64
            assert s[4] == c[4]                         # the window's bytes
            assert c[5] == window_base                  # the cadence window is the arena region
            shapes.append(s[0][2])
    assert shapes == [4, 12, 25, 37, 38, 30]


def test_predicted_signatures_are_the_ones_the_steps_ran(turn_run):
    assert turn_run["used"] == [sig for unit in turn_run["predicted"] for sig in unit]
    windows = [c[0] for _, cadence_calls in turn_run["windows"] for c in cadence_calls]
    assert [cs.window(s) for s in turn_run["used"]] == windows         # the shape each step ran


def test_every_call_returns_1920n_minus_555(turn_run):
    want_calls = [[4 * SPF - LOSS, 8 * SPF - LOSS], [13 * SPF - LOSS], [12 * SPF - LOSS], [13 * SPF - LOSS],
                  [5 * SPF - LOSS]]
    for (a, b), want in zip(turn_run["outs"], want_calls):
        assert [c["samples"] for c in a.info["calls"]] == want
        assert a.samples == b.samples == sum(want) and a.pcm16.dtype == np.int16


def test_arena_addresses_are_stable(turn_run):
    cadence = turn_run["cadence"]
    assert {n: r.data_ptr() for n, r in cadence.arena.regions.items()} == turn_run["ptrs"]


class StockDecoder:
    """Stands in for the model in a stock session for a fast walk: records each window the session builds
    and returns zeros of the stock length (1920 * T - 555 samples)."""

    def __init__(self):
        self.windows = []

    def __call__(self, codes):
        self.windows.append(tuple(codes.shape))
        return torch.zeros(1, 1, codes.shape[-1] * SPF - LOSS)


def test_the_clock_predicts_every_step_of_the_real_script(model):
    """The committed Qwen3-Omni session script (5 turns, 39 SPEAK units): before each unit the clock
    predicts its windows; the cadence session's cache records the signatures speak ran (a recorder here,
    so the walk is fast; turn_run checks that steps run the shapes their signatures say); the stock
    session's windows and its left context after each unit are the predicted lengths."""
    rows = [json.loads(line) for line in SCRIPT.read_text().splitlines()]
    stock, cadence, decoder = c2w.new_session(model, "stock"), c2w.new_session(model, "cadence"), StockDecoder()
    stock.model, used, turn = decoder, [], None
    cadence.graphs.run = lambda sig, step: used.append(sig) or torch.zeros(1, 1, sig.size * SPF - LOSS)
    for row in (r for r in rows if r["kind"] == "SPEAK"):
        if row["turn"] != turn:
            turn = row["turn"]
            stock.start_turn()
            cadence.start_turn()
        frames, final = len(row["codes"][0]), row["final"]
        clock = cadence.clocks()
        predicted = clock.unit(frames, final)
        used.clear(), decoder.windows.clear()
        stock.speak(row["codes"], final=final)
        cadence.speak(row["codes"], final=final)
        assert used == predicted and [cs.window(s) for s in predicted] == decoder.windows
        assert stock.state()["ctx"] == clock.ctx == cadence.state()["ctx"]
        if not final:
            assert stock.state()["codes"].shape == (16, clock.ctx)
    assert cadence.stats().units == sum(r["kind"] == "SPEAK" for r in rows) == 39
    assert set(cadence.stats().detail["calls_per_phase"]) == {"initial", "ramp", "steady", "final"}


# --- the comparison can fail -------------------------------------------------------------------------
SMALL = {"left_context": 3, "initial_frames": 2}     # windows of at most 3 + 4 frames: fast
SMALL_TURN = [3, 4, 3, 4]


def run_pair(model, stock_spec, cadence_spec, frames, corrupt_after=None):
    stock, cadence = c2w.new_session(model, "stock", stock_spec), c2w.new_session(model, "cadence", cadence_spec)
    stock.start_turn()
    cadence.start_turn()
    out = []
    for k, codes in enumerate(make_units(frames, seed=11)):
        if corrupt_after is not None and k == corrupt_after + 1:
            ctx = cadence.region("codes.context", (16, 1))
            ctx[5, 0] = (ctx[5, 0] + 1) % 2048          # one code of the left context
        final = k == len(frames) - 1
        out.append((stock.speak(codes, final=final), cadence.speak(codes, final=final)))
    return out


def test_small_schedule_is_bit_exact(model):
    for k, (a, b) in enumerate(run_pair(model, SMALL, SMALL, SMALL_TURN)):
        compare_units("qwen3_omni", k, a, b)


def test_corrupting_the_arena_context_changes_the_output(model):
    outs = run_pair(model, SMALL, SMALL, SMALL_TURN, corrupt_after=1)
    compare_units("qwen3_omni", 1, *outs[1])
    with pytest.raises(BitMismatch, match="unit 2: float32 waveform differs"):
        compare_units("qwen3_omni", 2, *outs[2])


def test_negative_control_context_off_by_one_frame(model):
    outs = run_pair(model, SMALL, {**SMALL, "left_context": 2}, SMALL_TURN)
    compare_units("qwen3_omni", 0, *outs[0])             # no context yet: same windows
    a, b = outs[2]
    assert a.samples == b.samples                        # same length, other bytes
    with pytest.raises(BitMismatch):
        compare_units("qwen3_omni", 2, a, b)


# --- bad input and limits --------------------------------------------------------------------------
def good():
    return make_units([3], seed=5)[0]


BAD = [
    pytest.param(lambda: good()[:15], "shape \\[16, frames\\]", id="15-codebooks"),
    pytest.param(lambda: good().tolist()[:15], "expected 16 codebooks", id="15-lists"),
    pytest.param(lambda: torch.cat([good(), good()[:1]]), "shape", id="17-codebooks"),
    pytest.param(lambda: good().index_fill(1, torch.tensor([1]), 2048), "2048 outside", id="id-2048"),
    pytest.param(lambda: good().index_fill(1, torch.tensor([0]), -1), "-1 outside", id="id-negative"),
    pytest.param(lambda: good().float(), "integer tensor", id="float-tensor"),
    pytest.param(lambda: [[True] * 3] * 16, "int code id", id="bools"),
    pytest.param(lambda: [[1.0] * 3] * 16, "int code id", id="floats"),
    pytest.param(lambda: [[1] * 3] * 15 + [[1] * 2], "same frame count", id="ragged"),
    pytest.param(lambda: torch.zeros(16, 0, dtype=torch.int64), "got 0", id="0-frames"),
    pytest.param(lambda: "codes", "list of 16 lists", id="string"),
]


@pytest.mark.parametrize("mode", ["stock", "cadence"])
@pytest.mark.parametrize("make_bad,match", BAD)
def test_bad_codes_rejected_state_unchanged(model, mode, make_bad, match):
    session = c2w.new_session(model, mode, SMALL)
    session.start_turn()
    session.speak(good())                                 # context holds 3 frames now
    before = snapshot(session)
    with pytest.raises(InputError, match=match) as info:
        session.speak(make_bad())
    assert not isinstance(info.value, LimitError) and same_state(snapshot(session), before)


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_a_unit_past_the_declared_bound_is_a_limit_error(model, mode):
    """14 frames: past the unit region's bound (13, the 12.5 Hz clock's ceiling), in both modes; the
    session goes on with the next unit as if the bad one never came."""
    session, reference = c2w.new_session(model, mode, SMALL), c2w.new_session(model, "stock", SMALL)
    for s in (session, reference):
        s.start_turn()
        s.speak(good())
    before = snapshot(session)
    with pytest.raises(LimitError, match="'unit'.*14.*13") as info:
        session.speak(torch.zeros(16, 14, dtype=torch.int64))
    with pytest.raises(LimitError, match="'unit'"):
        session.signatures(14)
    assert info.value.session_usable and same_state(snapshot(session), before)
    nxt = make_units([4], seed=6)[0]
    compare_units("qwen3_omni", 1, reference.speak(nxt), session.speak(nxt))


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_speak_outside_an_open_turn_is_rejected(model, mode):
    session = c2w.new_session(model, mode, SMALL)
    with pytest.raises(InputError, match="no open turn"):
        session.speak(good())
    session.start_turn()
    session.speak(good(), final=True)
    before = snapshot(session)
    with pytest.raises(InputError, match="no open turn"):
        session.speak(good())                             # a unit after the final unit of a turn
    assert same_state(snapshot(session), before) and before["ctx"] is None
    with pytest.raises(InputError, match="final"):
        session.speak(good(), final="no")
    with pytest.raises(TypeError):
        session.speak(good(), True)                       # final is keyword-only


def test_a_rejected_unit_loses_nothing(model):
    stock, cadence = c2w.new_session(model, "stock", SMALL), c2w.new_session(model, "cadence", SMALL)
    units = make_units(SMALL_TURN, seed=3)
    for s in (stock, cadence):
        s.start_turn()
    for k, codes in enumerate(units):
        with pytest.raises(InputError):
            cadence.speak(codes.tolist()[:15])
        final = k == len(units) - 1
        compare_units("qwen3_omni", k, stock.speak(codes, final=final), cadence.speak(codes, final=final))


def test_capabilities_and_bad_spec(model):
    for cls, graphs in ((c2w.StockSession, False), (c2w.CadenceSession, True)):
        caps = cls.capabilities
        assert (caps.turn_state, caps.concurrent, caps.graphs, caps.payload, caps.max_payload) == \
            ("reset", True, graphs, "frames", 13)
    for spec, match in (({"left_context": 0}, "left_context"), ({"initial_frames": 14}, "initial_frames"),
                        ({"capture": "later"}, "capture")):
        with pytest.raises(ValueError, match=match):
            c2w.new_session(model, "cadence", spec)
    with pytest.raises(ValueError, match="mode"):
        c2w.new_session(model, "fast")


def test_prepare_on_cpu_captures_nothing_and_changes_nothing(model):
    cadence = c2w.new_session(model, "cadence", SMALL)
    cadence.start_turn()
    cadence.speak(good())
    before = snapshot(cadence)
    assert set(cadence.prepare().values()) == {0} and set(cadence.prepare(cadence.signatures(4)).values()) == {0}
    assert same_state(snapshot(cadence), before)
    seamless = c2w.new_session(model, "cadence_seamless", SMALL)
    seamless.start_turn()
    for sig in (seamless.signatures(4)[-1],                                            # another keep
                c2w.new_session(model, "cadence").clocks().turn_signatures()[-1]):     # context 25 > 3
        with pytest.raises(InputError, match="signatures"):
            cadence.prepare([sig])


# --- sessions that share a model --------------------------------------------------------------------
def module_attributes(model) -> dict:
    """(module, attribute) -> id of the object, for every instance attribute, buffer, parameter and hook."""
    out = {}
    for name, mod in model.named_modules():
        for kind, items in (("attr", vars(mod)), ("buffer", mod._buffers), ("param", mod._parameters),
                            ("pre_hook", mod._forward_pre_hooks)):
            out.update({(name, kind, k): id(v) for k, v in items.items()})
    return out


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_every_patch_is_undone_after_a_step_and_after_a_step_that_raises(model, mode):
    session = c2w.new_session(model, mode, SMALL)
    session.start_turn()
    before = module_attributes(model)
    for codes in make_units(SMALL_TURN[:3], seed=8):
        session.speak(codes)
    assert bind.live() == 0 and module_attributes(model) == before
    assert "forward" not in vars(model.pre_transformer)

    def fail(module, args, kwargs):
        assert bind.live() == (mode == "cadence")         # the mask is handed over now (cadence)
        raise RuntimeError("a kernel failed")
    handle = model.pre_transformer.register_forward_pre_hook(fail, with_kwargs=True)
    try:
        with pytest.raises(RuntimeError, match="a kernel failed"):
            session.speak(good())
    finally:
        handle.remove()
    assert bind.live() == 0 and module_attributes(model) == before


def test_close_frees_the_session_at_once(model):
    session = c2w.new_session(model, "cadence", SMALL)
    session.start_turn()
    session.speak(good())
    gc.collect()
    gc.disable()                                  # nothing may wait for the cycle collector
    try:
        block = weakref.ref(session.arena._block)
        session.close()
        assert block() is None
    finally:
        gc.enable()
    session.close()                               # a second close does nothing
    for call in (lambda: session.speak(good()), session.start_turn, session.state, session.stats,
                 session.clocks, lambda: session.signatures(4), session.prepare):
        with pytest.raises(ClosedError):
            call()
    stock = c2w.new_session(model, "stock", SMALL)
    stock.close()
    with pytest.raises(ClosedError):
        stock.start_turn()


def run_alone(model, plan) -> list[bytes]:
    session = c2w.new_session(model, plan["mode"], dict(plan["spec"]))
    session.start_turn()
    out = [session.speak(codes, final=final).waveform.tobytes() for codes, final in plan["units"]]
    session.close()
    return out


def test_sessions_on_threads_equal_each_alone(model):
    """Left context 60, so windows reach 72-73 frames and the masks are tensors of each window's size.
    Three sessions (stock, and two cadence sessions whose windows differ in length at the same time) on
    three threads, opening at random times, speaking with random pauses, closing when done, while a
    fourth thread opens and closes sessions all the time: every unit's bytes equal that session's alone
    (the stock session, given the first cadence session's codes, is compared with its bytes alone: a
    stock unit equal to it is bit-exactness at 72-73-frame windows too), nothing raises."""
    spec = {"left_context": 60}
    same = make_units([12, 13] * 4, seed=21)
    plans = [{"mode": "stock", "spec": spec, "units": [(c, k == 7) for k, c in enumerate(same)]},
             {"mode": "cadence", "spec": spec, "units": [(c, k == 7) for k, c in enumerate(same)]},
             {"mode": "cadence", "spec": {**spec, "initial_frames": 0},
              "units": [(c, k == 7) for k, c in enumerate(make_units([13, 12] * 4, seed=22))]}]
    alone = [None] + [run_alone(model, plan) for plan in plans[1:]]
    alone[0] = alone[1]                 # the stock session alone: bit-exact cadence gives its bytes
    got = [None] * len(plans)

    def speaker(i):
        rng = random.Random(30 + i)
        time.sleep(rng.uniform(0, 0.03))
        session = c2w.new_session(model, plans[i]["mode"], dict(plans[i]["spec"]))
        session.start_turn()
        outs = []
        for codes, final in plans[i]["units"]:
            time.sleep(rng.uniform(0, 0.005))
            outs.append(session.speak(codes, final=final).waveform.tobytes())
        session.close()
        got[i] = outs

    errors = threaded.beside_churn([functools.partial(speaker, i) for i in range(len(plans))],
                                   lambda k: c2w.new_session(model, ("cadence", "stock")[k % 2], spec), seed=29)
    assert errors == []
    diffs = [(i, k) for i, (a, b) in enumerate(zip(alone, got)) for k in range(len(a)) if a[k] != b[k]]
    assert diffs == [] and bind.live() == 0


# --- opt-in seamless mode and the whole-utterance reference ---------------------------------------------
def test_seamless_refills_the_555_samples_and_keeps_stock_bytes(model):
    frames = SMALL_TURN
    stock, seamless = c2w.new_session(model, "stock", SMALL), c2w.new_session(model, "cadence_seamless", SMALL)
    for s in (stock, seamless):
        s.start_turn()
    total = 0
    for k, codes in enumerate(make_units(frames, seed=2)):
        final = k == len(frames) - 1
        a, b = stock.speak(codes, final=final), seamless.speak(codes, final=final)
        offset_a = offset_b = 0
        for ca, cb in zip(a.info["calls"], b.info["calls"]):
            extra = LOSS if ca["ctx"] else 0
            assert cb["samples"] == ca["samples"] + extra
            tail = b.waveform[offset_b + extra:offset_b + cb["samples"]]
            assert tail.tobytes() == a.waveform[offset_a:offset_a + ca["samples"]].tobytes()
            offset_a, offset_b = offset_a + ca["samples"], offset_b + cb["samples"]
        total += b.samples
    assert total == sum(frames) * SPF - LOSS            # the whole utterance's length
    whole = c2w.whole_utterance(model, torch.cat(make_units(frames, seed=2), dim=1))
    assert whole.dtype == np.float32 and whole.size == sum(frames) * SPF - LOSS


# --- checkpoint loading ------------------------------------------------------------------------------
def write_checkpoint(path, drop=None, extra=None, reshape=None):
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(9)
    layout = json.loads(MANIFEST.read_text())["tensors"]
    tensors = {name: torch.randn(shape, generator=gen) for name, shape in layout.items()}
    tensors.pop(drop, None)
    tensors.update(extra or {})
    if reshape:
        tensors[reshape] = torch.zeros(3)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    return tensors


def test_checkpoint_loads_through_transformers(tmp_path):
    written = write_checkpoint(tmp_path, extra={"talker.codec_head.weight": torch.zeros(2)})
    m = c2w.build_model({"dtype": "float32", "checkpoint": str(tmp_path)}, depth="reduced")
    state = m.state_dict()
    assert sorted(state) == sorted(k.removeprefix("code2wav.") for k in written if k.startswith("code2wav."))
    for name, tensor in written.items():
        if name.startswith("code2wav."):
            assert torch.equal(state[name.removeprefix("code2wav.")], tensor), name
    assert m.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kind", ["missing", "unexpected", "misshaped"])
def test_checkpoint_mismatch_raises(tmp_path, kind):
    name = "code2wav.decoder.1.block.1.conv.bias"
    write_checkpoint(tmp_path, drop=name if kind == "missing" else None,
                     extra={"code2wav.decoder.9.weight": torch.zeros(1)} if kind == "unexpected" else None,
                     reshape=name if kind == "misshaped" else None)
    with pytest.raises(c2w.CheckpointError, match="decoder"):
        c2w.build_model({"dtype": "float32", "checkpoint": str(tmp_path)}, depth="reduced")


def test_bad_build_arguments():
    with pytest.raises(ValueError, match="depth"):
        c2w.build_model({}, depth="tiny")
    with pytest.raises(ValueError, match="dtype"):
        c2w.build_model({"dtype": "float16"}, depth="reduced")
    with pytest.raises(FileNotFoundError):
        c2w.build_model({"checkpoint": "/nonexistent/dir"}, depth="reduced")


def test_an_unreadable_checkpoint_is_a_checkpoint_error_naming_it(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors header")
    with pytest.raises(c2w.CheckpointError, match=r"cannot be read as the reduced Code2Wav layout: SafetensorError"):
        c2w.build_model({"dtype": "float32", "checkpoint": str(tmp_path)}, depth="reduced")


@pytest.mark.parametrize("files", [
    pytest.param({"config.json": "[1, 2]"}, id="config-a-list"),
    pytest.param({"config.json": '{"model_type": "bert"}'}, id="config-another-model"),
    pytest.param({"model.safetensors.index.json": '{"weight_map": {}}'}, id="index-without-metadata"),
    pytest.param({"pytorch_model.bin": "garbage"}, id="garbage-bin"),
])
def test_a_checkpoint_directory_that_is_not_the_layout_is_a_checkpoint_error(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(c2w.CheckpointError, match=rf"^spec\['checkpoint'\]: {re.escape(str(tmp_path))} cannot be read"):
        c2w.build_model({"dtype": "float32", "checkpoint": str(tmp_path)}, depth="reduced")


@pytest.mark.parametrize("dtype", [["float32"], {"float32": 1}, None])
def test_a_dtype_that_is_not_a_name_is_named(dtype):
    with pytest.raises(InputError, match=r"^spec\['dtype'\]: expected one of \['bfloat16', 'float32'\], got "):
        c2w.build_model({"dtype": dtype}, depth="reduced")


# --- the released config, a few small units ------------------------------------------------------------
@pytest.mark.released
def test_released_config_short_turn_is_bit_exact():
    model = c2w.build_model({"dtype": "float32"}, depth="released", seed=0)   # CPU bf16 is ~8x slower
    assert sum(p.numel() for p in model.parameters()) == 216_016_577
    stock, cadence = c2w.new_session(model, "stock"), c2w.new_session(model, "cadence")
    for s in (stock, cadence):
        s.start_turn()
    frames = [2, 2, 1]                                   # windows (0, 2), (2, 2), (4, 1)
    for k, codes in enumerate(make_units(frames, seed=4)):
        a, b = stock.speak(codes, final=k == 2), cadence.speak(codes, final=k == 2)
        compare_units("qwen3_omni", k, a, b)
        assert a.samples == frames[k] * SPF - LOSS and a.waveform.std() > 0.05


# --- CUDA: graphs per exact window, captured ahead --------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
class TestGraphs:
    @pytest.fixture(scope="class")
    def cuda_model(self):
        return c2w.build_model({"dtype": "bfloat16"}, device="cuda", depth="reduced", seed=0)

    def test_prepared_windows_replay_bit_exact(self, cuda_model):
        stock, cadence = c2w.new_session(cuda_model, "stock"), c2w.new_session(cuda_model, "cadence")
        before = snapshot(cadence)
        delta = cadence.prepare()                          # None: every window of 12/13-frame turns
        assert same_state(snapshot(cadence), before)      # warm-ups and captures changed no state, no clock
        assert delta["captures"] == delta["graphs"] == 11 and delta["capture_failures"] == 0
        assert delta["graph_bytes"] > 0 and len(cadence.stats().detail["graph_bytes_per_signature"]) == 11
        for turn in range(2):
            for s in (stock, cadence):
                s.start_turn()
            for k, codes in enumerate(make_units(TURN, seed=turn)):
                final = k == len(TURN) - 1
                compare_units("qwen3_omni-cuda", k, stock.speak(codes, final=final), cadence.speak(codes, final=final))
        stats = cadence.stats()
        assert stats.captures == 11 and stats.replays == 2 * 5    # (0,4) (4,8) (12,13) (25,12) (25,13)
        # the 5-frame final is not in the set: eager both times (its first, a warm-up, in a fresh process)
        assert stats.eager_fallbacks + stats.warmup_runs - delta["warmup_runs"] == 2 and stats.eager_runs == 0
        assert bind.live() == 0 and "forward" not in vars(cuda_model.pre_transformer)

    def test_a_short_final_unit_captured_once_its_payload_is_known(self, cuda_model):
        stock, cadence = c2w.new_session(cuda_model, "stock"), c2w.new_session(cuda_model, "cadence")
        for s in (stock, cadence):
            s.start_turn()
        units = make_units(TURN, seed=5)
        for k, codes in enumerate(units):
            final = k == len(TURN) - 1
            assert cadence.prepare(cadence.signatures(codes.shape[1], final))["capture_failures"] == 0
            compare_units("qwen3_omni-cuda", k, stock.speak(codes, final=final), cadence.speak(codes, final=final))
        stats = cadence.stats()
        assert stats.captures == stats.replays == 6 and stats.eager_fallbacks == 0

    def test_long_context_masks_replay_bit_exact(self, cuda_model):
        """Left context 60: windows of 72 and 73 frames carry tensor masks, prepared outside the graph."""
        spec = {"left_context": 60}
        stock, cadence = c2w.new_session(cuda_model, "stock", spec), c2w.new_session(cuda_model, "cadence", spec)
        cadence.prepare()
        for s in (stock, cadence):
            s.start_turn()
        for k, codes in enumerate(make_units([13, 12] * 4, seed=9)):
            compare_units("qwen3_omni-cuda-c60", k, stock.speak(codes, final=k == 7), cadence.speak(codes, final=k == 7))
        assert cadence.stats().eager_fallbacks == 0 and cadence.stats().replays == 9

    def test_inline_capture_on_first_use(self, cuda_model):
        stock = c2w.new_session(cuda_model, "stock")
        cadence = c2w.new_session(cuda_model, "cadence", {"capture": "inline"})
        for s in (stock, cadence):
            s.start_turn()
        for k, codes in enumerate(make_units(TURN, seed=3)):
            final = k == len(TURN) - 1
            compare_units("qwen3_omni-cuda-inline", k, stock.speak(codes, final=final), cadence.speak(codes, final=final))
        stats = cadence.stats()
        assert stats.captures + stats.warmup_runs >= 6 and stats.eager_fallbacks == 0

    def test_a_new_thread_warms_up_before_its_first_capture_and_keeps_its_bytes(self, cuda_model):
        """Every window warmed on this thread first; then, on a new host thread (no cuBLAS / cuDNN handle of
        its own yet), a cadence session prepares (its own warm-ups, then the captures) and speaks, and a stock
        session speaks after it on that thread: no capture fails, both give this thread's bytes."""
        units = make_units(TURN, seed=51)

        def speak_all(session):
            session.start_turn()
            out = [session.speak(c, final=k == len(units) - 1).waveform.tobytes() for k, c in enumerate(units)]
            session.close()
            return out

        here = c2w.new_session(cuda_model, "cadence")
        here.prepare()
        expected, got = speak_all(here), {}

        def other_thread():
            try:
                cadence = c2w.new_session(cuda_model, "cadence")
                got["prepared"] = cadence.prepare()
                got["cadence"] = speak_all(cadence)
                got["stock"] = speak_all(c2w.new_session(cuda_model, "stock"))
            except Exception as exc:   # noqa: BLE001
                got["error"] = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert "error" not in got, got["error"]
        prepared = got["prepared"]
        assert (prepared["capture_failures"], prepared["captures"], prepared["warmup_runs"]) == (0, 11, 11)
        assert got["cadence"] == expected and got["stock"] == expected

    def test_threads_replay_without_the_lock_and_equal_each_alone(self, cuda_model):
        spec = {"left_context": 60}
        plans = [("stock", spec, make_units([12, 13] * 4, seed=41)), ("cadence", spec, make_units([12, 13] * 4, seed=42)),
                 ("cadence", {**spec, "initial_frames": 0}, make_units([13, 12] * 4, seed=43))]

        def open_session(mode, spec):
            session = c2w.new_session(cuda_model, mode, dict(spec))
            session.prepare()
            return session

        def speak_all(session, units):
            session.start_turn()
            return [session.speak(c, final=k == len(units) - 1).waveform.tobytes() for k, c in enumerate(units)]

        alone = []
        for mode, sp, units in plans:
            session = open_session(mode, sp)
            alone.append(speak_all(session, units))
            session.close()
        sessions = [open_session(mode, sp) for mode, sp, _ in plans]
        got = [None] * len(plans)

        def speaker(i):
            with torch.cuda.stream(torch.cuda.Stream()):
                got[i] = speak_all(sessions[i], plans[i][2])
            sessions[i].close()

        errors = threaded.beside_churn([functools.partial(speaker, i) for i in range(len(plans))],
                                       lambda k: c2w.new_session(cuda_model, ("cadence", "stock")[k % 2], spec),
                                       seed=0, pause_s=0)
        assert errors == [] and got == alone

    def test_close_gives_the_device_memory_back(self, cuda_model):
        def use(session):
            session.prepare()
            session.start_turn()
            session.speak(make_units([12], seed=1)[0])
        cuda_checks.check_close_gives_the_memory_back(lambda: c2w.new_session(cuda_model, "cadence"),
                                                      lambda first: first.prepare(), use)
