"""The host clocks of a session and the signature of every step they imply, from arithmetic alone.

`MiniCPMClocks` / `StepAudio2Clocks` are the `ClockState`s of both modes of a variant (the token buffer's fill,
the conformer / DiT cache lengths, the vocoder's host offsets); `plan(size, final)` advances them by a SPEAK unit
and returns its stream calls with their steps' signatures. `speak` runs exactly these with these keys
(`TokenSession`) and `clocks()` hands out a copy, so a prediction is what the step will use. Steps:
* "flow" (MiniCPM-o, a call with tokens): size = the call's tokens (incl. 3 lookahead), lengths conformer_att /
  estimator_att (mel frames read), exact last_chunk.
* "vocoder" (MiniCPM-o, a BoundedVocoder block): size = mel frames held, lengths vocoder_source (source frames
  held before it), exact: finalize, f0 (F0 input start in the mel history, frames skipped), parts (frames of each
  source call), dec (decoder mel from / to, source from, frames skipped, fresh frames), keep_mel / keep_src
  (frames dropped from the histories after it).
* "dit" (Step-Audio 2, a call): size = mel frames, lengths estimator_att, exact n_timesteps.
* "hift" (Step-Audio 2, a call): size = HiFT input frames (cached + new), lengths hift_mel / hift_source (cached
  mel frames, source samples), exact keep_source (source samples kept).
"""
from __future__ import annotations

import abc
from typing import NamedTuple

from duplexcadence import gate
from duplexcadence.clocks import ClockError, Signature, signature
from duplexcadence.errors import InputError, LimitError
from duplexcadence.payload import check_int, check_tokens
from duplexcadence.session import ClockState, Session, check_final, unit_output

import duplexcadence.adapters.flow_hift.facts as facts
from duplexcadence.adapters.flow_hift.facts import Call


class VocoderGeometry(NamedTuple):
    """BoundedVocoder's fixed sizes and the limits its `_observe` checks (bounded_vocoder.py L40-84)."""
    hop: int
    block: int
    f0_left: int
    f0_right: int
    history: int
    decoder_right: int
    mel_cap: int
    src_cap: int
    f0_max: int
    dec_max: int


def geometry(bv) -> VocoderGeometry:
    lim = bv.limits
    return VocoderGeometry(bv.hop, bv.block_frames, bv.f0_left, bv.f0_right, bv.history, bv.decoder_right,
                           *(lim[k] for k in ("mel_buffer_frames", "source_buffer_frames", "f0_input_frames",
                                              "decoder_input_frames")))


class Block(NamedTuple):
    """One `BoundedVocoder._process`: its signature (what the captured step reads), the mel frames appended
    before it, the absolute source frame its noise starts at (host noise staging)."""
    sig: Signature
    fresh: int
    first_source: int


