"""duplexcadence.adapters.mimi: Moshi's Mimi decoder, stock eager vs DuplexCadence, byte for byte.

CPU tests use the reduced config (2 transformer layers, same 8 x 250 x 64 ring KV caches) and run the
stock and cadence sessions interleaved over one model instance, on one thread and on several; one test uses
the released config. GPU classes (graph capture and replay) skip on CPU.
"""
from __future__ import annotations

import functools
import gc
import json
import random
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

import cuda_checks  # tests/ is on sys.path under pytest
import threaded
from reduced_mimi import model, random_units  # noqa: F401  (model: a fixture)
from session_state import digest
from torch_threads import one_thread  # noqa: F401  (autouse: this module's tests at one intra-op thread)
from duplexcadence import bind
from duplexcadence.adapters import mimi
from duplexcadence.adapters.mimi import schedule as ms
from duplexcadence.clocks import Fixed, Ring
from duplexcadence.errors import ClosedError, ConcurrencyError, InputError, LimitError
from duplexcadence.runtime import compare_units

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = Path(__file__).parent / "data" / "mimi_manifest.json"
SCRIPT = ROOT / "workloads" / "data" / "sessions" / "mimi.jsonl"
UNIT_FRAMES = [13, 12] * 5 + [13]          # 138 frames = 276 positions: past the 250-slot ring wrap
SPF = ms.SAMPLES_PER_FRAME


@pytest.fixture(scope="module")
def units():
    return random_units(UNIT_FRAMES, seed=1234)


def record_steps(session, log: list) -> None:
    """Record, through the session's GraphCache, every step's signature and how many decode calls the step
    made (a hook on the shared SEANet decoder counts them)."""
    run = session.graphs.run

    def recording(sig, step):
        def counted():
            calls = []
            handle = session.model.decoder.register_forward_pre_hook(lambda mod, args: calls.append(1))
            try:
                return step()
            finally:
                handle.remove()
                log.append((sig, len(calls)))
        return run(sig, counted)
    session.graphs.run = recording


@pytest.fixture(scope="module")
def long_run(model, units):
    """Stock eager and cadence ("unit" graphs; eager on CPU) over the same 11 units, interleaved; the
    signatures predicted before each unit and those the steps ran under (recorded through the cache)."""
    stock = mimi.new_session(model, "stock", {})
    cadence = mimi.new_session(model, "cadence", {"cadence_graphs": "unit"})
    stock_kv = mimi.new_session(model, "cadence", {"cadence_graphs": "unit", "kv_bookkeeping": "stock"})
    ptrs_before = {b.spec.name: b.view.data_ptr() for b in cadence.bindings}
    base_before = cadence.arena.base
    used, predicted, outs, outs_stock_kv = [], [], [], []
    record_steps(cadence, used)
    for k, codes in enumerate(units):
        predicted.append(cadence.signatures(codes.shape[1]))
        outs.append((stock.speak(codes), cadence.speak(codes.tolist() if k % 2 else codes)))
        outs_stock_kv.append(stock_kv.speak(codes))
    return {"stock": stock, "cadence": cadence, "stock_kv": stock_kv, "outs": outs, "used": used,
            "predicted": predicted, "outs_stock_kv": outs_stock_kv, "ptrs_before": ptrs_before,
            "base_before": base_before}


def stock_frames(long_run, unit: int, start: int, stop: int) -> bytes:
    return long_run["outs"][unit][0].waveform[start * SPF:stop * SPF].tobytes()


# --- bit-exactness ------------------------------------------------------------------------------
def test_cadence_equals_stock_bytes_across_ring_wrap(long_run):
    cadence = long_run["cadence"]
    assert cadence.clocks().positions == 2 * sum(UNIT_FRAMES) > cadence.capacity == 250
    for k, (s, c) in enumerate(long_run["outs"]):
        assert s.samples == UNIT_FRAMES[k] * SPF
        compare_units("moshi-reduced", k, s, c)          # float32 waveform and int16 PCM, bytes
        compare_units("moshi-reduced-stock-kv-bookkeeping", k, s, long_run["outs_stock_kv"][k])


