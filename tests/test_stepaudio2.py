"""Step-Audio 2 mini tail: DuplexCadence vs the upstream-driver stock session on the CPU (eager cadence path:
arena views, a KeepAll conformer region growing at a stable address, in-place estimator trim, HiFT caches
in the arena). Any differing byte on any unit fails, naming the unit. Stock and cadence sessions run one
after the other on one model; each seeds the default generator when it opens (the HiFT draws from it)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from torch_threads import torch_threads  # noqa: E402  (tests/ is on sys.path under pytest)
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters import stepaudio2 as sa  # noqa: E402
from duplexcadence.clocks import ClockError, KeepAll  # noqa: E402
from duplexcadence.errors import InputError  # noqa: E402
from duplexcadence.runtime import BitMismatch, compare_units  # noqa: E402

VOICE = Path(__file__).resolve().parents[1] / "workloads" / "data" / "voice_prompts" / \
    "librispeech_8297-275156-0011_24k.wav"
STEPS = 2
# Three turns on the same caches (upstream never resets them). Calls (tokens, last_chunk):
# turn 0: -, 28 (the session's first call: no HiFT history), 28 (DiT cache ramps P -> P+100), 28 (DiT cache
#         steady at P+100), 28 + flush 6 (two calls in one unit); turn 1: flush 2 (fewer than the 3-token
#         lookahead); turn 2: flush 19 (no regular call in the turn).
TURNS = [[16, 25, 25, 25, 15], [2], [9, 10]]
EXPECTED_CALLS = [[], [28], [28], [28], [28, 6], [2], [], [19]]


def tokens_for(unit: int, n: int) -> list[int]:
    return torch.randint(0, fh.VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(2000 + unit)).tolist()


def script(turns=TURNS):
    unit = 0
    for t, turn in enumerate(turns):
        for i, n in enumerate(turn):
            yield t, unit, tokens_for(unit, n), i == len(turn) - 1
            unit += 1


def run(session, turns=TURNS, observe=None):
    outs, open_turn = [], None
    for t, unit, toks, final in script(turns):
        if t != open_turn:
            session.start_turn()
            open_turn = t
        outs.append(session.speak(toks, final=final))
        if observe:
            observe(session, unit)
        if final:
            open_turn = None
    return outs


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    with torch_threads(2):      # this module's tests at 2 intra-op threads; the count before is back after
        yield


@pytest.fixture(scope="module")
def model():
    return fh.build_model({"variant": "stepaudio2", "n_timesteps": STEPS, "voice_prompt": str(VOICE),
                           "prompt_seconds": 2.0}, depth="reduced", seed=0)


@pytest.fixture(scope="module")
def runs(model):
    """Stock then cadence over TURNS; the cadence run records its region addresses and clocks per unit."""
    stock = fh.new_session(model, "stock")          # through flow_hift, as the suite's runner opens it
    assert isinstance(stock, sa.StockSession)
    stock_rng = []
    stock_out = run(stock, observe=lambda s, unit: stock_rng.append(torch.get_rng_state()))
    seen = []

    def observe(s, unit):
        seen.append({"ptrs": {n: r.data_ptr() for n, r in s.arena.regions.items()},
                     "conf_ptr": s.conformer_view(s.len_conf).data_ptr(), "len_conf": s.len_conf,
                     "len_est": s.len_est, "mapped": s.arena.bytes_mapped})

    cad = fh.new_session(model, "cadence")
    cad_out = run(cad, observe=observe)
    return {"stock": stock, "cadence": cad, "stock_out": stock_out, "cad_out": cad_out, "seen": seen,
            "stock_rng": stock_rng}


def test_plan_calls_follows_the_upstream_buffer_loop():
    """ex L20-27: stream buffer[:28] while >= 28 are buffered, keep buffer[25:], flush a non-empty rest."""
    calls, rest = sa.plan_calls([], list(range(25)), False)
    assert calls == [] and rest == list(range(25))
    calls, rest = sa.plan_calls(rest, list(range(25, 50)), False)
    assert [c.tokens for c in calls] == [list(range(28))] and rest == list(range(25, 50))
    calls, rest = sa.plan_calls(rest, [1, 2, 3], True)
    assert [(len(c.tokens), c.last_chunk) for c in calls] == [(28, False), (3, True)] and rest == []
    assert sa.plan_calls([], [], True) == ([], [])          # nothing buffered: no flush call (ex L26)
    assert [len(c.tokens) for c in sa.plan_calls([], list(range(60)), False)[0]] == [28, 28]


def test_released_regions_and_hift_config():
    sa.check_hift_config()                                   # HIFT_CONFIG == HiFTGenerator() defaults (t2w L45)
    specs = {r.name: r for r in sa.regions(258)}
    assert specs["conformer_att"].policy == KeepAll(sa.POSITION_TABLE)
    assert specs["estimator_att"].policy.bound() == 258 + 100 + 54
    assert specs["conformer_att"].step(4950, 50) == (5000, 5000)
    with pytest.raises(ClockError, match="conformer_att.*5002.*5000"):
        specs["conformer_att"].step(4950, 52)


def test_multi_turn_bit_exact_every_call_kind(runs, model):
    """Every unit's float32 waveform and int16 PCM byte-identical; the calls cover the first call, the DiT
    ramp and steady lengths, flushes of 19, 2 and 7 tokens and units without a call."""
    assert [o.info["calls"] for o in runs["stock_out"]] == EXPECTED_CALLS
    for unit, (a, b) in enumerate(zip(runs["stock_out"], runs["cad_out"])):
        compare_units("stepaudio2-reduced", unit, a, b)
        assert a.info == b.info
        if a.info["calls"]:
            assert a.samples > 0 and a.waveform.std() > 1e-4
        else:
            assert a.samples == 0
    # first call: 50 frames - 3840 held back; a steady call 24 000; flush n: all of (8 + 2n) frames
    assert [o.samples for o in runs["stock_out"]][1:3] == [20160, 24000]
    assert runs["stock_out"][5].samples == (8 + 4) * 480 and runs["stock_out"][7].samples == (8 + 38) * 480
    P = model.prompt.mel_frames
    lens = [s["len_est"] for s in runs["seen"]]
    assert lens[:4] == [P, P + 50, P + 100, P + 100]          # DiT cache: ramp, then steady (trimmed)


def test_conformer_region_grows_at_a_stable_address_and_matches_stock(runs, model):
    """KeepAll: +2(n-3) frames per call, never trimmed, at one address for the whole session; every region
    keeps its address; the final state equals stock's caches byte for byte."""
    seen, P = runs["seen"], model.prompt.mel_frames
    expect, L = [], P
    for calls in EXPECTED_CALLS:
        L += sum(sa.mel_advance(n, n != 28) for n in calls)     # 28-token calls are the non-final ones
        expect.append(L)
    assert [s["len_conf"] for s in seen] == expect and expect[-1] > P + 100 + 54
    assert len({s["conf_ptr"] for s in seen}) == 1
    assert all(s["ptrs"] == seen[0]["ptrs"] for s in seen)
    cad, stock = runs["cadence"], runs["stock"]
    state, caches = cad.state_tensors(), stock.caches
    assert torch.equal(state["conformer_att"], caches["conformer_att_cache"])
    assert torch.equal(state["estimator_att"], caches["estimator_att_cache"][:STEPS])
    assert torch.equal(state["conformer_cnn"], caches["conformer_cnn_cache"])
    for k in ("mel", "source", "speech"):
        assert torch.equal(state[f"hift_{k}"], stock._hift_cache[k])
    st = cad.stats()
    assert st["arena_bytes_reserved"] >= cad.arena["conformer_att"].nbytes > 0
    assert st["conformer_frames"] == expect[-1] and st["position_limit"] == sa.POSITION_TABLE


