"""MiniCPM-o 4.5 tail (flow_hift.cadence, flow_hift.causal_vocoder): DuplexCadence vs stock on the CPU (the eager
path of the same steps: arena views, in-place trims, the arena vocoder), what the stock modules read, negative
controls, bad input; on CUDA graph capture ahead and replay. Every turn shape of the real session script is
compared unit by unit in test_flow_hift_plan.py."""
from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from alloc_spy import BigAllocs  # noqa: E402  (tests/ is on sys.path under pytest)
from reduced_flow_hift import VOICES, reduced_model, token_maker  # noqa: E402
from session_state import same_state, snapshot  # noqa: E402
from torch_threads import two_threads  # noqa: E402, F401  (autouse: this module's tests at two intra-op threads)
from duplexcadence.adapters import flow_hift as fh  # noqa: E402
from duplexcadence.adapters.flow_hift import facts  # noqa: E402
from duplexcadence.errors import ClosedError, InputError  # noqa: E402
from duplexcadence.runtime import compare_units  # noqa: E402

VOICE = VOICES["minicpmo45"]
STEPS = 2
tokens_for = token_maker(1000)


@pytest.fixture(scope="module")
def model():
    return reduced_model("minicpmo45", n_timesteps=STEPS)


def run_turn(model, mode, units=3, before=None, each=None, final=False):
    """A fresh session's first turn of `units` 25-token units (the last final if `final`); before(s) runs after
    start_turn, each(s, u) before unit u."""
    with fh.new_session(model, mode) as s:
        s.start_turn()
        if before:
            before(s)
        outs = []
        for u in range(units):
            if each:
                each(s, u)
            outs.append(s.speak(tokens_for(u, 25), final=final and u == units - 1))
        return outs


@pytest.fixture(scope="module")
def clean(model):
    """Units 0-2 of a clean first turn (first, ramp, steady), stock and cadence."""
    return {mode: run_turn(model, mode) for mode in fh.MODES}


def test_a_clean_turn_is_bit_exact(clean):
    for u, (a, b) in enumerate(zip(clean["stock"], clean["cadence"])):
        compare_units("minicpmo45-reduced", u, a, b)
    assert clean["stock"][0].samples == 24000 and not clean["stock"][0].waveform[:3840].any()


def test_arena_is_what_the_upstream_modules_read(model):
    """Forward pre-hooks on the conformer layers and a spy on the DiT see only arena memory."""
    seen = []
    with fh.new_session(model, "cadence") as cad:
        cad.start_turn()
        lo, hi = cad.arena.base, cad.arena.base + cad.arena.bytes_reserved
        flow = model.t2w.flow
        layers = list(flow.encoder.encoders) + list(flow.encoder.up_encoders)
        handles = [layer.register_forward_pre_hook(
            lambda _m, _a, kw: seen.append(("conformer", lo <= kw["att_cache"].data_ptr() < hi)), with_kwargs=True)
            for layer in layers]
        dit = flow.decoder.estimator
        real = dit.forward_chunk

        def spy(*args, **kwargs):
            seen.append(("dit_cache", lo <= kwargs["att_cache"].data_ptr() < hi))
            seen.append(("dit_scratch", lo <= dit.att_cache_buffer.data_ptr() < hi))
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


def test_steady_unit_allocates_no_dit_cache_sized_tensor(model):
    """Stock re-allocates the whole DiT KV cache by torch.cat every steady unit; cadence does not (the detector is
    shown to work on stock first). The encoder still allocates its grown conformer cache: not covered."""
    threshold = STEPS * 2 * 2 * 8 * (model.prompt.mel_frames + 100) * 128
    for mode, expect_big in (("stock", True), ("cadence", False)):
        with fh.new_session(model, mode) as s:
            s.start_turn()
            for u in range(3):                      # first, ramp, then steady
                s.speak(tokens_for(u, 25))
            with BigAllocs(threshold) as spy:
                s.speak(tokens_for(3, 25))
        assert bool(spy.big) is expect_big, (mode, spy.big)


