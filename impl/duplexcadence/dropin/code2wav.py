"""transformers==5.17.0 `Qwen3OmniMoeCode2Wav` for a window loop, `forward` on a cadence session: `code2wav =
wrap(code2wav)` and the loop runs unchanged (vllm-omni `talker2code2wav_async_chunk`; `chunked_decode`, modeling
L3778-3788). The context is learnt from the codes: a window whose first min(F, C) frames are the last ones decoded
(F so far, C the left context) continues the stream, any other starts one. It computes what such loops keep,
`wav[..., ctx * 1920:]`; the head before it is NaN (docs/dropins.md)."""
import torch

from duplexcadence import gate
from duplexcadence.adapters import code2wav as adapter
from duplexcadence.adapters.code2wav.schedule import BOUNDARY_LOSS, NUM_QUANTIZERS, SAMPLES_PER_FRAME, UNIT
from duplexcadence.adapters.code2wav.stock import parse_codes
from duplexcadence.dropin.checks import check_options, check_wrapped
from duplexcadence.errors import InputError


class Code2Wav:
    """Stands in for the Qwen3OmniMoeCode2Wav `native` (or open_model("qwen3_omni")); any other attribute is its
    own. `session`: a CadenceSession (`options` its spec) of left context C = `left_context`, a call per window."""

    def __init__(self, native, left_context: int = adapter.LEFT_CONTEXT, **options):
        native = getattr(native, "native", native)
        check_wrapped("native", native, "Qwen3OmniMoeCode2Wav",
                      "a transformers Qwen3OmniMoeCode2Wav or open_model('qwen3_omni')")
        check_options(options, set(adapter.session_options(native, "cadence")) - {"left_context", "initial_frames"})
        self.native, self.left_context = native, left_context
        self.session = adapter.new_session(self.native, "cadence", {**options, "left_context": left_context,
                                                                    "initial_frames": 0})
        self.session.prepare()
        self.recent = torch.zeros(NUM_QUANTIZERS, 0, dtype=torch.int64)    # host: the stream's last <= C frames

    def __getattr__(self, name):
        return getattr(vars(self).get("native"), name)

    def forward(self, codes: torch.Tensor, **kwargs) -> torch.Tensor:
        """modeling L3764-3776: codes int [1, 16, T] -> wav [1, 1, 1920 T - 555] in the model's dtype and device,
        the stock bytes from sample ctx * 1920 on, NaN before. Raises InputError (LimitError past 13 new frames)
        before anything changes."""
        if codes.dim() != 3 or codes.shape[0] != 1:
            raise InputError(f"codes: expected [1, {NUM_QUANTIZERS}, frames] (batch 1), got {list(codes.shape)}")
        with gate.work():                  # the caller's copies too: never beside a capture
            host, ctx, clock = parse_codes(codes[0].cpu()), self.recent.shape[1], self.session.clocks()
            frames = host.shape[1]
            if not (0 < ctx < frames and torch.equal(host[:, :ctx], self.recent)):
                ctx = 0
                clock.start_turn()
            self.session.prepare(clock.unit(frames - ctx))       # checks the window; CUDA: captures an unseen one
            if ctx == 0:
                self.session.start_turn()
            out, self.recent = self.session.speak(host[:, ctx:]), host[:, max(0, frames - self.left_context):]
            wav = torch.full((1, 1, frames * SAMPLES_PER_FRAME - BOUNDARY_LOSS), float("nan"), dtype=self.dtype)
            wav[..., ctx * SAMPLES_PER_FRAME:] = torch.from_numpy(out.waveform)
            return wav.to(self.session.device)

    __call__ = forward

    def chunked_decode(self, codes, chunk_size: int = 300, left_context_size: int = 25) -> torch.Tensor:
        """transformers' own (L3778-3788) with this drop-in as `self`, a new stream. Raises InputError for
        chunk_size > 13 or a left_context_size other than `left_context`."""
        if chunk_size > UNIT.policy.bound() or left_context_size != self.left_context:
            raise InputError(f"chunk_size {chunk_size}, left_context_size {left_context_size}: the drop-in decodes "
                             f"<= {UNIT.policy.bound()} new frames a window after {self.left_context} of context")
        self.recent = self.recent[:, :0]
        return type(self.native).chunked_decode(self, codes, chunk_size, left_context_size)


wrap = Code2Wav             #: wrap(model, **options): the drop-in