def _snapshot(s):
    return ({k: v.clone() for k, v in s.state_tensors().items()}, s.len_conf, s.len_est, dict(s.hift_len),
            list(s.buffer) if s.buffer is not None else None, s.calls_made, torch.get_rng_state())


def _same(a, b):
    assert a[1:6] == b[1:6]
    assert torch.equal(a[6], b[6])
    assert a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0])


def test_position_table_limit_rejected_before_any_change(model, monkeypatch):
    """With the encoder's table cut to 180 positions (same values as max_len=180), the second 28-token call
    would read 200: cadence raises ClockError naming the region, bound and value, with its state, buffer,
    clocks and generator untouched; the stock driver breaks inside the encoder on the same unit."""
    pos = model.t2w.flow.encoder.embed.pos_enc
    pe, c = pos.pe, pos.pe.size(1) // 2
    limit = 180
    monkeypatch.setattr(pos, "pe", pe[:, c - (limit - 1): c + limit])
    assert sa.position_limit(model.t2w.flow) == limit
    # a 28-token call at unit 1 (L = 100 -> 150); the one at unit 2 would reach 200.
    cad = sa.new_session(model, "cadence")
    cad.start_turn()
    for unit in range(2):
        cad.speak(tokens_for(unit, 25))
    assert cad.len_conf == 150
    before = _snapshot(cad)
    with pytest.raises(ClockError, match=r"conformer_att.*200.*180.*position table"):
        cad.speak(tokens_for(2, 25))
    _same(before, _snapshot(cad))
    stock = sa.new_session(model, "stock")
    stock.start_turn()
    for unit in range(2):
        stock.speak(tokens_for(unit, 25))
    with pytest.raises(RuntimeError, match="size|shape|dimension"):
        stock.speak(tokens_for(2, 25))


