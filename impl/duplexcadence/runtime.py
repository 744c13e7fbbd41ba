"""Open a released model by name and its sessions; compare stock and DuplexCadence output byte for byte.

`MODELS` names every released model this runtime serves and the decoder architecture (adapter) behind it.
Every adapter module (duplexcadence.adapters.<architecture>) exposes:

* ``build_model(spec: dict, *, device, depth: str, seed: int) -> model``: the stock modules with seeded
  random weights (or a checkpoint, ``spec["checkpoint"]``); one instance is shared by both modes, so
  construction-time random tables are the same.
* ``new_session(model, mode: str, spec: dict) -> duplexcadence.session.Session``: ``mode`` is ``"stock"``
  (the upstream code as it ships, driven as the model's own serving loop drives it), ``"cadence"`` (the
  same kernels on arena views, with CUDA-graph replay on CUDA) or one of the adapter's other ``MODES``.
* ``session_options(model, mode: str) -> tuple``: the spec keys a session of ``mode`` takes.
* ``MODEL_OPTIONS``: the spec keys ``open_model`` passes on to ``build_model``.

`open_model(name, ...)` does both steps for a user: ``open_model("moshi").session("cadence")``.
"""
from __future__ import annotations

import importlib
import os
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from duplexcadence.errors import InputError, MissingFileError
from duplexcadence.payload import check_int, shown
from duplexcadence.gate import OuterLock
from duplexcadence.session import UnitOutput

MODES = ("stock", "cadence")
SEED_MAX = 2 ** 63 - 1       # torch.Generator.manual_seed takes a signed 64-bit seed

ADAPTERS = {
    "flow_hift": "duplexcadence.adapters.flow_hift",   # MiniCPM-o 4.5, Step-Audio 2 mini
    "mimi": "duplexcadence.adapters.mimi",             # Moshi
    "code2wav": "duplexcadence.adapters.code2wav",     # Qwen3-Omni
}


@dataclass(frozen=True)
class ModelEntry:
    """A released model: its decoder architecture, the adapter spec that selects it, and what it needs."""
    name: str
    title: str
    architecture: str
    spec: dict = field(default_factory=dict)
    needs: tuple = ()           # spec keys the caller must give (e.g. the voice prompt)


#: Every released model, by name.
MODELS = {e.name: e for e in (
    ModelEntry("minicpmo45", "MiniCPM-o 4.5", "flow_hift", {"variant": "minicpmo45", "n_timesteps": 10},
               ("voice_prompt",)),
    ModelEntry("stepaudio2_mini", "Step-Audio 2 mini", "flow_hift", {"variant": "stepaudio2", "n_timesteps": 10},
               ("voice_prompt",)),
    ModelEntry("moshi", "Moshi", "mimi"),
    ModelEntry("qwen3_omni", "Qwen3-Omni", "code2wav", {"dtype": "bfloat16"}),
)}


@dataclass
class OpenModel:
    """A built model and the adapter that serves it. `native` is the stock object (Token2wav, MimiModel,
    Qwen3OmniMoeCode2Wav, ...), shared by every session opened from it."""
    entry: ModelEntry
    adapter: object
    native: object
    spec: dict

    def session(self, mode: str = "cadence", **options):
        """A new session (duplexcadence.session.Session) in `mode` ("stock", "cadence", or another of the
        adapter's MODES). options: the adapter's session options for that mode (`adapter.session_options`).
        Raises InputError for an unknown mode or an option the mode does not take, or a bad value of one."""
        known = self.adapter.session_options(self.native, mode)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InputError(f"options: {unknown} not taken by a {self.entry.name} {mode!r} session "
                             f"(expected some of {list(known)})")
        return self.adapter.new_session(self.native, mode, options)


def check_device(device) -> torch.device:
    """`device` ("cpu", "cuda", "cuda:N" or a torch.device of those) as a torch.device. Raises InputError naming
    the argument for another type or device type, a string torch cannot parse, or CUDA where this torch has
    none or fewer devices."""
    try:
        dev = torch.device(device) if isinstance(device, (str, torch.device)) else None
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise InputError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {shown(device)}")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            raise InputError(f"device: {device!r} asked for, but this torch ({torch.__version__}) sees "
                             f"{count} CUDA device(s); use device='cpu'")
    return dev