class VocoderClock:
    """The host offsets of `BoundedVocoder.cache` (mel_offset, source_offset, source_end, speech_offset,
    finalized; bounded_vocoder.py L86-99) plus the frames held in the mel / source histories and
    Token2wav's first_chunk flag (token2wav.py L200-202), advanced by the arithmetic of `stream` / `_process`
    (L126-189).

    No input can cross BoundedVocoder's limits (L68-84), so they are invariants here, not bounds a caller meets:
    after every non-final block of R mel frames received, source_end = R - f0_right and emitted = source_end -
    decoder_right, so the trim (L160-166) keeps min(R, delay + max(history, f0_left - decoder_right)) mel
    frames (`mel_cache_frames`) and min(source_end, history + decoder_right) source frames; the next block
    appends at most `block` frames (`mel_buffer_frames`), makes at most `block` source frames and reads at most
    f0_left + f0_right + block / history + decoder_right + block frames; a finalize block appends no mel and
    makes f0_right <= block source frames (the build fixes delay = 8 < block = 16), and closes the turn. The
    checks below are assertions of that arithmetic."""

    def __init__(self, geometry: VocoderGeometry):
        assert geometry.f0_right <= geometry.block, geometry     # a finalize block's source fits one block
        self.g = geometry
        self.reset()

    def reset(self) -> None:
        self.mel_offset = self.source_offset = self.source_end = self.emitted = 0
        self.mel_len = self.src_len = 0
        self.finalized, self.first_chunk = False, True

    def blocks(self, frames: int, finalize: bool) -> list[Block]:
        """The blocks of `stream(mel of `frames`, finalize)`: 16-frame parts, then the finalize block."""
        assert not self.finalized, "a finalized vocoder takes no blocks until reset (the turn is closed)"
        out = []
        for start in range(0, frames, self.g.block):
            n = min(self.g.block, frames - start)
            self.mel_len += n
            assert self.mel_len <= self.g.mel_cap, f"vocoder_mel {self.mel_len} > mel_buffer_frames {self.g.mel_cap}"
            out.append(self._block(False, n))
        if finalize:
            out.append(self._block(True, 0))
            self.finalized = True
        return out

    def _block(self, finalize: bool, fresh: int) -> Block:
        geo, mo, so, se, em = self.g, self.mel_offset, self.source_offset, self.source_end, self.emitted
        received = mo + self.mel_len
        avail_src = max(0, received - (0 if finalize else geo.f0_right))
        f0, parts, se_new = None, (), se
        if avail_src > se:
            start = max(0, se - geo.f0_left)
            assert received - start <= geo.f0_max, f"f0 input {received - start} > f0_input_frames {geo.f0_max}"
            f0 = (start - mo, se - start)
            n = avail_src - se
            parts = tuple(min(geo.block, n - i) for i in range(0, n, geo.block))
            se_new = avail_src
        src_len = self.src_len + sum(parts)
        assert src_len <= geo.src_cap, f"vocoder_source {src_len} > source_buffer_frames {geo.src_cap}"
        avail_speech = max(0, se_new - (0 if finalize else geo.decoder_right))
        dec, em_new = None, em
        if avail_speech > em:
            start = max(0, em - geo.history)
            assert se_new - start <= geo.dec_max, f"decoder input {se_new - start} > decoder_input_frames {geo.dec_max}"
            dec = (start - mo, se_new - mo, start - so, em - start, avail_speech - em)
            em_new = avail_speech
        keep_mel = max(0, min(em_new - geo.history, se_new - geo.f0_left))
        keep_src = max(0, em_new - geo.history)
        sig = signature("vocoder", self.mel_len, {"vocoder_source": self.src_len}, finalize=finalize, f0=f0,
                        parts=parts, dec=dec, keep_mel=keep_mel - mo, keep_src=keep_src - so)
        self.mel_len -= keep_mel - mo
        self.src_len = src_len - (keep_src - so)
        self.mel_offset, self.source_offset, self.source_end, self.emitted = keep_mel, keep_src, se_new, em_new
        return Block(sig, fresh, se)


class CallPlan(NamedTuple):
    """One stream call: the call, the signatures of its steps in order, the vocoder blocks (MiniCPM-o),
    whether its speech gets the first-chunk silence, and every host clock before and after it (`host()`)."""
    call: Call
    steps: list
    blocks: list
    silence: bool
    before: dict
    after: dict


class UnitPlan(NamedTuple):
    calls: list        # CallPlan
    rest: int          # where the token buffer left after the unit starts (in buffer + new tokens)


