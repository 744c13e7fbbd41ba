"""The flow-matching DiT + HiFT tails of MiniCPM-o 4.5 and Step-Audio 2 mini: the adapter (duplexcadence.runtime).

Variants (spec "variant"): "minicpmo45" (default; minicpmo-utils==1.0.7 `Token2wav`, causal HiFT) and "stepaudio2"
(the same flow, the original HiFT, driven as stepfun-ai/Step-Audio2 @ b1bb23c drives them). Modes: "stock"
(stock.py) and "cadence" (cadence.py, cadence_sa2.py). Modules: facts (constants, configuration, regions, stock
limits), plan (the host clocks, every step's Signature), build, flowstate, causal_vocoder, hift_graph.
"""
from __future__ import annotations

from duplexcadence import rng
from duplexcadence.errors import InputError
from duplexcadence.payload import shown
from duplexcadence.runtime import use_expandable_segments

from duplexcadence.adapters.flow_hift import build, facts
from duplexcadence.adapters.flow_hift.build import Model
from duplexcadence.adapters.flow_hift.cadence import CadenceSession
from duplexcadence.adapters.flow_hift.cadence_sa2 import StepAudio2CadenceSession
from duplexcadence.adapters.flow_hift.plan import script_signatures
from duplexcadence.adapters.flow_hift.stock import StepAudio2StockSession, StockSession

MODES = ("stock", "cadence")
#: The build options open_model passes on (build_model's spec keys a caller may give).
MODEL_OPTIONS = ("voice_prompt", "prompt_seconds", "n_timesteps", "checkpoint")
#: The session class of each (variant, mode) and the options a cadence session takes.
SESSIONS = {("minicpmo45", "stock"): StockSession, ("minicpmo45", "cadence"): CadenceSession,
            ("stepaudio2", "stock"): StepAudio2StockSession, ("stepaudio2", "cadence"): StepAudio2CadenceSession}
OPTIONS = {("minicpmo45", "cadence"): ("graphs", "capture", "strict", "arena_backend", "noise"),
           ("stepaudio2", "cadence"): ("graphs", "capture", "strict", "arena_backend")}


@rng.seeded_build
def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0) -> Model:
    """The stock model of `spec` with seeded random weights (or "checkpoint", a directory in the variant's released
    layout: build.build_token2wav, build.build_stepaudio2_token2wav) and its voice prompt. spec: "voice_prompt" (a 24 kHz WAV; required), "variant", "n_timesteps"
    (Euler steps, 1-16; 10), "prompt_seconds" (None: the whole WAV; default facts.PROMPT_SECONDS). depth:
    "released" | "reduced" (facts.REDUCED). Raises InputError naming a missing or bad key (the voice prompt is
    read and checked before the model is built), MissingFileError, CheckpointError."""
    variant = dict(spec).get("variant") or "minicpmo45"
    if variant not in facts.VARIANTS:
        raise InputError(f"spec['variant']: expected one of {facts.VARIANTS}, got {shown(variant)}")
    if depth not in ("released", "reduced"):
        raise InputError(f"depth: expected 'released' or 'reduced', got {shown(depth)}")
    if spec.get("voice_prompt") is None:
        raise InputError("spec['voice_prompt']: required: the path of a 24 kHz WAV of the voice to speak in")
    steps = build.check_steps(spec.get("n_timesteps", 10))
    layers = facts.RELEASED if depth == "released" else facts.REDUCED
    prompt = build.prepare_prompt(spec["voice_prompt"], device=device,      # a bad voice fails before a build
                                  seconds=spec.get("prompt_seconds", facts.PROMPT_SECONDS[variant]))
    if variant == "minicpmo45":
        t2w = build.build_token2wav(spec.get("checkpoint"), n_timesteps=steps, device=device, seed=seed, depth=layers)
    elif spec.get("checkpoint"):
        t2w = build.build_stepaudio2_token2wav(spec["checkpoint"], n_timesteps=steps, device=device, seed=seed)
    else:
        t2w = build.build_stock_token2wav(n_timesteps=steps, device=device, seed=seed, depth=layers,
                                          hift_config=facts.HIFT_CONFIG if depth == "released" else facts.HIFT_REDUCED)
    build.install_prompt(t2w, prompt)
    return Model(t2w, prompt, dict(spec), variant, seed)


def session_options(model: Model, mode: str) -> tuple:
    """The options a session of `mode` takes at the top level of new_session's spec (OPTIONS). Raises
    InputError for an unknown mode."""
    if mode not in MODES:
        raise InputError(f"mode: expected one of {MODES}, got {shown(mode)}")
    return OPTIONS.get((model.variant, mode), ())


def new_session(model: Model, mode: str, spec: dict | None = None):
    """A session on `model` in `mode`. spec: cadence options (OPTIONS) under spec["cadence"] (a workload's spec) or
    at the top level (runtime.OpenModel.session; other top-level keys are the model's). Raises InputError for an
    unknown mode or option, ClockError for a voice past a stock table, ConcurrencyError (stock.py)."""
    if mode not in MODES:
        raise InputError(f"mode: expected one of {MODES}, got {shown(mode)}")
    spec, names = dict(spec or {}), OPTIONS.get((model.variant, mode), ())
    nested = spec.get("cadence", {}) if mode == "cadence" else {}
    unknown = sorted(set(nested) - set(names))
    if unknown:
        raise InputError(f"spec['cadence']: unknown option(s) {unknown} for a {model.variant} cadence session "
                         f"(expected {list(names)})")
    return SESSIONS[model.variant, mode](model, **{**{k: spec[k] for k in names if k in spec}, **nested})


def for_mode(model: Model, mode: str) -> dict:
    """For a process of one `mode`: "cadence" frees the stock DiT buffers (build.release_stock_buffers; stock
    sessions are refused afterwards) and, for Step-Audio 2, turns on the CUDA allocator's expandable segments (its
    encoder runs eagerly on a length that grows every unit). Returns what was done, for the record."""
    if mode not in MODES:
        raise InputError(f"mode: expected one of {MODES}, got {shown(mode)}")
    if mode != "cadence":
        return {}
    done = {"stock_buffers_released_bytes": build.release_stock_buffers(model.t2w)}
    if model.variant == "stepaudio2":
        done.update(use_expandable_segments(model.t2w.device))
    return done


def oracle_prepare(session, turns) -> dict:
    """ORACLE (reads the session's future; reported beside the real figure only): prepare every signature `turns`
    (token counts per SPEAK unit, each turn's last final) reach from the session's clocks now."""
    sigs = script_signatures(session.clocks(), turns)
    return {**session.prepare(sigs), "signatures": len(sigs)}
