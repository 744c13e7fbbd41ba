"""Checks of what callers pass in, and the in-place shift every sliding region uses.

Each check raises `InputError` naming the argument, what was expected and what came, and returns a clean
value; none changes any state, so a session can check its whole unit before anything runs.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from duplexcadence.clocks import Signature
from duplexcadence.errors import InputError

_NOT_A_SEQUENCE = (str, bytes, bytearray, memoryview, set, frozenset, dict)
#: The most signatures one prepare() call takes: far more than any session's graph set holds (an endless
#: iterable stops here).
MAX_SIGNATURES = 1 << 16
#: The most characters of a caller's value an error message quotes.
SHOWN_CHARS = 200
#: The tensor dtypes a payload of ids may come in (quantized, float, complex and bool tensors are refused).
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
              torch.uint64)


def is_int(x) -> bool:
    """An int (numpy ints too) that is not a bool or a numpy timedelta."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_, np.timedelta64))


def as_int(x):
    """`x` as a plain int if it is one (is_int), read once: an int subclass's own value (its overridden
    comparisons, __int__ and __index__ are never called), a numpy int's stored value (a subclass's too);
    else None."""
    if not is_int(x):
        return None
    if isinstance(x, int):
        return int.__int__(x)
    base = next(t for t in type(x).__mro__ if t.__module__ == "numpy")     # np.int64 under any subclass
    try:
        return operator.index(base(x))              # the stored value: a subclass's __index__ is never called
    except Exception:
        return None


def check_int(name: str, x, *, low: int | None = None, high: int | None = None, error=InputError) -> int:
    """`x` as a plain int in [low, high] (either bound optional), read once (as_int): the value checked is the
    value returned. Raises `error` (InputError) naming `name`."""
    v = as_int(x)
    if v is None or (low is not None and v < low) or (high is not None and v > high):
        bounds = f" in [{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise error(f"{name}: expected an int{bounds if low is not None or high is not None else ''}, "
                    f"got {shown(x)} ({type(x).__name__})")
    return v


def shown(x) -> str:
    """A caller's value for an error message: an int's own value, else repr(x) cut at SHOWN_CHARS characters
    (`<type>` where its __repr__ raises): quoting a caller's object never raises and never floods a message."""
    v = as_int(x)
    if v is not None:
        return repr(v)
    try:
        text = repr(x)
    except Exception:
        return f"<{type(x).__name__}>"
    if not isinstance(text, str):
        return f"<{type(x).__name__}>"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _stored(seq: list | tuple) -> list:
    """A list's or tuple's stored items, read past any __iter__ / __len__ a subclass overrides."""
    return list(list.__iter__(seq)) if isinstance(seq, list) else list(tuple.__iter__(seq))


def _items(name: str, values, limit: int) -> list:
    """The first `limit` + 1 items of a caller's iterable (an endless one stops there), as a list; an exception
    its __iter__ / __next__ raises becomes an InputError naming `name` (a DuplexCadence error passes as is)."""
    out = []
    try:
        for v in values:
            out.append(v)
            if len(out) > limit:
                break
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{name}: iterating it raised {type(exc).__name__}: {exc}") from None
    return out


def check_signatures(signatures) -> list[Signature]:
    """`prepare(signatures)`'s argument as a list: an iterable of at most MAX_SIGNATURES Signatures (from
    `signatures()` or `clocks()`), each well formed: `step` a str, `size` a plain int >= 0, `lengths` a tuple of
    (str, int >= 0) pairs, `exact` a tuple of (str, hashable) pairs. Raises InputError naming `signatures` for
    anything else (an exception the iterable raises included), before anything runs; whether a well-formed
    Signature is a step of the session is the session's check."""
    if isinstance(signatures, (str, bytes, Signature)) or not hasattr(signatures, "__iter__"):
        raise InputError(f"signatures: expected an iterable of Signature (from signatures() or clocks()), got "
                         f"{type(signatures).__name__}")
    out = _items("signatures", signatures, MAX_SIGNATURES)
    if len(out) > MAX_SIGNATURES:
        raise InputError(f"signatures: at most {MAX_SIGNATURES} per prepare() call, got more")
    for i, sig in enumerate(out):
        if not isinstance(sig, Signature):
            raise InputError(f"signatures[{i}]: expected a Signature, got {shown(sig)} ({type(sig).__name__})")
        fields = tuple.__iter__(sig)                    # stored values, past any override of the named fields
        step, size, lengths, exact = fields
        problem = (None if type(step) is str else f"step {shown(step)}: expected a str")
        problem = problem or (None if type(size) is int and size >= 0 else
                              f"size {shown(size)} ({type(size).__name__}): expected an int >= 0")
        problem = problem or _pairs_problem("lengths", lengths, lambda v: type(v) is int and v >= 0, "an int >= 0")
        problem = problem or _pairs_problem("exact", exact, _hashable, "a hashable value")
        if problem:
            raise InputError(f"signatures[{i}]: {problem} (build Signatures with signatures() or clocks())")
    return out