def test_bad_input_leaves_state_unchanged(model):
    cad = sa.new_session(model, "cadence")
    with pytest.raises(InputError, match="no open turn"):
        cad.speak([1, 2, 3])
    cad.start_turn()
    cad.speak(tokens_for(0, 20))
    before = _snapshot(cad)
    for bad, what in (([1, 6561], r"tokens\[1\].*6561"), ([1, "x"], r"tokens\[1\]"), (list(range(51)), "at most 50")):
        with pytest.raises(InputError, match=what):
            cad.speak(bad)
        _same(before, _snapshot(cad))
    cad.speak(tokens_for(1, 5), final=True)               # between turns: the caches carry over
    before = _snapshot(cad)
    clocks = (cad.len_conf, cad.len_est, cad.calls_made, cad.buffer, cad.turn)
    with pytest.raises(InputError, match="prepare"):      # inherited prepare() cleared the host clocks
        cad.prepare(1, 1)
    _same(before, _snapshot(cad))
    assert (cad.len_conf, cad.len_est, cad.calls_made, cad.buffer, cad.turn) == clocks
    for s in (cad, sa.new_session(model, "stock")):
        s.close()
        with pytest.raises(InputError, match="closed"):
            s.start_turn()


def test_negative_controls_fail_the_check(runs, model):
    """The check can fail: (a) one corrupted conformer frame in the arena changes later units (the region
    is really read); (b) a session whose generator starts elsewhere gives different HiFT noise."""
    ref = runs["stock_out"]
    bad = sa.new_session(model, "cadence")
    bad.start_turn()
    outs = [bad.speak(tokens_for(0, 16)), bad.speak(tokens_for(1, 25))]
    with torch.inference_mode():
        bad.conformer_view(bad.len_conf)[:, :, :, 3].add_(1.0)
    outs.append(bad.speak(tokens_for(2, 25)))
    compare_units("stepaudio2-reduced", 1, ref[1], outs[1])
    with pytest.raises(BitMismatch, match="unit 2"):
        compare_units("stepaudio2-reduced", 2, ref[2], outs[2])
    from duplexcadence.adapters.stepaudio2_cadence import CadenceSession
    other = CadenceSession(model.t2w, model.prompt, rng_seed=model.rng_seed + 1)
    other.start_turn()
    other.speak(tokens_for(0, 16))
    with pytest.raises(BitMismatch, match="unit 1"):
        compare_units("stepaudio2-reduced", 1, ref[1], other.speak(tokens_for(1, 25)))