class FlowClocks(ClockState):
    """Host clocks common to both variants: the open turn, the token buffer's fill, the flow regions'
    lengths (mel frames). specs: facts.regions(...) by name."""

    variant = ""

    def __init__(self, specs: dict):
        self.specs = specs
        self.P = specs["estimator_att"].initial
        self.open = False
        self.buffered = 0
        self.lengths = {"conformer_att": self.P, "estimator_att": self.P}

    def start_turn(self) -> None:
        self.open = True
        self.buffered = len(facts.VARIANT[self.variant].start_buffer)

    def plan(self, size: int, final: bool = False) -> UnitPlan:
        """Advance by one SPEAK unit of `size` new tokens (the turn's last if `final`); return its calls.
        Raises InputError (no open turn, a size outside [0, 25], a call the stock code cannot make), a
        ClockError past a declared bound, or LimitError (session_usable False) for a Step-Audio 2 call after a
        first call that cached a speech tail shorter than the cross-fade, part-way through: plan on a copy
        (`copy()`) and keep it on success."""
        if not self.open:
            raise InputError("speak: no open turn (call start_turn first; a finalised turn is closed)")
        size, final = check_int("size", size, low=0, high=facts.MAX_UNIT_TOKENS), check_final(final)
        calls, rest = facts.plan_calls(self.variant, self.buffered, size, final)
        out = [self._call(c) for c in calls]
        self.buffered, self.open = (0, False) if final else (self.buffered + size - rest, True)
        return UnitPlan(out, rest)

    def unit(self, size: int, final: bool = False) -> list[Signature]:
        return [s for c in self.plan(size, final).calls for s in c.steps]

    def _grow(self, call: Call) -> int:
        adv = facts.mel_advance(call.n, call.last_chunk)
        for name in self.lengths:
            self.lengths[name] = self.specs[name].step(self.lengths[name], adv)[1]
        return adv

    @abc.abstractmethod
    def _call(self, call: Call) -> CallPlan:
        """Advance by one stream call."""

    @abc.abstractmethod
    def host(self) -> dict:
        """Every host clock now (ints and bools)."""


class MiniCPMClocks(FlowClocks):
    """MiniCPM-o 4.5: start_turn restores the voice's base (lengths P, vocoder reset, buffer [4218] * 3)."""

    variant = "minicpmo45"

    def __init__(self, specs: dict, vocoder: VocoderGeometry):
        super().__init__(specs)
        self.vocoder = VocoderClock(vocoder)

    def start_turn(self) -> None:
        super().start_turn()
        self.lengths = {"conformer_att": self.P, "estimator_att": self.P}
        self.vocoder.reset()

    def _call(self, call: Call) -> CallPlan:
        steps, before = [], self.host()
        if call.n:
            steps.append(signature("flow", call.n, self.lengths, last_chunk=call.last_chunk))
        frames = self._grow(call) if call.n else 0
        blocks = self.vocoder.blocks(frames, call.last_chunk)
        speech = any(b.sig.get("dec") is not None for b in blocks)
        silence = speech and self.vocoder.first_chunk and not call.last_chunk
        self.vocoder.first_chunk &= not speech
        return CallPlan(call, steps + [b.sig for b in blocks], blocks, silence, before, self.host())

    def host(self) -> dict:
        v = self.vocoder
        return {"open": self.open, "buffered": self.buffered, **self.lengths, "vocoder_mel": v.mel_len,
                "vocoder_source": v.src_len, "mel_offset": v.mel_offset, "source_offset": v.source_offset,
                "source_end": v.source_end, "speech_offset": v.emitted * v.g.hop, "finalized": v.finalized,
                "first_chunk": v.first_chunk}


class StepAudio2Clocks(FlowClocks):
    """Step-Audio 2 mini: the caches carry over turns (start_turn only empties the token buffer, ex L5); the
    HiFT holds the last 8 mel frames, 3840 source and 3840 speech samples after its first call (t2w L156-160)."""

    variant = "stepaudio2"

    def __init__(self, specs: dict, n_timesteps: int):
        super().__init__(specs)
        self.n_timesteps = n_timesteps
        self.hift = {"hift_mel": 0, "hift_source": 0, "hift_speech": 0}

    def _call(self, call: Call) -> CallPlan:
        if call.n == 1:
            raise InputError("tokens: the turn would end in a call of 1 token (0 or >= 2 must be left at the final "
                             "unit): upstream's conformer conv cache then comes out 5 frames wide and its next "
                             "call fails (upsample_encoder_v2.py L425)")
        tail = self.hift["hift_speech"]
        if 0 < tail < facts.SOURCE_CACHE_LEN:
            raise LimitError(f"speak: the cached speech tail holds {tail} samples, the cross-fade needs "
                             f"{facts.SOURCE_CACHE_LEN} (the session's first call was a flush of "
                             f"{tail // (2 * facts.HOP_SAMPLES)} tokens); upstream's fade fails here (t2w L14-22), "
                             f"so this session cannot speak again; the session is unchanged and every later call "
                             f"would fail too: open another", session_usable=False)
        le, before = self.lengths["estimator_att"], self.host()
        try:
            frames = self._grow(call)
        except ClockError as exc:
            raise ClockError(f"{exc}: a call of {call.n} tokens would make the encoder read past its position "
                             f"table of {self.specs['conformer_att'].policy.bound()} (EspnetRelPositionalEncoding "
                             f"max_len; the stock driver breaks here); the session is unchanged and every later "
                             f"call would cross it too", session_usable=False) from None
        T = self.hift["hift_mel"] + frames
        keep = min(facts.SOURCE_CACHE_LEN, T * facts.HOP_SAMPLES)
        steps = [signature("dit", frames, {"estimator_att": le}, n_timesteps=self.n_timesteps),
                 signature("hift", T, {k: self.hift[k] for k in ("hift_mel", "hift_source")}, keep_source=keep)]
        self.hift = {"hift_mel": min(facts.MEL_CACHE_LEN, T), "hift_source": keep, "hift_speech": keep}
        return CallPlan(call, steps, [], False, before, self.host())

    def host(self) -> dict:
        return {"open": self.open, "buffered": self.buffered, **self.lengths, **self.hift}


