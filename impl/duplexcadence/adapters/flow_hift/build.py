"""Building the stock tails (MiniCPM-o 4.5's `Token2wav`, Step-Audio 2 mini's `StockToken2wav`), seeded random or
from a checkpoint, and the voice-prompt stand-in. All that computes audio is minicpmo-utils==1.0.7's `stepaudio2`:
the flow from the released flow.yaml through `token2wav._load_config` (L28-59), the causal HiFT behind
`BoundedVocoder` (`load_causal_vocoder` L62-79) or the original `HiFTGenerator` (t2w L45). Step-Audio 2's driver is
not installable (stepfun-ai/Step-Audio2 @ b1bb23c, read in the fork weedge/Step-Audio2's history): `StockToken2wav`
mirrors its `Token2wav` (t2w L25-169) minus the ONNX front end.
The stock DiT cache buffers, CFM [16 steps, 16 layers, 2, 8, 1000, 128] and DiT [16, 2, 8, 1000, 128]
(flow_matching.py L35-36, decoder_dit.py L406-407), are written for the steps and layers in use only and handed
back whole as the stream cache: a model of fewer than 16 DiT layers (reduced) gets buffers of the same layout with
only its steps and layers (the 1000-frame stock limit stays), the same bytes (tests/test_flow_hift_reference.py
compares with a process on the stock buffers); construction makes zero-stride placeholders, so no build allocates
the 16 x 16 buffer.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import numbers
import string
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from duplexcadence import gate, upstream
from duplexcadence.errors import CheckpointError, InputError, MissingFileError, one_line
from duplexcadence.payload import as_int, shown
from duplexcadence.runtime import model_state

import duplexcadence.adapters.flow_hift.facts as facts

_STOCK_SHAPES = {(16, 16, 2, 1024, 2), (16, 16, 2, 8, 1000, 128), (16, 2, 8, 1000, 128), (16, 2, 1024, 2)}


def write_config_dir(directory: Path, depth: dict | None = None) -> Path:
    """Write flow.yaml and config.yaml (released hyperparameters; `depth` overrides layer counts)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    depth = depth or facts.RELEASED
    (directory / "flow.yaml").write_text(string.Template(facts.FLOW_YAML).substitute(depth))
    (directory / "config.yaml").write_text(string.Template(facts.VOCODER_YAML).substitute(depth))
    return directory


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Seeded random weights at a scale that gives non-degenerate audio: the stock initialisers zero the DiT's
    adaLN and output layers (decoder_dit.py L409-431), which would make every mel frame zero. Matrices get
    N(0, 1/fan_in), norm scales 1 + N(0, 0.02), biases N(0, 0.02). Buffers (noise tables) are left as built."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(max(1, math.prod(p.shape[1:]))))
            elif name.endswith(("weight", "gamma", "alpha")):
                p.copy_(1 + 0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))


def quiet_vocoder_(hift) -> None:
    """Random-weight audio in a speech-like range instead of mostly clipped: conv_post's first n_fft/2 + 1
    channels are log-magnitudes (generator.py L704: magnitude = exp(x)); a bias of -2 and 0.3 of the gain."""
    with torch.no_grad():
        bins = hift.istft_params["n_fft"] // 2 + 1
        for name, p in hift.conv_post.named_parameters():
            if name == "bias":
                p[:bins] -= 2.0
            elif p.ndim >= 2 and "original0" in name or name == "weight":
                p.mul_(0.3)


