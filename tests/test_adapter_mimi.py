"""duplexcadence.adapters.mimi: Moshi's Mimi decoder, stock eager vs DuplexCadence, byte for byte.

CPU tests use the reduced config (2 transformer layers, same 8 x 250 x 64 ring KV caches) and run the
stock and cadence sessions interleaved over one model instance; one test uses the released config. GPU
classes (graph capture and replay) skip on CPU.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from duplexcadence.adapters import mimi, mimi_cadence
from duplexcadence.clocks import Fixed, Ring
from duplexcadence.errors import InputError
from duplexcadence.runtime import compare_units

MANIFEST = Path(__file__).parent / "data" / "mimi_manifest.json"
UNIT_FRAMES = [13, 12] * 5 + [13]          # 138 frames = 276 positions: past the 250-slot ring wrap
SPF = mimi.SAMPLES_PER_FRAME


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # the CI machine has 2 cores; one intra-op thread avoids spin contention (about 10x faster here)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return mimi.build_model({}, device="cpu", depth="reduced", seed=0)


@pytest.fixture(scope="module")
def units():
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, mimi.CARDINALITY, (mimi.N_Q, f), generator=gen) for f in UNIT_FRAMES]


@pytest.fixture(scope="module")
def long_run(model, units):
    """Stock eager and cadence ("unit" graphs; eager on CPU) over the same 11 units, interleaved."""
    stock = mimi.new_session(model, "stock", {})
    cadence = mimi.new_session(model, "cadence", {"cadence_graphs": "unit"})
    stock_kv = mimi.new_session(model, "cadence", {"cadence_graphs": "unit", "kv_bookkeeping": "stock"})
    ptrs_before = {b.spec.name: b.view.data_ptr() for b in cadence.bindings}
    base_before = cadence.arena.base
    outs, outs_stock_kv = [], []
    for k, codes in enumerate(units):
        outs.append((stock.speak(codes), cadence.speak(codes.tolist() if k % 2 else codes)))
        outs_stock_kv.append(stock_kv.speak(codes))
    return {"stock": stock, "cadence": cadence, "stock_kv": stock_kv, "outs": outs,
            "outs_stock_kv": outs_stock_kv, "ptrs_before": ptrs_before, "base_before": base_before}


def stock_frames(long_run, unit: int, start: int, stop: int) -> bytes:
    return long_run["outs"][unit][0].waveform[start * SPF:stop * SPF].tobytes()


def digest(session) -> str:
    """sha256 over every state tensor's bytes (copied to the host) and every host counter."""
    h = hashlib.sha256()
    for name, value in sorted(mimi.state_tensors(session).items()):
        h.update(name.encode())
        h.update(value.cpu().contiguous().view(torch.uint8).numpy().tobytes()
                 if isinstance(value, torch.Tensor) else str(value).encode())
    return h.hexdigest()


# --- bit-exactness ------------------------------------------------------------------------------
def test_cadence_equals_stock_bytes_across_ring_wrap(long_run):
    cadence = long_run["cadence"]
    assert cadence.positions == 2 * sum(UNIT_FRAMES) > cadence.kv_slots() == 250
    for k, (s, c) in enumerate(long_run["outs"]):
        assert s.samples == UNIT_FRAMES[k] * SPF
        compare_units("moshi-reduced", k, s, c)          # float32 waveform and int16 PCM, bytes
        compare_units("moshi-reduced-stock-kv-bookkeeping", k, s, long_run["outs_stock_kv"][k])


def test_host_ring_rows_equal_moshis_ring_bookkeeping():
    """ring_rows (host) against moshi's RingKVCache.complete itself, call by call, past two wraps."""
    from moshi.modules.transformer import RingKVCache

    capacity, calls = 10, 14
    ring = RingKVCache(1, 1, 1, capacity, device=torch.device("cpu"), dtype=torch.float32)
    rows = mimi_cadence.ring_rows(0, calls, capacity)
    assert torch.equal(mimi_cadence.ring_rows(6, calls - 3, capacity), rows[3:])   # later start, later rows
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
    for k in range(2):
        out = cadence.speak(units[k])
        compare_units("moshi-reduced", k, long_run["outs"][k][0], out)
        assert out.info["signature"] == ("frame", 1, 1, 250)


def test_unit_boundaries_do_not_matter(model, units, long_run):
    """Frames are decoded one by one: 13 frames as 3 + 10 give the same bytes as stock's unit of 13."""
    cadence = mimi.new_session(model, "cadence", {})
    a, b = cadence.speak(units[0][:, :3]), cadence.speak(units[0][:, 3:])
    assert a.waveform.tobytes() + b.waveform.tobytes() == stock_frames(long_run, 0, 0, 13)


