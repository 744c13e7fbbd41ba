"""Qwen3-Omni Code2Wav (transformers==5.17.0 `Qwen3OmniMoeCode2Wav.forward(codes [1, 16, T])`, modeling
L3728-3776: code embedding, sliding-window pre-transformer, upsampling, decoder -> wav [1, 1, 1920*T - 555]
@ 24 kHz) on an exact chunk schedule. `schedule` (facts, clock, region, every window's Signature), `stock`
(the serving code's windows), `cadence` (arena + graph replay; opt-in seamless). Modes: "stock" (the
reference), "cadence" (bit-exact), "cadence_seamless" (not bit-exact). Any session may speak on its own host
thread while others of the model speak.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from duplexcadence import rng, upstream
from duplexcadence.errors import CheckpointError, InputError, MissingFileError, one_line
from duplexcadence.adapters.code2wav.cadence import CadenceSession
from duplexcadence.adapters.code2wav.schedule import LEFT_CONTEXT, NUM_QUANTIZERS, WHOLE_CHUNK
from duplexcadence.adapters.code2wav.stock import StockSession
from duplexcadence.payload import shown
from duplexcadence.session import host_waveform

MODES = ("stock", "cadence", "cadence_seamless")
#: The build options open_model passes on (build_model's spec keys a caller may give).
MODEL_OPTIONS = ("dtype", "checkpoint")
#: Released depth = the config class defaults; reduced depth for fast CPU checks of the same classes.
RELEASED: dict = {}
REDUCED = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 4, "decoder_dim": 64}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
CHECKPOINT_PREFIX = "code2wav."   # the released checkpoint's names (vllm-omni hf_to_vllm_mapper)


def code2wav_config(depth: str = "released"):
    """`Qwen3OmniMoeCode2WavConfig` at the released defaults (configuration L515-560) or reduced depth."""
    if depth not in ("released", "reduced"):
        raise InputError(f"depth: expected 'released' or 'reduced', got {shown(depth)}")
    cfg, _ = upstream.qwen3_omni()
    return cfg.Qwen3OmniMoeCode2WavConfig(**(RELEASED if depth == "released" else REDUCED))


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Seeded random weights at a scale that gives non-degenerate audio, drawn on the CPU in float32. The stock
    init (normal(0, 0.02)) gives output std ~0.38 at released width, ~1e-6 at reduced (silence). Here: matrices
    N(0, 1/fan_in) (transposed convs: in * k / stride), embedding N(0, 1), biases N(0, 0.02), SnakeBeta alpha /
    beta N(0, 0.1), LayerScale / ConvNeXt gamma 0.1, norms 1; residual units' second conv and the output conv
    x 0.1. Output std ~0.15 at both depths, nothing clipped; the left context changes the kept samples."""
    gen = torch.Generator().manual_seed(seed)
    output_conv = f"decoder.{len(model.decoder) - 1}.conv.weight"
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            owner_name, leaf = name.rsplit(".", 1)
            owner = model.get_submodule(owner_name)
            if isinstance(owner, torch.nn.Embedding):
                value = torch.randn(p.shape, generator=gen)
            elif isinstance(owner, torch.nn.ConvTranspose1d) and leaf == "weight":
                value = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[0] * p.shape[2] / owner.stride[0])
            elif p.ndim >= 2:
                value = torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]))
            elif leaf == "bias":
                value = 0.02 * torch.randn(p.shape, generator=gen)
            elif leaf in ("alpha", "beta"):
                value = 0.1 * torch.randn(p.shape, generator=gen)
            elif leaf in ("scale", "gamma"):
                value = torch.full(p.shape, 0.1)
            else:                                   # RMSNorm / LayerNorm weights
                value = torch.ones(p.shape)
            if leaf == "weight" and (owner_name.endswith("conv2.conv") or name == output_conv):
                value = value * 0.1
            p.copy_(value)