def test_host_ring_rows_equal_moshis_ring_bookkeeping():
    """ring_rows (host) against moshi's RingKVCache.complete itself, call by call, past two wraps."""
    from moshi.modules.transformer import RingKVCache

    capacity, calls = 10, 14
    ring = RingKVCache(1, 1, 1, capacity, device=torch.device("cpu"), dtype=torch.float32)
    rows = ms.ring_rows(0, calls, capacity)
    assert torch.equal(ms.ring_rows(6, calls - 3, capacity), rows[3:])   # later start, later rows
    for call in range(calls):
        marks = torch.tensor([1000.0 + 2 * call, 1001.0 + 2 * call]).view(1, 1, 2, 1)
        out = ring.complete(marks, marks, torch.ones(1, dtype=torch.bool))
        written = [int((ring.cache[0, 0, 0, :, 0] == m).nonzero()[0]) for m in marks.view(-1).tolist()]
        assert rows[call, :2].tolist() == written
        assert torch.equal(rows[call, 2:], out.positions[0])


def test_stock_output_is_not_degenerate(long_run):
    wave = np.concatenate([s.waveform for s, _ in long_run["outs"]])
    assert 0.03 < float(wave.std()) < 0.5
    assert float(np.mean(np.abs(wave) >= 1.0)) < 0.01
    first, second = long_run["outs"][0][0].waveform, long_run["outs"][2][0].waveform
    assert float(np.std(first - second[:first.size])) > 0.01        # the codes matter


def test_frame_graphs_mode_equals_stock(model, units, long_run):
    cadence = mimi.new_session(model, "cadence", {"cadence_graphs": "frame"})
    used = []
    record_steps(cadence, used)
    for k in range(2):
        compare_units("moshi-reduced", k, long_run["outs"][k][0], cadence.speak(units[k]))
    assert len(used) == UNIT_FRAMES[0] + UNIT_FRAMES[1] and {(s.step, s.size, n) for s, n in used} == {("frame", 1, 1)}


def test_unit_boundaries_do_not_matter(model, units, long_run):
    """Frames are decoded one by one: 13 frames as 3 + 10 give the same bytes as stock's unit of 13."""
    cadence = mimi.new_session(model, "cadence", {})
    a, b = cadence.speak(units[0][:, :3]), cadence.speak(units[0][:, 3:])
    assert a.waveform.tobytes() + b.waveform.tobytes() == stock_frames(long_run, 0, 0, 13)


# --- the clocks make the keys --------------------------------------------------------------------
def test_predicted_signatures_are_the_ones_the_steps_ran(long_run):
    used = long_run["used"]
    assert [s for s, _ in used] == [sig for unit in long_run["predicted"] for sig in unit]
    assert [(s.step, s.size, n) for s, n in used] == [("unit", f, f) for f in UNIT_FRAMES]   # F decodes per step


def stock_length(state: dict, region: str) -> int:
    """The length moshi allocated for a region: ring slots (cache [2, B, heads, context, head_dim]) or
    conv tail samples (previous / partial [B, C, K - S])."""
    return state[region].shape[-2 if region.endswith("kv_cache.cache") else -1]


@pytest.mark.parametrize("graphs", ["frame", "unit"])
def test_the_clock_predicts_every_step_of_the_real_script(model, graphs):
    """The whole committed Moshi session script (55 units, LISTEN units decoded too): before each unit the
    clock predicts its steps; the cache records the signatures speak ran (the cache is a recorder here,
    so the walk is fast); every predicted region length is what moshi allocated for a stock session."""
    rows = [json.loads(line) for line in SCRIPT.read_text().splitlines()]
    cadence, stock = mimi.new_session(model, "cadence", {"cadence_graphs": graphs}), mimi.new_session(model, "stock")
    used = []
    cadence.graphs.run = lambda sig, step: used.append(sig) or torch.zeros(1, 1, SPF * sig.size)
    stock_state = stock.state()
    for row in rows:
        frames = len(row["codes"][0])
        predicted = cadence.signatures(frames, row["final"])
        used.clear()
        cadence.speak(row["codes"], final=row["final"])
        assert used == predicted and len(used) == (1 if graphs == "unit" else frames)
        for sig in predicted:
            assert sig.size == (frames if graphs == "unit" else 1) and sig.get("batch") == 1
            assert {name: stock_length(stock_state, name) for name, _ in sig.lengths} == dict(sig.lengths)
    kv = [n for n, length in used[0].lengths if n.endswith("kv_cache.cache")]
    assert len(kv) == 2 and used[0].get(kv[0]) == 250
    assert cadence.clocks().frames == sum(len(r["codes"][0]) for r in rows) > 250 // 2


