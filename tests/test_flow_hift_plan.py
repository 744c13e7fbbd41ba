"""The clocks make the keys (flow_hift.plan): walking the workloads' real session script (its turns' token counts),
for both variants, the signatures the ClockState predicts for every unit are the ones the cadence session's steps
ran with (recorded through its GraphCache), the region lengths it predicts after every call are the stock caches'
lengths (read from the stock tensors' shapes), and every unit's bytes and regions equal stock's."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from reduced_flow_hift import reduced_model  # noqa: E402  (tests/ is on sys.path under pytest)
from session_state import snapshot  # noqa: E402
from torch_threads import two_threads  # noqa: E402, F401  (autouse: this module's tests at two intra-op threads)
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.flow_hift import facts, plan  # noqa: E402
from duplexcadence.runtime import compare_units  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "workloads" / "data" / "sessions" / "flow_hift.jsonl"


def script_turns() -> list[list[list[int]]]:
    """The script's SPEAK units as turns of token-id lists (read directly: one JSON object a line)."""
    turns: dict[int, list] = {}
    for line in SCRIPT.read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "SPEAK":
            turns.setdefault(row["turn"], []).append(row["tokens"])
    return [turns[k] for k in sorted(turns)]


def stock_lengths(variant: str, t2w) -> dict:
    """The stock caches' lengths now, from their tensor shapes (and BoundedVocoder's offsets)."""
    c, h = t2w.stream_cache, t2w.hift_cache_dict
    out = {"conformer_att": c["conformer_att_cache"].shape[3], "estimator_att": c["estimator_att_cache"].shape[4]}
    if variant == "minicpmo45":
        out.update(vocoder_mel=h["mel"].shape[-1], vocoder_source=h["source"].shape[-1] // facts.HOP_SAMPLES,
                   **{k: int(h[k]) for k in ("mel_offset", "source_offset", "source_end", "speech_offset")},
                   finalized=bool(h["finalized"]), first_chunk=bool(h["first_chunk"]))
    else:
        out.update(hift_mel=h["mel"].shape[-1], hift_source=h["source"].shape[-1], hift_speech=h["speech"].shape[-1])
    return out


@pytest.fixture(scope="module", params=facts.VARIANTS)
def walk(request):
    """Stock and cadence over the whole script on one model: per unit the predicted signatures, the signatures
    the cadence steps ran with, the predicted and the stock lengths after each call, both outputs and states."""
    variant = request.param
    model = reduced_model(variant)
    stock, cad = fh.new_session(model, "stock"), fh.new_session(model, "cadence")
    ran, calls_seen, stream = [], [], model.t2w.stream

    def recorded_run(sig, step):
        ran.append(sig)
        return run(sig, step)

    def recorded_stream(*args, **kwargs):
        out = stream(*args, **kwargs)
        calls_seen.append(stock_lengths(variant, model.t2w))
        return out

    run = cad.graphs.run
    cad.graphs.run = recorded_run
    model.t2w.stream = recorded_stream
    units, fresh = [], cad.clocks()
    try:
        for turn in script_turns():
            stock.start_turn()
            cad.start_turn()
            for k, tokens in enumerate(turn):
                final = k == len(turn) - 1
                predicted = cad.signatures(len(tokens), final)
                after = [c.after for c in stock.clocks().plan(len(tokens), final).calls]
                ran.clear()
                calls_seen.clear()
                a, b = stock.speak(tokens, final=final), cad.speak(tokens, final=final)
                units.append({"fresh": fresh, "predicted": predicted, "ran": list(ran), "after": after, "stock": list(calls_seen),
                              "outs": (a, b), "states": (snapshot(stock), snapshot(cad)),
                              "ptrs": {n: r.data_ptr() for n, r in cad.arena.regions.items()}})
    finally:
        del model.t2w.stream
    yield variant, units
    stock.close()
    cad.close()


def test_the_script_is_long_and_has_every_call_kind(walk):
    variant, units = walk
    assert len(units) >= 39
    sizes = {s.size for u in units for s in u["predicted"] if s.step in ("flow", "dit")}
    assert len(sizes) >= 6, sizes          # full calls and flushes of several sizes


def test_predicted_signatures_are_the_ones_the_steps_ran_with(walk):
    variant, units = walk
    steps = {"minicpmo45": {"flow", "vocoder"}, "stepaudio2": {"dit", "hift"}}[variant]
    for i, u in enumerate(units):
        assert u["predicted"] == u["ran"], f"{variant} unit {i}: predicted {u['predicted']} ran {u['ran']}"
    assert {s.step for u in units for s in u["ran"]} == steps
    assert len({s for u in units for s in u["ran"]}) > 10