def steady_signatures(clocks: ClockState, max_units: int = 8) -> list[Signature]:
    """The signatures of full units (25 tokens) from `clocks` (a copy is walked; a turn is opened if none is)
    until one unit's signatures repeat the previous unit's: a turn start, its ramp and the steady shape.
    Ordered, without repeats. Raises RuntimeError if no steady state comes within `max_units` units."""
    c, seen, prev = clocks.copy(), {}, None
    if not c.open:
        c.start_turn()
    for _ in range(max_units):
        sigs = c.unit(facts.MAX_UNIT_TOKENS)
        seen.update(dict.fromkeys(sigs))
        if sigs and sigs == prev:
            return list(seen)
        prev = sigs or prev
    raise RuntimeError(f"no steady unit within {max_units} full units")


def script_signatures(clocks: ClockState, turns) -> list[Signature]:
    """Oracle only (it reads a session's future): the signatures of `turns` (each a sequence of token counts
    per SPEAK unit, the last one final) walked from a copy of `clocks`, ordered, without repeats."""
    c, seen = clocks.copy(), {}
    for counts in turns:
        counts = list(counts)
        c.start_turn()
        for k, n in enumerate(counts):
            seen.update(dict.fromkeys(c.unit(n, k == len(counts) - 1)))
    return list(seen)


class TokenSession(Session):
    """The host side of every session of the family: the variant's clocks (`clock`; read them through `clocks()`),
    the token buffer (`buffer`: ids carried to the next call; None outside a turn), the unit loop."""

    variant = ""
    units = 0

    def clocks(self) -> FlowClocks:
        self.check_open("clocks")
        return self.clock.copy()

    def open_turn(self) -> None:
        self.check_open("start_turn")
        self.clock.start_turn()
        self.buffer = list(facts.VARIANT[self.variant].start_buffer)

    def speak(self, tokens, *, final: bool = False):
        """One SPEAK unit: <= 25 speech token ids @ 25 Hz -> the float32 waveform @ 24 kHz of the unit's stream
        calls (facts.plan_calls; concatenated) and its int16 PCM. Raises InputError (bad tokens or final, no open
        turn, a call the stock code cannot make), ClockError (a stock table) or LimitError (session_usable False:
        a call the stock code can never make on this session's caches) before anything runs."""
        self.check_open("speak")
        final = check_final(final)
        tokens = check_tokens(tokens, vocab=facts.VOCAB_SIZE, max_count=facts.MAX_UNIT_TOKENS)
        clock = self.clock.copy()
        plan = clock.plan(len(tokens), final)
        buf = self.buffer + tokens
        with gate.work():
            waves = self.run_calls(plan, buf)
        self.clock, self.buffer = clock, (None if final else buf[plan.rest:])
        self.units += 1
        return unit_output(waves, calls=[c.call.n for c in plan.calls])

    @abc.abstractmethod
    def run_calls(self, plan: UnitPlan, buf: list[int]) -> list:
        """Run the unit's calls (tokens buf[call.start:call.start + call.n]); return their float32 waveforms."""