def test_released_config_three_units_bit_exact():
    """The released flow (6+4 conformer blocks, 16-layer DiT) and HiFT (HiFTGenerator() defaults) on three
    units (no call; the first 28-token call; a 3-token flush), 1 Euler step to keep the CPU time down."""
    m = fh.build_model({"variant": "stepaudio2", "n_timesteps": 1, "voice_prompt": str(VOICE),
                        "prompt_seconds": 2.0}, depth="released", seed=0)
    assert len(m.t2w.flow.encoder.encoders) == 6 and len(m.t2w.flow.decoder.estimator.blocks) == 16
    units = [[25, 3, 0]]
    a, b = run(sa.new_session(m, "stock"), units), run(sa.new_session(m, "cadence"), units)
    assert [o.info["calls"] for o in a] == [[], [28], [3]]
    for unit, (x, y) in enumerate(zip(a, b)):
        compare_units("stepaudio2-released", unit, x, y)
    assert a[1].waveform.std() > 1e-4


def test_graphed_decoder_routing_is_bit_exact_on_cpu(runs, model, monkeypatch):
    """The graphs=True path's routing of `decoder.forward_chunk` (static input buffers, keyword call, DiT
    signature) run eagerly on the CPU: same bytes as stock; signatures are (mel frames, DiT length)."""
    cad = sa.new_session(model, "cadence")
    sigs = []
    monkeypatch.setattr(cad.graphs, "enabled", True)
    monkeypatch.setattr(cad.graphs, "run", lambda sig, step: (sigs.append(sig), step())[1])
    cad.start_turn()
    outs = [cad.speak(tokens_for(0, 16)), cad.speak(tokens_for(1, 25))]
    compare_units("stepaudio2-reduced", 1, runs["stock_out"][1], outs[1])
    assert sigs == [("dit", 50, model.prompt.mel_frames, STEPS)]
    assert "forward_chunk" not in vars(model.t2w.flow.decoder)      # the stock method is back


def test_dit_hift_mode_eager_path_bit_exact_with_equal_generator_state(runs, model, monkeypatch):
    """graphs="dit+hift" on the CPU runs its routing eagerly (static HiFT input in the arena, `_istft`
    patched for the step, magnitude/phase/source tail written to arena regions, stock istft after): every
    unit's bytes equal stock's and the default generator (the HiFT's rand/randn draws) is in the same state
    after every unit; signatures carry every length; the stock methods are back after each step."""
    from duplexcadence.adapters.stepaudio2_cadence import CadenceSession
    with pytest.raises(ValueError, match="graphs"):
        CadenceSession(model.t2w, model.prompt, graphs="hift")
    assert "hift_in_mel" not in runs["cadence"].arena.regions        # default mode: no extra regions
    cad = sa.new_session(model, "cadence", {"cadence": {"graphs": "dit+hift"}})
    assert cad.graph_mode == "dit+hift" and not cad.graphs.enabled   # CPU: the same routing, eagerly
    sigs, run_graph = [], cad.graphs.run
    monkeypatch.setattr(cad.graphs, "run", lambda sig, step: (sigs.append(sig), run_graph(sig, step))[1])
    rng = []
    outs = run(cad, observe=lambda s, unit: rng.append(torch.get_rng_state()))
    for unit, (a, b) in enumerate(zip(runs["stock_out"], outs)):
        compare_units("stepaudio2-reduced-dit+hift", unit, a, b)
        assert torch.equal(runs["stock_rng"][unit], rng[unit]), f"unit {unit}: generator state differs"
    hift = [s for s in sigs if s[0] == "hift"]
    P = model.prompt.mel_frames
    assert hift == [("hift", 50, 0, 0, 3840), ("hift", 58, 8, 3840, 3840), ("hift", 58, 8, 3840, 3840),
                    ("hift", 58, 8, 3840, 3840), ("hift", 20, 8, 3840, 3840), ("hift", 12, 8, 3840, 3840),
                    ("hift", 46, 8, 3840, 3840)]
    assert [s for s in sigs if s[0] == "dit"][:3] == [("dit", 50, P, STEPS), ("dit", 50, P + 50, STEPS),
                                                      ("dit", 50, P + 100, STEPS)]
    assert cad.stats()["eager_runs"] == len(sigs) and cad.stats()["captures"] == 0
    assert "_istft" not in vars(model.t2w.hift) and "forward_chunk" not in vars(model.t2w.flow.decoder)
    state, stock = cad.state_tensors(), runs["stock"]
    for k in ("mel", "source", "speech"):
        assert torch.equal(state[f"hift_{k}"], stock._hift_cache[k])
    assert torch.equal(state["conformer_att"], stock.caches["conformer_att_cache"])
    cad.close()