def _hashable(value) -> bool:
    try:
        hash(value)
    except Exception:
        return False
    return True


def _pairs_problem(name: str, pairs, ok, want: str) -> str | None:
    """What is wrong with a Signature's `lengths` / `exact` field (a tuple of (str, value) pairs), or None."""
    if type(pairs) is not tuple:
        return f"{name}: expected a tuple of (name, value) pairs, got {type(pairs).__name__}"
    for pair in tuple.__iter__(pairs):
        if type(pair) is not tuple or len(pair) != 2 or type(pair[0]) is not str:
            return f"{name}: expected (name, value) pairs, got {shown(pair)}"
        if not ok(pair[1]):
            return f"{name}[{pair[0]!r}]: expected {want}, got {shown(pair[1])} ({type(pair[1]).__name__})"
    return None


def check_tokens(tokens, *, vocab: int, max_count: int, name: str = "tokens") -> list[int]:
    """Speech token ids: a sequence of at most `max_count` ints in [0, vocab), or a 1-D integer CPU torch
    tensor of them (as frame payloads take tensors). Returns them as a list."""
    if isinstance(tokens, torch.Tensor):
        if (tokens.device.type != "cpu" or tokens.layout != torch.strided or tokens.dim() != 1
                or tokens.dtype not in INT_DTYPES):
            raise InputError(f"{name}: expected a sequence of ints in [0, {vocab}) (as a tensor: 1-D, dense, integer, "
                             f"on the CPU), got {list(tokens.shape)} {tokens.dtype} on {tokens.device}")
        tokens = tokens.tolist()
    if (isinstance(tokens, _NOT_A_SEQUENCE) or not hasattr(tokens, "__iter__")
            or isinstance(getattr(tokens, "ndim", 1), int) and getattr(tokens, "ndim", 1) == 0):
        raise InputError(f"{name}: expected a sequence of ints in [0, {vocab}), got {type(tokens).__name__}")
    items = _items(name, tokens, max_count)
    if len(items) > max_count:                   # an endless iterator ends here
        got = len(tokens) if isinstance(tokens, (list, tuple, np.ndarray)) else "more"
        raise InputError(f"{name}: at most {max_count} per unit, got {got}")
    out = []
    for i, t in enumerate(items):
        v = as_int(t)                            # read once: the id checked is the id used
        if v is None:
            raise InputError(f"{name}[{i}]: expected an int token id, got {shown(t)} ({type(t).__name__})")
        if not 0 <= v < vocab:
            raise InputError(f"{name}[{i}]: token id {v} outside [0, {vocab})")
        out.append(v)
    return out


