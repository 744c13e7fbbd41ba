"""The AR stage before the tail of every SPEAK unit: none, a fixed busy time, or a stand-in model.

Specs (`--ar` of suite.measure.duplex, `parse_ar`): `none`; `busy:<T>ms` / `busy:<T>s`, a fixed busy time
per SPEAK unit (CUDA: one `torch.cuda._sleep` kernel of T ms on the session's stream, calibrated once; CPU:
a spin); `standin` / `standin:<name>`, a real-architecture model of workloads.ar_standin with seeded random
weights generating `tokens_per_unit` tokens per unit (transformers `generate`, greedy). Each stage's `run()`
returns when its work is done; `describe()` is what the record holds. A bad spec raises ARSpecError.
"""
from __future__ import annotations

import re
import time

import torch

from workloads import ar_standin


class ARSpecError(ValueError):
    """A bad --ar spec."""


ACCEPTED = "'none', 'busy:<ms>ms' (e.g. busy:30ms), 'standin' or 'standin:<name>'"


class NoAR:
    kind = "none"

    def run(self, seed: int = 0) -> None:
        return None

    def describe(self) -> dict:
        return {"kind": "none"}


class BusyAR:
    """A fixed busy time per unit: ms > 0. CUDA: one `torch.cuda._sleep` kernel; CPU: a spin."""
    kind = "busy"

    def __init__(self, ms: float, device):
        self.ms = float(ms)
        self.device = torch.device(device)
        self.cycles_per_ms = None

    def _calibrate(self) -> None:
        cycles = 10_000_000
        torch.cuda._sleep(cycles // 10)        # first launch outside the measurement
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.cycles_per_ms = cycles / max(start.elapsed_time(end), 1e-3)

    def run(self, seed: int = 0) -> None:
        if self.device.type == "cuda":
            if self.cycles_per_ms is None:
                self._calibrate()
            torch.cuda._sleep(int(self.ms * self.cycles_per_ms))
            torch.cuda.current_stream(self.device).synchronize()
            return
        t_end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < t_end:
            pass

    def describe(self) -> dict:
        return {"kind": "busy", "ms": self.ms, "how": "torch.cuda._sleep" if self.device.type == "cuda"
                else "host spin (perf_counter)", "cycles_per_ms": self.cycles_per_ms}


class StandInAR:
    """A stand-in model (workloads.ar_standin) shared by every session; `run(seed)` generates one unit's
    tokens from a seeded condition of `prompt_tokens` ids. Returns the int64 [tokens_per_unit] ids."""
    kind = "standin"

    def __init__(self, standin: ar_standin.StandIn, device, *, depth: str = "released", seed: int = 0):
        self.standin = standin
        self.device = torch.device(device)
        self.depth = depth
        self.model = ar_standin.build(standin, device=self.device, depth=depth, seed=seed)
        self.params = sum(p.numel() for p in self.model.parameters())

    def run(self, seed: int = 0) -> torch.Tensor:
        s = self.standin
        gen = torch.Generator().manual_seed(seed)
        vocab = self.model.config.vocab_size
        ids = torch.randint(0, vocab, (1, s.prompt_tokens), generator=gen).to(self.device)
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.tokens_per_unit,
                                      min_new_tokens=s.tokens_per_unit, do_sample=False, pad_token_id=0,
                                      eos_token_id=None)
        new = out[0, s.prompt_tokens:].cpu()       # host copy: the unit waits for its tokens
        if new.numel() != s.tokens_per_unit:
            raise RuntimeError(f"AR stand-in {s.name}: generated {new.numel()} tokens, expected "
                               f"{s.tokens_per_unit}")
        return new

    def describe(self) -> dict:
        return {"kind": "standin", "name": self.standin.name, "depth": self.depth, "params": self.params,
                "tokens_per_unit": self.standin.tokens_per_unit, "prompt_tokens": self.standin.prompt_tokens,
                "config": self.standin.config if self.depth == "released"
                else {**self.standin.config, **self.standin.reduced},
                "source": self.standin.source, "output": "discarded (the tail decodes the script payload)"}


def parse_ar(spec: str) -> tuple[str, object]:
    """('none', None) | ('busy', ms) | ('standin', name or None). Raises ARSpecError."""
    if not isinstance(spec, str):
        raise ARSpecError(f"--ar: expected {ACCEPTED}, got {spec!r}")
    s = spec.strip().lower()
    if s == "none":
        return "none", None
    if s.startswith("busy:"):
        m = re.fullmatch(r"busy:(\d+(?:\.\d+)?)(ms|s)", s)
        if not m:
            raise ARSpecError(f"--ar: a busy time is written busy:<number>ms or busy:<number>s, got {spec!r}")
        ms = float(m.group(1)) * (1000.0 if m.group(2) == "s" else 1.0)
        if ms <= 0:
            raise ARSpecError(f"--ar: busy time must be > 0 ms, got {spec!r}")
        return "busy", ms
    if s == "standin":
        return "standin", None
    if s.startswith("standin:"):
        name = spec.strip().split(":", 1)[1]
        ar_standin.get(name) if name in ar_standin.STANDINS else _unknown(name)
        return "standin", name
    raise ARSpecError(f"--ar: expected {ACCEPTED}, got {spec!r}")


def _unknown(name: str):
    raise ARSpecError(f"--ar: stand-in {name!r}: expected one of {sorted(ar_standin.STANDINS)}")


def make_ar(spec: str, workload_name: str, device, *, depth: str = "released", seed: int = 0):
    """The AR stage for a spec and workload. Raises ARSpecError (bad spec, or `standin` for a workload
    with no default stand-in: name one with standin:<name>)."""
    kind, arg = parse_ar(spec)
    if kind == "none":
        return NoAR()
    if kind == "busy":
        return BusyAR(arg, device)
    name = arg or ar_standin.DEFAULT_FOR.get(workload_name)
    if name is None:
        raise ARSpecError(f"--ar standin: workload {workload_name!r} has no default stand-in "
                          f"(defaults: {ar_standin.DEFAULT_FOR}); name one, e.g. "
                          f"standin:{next(iter(ar_standin.STANDINS))}")
    return StandInAR(ar_standin.get(name), device, depth=depth, seed=seed)