# --- the arena is the state ----------------------------------------------------------------------
def test_regions_stay_at_their_arena_addresses(long_run):
    cadence = long_run["cadence"]
    assert cadence.arena.base == long_run["base_before"]
    assert {b.spec.name: b.view.data_ptr() for b in cadence.bindings} == long_run["ptrs_before"]
    for b in cadence.bindings:            # moshi updated every state in place: none was rebound
        assert getattr(b.owner, b.attr) is b.view, b.spec.name
    assert cadence.rebinds == 0


@pytest.mark.parametrize("which, n_counters", [("cadence", 2 + 1), ("stock_kv", 2 * 2 + 1)])
def test_counters_follow_the_host_clock(long_run, which, n_counters):
    """Device counters equal clock POSITIONS: per layer the RoPE offset (and, with moshi's own ring
    bookkeeping, the ring's end_offset), plus the transformer's offsets."""
    session = long_run[which]
    counters = [b for b in session.bindings if b.view.dtype == torch.int64]
    assert len(counters) == n_counters
    for b in counters:
        assert b.view.tolist() == [session.positions], b.spec.name


def test_regions_cover_every_decoder_state_tensor(model, long_run):
    cadence, stock = long_run["cadence"], long_run["stock"]
    stock_tensors = mimi.state_tensors(stock)
    decoder_side = {n for n, v in stock_tensors.items() if isinstance(v, torch.Tensor) and v.numel()
                    and n.split(".")[0] in ("decoder", "decoder_transformer", "upsample", "exec_mask")}
    assert {b.spec.name for b in long_run["stock_kv"].bindings} == decoder_side
    ends = {n for n in decoder_side if n.endswith("kv_cache.end_offset")}
    assert len(ends) == 2 and {b.spec.name for b in cadence.bindings} == decoder_side - ends
    assert not any(n.startswith(("encoder", "downsample")) for n in mimi.state_tensors(cadence))
    kv = [b for b in cadence.bindings if b.kind == "RingKVCache.cache"]
    assert [tuple(b.view.shape) for b in kv] == [(2, 1, 8, 250, 64)] * 2
    assert all(b.spec.policy == Ring(250) and b.spec.clock == "positions" for b in kv)
    tails = {b.spec.name: b.spec for b in cadence.bindings if b.attr in ("previous", "partial")}
    assert tails["upsample.convtr.partial"].policy == Fixed(2)           # K 4 - stride 2
    assert tails["decoder.model.2.partial"].policy == Fixed(8)           # K 16 - stride 8
    assert tails["decoder.model.14.previous"].clock == "samples"              # last conv @ 24 kHz
    steps = mimi.session_schedule(cadence.bindings, UNIT_FRAMES)
    assert len({tuple(sorted(s.before.items())) for s in steps}) == 1       # one shape per session
    assert {cadence.signature(f) for f in UNIT_FRAMES} == {("unit", 13, 1, 250), ("unit", 12, 1, 250)}


def _corrupt(cadence, kind: str) -> None:
    views = {b.spec.name: b.view for b in cadence.bindings}
    layer0 = "decoder_transformer.transformer.layers.0.self_attn"
    if kind == "host_clock_one_frame_ahead":
        cadence.frames += 1
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