def test_device_constants_one_copy_per_content():
    """`_DeviceConstants` (the HiFT step's stand-in for constant host-to-device copies) on the meta device:
    equal content gives the same cached copy, other content or arguments another; CPU->CPU passes through."""
    from duplexcadence.adapters.stepaudio2_cadence import _DeviceConstants
    cache = {}
    with _DeviceConstants(cache):
        a = torch.arange(3.).to("meta")
        b = torch.arange(3.).to("meta")
        c = torch.arange(4.).to("meta")
        d = torch.arange(3.).to("meta", torch.float64)
        e = torch.arange(3.).to(torch.float64)
        h = torch.FloatTensor([[range(1, 10)]]).to(torch.device("meta"))   # layers.py L366's expression
    assert a is b and a is not c and d.dtype == torch.float64 and d is not a
    assert e.device.type == "cpu" and h.shape == (1, 1, 9) and len(cache) == 4


def test_cadence_only_process_frees_the_stock_buffers_and_stays_bit_exact(runs):
    """flow_hift.for_mode(model, "cadence") frees the stock 16-step DiT buffers of a Step-Audio 2 model (each
    cadence session runs its set-up on its arena views); a cadence session on that model gives the same
    bytes as stock on an untouched model; a stock session on it is refused."""
    released = fh.build_model({"variant": "stepaudio2", "n_timesteps": STEPS, "voice_prompt": str(VOICE),
                               "prompt_seconds": 2.0}, depth="reduced", seed=0)
    buf = released.t2w.flow.decoder.att_cache_buffer
    done = fh.for_mode(released, "cadence")
    assert done["stock_buffers_released_bytes"] >= buf.numel() * buf.element_size()
    assert released.t2w.flow.decoder.att_cache_buffer.stride() == (0,) * buf.ndim
    with pytest.raises(RuntimeError, match="released"):
        fh.new_session(released, "stock")
    outs = run(fh.new_session(released, "cadence"))
    for unit, (a, b) in enumerate(zip(runs["stock_out"], outs)):
        compare_units("stepaudio2-reduced-released-buffers", unit, a, b)