# --- the arena is the state ----------------------------------------------------------------------
def test_regions_stay_at_their_arena_addresses(long_run):
    cadence = long_run["cadence"]
    assert cadence.arena.base == long_run["base_before"]
    assert {b.spec.name: b.view.data_ptr() for b in cadence.bindings} == long_run["ptrs_before"]
    for b in cadence.bindings:            # moshi updated every state in place: none was rebound
        assert getattr(b.owner, b.attr) is b.view, b.spec.name


@pytest.mark.parametrize("which, n_counters", [("cadence", 2 + 1), ("stock_kv", 2 * 2 + 1)])
def test_counters_follow_the_host_clock(long_run, which, n_counters):
    """Device counters equal clock POSITIONS: per layer the RoPE offset (and, with moshi's own ring
    bookkeeping, the ring's end_offset), plus the transformer's offsets."""
    session = long_run[which]
    counters = [b for b in session.bindings if b.view.dtype == torch.int64]
    assert len(counters) == n_counters
    for b in counters:
        assert b.view.tolist() == [session.clocks().positions], b.spec.name


def moshi_tensors(states: dict) -> dict:
    """Every non-empty tensor of moshi's State objects (and their ring KV caches), by dotted name."""
    out = {}
    for name, state in states.items():
        for owner, prefix in ((state, name), (getattr(state, "kv_cache", None), f"{name}.kv_cache")):
            out.update({f"{prefix}.{a}".lstrip("."): v for a, v in (vars(owner) if owner is not None else {}).items()
                        if isinstance(v, torch.Tensor) and v.numel()})
    return out


def test_regions_cover_every_decoder_state_tensor(model, long_run):
    cadence, stock = long_run["cadence"], long_run["stock"]
    with model.streaming(1):                       # everything moshi allocates for a stream
        everything = moshi_tensors(model.get_streaming_state())
    decoder_side = {n for n in everything if n.split(".")[0] in ("decoder", "decoder_transformer", "upsample",
                                                                 "exec_mask")}
    assert decoder_side == set(moshi_tensors(stock.own.states)) and len(decoder_side) < len(everything)
    assert {n for n, v in stock.state().items() if isinstance(v, torch.Tensor)} == decoder_side
    assert {b.spec.name for b in long_run["stock_kv"].bindings} == decoder_side
    ends = {n for n in decoder_side if n.endswith("kv_cache.end_offset")}
    assert len(ends) == 2 and {b.spec.name for b in cadence.bindings} == decoder_side - ends
    assert not any(n.startswith(("encoder", "downsample")) for n in cadence.state())
    kv = [b for b in cadence.bindings if b.kind == "RingKVCache.cache"]
    assert [tuple(b.view.shape) for b in kv] == [(2, 1, 8, 250, 64)] * 2
    assert all(b.spec.policy == Ring(250) and b.spec.clock == "positions" for b in kv)
    tails = {b.spec.name: b.spec for b in cadence.bindings if b.attr in ("previous", "partial")}
    assert tails["upsample.convtr.partial"].policy == Fixed(2)           # K 4 - stride 2
    assert tails["decoder.model.2.partial"].policy == Fixed(8)           # K 16 - stride 8
    assert tails["decoder.model.14.previous"].clock == "samples"              # last conv @ 24 kHz
    assert {cadence.signatures(f)[0].size for f in UNIT_FRAMES} == {12, 13}