def test_corrupting_an_arena_region_changes_the_output(model, clean):
    def poke(s, u):
        if u == 2:
            with torch.inference_mode():
                s.state()["conformer_att"][0, 0, 0, 0, 0] += 1.0
    dirty = run_turn(model, "cadence", each=poke)
    assert clean["cadence"][1].sha256() == dirty[1].sha256()
    assert clean["cadence"][2].sha256() != dirty[2].sha256()


def test_negative_control_oldest_first_dit_keys_fails_bit_exactness(model, clean):
    def reverse(s):
        v = s.state()["estimator_att"]
        v.copy_(v.flip(4))
    wrong = run_turn(model, "cadence", units=1, before=reverse)
    with pytest.raises(AssertionError, match="unit 0: float32 waveform differs"):
        compare_units("minicpmo45-reduced", 0, clean["stock"][0], wrong[0])


def test_arena_is_sized_from_the_clocks_not_stock_constants(model):
    P = model.prompt.mel_frames
    with fh.new_session(model, "cadence") as cad:
        assert cad.arena["estimator_att"].capacity == STEPS * 2 * 2 * 8 * (P + 150) * 128   # steps and layers in use
        assert cad.arena["conformer_att"].capacity == 3 * 8 * (P + 150) * 128
        assert cad.arena.bytes_reserved < 20 * 2 ** 20


def test_flow_output_is_an_arena_view(model):
    """The flow step's mel is returned from the arena, not a graph-pool tensor that another graph's intermediates
    may overwrite while the vocoder reads it block by block."""
    with fh.new_session(model, "cadence") as s:
        s.start_turn()
        sig = s.signatures(25)[0]
        mel = s.flow_step(sig)()
        lo, hi = s.arena.base, s.arena.base + s.arena.bytes_reserved
        assert sig.step == "flow" and lo <= mel.data_ptr() < hi and mel.shape == (1, 80, 50)


def test_vocoder_regions_are_read_and_stay_put(model):
    """Two equal sessions stay equal; corrupting one's source history changes its next unit; no region moves."""
    a, b = fh.new_session(model, "cadence"), fh.new_session(model, "cadence")
    with a, b:
        names = ("vocoder_mel", "vocoder_source", "vocoder_phase")
        ptrs = {n: b.arena[n].data_ptr() for n in names}
        for s in (a, b):
            s.start_turn()
            s.speak(tokens_for(0, 25))
        assert a.speak(tokens_for(1, 25)).sha256() == b.speak(tokens_for(1, 25)).sha256()
        src = b.state()["vocoder_source"]
        assert src.numel() > 0
        src.add_(1e-3)
        assert a.speak(tokens_for(2, 25)).sha256() != b.speak(tokens_for(2, 25)).sha256()
        assert {n: b.arena[n].data_ptr() for n in names} == ptrs


def test_a_vocoder_step_keeps_no_reference_to_the_phase_it_computed(model):
    """The stock source function hands its new phase back through the shim's cache; after the copy into the
    arena's phase region the cache holds nothing (under capture, that tensor lies in the graph pool, and a
    reference kept here would keep its block allocated for the session's life)."""
    with fh.new_session(model, "cadence") as s:
        s.start_turn()
        for u in range(3):
            s.speak(tokens_for(u, 25))
        assert s.vocoder.phase.data_ptr() == s.arena["vocoder_phase"].data_ptr()
        assert s.vocoder.shim.cache == {}


