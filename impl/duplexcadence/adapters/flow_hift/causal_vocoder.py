"""MiniCPM-o 4.5's causal vocoder (`BoundedVocoder` over `CausalHiFTGenerator`, minicpmo-utils==1.0.7) on arena
state, one "vocoder" step per 16-frame block.

Stock (causal_vocoder/bounded_vocoder.py) re-allocates its history every block by `torch.cat`, reads offsets back
with `.item()`, gathers noise from a 259 MB host table per block; `torch.istft` checks its window on the host.
Here: regions sized from `BoundedVocoder.limits` (L68-84): ``vocoder_mel`` [1, 80, mel_buffer_frames],
``vocoder_source`` [1, 1, source_buffer_frames x 480], ``vocoder_phase`` [1, 1, 9] float64, the noise staging
``vocoder_noise`` [calls, 16 x 480, 9] (noise "host") or ``vocoder_noise_base`` [calls] int64 (noise "device");
the offsets are host clocks (plan.VocoderClock, `_process` L126-168). The histories are trimmed every block, so
no input makes them outgrow these limits: an invariant plan.VocoderClock asserts, not a bound a caller can meet.
The step (`block_step`) reads every length from its Signature: `f0_predictor` (L138), `BoundedVocoder._source`
(L108-124, the upstream function, with a stand-in noise table returning the staged noise), the source append,
`CausalHiFTGenerator.decode` (generator.py L672-711) with its `_istft` (L499-505) bound to istft.StockIstft (the
same ops; the envelope and its NOLA check made outside the step, once per frame count: no host read, no window
copy), so decode's cut and clamp (L708-711) and `_process`'s skip and sample-count check (L155-157) run in the
step too, then the history trims (L160-166). The step returns the block's speech. Eager between steps: the mel
append, the noise staging, the copy of each block's speech into the call's output (stock: `torch.cat(chunks)`,
L189; the first-chunk silence is its zeroed head, token2wav.py L213-217, the same bytes), `_stream_vocode`'s
finiteness check (token2wav.py L211: a host read per call, kept where upstream has it).
Noise "host" gathers as stock (`table[:, positions]`) into pinned memory, copied asynchronously; "device" gathers
in the step from a device copy made once per model, the same elements. The STFT window (`stft_window.to(x.device)`,
generator.py L494, L504) is a device copy bound for the step, and `CausalConv1d`'s zero context (convolution.py
L179) is made on the device (the step runs with it as torch's default device): both would block capture.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from duplexcadence import bind
from duplexcadence.errors import InputError
from duplexcadence.payload import shift_left_, shown
from duplexcadence.runtime import model_lock, model_state

from duplexcadence.adapters.flow_hift.istft import StockIstft

NOISE_MODES = ("host", "device")


class _NoiseTable:
    """Stands in for `SineGen2.sine_waves` inside `_source` (called with frame_offset 0, so it indexes
    positions arange(0, n)): returns the current call's noise [1, n, 9] at its true offset."""

    def __init__(self, owner: "ArenaVocoder"):
        self.owner, self.shape, self.device = owner, owner.table.shape, owner.device

    def __getitem__(self, index):
        return self.owner.noise_for_call(index[1])


