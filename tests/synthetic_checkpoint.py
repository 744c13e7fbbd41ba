"""A small synthetic MiniCPM-o 4.5 token2wav checkpoint, written from tests/data/flow_hift_manifest.json.

The directory has the files minicpmo-utils 1.0.7's `Token2wav` reads (token2wav.py L100-104, less the two
ONNX front-end models): flow.yaml and config.yaml (reduced-depth text from the manifest), and flow.pt,
hift.pt, hift_original.pt (`torch.save` of dicts of seeded random tensors with exactly the manifest's
key names, shapes and dtypes). Nothing here imports the loader under test (duplexcadence) or stepaudio2.

Values: matrices N(0, 1/fan_in), vectors 0.1 x N(0, 1); for the two vocoders, `conv_post` (whose first
n_fft/2 + 1 = 9 output channels are log-magnitudes, causal_vocoder/generator.py L704) gets 0.3 x its weight
norm gain and -2 on those 9 biases, so random audio stays mostly inside the +-0.99 clamp instead of
saturating (measured: max |x| 0.8, none clipped). Deterministic in `seed`.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

MANIFEST = Path(__file__).resolve().parent / "data" / "flow_hift_manifest.json"
TENSOR_FILES = ("flow.pt", "hift.pt", "hift_original.pt")
TEXT_FILES = ("flow.yaml", "config.yaml")


def load_manifest() -> dict:
    """The committed layout: {"texts": {file: yaml}, "tensors": {file: {key: [shape, dtype]}}, ...}."""
    return json.loads(MANIFEST.read_text())


def _tensor(shape: list[int], dtype: str, gen: torch.Generator) -> torch.Tensor:
    dt = getattr(torch, dtype)
    if not dt.is_floating_point:
        raise ValueError(f"manifest dtype {dtype}: only floating-point tensors are expected")
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    x = x / math.sqrt(max(1, math.prod(shape[1:]))) if len(shape) >= 2 else 0.1 * x
    return x.to(dt)


QUIET_BINS = 9   # istft n_fft 16 // 2 + 1 (config.yaml istft_params)


def _quiet_(key: str, x: torch.Tensor) -> torch.Tensor:
    if key.endswith("conv_post.parametrizations.weight.original0"):
        return x * 0.3
    if key.endswith("conv_post.bias"):
        x = x.clone()
        x[:QUIET_BINS] -= 2.0
    return x


def write_checkpoint(directory: Path, *, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """Write the checkpoint directory (created if absent); return {file: {key: tensor written}}."""
    manifest = load_manifest()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in TEXT_FILES:
        (directory / name).write_text(manifest["texts"][name])
    gen = torch.Generator().manual_seed(seed)
    written = {}
    for name in TENSOR_FILES:
        tensors = {key: _quiet_(key, _tensor(shape, dtype, gen))
                   for key, (shape, dtype) in manifest["tensors"][name].items()}
        torch.save(tensors, directory / name)
        written[name] = tensors
    return written


#: Step-Audio 2 mini's released token2wav/ folder (stepfun-ai/Step-Audio2 token2wav.py L20-48 @ b1bb23c): the
#: tensors and the flow's config it loads, and the two ONNX front-end models it opens (written empty here).
STEPAUDIO2_FILES = ("flow.yaml", "flow.pt", "hift.pt", "speech_tokenizer_v2_25hz.onnx", "campplus.onnx")


def write_stepaudio2_checkpoint(directory: Path, *, seed: int = 0, hift_prefix: str = "generator.") -> dict:
    """Write a Step-Audio 2 token2wav/ directory (created if absent): flow.yaml and flow.pt as the manifest's
    MiniCPM-o ones (the same flow class and released flow.yaml, at the reduced depth), hift.pt the keys of the
    original `HiFTGenerator()` (the manifest's hift_original.pt: released shapes), each key with `hift_prefix`
    ("generator." as in the MiniCPM-o layout; upstream strips it, token2wav.py L46). Returns {file: {key: tensor}}."""
    manifest = load_manifest()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "flow.yaml").write_text(manifest["texts"]["flow.yaml"])
    for name in STEPAUDIO2_FILES[3:]:
        (directory / name).write_bytes(b"")
    gen = torch.Generator().manual_seed(seed)
    written = {}
    for name, source in (("flow.pt", "flow.pt"), ("hift.pt", "hift_original.pt")):
        tensors = {(hift_prefix + key.removeprefix("generator.") if name == "hift.pt" else key):
                   _quiet_(key, _tensor(shape, dtype, gen)) for key, (shape, dtype) in manifest["tensors"][source].items()}
        torch.save(tensors, directory / name)
        written[name] = tensors
    return written


def write_defective_copy(good: Path, written: dict, directory: Path, files, file: str, key: str, defect: str) -> None:
    """A copy in `directory` of the checkpoint written in `good` (`written`: what the writer returned) with one defect
    in `file`: `key` left out ("missing"), one larger in every dimension ("shape"), or added as a tensor of 2 zeros
    ("unexpected"). Every other name in `files` is hard-linked from `good`."""
    for name in files:
        if name != file:
            os.link(Path(good) / name, Path(directory) / name)
    state = dict(written[file])
    if defect == "missing":
        del state[key]
    elif defect == "shape":
        state[key] = torch.zeros([s + 1 for s in state[key].shape])
    elif defect == "unexpected":
        state[key] = torch.zeros([2])
    else:
        raise ValueError(f"defect: expected 'missing', 'shape' or 'unexpected', got {defect!r}")
    torch.save(state, Path(directory) / file)
