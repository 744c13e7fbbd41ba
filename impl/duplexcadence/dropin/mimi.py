"""moshi==0.2.13 `MimiModel` for a serving loop, `decode` on a cadence session: `mimi = wrap(mimi)` and the loop
runs unchanged (server.py L59-82: `streaming_forever(1)`, `decode(tokens[:, 1:])` per frame, `reset_streaming()` per
connection). One stream (batch 1), one frame per call: docs/dropins.md says why."""
import torch

from duplexcadence import bind, gate
from duplexcadence.adapters import mimi as adapter
from duplexcadence.dropin.checks import check_options, check_wrapped
from duplexcadence.errors import InputError
from duplexcadence.runtime import model_lock


class Mimi:
    """Stands in for the MimiModel `native` (or open_model("moshi")); any other attribute is its own (encode,
    sample_rate, ...). While it streams, `session` (a CadenceSession, `options` its spec) decodes."""

    def __init__(self, native, **options):
        native = getattr(native, "native", native)
        check_wrapped("native", native, "MimiModel", "a moshi MimiModel or open_model('moshi')")
        check_options(options, adapter.session_options(native, "cadence"))
        self.native, self.options, self.session = native, options, None

    def __getattr__(self, name):
        return getattr(vars(self).get("native"), name)

    def _close(self) -> None:
        self.session = self.session and self.session.close()

    def _open(self) -> None:        # the model's own states set aside while a new session takes its own
        self._close()
        mods = [self.native.get_submodule(k) if k else self.native for k in self.native.get_streaming_state()]
        with bind.bound(*(bind.attr(m, "_streaming_state", None) for m in mods), lock=model_lock(self.native)):
            self.session = adapter.new_session(self.native, "cadence", self.options)
        self.session.prepare()

    def streaming(self, batch_size: int):
        """streaming.py L141-148: an ExitStack over `native.streaming(1)` and a new cadence session, both ended on
        exit. Raises InputError for batch_size != 1."""
        if batch_size != 1:
            raise InputError(f"batch_size: the drop-in decodes one stream, expected 1, got {batch_size}")
        stack = self.native.streaming(1)
        stack.callback(self._close)
        self._open()
        return stack

    def streaming_forever(self, batch_size: int) -> None:
        self.streaming(batch_size).__enter__()                   # streaming.py L138-139

    def reset_streaming(self, reset_mask=None) -> None:
        """streaming.py L150-166: `native`'s states reset, a new cadence session (reset_mask: None, one stream)."""
        if reset_mask is not None:
            raise InputError("reset_mask: the drop-in has one stream; expected None (reset it)")
        self.native.reset_streaming()
        self._open()

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """compression.py L406-429: codes int [1, 8, 1] (one 80 ms frame) -> float32 PCM [1, 1, 1920] @ 24 kHz on
        the model's device, the stock bytes (not streaming: the stock call). Raises InputError (another shape, bad
        codes) before anything changes."""
        if self.session is None:
            return self.native.decode(codes)
        if tuple(codes.shape) != (1, adapter.N_Q, 1):
            raise InputError(f"codes: expected [1, {adapter.N_Q}, 1] (batch 1, one frame), got {list(codes.shape)}")
        with gate.work():
            return torch.from_numpy(self.session.speak(codes[0].cpu()).waveform).view(1, 1, -1).to(self.session.device)


wrap = Mimi                 #: wrap(model, **options): the drop-in