class ArenaVocoder:
    """One session's vocoder regions and staging, driven block by block as `BoundedVocoder.stream`.

    t2w: the stock Token2wav (its `bounded_vocoder`, `hift`, `source_cache_len` are used as shipped).
    `declare(arena)` before the arena is allocated, `attach(arena, graphs)` after; `close()` drops it all."""

    def __init__(self, t2w, *, noise: str = "host"):
        if noise not in NOISE_MODES:
            raise InputError(f"noise: expected one of {NOISE_MODES}, got {shown(noise)}")
        self.t2w, self.bv, self.model, self.noise = t2w, t2w.bounded_vocoder, t2w.bounded_vocoder.model, noise
        self.device = torch.device(t2w.device)
        lim, self.hop, self.block = self.bv.limits, self.bv.hop, self.bv.block_frames
        self.channels = self.model.conv_pre.in_channels
        self.mel_cap, self.src_cap = lim["mel_buffer_frames"], lim["source_buffer_frames"]
        self.calls_max = math.ceil(lim["f0_input_frames"] / self.block)
        self.n_phase = self.model.nb_harmonics + 1
        self.table = self.model.m_source.l_sin_gen.sine_waves      # host [1, 7_200_000, 9] (generator.py L226)
        self.cut = int(math.prod(self.model.upsample_rates) * self.model.istft_params["hop_len"])
        osc = self.model.m_source.l_sin_gen
        m_source = SimpleNamespace(l_sin_gen=SimpleNamespace(
            voiced_threshold=osc.voiced_threshold, noise_std=osc.noise_std, sine_amp=osc.sine_amp,
            sine_waves=_NoiseTable(self)), l_linear=self.model.m_source.l_linear, l_tanh=self.model.m_source.l_tanh)
        # the attributes BoundedVocoder._source reads (L108-124)
        self.shim = SimpleNamespace(model=SimpleNamespace(m_source=m_source, nb_harmonics=self.model.nb_harmonics,
                                                          sampling_rate=self.model.sampling_rate),
                                    hop=self.hop, cache={}, _observe=lambda **values: None)
        self.source_fn = type(self.bv)._source
        self.copied = [None] * self.calls_max       # CUDA events: async copies out of the pinned buffers
        self.call_index = 0

    def declare(self, arena) -> None:
        f32, staged = torch.float32, (self.calls_max, self.block * self.hop, self.n_phase)
        self.shapes = {"vocoder_mel": ((1, self.channels, self.mel_cap), f32),
                       "vocoder_source": ((1, 1, self.src_cap * self.hop), f32),
                       "vocoder_phase": ((1, 1, self.n_phase), torch.float64),
                       **({"vocoder_noise": (staged, f32)} if self.noise == "host" else
                          {"vocoder_noise_base": ((self.calls_max,), torch.int64)})}
        for name, (shape, dtype) in self.shapes.items():
            arena.declare(name, shape, dtype)

    def attach(self, arena, graphs) -> None:
        self.graphs = graphs
        views = {name: arena[name].view(shape) for name, (shape, _) in self.shapes.items()}
        self.mel, self.src, self.phase = views["vocoder_mel"], views["vocoder_source"], views["vocoder_phase"]
        pin = self.device.type == "cuda"
        if self.noise == "host":
            self.staged = views["vocoder_noise"]
            self.pinned = [torch.empty((1, self.block * self.hop, self.n_phase), pin_memory=pin)
                           for _ in range(self.calls_max)]
        else:
            self.base = views["vocoder_noise_base"]
            self.base_host = torch.zeros(self.calls_max, dtype=torch.int64, pin_memory=pin)
            with model_lock(self.t2w):             # once per model and device, shared by its sessions
                tables = model_state(self.t2w).setdefault("noise_tables", {})
                if self.device not in tables:
                    tables[self.device] = self.table.to(self.device)
            self.table_dev = tables[self.device]
        self.window = self.model.stft_window.to(self.device)
        self.istft = StockIstft(self.model.istft_params, self.window)

    def reset(self) -> None:
        """The regions after `BoundedVocoder.reset()` (phase zero; the histories' lengths are host clocks)."""
        with torch.inference_mode():
            self.phase.zero_()

    def state(self, mel_len: int, src_len: int) -> dict:
        return {"vocoder_mel": self.mel[:, :, :mel_len], "vocoder_source": self.src[:, :, :src_len * self.hop],
                "vocoder_phase": self.phase}

    def close(self) -> None:
        """Drop every view, buffer and reference (the stand-ins point back at this object)."""
        self.__dict__.clear()

    # --- Token2wav._stream_vocode (token2wav.py L206-218) over BoundedVocoder.stream (L170-189) --------------
    def stream(self, mel: torch.Tensor, call) -> torch.Tensor:
        """The fresh mel [1, 80, frames] of one call (plan.CallPlan) -> its samples [1, samples] @ 24 kHz, written
        block by block into one tensor (stock: `torch.cat(chunks)`, L189; the silence's cat, token2wav.py L216-217).
        Raises RuntimeError for non-finite audio (as stock) or a sample count the plan did not predict."""
        lead = self.t2w.source_cache_len if call.silence else 0
        total = sum(b.sig.get("dec")[4] for b in call.blocks if b.sig.get("dec") is not None) * self.hop
        with torch.inference_mode():
            speech, pos = self.mel.new_empty(1, lead + total), lead
            speech[:, :lead].zero_()                                   # the first-chunk silence (L216)
            for block in call.blocks:
                sig = block.sig
                if block.fresh:
                    end = sig.size
                    self.mel[:, :, end - block.fresh:end].copy_(mel[:, :, :block.fresh].float())
                    mel = mel[:, :, block.fresh:]
                self._stage_noise(block)
                out = self.graphs.run(sig, self.block_step(sig))
                if out is not None:       # the step's samples, valid until the next replay: copied out now
                    speech[:, pos:pos + out.shape[1]].copy_(out)
                    pos += out.shape[1]
            assert pos == lead + total, (pos, lead, total)
            if not torch.isfinite(speech).all():      # token2wav.py L211 (the silence is finite)
                raise RuntimeError("Causal vocoder returned non-finite audio")
        return speech

    def _stage_noise(self, block) -> None:
        """Before the block: the noise of each `_source` call at its true offset (host clocks only)."""
        se, length, offsets = block.first_source, self.table.shape[1], []
        for n in block.sig.get("parts"):
            offsets.append((se * self.hop, n * self.hop))
            se += n
        if not offsets:
            return
        if self.noise == "host":
            for j, (start, count) in enumerate(offsets):
                staged = self.pinned[j][:, :count]
                if self.copied[j] is not None:          # the last async copy out of this buffer is done
                    self.copied[j].synchronize()
                staged.copy_(self.table[:, torch.arange(start, start + count).remainder(length)])   # as stock
                self.staged[j:j + 1, :count].copy_(staged, non_blocking=True)
                self.copied[j] = self._event()
        else:
            if self.copied[0] is not None:
                self.copied[0].synchronize()
            for j, (start, _) in enumerate(offsets):
                self.base_host[j] = start % length
            self.base.copy_(self.base_host, non_blocking=True)
            self.copied[0] = self._event()

    def _event(self):
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def noise_for_call(self, positions: torch.Tensor) -> torch.Tensor:
        j, n = self.call_index, positions.shape[0]
        self.call_index += 1
        if self.noise == "host":
            return self.staged[j:j + 1, :n]
        return self.table_dev[:, (positions + self.base[j]).remainder(self.table.shape[1])]

    # --- BoundedVocoder._process (bounded_vocoder.py L126-168) on arena views --------------------------------
    def block_step(self, sig):
        """The step of a "vocoder" Signature (plan.py): a zero-argument callable that reads and writes arena
        views and its own tensors only and reads every length from `sig`. Returns the block's speech [1, fresh x
        480] (decode with its `_istft`, cut and clamp, then `_process`'s skip, L155-157), or None when no speech is
        due. Runs with the STFT window's device copy and the `_istft` stand-in (istft.StockIstft, its envelope made
        here, outside the step) bound on the shared generator under the model's lock (a replay binds nothing)."""
        dec, finalize = sig.get("dec"), sig.get("finalize")
        binds = [bind.attr(self.model, "stft_window", self.window)]
        if dec is not None:     # decode's istft makes (skip + fresh) x 480 samples, + the cut unless finalizing
            samples = (dec[3] + dec[4]) * self.hop + (0 if finalize else self.cut)
            binds.append(bind.attr(self.model, "_istft", self.istft.for_samples(samples)))

        def step():
            with torch.device(self.device), bind.bound(*binds, lock=model_lock(self.t2w)):
                return self._block(sig)
        return step

    def _block(self, sig):
        mel_len, src_len, model, self.call_index = sig.size, sig.get("vocoder_source"), self.model, 0
        if sig.get("f0") is not None:
            rel, skip = sig.get("f0")
            features = self.mel[:, :, rel:mel_len]
            f0 = model.f0_predictor(features.double(), finalize=sig.get("finalize")).to(features)[:, skip:]
            pos = src_len * self.hop
            for part in f0.split(self.block, dim=1):
                self.shim.cache["phase"] = self.phase
                s = self.source_fn(self.shim, part, 0)
                self.phase.copy_(self.shim.cache.pop("phase"))    # pop: a capture's phase is not kept alive
                self.src[:, :, pos:pos + s.shape[-1]].copy_(s)
                pos += s.shape[-1]
            src_len += sum(sig.get("parts"))
        speech = None
        if sig.get("dec") is not None:
            a, b, s0, skip, fresh = sig.get("dec")
            speech = model.decode(self.mel[:, :, a:b], self.src[:, :, s0 * self.hop:src_len * self.hop],
                                  finalize=sig.get("finalize"))[:, skip * self.hop:]
            if speech.shape[-1] != fresh * self.hop:
                raise RuntimeError("Bounded vocoder returned an unexpected sample count")
        shift_left_(self.mel, mel_len, sig.get("keep_mel"))
        shift_left_(self.src, src_len * self.hop, sig.get("keep_src") * self.hop)
        return speech
