"""Step-Audio 2 mini tail (flow_hift.cadence_sa2, flow_hift.hift_graph): DuplexCadence vs the upstream-driver stock
session on the CPU (the eager path of the same steps: arena views, a KeepAll conformer region growing at a stable
address, the in-place DiT trim, the HiFT caches and step outputs in the arena, the session's own generator). Any
differing byte on any unit fails, naming the unit; on CUDA graph capture ahead and replay."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from reduced_flow_hift import VOICES, reduced_model, token_maker  # noqa: E402  (tests/ is on sys.path under pytest)
from session_state import same_state, snapshot  # noqa: E402
from torch_threads import two_threads  # noqa: E402, F401  (autouse: this module's tests at two intra-op threads)
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.flow_hift import facts, plan  # noqa: E402
from duplexcadence.adapters.flow_hift.hift_graph import DeviceConstants  # noqa: E402
from duplexcadence.clocks import ClockError  # noqa: E402
from duplexcadence.errors import InputError, LimitError  # noqa: E402
from duplexcadence.runtime import BitMismatch, compare_units  # noqa: E402

VOICE = VOICES["stepaudio2"]
STEPS = 2
# Three turns on the same caches (upstream never resets them). Calls: turn 0: -, 28 (the session's first call: no
# HiFT history), 28 (DiT cache ramps P -> P+100), 28 (steady at P+100), 28 + flush 6 (two calls in one unit);
# turn 1: flush 2 (fewer than the 3-token lookahead); turn 2: flush 19 (no regular call in the turn).
TURNS = [[16, 25, 25, 25, 15], [2], [9, 10]]
EXPECTED_CALLS = [[], [28], [28], [28], [28, 6], [2], [], [19]]


tokens_for = token_maker(2000)


def run(session, turns=TURNS, observe=None):
    outs, unit = [], 0
    for turn in turns:
        session.start_turn()
        for i, n in enumerate(turn):
            outs.append(session.speak(tokens_for(unit, n), final=i == len(turn) - 1))
            if observe:
                observe(session, unit)
            unit += 1
    return outs


@pytest.fixture(scope="module")
def model():
    return reduced_model("stepaudio2", n_timesteps=STEPS)


@pytest.fixture(scope="module")
def runs(model):
    """Stock then cadence over TURNS; per unit the generator states and the cadence's addresses and clocks."""
    seen = {"stock": [], "cadence": []}

    def observe(s, unit):
        st = s.state()
        seen[mode].append({"rng": st["generator"].clone(), "clocks": st["clocks"],
                           "conf_ptr": st["conformer_att"].data_ptr(),
                           "ptrs": {n: r.data_ptr() for n, r in s.arena.regions.items()} if mode == "cadence" else None})
    out = {}
    for mode in fh.MODES:
        with fh.new_session(model, mode) as s:
            out[mode] = run(s, observe=observe)
            out[mode + "_state"] = snapshot(s)
    return {**out, "seen": seen}


def test_multi_turn_bit_exact_every_call_kind_and_generator_state(runs, model):
    """Every unit's float32 waveform and int16 PCM byte-identical and the session's generator in the same state
    after every unit; the calls cover the first call, the DiT ramp and steady lengths, flushes of 19, 2 and 6
    tokens and units without a call."""
    assert [o.info["calls"] for o in runs["stock"]] == EXPECTED_CALLS
    for unit, (a, b) in enumerate(zip(runs["stock"], runs["cadence"])):
        compare_units("stepaudio2-reduced", unit, a, b)
        assert torch.equal(runs["seen"]["stock"][unit]["rng"], runs["seen"]["cadence"][unit]["rng"]), unit
        assert a.info == b.info and (a.samples > 0 and a.waveform.std() > 1e-4 if a.info["calls"] else a.samples == 0)
    assert [o.samples for o in runs["stock"]][1:3] == [20160, 24000]
    assert runs["stock"][5].samples == (8 + 4) * 480 and runs["stock"][7].samples == (8 + 38) * 480
    P = model.prompt.mel_frames
    assert [s["clocks"]["estimator_att"] for s in runs["seen"]["cadence"]][:4] == [P, P + 50, P + 100, P + 100]