def test_cadence_needs_none_of_the_stock_module_buffers():
    """for_mode(model, "cadence") frees the stock DiT buffers: the voice set-up and every step run on the arena,
    bytes equal stock's (computed on the same instance before), and a stock session is then refused."""
    m = reduced_model("minicpmo45", n_timesteps=STEPS)
    script = [(tokens_for(500 + u, n), u == 2) for u, n in enumerate((25, 25, 4))]
    with fh.new_session(m, "stock") as stock:
        stock.start_turn()
        want = [stock.speak(t, final=f) for t, f in script]
    buf = m.t2w.flow.decoder.att_cache_buffer
    done = fh.for_mode(m, "cadence")
    assert done["stock_buffers_released_bytes"] >= buf.numel() * buf.element_size()
    assert m.t2w.flow.decoder.att_cache_buffer.stride() == (0,) * 6
    with pytest.raises(InputError, match="released"):
        fh.new_session(m, "stock")
    with fh.new_session(m, "cadence") as cad:
        cad.start_turn()
        for u, ((t, f), a) in enumerate(zip(script, want)):
            compare_units("minicpmo45-reduced-released-buffers", u, a, cad.speak(t, final=f))


def test_options_and_a_closed_session_are_clear_errors(model):
    for kwargs, match in (({"noise": "bogus"}, "noise"), ({"capture": "never"}, "capture"),
                          ({"arena_backend": "vmm"}, "backend")):
        with pytest.raises(ValueError, match=match):
            fh.CadenceSession(model, **kwargs)
    with pytest.raises(ValueError, match=r"unknown option.*prepare_turns"):
        fh.new_session(model, "cadence", {"cadence": {"prepare_turns": 0}})
    with pytest.raises(ValueError, match="mode"):
        fh.new_session(model, "fast")
    with fh.new_session(model, "cadence", {"capture": "inline"}) as inline:    # speak may capture: not concurrent
        assert inline.capabilities.concurrent is False and fh.CadenceSession.capabilities.concurrent is True
    s = fh.new_session(model, "cadence")
    with pytest.raises(InputError, match=r"^signatures\[0\]: expected a Signature"):
        s.prepare([("flow", 28)])
    s.close()
    s.close()                                          # a second close does nothing
    for call in (s.start_turn, lambda: s.speak(tokens_for(1, 25)), s.prepare, s.state, s.stats, s.clocks):
        with pytest.raises(ClosedError, match="closed"):
            call()


@pytest.mark.parametrize("mode", fh.MODES)
def test_unit_outside_a_turn_and_non_bool_final_are_rejected(model, mode):
    with fh.new_session(model, mode) as s:
        with pytest.raises(InputError, match="no open turn"):
            s.speak(tokens_for(0, 25))
        with pytest.raises(InputError, match="no open turn"):
            s.signatures(25)
        s.start_turn()
        for final in ("no", None, 1):
            with pytest.raises(InputError, match="final: expected a bool"):
                s.speak(tokens_for(0, 25), final=final)
        assert s.state()["buffer"] == [facts.SILENCE_TOKEN] * 3
        s.speak(tokens_for(0, 25), final=True)
        with pytest.raises(InputError, match="no open turn"):
            s.speak(tokens_for(1, 25))


def test_after_a_rejected_unit_output_equals_a_clean_run(model, clean):
    with fh.new_session(model, "cadence") as s:
        s.start_turn()
        outs = [s.speak(tokens_for(0, 25))]
        with pytest.raises(InputError):
            s.speak([9999] * 25)
        outs += [s.speak(tokens_for(1, 25)), s.speak(tokens_for(2, 25))]
    for a, b in zip(clean["cadence"], outs):
        assert a.sha256() == b.sha256()


@pytest.mark.released
def test_released_configuration_first_ramp_steady_and_flush_bit_exact():
    """The released architecture (6 + 4 conformer blocks, DiT depth 16 with the stock 16 x 16 DiT buffers, 10 Euler
    steps, the full vocoder) with the workload's 6 s prompt (P = 300): first, ramp and steady units and a final
    flush, byte-identical."""
    m = fh.build_model({"n_timesteps": 10, "voice_prompt": str(VOICE), "prompt_seconds": 6.0}, depth="released", seed=0)
    assert m.prompt.mel_frames == 300 and len(m.t2w.flow.decoder.estimator.blocks) == 16
    assert tuple(m.t2w.flow.decoder.att_cache_buffer.shape) == (16, 16, 2, 8, 1000, 128)
    with fh.new_session(m, "stock") as stock, fh.new_session(m, "cadence") as cad:
        for s in (stock, cad):
            s.start_turn()
        for u, n in enumerate([25, 25, 25, 2]):
            a, b = stock.speak(tokens_for(u, n), final=u == 3), cad.speak(tokens_for(u, n), final=u == 3)
            compare_units("minicpmo45-released", u, a, b)
            assert a.waveform.std() > 1e-4