def _corrupt(cadence, kind: str) -> None:
    views = {b.spec.name: b.view for b in cadence.bindings}
    layer0 = "decoder_transformer.transformer.layers.0.self_attn"
    if kind == "host_clock_one_frame_ahead":
        cadence.clock.frames += 1
    elif kind == "kv_value":
        views[f"{layer0}.kv_cache.cache"][:, :, :, 0] += 0.5
    elif kind == "kv_end_offset_off_by_one":
        views[f"{layer0}.kv_cache.end_offset"] += 1
    elif kind == "rope_offset_off_by_one":
        views[f"{layer0}.offset"] += 1
    elif kind == "kv_ring_order":   # same keys and values, other slot order: only the reduction order changes
        for name, v in views.items():
            if name.endswith("kv_cache.cache"):
                v[:, :, :, :6] = v[:, :, :, :6].flip(3).clone()
    elif kind in views:
        views[kind] += 0.1
    elif kind != "none":
        raise KeyError(kind)


@pytest.mark.parametrize("kv, kind", [
    pytest.param("host", "none", id="control-untouched"),
    pytest.param("stock", "none", id="control-untouched-stock-kv"),
    pytest.param("host", "kv_value", id="kv-cache"),
    pytest.param("host", "decoder.model.0.previous", id="seanet-conv-tail"),
    pytest.param("host", "decoder.model.2.partial", id="seanet-convtr-tail"),
    pytest.param("host", "upsample.convtr.partial", id="upsample-tail"),
    pytest.param("host", "host_clock_one_frame_ahead", id="negative-host-clock-one-frame-ahead"),
    pytest.param("stock", "kv_end_offset_off_by_one", id="negative-kv-end-offset-off-by-one"),
    pytest.param("host", "rope_offset_off_by_one", id="negative-rope-offset-off-by-one"),
    pytest.param("host", "kv_ring_order", id="negative-kv-ring-in-wrong-order"),
])
def test_the_arena_is_read(model, units, long_run, kv, kind):
    """Decode 3 frames, change one arena region, decode frame 4: it must differ from stock's frame 4
    (and equal it when nothing was changed). The negative controls are layout bugs a runtime could make."""
    cadence = mimi.new_session(model, "cadence", {"kv_bookkeeping": kv})
    cadence.speak(units[0][:, :3])
    _corrupt(cadence, kind)
    got = cadence.speak(units[0][:, 3:4]).waveform.tobytes()
    want = stock_frames(long_run, 0, 3, 4)
    assert (got == want) == (kind == "none")


