"""duplexcadence.bind: swaps of attributes and registered buffers (module._buffers, read here through
named_buffers()) for the body of a `with`, undone on the way out (also when the body raises), nested on one
thread, refused across threads, under the model's lock."""
from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from duplexcadence import bind
from duplexcadence.errors import ConcurrencyError


class Stock:
    """A stand-in for a stock module: a class attribute, a method, an instance attribute."""
    table = "class table"

    def __init__(self):
        self.offset = 3

    def forward(self):
        return "stock forward"


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4))
        self.register_buffer("mask", torch.ones(2), persistent=False)


@pytest.fixture(autouse=True)
def _no_patch_left():
    assert bind.live() == 0
    yield
    assert bind.live() == 0


# --- attr ----------------------------------------------------------------------------------------
def test_an_instance_attribute_is_swapped_and_restored():
    s = Stock()
    with bind.bound(bind.attr(s, "offset", 10)):
        assert s.offset == 10 and bind.live() == 1
    assert s.offset == 3 and vars(s)["offset"] == 3


def test_an_attribute_the_instance_lacked_is_deleted_again_so_the_class_shows_through():
    s = Stock()
    with bind.bound(bind.attr(s, "forward", lambda: "patched"), bind.attr(s, "table", "own table")):
        assert s.forward() == "patched" and s.table == "own table"
        assert bind.live() == 2
    assert "forward" not in vars(s) and "table" not in vars(s)
    assert s.forward() == "stock forward" and s.table == "class table"


def test_a_patched_class_attribute_is_restored_on_the_class():
    with bind.bound(bind.attr(Stock, "table", "patched")):
        assert Stock().table == "patched"
    assert Stock.table == "class table"


@pytest.mark.parametrize("name", ["child", "weight"])
def test_a_submodule_or_parameter_swapped_with_attr_is_restored_not_deleted(name):
    """nn.Module keeps submodules and parameters in its registries (_modules, _parameters), not in the
    instance __dict__; a swap of one must put the original back on exit, not delete it."""
    parent = torch.nn.Module()
    parent.child = torch.nn.Linear(2, 2)
    parent.weight = torch.nn.Parameter(torch.ones(3))
    original = getattr(parent, name)
    stand_in = torch.nn.Linear(3, 3) if name == "child" else torch.nn.Parameter(torch.zeros(3))
    with bind.bound(bind.attr(parent, name, stand_in)):
        assert getattr(parent, name) is stand_in
    assert getattr(parent, name, None) is original


# --- buffer --------------------------------------------------------------------------------------
def test_a_buffer_is_swapped_in_the_registry_and_restored():
    m = WithBuffer()
    cache, view = m.cache, torch.full((4,), 7.0)
    with bind.bound(bind.buffer(m, "cache", view)):
        assert m.cache is view and dict(m.named_buffers())["cache"] is view
        assert torch.equal(m.state_dict()["cache"], view)
        assert "cache" not in vars(m)                         # not shadowed by an instance attribute
    assert m.cache is cache and dict(m.named_buffers())["cache"] is cache
    assert set(m.state_dict()) == {"cache"}                  # the non-persistent one stays out


def test_an_unknown_buffer_name_raises_key_error_and_undoes_the_earlier_patches():
    m, s = WithBuffer(), Stock()
    with pytest.raises(KeyError, match="no registered buffer 'cahce'"):
        with bind.bound(bind.attr(s, "offset", 99), bind.buffer(m, "cahce", torch.zeros(4))):
            pytest.fail("the body ran")
    assert s.offset == 3 and "cahce" not in dict(m.named_buffers()) and not hasattr(m, "cahce")


# --- exceptions, nesting, counts -----------------------------------------------------------------
def test_every_patch_is_undone_when_the_body_raises():
    m, s = WithBuffer(), Stock()
    cache = m.cache
    with pytest.raises(RuntimeError, match="step failed"):
        with bind.bound(bind.attr(s, "offset", 10), bind.attr(s, "forward", len), bind.buffer(m, "cache", None)):
            raise RuntimeError("step failed")
    assert s.offset == 3 and s.forward() == "stock forward" and m.cache is cache