def test_conformer_region_grows_at_a_stable_address_and_matches_stock(runs, model):
    """KeepAll: +2(n-3) frames per call, never trimmed, at one address for the whole session; every region keeps
    its address; the final state equals stock's caches byte for byte."""
    seen, P = runs["seen"]["cadence"], model.prompt.mel_frames
    expect, L = [], P
    for calls in EXPECTED_CALLS:
        L += sum(facts.mel_advance(n, n != 28) for n in calls)
        expect.append(L)
    assert [s["clocks"]["conformer_att"] for s in seen] == expect and expect[-1] > P + 100 + 54
    assert len({s["conf_ptr"] for s in seen}) == 1 and all(s["ptrs"] == seen[0]["ptrs"] for s in seen)
    assert same_state(runs["stock_state"], runs["cadence_state"])


def test_position_table_limit_rejected_in_both_modes_before_any_change(model, monkeypatch):
    """With the encoder's table cut to 180 positions, the second 28-token call would read 200: both modes raise
    ClockError naming the region, bound and value (session_usable False), state, clocks and generator untouched;
    control: the stock driver itself breaks inside the encoder on that call."""
    pos = model.t2w.flow.encoder.embed.pos_enc
    c = pos.pe.size(1) // 2
    monkeypatch.setattr(pos, "pe", pos.pe[:, c - 179: c + 180])
    assert facts.stock_limits(model.t2w.flow).positions == 180
    for mode in fh.MODES:
        with fh.new_session(model, mode) as s:
            s.start_turn()
            for unit in range(2):                     # no call, then a 28-token call: 100 -> 150 frames
                s.speak(tokens_for(unit, 25))
            assert s.state()["clocks"]["conformer_att"] == 150
            before = snapshot(s)
            with pytest.raises(ClockError, match=r"conformer_att.*200.*180.*position table") as err:
                s.speak(tokens_for(2, 25))
            assert err.value.session_usable is False and same_state(before, snapshot(s))
    t2w = model.t2w
    t2w.set_stream_cache(model.prompt.key)
    t2w.stream(tokens_for(0, 28), model.prompt.key)
    with pytest.raises(RuntimeError, match="size|shape|dimension"):
        t2w.stream(tokens_for(1, 28), model.prompt.key)


def test_bad_input_leaves_state_unchanged(model):
    for spec, match in (({"cadence": {"graphs": "dit+hift"}}, "graphs"), ({"cadence": {"noise": "host"}}, "noise")):
        with pytest.raises(ValueError, match=match):            # the DiT and HiFT are always routed steps now
            fh.new_session(model, "cadence", spec)
    with fh.new_session(model, "cadence") as cad:
        with pytest.raises(InputError, match="no open turn"):
            cad.speak([1, 2, 3])
        cad.start_turn()
        cad.speak(tokens_for(0, 20))
        before = snapshot(cad)
        for bad, what in (([1, 6561], r"tokens\[1\].*6561"), ([1, "x"], r"tokens\[1\]"), (list(range(26)), "at most 25")):
            with pytest.raises(InputError, match=what):
                cad.speak(bad)
            assert same_state(before, snapshot(cad))


def test_a_unit_refused_while_another_thread_holds_the_generator_changes_nothing(runs, model):
    """A Step-Audio 2 unit asked for while another thread holds the generator lock (a session drawing, a model
    being built) is refused with ConcurrencyError before anything runs, in both modes: state, clocks and
    generator as they were, and once the lock is free the same unit gives the bytes of a session never refused."""
    from duplexcadence import rng as rng_mod
    from duplexcadence.errors import ConcurrencyError
    from threaded import Held
    for mode in fh.MODES:
        with fh.new_session(model, mode) as s:
            s.start_turn()
            first = s.speak(tokens_for(0, 16))
            before = snapshot(s)
            holder = Held(lambda: rng_mod.LOCK)
            assert holder.entered.wait(10)
            try:
                with pytest.raises(ConcurrencyError, match="another thread holds it"):
                    s.speak(tokens_for(1, 25))
                assert same_state(before, snapshot(s))
            finally:
                holder.let_go()
                holder.thread.join(10)
            again = s.speak(tokens_for(1, 25))
        for unit, (a, b) in enumerate(((first, runs[mode][0]), (again, runs[mode][1]))):
            compare_units(f"stepaudio2-reduced {mode}", unit, a, b)


