"""DuplexCadence: the speech-synthesis tail of full-duplex speech models on a one-second cadence, bit-exact.

    import duplexcadence as dc
    model = dc.open_model("moshi", device="cuda")          # or "minicpmo45", "stepaudio2_mini", "qwen3_omni"
    session = model.session("cadence")                      # "stock": the upstream code as it ships
    session.start_turn()
    out = session.speak(codes)                              # one 1 s SPEAK unit -> UnitOutput @ 24 kHz
    session.stats()                                         # SessionStats: captures, replays, arena bytes
    session.close()

Names here are loaded on first use, so `import duplexcadence.clocks` stays light.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "open_model": "runtime", "OpenModel": "runtime", "MODELS": "runtime", "compare_units": "runtime",
    "BitMismatch": "runtime",
    "Session": "session", "Capabilities": "session", "SessionStats": "session", "UnitOutput": "session",
    "ClockState": "session",
    "Signature": "clocks",
    "InputError": "errors", "LimitError": "errors", "ClosedError": "errors", "ConcurrencyError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"duplexcadence.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'duplexcadence' has no attribute {name!r}")