def check_codes(codes, *, n_q: int, cardinality: int, max_frames: int | None, name: str = "codes") -> torch.Tensor:
    """One unit's codec frames: `n_q` codebooks x F frames (1 <= F <= max_frames; None: no upper bound here,
    for a caller whose clocks declare the bound as a region and raise LimitError past it) of ids in
    [0, cardinality).

    Accepts a list of n_q lists of ints, an integer CPU torch tensor / numpy array [n_q, F], or a numpy object
    array of ints [n_q, F] (checked as lists). Returns an int64 CPU tensor [n_q, F] (a copy)."""
    span = "1 or more" if max_frames is None else f"1..{max_frames}"
    want = f"{n_q} codebooks x {span} frames of ids in [0, {cardinality})"
    if isinstance(codes, np.ndarray) and codes.dtype == object:
        codes = codes.tolist()                      # checked as lists: each element named, as a list's would be
    if isinstance(codes, np.ndarray) and codes.dtype.kind not in "iu":
        raise InputError(f"{name}: expected an integer array [{n_q}, frames], got dtype {codes.dtype}")
    if isinstance(codes, torch.Tensor) and codes.device.type != "cpu":
        raise InputError(f"{name}: expected a CPU tensor (host payload), got one on {codes.device}")
    if isinstance(codes, (torch.Tensor, np.ndarray)):
        if isinstance(codes, torch.Tensor) and codes.layout != torch.strided:
            raise InputError(f"{name}: expected a dense integer tensor [{n_q}, frames], got layout {codes.layout}")
        if isinstance(codes, torch.Tensor) and codes.dtype not in INT_DTYPES:
            raise InputError(f"{name}: expected an integer tensor [{n_q}, frames], got dtype {codes.dtype}")
        try:
            t = torch.as_tensor(np.array(codes, order="C", dtype=codes.dtype.newbyteorder("="))   # native byte order
                                if isinstance(codes, np.ndarray) else codes)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InputError(f"{name}: expected an integer array [{n_q}, frames], got {exc}") from None
        if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
            raise InputError(f"{name}: expected an integer tensor [{n_q}, frames], got dtype {t.dtype}")
        if t.dim() != 2 or t.shape[0] != n_q:
            raise InputError(f"{name}: expected shape [{n_q}, frames] ({want}), got {list(t.shape)}")
        ids = t.detach().numpy()                  # its own dtype: a uint64 id past int64 is not wrapped round
        bad = (ids < 0) | (ids >= cardinality)
        if bad.any():
            q, f = (int(i) for i in np.argwhere(bad)[0])
            raise InputError(f"{name}[{q}][{f}]: code id {ids[q, f]} outside [0, {cardinality})")
        t = torch.from_numpy(ids.astype(np.int64))
    else:
        if isinstance(codes, (str, bytes)) or not isinstance(codes, (list, tuple)):
            raise InputError(f"{name}: expected {want} as a list of {n_q} lists, got {type(codes).__name__}")
        rows = _stored(codes)
        if len(rows) != n_q:
            raise InputError(f"{name}: expected {n_q} codebooks, got {len(rows)}")
        matrix = []
        for q, row in enumerate(rows):
            if not isinstance(row, (list, tuple)):
                raise InputError(f"{name}[{q}]: expected a list of ints, got {type(row).__name__}")
            matrix.append([])
            for f, c in enumerate(_stored(row)):
                v = as_int(c)                           # read once: the id checked is the id used
                if v is None:
                    raise InputError(f"{name}[{q}][{f}]: expected an int code id, got {shown(c)} ({type(c).__name__})")
                if not 0 <= v < cardinality:
                    raise InputError(f"{name}[{q}][{f}]: code id {v} outside [0, {cardinality})")
                matrix[q].append(v)
        lengths = sorted({len(row) for row in matrix})
        if len(lengths) != 1:
            raise InputError(f"{name}: every codebook needs the same frame count, got lengths {lengths}")
        t = torch.tensor(matrix, dtype=torch.int64).reshape(n_q, lengths[0])
    frames = int(t.shape[1])
    if frames < 1 or (max_frames is not None and frames > max_frames):
        raise InputError(f"{name}: expected {span} frames per unit (12.5 Hz), got {frames}")
    bad = (t < 0) | (t >= cardinality)
    if bool(bad.any()):
        q, f = (int(i) for i in bad.nonzero()[0])
        raise InputError(f"{name}[{q}][{f}]: code id {int(t[q, f])} outside [0, {cardinality})")
    return t


def shift_left_(buf: torch.Tensor, length: int, by: int, dim: int = -1) -> None:
    """buf[..., :length-by] = buf[..., by:length] along `dim`, in place and in pieces no longer than `by`,
    so that no piece reads what an earlier piece wrote: the stock trims `cat(x[..., :head], x[..., -tail:])`
    and `x[..., keep:].clone()` as one device copy per piece inside the same buffer (the address stays)."""
    if by <= 0:
        return
    keep = length - by
    for i in range(0, keep, by):
        w = min(by, keep - i)
        buf.narrow(dim, i, w).copy_(buf.narrow(dim, by + i, w))


def move_tail_(buf: torch.Tensor, head: int, length: int, tail: int, dim: int = -1) -> None:
    """buf[..., head:head+tail] = buf[..., length-tail:length] along `dim`, in place (pieces no longer than
    the shift): the stock `cat(x[..., :head], x[..., -tail:])` of a region already laid out in `buf`."""
    shift = length - (head + tail)
    if shift <= 0:
        return
    for i in range(0, tail, shift):
        w = min(shift, tail - i)
        buf.narrow(dim, head + i, w).copy_(buf.narrow(dim, head + shift + i, w))