def test_nested_patches_of_the_same_name_on_one_thread_unwind_in_order():
    s = Stock()
    with bind.bound(bind.attr(s, "offset", 10)):
        with bind.bound(bind.attr(s, "offset", 20)):
            assert s.offset == 20 and bind.live() == 2
        assert s.offset == 10 and bind.live() == 1
    assert s.offset == 3


def test_the_same_name_twice_in_one_bound_unwinds_in_reverse():
    s = Stock()
    with bind.bound(bind.attr(s, "offset", 10), bind.attr(s, "offset", 20)):
        assert s.offset == 20 and bind.live() == 2
    assert s.offset == 3


def test_live_counts_patches_over_all_threads():
    a, b = Stock(), Stock()
    inside, leave = threading.Event(), threading.Event()

    def other():
        with bind.bound(bind.attr(b, "offset", 1), bind.attr(b, "table", "t")):
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with bind.bound(bind.attr(a, "offset", 2)):
        assert bind.live() == 3
    leave.set()
    t.join(10)
    assert bind.live() == 0 and b.offset == 3


# --- threads -------------------------------------------------------------------------------------
@contextlib.contextmanager
def held_on_another_thread(*patches):
    """The body runs while another thread is inside bind.bound(*patches); that thread leaves when the body ends."""
    inside, leave = threading.Event(), threading.Event()

    def holder():
        with bind.bound(*patches):
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert inside.wait(10)
    try:
        yield
    finally:
        leave.set()
        t.join(10)


def test_another_threads_patch_of_the_same_name_is_refused_and_nothing_changes():
    s, errors = Stock(), []
    with held_on_another_thread(bind.attr(s, "offset", 10)):
        with pytest.raises(ConcurrencyError, match="'offset'"):
            with bind.bound(bind.attr(s, "table", "mine"), bind.attr(s, "offset", 20)):
                errors.append("the body ran")
        assert s.offset == 10 and "table" not in vars(s)       # the holder's swap stands; ours undone
        with bind.bound(bind.attr(s, "forward", len)):         # another name of the same object is free
            assert s.forward is len
    assert errors == [] and s.offset == 3


def test_a_buffer_swap_and_an_attr_swap_of_the_same_name_on_two_threads_are_refused():
    """`bind.buffer(m, "cache", ...)` and `bind.attr(m, "cache", ...)` both repoint `m.cache`: the same
    (object, name), so the second thread's patch is refused whichever kind it is."""
    m = WithBuffer()
    cache = m.cache
    with held_on_another_thread(bind.buffer(m, "cache", torch.ones(4))):
        with pytest.raises(ConcurrencyError):
            with bind.bound(bind.attr(m, "cache", torch.full((4,), 2.0))):
                pass
    assert m.cache is cache


def test_the_lock_is_held_from_the_first_swap_until_the_last_undo():
    s, lock, log = Stock(), threading.RLock(), []
    inside, leave = threading.Event(), threading.Event()

    def first():
        with bind.bound(bind.attr(s, "offset", 10), lock=lock):
            log.append("first in")
            inside.set()
            leave.wait(10)
            log.append("first out")

    def second():
        with bind.bound(bind.attr(s, "offset", 20), lock=lock):
            log.append(("second in", bind.live(), vars(s)["offset"]))

    t1 = threading.Thread(target=first)
    t1.start()
    assert inside.wait(10)
    t2 = threading.Thread(target=second)
    t2.start()
    time.sleep(0.2)
    assert log == ["first in"] and t2.is_alive()              # blocked on the lock, not refused
    assert not lock.acquire(blocking=False)
    leave.set()
    t1.join(10)
    t2.join(10)
    assert log == ["first in", "first out", ("second in", 1, 20)]
    assert s.offset == 3


def test_the_lock_is_reentrant_for_nested_steps_of_one_thread():
    s, lock = Stock(), threading.RLock()
    with bind.bound(bind.attr(s, "offset", 10), lock=lock):
        with bind.bound(bind.attr(s, "table", "t"), lock=lock):
            assert s.offset == 10 and s.table == "t"
    assert s.offset == 3 and s.table == "class table"
    assert lock.acquire(blocking=False)
    lock.release()