def open_model(name: str, *, device="cpu", depth: str = "released", seed: int = 0, **spec) -> OpenModel:
    """Build the released model `name` (a key of MODELS) on `device` with seeded random weights, or from
    `checkpoint=DIR_OR_FILE` in the released layout. depth: "released" or "reduced" (the same classes,
    fewer layers: CPU tests). spec: the model's options (voice_prompt=WAV path for the flow-matching
    decoders, n_timesteps, prompt_seconds, dtype, ...: the adapter's MODEL_OPTIONS). Raises InputError naming
    the known models for another name, a missing required option, an option the model does not take (or one
    its entry fixes, such as the variant), a path option that is not a path, a device this machine lacks
    (check_device) or a seed that is not an int in [0, SEED_MAX]; MissingFileError (an InputError) for a path
    option that names nothing there; the adapter's CheckpointError for a checkpoint not in the released
    layout. All of these before anything is built."""
    if not isinstance(name, str) or name not in MODELS:
        raise InputError(f"name: expected one of {sorted(MODELS)}, got {shown(name)}")
    entry = MODELS[name]
    missing = [k for k in entry.needs if spec.get(k) is None]
    if missing:
        raise InputError(f"open_model({name!r}): {', '.join(missing)} is required (e.g. voice_prompt='voice.wav', "
                         f"a 24 kHz WAV of the voice to speak in)")
    mod = adapter(entry.architecture)
    fixed = sorted(set(spec) & set(entry.spec) - set(mod.MODEL_OPTIONS))
    unknown = sorted(set(spec) - set(mod.MODEL_OPTIONS) - set(fixed))
    if fixed or unknown:
        raise InputError(f"options: {fixed or unknown} {'fixed by the model' if fixed else 'not taken'} for "
                         f"{name} (expected some of {list(mod.MODEL_OPTIONS)})")
    for key in ("voice_prompt", "checkpoint"):
        if spec.get(key) is not None and not isinstance(spec[key], (str, os.PathLike)):
            raise InputError(f"{key}: expected a path (str or os.PathLike), got {shown(spec[key])} "
                             f"({type(spec[key]).__name__})")
        if spec.get(key) is not None and not os.path.exists(spec[key]):
            raise MissingFileError(f"{key}: {os.fspath(spec[key])} does not exist")
    check_device(device)
    seed = check_int("seed", seed, low=0, high=SEED_MAX)
    full = {**entry.spec, **spec}
    return OpenModel(entry, mod, mod.build_model(full, device=device, depth=depth, seed=seed), full)


_MODEL_STATE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MODEL_STATE_LOCK = threading.Lock()


def model_state(model) -> dict:
    """The runtime's per-model-instance state shared by that instance's sessions (a lock for eager steps and
    captures, signatures already warmed on each host thread, voice bases, device tables), as one dict kept
    beside the model, not on it: `copy.deepcopy(model)` copies the weights only and the copy starts with
    an empty dict; the entry goes when the model is collected. Thread-safe. Raises TypeError for an object
    that cannot be weakly referenced."""
    with _MODEL_STATE_LOCK:
        state = _MODEL_STATE.get(model)
        if state is None:
            state = _MODEL_STATE[model] = {}
        return state


def model_lock(model) -> OuterLock:
    """The lock shared by every session of one model instance: held while a step repoints the shared
    modules (duplexcadence.bind) and for eager runs and captures; never for a replay. A reentrant lock taken
    before the capture gate's work() (gate.OuterLock: inside work() it waits with the thread's hold set aside)."""
    state = model_state(model)
    with _MODEL_STATE_LOCK:
        return state.setdefault("lock", OuterLock())


def adapter(architecture: str):
    """The adapter module for a decoder architecture. Raises KeyError naming the known ones."""
    if architecture not in ADAPTERS:
        raise KeyError(f"architecture {architecture!r}: expected one of {sorted(ADAPTERS)}")
    return importlib.import_module(ADAPTERS[architecture])


class BitMismatch(AssertionError):
    """Cadence output differs from stock; the message names the workload, unit and what differs."""


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    """Describe the first differing element of two arrays (shape, index, values, max |diff|)."""
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
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
    allocator's reserve, not the session's state, becomes its memory. Output
    bytes do not depend on it. No-op off CUDA. Returns {"cuda_allocator": <setting>} or {}."""
    import torch
    if torch.device(device).type != "cuda":
        return {}
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    return {"cuda_allocator": "expandable_segments:True"}