# --- input errors and limits lose nothing ---------------------------------------------------------
BAD_CODES = [
    pytest.param([[0] * 2] * 7, id="7-codebooks"),
    pytest.param([[0] * 2] * 9, id="9-codebooks"),
    pytest.param([[0, 2048]] + [[0, 0]] * 7, id="id-2048"),
    pytest.param([[0, -1]] + [[0, 0]] * 7, id="id-negative"),
    pytest.param([[0, 1.0]] + [[0, 0]] * 7, id="float-id"),
    pytest.param([[0, True]] + [[0, 0]] * 7, id="bool-id"),
    pytest.param([[0, 1]] + [[0]] * 7, id="ragged"),
    pytest.param([[]] * 8, id="0-frames"),
    pytest.param(torch.zeros(8, 2), id="float-tensor"),
    pytest.param(torch.zeros(8, 2, dtype=torch.bool), id="bool-tensor"),
    pytest.param(torch.zeros(1, 8, 2, dtype=torch.long), id="3d-tensor"),
    pytest.param(np.full((8, 2), 2048), id="numpy-id-2048"),
    pytest.param("0 1 2", id="string"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("mode", ["stock", "cadence"])
@pytest.mark.parametrize("bad", BAD_CODES)
def test_bad_codes_rejected_and_state_unchanged(model, long_run, units, mode, bad):
    session = mimi.new_session(model, mode, {})
    session.speak(units[0][:, :2])
    before = digest(session)
    with pytest.raises(InputError, match="codes") as info:
        session.speak(bad)
    assert not isinstance(info.value, LimitError)
    assert digest(session) == before and session.clocks().frames == 2
    out = session.speak(units[0][:, 2:3])                   # nothing was lost
    assert out.waveform.tobytes() == stock_frames(long_run, 0, 2, 3)


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_a_unit_past_the_declared_bound_is_a_limit_error(model, long_run, units, mode):
    """14 frames: past the unit region's bound (13, the 12.5 Hz clock's ceiling), in both modes."""
    session = mimi.new_session(model, mode, {})
    session.speak(units[0][:, :2])
    before = digest(session)
    with pytest.raises(LimitError, match="'unit'.*14.*13") as info:
        session.speak([[0] * 14] * 8)
    with pytest.raises(LimitError, match="'unit'"):
        session.signatures(14)
    assert info.value.session_usable and digest(session) == before
    assert session.speak(units[0][:, 2:3]).waveform.tobytes() == stock_frames(long_run, 0, 2, 3)


@pytest.mark.parametrize("bad", [pytest.param("yes", id="string"), pytest.param(1, id="int"),
                                 pytest.param(None, id="none")])
def test_final_must_be_a_bool(model, units, bad):
    session = mimi.new_session(model, "cadence", {})
    before = digest(session)
    with pytest.raises(InputError, match="final"):
        session.speak(units[0][:, :1], final=bad)
    assert digest(session) == before
    with pytest.raises(TypeError):
        session.speak(units[0][:, :1], True)                # final is keyword-only


def test_start_turn_keeps_the_stream(model, units, long_run):
    cadence = mimi.new_session(model, "cadence", {})
    cadence.speak(units[0][:, :2])
    before = digest(cadence)
    cadence.start_turn()
    assert digest(cadence) == before
    assert cadence.speak(units[0][:, 2:3], final=True).waveform.tobytes() == stock_frames(long_run, 0, 2, 3)


def test_capabilities_are_declared(model):
    for mode, concurrent, graphs in (("stock", True, False), ("stock_graphs", False, True), ("cadence", True, True)):
        caps = mimi.new_session(model, mode, {}).capabilities
        assert (caps.turn_state, caps.concurrent, caps.graphs, caps.payload, caps.max_payload) == \
            ("stream", concurrent, graphs, "frames", 13)


def test_bad_mode_and_spec(model):
    with pytest.raises(ValueError, match="mode"):
        mimi.new_session(model, "fast", {})
    for key, value in (("cadence_graphs", "padded"), ("kv_bookkeeping", "device"), ("capture", "later")):
        with pytest.raises(ValueError, match=key):
            mimi.new_session(model, "cadence", {key: value})
    with pytest.raises(ValueError, match="depth"):
        mimi.build_model({}, depth="tiny")


def test_prepare_on_cpu_captures_nothing_and_changes_nothing(model, units):
    cadence = mimi.new_session(model, "cadence", {"cadence_graphs": "unit"})
    cadence.speak(units[0][:, :2])
    before = digest(cadence)
    assert set(cadence.prepare().values()) == {0} and set(cadence.prepare(cadence.signatures(12)).values()) == {0}
    assert digest(cadence) == before
    other = mimi.new_session(model, "cadence", {"cadence_graphs": "frame"}).signatures(1)
    with pytest.raises(InputError, match="signatures"):
        cadence.prepare(other)


def test_a_model_streaming_on_its_own_is_refused(model):
    with model.streaming(1):
        for mode in mimi.MODES:
            with pytest.raises(ConcurrencyError, match="streaming"):
                mimi.new_session(model, mode, {})
    assert not model.is_streaming


# --- sessions that share a model --------------------------------------------------------------------
def module_attributes(model) -> dict:
    """(module, attribute) -> id of the object, for every instance attribute, buffer and parameter."""
    out = {}
    for name, mod in model.named_modules():
        for kind, items in (("attr", vars(mod)), ("buffer", mod._buffers), ("param", mod._parameters)):
            out.update({(name, kind, k): id(v) for k, v in items.items()})
    return out


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_every_patch_is_undone_after_a_step_and_after_a_step_that_raises(model, units, mode):
    session = mimi.new_session(model, mode, {})
    before = module_attributes(model)
    session.speak(units[0][:, :2])
    assert bind.live() == 0 and module_attributes(model) == before
    assert all(m._streaming_state is None for m in model.modules() if hasattr(m, "_streaming_state"))

    def fail(module, args):
        assert bind.live() > 0                   # the session's states are installed now
        raise RuntimeError("a kernel failed")
    handle = model.decoder_transformer.register_forward_pre_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="a kernel failed"):
            session.speak(units[0][:, 2:4])
    finally:
        handle.remove()
    assert bind.live() == 0 and module_attributes(model) == before
    assert all(m._streaming_state is None for m in model.modules() if hasattr(m, "_streaming_state"))


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_close_frees_the_session_at_once(model, units, mode):
    session = mimi.new_session(model, mode, {})
    session.speak(units[0][:, :2])
    gc.collect()
    gc.disable()                                  # nothing may wait for the cycle collector
    try:
        kv = "decoder_transformer.transformer.layers.0.self_attn.kv_cache.cache"
        refs = [weakref.ref(session.state()[kv])]
        if mode == "cadence":
            refs.append(weakref.ref(session.arena._block))
        assert all(r() is not None for r in refs)
        session.close()
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
    session.close()                               # a second close does nothing
    for call in (lambda: session.speak(units[0][:, :1]), session.start_turn, session.state, session.stats,
                 session.clocks, lambda: session.signatures(12), session.prepare):
        with pytest.raises(ClosedError):
            call()


def run_alone(model, plan) -> list[bytes]:
    session = mimi.new_session(model, plan["mode"], dict(plan["spec"]))
    out = [session.speak(codes).waveform.tobytes() for codes in plan["units"]]
    session.close()
    return out


def test_sessions_on_threads_equal_each_alone(model):
    """Three sessions (stock, cadence frame graphs, cadence unit graphs with moshi's ring bookkeeping) on
    three threads, opening at random times, speaking with random pauses, closing when done, while a
    fourth thread opens and closes sessions all the time: every unit's bytes equal that session's alone,
    and nothing raises."""
    gen = torch.Generator().manual_seed(5)
    plans = [{"mode": mode, "spec": spec,
              "units": [torch.randint(0, ms.CARDINALITY, (ms.N_Q, f), generator=gen) for f in (5, 4, 6)]}
             for mode, spec in (("stock", {}), ("cadence", {}),
                                ("cadence", {"cadence_graphs": "unit", "kv_bookkeeping": "stock"}))]
    alone = [run_alone(model, plan) for plan in plans]
    got = [None] * len(plans)

    def speaker(i):
        rng = random.Random(10 + i)
        time.sleep(rng.uniform(0, 0.03))
        session = mimi.new_session(model, plans[i]["mode"], dict(plans[i]["spec"]))
        outs = []
        for codes in plans[i]["units"]:
            time.sleep(rng.uniform(0, 0.005))
            outs.append(session.speak(codes).waveform.tobytes())
        session.close()
        got[i] = outs

    errors = threaded.beside_churn([functools.partial(speaker, i) for i in range(len(plans))],
                                   lambda k: mimi.new_session(model, ("cadence", "stock")[k % 2], {}), seed=9)
    assert errors == []
    diffs = [(i, k) for i, (a, b) in enumerate(zip(alone, got)) for k in range(len(a)) if a[k] != b[k]]
    assert diffs == [] and bind.live() == 0


# --- weights and checkpoints ----------------------------------------------------------------------
def manifest(depth: str) -> dict:
    return json.loads(MANIFEST.read_text())["depths"][depth]


def test_reduced_layout_matches_the_manifest(model):
    assert mimi.state_manifest(model) == manifest("reduced")


def write_checkpoint(path: Path, layout: dict, *, drop: str | None = None,
                     reshape: str | None = None) -> dict:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(7)
    tensors = {}
    for name, shape in layout.items():
        if name == drop:
            continue
        if name == reshape:
            shape = [s + 1 for s in shape]
        tensors[name] = torch.randn(shape, generator=gen)
    save_file(tensors, str(path))
    return tensors


def test_checkpoint_loads_through_moshis_loader(tmp_path):
    path = tmp_path / "mimi.safetensors"
    written = write_checkpoint(path, manifest("reduced"))
    loaded = mimi.build_model({"checkpoint": path}, device="cpu", depth="reduced", seed=0).state_dict()
    assert set(loaded) == set(written)
    for name, tensor in written.items():
        assert torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize("defect", ["missing", "shape"])
def test_checkpoint_defects_raise(tmp_path, defect):
    layout = manifest("reduced")
    key = "decoder_transformer.transformer.layers.1.linear2.weight"
    path = tmp_path / "bad.safetensors"
    write_checkpoint(path, layout, drop=key if defect == "missing" else None,
                     reshape=key if defect == "shape" else None)
    with pytest.raises(mimi.CheckpointError, match="linear2") as info:
        mimi.build_model({"checkpoint": path}, device="cpu", depth="reduced")
    assert "\n" not in str(info.value) and isinstance(info.value, InputError)


def test_checkpoint_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        mimi.build_model({"checkpoint": tmp_path / "absent.safetensors"}, depth="reduced")
    other = tmp_path / "mimi.pt"
    other.write_bytes(b"x")
    with pytest.raises(mimi.CheckpointError, match="safetensors"):
        mimi.build_model({"checkpoint": other}, depth="reduced")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors header")
    with pytest.raises(mimi.CheckpointError, match=r"garbage.safetensors does not match .*header") as info:
        mimi.build_model({"checkpoint": garbage}, depth="reduced")
    assert isinstance(info.value, InputError)
    with pytest.raises(InputError, match=r"^spec\['checkpoint'\]: .* is not a file"):
        mimi.build_model({"checkpoint": tmp_path}, depth="reduced")


@pytest.mark.released
def test_released_config_layout_and_bytes():
    model = mimi.build_model({}, device="cpu", depth="released", seed=0)
    assert mimi.state_manifest(model) == manifest("released")
    gen = torch.Generator().manual_seed(99)
    stock, cadence = mimi.new_session(model, "stock", {}), mimi.new_session(model, "cadence", {})
    assert len([b for b in cadence.bindings if b.kind == "RingKVCache.cache"]) == 8
    for k in range(2):
        codes = torch.randint(0, ms.CARDINALITY, (ms.N_Q, 3), generator=gen)
        compare_units("moshi-released", k, stock.speak(codes), cadence.speak(codes))


# --- CUDA: capture ahead and replay -----------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
class TestCudaGraphs:
    @pytest.fixture(scope="class")
    def cuda_model(self):
        return mimi.build_model({}, device="cuda", depth="reduced", seed=0)

    @pytest.mark.parametrize("graphs, kv", [("unit", "host"), ("frame", "host"), ("unit", "stock")])
    def test_prepared_replay_equals_stock_eager(self, cuda_model, units, graphs, kv):
        stock = mimi.new_session(cuda_model, "stock", {})
        cadence = mimi.new_session(cuda_model, "cadence", {"cadence_graphs": graphs, "kv_bookkeeping": kv})
        before = digest(cadence)
        delta = cadence.prepare()                 # None: what every unit needs
        n_graphs = 2 if graphs == "unit" else 1
        assert digest(cadence) == before          # a warm-up and the captures changed no state, no clock
        assert delta["captures"] == delta["graphs"] == n_graphs and delta["capture_failures"] == 0
        assert delta["graph_bytes"] >= 0 and delta["warmup_runs"] <= n_graphs
        base = cadence.arena.base
        for k, codes in enumerate(units[:4]):
            compare_units(f"moshi-reduced-cuda-{graphs}-{kv}", k, stock.speak(codes), cadence.speak(codes))
        stats = cadence.stats()
        assert stats.captures == n_graphs and stats.eager_fallbacks == 0 and stats.eager_runs == 0
        assert stats.replays == (4 if graphs == "unit" else sum(UNIT_FRAMES[:4]))
        assert cadence.arena.base == base and bind.live() == 0

    def test_prepare_takes_the_predicted_signatures(self, cuda_model, units):
        stock = mimi.new_session(cuda_model, "stock", {})
        cadence = mimi.new_session(cuda_model, "cadence", {"cadence_graphs": "unit"})
        assert cadence.prepare(cadence.signatures(13))["captures"] == 1
        assert cadence.prepare(cadence.signatures(13))["captures"] == 0      # already held
        compare_units("moshi-reduced-cuda-13", 0, stock.speak(units[0]), cadence.speak(units[0]))
        stats = cadence.stats()
        assert (stats.captures, stats.replays, stats.eager_fallbacks) == (1, 1, 0)
        compare_units("moshi-reduced-cuda-12", 1, stock.speak(units[1]), cadence.speak(units[1]))
        after = cadence.stats()          # 12 frames, not captured: eager (a warm-up if its first in the process)
        assert after.eager_fallbacks + after.warmup_runs - stats.warmup_runs == 1 and after.captures == 1

    def test_without_prepare_every_step_runs_eagerly_and_is_counted(self, cuda_model, units):
        stock, cadence = mimi.new_session(cuda_model, "stock", {}), mimi.new_session(cuda_model, "cadence", {})
        for k in range(2):
            compare_units("moshi-reduced-cuda-eager", k, stock.speak(units[k]), cadence.speak(units[k]))
        stats = cadence.stats()
        assert stats.captures == stats.replays == 0
        assert stats.eager_fallbacks + stats.warmup_runs == sum(UNIT_FRAMES[:2])

    def test_inline_capture_on_first_use(self, cuda_model, units):
        stock = mimi.new_session(cuda_model, "stock", {})
        cadence = mimi.new_session(cuda_model, "cadence", {"cadence_graphs": "unit", "capture": "inline"})
        for k, codes in enumerate(units[:4]):
            compare_units("moshi-reduced-cuda-inline", k, stock.speak(codes), cadence.speak(codes))
        stats = cadence.stats()
        # each unit: a warm-up (first in the process), a capture (its run is not a replay) or a replay
        assert stats.captures == 2 and stats.captures + stats.replays + stats.warmup_runs == 4
        assert stats.eager_fallbacks == 0

    def test_threads_replay_without_the_lock_and_equal_each_alone(self, cuda_model, units):
        """Prepared cadence sessions and stock sessions speak on their own threads and CUDA streams while
        a thread opens and closes sessions: every unit equals that session alone."""
        specs = [("stock", {}), ("cadence", {}), ("cadence", {"cadence_graphs": "unit"}),
                 ("cadence", {"kv_bookkeeping": "stock"})]

        def open_session(mode, spec):
            session = mimi.new_session(cuda_model, mode, dict(spec))
            session.prepare()
            return session

        alone = []
        for mode, spec in specs:
            session = open_session(mode, spec)
            alone.append([session.speak(codes).waveform.tobytes() for codes in units[:4]])
            session.close()
        sessions = [open_session(mode, spec) for mode, spec in specs]
        got = [None] * len(specs)

        def speaker(i):
            with torch.cuda.stream(torch.cuda.Stream()):
                got[i] = [sessions[i].speak(codes).waveform.tobytes() for codes in units[:4]]
            sessions[i].close()

        errors = threaded.beside_churn([functools.partial(speaker, i) for i in range(len(specs))],
                                       lambda k: mimi.new_session(cuda_model, ("cadence", "stock")[k % 2], {}),
                                       seed=0, pause_s=0)
        assert errors == [] and got == alone

    def test_close_gives_the_device_memory_back(self, cuda_model, units):
        def prepare_and_speak(session):
            session.prepare()
            session.speak(units[0])
        spec = {"cadence_graphs": "unit", "arena_backend": "prealloc"}
        cuda_checks.check_close_gives_the_memory_back(lambda: mimi.new_session(cuda_model, "cadence", spec),
                                                      prepare_and_speak, prepare_and_speak)

    def test_moshi_graphs_baseline_runs(self, cuda_model, units):
        session = mimi.new_session(cuda_model, "stock_graphs", {})
        out = session.speak(units[0])
        assert out.samples == UNIT_FRAMES[0] * SPF and np.isfinite(out.waveform).all()
        assert session.stats().detail["moshi_graphs_captured"] == 2