def test_rehearse_hits_the_live_signatures_and_leaves_no_trace(runs, model, monkeypatch):
    """`rehearse(turns)` runs the script's turn shapes in order from the session's state and puts its
    snapshot back: the signatures it reaches are exactly those the live turns reach (so on CUDA every graph
    is captured before the cadence), and afterwards every unit's bytes and the generator state after every
    unit equal stock's. Negative control: the same synthetic turns without the restore change the bytes."""
    cad = sa.new_session(model, "cadence", {"cadence": {"graphs": "dit+hift"}})
    sigs, run_graph = [], cad.graphs.run
    monkeypatch.setattr(cad.graphs, "run", lambda sig, step: (sigs.append(sig), run_graph(sig, step))[1])
    before = _snapshot(cad)
    ptrs = {n: r.data_ptr() for n, r in cad.arena.regions.items()}
    done = cad.rehearse(TURNS)
    _same(before, _snapshot(cad))
    assert {n: r.data_ptr() for n, r in cad.arena.regions.items()} == ptrs
    assert done["turns"] == TURNS and done["frozen"] is False and done["eager_runs"] == len(sigs) > 0
    rehearsed, sigs[:] = list(sigs), []
    rng = []
    outs = run(cad, observe=lambda s, unit: rng.append(torch.get_rng_state()))
    assert sigs == rehearsed
    for unit, (a, b) in enumerate(zip(runs["stock_out"], outs)):
        compare_units("stepaudio2-reduced-rehearsed", unit, a, b)
        assert torch.equal(runs["stock_rng"][unit], rng[unit]), f"unit {unit}: generator state differs"
    cad.close()
    # negative control: the same turns spoken for real (no snapshot restored) leave their trace
    dirty = sa.new_session(model, "cadence", {"cadence": {"graphs": "dit+hift"}})
    gen = torch.Generator().manual_seed(1)
    for counts in TURNS:
        dirty.start_turn()
        for k, n in enumerate(counts):
            dirty.speak(torch.randint(0, fh.VOCAB_SIZE, (n,), generator=gen).tolist(), final=k == len(counts) - 1)
    with pytest.raises(BitMismatch):
        for unit, (a, b) in enumerate(zip(runs["stock_out"], run(dirty))):
            compare_units("stepaudio2-reduced-not-restored", unit, a, b)


def test_rehearse_bad_input_and_clock_error_leave_state_unchanged(model, monkeypatch):
    cad = sa.new_session(model, "cadence")
    before = _snapshot(cad)
    for bad, kw, what in (([], {}, "turns"), ([[]], {}, "turns"), ([[3, -1]], {}, "turns"), ("ab", {}, "turns"),
                          ([[3, True]], {}, "turns"), (None, {}, "turns"), (5, {}, "turns"), ([5], {}, "turns"),
                          ([[25, 25, 25, 51]], {}, "turns"), ([[1]], {}, "turns"), ([[0, 1]], {}, "turns"),
                          ([[2], [25, 3]], {}, "turns"),
                          (TURNS, {"passes": 0}, "passes"),
                          (TURNS, {"freeze": "no"}, "freeze")):
        with pytest.raises(ValueError, match=what):
            cad.rehearse(bad, **kw)
        _same(before, _snapshot(cad))
    cad.start_turn()
    cad.speak(tokens_for(0, 20))
    before = _snapshot(cad)
    with pytest.raises(InputError, match="turn is open"):
        cad.rehearse(TURNS)
    _same(before, _snapshot(cad))
    cad.speak(tokens_for(1, 5), final=True)
    cad.close()
    with pytest.raises(InputError, match="closed"):
        cad.rehearse(TURNS)
    # a rehearsed turn past the position table (cut to 180): ClockError, with the snapshot put back first
    pos = model.t2w.flow.encoder.embed.pos_enc
    pe, c = pos.pe, pos.pe.size(1) // 2
    monkeypatch.setattr(pos, "pe", pe[:, c - 179: c + 180])
    cad = sa.new_session(model, "cadence")
    cad.start_turn()
    cad.speak(tokens_for(0, 25), final=True)
    before = _snapshot(cad)
    with pytest.raises(ClockError, match="conformer_att"):
        cad.rehearse([[25, 25, 25, 25, 0]])
    _same(before, _snapshot(cad))


