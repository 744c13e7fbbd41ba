"""The one way to repoint a stock module for one step: swap attributes, buffers or methods, restore in `finally`.

DuplexCadence runs the upstream modules as they ship; where a step must see a session's own state (its arena
views in place of a module buffer, a device-resident table in place of a per-call host copy, a stand-in for
one method), the session swaps it in with `bound(...)` for exactly the duration of the step and the swap is
undone on the way out, also when the step raises. On a model shared by several sessions the swap is held
under the model's lock (`lock=`) for the whole time the module is repointed, so no other session's step
can run the module meanwhile; a patch of the same (object, name) already live on another thread raises
ConcurrencyError instead of silently mixing two sessions' state. `live()` counts the patches in force (a
test checks it returns to zero after every step and after a step that raises).

Patch kinds: ``attr(obj, name, value)`` sets an instance attribute (restored to the previous instance value,
or deleted when the instance had none, so a class attribute or method shows through again);
``buffer(module, name, tensor)`` replaces `module._buffers[name]` (torch's registry, so `module.name`,
`state_dict` and `.to()` see the swap).
"""
from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

from duplexcadence.errors import ConcurrencyError

_MISSING = object()
_lock = threading.Lock()
_live: dict[tuple[int, str], tuple[int, int]] = {}   # (id(owner), name) -> (thread id, depth)
_REGISTRIES = ("_parameters", "_buffers", "_modules")     # where torch.nn.Module keeps its members


class Patch(NamedTuple):
    owner: object
    name: str
    value: object
    kind: str          # "attr" | "buffer"


def attr(owner, name: str, value) -> Patch:
    """Set instance attribute `name` of `owner` to `value` for the step."""
    return Patch(owner, name, value, "attr")


def buffer(module, name: str, tensor) -> Patch:
    """Replace the registered buffer `name` of `module` by `tensor` for the step. Raises KeyError at entry
    for a name the module has not registered (a typo would otherwise create a new attribute)."""
    return Patch(module, name, tensor, "buffer")


def live() -> int:
    """How many patches are in force now, over all threads."""
    with _lock:
        return sum(depth for _, depth in _live.values())


def _claim(key) -> None:
    me = threading.get_ident()
    with _lock:
        owner, depth = _live.get(key, (me, 0))
        if owner != me:
            raise ConcurrencyError(f"{key[1]!r} of a shared module is repointed by another thread's "
                                   f"step; sessions of one model must take the model's lock around it")
        _live[key] = (me, depth + 1)


def _release(key) -> None:
    with _lock:
        owner, depth = _live[key]
        if depth <= 1:
            del _live[key]
        else:
            _live[key] = (owner, depth - 1)


def _apply(p: Patch):
    """Make the swap; return the function that undoes it."""
    if p.kind == "buffer":
        buffers = p.owner._buffers
        if p.name not in buffers:
            raise KeyError(f"{type(p.owner).__name__} has no registered buffer {p.name!r}")
        old = buffers[p.name]
        buffers[p.name] = p.value

        def undo():
            buffers[p.name] = old
        return undo
    if p.kind != "attr":
        raise ValueError(f"patch kind: expected 'attr' or 'buffer', got {p.kind!r}")
    store = vars(p.owner)
    old = store.get(p.name, _MISSING)
    for registry in _REGISTRIES:           # an nn.Module member lives in a registry, not in __dict__
        members = store.get(registry)
        if old is _MISSING and isinstance(members, dict) and p.name in members:
            old = members[p.name]
    setattr(p.owner, p.name, p.value)

    def undo():
        if old is _MISSING:
            delattr(p.owner, p.name)
        else:
            setattr(p.owner, p.name, old)
    return undo


@contextlib.contextmanager
def bound(*patches: Patch, lock=None):
    """Apply `patches` in order for the body, undo them in reverse order on exit (also on an exception).
    lock: a context manager (the model's RLock) held from before the first swap until after the last undo.
    Raises ConcurrencyError if another thread holds a patch of the same (object, name)."""
    with lock if lock is not None else contextlib.nullcontext():
        undo, claimed = [], []
        try:
            for p in patches:
                key = (id(p.owner), p.name)
                _claim(key)
                claimed.append(key)
                undo.append(_apply(p))
            yield
        finally:
            for fn in reversed(undo):
                fn()
            for key in reversed(claimed):
                _release(key)
