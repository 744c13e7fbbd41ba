"""The flow-matching DiT + HiFT tails of MiniCPM-o 4.5 and Step-Audio 2 mini: the adapter (duplexcadence.runtime).

Variants (spec "variant"): "minicpmo45" (default; minicpmo-utils==1.0.7 `stepaudio2.Token2wav` with the causal
HiFT behind `BoundedVocoder`) and "stepaudio2" (the same flow classes and the original HiFT, driven as
stepfun-ai/Step-Audio2 @ b1bb23c drives them). Modes: "stock" (the upstream code as it ships: stock.py) and
"cadence" (the same kernels on arena state with graph replay: cadence.py, cadence_sa2.py). Modules: facts
(cited constants, configuration files, regions and stock limits), plan (the host clocks and every step's
Signature), build (the stock models, the prompt stand-in), flowstate (the flow's arena state, shared),
causal_vocoder / hift_graph (each variant's vocoder on the arena), stock, cadence, cadence_sa2.
"""
from __future__ import annotations

from duplexcadence.session import to_pcm16  # noqa: F401  (duplexcadence.adapters.mimi imports it from here)

from duplexcadence.adapters.flow_hift import build, facts
from duplexcadence.adapters.flow_hift.build import Model
from duplexcadence.adapters.flow_hift.cadence import CadenceSession
from duplexcadence.adapters.flow_hift.cadence_sa2 import StepAudio2CadenceSession
from duplexcadence.adapters.flow_hift.plan import script_signatures
from duplexcadence.adapters.flow_hift.stock import StepAudio2StockSession, StockSession

MODES = ("stock", "cadence")
#: The session class of each (variant, mode), and the options its cadence session takes.
SESSIONS = {("minicpmo45", "stock"): StockSession, ("minicpmo45", "cadence"): CadenceSession,
            ("stepaudio2", "stock"): StepAudio2StockSession, ("stepaudio2", "cadence"): StepAudio2CadenceSession}
OPTIONS = {("minicpmo45", "cadence"): ("graphs", "capture", "strict", "arena_backend", "noise"),
           ("stepaudio2", "cadence"): ("graphs", "capture", "strict", "arena_backend")}


def build_model(spec: dict, *, device="cpu", depth: str = "released", seed: int = 0) -> Model:
    """The stock model of `spec` with seeded random weights (or spec "checkpoint", a directory in the released
    layout: MiniCPM-o only) and its voice prompt. spec: "voice_prompt" (a 24 kHz WAV; required), "variant"
    ("minicpmo45" | "stepaudio2"), "n_timesteps" (Euler steps, 1-16; 10), "prompt_seconds" (the first seconds
    of the WAV; None: all; default 6.0 for MiniCPM-o, None for Step-Audio 2). depth: "released" | "reduced" (the
    same classes, fewer layers: facts.REDUCED). Raises ValueError naming a missing or bad key, FileNotFoundError
    for a missing file."""
    if not isinstance(spec, dict):
        raise ValueError(f"spec: expected a dict, got {type(spec).__name__}")
    variant = spec.get("variant") or "minicpmo45"
    if variant not in facts.VARIANTS:
        raise ValueError(f"spec['variant']: expected one of {facts.VARIANTS}, got {variant!r}")
    if depth not in ("released", "reduced"):
        raise ValueError(f"depth: expected 'released' or 'reduced', got {depth!r}")
    if spec.get("voice_prompt") is None:
        raise ValueError("spec['voice_prompt']: required: the path of a 24 kHz WAV of the voice to speak in")
    steps = build.check_steps(spec.get("n_timesteps", 10))
    layers = facts.RELEASED if depth == "released" else facts.REDUCED
    if variant == "minicpmo45":
        t2w = build.build_token2wav(spec.get("checkpoint"), n_timesteps=steps, device=device, seed=seed, depth=layers)
    elif spec.get("checkpoint"):
        raise ValueError("spec['checkpoint']: the stepaudio2 variant builds seeded random weights only")
    else:
        t2w = build.build_stock_token2wav(n_timesteps=steps, device=device, seed=seed, depth=layers,
                                          hift_config=facts.HIFT_CONFIG if depth == "released" else facts.HIFT_REDUCED)
    prompt = build.prepare_prompt(spec["voice_prompt"], device=device,
                                  seconds=spec.get("prompt_seconds", facts.PROMPT_SECONDS[variant]))
    build.install_prompt(t2w, prompt)
    return Model(t2w, prompt, dict(spec), variant, seed)


def new_session(model: Model, mode: str, spec: dict | None = None):
    """A session on `model` in `mode` ("stock" | "cadence"). spec: cadence options (OPTIONS), under
    spec["cadence"] (a workload's spec) or at the top level (runtime.OpenModel.session); other top-level keys
    are the model's and ignored here. Raises ValueError for an unknown mode or option, ClockError for a voice
    past a stock table, ConcurrencyError for a second live stock session on one model."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    spec = dict(spec or {})
    names = OPTIONS.get((model.variant, mode), ())
    options = {k: spec[k] for k in names if k in spec}
    nested = spec.get("cadence", {}) if mode == "cadence" else {}
    unknown = sorted(set(nested) - set(names))
    if unknown:
        raise ValueError(f"spec['cadence']: unknown option(s) {unknown} for a {model.variant} cadence session "
                         f"(expected {list(names)})")
    return SESSIONS[model.variant, mode](model, **{**options, **nested})


def for_mode(model: Model, mode: str) -> dict:
    """For a process that runs sessions of one `mode` only: "cadence" frees the stock DiT cache buffers
    (build.release_stock_buffers; stock sessions are refused on the model afterwards) and, for Step-Audio 2,
    turns on the CUDA allocator's expandable segments (its encoder runs eagerly on a length that grows 50
    frames a unit: runtime.use_expandable_segments). Returns what was done, for the record."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if mode != "cadence":
        return {}
    done = {"stock_buffers_released_bytes": build.release_stock_buffers(model.t2w)}
    if model.variant == "stepaudio2":
        from duplexcadence.runtime import use_expandable_segments
        done.update(use_expandable_segments(model.t2w.device))
    return done


def oracle_prepare(session, turns) -> dict:
    """ORACLE (reads the session's future; for reporting beside the real figure only): capture every signature
    `turns` (each a sequence of token counts per SPEAK unit, the last one final) reach from the session's
    clocks now. Returns prepare's counters and how many signatures were asked for."""
    sigs = script_signatures(session.clocks(), turns)
    return {**session.prepare(sigs), "signatures": len(sigs)}