# --- input errors lose nothing --------------------------------------------------------------------
BAD_CODES = [
    pytest.param([[0] * 2] * 7, id="7-codebooks"),
    pytest.param([[0] * 2] * 9, id="9-codebooks"),
    pytest.param([[0, 2048]] + [[0, 0]] * 7, id="id-2048"),
    pytest.param([[0, -1]] + [[0, 0]] * 7, id="id-negative"),
    pytest.param([[0, 1.0]] + [[0, 0]] * 7, id="float-id"),
    pytest.param([[0, True]] + [[0, 0]] * 7, id="bool-id"),
    pytest.param([[0, 1]] + [[0]] * 7, id="ragged"),
    pytest.param([[0] * 14] * 8, id="14-frames"),
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
def test_bad_codes_rejected_and_state_unchanged(model, units, long_run, mode, bad):
    session = mimi.new_session(model, mode, {})
    session.speak(units[0][:, :2])
    before = digest(session)
    with pytest.raises(InputError, match="codes"):
        session.speak(bad)
    assert digest(session) == before
    assert session.frames == 2
    out = session.speak(units[0][:, 2:3])                   # nothing was lost
    assert out.waveform.tobytes() == stock_frames(long_run, 0, 2, 3)


def test_start_turn_keeps_the_stream(model, units, long_run):
    cadence = mimi.new_session(model, "cadence", {})
    cadence.speak(units[0][:, :2])
    before = digest(cadence)
    cadence.start_turn()
    assert digest(cadence) == before
    assert cadence.speak(units[0][:, 2:3]).waveform.tobytes() == stock_frames(long_run, 0, 2, 3)


def test_bad_mode_and_spec(model):
    with pytest.raises(ValueError, match="mode"):
        mimi.new_session(model, "fast", {})
    with pytest.raises(ValueError, match="cadence_graphs"):
        mimi.new_session(model, "cadence", {"cadence_graphs": "padded"})
    with pytest.raises(ValueError, match="kv_bookkeeping"):
        mimi.new_session(model, "cadence", {"kv_bookkeeping": "device"})
    with pytest.raises(ValueError, match="depth"):
        mimi.build_model({}, depth="tiny")


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
    with pytest.raises(mimi.CheckpointError, match="linear2"):
        mimi.build_model({"checkpoint": path}, device="cpu", depth="reduced")


def test_checkpoint_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        mimi.build_model({"checkpoint": tmp_path / "absent.safetensors"}, depth="reduced")
    other = tmp_path / "mimi.pt"
    other.write_bytes(b"x")
    with pytest.raises(mimi.CheckpointError, match="safetensors"):
        mimi.build_model({"checkpoint": other}, depth="reduced")


@pytest.mark.released
def test_released_config_layout_and_bytes():
    model = mimi.build_model({}, device="cpu", depth="released", seed=0)
    assert mimi.state_manifest(model) == manifest("released")
    gen = torch.Generator().manual_seed(99)
    stock, cadence = mimi.new_session(model, "stock", {}), mimi.new_session(model, "cadence", {})
    assert len([b for b in cadence.bindings if b.kind == "RingKVCache.cache"]) == 8
    for k in range(2):
        codes = torch.randint(0, mimi.CARDINALITY, (mimi.N_Q, 3), generator=gen)
        compare_units("moshi-released", k, stock.speak(codes), cadence.speak(codes))


# --- CUDA: capture and replay -----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
class TestCudaGraphs:
    @pytest.fixture(scope="class")
    def cuda_model(self):
        return mimi.build_model({}, device="cuda", depth="reduced", seed=0)

    @pytest.mark.parametrize("graphs, kv", [("unit", "host"), ("frame", "host"), ("unit", "stock")])
    def test_replay_equals_stock_eager(self, cuda_model, units, graphs, kv):
        stock = mimi.new_session(cuda_model, "stock", {})
        cadence = mimi.new_session(cuda_model, "cadence", {"cadence_graphs": graphs, "kv_bookkeeping": kv})
        base = cadence.arena.base
        for k, codes in enumerate(units[:4]):
            compare_units(f"moshi-reduced-cuda-{graphs}", k, stock.speak(codes), cadence.speak(codes))
        stats = cadence.graphs.stats
        assert stats.captures == (2 if graphs == "unit" else 1) and stats.capture_failures == 0
        assert stats.replays == (2 if graphs == "unit" else sum(UNIT_FRAMES[:4]) - 1)   # capture runs once
        assert stats.eager_runs == 0 and cadence.arena.base == base

    def test_prepare_captures_ahead_and_changes_nothing(self, cuda_model, units):
        stock = mimi.new_session(cuda_model, "stock", {})
        cadence = mimi.new_session(cuda_model, "cadence", {"cadence_graphs": "unit"})
        before = digest(cadence)
        assert cadence.prepare((12, 13)) == [("unit", 12, 1, 250), ("unit", 13, 1, 250)]
        assert digest(cadence) == before and cadence.graphs.stats.captures == 2
        for k, codes in enumerate(units[:3]):
            compare_units("moshi-reduced-cuda-prepared", k, stock.speak(codes), cadence.speak(codes))
        assert cadence.graphs.stats.captures == 2 and cadence.graphs.stats.replays == 3

    def test_moshi_graphs_baseline_runs(self, cuda_model, units):
        session = mimi.new_session(cuda_model, "stock_graphs", {})
        out = session.speak(units[0])
        assert out.samples == UNIT_FRAMES[0] * SPF and np.isfinite(out.waveform).all()