def test_negative_controls_fail_the_check(runs, model):
    """The check can fail: (a) one corrupted conformer frame in the arena changes later units (the region is
    really read); (b) a session whose generator is seeded otherwise gives other HiFT noise."""
    ref = runs["stock"]
    with fh.new_session(model, "cadence") as bad:
        bad.start_turn()
        outs = [bad.speak(tokens_for(0, 16)), bad.speak(tokens_for(1, 25))]
        bad.state()["conformer_att"][:, :, :, 3].add_(1.0)
        outs.append(bad.speak(tokens_for(2, 25)))
    compare_units("stepaudio2-reduced", 1, ref[1], outs[1])
    with pytest.raises(BitMismatch, match="unit 2"):
        compare_units("stepaudio2-reduced", 2, ref[2], outs[2])
    with fh.new_session(dataclasses.replace(model, seed=model.seed + 1), "cadence") as other:
        other.start_turn()
        other.speak(tokens_for(0, 16))
        with pytest.raises(BitMismatch, match="unit 1"):
            compare_units("stepaudio2-reduced", 1, ref[1], other.speak(tokens_for(1, 25)))


def test_one_token_flush_refused_in_both_modes_before_any_change(model):
    """A turn whose final call would stream 1 token: upstream's conformer conv cache comes out 5 frames wide and its
    next call fails its assertion (upsample_encoder_v2.py L425; control on the stock driver itself). Both modes
    refuse the unit with InputError, state, clocks and generator as before, and speak on."""
    for mode in fh.MODES:
        with fh.new_session(model, mode) as s:
            s.start_turn()
            before = snapshot(s)
            with pytest.raises(InputError, match="1 token"):
                s.speak([7], final=True)
            assert same_state(before, snapshot(s))
            assert s.speak(tokens_for(0, 3), final=True).info["calls"] == [3]
    t2w = model.t2w
    t2w.set_stream_cache(model.prompt.key)
    t2w.stream([7], model.prompt.key, last_chunk=True)
    with pytest.raises(AssertionError):
        t2w.stream(tokens_for(1, 28), model.prompt.key)


@pytest.mark.parametrize("n", [2, 3])
def test_call_after_a_short_first_flush_refused_in_both_modes(model, n):
    """A session whose first call flushes 2 or 3 tokens caches 960 n speech samples, fewer than the 3840-sample
    cross-fade (upstream's fade then fails on the next call): both modes give the same bytes for the flush and
    refuse the next call with LimitError (session_usable False: every later call fails the same way), state and
    clocks unchanged, the refusal repeated. With 4 tokens (3840 samples) both speak on."""
    outs = {}
    for mode in fh.MODES:
        with fh.new_session(model, mode) as s:
            s.start_turn()
            outs[mode] = s.speak([7] * n, final=True)
            s.start_turn()
            s.speak(tokens_for(1, 25))
            before = snapshot(s)
            for _ in range(2):
                with pytest.raises(LimitError, match=f"{960 * n} samples.*cannot speak again") as err:
                    s.speak(tokens_for(2, 3))
                assert err.value.session_usable is False and same_state(before, snapshot(s))
    compare_units("stepaudio2-short-flush", 0, outs["stock"], outs["cadence"])
    with fh.new_session(model, "cadence") as ok:
        ok.start_turn()
        ok.speak([7] * 4, final=True)
        ok.start_turn()
        ok.speak(tokens_for(1, 25))
        assert ok.speak(tokens_for(2, 3)).info["calls"] == [28]


def test_device_constants_one_copy_per_content():
    """`DeviceConstants` on the meta device: equal content gives the same cached copy, other content or
    arguments another; CPU->CPU passes through."""
    cache = {}
    with DeviceConstants(cache):
        a, b, c = torch.arange(3.).to("meta"), torch.arange(3.).to("meta"), torch.arange(4.).to("meta")
        d, e = torch.arange(3.).to("meta", torch.float64), torch.arange(3.).to(torch.float64)
        h = torch.FloatTensor([[range(1, 10)]]).to(torch.device("meta"))   # layers.py L366's expression
    assert a is b and a is not c and d.dtype == torch.float64 and d is not a
    assert e.device.type == "cpu" and h.shape == (1, 1, 9) and len(cache) == 4


def test_cadence_only_process_frees_the_stock_buffers_and_stays_bit_exact(runs):
    released = reduced_model("stepaudio2", n_timesteps=STEPS)
    buf = released.t2w.flow.decoder.att_cache_buffer
    assert fh.for_mode(released, "cadence")["stock_buffers_released_bytes"] >= buf.numel() * buf.element_size()
    with pytest.raises(InputError, match="released"):
        fh.new_session(released, "stock")
    with fh.new_session(released, "cadence") as cad:
        for unit, (a, b) in enumerate(zip(runs["stock"], run(cad))):
            compare_units("stepaudio2-reduced-released-buffers", unit, a, b)