@rng.seeded_build
def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0):
    """The stock `Qwen3OmniMoeCode2Wav` (attn "sdpa"), eval mode, in spec["dtype"] (default bfloat16). Without
    spec["checkpoint"]: `_from_config(config, dtype=...)`, `randomize_(model, seed)` on the CPU, `.to(device)`
    (the same weights on every device). spec["checkpoint"]: a directory with `model.safetensors` (or a sharded
    index) in the released layout ("code2wav." names, vllm-omni's hf_to_vllm_mapper), optionally config.json,
    loaded by `from_pretrained(..., key_mapping={"^code2wav\\.": ""})`; "thinker." / "talker." keys are ignored.
    Raises InputError (depth, dtype), MissingFileError (no directory there), CheckpointError (unreadable, or
    missing / unexpected / mis-shaped keys)."""
    config = code2wav_config(depth)
    name = spec.get("dtype", "bfloat16")
    name = str(name).replace("torch.", "") if isinstance(name, torch.dtype) else name
    if not isinstance(name, str) or name not in DTYPES:
        raise InputError(f"spec['dtype']: expected one of {sorted(DTYPES)}, got {shown(name)}")
    model_cls = upstream.qwen3_omni()[1].Qwen3OmniMoeCode2Wav
    checkpoint = spec.get("checkpoint")
    if checkpoint is None:
        torch.manual_seed(seed)
        model = model_cls._from_config(config, attn_implementation="sdpa", dtype=DTYPES[name])
        randomize_(model, seed)
        return model.to(device).eval()
    path = Path(checkpoint)
    if not path.is_dir():
        raise MissingFileError(f"spec['checkpoint']: {path} is not a directory (expected model.safetensors "
                                f"[+ config.json] in the released layout)")
    kwargs = {} if (path / "config.json").is_file() else {"config": config}
    # ignore_mismatched_sizes: mis-shaped keys are reported in `info` (and raised below), not re-initialised
    try:
        model, info = model_cls.from_pretrained(
            str(path), dtype=DTYPES[name], attn_implementation="sdpa", key_mapping={r"^code2wav\.": ""},
            output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except (torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as exc:                        # unreadable files, a config of another model, a bad index ...
        raise CheckpointError(f"spec['checkpoint']: {path} cannot be read as the {depth} Code2Wav layout: "
                              f"{one_line(exc)}") from exc
    unexpected = [k for k in info["unexpected_keys"] if not k.startswith(("thinker.", "talker."))]
    if info["missing_keys"] or unexpected or info["mismatched_keys"]:
        raise CheckpointError(f"spec['checkpoint']: {path} does not match the {depth} Code2Wav layout "
                              f"(transformers 5.17.0): missing {sorted(info['missing_keys'])}, unexpected "
                              f"{sorted(unexpected)}, mis-shaped {sorted(info['mismatched_keys'])}")
    return model.to(device).eval()


def state_manifest(model) -> dict:
    """{checkpoint name: [shape]} of every state-dict entry, in the released naming ("code2wav." + name)."""
    return {CHECKPOINT_PREFIX + k: list(v.shape) for k, v in model.state_dict().items()}


def session_options(model, mode: str) -> tuple:
    """The options a session of `mode` takes (new_session's spec keys). Raises InputError for an unknown mode."""
    if mode not in MODES:
        raise InputError(f"mode: expected one of {MODES}, got {shown(mode)}")
    return ("left_context", "initial_frames") + (("capture", "graphs", "arena_backend") if mode != "stock" else ())


def new_session(model, mode: str, spec: dict | None = None):
    """A session on `model` (shared by any number of sessions and threads) in `mode` (MODES). spec: left_context
    (25), initial_frames (4); cadence: capture, graphs, arena_backend (call `prepare()` first on CUDA). Raises
    InputError for an unknown mode or a bad spec value."""
    if mode == "stock":
        return StockSession(model, spec)
    if mode in ("cadence", "cadence_seamless"):
        return CadenceSession(model, spec, seamless=mode == "cadence_seamless")
    raise InputError(f"mode: expected one of {MODES}, got {shown(mode)}")


def whole_utterance(model, codes: torch.Tensor) -> np.ndarray:
    """The second reference row: stock `chunked_decode(codes, 300, 25)` over a whole turn, as transformers'
    generate calls it (L4137). codes: int64 [16, F] (host). Returns float32 [1920*F - 555*ceil(F/300)]."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        wav = model.chunked_decode(codes.reshape(1, NUM_QUANTIZERS, -1).to(device), chunk_size=WHOLE_CHUNK,
                                   left_context_size=LEFT_CONTEXT)
    return host_waveform(wav.float())