class _placeholder_buffers(TorchFunctionMode):
    """During flow construction: `torch.zeros` of a stock DiT cache buffer shape gives a zero-stride view."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.zeros:
            shape = tuple(args[0]) if len(args) == 1 and not isinstance(args[0], int) else tuple(args)
            if shape in _STOCK_SHAPES:
                return torch.zeros((), **kwargs).expand(shape)
        return func(*args, **kwargs)


def load_flow(path: Path, n_timesteps: int):
    """The stock flow from a flow.yaml (`_load_config`), with DiT cache buffers sized as the module docstring
    says: stock shapes for 16 DiT layers, else [n_timesteps, layers, ...] / [layers, ...]. Raises CheckpointError
    for a file that is not such a config."""
    with _placeholder_buffers():
        try:
            flow = upstream.stepaudio2()._load_config(path)["flow"]
            cfm, dit = flow.decoder, flow.decoder.estimator
            layers = len(dit.blocks)
        except (torch.OutOfMemoryError, MemoryError):
            raise
        except Exception as exc:                    # not YAML, no "flow" entry, a class hyperpyyaml cannot build
            raise CheckpointError(f"{path}: not a flow config in the released layout ({one_line(exc)})") from exc
    for mod, lead in ((cfm, (n_timesteps, layers)), (dit, (layers,))):
        for name in ("att_cache_buffer", "cnn_cache_buffer"):
            shape = tuple(mod._buffers[name].shape)
            if layers < 16:
                shape = lead + shape[len(lead):]
            mod._buffers[name] = torch.zeros(shape)
    return flow


def check_steps(n_timesteps) -> int:
    """Euler steps as a plain int in [1, 16] (a numpy int too). Raises InputError naming n_timesteps."""
    steps = as_int(n_timesteps)
    if steps is None or not 1 <= steps <= 16:
        raise InputError(f"n_timesteps: expected an int in [1, 16] (the stock DiT buffers hold 16 steps), "
                         f"got {shown(n_timesteps)}")
    return steps


def build_token2wav(model_dir=None, *, n_timesteps: int = 10, device="cpu", seed: int = 0, depth=None):
    """A stock `Token2wav` without its CUDA-only, ONNX-loading `__init__` (token2wav.py L92-134, mirrored attribute
    for attribute) from `model_dir` (the released layout, facts.CHECKPOINT_FILES less the ONNX models) or, for
    None, seeded random weights of the released (or `depth`) architecture. The construction-time tables
    (`decoder.rand_noise`, the vocoder's `sine_waves` / `rand_ini` / `uv`) come from the global CPU RNG after
    `torch.manual_seed(seed)`. Raises MissingFileError naming missing files, CheckpointError (a file that
    does not load or does not hold the layout's keys), InputError for bad n_timesteps."""
    t2w_mod = upstream.stepaudio2()
    check_steps(n_timesteps)
    device = torch.device(device)
    torch.manual_seed(seed)
    if model_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = write_config_dir(Path(tmp), depth)
            flow = load_flow(cfg / "flow.yaml", n_timesteps)
            hift = t2w_mod._load_config(cfg / "config.yaml", {"hifigan": None})["hift"]
        randomize_(flow, seed + 1)
        randomize_(hift, seed + 2)
        quiet_vocoder_(hift)
        hift, checkpoint = hift.float().to(device).eval(), None
    else:
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise MissingFileError(f"spec['checkpoint']: {model_dir} is not a directory (expected the released "
                                   f"layout: {list(facts.CHECKPOINT_FILES)})")
        missing = [n for n in facts.CHECKPOINT_FILES if not (model_dir / n).is_file()]
        if missing:
            raise MissingFileError(f"spec['checkpoint'] {model_dir}: missing {missing} (released layout: "
                                    f"{list(facts.CHECKPOINT_FILES)})")
        flow = load_flow(model_dir / "flow.yaml", n_timesteps)
        load_strict(flow, model_dir / "flow.pt")
        try:                                        # reads config.yaml and hift.pt (token2wav.py L62-77)
            hift, checkpoint, _ = t2w_mod.load_causal_vocoder(model_dir, device)
        except (torch.OutOfMemoryError, MemoryError):
            raise
        except Exception as exc:
            raise CheckpointError(f"{model_dir / 'hift.pt'} (with config.yaml): the vocoder does not load "
                                  f"({one_line(exc)})") from exc
    t2w = t2w_mod.Token2wav.__new__(t2w_mod.Token2wav)
    t2w.float16, t2w.n_timesteps, t2w.device = False, n_timesteps, device
    t2w.model_path = Path(model_dir) if model_dir is not None else None
    t2w.flow, t2w.hift, t2w.vocoder_checkpoint = flow.to(device).eval(), hift, checkpoint
    t2w.bounded_vocoder = t2w_mod.BoundedVocoder(hift)
    t2w.sample_rate, t2w.hop_samples = facts.SAMPLE_RATE, facts.HOP_SAMPLES
    t2w.vocoder_delay_frames = hift.f0_predictor.condnet[0].causal_padding + hift.conv_pre_look_right + 1
    if t2w.vocoder_delay_frames != 8:
        raise ValueError(f"vocoder delay: expected 8 frames, got {t2w.vocoder_delay_frames}")
    t2w.vocoder_delay_samples = t2w.source_cache_len = t2w.vocoder_delay_frames * facts.HOP_SAMPLES
    t2w.original_vocoder_checkpoint = (Path(model_dir) / "hift_original.pt") if model_dir else None
    t2w.original_hift = None
    t2w.cache, t2w.stream_cache, t2w.hift_cache_dict, t2w._stream_prompt = {}, None, {}, None
    return t2w


# --- Step-Audio 2 ----------------------------------------------------------------------------------
def hift_class():
    """The stock original CosyVoice2 HiFTGenerator (flashcosyvoice/modules/hifigan.py)."""
    return importlib.import_module("stepaudio2.flashcosyvoice.modules.hifigan", upstream.stepaudio2()).HiFTGenerator


def check_hift_config() -> None:
    """Raise ValueError unless facts.HIFT_CONFIG is the installed HiFTGenerator's defaults (t2w L45 relies on them)."""
    params = inspect.signature(hift_class().__init__).parameters
    for k, v in facts.HIFT_CONFIG.items():
        if params[k].default != v:
            raise ValueError(f"HIFT_CONFIG[{k!r}]: {v!r}, but HiFTGenerator's default is {params[k].default!r}")


def fade_in_out(fade_in_mel: torch.Tensor, fade_out_mel: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """t2w L14-22 (the driver's own; the installed `cosyvoice2.utils.common.fade_in_out` differs): speech
    [1, S] float32 with its first 3840 samples faded in over the cached tail [1, 3840] faded out (float64
    Hamming window [7680]); a copy."""
    overlap = int(window.shape[0] / 2)
    fade_in_mel = fade_in_mel.clone()
    fade_in_mel[..., :overlap] = \
        fade_in_mel[..., :overlap] * window[:overlap] + fade_out_mel[..., -overlap:] * window[overlap:]
    return fade_in_mel


def autocast_like_upstream(device, float16: bool = False):
    """t2w L129: `torch.amp.autocast("cuda", dtype=float16 if float16 else float32)` on CUDA; nothing on the
    CPU (b1bb23c is CUDA-only; its later CPU-support commits run the same code without it)."""
    if torch.device(device).type == "cuda":
        return torch.amp.autocast("cuda", dtype=torch.float16 if float16 else torch.float32)
    return nullcontext()


class StockToken2wav:
    """Upstream `Token2wav` (t2w L25-169) minus the ONNX front end, on the installed stock modules. `cache[key]`
    holds a prepared prompt as t2w L81 returns it: (tokens int32 [1, n], lens, spk [1, 192], mel [1, 2n, 80],
    mel_lens)."""

    def __init__(self, flow, hift, device, *, n_timesteps: int = facts.N_TIMESTEPS, float16: bool = False):
        self.device, self.flow, self.hift = torch.device(device), flow, hift
        self.float16, self.n_timesteps = float16, n_timesteps
        self.cache: dict = {}
        self.stream_cache = None
        self.mel_cache_len = facts.MEL_CACHE_LEN                                   # t2w L53
        self.source_cache_len = int(self.mel_cache_len * facts.HOP_SAMPLES)        # t2w L54
        self.speech_window = torch.from_numpy(np.hamming(2 * self.source_cache_len)).to(self.device)  # t2w L55
        self.hift_cache_dict: dict = {}                                            # t2w L58

    def set_stream_cache(self, prompt_key: str) -> None:
        """t2w L102-115 (the prompt comes installed, `install_prompt`)."""
        prompt_speech_tokens, _, spk_emb, prompt_mels, _ = self.cache[prompt_key]
        self.stream_cache = self.flow.setup_cache(
            torch.cat([prompt_speech_tokens, prompt_speech_tokens[:, :3]], dim=1),
            prompt_mels, spk_emb, n_timesteps=self.n_timesteps)
        self.hift_cache_dict = dict(mel=torch.zeros(1, prompt_mels.shape[2], 0, device=self.device),
                                    source=torch.zeros(1, 1, 0, device=self.device),
                                    speech=torch.zeros(1, 0, device=self.device))

    def stream(self, generated_speech_tokens: list, prompt_key: str, last_chunk: bool = False) -> torch.Tensor:
        """t2w L118-162: one call; the float32 speech [1, S] on the device before upstream's `.cpu()`, clip and
        int16 (L164-167). S = 480 (cached + new frames) - 3840 for a non-final call, all of it for last_chunk."""
        _, _, spk_emb, prompt_mels, _ = self.cache[prompt_key]
        generated_speech_tokens = torch.tensor([generated_speech_tokens], dtype=torch.int32, device=self.device)
        if self.stream_cache is None:
            raise ValueError("stream_cache is not set")
        with autocast_like_upstream(self.device, self.float16):
            chunk_mel, self.stream_cache = self.flow.inference_chunk(
                token=generated_speech_tokens, spk=spk_emb, cache=self.stream_cache,
                last_chunk=last_chunk, n_timesteps=self.n_timesteps)
        if self.stream_cache['estimator_att_cache'].shape[4] > (prompt_mels.shape[1] + facts.TAIL_FRAMES):
            self.stream_cache['estimator_att_cache'] = torch.cat([
                self.stream_cache['estimator_att_cache'][:, :, :, :, :prompt_mels.shape[1]],
                self.stream_cache['estimator_att_cache'][:, :, :, :, -facts.TAIL_FRAMES:]], dim=4)
        mel = torch.concat([self.hift_cache_dict['mel'], chunk_mel], dim=2)                   # t2w L143-162
        speech, source = self.hift(mel, self.hift_cache_dict['source'])
        if self.hift_cache_dict['speech'].shape[-1] > 0:
            speech = fade_in_out(speech, self.hift_cache_dict['speech'], self.speech_window)
        self.hift_cache_dict = dict(mel=mel[..., -self.mel_cache_len:].clone().detach(),
                                    source=source[:, :, -self.source_cache_len:].clone().detach(),
                                    speech=speech[:, -self.source_cache_len:].clone().detach())
        if not last_chunk:
            speech = speech[:, :-self.source_cache_len]
        return speech


def build_stock_token2wav(*, n_timesteps: int = facts.N_TIMESTEPS, device="cpu", seed: int = 0,
                          depth=None, hift_config=None) -> StockToken2wav:
    """Step-Audio 2's tail with seeded random weights, as `build_token2wav` (same flow.yaml, seeds and
    order); hift_config: HiFTGenerator kwargs (None: facts.HIFT_CONFIG, the released defaults)."""
    check_steps(n_timesteps)
    check_hift_config()
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        flow = load_flow(write_config_dir(Path(tmp), depth) / "flow.yaml", n_timesteps)
    hift = hift_class()(**(hift_config or facts.HIFT_CONFIG))
    randomize_(flow, seed + 1)
    randomize_(hift, seed + 2)
    quiet_vocoder_(hift)
    return StockToken2wav(flow.to(device).eval(), hift.float().to(device).eval(), device, n_timesteps=n_timesteps)




def load_strict(module: torch.nn.Module, path: Path, rename=str) -> None:
    """`module.load_state_dict(torch.load(path), strict=True)`, keys renamed; a mismatch is one line naming the file
    and the first missing, unexpected or mis-shaped key, or a file torch cannot load. Raises CheckpointError."""
    want = module.state_dict()
    try:
        state = {rename(k): v for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}
    except (torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as exc:                        # unpickling, a truncated zip, not a dict of tensors ...
        raise CheckpointError(f"{path}: torch.load failed ({one_line(exc)})") from exc
    bad = [f"missing key {k!r}" for k in want if k not in state] + [
        f"unexpected key {k!r}" if k not in want else f"key {k!r} is {list(v.shape)}, expected {list(want[k].shape)}"
        for k, v in state.items() if k not in want or v.shape != want[k].shape]
    if bad:
        raise CheckpointError(f"{path}: {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
    module.load_state_dict(state, strict=True)


def build_stepaudio2_token2wav(model_dir, *, n_timesteps: int = facts.N_TIMESTEPS, device="cpu", seed: int = 0):
    """Step-Audio 2 mini's StockToken2wav from its released token2wav/ folder, loaded as t2w L37-48 loads it: the
    flow from flow.yaml and flow.pt, hift.pt into `HiFTGenerator()` with "generator." taken out of its keys (the
    files and the class defaults give the architecture; the ONNX front end is not read: prepare_prompt). Raises
    MissingFileError naming a missing file, CheckpointError naming the file and key, InputError (n_timesteps)."""
    model_dir, steps = Path(model_dir), check_steps(n_timesteps)
    missing = [n for n in ("flow.yaml", "flow.pt", "hift.pt") if not (model_dir / n).is_file()]   # t2w L37-47
    if missing:
        raise MissingFileError(f"spec['checkpoint'] {model_dir}: missing {missing} (Step-Audio 2's token2wav/ layout)")
    torch.manual_seed(seed)
    flow, hift = load_flow(model_dir / "flow.yaml", steps), hift_class()()
    load_strict(flow, model_dir / "flow.pt")
    load_strict(hift, model_dir / "hift.pt", lambda k: k.replace("generator.", ""))
    return StockToken2wav(flow.to(device).eval(), hift.float().to(device).eval(), device, n_timesteps=steps)


# --- the model's voice prompt and buffers ------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    """A prepared voice prompt as `Token2wav._prepare_prompt` returns it (token2wav.py L136-156): tokens int32
    [1, n] @ 25 Hz, spk float32 [1, 192], mel float32 [1, 2n, 80] @ 50 Hz; `key` names it in `t2w.cache`."""
    key: str
    tokens: torch.Tensor
    spk: torch.Tensor
    mel: torch.Tensor

    @property
    def mel_frames(self) -> int:
        return int(self.mel.shape[1])


def prepare_prompt(wav_path, *, seconds: float | None = 6.0, device="cpu") -> Prompt:
    """A voice prompt from a real 24 kHz WAV. The mel is the stock front end (`flashcosyvoice.utils.audio.
    mel_spectrogram` on the audio, right-padded by replicate to 2 x n_tokens frames, token2wav.py L148-155).
    Stand-in (documented, deterministic): the S3 tokenizer and CAMPPlus ONNX models ship with the weights and
    are unavailable, so the n = floor(16 kHz samples / 640) tokens and the 192-d speaker embedding are drawn
    from a generator seeded by the sha256 of the samples. seconds: keep the first `seconds` (None: all).
    Raises MissingFileError / InputError naming the file (missing, not a regular file, unreadable, not 24 kHz,
    < 0.4 s, a NaN or infinite sample, samples so large that the mel is not finite)
    and InputError for `seconds` that is not None or a finite number > 0."""
    import soundfile as sf

    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real)
                                or not math.isfinite(seconds) or seconds <= 0):
        raise InputError(f"spec['prompt_seconds']: expected None (the whole WAV) or a finite number of seconds > 0, "
                         f"got {shown(seconds)} ({type(seconds).__name__})")
    wav_path = Path(wav_path)
    if wav_path.is_dir():
        raise InputError(f"voice_prompt: {wav_path} is a directory, expected a 24 kHz WAV file")
    if not wav_path.exists():
        raise MissingFileError(f"voice_prompt: {wav_path} does not exist (expected a 24 kHz WAV file)")
    if not wav_path.is_file():
        raise InputError(f"voice_prompt: {wav_path} is not a regular file, expected a 24 kHz WAV file")
    try:
        audio, rate = sf.read(str(wav_path), dtype="float32", always_2d=True)
    except Exception as exc:
        raise InputError(f"voice_prompt: {wav_path} is not a readable audio file ({exc})") from exc
    if rate != facts.SAMPLE_RATE:
        raise InputError(f"voice_prompt: {wav_path} is {rate} Hz, expected {facts.SAMPLE_RATE} Hz")
    audio = audio.mean(axis=1)
    if seconds is not None and seconds * facts.SAMPLE_RATE < len(audio):      # a longer cut keeps the whole WAV
        audio = audio[: int(round(seconds * facts.SAMPLE_RATE))]
    if not np.isfinite(audio).all():
        raise InputError(f"voice_prompt: {wav_path} holds non-finite samples (NaN or inf) in the part used")
    n_tokens = (len(audio) * 16000 // facts.SAMPLE_RATE) // 640
    if n_tokens < 10:
        raise InputError(f"voice_prompt: {wav_path} gives {n_tokens} tokens; need >= 10 (0.4 s)")
    upstream.stepaudio2()
    from stepaudio2.flashcosyvoice.utils.audio import mel_spectrogram

    mel = mel_spectrogram(torch.from_numpy(np.ascontiguousarray(audio)).unsqueeze(0)).transpose(1, 2)
    mel = torch.nn.functional.pad(mel, (0, 0, 0, 2 * n_tokens - mel.shape[1]), mode="replicate")
    if not bool(torch.isfinite(mel).all()):
        raise InputError(f"voice_prompt: {wav_path} gives a non-finite mel spectrogram (samples up to "
                         f"{float(np.abs(audio).max()):.3g}; expected audio in [-1, 1])")
    digest = hashlib.sha256(audio.tobytes()).hexdigest()
    gen = torch.Generator().manual_seed(int(digest[:15], 16))
    tokens = torch.randint(0, facts.VOCAB_SIZE, (1, n_tokens), generator=gen, dtype=torch.int64).to(torch.int32)
    spk = torch.randn(1, 192, generator=gen)
    device = torch.device(device)
    return Prompt(f"{wav_path.name}#{seconds}s#{digest[:12]}", tokens.to(device), spk.to(device),
                  mel.contiguous().to(device))


def install_prompt(t2w, prompt: Prompt) -> None:
    """Put a prepared prompt where `set_stream_cache` looks for it (`t2w.cache`, keyed like stock's per-path
    cache). Done once, when the model is built."""
    lens = torch.tensor([prompt.tokens.shape[1]], dtype=torch.int32, device=prompt.tokens.device)
    mel_lens = torch.tensor([prompt.mel_frames], dtype=torch.int32, device=prompt.tokens.device)
    t2w.cache[prompt.key] = (prompt.tokens, lens, prompt.spk, prompt.mel, mel_lens)


def release_stock_buffers(t2w) -> int:
    """Free the stock DiT cache buffers no cadence session reads: zero-stride tensors of their shapes stay (shape
    reads work; stock sessions are refused afterwards). For a cadence-only process. Returns the bytes freed."""
    cfm, freed = t2w.flow.decoder, 0
    for mod in (cfm, cfm.estimator):
        for name in ("att_cache_buffer", "cnn_cache_buffer"):
            buf = mod._buffers[name]
            if buf.stride() != (0,) * buf.ndim:
                freed += buf.numel() * buf.element_size()
                mod._buffers[name] = torch.zeros((), dtype=buf.dtype, device=buf.device).expand(buf.shape)
    model_state(t2w)["stock_buffers_released"] = True
    if freed and torch.device(t2w.device).type == "cuda":
        with gate.device_wide():
            torch.cuda.empty_cache()
    return freed


def clone_recursive(obj):
    """`tensor.clone()` through the cache dicts: the duplex demo's `torch_clone_recursive` (MiniCPMO45/utils.py
    @67abcfd, which also walks lists) for its per-voice base caches and turn resets (unified L4398-4410)."""
    if isinstance(obj, dict):
        return {k: clone_recursive(v) for k, v in obj.items()}
    return obj.clone() if isinstance(obj, torch.Tensor) else obj


@dataclass
class Model:
    """A stock instance (`Token2wav` / `StockToken2wav`) and its installed voice prompt, shared by its sessions;
    seed: the weights seed (Step-Audio 2 sessions seed their generator with it)."""
    t2w: object
    prompt: Prompt
    spec: dict
    variant: str
    seed: int
