"""duplexcadence.errors: every error a session raises is an InputError (one `except` catches them all)."""
from __future__ import annotations

import pytest

from duplexcadence.clocks import ClockError
from duplexcadence.errors import ClosedError, ConcurrencyError, InputError, LimitError


@pytest.mark.parametrize("cls", [InputError, LimitError, ClosedError, ConcurrencyError, ClockError])
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