def test_one_token_flush_refused_before_any_change(model):
    """A turn whose final call would stream 1 token: upstream's conformer conv cache comes out 5 frames wide
    and stock's next call fails its assertion (upsample_encoder_v2.py L425); DuplexCadence refuses the unit
    with InputError and its state, clocks and generator are as before (it then speaks on, as stock's
    session cannot)."""
    stock = sa.new_session(model, "stock")
    stock.start_turn()
    stock.speak([7], final=True)
    stock.start_turn()
    with pytest.raises(AssertionError):
        stock.speak(tokens_for(1, 25) + tokens_for(2, 3))
    cad = sa.new_session(model, "cadence")
    cad.start_turn()
    before = _snapshot(cad)
    with pytest.raises(InputError, match="1 token"):
        cad.speak([7], final=True)
    _same(before, _snapshot(cad))
    out = cad.speak(tokens_for(0, 3), final=True)         # the same open turn, flushed with 3 tokens
    assert out.info["calls"] == [3] and out.samples > 0


@pytest.mark.parametrize("n", [2, 3])
def test_call_after_a_short_first_flush_refused_before_any_change(model, n):
    """A session whose first vocoder call flushes 2 or 3 tokens caches 960 n speech samples, fewer than the
    3840-sample cross-fade: stock gives that unit's audio and then fails inside the fade on its next call;
    DuplexCadence gives the same bytes for the flush unit and refuses the next call with InputError, its
    state, clocks and generator as before. With 4 tokens (3840 samples) both speak on."""
    stock = sa.new_session(model, "stock")          # each session seeds the default generators when it opens
    stock.start_turn()
    ref = stock.speak([7] * n, final=True)
    stock.start_turn()
    with pytest.raises(RuntimeError, match="size"):
        stock.speak(tokens_for(1, 25) + tokens_for(2, 3))
    cad = sa.new_session(model, "cadence")
    cad.start_turn()
    compare_units("stepaudio2-short-flush", 0, ref, cad.speak([7] * n, final=True))
    cad.start_turn()
    before = _snapshot(cad)
    with pytest.raises(InputError, match=f"{960 * n} samples"):
        cad.speak(tokens_for(1, 25) + tokens_for(2, 3))
    _same(before, _snapshot(cad))
    ok = sa.new_session(model, "cadence")
    ok.start_turn()
    ok.speak([7] * 4, final=True)
    ok.start_turn()
    assert ok.speak(tokens_for(1, 25) + tokens_for(2, 3)).info["calls"] == [28]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_rehearsal_captures_every_live_graph_and_keeps_the_bytes():
    """On CUDA (graphs "dit+hift"): after `rehearse(TURNS, freeze=True)` the live turns run with no
    first-occurrence eager step, no capture and no eager fallback (every step a replay), and every unit's
    bytes equal a stock session's on the same model. (Written for the GPU; not yet run there.)"""
    m = fh.build_model({"variant": "stepaudio2", "n_timesteps": STEPS, "voice_prompt": str(VOICE),
                        "prompt_seconds": 2.0}, depth="reduced", seed=0, device="cuda")
    ref = run(sa.new_session(m, "stock"))
    cad = sa.new_session(m, "cadence", {"cadence": {"graphs": "dit+hift"}})
    done = cad.rehearse(TURNS, freeze=True)
    assert done["frozen"] and done["captures"] > 0
    before = cad.stats()
    outs = run(cad)
    after = cad.stats()
    assert {k: after[k] - before[k] for k in ("captures", "warmup_runs", "eager_runs", "eager_fallbacks")} == \
        {"captures": 0, "warmup_runs": 0, "eager_runs": 0, "eager_fallbacks": 0}
    assert after["replays"] > before["replays"]
    for unit, (a, b) in enumerate(zip(ref, outs)):
        compare_units("stepaudio2-reduced-cuda-rehearsed", unit, a, b)
