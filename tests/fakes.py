"""A fake adapter on the session protocol (duplexcadence.session.Session), and fake workloads, for the suite's
tests. Its audio is a seeded function of each unit's tokens, so expected hashes are computed here,
independently of the suite; its clocks give one signature per unit ("step", size, history, last).

Spec options (the workload's spec): zero_units / cadence_off_units (unit indices whose audio is silent /
one ULP off in cadence), session: "reset" (default) | "carried" (caches carry over turns, one host thread),
inline: True (cadence captures an uncaptured signature inside speak), exclusive: True (a second stock session
on one model instance is refused with ConcurrencyError).
"""
from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from duplexcadence import runtime
from duplexcadence.clocks import signature
from duplexcadence.errors import ConcurrencyError, InputError, LimitError
from duplexcadence.session import Capabilities, ClockState, Session, SessionStats, UnitOutput, check_final, to_pcm16
from workloads.common import FORMATS, load_script

SAMPLES_PER_TOKEN = 960          # 25 tokens -> 1 s @ 24 kHz
MAX_TOKENS = 25
#: What prepare(None) captures: a steady 25-token unit at every history length.
VOICE = [signature("step", MAX_TOKENS, {"history": h}, last=False) for h in range(3)]


def fake_wave(tokens) -> np.ndarray:
    """The fake decoder: 960 samples per token, N(0, 0.1) seeded by the token ids."""
    tokens = list(tokens)
    rng = np.random.default_rng(sum(tokens) * 7919 + len(tokens))
    return (0.1 * rng.standard_normal(SAMPLES_PER_TOKEN * len(tokens))).astype(np.float32)


class FakeClocks(ClockState):
    def __init__(self, carried: bool = False):
        self.pos, self.carried = 0, carried

    def start_turn(self) -> None:
        if not self.carried:
            self.pos = 0

    def unit(self, size: int, final: bool = False) -> list:
        if not 0 <= size <= MAX_TOKENS:          # a turn's final unit may carry none (a flush)
            raise LimitError(f"payload: expected 0-{MAX_TOKENS} tokens, got {size}")
        sig = signature("step", size, {"history": min(self.pos, 2)}, last=bool(final))
        self.pos += 1
        return [sig]


class FakeSession(Session):
    capabilities = Capabilities(turn_state="reset", concurrent=True, graphs=True, payload="tokens",
                                max_payload=MAX_TOKENS)

    def __init__(self, model: dict, mode: str):
        self.model, self.mode = model, mode
        self.turn_open, self.turns = False, 0
        self.clock = FakeClocks(carried=self.capabilities.turn_state == "carried")
        self.graphs: set = set()
        self.counts = dict.fromkeys(SessionStats.COUNTERS, 0)
        self.units = 0
        self.held = []                       # on CUDA: 16 MiB of device memory per unit, kept
        model["open"].append(self)

    def start_turn(self):
        self.check_open("start_turn")
        self.turn_open = True
        self.turns += 1
        self.clock.start_turn()

    def clocks(self):
        self.check_open("clocks")
        return self.clock.copy()

    def prepare(self, signatures=None):
        self.check_open("prepare")
        before = dict(self.counts)
        if self.mode != "stock":
            for sig in (VOICE if signatures is None else list(signatures)):
                if sig not in self.graphs:
                    self.graphs.add(sig)
                    self.counts["captures"] += 1
        return {k: self.counts[k] - before[k] for k in SessionStats.COUNTERS}

    def speak(self, tokens, *, final=False):
        self.check_open("speak")
        final = check_final(final)
        if not self.turn_open and self.capabilities.turn_state != "stream":
            raise InputError("speak: no open turn; call start_turn() first")
        after = self.clock.copy()
        (sig,) = after.unit(len(tokens), final)     # raises before anything changes
        self.clock = after
        if self.mode == "stock":
            self.counts["eager_runs"] += 1
        elif sig in self.graphs:
            self.counts["replays"] += 1
        elif self.model["spec"].get("inline"):
            self.graphs.add(sig)
            self.counts["captures"] += 1
        else:
            self.counts["eager_fallbacks"] += 1
        unit = tokens[0] if len(tokens) else None     # the fake scripts write the unit index into the tokens
        wave = fake_wave(tokens)
        if unit in self.model["zero_units"]:
            wave = np.zeros_like(wave)
        if self.mode == "cadence" and unit in self.model["cadence_off_units"]:
            wave = wave.copy()
            wave[5] = np.nextafter(wave[5], np.float32(1))   # one ULP: bytes differ
        if self.model["device"].type == "cuda":
            self.held.append(torch.ones(4 * 2**20, device=self.model["device"]))
        self.units += 1
        if final:
            self.turn_open = False
        return UnitOutput(wave, to_pcm16(wave), {"tokens": len(tokens)})

    def state(self):
        return {"pos": self.clock.pos}

    def stats(self):
        out = SessionStats(units=self.units, graphs=len(self.graphs), graph_bytes=1024 * len(self.graphs),
                           arena_bytes_reserved=4096 if self.mode != "stock" else 0, detail={"turns": self.turns})
        for k, v in self.counts.items():
            setattr(out, k, v)
        return out

    def close(self):
        if not self.closed:
            self.held.clear()
            self.model["open"].remove(self)
        self.closed = True


