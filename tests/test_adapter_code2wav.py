"""duplexcadence.adapters.code2wav: Qwen3-Omni Code2Wav on its chunk schedule, stock vs cadence, byte for byte.

CPU tests use the reduced config (2 transformer layers, hidden 128, decoder dim 64; same classes, same
16 x 2048 codes) in bfloat16, the workload's dtype; one test runs the released config (float32: bfloat16
convolutions are ~8x slower on CPU) on a short turn.
Cadence runs eagerly on CPU through the same code path as on CUDA (arena views, prepared masks); the
GPU class (graph capture and replay) skips on CPU. Expected lengths and schedules are written out by hand
from the stock code (transformers 5.17.0 `chunked_decode`, vllm-omni `talker2code2wav_async_chunk`).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from duplexcadence.adapters import code2wav as c2w
from duplexcadence.errors import InputError
from duplexcadence.runtime import BitMismatch, compare_units

SPF, LOSS = 1920, 555                       # samples per 12.5 Hz frame; samples lost per call
TURN = [12, 13, 12, 13, 5]                  # initial + ramp, ramp, steady, steady, final
# Reduced-config checkpoint layout in the released naming (keys "code2wav." + module path, as in the
# Qwen3-Omni checkpoint; vllm-omni's hf_to_vllm_mapper): written from transformers 5.17.0, kept as data.
MANIFEST = """\
code2wav.pre_transformer.layers.0.self_attn.q_proj.weight 128,128
code2wav.pre_transformer.layers.0.self_attn.k_proj.weight 128,128
code2wav.pre_transformer.layers.0.self_attn.v_proj.weight 128,128
code2wav.pre_transformer.layers.0.self_attn.o_proj.weight 128,128
code2wav.pre_transformer.layers.0.mlp.gate_proj.weight 256,128
code2wav.pre_transformer.layers.0.mlp.up_proj.weight 256,128
code2wav.pre_transformer.layers.0.mlp.down_proj.weight 128,256
code2wav.pre_transformer.layers.0.input_layernorm.weight 128
code2wav.pre_transformer.layers.0.post_attention_layernorm.weight 128
code2wav.pre_transformer.layers.0.self_attn_layer_scale.scale 128
code2wav.pre_transformer.layers.0.mlp_layer_scale.scale 128
code2wav.pre_transformer.layers.1.self_attn.q_proj.weight 128,128
code2wav.pre_transformer.layers.1.self_attn.k_proj.weight 128,128
code2wav.pre_transformer.layers.1.self_attn.v_proj.weight 128,128
code2wav.pre_transformer.layers.1.self_attn.o_proj.weight 128,128
code2wav.pre_transformer.layers.1.mlp.gate_proj.weight 256,128
code2wav.pre_transformer.layers.1.mlp.up_proj.weight 256,128
code2wav.pre_transformer.layers.1.mlp.down_proj.weight 128,256
code2wav.pre_transformer.layers.1.input_layernorm.weight 128
code2wav.pre_transformer.layers.1.post_attention_layernorm.weight 128
code2wav.pre_transformer.layers.1.self_attn_layer_scale.scale 128
code2wav.pre_transformer.layers.1.mlp_layer_scale.scale 128
code2wav.pre_transformer.norm.weight 128
code2wav.code_embedding.weight 32768,128
code2wav.upsample.0.0.conv.weight 128,128,2
code2wav.upsample.0.0.conv.bias 128
code2wav.upsample.0.1.gamma 128
code2wav.upsample.0.1.dwconv.conv.weight 128,1,7
code2wav.upsample.0.1.dwconv.conv.bias 128
code2wav.upsample.0.1.norm.weight 128
code2wav.upsample.0.1.norm.bias 128
code2wav.upsample.0.1.pwconv1.weight 512,128
code2wav.upsample.0.1.pwconv1.bias 512
code2wav.upsample.0.1.pwconv2.weight 128,512
code2wav.upsample.0.1.pwconv2.bias 128
code2wav.upsample.1.0.conv.weight 128,128,2
code2wav.upsample.1.0.conv.bias 128
code2wav.upsample.1.1.gamma 128
code2wav.upsample.1.1.dwconv.conv.weight 128,1,7
code2wav.upsample.1.1.dwconv.conv.bias 128
code2wav.upsample.1.1.norm.weight 128
code2wav.upsample.1.1.norm.bias 128
code2wav.upsample.1.1.pwconv1.weight 512,128
code2wav.upsample.1.1.pwconv1.bias 512
code2wav.upsample.1.1.pwconv2.weight 128,512
code2wav.upsample.1.1.pwconv2.bias 128
code2wav.decoder.0.conv.weight 64,128,7
code2wav.decoder.0.conv.bias 64
code2wav.decoder.1.block.0.alpha 64
code2wav.decoder.1.block.0.beta 64
code2wav.decoder.1.block.1.conv.weight 64,32,16
code2wav.decoder.1.block.1.conv.bias 32
code2wav.decoder.1.block.2.act1.alpha 32
code2wav.decoder.1.block.2.act1.beta 32
code2wav.decoder.1.block.2.conv1.conv.weight 32,32,7
code2wav.decoder.1.block.2.conv1.conv.bias 32
code2wav.decoder.1.block.2.act2.alpha 32
code2wav.decoder.1.block.2.act2.beta 32
code2wav.decoder.1.block.2.conv2.conv.weight 32,32,1
code2wav.decoder.1.block.2.conv2.conv.bias 32
code2wav.decoder.1.block.3.act1.alpha 32
code2wav.decoder.1.block.3.act1.beta 32
code2wav.decoder.1.block.3.conv1.conv.weight 32,32,7
code2wav.decoder.1.block.3.conv1.conv.bias 32
code2wav.decoder.1.block.3.act2.alpha 32
code2wav.decoder.1.block.3.act2.beta 32
code2wav.decoder.1.block.3.conv2.conv.weight 32,32,1
code2wav.decoder.1.block.3.conv2.conv.bias 32
code2wav.decoder.1.block.4.act1.alpha 32
code2wav.decoder.1.block.4.act1.beta 32
code2wav.decoder.1.block.4.conv1.conv.weight 32,32,7
code2wav.decoder.1.block.4.conv1.conv.bias 32
code2wav.decoder.1.block.4.act2.alpha 32
code2wav.decoder.1.block.4.act2.beta 32
code2wav.decoder.1.block.4.conv2.conv.weight 32,32,1
code2wav.decoder.1.block.4.conv2.conv.bias 32
code2wav.decoder.2.block.0.alpha 32
code2wav.decoder.2.block.0.beta 32
code2wav.decoder.2.block.1.conv.weight 32,16,10
code2wav.decoder.2.block.1.conv.bias 16
code2wav.decoder.2.block.2.act1.alpha 16
code2wav.decoder.2.block.2.act1.beta 16
code2wav.decoder.2.block.2.conv1.conv.weight 16,16,7
code2wav.decoder.2.block.2.conv1.conv.bias 16
code2wav.decoder.2.block.2.act2.alpha 16
code2wav.decoder.2.block.2.act2.beta 16
code2wav.decoder.2.block.2.conv2.conv.weight 16,16,1
code2wav.decoder.2.block.2.conv2.conv.bias 16
code2wav.decoder.2.block.3.act1.alpha 16
code2wav.decoder.2.block.3.act1.beta 16
code2wav.decoder.2.block.3.conv1.conv.weight 16,16,7
code2wav.decoder.2.block.3.conv1.conv.bias 16
code2wav.decoder.2.block.3.act2.alpha 16
code2wav.decoder.2.block.3.act2.beta 16
code2wav.decoder.2.block.3.conv2.conv.weight 16,16,1
code2wav.decoder.2.block.3.conv2.conv.bias 16
code2wav.decoder.2.block.4.act1.alpha 16
code2wav.decoder.2.block.4.act1.beta 16
code2wav.decoder.2.block.4.conv1.conv.weight 16,16,7
code2wav.decoder.2.block.4.conv1.conv.bias 16
code2wav.decoder.2.block.4.act2.alpha 16
code2wav.decoder.2.block.4.act2.beta 16
code2wav.decoder.2.block.4.conv2.conv.weight 16,16,1
code2wav.decoder.2.block.4.conv2.conv.bias 16
code2wav.decoder.3.block.0.alpha 16
code2wav.decoder.3.block.0.beta 16
code2wav.decoder.3.block.1.conv.weight 16,8,8
code2wav.decoder.3.block.1.conv.bias 8
code2wav.decoder.3.block.2.act1.alpha 8
code2wav.decoder.3.block.2.act1.beta 8
code2wav.decoder.3.block.2.conv1.conv.weight 8,8,7
code2wav.decoder.3.block.2.conv1.conv.bias 8
code2wav.decoder.3.block.2.act2.alpha 8
code2wav.decoder.3.block.2.act2.beta 8
code2wav.decoder.3.block.2.conv2.conv.weight 8,8,1
code2wav.decoder.3.block.2.conv2.conv.bias 8
code2wav.decoder.3.block.3.act1.alpha 8
code2wav.decoder.3.block.3.act1.beta 8
code2wav.decoder.3.block.3.conv1.conv.weight 8,8,7
code2wav.decoder.3.block.3.conv1.conv.bias 8
code2wav.decoder.3.block.3.act2.alpha 8
code2wav.decoder.3.block.3.act2.beta 8
code2wav.decoder.3.block.3.conv2.conv.weight 8,8,1
code2wav.decoder.3.block.3.conv2.conv.bias 8
code2wav.decoder.3.block.4.act1.alpha 8
code2wav.decoder.3.block.4.act1.beta 8
code2wav.decoder.3.block.4.conv1.conv.weight 8,8,7
code2wav.decoder.3.block.4.conv1.conv.bias 8
code2wav.decoder.3.block.4.act2.alpha 8
code2wav.decoder.3.block.4.act2.beta 8
code2wav.decoder.3.block.4.conv2.conv.weight 8,8,1
code2wav.decoder.3.block.4.conv2.conv.bias 8
code2wav.decoder.4.block.0.alpha 8
code2wav.decoder.4.block.0.beta 8
code2wav.decoder.4.block.1.conv.weight 8,4,6
code2wav.decoder.4.block.1.conv.bias 4
code2wav.decoder.4.block.2.act1.alpha 4
code2wav.decoder.4.block.2.act1.beta 4
code2wav.decoder.4.block.2.conv1.conv.weight 4,4,7
code2wav.decoder.4.block.2.conv1.conv.bias 4
code2wav.decoder.4.block.2.act2.alpha 4
code2wav.decoder.4.block.2.act2.beta 4
code2wav.decoder.4.block.2.conv2.conv.weight 4,4,1
code2wav.decoder.4.block.2.conv2.conv.bias 4
code2wav.decoder.4.block.3.act1.alpha 4
code2wav.decoder.4.block.3.act1.beta 4
code2wav.decoder.4.block.3.conv1.conv.weight 4,4,7
code2wav.decoder.4.block.3.conv1.conv.bias 4
code2wav.decoder.4.block.3.act2.alpha 4
code2wav.decoder.4.block.3.act2.beta 4
code2wav.decoder.4.block.3.conv2.conv.weight 4,4,1
code2wav.decoder.4.block.3.conv2.conv.bias 4
code2wav.decoder.4.block.4.act1.alpha 4
code2wav.decoder.4.block.4.act1.beta 4
code2wav.decoder.4.block.4.conv1.conv.weight 4,4,7
code2wav.decoder.4.block.4.conv1.conv.bias 4
code2wav.decoder.4.block.4.act2.alpha 4
code2wav.decoder.4.block.4.act2.beta 4
code2wav.decoder.4.block.4.conv2.conv.weight 4,4,1
code2wav.decoder.4.block.4.conv2.conv.bias 4
code2wav.decoder.5.alpha 4
code2wav.decoder.5.beta 4
code2wav.decoder.6.conv.weight 1,4,7
code2wav.decoder.6.conv.bias 1
"""


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)                # 2-core CI machine: one intra-op thread avoids contention
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return c2w.build_model({"dtype": "bfloat16"}, device="cpu", depth="reduced", seed=0)


def make_units(frames, seed=7):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2048, (16, n), generator=gen) for n in frames]


class WindowSpy:
    """Records the codes tensor every forward of the model receives (shape, strides, bytes)."""

    def __init__(self, model):
        self.seen = []
        self.handle = model.register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        codes = args[0]
        self.seen.append((tuple(codes.shape), codes.stride(), codes.is_contiguous(), codes.dtype,
                          codes.numpy().tobytes()))

    def take(self):
        out, self.seen = self.seen, []
        return out


@pytest.fixture(scope="module")
def turn_run(model):
    """One turn of TURN through stock and cadence (interleaved, one model), every window recorded."""
    stock, cadence = c2w.new_session(model, "stock"), c2w.new_session(model, "cadence")
    stock.start_turn()
    cadence.start_turn()
    ptrs = {n: r.data_ptr() for n, r in cadence.arena.regions.items()}
    spy = WindowSpy(model)
    outs, windows = [], []
    try:
        for k, codes in enumerate(make_units(TURN)):
            final = k == len(TURN) - 1
            a = stock.speak(codes, final=final)
            wa = spy.take()
            b = cadence.speak(codes.tolist() if k % 2 else codes, final=final)
            outs.append((a, b))
            windows.append((wa, spy.take()))
    finally:
        spy.handle.remove()
    return {"stock": stock, "cadence": cadence, "outs": outs, "windows": windows, "ptrs": ptrs}


# --- the schedule ---------------------------------------------------------------------------------
def test_schedule_matches_the_serving_code():
    # vllm-omni: chunk 0 = the initial 4 frames, chunk 1 has left context = 4; then min(25, frames so far)
    got = [[(c.phase, c.ctx, c.new, c.offset) for c in unit] for unit in c2w.turn_schedule(TURN)]
    assert got == [[("initial", 0, 4, 0), ("ramp", 4, 8, 4)], [("ramp", 12, 13, 0)],
                   [("steady", 25, 12, 0)], [("steady", 25, 13, 0)], [("final", 25, 5, 0)]]
    assert [[(c.ctx, c.new) for c in u] for u in c2w.turn_schedule([3])] == [[(0, 3)]]
    assert [[(c.ctx, c.new) for c in u] for u in c2w.turn_schedule([12, 13], initial=0)] == [[(0, 12)], [(12, 13)]]


def test_region_is_declared_with_its_bound():
    region = c2w.codes_region()
    assert region.clock == "codec" and region.policy.bound() == 25 + 13
    assert region.step(25, 13) == (38, 25) and region.step(4, 8) == (12, 12)


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
    for stock_calls, cadence_calls in turn_run["windows"]:
        assert len(stock_calls) == len(cadence_calls)
        for s, c in zip(stock_calls, cadence_calls):
            assert s[:4] == c[:4]                       # shape, strides, contiguous, dtype
            assert s[2] is True and s[3] == torch.int64
            assert s[4] == c[4]                         # the window's bytes
            shapes.append(s[0][2])
    assert shapes == [4, 12, 25, 37, 38, 30]


def test_every_call_returns_1920n_minus_555(turn_run):
    want_calls = [[4 * SPF - LOSS, 8 * SPF - LOSS], [13 * SPF - LOSS], [12 * SPF - LOSS], [13 * SPF - LOSS],
                  [5 * SPF - LOSS]]
    for (a, b), want in zip(turn_run["outs"], want_calls):
        assert [c["samples"] for c in a.info["calls"]] == want
        assert a.samples == b.samples == sum(want) and a.pcm16.dtype == np.int16


def test_arena_addresses_are_stable(turn_run):
    cadence = turn_run["cadence"]
    assert {n: r.data_ptr() for n, r in cadence.arena.regions.items()} == turn_run["ptrs"]
    assert cadence.last_window.data_ptr() == cadence.arena["codes.window"].data_ptr()


def test_hook_is_gone_after_a_cadence_call(turn_run, model):
    assert len(model.pre_transformer._forward_pre_hooks) == 0


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


# --- bad input -------------------------------------------------------------------------------------
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
    pytest.param(lambda: torch.zeros(16, 0, dtype=torch.int64), "1..13 frames", id="0-frames"),
    pytest.param(lambda: torch.zeros(16, 14, dtype=torch.int64), "1..13 frames", id="14-frames"),
    pytest.param(lambda: "codes", "list of 16 lists", id="string"),
]


@pytest.mark.parametrize("mode", ["stock", "cadence"])
@pytest.mark.parametrize("make_bad,match", BAD)
def test_bad_codes_rejected_state_unchanged(model, mode, make_bad, match):
    session = c2w.new_session(model, mode, SMALL)
    session.start_turn()
    session.speak(good())                                 # context holds 3 frames now
    before = session.state()
    with pytest.raises(InputError, match=match):
        session.speak(make_bad())
    assert session.state() == before


@pytest.mark.parametrize("mode", ["stock", "cadence"])
def test_speak_outside_an_open_turn_is_rejected(model, mode):
    session = c2w.new_session(model, mode, SMALL)
    with pytest.raises(InputError, match="no open turn"):
        session.speak(good())
    session.start_turn()
    session.speak(good(), final=True)
    before = session.state()
    with pytest.raises(InputError, match="no open turn"):
        session.speak(good())                             # a unit after the final unit of a turn
    assert session.state() == before and before["ctx"] is None


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
    tensors = {}
    for line in MANIFEST.strip().splitlines():
        name, shape = line.split()
        tensors[name] = torch.randn([int(s) for s in shape.split(",")], generator=gen)
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


# --- the harness, tiny ---------------------------------------------------------------------------------
def test_check_script_runs_tiny_on_cpu(tmp_path):
    from suite.gpu import code2wav_check

    code2wav_check.main(["--device", "cpu", "--depth", "reduced", "--units", "1", "--turn-units", "1",
                         "--warmup-units", "1", "--no-whole", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "code2wav_check.json").read_text())
    assert record["units_measured"] == 1 and record["targets"]["bit_exact"] is True
    assert all(u["equal"] for u in record["units"]) and len(record["units"]) == 2
    assert any("measured units < 30" in r for r in record["invalid_reasons"])


# --- CUDA: graphs per exact shape ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture and replay")
class TestGraphs:
    def test_graphs_replay_bit_exact_per_exact_shape(self):
        model = c2w.build_model({"dtype": "bfloat16"}, device="cuda", depth="reduced", seed=0)
        stock, cadence = c2w.new_session(model, "stock"), c2w.new_session(model, "cadence")
        for turn in range(2):
            for s in (stock, cadence):
                s.start_turn()
            for k, codes in enumerate(make_units(TURN, seed=turn)):
                final = k == len(TURN) - 1
                compare_units("qwen3_omni", k, stock.speak(codes, final=final), cadence.speak(codes, final=final))
        stats = cadence.stats()
        shapes = {(c.ctx, c.new) for u in c2w.turn_schedule(TURN) for c in u}
        assert stats["graphs"]["captures"] == len(shapes) == 6
        assert stats["graphs"]["replays"] == 6 and stats["graphs"]["eager_fallbacks"] == 0
        assert stats["graph_pool_bytes"] > 0 and len(stats["graph_pool_bytes_per_shape"]) == 6

    def test_prepared_graphs_only_replay(self):
        model = c2w.build_model({"dtype": "bfloat16"}, device="cuda", depth="reduced", seed=0)
        stock, cadence = c2w.new_session(model, "stock"), c2w.new_session(model, "cadence")
        cadence.prepare(cadence.signature(c) for u in c2w.turn_schedule(TURN) for c in u)
        captured = cadence.stats()["graphs"]["captures"]
        for s in (stock, cadence):
            s.start_turn()
        for k, codes in enumerate(make_units(TURN, seed=5)):
            final = k == len(TURN) - 1
            compare_units("qwen3_omni", k, stock.speak(codes, final=final), cadence.speak(codes, final=final))
        assert cadence.stats()["graphs"]["captures"] == captured == 6
