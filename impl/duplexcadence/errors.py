"""The errors a session raises to its caller. Every one is an `InputError`, so one `except` catches them all.

* ``InputError``: bad input (names the argument, what was expected and what came). Nothing changed: the
  session's state and clocks are exactly as they were, and the session can go on.
* ``LimitError``: a declared bound (a region's retention bound, a position or noise table, a prompt that is
  too long) would be crossed by this call. Checked before anything runs, so nothing changed either;
  ``session_usable`` says whether the session can still take other input (False when every later unit
  would cross the bound too, e.g. a cache that only grows).
* ``ClosedError``: the session was closed.
* ``MissingFileError``: a path argument (voice_prompt, checkpoint) names nothing there; also a
  FileNotFoundError. ``CheckpointError``: a checkpoint not in the released layout (a file missing, unreadable,
  a key missing, unexpected or mis-shaped). Both raised before a model is built.
* ``ConcurrencyError``: something that cannot run at the same time as another session's work was asked
  for (a second stock session on one model instance whose upstream code shares its caches, a session that
  cannot run on its own host thread): refused, never silently wrong.
"""
from __future__ import annotations


class InputError(ValueError):
    """Bad input to a session; nothing changed and the session can go on."""


class LimitError(InputError):
    """A declared bound would be crossed; nothing changed. `session_usable`: can the session go on."""

    def __init__(self, message: str, *, session_usable: bool = True):
        super().__init__(message)
        self.session_usable = session_usable


class ClosedError(InputError):
    """The session is closed; open another."""


class MissingFileError(InputError, FileNotFoundError):
    """A path argument names no file or folder; the message names the argument and the path."""


class CheckpointError(InputError):
    """A checkpoint does not hold the released layout; the message names the file and what is wrong."""


class ConcurrencyError(InputError):
    """Refused: this would share state with another session (the message says which and why)."""


def one_line(exc: BaseException, limit: int = 500) -> str:
    """`Type: message` of an upstream error on one line (whitespace runs made one space), cut at `limit`
    characters: the part of a CheckpointError that quotes the loader."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return text if len(text) <= limit else text[:limit - 3] + "..."