class CarriedSession(FakeSession):
    """Caches carry over turns (Step-Audio 2's kind): no warm-up unit of its own, one host thread."""
    capabilities = Capabilities(turn_state="carried", concurrent=False, graphs=True, payload="tokens",
                                max_payload=MAX_TOKENS)


class FakeModel(dict):
    """The fake model instance: a copy (as the harness makes for a session refused on a shared instance) has
    the same tables and no open sessions."""

    def __deepcopy__(self, memo):
        return FakeModel({**self, "open": []})


def module(modes=("stock", "cadence"), name: str = "fake_suite_adapter") -> types.ModuleType:
    """A fresh fake adapter module; `builds` lists what build_model was given."""
    mod = types.ModuleType(name)
    mod.MODES = modes
    mod.builds = []

    def build_model(spec, *, device, depth, seed):
        mod.builds.append({"spec": dict(spec), "device": str(device), "depth": depth, "seed": seed})
        return FakeModel(device=torch.device(device), spec=dict(spec), open=[], zero_units=set(spec.get("zero_units", ())),
                         cadence_off_units=set(spec.get("cadence_off_units", ())))

    def new_session(model, mode, spec):
        if mode not in mod.MODES:
            raise ValueError(f"mode: expected one of {mod.MODES}, got {mode!r}")
        if spec.get("exclusive") and mode == "stock" and any(s.mode == "stock" for s in model["open"]):
            raise ConcurrencyError("a second stock session on this model instance shares its caches")
        return (CarriedSession if spec.get("session") == "carried" else FakeSession)(model, mode)

    mod.build_model, mod.new_session = build_model, new_session
    return mod


def register(monkeypatch=None, modes=("stock", "cadence")) -> types.ModuleType:
    """Register a fake adapter under architecture "fake" (monkeypatched, or for the process)."""
    mod = module(modes)
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        monkeypatch.setitem(runtime.ADAPTERS, "fake", mod.__name__)
    else:
        sys.modules[mod.__name__] = mod
        runtime.ADAPTERS["fake"] = mod.__name__
    return mod


# --- scripts and workloads ---------------------------------------------------------------------------------
@dataclass
class FakeUnit:
    index: int
    t_start_s: float
    kind: str
    turn: int | None
    final: bool
    tokens: tuple | None = None
    codes: tuple | None = None

    @property
    def payload(self):
        return self.tokens if self.tokens is not None else self.codes


@dataclass
class FakeScript:
    units: list

    def select(self, max_speak_units, min_turns=2):
        out, n = [], 0
        for u in self.units:
            if u.kind == "SPEAK":
                if n == max_speak_units:
                    break
                n += 1
            out.append(u)
        return FakeScript(out)


def rows(turns: int, speak_per_turn: int, listen_per_turn: int = 2) -> list[dict]:
    """Each turn: LISTEN units, then SPEAK units of 25 tokens (tokens[0] = unit index), the last final and 10
    tokens long."""
    out, i = [], 0
    for turn in range(turns):
        for _ in range(listen_per_turn):
            out.append({"unit": i, "t_start_s": float(i), "kind": "LISTEN", "turn": None, "final": False})
            i += 1
        for k in range(speak_per_turn):
            final = k == speak_per_turn - 1
            n = 10 if final else 25
            out.append({"unit": i, "t_start_s": float(i), "kind": "SPEAK", "turn": turn, "final": final,
                        "tokens": [i] + [(i * 31 + j) % 6561 for j in range(n - 1)]})
            i += 1
    return out


def fake_script(turns: int, speak_per_turn: int, listen_per_turn: int = 2) -> FakeScript:
    return FakeScript([FakeUnit(r["unit"], r["t_start_s"], r["kind"], r["turn"], r["final"],
                                tuple(r["tokens"]) if "tokens" in r else None)
                       for r in rows(turns, speak_per_turn, listen_per_turn)])


@dataclass
class FakeWorkload:
    name: str = "fake"
    model: str = "Fake model"
    architecture: str = "fake"
    stock_package: str = "none==0"
    dtype: str = "float32"
    euler_steps: int | None = 10
    voice_prompt: str = "voice.wav"
    prompt_seconds: float = 6.0
    script: object = None
    token_source: str = "inline"
    seeds: dict = field(default_factory=lambda: {"weights": 3, "tokens": 4, "prompt": 5})
    spec: dict = field(default_factory=dict)
    notes: str = ""

    @property
    def payload_format(self):
        return FORMATS["flow_hift"]

    def session_script(self):
        if isinstance(self.script, (str, Path)):
            return load_script(self.script, self.payload_format)
        return self.script


def workload(turns=2, speak_per_turn=4, name="fake", **spec) -> FakeWorkload:
    return FakeWorkload(name=name, script=fake_script(turns, speak_per_turn), spec=spec)


def file_workload(folder: Path, turns=2, speak_per_turn=4, listen_per_turn=2, name="fake", **spec) -> FakeWorkload:
    """A fake workload whose script is a JSONL file (the duplex harness tiles scripts read from files)."""
    path = Path(folder) / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(turns, speak_per_turn, listen_per_turn)))
    return FakeWorkload(name=name, script=path, spec=spec)
