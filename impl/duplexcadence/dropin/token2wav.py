"""minicpmo-utils==1.0.7 stepaudio2 `Token2wav` for MiniCPM-o 4.5's duplex loop, `stream` on a cadence session:
`token2wav = wrap(open_model("minicpmo45", voice_prompt=...))` and the loop runs unchanged but for its turn reset,
`set_stream_cache(prompt)` (docs/dropins.md). A call starts with the tokens the last one carried (its 3 lookahead;
[4218] * 3 at a turn start) and has 8-28 tokens, a final one fewer than 8, as the loop makes them (unified
L5446-5525): each call is one unit of the session."""
import numpy as np

from duplexcadence.adapters import flow_hift as adapter
from duplexcadence.dropin.checks import check_options
from duplexcadence.errors import InputError
from duplexcadence.payload import check_tokens, shown

LOW, HIGH = adapter.facts.MIN_CALL_TOKENS, adapter.facts.CALL_TOKENS


class Token2wav:
    """Stands in for the stock Token2wav `native` of `model` (open_model("minicpmo45", ...) or its adapter Model);
    any other attribute is its own. `session`: a CadenceSession (`options` its own) in the model's voice."""

    def __init__(self, model, **options):
        model = getattr(model, "native", model)
        if getattr(model, "variant", None) != "minicpmo45" or not hasattr(model, "t2w"):
            raise InputError(f"model: expected open_model('minicpmo45', ...) or its adapter Model, got "
                             f"{type(model).__name__}{' of ' + repr(model.variant) if hasattr(model, 'variant') else ''}")
        check_options(options, adapter.session_options(model, "cadence"))
        self.model = model
        self.native, self.session = self.model.t2w, adapter.new_session(self.model, "cadence", options)
        self.session.prepare()

    def __getattr__(self, name):
        return getattr(vars(self).get("native"), name)

    def _voice(self, prompt_wav) -> None:       # the model's voice, by its path or prompt key
        voice = self.model.spec["voice_prompt"]
        if prompt_wav is not None and str(prompt_wav) not in (self.model.prompt.key, str(voice)):
            raise InputError(f"prompt_wav: the model speaks in {voice}, got {prompt_wav}")

    def set_stream_cache(self, prompt_wav) -> None:
        """token2wav.py L188-204: a new turn from the voice's base caches (in the arena: returns None)."""
        self._voice(prompt_wav)
        self.session.start_turn()

    def stream(self, generated_speech_tokens, prompt_wav=None, last_chunk=False, return_waveform=False):
        """token2wav.py L249-279: speech token ids @ 25 Hz -> float32 [1, S] @ 24 kHz (return_waveform) or its int16
        PCM bytes, the stock bytes. Raises InputError (a ValueError, as stock's) for a call the loop would not make
        (module docstring) or bad ids, before anything changes."""
        self._voice(prompt_wav)
        if not isinstance(last_chunk, (bool, np.bool_)):
            raise InputError(f"last_chunk: expected a bool, got {shown(last_chunk)} ({type(last_chunk).__name__})")
        tokens = check_tokens(generated_speech_tokens, vocab=adapter.facts.VOCAB_SIZE, max_count=HIGH,
                              name="generated_speech_tokens")
        carried = self.session.buffer
        if carried is None:
            raise InputError("stream: no open turn (a final call ends one); call set_stream_cache(prompt_wav)")
        n, k = len(tokens), len(carried)
        if tokens[:k] != carried or not (n < LOW if last_chunk else LOW <= n <= HIGH):
            raise InputError(f"generated_speech_tokens: expected the {k} carried {carried} first, {LOW}-{HIGH} in "
                             f"all (last_chunk: fewer than {LOW}), got {n} starting {tokens[:k]}")
        self.session.prepare(self.session.signatures(n - k, last_chunk))     # CUDA: an unseen call's graphs ahead
        out = self.session.speak(tokens[k:], final=last_chunk)
        return out.waveform.reshape(1, -1) if return_waveform else out.pcm16.tobytes()


wrap = Token2wav            #: wrap(model, **options): the drop-in