def test_predicted_lengths_are_the_stock_caches_after_every_call(walk):
    variant, units = walk
    calls = 0
    for i, u in enumerate(units):
        assert len(u["after"]) == len(u["stock"]), f"unit {i}"
        for want, got in zip(u["after"], u["stock"]):
            assert {k: want[k] for k in got} == got, f"{variant} unit {i}: clocks {want}, stock caches {got}"
            calls += 1
    assert calls >= 35


def test_every_unit_and_region_equals_stock_and_no_region_moves(walk):
    variant, units = walk
    for i, u in enumerate(units):
        a, b = u["outs"]
        compare_units(f"{variant}-reduced", i, a, b)
        assert a.info == b.info
        if a.samples:
            assert a.waveform.std() > 1e-4
        s, c = u["states"]
        assert s["clocks"] == c["clocks"] and s["buffer"] == c["buffer"], f"unit {i}"
        for name, t in c.items():
            if torch.is_tensor(t):
                assert torch.equal(t, s[name]), f"{variant} unit {i}: region {name} differs from stock"
        assert u["ptrs"] == units[0]["ptrs"]


def test_steady_signatures_are_a_turn_start_ramp_and_steady_shape(walk):
    """prepare(None)'s set from a fresh session's clocks: the flow / DiT lengths P, P + 50, P + 100 of a turn's
    first full units, each once, and (a control) the steady unit's signatures are in it."""
    variant, units = walk
    fresh = units[0]["fresh"]
    P = fresh.host()["estimator_att"]
    sigs = plan.steady_signatures(fresh)
    dit = "flow" if variant == "minicpmo45" else "dit"
    assert [s.get("estimator_att") for s in sigs if s.step == dit] == [P, P + 50, P + 100]
    steady = [u["ran"] for u in units if [s.size for s in u["ran"] if s.step == dit] == [facts.CALL_TOKENS
              if variant == "minicpmo45" else 50]]
    assert steady and set(steady[-1]) <= set(sigs)
    assert len(set(sigs)) == len(sigs) and fresh.host() == units[0]["fresh"].host()      # walked a copy


@pytest.fixture(scope="module")
def vocoder_geometry():
    """The stock BoundedVocoder's sizes and limits (reduced depth: the released kernels, rates and history)."""
    from duplexcadence.adapters.flow_hift import build
    bv = build.build_token2wav(n_timesteps=2, depth=facts.REDUCED).bounded_vocoder
    return plan.geometry(bv), bv.limits


def long_script(seed: int, units: int) -> list[list[int]]:
    """Turns of 1-12 SPEAK units of 0-25 tokens each (every size, turns ending on any size), `units` in all."""
    gen, turns, total = torch.Generator().manual_seed(seed), [], 0
    while total < units:
        n = int(torch.randint(1, 13, (1,), generator=gen))
        turns.append(torch.randint(0, facts.MAX_UNIT_TOKENS + 1, (n,), generator=gen).tolist())
        total += n
    return turns


def test_vocoder_histories_never_outgrow_their_buffers_on_a_long_script(vocoder_geometry):
    """BoundedVocoder trims its mel / source histories every block, so no script can cross mel_buffer_frames
    (plan.VocoderClock asserts it, an invariant, not a caller's bound): walking 3,000 units of every size, the mel
    held at a block reaches the buffer exactly and never more, and after every block it is at most
    mel_cache_frames; the source history likewise. A bad trim would grow the history and fail here."""
    geo, limits = vocoder_geometry
    specs = {r.name: r for r in facts.regions("minicpmo45", 100, facts.StockLimits(1000, 5000, 30000))}
    clock = plan.MiniCPMClocks(specs, geo)
    held, kept, src_kept, sizes = [], [], [], set()
    for counts in long_script(seed=7, units=3000):
        clock.start_turn()
        for k, n in enumerate(counts):
            sizes.add((n, k == len(counts) - 1))
            for cp in clock.plan(n, final=k == len(counts) - 1).calls:
                held += [b.sig.size for b in cp.blocks]
                kept.append(cp.after["vocoder_mel"])
                src_kept.append(cp.after["vocoder_source"])
    assert len(sizes) == 2 * (facts.MAX_UNIT_TOKENS + 1)          # every unit size, final or not
    assert len(held) > 5000
    assert max(held) == limits["mel_buffer_frames"] == geo.mel_cap
    assert max(kept) <= limits["mel_cache_frames"] and max(src_kept) <= limits["source_cache_frames"]


def test_a_vocoder_clock_past_its_buffer_is_an_assertion_not_a_session_error(vocoder_geometry):
    """Control: the same arithmetic against a buffer one frame short trips VocoderClock's invariant assertion
    (an internal fault, never an InputError a caller would catch and carry on from)."""
    geo, _ = vocoder_geometry
    clock = plan.VocoderClock(geo._replace(mel_cap=geo.mel_cap - 1))
    with pytest.raises(AssertionError, match="mel_buffer_frames"):
        for _ in range(20):
            clock.blocks(50, False)
