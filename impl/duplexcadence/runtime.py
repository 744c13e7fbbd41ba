"""Drive an adapter unit by unit, in `stock` or `cadence` mode, and compare the two (`verify`).

Every adapter module (duplexcadence.adapters.<architecture>) exposes:

* ``build_model(spec: dict, *, device, depth: str, seed: int) -> model``: the stock modules with seeded
  random weights (or a checkpoint, ``spec["checkpoint"]``); one instance is shared by both modes, so
  construction-time random tables are the same.
* ``new_session(model, mode: str, spec: dict) -> Session``: ``mode`` is ``"stock"`` (the upstream code
  as it ships, driven as the model's own serving loop drives it) or ``"cadence"`` (the same kernels on
  arena views, with CUDA-graph replay on CUDA).

A Session has ``start_turn()``, ``speak(payload, final=False) -> UnitOutput`` and ``stats()``. The
payload is what the AR stage emitted during the one-second unit: speech token ids (flow_hift) or codec
frames ``[n_q][frames]`` (mimi, code2wav). Bad input raises ``InputError`` (a ValueError) and leaves
the session's state and clocks exactly as they were.
"""
from __future__ import annotations

import hashlib
import importlib
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

MODES = ("stock", "cadence")

ADAPTERS = {
    "flow_hift": "duplexcadence.adapters.flow_hift",   # MiniCPM-o 4.5, Step-Audio 2 mini
    "mimi": "duplexcadence.adapters.mimi",             # Moshi
    "code2wav": "duplexcadence.adapters.code2wav",     # Qwen3-Omni
}


_MODEL_STATE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MODEL_STATE_LOCK = threading.Lock()


def model_state(model) -> dict:
    """The runtime's per-model-instance state shared by that instance's sessions (a lock for eager steps and
    captures, signatures already warmed in this process, voice bases, device tables), as one dict kept
    beside the model, not on it: `copy.deepcopy(model)` (stock's one instance per session) copies the
    weights only and the copy starts with an empty dict; the entry goes when the model is collected.
    Thread-safe. Raises TypeError for an object that cannot be weakly referenced."""
    with _MODEL_STATE_LOCK:
        state = _MODEL_STATE.get(model)
        if state is None:
            state = _MODEL_STATE[model] = {}
        return state


class InputError(ValueError):
    """Bad input to a session (names the argument, the expectation and what came); nothing changed."""


@dataclass
class UnitOutput:
    """One SPEAK unit's audio: float32 [samples] @ 24 kHz (the stock call's waveform before int16
    quantisation, concatenated over the unit's calls) and the stock int16 PCM of the same samples."""
    waveform: np.ndarray
    pcm16: np.ndarray
    info: dict = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return int(self.waveform.shape[-1])

    def sha256(self) -> tuple[str, str]:
        """(sha256 of the float32 little-endian bytes, sha256 of the int16 little-endian bytes)."""
        f32 = np.ascontiguousarray(self.waveform, dtype="<f4").tobytes()
        i16 = np.ascontiguousarray(self.pcm16, dtype="<i2").tobytes()
        return hashlib.sha256(f32).hexdigest(), hashlib.sha256(i16).hexdigest()


def adapter(architecture: str):
    """The adapter module for a decoder architecture. Raises KeyError naming the known ones."""
    try:
        return importlib.import_module(ADAPTERS[architecture])
    except KeyError:
        raise KeyError(f"architecture {architecture!r}: expected one of {sorted(ADAPTERS)}") from None


class BitMismatch(AssertionError):
    """Cadence output differs from stock; the message names the workload, unit and what differs."""


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    """Describe the first differing element of two arrays (shape, index, values, max |diff|)."""
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    ab = np.ascontiguousarray(a).view(np.uint8)
    bb = np.ascontiguousarray(b).view(np.uint8)
    idx = np.flatnonzero(ab != bb)
    if idx.size == 0:
        return "identical"
    el = int(idx[0]) // a.dtype.itemsize
    diff = np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))
    return (f"first differing sample {el} of {a.size}: {a.reshape(-1)[el]!r} vs {b.reshape(-1)[el]!r}, "
            f"max |diff| {diff:.3g}")


def compare_units(workload: str, unit: int, stock: UnitOutput, cadence: UnitOutput) -> None:
    """Raise BitMismatch unless float32 waveform and int16 PCM are byte-identical."""
    for what, a, b in (("float32 waveform", stock.waveform, cadence.waveform),
                       ("int16 PCM", stock.pcm16, cadence.pcm16)):
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            raise BitMismatch(f"{workload}: unit {unit}: {what} differs: {first_difference(a, b)}")


def use_expandable_segments(device) -> dict:
    """Turn on torch's CUDA caching-allocator setting `expandable_segments:True` for this process (segments
    created from now on grow in place instead of one new segment per larger request). For processes that
    run DuplexCadence sessions only: a decoder part that still runs eagerly on a shape that grows every unit
    (Step-Audio 2's conformer encoder) otherwise leaves a new cached segment behind per unit, and the
    allocator's reserve, not the session's state, becomes its memory (measured: results/README.md). Output
    bytes do not depend on it. No-op off CUDA. Returns {"cuda_allocator": <setting>} or {}."""
    import torch
    if torch.device(device).type != "cuda":
        return {}
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    return {"cuda_allocator": "expandable_segments:True"}
