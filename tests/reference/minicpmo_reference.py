"""Reference run of MiniCPM-o 4.5's token2wav tail, written from the upstream code alone.

Imports only torch, numpy and the stock package (minicpmo-utils==1.0.7, `stepaudio2`); never duplexcadence,
suite or workloads (it reports what it imported so the caller can check). Builds `Token2wav` from a
checkpoint directory the way `Token2wav.__init__` does (token2wav.py L92-134, on the CPU, without the two
ONNX front-end models), installs a prepared voice prompt into `Token2wav.cache`, and drives `stream` as the
MiniCPM-o 4.5 duplex loop does (OpenBMB/minicpm-o-4_5-pytorch-simple-demo @c7e1660,
MiniCPMO45/modeling_minicpmo_unified.py):

* set_stream_cache once per voice, the returned caches cloned as the base (L4398-4404);
* at each turn start: clones of the base restored, token buffer [4218] * 3 (L4406-4410);
  "clone" is the demo's `torch_clone_recursive` (MiniCPMO45/utils.py, read at @67abcfd: `Tensor.clone()`
  through dicts, lists and tuples; anything else raises), re-typed below as `clone_recursive`;
* per unit: `while len(buf) >= pre_lookahead + 5: n = min(25 + 3, len(buf)); stream(buf[:n]);
  buf = buf[min(25, n - 3):]`; at turn end `stream(buf, last_chunk=True)` (L5446-5525).

Prints one JSON line: per unit, the samples and sha256 of the float32 waveform bytes (what
`stream(..., return_waveform=True)` returns, concatenated over the unit's calls) and of the int16 PCM
(clip to [-1, 1], x 32767, astype('<i2'): token2wav.py L277-279).
token2wav.py imports onnxruntime, s3tokenizer and torchaudio at module level (L9-13) for prompt preparation
only; where one does not import, an empty module with a __spec__ stands in (the prompt comes prepared).

usage: minicpmo_reference.py --checkpoint DIR --prompt PROMPT.pt --script SCRIPT.json --steps N --seed S
PROMPT.pt: {"tokens": int32 [1, n], "spk": float32 [1, 192], "mel": float32 [1, 2n, 80]}.
SCRIPT.json: {"turns": [[[token ids of unit 0], [unit 1], ...], ...]}; a turn's last unit ends it.
The construction-time random tables (decoder.rand_noise, the vocoder's rand_ini / sine_waves) come from the
global CPU RNG: torch.manual_seed(seed) right before the flow is built, then flow, its weights, vocoder.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.machinery
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

SILENCE_TOKEN = 4218
CHUNK_SIZE = 25
STAND_INS = ("onnxruntime", "s3tokenizer", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")


def install_stand_ins() -> list[str]:
    """Empty modules (with __spec__) for the prompt-only imports of token2wav.py L9-13 that do not import."""
    installed = []
    for name in STAND_INS:
        root = name.split(".")[0]
        if name == root:
            try:
                importlib.import_module(name)
                continue
            except Exception:  # torchaudio without a matching build raises OSError
                sys.modules.pop(name, None)
        elif root not in installed:
            continue
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
        module.__path__ = []
        sys.modules[name] = module
        if "." in name:
            parent, child = name.rsplit(".", 1)
            setattr(sys.modules[parent], child, module)
        installed.append(name)
    return installed


def build(t2w_mod, model_dir: Path, n_timesteps: int, seed: int):
    """Token2wav.__init__ (token2wav.py L92-134) on the CPU, without the tokenizer / speaker ONNX models."""
    device = torch.device("cpu")
    torch.manual_seed(seed)
    t2w = t2w_mod.Token2wav.__new__(t2w_mod.Token2wav)
    t2w.float16 = False
    t2w.n_timesteps = int(n_timesteps)
    t2w.device = device
    t2w.model_path = model_dir
    t2w.flow = t2w_mod._load_config(model_dir / "flow.yaml")["flow"]
    t2w.flow.load_state_dict(torch.load(model_dir / "flow.pt", map_location="cpu", weights_only=True), strict=True)
    t2w.flow.to(device).eval()
    t2w.hift, t2w.vocoder_checkpoint, t2w.vocoder_config = t2w_mod.load_causal_vocoder(model_dir, device)
    t2w.bounded_vocoder = t2w_mod.BoundedVocoder(t2w.hift)
    t2w.sample_rate = 24000
    t2w.hop_samples = 480
    t2w.vocoder_delay_frames = (t2w.hift.f0_predictor.condnet[0].causal_padding + t2w.hift.conv_pre_look_right + 1)
    t2w.vocoder_delay_samples = t2w.vocoder_delay_frames * t2w.hop_samples
    t2w.source_cache_len = t2w.vocoder_delay_samples
    t2w.original_vocoder_checkpoint = model_dir / "hift_original.pt"
    t2w.original_hift = None
    t2w.cache = {}
    t2w.stream_cache = None
    t2w.hift_cache_dict = {}
    t2w._stream_prompt = None
    return t2w


def clone_recursive(obj):
    """The demo's torch_clone_recursive (MiniCPMO45/utils.py)."""
    if torch.is_tensor(obj):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: clone_recursive(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_recursive(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clone_recursive(v) for v in obj)
    raise ValueError(f"Unsupported type: {type(obj)}")


def run(t2w, prompt: dict, turns: list) -> list[dict]:
    key = "voice_prompt"
    tokens = prompt["tokens"]
    t2w.cache[key] = (tokens, torch.tensor([tokens.shape[1]], dtype=torch.int32), prompt["spk"], prompt["mel"],
                      torch.tensor([prompt["mel"].shape[1]], dtype=torch.int32))
    flow_cache, hift_cache = t2w.set_stream_cache(key)
    base = (clone_recursive(flow_cache), clone_recursive(hift_cache))
    pre_lookahead = t2w.flow.pre_lookahead_len
    units = []
    for turn_index, turn in enumerate(turns):
        t2w.stream_cache = clone_recursive(base[0])
        t2w.hift_cache_dict = clone_recursive(base[1])
        buf = [SILENCE_TOKEN] * pre_lookahead
        for unit_index, new_tokens in enumerate(turn):
            buf = buf + list(new_tokens)
            waves, calls = [], []
            while len(buf) >= pre_lookahead + 5:
                n = min(CHUNK_SIZE + pre_lookahead, len(buf))
                waves.append(t2w.stream(buf[:n], return_waveform=True))
                calls.append(n)
                buf = buf[min(CHUNK_SIZE, n - pre_lookahead):]
            if unit_index == len(turn) - 1:
                waves.append(t2w.stream(buf, last_chunk=True, return_waveform=True))
                calls.append(len(buf))
                buf = []
            wave = (np.concatenate([w.reshape(-1) for w in waves]) if waves else np.zeros(0)).astype(np.float32)
            pcm = (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2")
            units.append({"turn": turn_index, "unit": unit_index, "tokens": len(new_tokens), "calls": calls,
                          "samples": int(wave.shape[0]),
                          "sha256_f32": hashlib.sha256(wave.astype("<f4").tobytes()).hexdigest(),
                          "sha256_pcm16": hashlib.sha256(pcm.tobytes()).hexdigest()})
    return units


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--prompt", type=Path, required=True)
    ap.add_argument("--script", type=Path, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    stand_ins = install_stand_ins()
    t2w_mod = importlib.import_module("stepaudio2.token2wav")
    t2w = build(t2w_mod, args.checkpoint, args.steps, args.seed)
    prompt = torch.load(args.prompt, map_location="cpu", weights_only=True)
    units = run(t2w, prompt, json.loads(args.script.read_text())["turns"])
    project = sorted(m for m in sys.modules if m.split(".")[0] in ("duplexcadence", "suite", "workloads"))
    print(json.dumps({"units": units, "stand_ins": stand_ins, "project_modules": project}))


if __name__ == "__main__":
    main()
