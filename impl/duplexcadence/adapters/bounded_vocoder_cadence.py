"""The 1.0.7 causal vocoder (`BoundedVocoder` over `CausalHiFTGenerator`) on arena state, graph-replayed.

Stock (stepaudio2/causal_vocoder/bounded_vocoder.py, minicpmo-utils==1.0.7) keeps its history in a
dict of tensors that `torch.cat` re-allocates for every 16-frame block, reads its offsets back with
`.item()`, gathers the oscillator's noise from a 259 MB table in host memory and copies it to the GPU
(a synchronous copy per block), and `torch.istft` checks its window envelope on the host (a sync).
None of that can be captured, so stock runs ~1,000 small kernels per block one by one.

Here the same upstream kernels run on arena views:

* regions (one session's arena, sizes from `BoundedVocoder.limits`, bounded_vocoder.py L68-84):
  ``vocoder_mel`` [1, 80, mel_buffer_frames] float32, ``vocoder_source`` [1, 1, source_buffer_frames
  x 480] float32 (samples), ``vocoder_phase`` [1, 1, harmonics + 1] float64, and the noise staging
  ``vocoder_noise`` [calls, 16 x 480, harmonics + 1] float32 (host mode) or the per-call table offsets
  ``vocoder_noise_base`` [calls] int64 (device mode);
* the offsets (mel, source, emitted samples, finalized, first chunk) are host integers advanced by the
  same arithmetic as `BoundedVocoder._process` (L126-168), never read back from the device;
* per block, one graph (keyed by every slice length and offset the block uses) runs
  `f0_predictor` (L138), `BoundedVocoder._source` (L108-124, the upstream function itself, called with a
  stand-in whose noise table returns the staged noise), the source append, `CausalHiFTGenerator.decode`
  up to its `_istft` call (generator.py L672-706), and the in-place history trims (L160-166);
* eager between graphs: the mel append (a copy from the flow's output), the noise staging, the stock
  `_istft` (torch.istft's NOLA check syncs), decode's last two lines (generator.py L708-711), the slice
  to fresh samples, and `Token2wav._stream_vocode`'s finiteness check and first-chunk silence
  (token2wav.py L206-218).

Noise: ``noise="host"`` gathers from the host table exactly as stock (`table[:, positions]`) into pinned
memory and copies it asynchronously into the staging region before the replay; ``noise="device"``
copies the table to the GPU once per model (259 MB, shared by its sessions) and gathers inside the
graph at `(arange + offset) % len`, the same elements. Both give stock's bytes; the suite measures both.

CUDA graph capture also needs two host-to-device copies out of the way, both of constant bytes: the
STFT window (`self.stft_window.to(x.device)`, generator.py L494/L504) is bound to a device copy for the
step, and `CausalConv1d`'s zero left context (`torch.zeros(...).to(x)`, convolution.py L179) is made on
the device (`torch.device` as the default factory device during the step).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch

NOISE_MODES = ("host", "device")


class _NoiseTable:
    """Stands in for `SineGen2.sine_waves` inside `BoundedVocoder._source`.

    `_source` is called with frame_offset=0, so it indexes with positions = arange(0, n) (n < table
    length); `__getitem__` returns the noise of the block's true offset: the staged host gather
    (host mode) or the device table at (positions + offset) % length (device mode). Shape [1, n, 9].
    """

    def __init__(self, owner: "ArenaVocoder"):
        self.owner = owner
        self.shape = owner.table_shape
        self.device = owner.device

    def __getitem__(self, index):
        _, positions = index
        return self.owner._noise_for_call(positions)


class _SourceShim:
    """The attributes of a `BoundedVocoder` that `BoundedVocoder._source` reads (bounded_vocoder.py
    L108-124): model (oscillator parameters, l_linear, l_tanh), hop, cache['phase'], _observe."""

    def __init__(self, owner: "ArenaVocoder"):
        bv, model = owner.bv, owner.model
        osc = model.m_source.l_sin_gen
        oscillator = SimpleNamespace(voiced_threshold=osc.voiced_threshold, noise_std=osc.noise_std,
                                     sine_amp=osc.sine_amp, sine_waves=_NoiseTable(owner))
        m_source = SimpleNamespace(l_sin_gen=oscillator, l_linear=model.m_source.l_linear,
                                   l_tanh=model.m_source.l_tanh)
        self.model = SimpleNamespace(m_source=m_source, nb_harmonics=model.nb_harmonics,
                                     sampling_rate=model.sampling_rate)
        self.hop = bv.hop
        self.cache = {}
        self._limits = bv.limits

    def _observe(self, **values):
        for key, value in values.items():
            if value > self._limits[key]:
                raise RuntimeError(f"Bounded vocoder exceeded {key}: {value} > {self._limits[key]}")


class ArenaVocoder:
    """One session's vocoder state in its arena, driven block by block like `BoundedVocoder.stream`.

    t2w: the stock Token2wav (its `bounded_vocoder`, `hift` and `source_cache_len` are used as shipped).
    noise: "host" or "device" (module docstring). Call `declare(arena)` before the arena is allocated,
    then `attach(arena, graphs)`, then `reset()` at every turn start.
    Raises ValueError for a bad `noise` or bad mel input (as stock), RuntimeError past a vocoder bound
    (as stock's `_observe`), both before any state changes.
    """

    def __init__(self, t2w, *, noise: str = "host"):
        if noise not in NOISE_MODES:
            raise ValueError(f"noise: expected one of {NOISE_MODES}, got {noise!r}")
        self.t2w = t2w
        self.bv = t2w.bounded_vocoder
        self.model = self.bv.model
        self.noise = noise
        self.device = torch.device(t2w.device)
        limits = self.bv.limits
        self.hop = self.bv.hop
        self.block = self.bv.block_frames
        self.channels = self.model.conv_pre.in_channels
        self.mel_cap = limits["mel_buffer_frames"]
        self.src_cap = limits["source_buffer_frames"]
        self.calls_max = math.ceil(limits["f0_input_frames"] / self.block)
        self.n_phase = self.model.nb_harmonics + 1
        table = self.model.m_source.l_sin_gen.sine_waves
        self.table = table                      # host table [1, 7_200_000, 9] (generator.py L226)
        self.table_shape = table.shape
        self.cut = int(np.prod(self.model.upsample_rates) * self.model.istft_params["hop_len"])
        self._shim = _SourceShim(self)
        self._window = None
        self._table_dev = None
        self._copied = [None] * self.calls_max    # CUDA events: async copies out of pinned buffers
        self._call_index = 0
        self._source_fn = type(self.bv)._source   # BoundedVocoder._source, the upstream function
        self.arena = self.graphs = None

    # --- set-up ------------------------------------------------------------------------------
    def declare(self, arena) -> None:
        """Declare the vocoder's regions (sizes from BoundedVocoder.limits) in `arena`."""
        arena.declare("vocoder_mel", (1, self.channels, self.mel_cap), torch.float32)
        arena.declare("vocoder_source", (1, 1, self.src_cap * self.hop), torch.float32)
        arena.declare("vocoder_phase", (1, 1, self.n_phase), torch.float64)
        if self.noise == "host":
            arena.declare("vocoder_noise", (self.calls_max, self.block * self.hop, self.n_phase), torch.float32)
        else:
            arena.declare("vocoder_noise_base", (self.calls_max,), torch.int64)

    def attach(self, arena, graphs) -> None:
        """Bind the allocated arena's views and the session's GraphCache."""
        self.arena, self.graphs = arena, graphs
        self._mel = arena["vocoder_mel"].view((1, self.channels, self.mel_cap))
        self._src = arena["vocoder_source"].view((1, 1, self.src_cap * self.hop))
        self._phase = arena["vocoder_phase"].view((1, 1, self.n_phase))
        pin = self.device.type == "cuda"
        if self.noise == "host":
            self._noise = arena["vocoder_noise"].view((self.calls_max, self.block * self.hop, self.n_phase))
            self._pinned = [torch.empty((1, self.block * self.hop, self.n_phase), dtype=torch.float32,
                                        pin_memory=pin) for _ in range(self.calls_max)]
        else:
            self._base = arena["vocoder_noise_base"].view((self.calls_max,))
            self._base_host = torch.zeros(self.calls_max, dtype=torch.int64, pin_memory=pin)
            from duplexcadence.runtime import model_state
            cache = model_state(self.t2w).setdefault("noise_tables", {})
            if self.device not in cache:      # once per model and device, shared by its sessions
                cache[self.device] = self.table.to(self.device)
            self._table_dev = cache[self.device]
        self._window = self.model.stft_window.to(self.device)

    def reset(self) -> None:
        """The state after `BoundedVocoder.reset()` + Token2wav's first_chunk flag (token2wav.py L200-202)."""
        with torch.inference_mode():
            self._phase.zero_()
        self.mel_offset = self.source_offset = self.source_end = self.emitted = 0
        self.mel_len = self.src_len = 0        # frames held in the regions
        self.finalized = False
        self.first_chunk = True

    def state(self) -> dict:
        """Host offsets and the regions' logical contents (views): for tests and snapshots."""
        return {"mel_offset": self.mel_offset, "source_offset": self.source_offset,
                "source_end": self.source_end, "speech_offset": self.emitted * self.hop,
                "finalized": self.finalized, "first_chunk": self.first_chunk,
                "mel": self._mel[:, :, :self.mel_len], "source": self._src[:, :, :self.src_len * self.hop],
                "phase": self._phase}

    # --- Token2wav._stream_vocode (token2wav.py L206-218) ----------------------------------------
    def stream_vocode(self, chunk_mel: torch.Tensor, last_chunk: bool) -> torch.Tensor:
        """Fresh mel [1, 80, frames] -> new samples [1, samples] @ 24 kHz, as Token2wav._stream_vocode.
        Raises ValueError (bad shape / finalized stream) and RuntimeError (non-finite audio) as stock."""
        speech = self.stream(chunk_mel, finalize=last_chunk)
        if not torch.isfinite(speech).all():
            raise RuntimeError("Causal vocoder returned non-finite audio")
        if speech.shape[-1] and self.first_chunk:
            self.first_chunk = False
            if not last_chunk:
                silence = speech.new_zeros(1, self.t2w.source_cache_len)
                speech = torch.cat([silence, speech], dim=1)
        return speech

    # --- BoundedVocoder.stream (bounded_vocoder.py L170-189) -------------------------------------
    def stream(self, mel: torch.Tensor, finalize: bool = False) -> torch.Tensor:
        if not isinstance(mel, torch.Tensor):
            raise ValueError(f"mel: expected a torch.Tensor [1, {self.channels}, frames], got {type(mel).__name__}")
        if mel.ndim != 3 or tuple(mel.shape[:2]) != (1, self.channels):
            raise ValueError("Require fresh mel with shape [1, channels, frames]")
        if not mel.dtype.is_floating_point:     # stock's part.float() would cast ints/bools, drop imaginary parts
            raise ValueError(f"mel: expected a floating-point tensor, got {mel.dtype}")
        if self.finalized:
            if mel.shape[-1] or not finalize:
                raise ValueError("Stream already finalized; call reset() for a new utterance")
            return mel.new_zeros(1, 0)
        chunks = []
        with torch.inference_mode(), torch.amp.autocast(mel.device.type, enabled=False):
            for part in mel.split(self.block, dim=2):
                n = part.shape[-1]
                if not n:
                    continue
                if self.mel_len + n > self.mel_cap:
                    raise RuntimeError(f"Bounded vocoder exceeded mel_buffer_frames: {self.mel_len + n} > "
                                       f"{self.mel_cap}")
                self._mel[:, :, self.mel_len:self.mel_len + n].copy_(part.float())
                self.mel_len += n
                chunks.append(self._process(False))
            if finalize:
                chunks.append(self._process(True))
                self.finalized = True
        return torch.cat(chunks, dim=1) if chunks else mel.new_zeros(1, 0)

    # --- BoundedVocoder._process (bounded_vocoder.py L126-168) -----------------------------------
    def _plan(self, finalize: bool) -> dict:
        """Every length and offset of one block from the host clocks (the same arithmetic as L127-166)."""
        bv = self.bv
        mo, so, se, em = self.mel_offset, self.source_offset, self.source_end, self.emitted
        received = mo + self.mel_len
        avail_src = max(0, received - (0 if finalize else bv.f0_right))
        plan = {"finalize": finalize, "mel_len": self.mel_len, "src_len": self.src_len}
        parts, f0_start = (), None
        if avail_src > se:
            f0_start = max(0, se - bv.f0_left)
            if received - f0_start > bv.limits["f0_input_frames"]:
                raise RuntimeError(f"Bounded vocoder exceeded f0_input_frames: {received - f0_start} > "
                                   f"{bv.limits['f0_input_frames']}")
            n = avail_src - se
            parts = tuple(min(self.block, n - i) for i in range(0, n, self.block))
            se_new = avail_src
        else:
            se_new = se
        src_len = self.src_len + sum(parts)
        if src_len > self.src_cap:
            raise RuntimeError(f"Bounded vocoder exceeded source_buffer_frames: {src_len} > {self.src_cap}")
        avail_speech = max(0, se_new - (0 if finalize else bv.decoder_right))
        dec = None
        em_new = em
        if avail_speech > em:
            start = max(0, em - bv.history)
            if se_new - start > bv.limits["decoder_input_frames"]:
                raise RuntimeError(f"Bounded vocoder exceeded decoder_input_frames: {se_new - start} > "
                                   f"{bv.limits['decoder_input_frames']}")
            dec = (start - mo, se_new - mo, start - so, em - start, avail_speech - em)
            em_new = avail_speech
        keep_mel = max(0, min(em_new - bv.history, se_new - bv.f0_left))
        keep_source = max(0, em_new - bv.history)
        plan.update(f0=None if f0_start is None else (f0_start - mo, se - f0_start), parts=parts,
                    first_source=se, dec=dec, keep_mel=keep_mel - mo, keep_src=keep_source - so,
                    new=(keep_mel, keep_source, se_new, em_new, src_len))
        return plan

    def _process(self, finalize: bool) -> torch.Tensor:
        plan = self._plan(finalize)
        self._stage_noise(plan)
        sig = ("vocoder", finalize, plan["mel_len"], plan["src_len"], plan["f0"], plan["parts"], plan["dec"],
               plan["keep_mel"], plan["keep_src"])
        out = self.graphs.run(sig, lambda: self._bound_step(plan))
        keep_mel, keep_source, se_new, em_new, src_len = plan["new"]
        speech = self._mel.new_zeros(1, 0)
        if plan["dec"] is not None:
            magnitude, phase = out
            x = self.model._istft(magnitude, phase)             # stock, eager (generator.py L499-505)
            if not finalize:                                    # generator.py L708-711
                x = x[:, :-self.cut]
            x = torch.clamp(x, -self.model.audio_limit, self.model.audio_limit)
            _, _, _, skip, fresh = plan["dec"]
            speech = x[:, skip * self.hop:]
            if speech.shape[-1] != fresh * self.hop:
                raise RuntimeError("Bounded vocoder returned an unexpected sample count")
        self.mel_len -= plan["keep_mel"]
        self.src_len = src_len - plan["keep_src"]
        self.mel_offset, self.source_offset, self.source_end, self.emitted = keep_mel, keep_source, se_new, em_new
        return speech

    def _stage_noise(self, plan: dict) -> None:
        """Before the block: the noise of each `_source` call at its true offset (host clocks only)."""
        se, L = plan["first_source"], self.table_shape[1]
        offsets = []
        for n in plan["parts"]:
            offsets.append((se * self.hop, n * self.hop))
            se += n
        self._call_index = 0
        if self.noise == "host":
            for j, (start, count) in enumerate(offsets):
                positions = torch.arange(start, start + count).remainder(L)   # as stock, on the host
                staged = self._pinned[j][:, :count]
                if self._copied[j] is not None:     # the last async copy out of this buffer is done
                    self._copied[j].synchronize()
                staged.copy_(self.table[:, positions])
                self._noise[j:j + 1, :count].copy_(staged, non_blocking=True)
                if self.device.type == "cuda":
                    self._copied[j] = torch.cuda.Event()
                    self._copied[j].record()
        else:
            if offsets:
                if self._copied[0] is not None:
                    self._copied[0].synchronize()
                for j, (start, _) in enumerate(offsets):
                    self._base_host[j] = start % L
                self._base.copy_(self._base_host, non_blocking=True)
                if self.device.type == "cuda":
                    self._copied[0] = torch.cuda.Event()
                    self._copied[0].record()

    def _noise_for_call(self, positions: torch.Tensor) -> torch.Tensor:
        j, n = self._call_index, positions.shape[0]
        self._call_index += 1
        if self.noise == "host":
            return self._noise[j:j + 1, :n]
        return self._table_dev[:, (positions + self._base[j]).remainder(self.table_shape[1])]

    def _bound(self):
        return _Bound(self)

    def _bound_step(self, plan: dict):
        """`_block_step` with device-default factories and the device STFT window (`_Bound`): entered inside
        the step, so a replay swaps nothing on the shared model (sessions may replay on other threads)."""
        with torch.device(self.device), self._bound():
            return self._block_step(plan)

    def _block_step(self, plan: dict):
        """One block on arena views (graph-capturable: reads/writes arena views and its own tensors only).
        Returns decode's (magnitude, phase) at the `_istft` call, or None when no speech is due."""
        bv, model = self.bv, self.model
        shim = self._shim
        self._call_index = 0
        mel_len, src_len = plan["mel_len"], plan["src_len"]
        if plan["f0"] is not None:
            rel, skip = plan["f0"]
            features = self._mel[:, :, rel:mel_len]
            f0 = model.f0_predictor(features.double(), finalize=plan["finalize"]).to(features)
            f0 = f0[:, skip:]
            pos = src_len * self.hop
            for part in f0.split(self.block, dim=1):
                shim.cache["phase"] = self._phase
                s = self._source_fn(shim, part, 0)
                self._phase.copy_(shim.cache["phase"])
                self._src[:, :, pos:pos + s.shape[-1]].copy_(s)
                pos += s.shape[-1]
            src_len += sum(plan["parts"])
        out = None
        if plan["dec"] is not None:
            a, b, s0, _, _ = plan["dec"]
            features = self._mel[:, :, a:b]
            source = self._src[:, :, s0 * self.hop:src_len * self.hop]
            seen = {}

            def istft_input(magnitude, phase):
                seen["out"] = (magnitude, phase)
                return magnitude.new_zeros(1, self.cut + 1)     # discarded: the real _istft runs eagerly

            model._istft = istft_input
            try:
                model.decode(features, source, finalize=plan["finalize"])
            finally:
                del model._istft
            out = seen["out"]
        _shift_left(self._mel, mel_len, plan["keep_mel"])
        _shift_left(self._src, src_len * self.hop, plan["keep_src"] * self.hop)
        return out


class _Bound:
    """For one block: the STFT window is a device copy (same bytes), so `stft_window.to(device)` is free."""

    def __init__(self, owner):
        self.owner = owner

    def __enter__(self):
        model = self.owner.model
        self.saved = model.stft_window
        model.stft_window = self.owner._window

    def __exit__(self, *exc):
        self.owner.model.stft_window = self.saved


def _shift_left(buf: torch.Tensor, length: int, by: int) -> None:
    """buf[..., :length-by] = buf[..., by:length] in place, in pieces no longer than `by` (no piece reads
    what an earlier piece wrote). The stock `cache[...][..., keep:].clone()` (bounded_vocoder.py L162-163)."""
    if by <= 0:
        return
    keep = length - by
    for i in range(0, keep, by):
        w = min(by, keep - i)
        buf[..., i:i + w].copy_(buf[..., by + i:by + i + w])
