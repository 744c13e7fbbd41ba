"""Moshi's Mimi decoder (moshi==0.2.13): stock eager, moshi's own CUDA graphs, and DuplexCadence.

Everything that computes audio is the stock code, `MimiModel.decode` (models/compression.py L406-429),
built by moshi's own loader (`loaders.get_mimi`, L323-363). Modules: `schedule` (facts, clocks, regions,
the Signature of every step), `stock` (moshi's server loop, sessions' own streaming states), `cadence`
(arena + graph replay). shared/notes/stock_decoders.md section 4 has the details.

Modes (`new_session`): "stock" (the bit-exact reference), "stock_graphs" (moshi's CUDAGraphed baseline, not
bit-exact), "cadence". Every session may speak on its own host thread while others of the model speak.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from torch import nn

from duplexcadence import upstream
from duplexcadence.adapters.mimi.cadence import CadenceSession
from duplexcadence.adapters.mimi.schedule import N_Q
from duplexcadence.adapters.mimi.stock import StockSession

MODES = ("stock", "stock_graphs", "cadence")
DEPTHS = ("released", "reduced")
#: The reduced config CI uses: the same classes, built by the same loader, with 2 transformer layers, 16
#: SEANet base filters and 8 quantizer levels (only 8 are decoded). The KV caches keep their released shape
#: (8 heads x 64, context 250), so the ring wrap is exercised. About 8x faster per frame on CPU.
REDUCED = {"transformer": {"num_layers": 2}, "seanet": {"n_filters": 16}, "quantizer": {"n_q": 8}}


class CheckpointError(ValueError):
    """A checkpoint does not match the model layout (missing, unexpected or mis-shaped keys)."""


def mimi_config(depth: str) -> dict:
    """moshi's released Mimi config (loaders._mimi_config, L28-88), or the reduced one (`REDUCED`)."""
    if depth not in DEPTHS:
        raise ValueError(f"depth: expected one of {DEPTHS}, got {depth!r}")
    loaders, _ = upstream.moshi()
    cfg = copy.deepcopy(loaders._mimi_config)
    for section, overrides in (REDUCED.items() if depth == "reduced" else ()):
        cfg[section].update(overrides)
    return cfg


def randomize_(model: nn.Module, seed: int) -> None:
    """Seeded random weights that give non-degenerate audio.

    moshi's constructors leave every codebook's `embedding_sum` at zero (core_vq.py L157-159), so the
    quantizer decodes every code to the same zero latent and the output does not depend on the codes at
    all; with PyTorch's default init the signal also shrinks through the SEANet stack. Here: conv, conv
    transpose and linear weights N(0, 1/fan_in) (fan_in of a transposed conv: in/groups * K / stride),
    biases N(0, 0.02^2), codebook sums N(0, 1), LayerScale 0.2 * (1 + N(0, 0.1^2)), then the last SEANet
    conv scaled by 0.15 so the waveform sits near std 0.15 with no clipping (checked on both depths).
    Norm layers keep their constructed values. Draws come from a CPU generator, so the weights are the
    same on every device. The cached codebook `_embedding` (core_vq.py L179-186) is cleared.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
            fan = None
            if isinstance(mod, nn.ConvTranspose1d):
                fan = mod.weight.shape[0] // mod.groups * mod.weight.shape[2] / mod.stride[0]
            elif isinstance(mod, nn.Conv1d):
                fan = mod.weight.shape[1] * mod.weight.shape[2]
            elif isinstance(mod, nn.Linear):
                fan = mod.weight.shape[1]
            if fan is not None:
                mod.weight.copy_(torch.randn(tuple(mod.weight.shape), generator=gen) / math.sqrt(fan))
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(tuple(mod.bias.shape), generator=gen) * 0.02)
            if type(mod).__name__ == "EuclideanCodebook":
                mod.embedding_sum.copy_(torch.randn(tuple(mod.embedding_sum.shape), generator=gen))
                mod._embedding = None
            if type(mod).__name__ == "LayerScale":
                mod.scale.copy_(0.2 * (1 + 0.1 * torch.randn(tuple(mod.scale.shape), generator=gen)))
        last = model.decoder.model[-1].conv.conv
        last.weight.mul_(0.15)
        last.bias.mul_(0.15)


def _materialise_codebooks(model: nn.Module) -> nn.Module:
    """Compute the codebooks' lazy tables once, here: `EuclideanCodebook.embedding` registers `_embedding`
    and `initialized` caches `_initialized.item()` on first use (core_vq.py L179-194), a change of the
    shared model that would otherwise happen inside some session's first decode (or capture)."""
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__ == "EuclideanCodebook":
                _ = mod.embedding, mod.initialized
    return model.eval()


def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0):
    """The stock `MimiModel` from `loaders.get_mimi(filename, config, device, num_codebooks=8)`, eval mode.

    spec["checkpoint"]: a `.safetensors` file in the released layout (state-dict names as the model's;
    tests/data/mimi_manifest.json lists them), loaded by moshi's loader (strict load_state_dict). Without
    it: `torch.manual_seed(seed)`, the stock constructors, then `randomize_(model, seed + 1)`.
    depth: "released" or "reduced" (`REDUCED`). Raises ValueError for a bad depth, FileNotFoundError for a
    missing checkpoint, CheckpointError naming missing / unexpected / mis-shaped keys.
    """
    loaders, _ = upstream.moshi()
    cfg = mimi_config(depth)
    device = torch.device(device)
    checkpoint = spec.get("checkpoint")
    torch.manual_seed(seed)
    if checkpoint is None:
        model = loaders.get_mimi(None, cfg, device=device, num_codebooks=N_Q)
        randomize_(model, seed + 1)
        return _materialise_codebooks(model)
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"spec['checkpoint']: {path} does not exist")
    if path.suffix not in (".safetensors", ".sft", ".sfts"):
        raise CheckpointError(f"spec['checkpoint']: expected a .safetensors file (released layout), got {path}")
    try:
        model = loaders.get_mimi(str(path), cfg, device=device, num_codebooks=N_Q)
    except RuntimeError as exc:   # torch's load_state_dict(strict=True) names every bad key
        raise CheckpointError(f"spec['checkpoint']: {path} does not match the {depth} Mimi layout "
                              f"(moshi=={upstream.STOCK_VERSIONS['moshi']} get_mimi): {exc}") from exc
    return _materialise_codebooks(model)


def state_manifest(model: nn.Module) -> dict:
    """{name: [shape]} of every state-dict entry: the checkpoint layout, in the manifest's format."""
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def new_session(model, mode: str, spec: dict | None = None):
    """A session on `model` (shared by any number of sessions and threads). mode: "stock" (bit-exact
    reference), "stock_graphs" (moshi's CUDAGraphed baseline) or "cadence" (CadenceSession: spec keys
    cadence_graphs, kv_bookkeeping, capture, arena_backend, graphs; call `prepare()` before the first unit
    on CUDA). Raises ValueError for an unknown mode or spec value, ConcurrencyError for a model that
    streams on its own."""
    if mode in ("stock", "stock_graphs"):
        return StockSession(model, moshi_graphs=mode == "stock_graphs")
    if mode == "cadence":
        return CadenceSession(model, spec)
    raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