@pytest.mark.released
def test_released_config_three_units_bit_exact():
    """The released flow (6 + 4 conformer blocks, 16-layer DiT) and HiFT (HiFTGenerator() defaults) on three units
    (no call; the first 28-token call; a 3-token flush), 1 Euler step to keep the CPU time down."""
    m = fh.build_model({"variant": "stepaudio2", "n_timesteps": 1, "voice_prompt": str(VOICE), "prompt_seconds": 2.0},
                       depth="released", seed=0)
    assert len(m.t2w.flow.encoder.encoders) == 6 and len(m.t2w.flow.decoder.estimator.blocks) == 16
    units = [[25, 3, 0]]
    with fh.new_session(m, "stock") as s:
        a = run(s, units)
    with fh.new_session(m, "cadence") as s:
        b = run(s, units)
    assert [o.info["calls"] for o in a] == [[], [28], [3]]
    for unit, (x, y) in enumerate(zip(a, b)):
        compare_units("stepaudio2-released", unit, x, y)
    assert a[1].waveform.std() > 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_prepared_graphs_replay_every_step_bit_exact_with_equal_generator_state():
    """On CUDA: prepare(None) captures the steady set and an oracle prepare the rest of TURNS' signatures, neither
    changing state, clocks or the generator; then every step of every unit replays (replays per unit = the steps
    the clocks predict; no capture, warm-up or eager fallback inside a unit), every unit's bytes and the
    generator state after it equal stock's."""
    m = reduced_model("stepaudio2", device="cuda", n_timesteps=STEPS)
    rng = []
    with fh.new_session(m, "stock") as s:
        ref = run(s, observe=lambda s, u: rng.append(s.state()["generator"].clone()))
    with fh.new_session(m, "cadence") as cad:
        before = snapshot(cad)
        done = cad.prepare()
        assert done["captures"] == len(plan.steady_signatures(cad.clocks())) and same_state(before, snapshot(cad))
        oracle = fh.oracle_prepare(cad, TURNS)
        assert oracle["capture_failures"] == 0 and same_state(before, snapshot(cad))
        outs, unit = [], 0
        for turn in TURNS:
            cad.start_turn()
            for i, n in enumerate(turn):
                final = i == len(turn) - 1
                was, sigs = cad.stats(), cad.signatures(n, final)
                outs.append(cad.speak(tokens_for(unit, n), final=final))
                now = cad.stats()
                assert (now.captures - was.captures, now.warmup_runs - was.warmup_runs, now.eager_runs - was.eager_runs,
                        now.eager_fallbacks - was.eager_fallbacks, now.replays - was.replays) == (0, 0, 0, 0, len(sigs))
                assert torch.equal(cad.state()["generator"], rng[unit]), unit
                unit += 1
    for unit, (a, b) in enumerate(zip(ref, outs)):
        compare_units("stepaudio2-reduced-cuda", unit, a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_prepare_waits_for_the_generator_lock_another_thread_holds():
    """A capture of a step that draws registers the default generator: prepare waits while another thread holds
    the generator lock (a session swapping its state in), captures once it is released, and the graphs then give
    stock's bytes."""
    import threading

    from duplexcadence import rng as rng_mod

    m = reduced_model("stepaudio2", device="cuda", n_timesteps=STEPS)
    with fh.new_session(m, "stock") as s:
        ref = run(s, turns=TURNS[:1])
    with fh.new_session(m, "cadence") as cad:
        holding, release, done = threading.Event(), threading.Event(), []

        def holder():
            with rng_mod.LOCK:
                holding.set()
                release.wait(30)

        t = threading.Thread(target=holder, daemon=True)
        t.start()
        assert holding.wait(30)
        p = threading.Thread(target=lambda: done.append(cad.prepare()), daemon=True)
        p.start()
        p.join(0.5)
        assert p.is_alive() and done == []                  # waits for the lock, captures nothing meanwhile
        release.set()
        t.join(30), p.join(120)
        assert done and done[0]["captures"] > 0 and done[0]["capture_failures"] == 0
        outs = run(cad, turns=TURNS[:1])
    for unit, (a, b) in enumerate(zip(ref, outs)):
        compare_units("stepaudio2-reduced-cuda", unit, a, b)
