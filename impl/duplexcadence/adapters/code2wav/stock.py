"""Stock Code2Wav session: the transformers forward per window on a freshly concatenated code window, as
vllm-omni's `talker2code2wav_async_chunk` builds it (`torch.cat(frames[-end_index:])`, [1, 16, T] on the
device) and `chunked_decode_streaming` trims it (`wav[..., ctx * 1920:]`), cast with `.float()` as generate
does (L4145; exact). The module keeps no state between calls, so stock sessions are independent; each forward
holds the model's lock, so it never runs while a cadence step hands the shared pre-transformer its mask.
"""
from __future__ import annotations


import torch

from duplexcadence import clocks, gate
from duplexcadence.adapters.code2wav.schedule import CODEBOOK_SIZE, NUM_QUANTIZERS, SAMPLES_PER_FRAME, UNIT, Turn
from duplexcadence.payload import check_codes
from duplexcadence.runtime import model_lock
from duplexcadence.session import Capabilities, Session, SessionStats, check_final, host_waveform, unit_output

CAPABILITIES = dict(turn_state="reset", concurrent=True, payload="frames", max_payload=UNIT.policy.bound())


def parse_codes(codes) -> torch.Tensor:
    """One unit's codes, int64 [16, N] (InputError); the frame bound is the clock's (Turn.calls: LimitError)."""
    return check_codes(codes, n_q=NUM_QUANTIZERS, cardinality=CODEBOOK_SIZE, max_frames=None)


class StockSession(Session):
    """The stock schedule (schedule.plan_unit) on the transformers forward (module docstring). spec keys:
    left_context (25), initial_frames (4)."""

    capabilities = Capabilities(graphs=False, **CAPABILITIES)

    def __init__(self, model, spec: dict | None = None):
        self.model, self.lock = model, model_lock(model)
        self.device = next(model.parameters()).device
        self._clock = Turn(spec or {}, max_frames=model.config.max_position_embeddings)
        self.context = torch.zeros(NUM_QUANTIZERS, 0, dtype=torch.int64)   # host: the last <= C frames

    def start_turn(self) -> None:
        """A new turn: the left context is cleared (the serving code keys frames by request)."""
        self.check_open("start_turn")
        self._clock.start_turn()
        self.context = torch.zeros(NUM_QUANTIZERS, 0, dtype=torch.int64)

    def clocks(self) -> Turn:
        self.check_open("clocks")
        return self._clock.copy()

    def speak(self, payload, *, final: bool = False):
        """One SPEAK unit: codes [16][N] (1 <= N <= 13) -> float32 [sum of 1920*n - 555 per call] @ 24 kHz.
        Raises InputError (bad codes, no open turn; LimitError past 13 frames) before anything changes."""
        self.check_open("speak")
        final = check_final(final)
        codes = parse_codes(payload)
        clock = self._clock.copy()
        context, waves, info = self.context, [], []
        with gate.work():
            with clocks.argument("codes"):
                calls = clock.calls(int(codes.shape[1]), final)
            for call in calls:
                window = torch.cat([context, codes[:, call.offset:call.offset + call.new]], dim=-1)
                with self.lock, torch.inference_mode():
                    wav = self.model(window.reshape(1, NUM_QUANTIZERS, -1).to(self.device))
                    wave = wav[..., call.ctx * SAMPLES_PER_FRAME:].float()
                waves.append(host_waveform(wave))
                info.append(self._clock.info(call, waves[-1].size))
                context = window[:, window.shape[1] - min(window.shape[1], clock.left_context):]
        self.context, self._clock = context, clock
        return unit_output(waves, frames=int(codes.shape[1]), calls=info)

    def state(self) -> dict:
        """The left context (host int64 [16, ctx]) and the host clocks."""
        self.check_open("state")
        return {"codes": self.context, "ctx": self._clock.ctx, "frames": self._clock.frames,
                "units": self._clock.units, "turn": self._clock.turn}

    def stats(self) -> SessionStats:
        self.check_open("stats")
        return SessionStats.of(units=self._clock.units, mode="stock", turn=self._clock.turn)

    def close(self) -> None:
        self.context = None
        super().close()
