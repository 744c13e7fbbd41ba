"""Moshi's Mimi decoder (moshi==0.2.13, `MimiModel.decode`, models/compression.py L406-429, built by
`loaders.get_mimi`, L323-363): `schedule` (facts, clocks, regions, every step's Signature), `stock` (moshi's
server loop; sessions' own streaming states), `cadence` (arena + graph replay). Modes: "stock" (the
bit-exact reference), "stock_graphs" (moshi's CUDAGraphed baseline), "cadence". Any session may speak on its
own host thread while others of the model speak; a stock_graphs unit that may capture waits to run alone
(stock.StockGraphsSession).
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from torch import nn

from duplexcadence import rng, upstream
from duplexcadence.errors import CheckpointError, InputError, MissingFileError, one_line
from duplexcadence.adapters.mimi.cadence import OPTIONS as CADENCE_OPTIONS, CadenceSession
from duplexcadence.adapters.mimi.schedule import N_Q
from duplexcadence.adapters.mimi.stock import StockGraphsSession, StockSession
from duplexcadence.payload import shown

MODES = ("stock", "stock_graphs", "cadence")
#: The build options open_model passes on (build_model's spec keys a caller may give).
MODEL_OPTIONS = ("checkpoint",)
DEPTHS = ("released", "reduced")
#: CI's config: the same classes and loader, 2 transformer layers, 16 SEANet base filters, 8 quantizer levels;
#: the KV caches keep their released shape (8 heads x 64, context 250: the ring wraps). ~8x faster on CPU.
REDUCED = {"transformer": {"num_layers": 2}, "seanet": {"n_filters": 16}, "quantizer": {"n_q": 8}}


def mimi_config(depth: str) -> dict:
    """moshi's released Mimi config (loaders._mimi_config, L28-88), or the reduced one (`REDUCED`)."""
    if depth not in DEPTHS:
        raise InputError(f"depth: expected one of {DEPTHS}, got {shown(depth)}")
    loaders, _ = upstream.moshi()
    cfg = copy.deepcopy(loaders._mimi_config)
    for section, overrides in (REDUCED.items() if depth == "reduced" else ()):
        cfg[section].update(overrides)
    return cfg


def randomize_(model: nn.Module, seed: int) -> None:
    """Seeded random weights that give non-degenerate audio. moshi leaves every codebook's `embedding_sum` at
    zero (core_vq.py L157-159: every code decodes to the same latent) and the default init shrinks the signal
    through SEANet. Here: conv / conv-transpose / linear weights N(0, 1/fan_in) (transposed: in/groups * K /
    stride), biases N(0, 0.02^2), codebook sums N(0, 1), LayerScale 0.2 * (1 + N(0, 0.1^2)), the last SEANet
    conv x 0.15 (std ~0.15, no clipping, both depths); norms as constructed. A CPU generator: the same weights
    on every device. The cached codebook `_embedding` (core_vq.py L179-186) is cleared."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
            fan = (mod.weight.shape[0] // mod.groups * mod.weight.shape[2] / mod.stride[0]
                   if isinstance(mod, nn.ConvTranspose1d) else math.prod(mod.weight.shape[1:])
                   if isinstance(mod, (nn.Conv1d, nn.Linear)) else None)
            if fan is not None:
                mod.weight.copy_(torch.randn(tuple(mod.weight.shape), generator=gen) / math.sqrt(fan))
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(tuple(mod.bias.shape), generator=gen) * 0.02)
            if type(mod).__name__ == "EuclideanCodebook":
                mod.embedding_sum.copy_(torch.randn(tuple(mod.embedding_sum.shape), generator=gen))
                mod._embedding = None
            if type(mod).__name__ == "LayerScale":
                mod.scale.copy_(0.2 * (1 + 0.1 * torch.randn(tuple(mod.scale.shape), generator=gen)))
        for p in (model.decoder.model[-1].conv.conv.weight, model.decoder.model[-1].conv.conv.bias):
            p.mul_(0.15)


def _materialise_codebooks(model: nn.Module) -> nn.Module:
    """The codebooks' lazy tables (`_embedding`, `_cached_initialized`: core_vq.py L179-194), made here once,
    not inside some session's first decode or capture on the shared model."""
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__ == "EuclideanCodebook":
                _ = mod.embedding, mod.initialized
    return model.eval()


@rng.seeded_build
def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0):
    """The stock `MimiModel` from `loaders.get_mimi(filename, config, device, num_codebooks=8)`, eval mode.
    spec["checkpoint"]: a `.safetensors` file in the released layout (tests/data/mimi_manifest.json), loaded
    by moshi's loader (strict); without it `torch.manual_seed(seed)`, the stock constructors, then
    `randomize_(model, seed + 1)`. depth: "released" or "reduced" (`REDUCED`). Raises InputError (depth),
    MissingFileError (no file there), CheckpointError (not a .safetensors file, unreadable, or missing /
    unexpected / mis-shaped keys)."""
    loaders, cfg, checkpoint = upstream.moshi()[0], mimi_config(depth), spec.get("checkpoint")
    device = torch.device(device)
    torch.manual_seed(seed)
    if checkpoint is None:
        model = loaders.get_mimi(None, cfg, device=device, num_codebooks=N_Q)
        randomize_(model, seed + 1)
        return _materialise_codebooks(model)
    path = Path(checkpoint)
    if not path.is_file():
        raise MissingFileError(f"spec['checkpoint']: {path} is not a file (expected a .safetensors file in the "
                               f"released layout)")
    if path.suffix not in (".safetensors", ".sft", ".sfts"):
        raise CheckpointError(f"spec['checkpoint']: expected a .safetensors file (released layout), got {path}")
    try:
        model = loaders.get_mimi(str(path), cfg, device=device, num_codebooks=N_Q)
    except (torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as exc:                        # load_state_dict(strict=True) names every bad key; unreadable files
        raise CheckpointError(f"spec['checkpoint']: {path} does not match the {depth} Mimi layout "
                              f"(moshi=={upstream.STOCK_VERSIONS['moshi']} get_mimi): {one_line(exc)}") from exc
    return _materialise_codebooks(model)


def state_manifest(model: nn.Module) -> dict:
    """{name: [shape]} of every state-dict entry: the checkpoint layout, in the manifest's format."""
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def session_options(model, mode: str) -> tuple:
    """The options a session of `mode` takes (new_session's spec keys). Raises InputError for an unknown mode."""
    if mode not in MODES:
        raise InputError(f"mode: expected one of {MODES}, got {shown(mode)}")
    return (*CADENCE_OPTIONS, "arena_backend", "graphs") if mode == "cadence" else ()


def new_session(model, mode: str, spec: dict | None = None):
    """A session on `model` (shared by any number of sessions and threads): mode "stock", "stock_graphs" or
    "cadence" (spec: CadenceSession's; call `prepare()` before the first unit on CUDA). Raises InputError for
    an unknown mode or spec value, ConcurrencyError for a model that streams on its own."""
    if mode in ("stock", "stock_graphs"):
        return StockSession(model) if mode == "stock" else StockGraphsSession(model)
    if mode == "cadence":
        return CadenceSession(model, spec)
    raise InputError(f"mode: expected one of {MODES}, got {shown(mode)}")