BAD = [
    pytest.param([6561] + [1] * 24, "outside", id="id-too-large"),
    pytest.param([-1] + [1] * 24, "outside", id="id-negative"),
    pytest.param([1.5] + [1] * 24, "int token id", id="float"),
    pytest.param([True] + [1] * 24, "int token id", id="bool"),
    pytest.param("abc", "sequence", id="string"),
    pytest.param([1] * 26, "at most 25", id="too-many"),
    pytest.param(torch.tensor(5), "sequence", id="tensor-0d"),
    pytest.param(np.array(5), "sequence", id="array-0d"),
    pytest.param({1: 2, 3: 4}, "sequence", id="dict"),
    pytest.param({5, 6}, "sequence", id="set"),
    pytest.param(bytearray(b"\x01\x02"), "sequence", id="bytearray"),
    pytest.param(memoryview(b"\x01\x02"), "sequence", id="memoryview"),
]


@pytest.fixture(scope="module")
def spoken(model):
    """mode -> a session with an open turn after one unit, shared by the bad-token cases (the last tests here:
    the stock one holds the model's one live stock session until the module ends)."""
    sessions = {}

    def get(mode):
        if mode not in sessions:
            s = sessions[mode] = fh.new_session(model, mode)
            s.start_turn()
            s.speak(tokens_for(0, 25))
        return sessions[mode]
    yield get
    for s in sessions.values():
        s.close()


@pytest.mark.parametrize("tokens,match", BAD)
@pytest.mark.parametrize("mode", fh.MODES)
def test_bad_tokens_rejected_and_state_unchanged(spoken, mode, tokens, match):
    s = spoken(mode)
    before = snapshot(s)
    with pytest.raises(InputError, match=match):
        s.speak(tokens)
    assert same_state(before, s.state())


