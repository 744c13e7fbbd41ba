"""duplexcadence.errors: every error a session raises is an InputError (one `except` catches them all)."""
from __future__ import annotations

import pytest

from duplexcadence.clocks import ClockError
from duplexcadence.errors import (CheckpointError, ClosedError, ConcurrencyError, InputError, LimitError,
                                  MissingFileError, one_line)


@pytest.mark.parametrize("cls", [InputError, LimitError, ClosedError, ConcurrencyError, ClockError, MissingFileError,
                                 CheckpointError])
def test_every_session_error_is_an_input_error_and_a_value_error(cls):
    with pytest.raises(InputError, match="what came"):
        raise cls("what came")
    assert issubclass(cls, ValueError)


def test_limit_error_says_whether_the_session_can_go_on():
    assert LimitError("past the bound").session_usable is True
    assert LimitError("past the bound", session_usable=False).session_usable is False
    assert ClockError("past the bound", session_usable=False).session_usable is False
    with pytest.raises(TypeError):
        LimitError("past the bound", False)          # keyword only: a positional bool is a mistake


def test_the_kinds_stay_distinct():
    assert not issubclass(ClosedError, LimitError) and not issubclass(ConcurrencyError, LimitError)
    assert not issubclass(ClosedError, ConcurrencyError) and not issubclass(LimitError, ClosedError)
    assert str(ClosedError("speak: the session is closed")) == "speak: the session is closed"


def test_a_missing_file_is_caught_as_a_file_not_found_error_too():
    with pytest.raises(FileNotFoundError, match="^voice_prompt: /x does not exist$"):
        raise MissingFileError("voice_prompt: /x does not exist")
    assert not issubclass(CheckpointError, FileNotFoundError)


def test_one_line_joins_an_upstream_message_and_cuts_it():
    assert one_line(RuntimeError("Error(s):\n\tMissing key(s): 'a'")) == "RuntimeError: Error(s): Missing key(s): 'a'"
    cut = one_line(ValueError("x" * 1000), limit=20)
    assert cut == "ValueError: xxxxx..." and len(cut) == 20