# --- CUDA ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_model():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: graph capture and replay")
    return reduced_model("minicpmo45", device="cuda", n_timesteps=STEPS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_graph_replay_is_bit_exact_and_steady_units_replay(cuda_model):
    """prepare(None) captures the turn start, ramp and steady shapes without changing the session; then every
    step of every full unit replays (replays per unit = the steps the clocks predict for it; no capture, no eager
    run inside a unit); a final flush, not prepared, runs eagerly (counted), and after prepare(its signatures)
    it replays too. Every unit byte-identical to stock."""
    m = cuda_model
    with fh.new_session(m, "stock") as stock, fh.new_session(m, "cadence") as cad:
        before = snapshot(cad)
        done = cad.prepare()
        assert done["captures"] == len(set(fh.plan.steady_signatures(_turn(cad.clocks())))) > 0
        assert done["capture_failures"] == 0 and same_state(before, cad.state())
        for turn in range(2):
            stock.start_turn()
            cad.start_turn()
            for u in range(6):
                sigs, was = cad.signatures(25), cad.stats()
                a, b = stock.speak(tokens_for(u, 25)), cad.speak(tokens_for(u, 25))
                compare_units("minicpmo45-reduced-cuda", u, a, b)
                now = cad.stats()
                assert (now.replays - was.replays, now.captures - was.captures,
                        now.eager_fallbacks - was.eager_fallbacks, now.warmup_runs - was.warmup_runs) == \
                    (len(sigs), 0, 0, 0), (turn, u)
            sigs, was = cad.signatures(3, True), cad.stats()
            if turn == 1:
                cad.prepare(sigs)
                was = cad.stats()
            a, b = stock.speak(tokens_for(9, 3), final=True), cad.speak(tokens_for(9, 3), final=True)
            compare_units("minicpmo45-reduced-cuda-flush", turn, a, b)
            now = cad.stats()
            fallbacks, replays = now.eager_fallbacks - was.eager_fallbacks, now.replays - was.replays
            assert fallbacks + replays == len(sigs) and (fallbacks > 0 if turn == 0 else fallbacks == 0), turn
        assert np.all(np.isfinite(b.waveform))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_prepared_graphs_keep_only_their_outputs_allocated_in_the_pool(cuda_model):
    """After prepare(), every block still allocated in the session's graph pool is one of its graphs' outputs:
    each capture's intermediates went back to the pool (a graph holding outputs with autograd history would keep
    them all allocated: the vocoder's activations, its convolutions' padded inputs)."""
    with fh.new_session(cuda_model, "cadence") as cad:
        assert cad.prepare()["capture_failures"] == 0
        pool = tuple(cad.graphs.pool)
        live = []
        for seg in torch.cuda.memory_snapshot():
            if tuple(seg.get("segment_pool_id", ())) != pool:
                continue
            address = seg["address"]
            for block in seg["blocks"]:
                if block["state"] == "active_allocated":
                    live.append((address, block["size"]))
                address += block["size"]
        outputs = set()
        for entry in cad.graphs.entries.values():
            for t in entry.outputs if isinstance(entry.outputs, (tuple, list)) else (entry.outputs,):
                if torch.is_tensor(t):
                    outputs.add(t.untyped_storage().data_ptr())
        assert cad.graphs.entries and live
        assert [blk for blk in live if blk[0] not in outputs] == []


def _turn(clocks):
    clocks.start_turn()
    return clocks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_inline_capture_is_bit_exact_and_replays_from_the_second_turn(cuda_model):
    """capture="inline": a step's first occurrence is captured inside speak (one eager warm-up per step family in
    the process), so the second identical turn replays every step the clocks predict."""
    with fh.new_session(cuda_model, "stock") as stock, fh.new_session(cuda_model, "cadence", {"capture": "inline"}) as cad:
        for turn in range(2):
            stock.start_turn()
            cad.start_turn()
            for u, n in enumerate((25, 25, 25, 25, 4)):
                final, sigs, was = u == 4, cad.signatures(n, u == 4), cad.stats().replays
                compare_units("minicpmo45-reduced-cuda-inline", u, stock.speak(tokens_for(u, n), final=final),
                              cad.speak(tokens_for(u, n), final=final))
                if turn == 1:
                    assert cad.stats().replays - was == len(sigs)
        assert cad.stats().captures > 0 and cad.stats().capture_failures == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
def test_cuda_sessions_on_threads_give_their_own_bytes(cuda_model):
    """Two cadence sessions speaking on two host threads (one prepared before the threads start: replays; one not:
    its steps run eagerly under the model's lock) while a third thread opens and closes sessions of the model:
    every unit of both equals that session run alone, and nothing raises. (Captures stay out of the threaded part:
    torch.cuda.graph captures in "global" mode, where another thread's device sync during a capture fails.)"""
    import threading

    def units(s):
        s.start_turn()
        return [s.speak(tokens_for(u, 25)).sha256() for u in range(6)]

    sessions = {name: fh.new_session(cuda_model, "cadence") for name in ("prepared", "eager")}
    sessions["prepared"].prepare()
    alone = {}
    for name in sessions:
        with fh.new_session(cuda_model, "cadence") as s:
            if name == "prepared":
                s.prepare()
            alone[name] = units(s)
    got, errors, stop = {}, [], threading.Event()

    def speak(name):
        try:
            with sessions[name] as s:
                got[name] = units(s)
        except Exception as exc:          # noqa: BLE001 (reported below)
            errors.append(exc)

    def churn():
        try:
            while not stop.is_set():
                fh.new_session(cuda_model, "cadence").close()
        except Exception as exc:          # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=speak, args=(n,)) for n in sessions] + [threading.Thread(target=churn)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(300)
    stop.set()
    threads[2].join(300)
    assert not errors, errors
    assert got == alone
