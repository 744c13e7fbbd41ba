"""duplexcadence.payload: argument checks (each error names the argument and what came; the input is never
changed) and the in-place shifts, against a reference built with torch.cat / clone on a copy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from duplexcadence.errors import InputError, LimitError
from duplexcadence.clocks import Signature, signature
from duplexcadence.payload import (MAX_SIGNATURES, SHOWN_CHARS, check_codes, check_int, check_signatures, check_tokens,
                                  is_int, move_tail_, shift_left_, shown)

VOCAB, MAX_TOKENS = 6561, 28
N_Q, CARD, MAX_FRAMES = 8, 2048, 16


# --- check_int -----------------------------------------------------------------------------------
@pytest.mark.parametrize("x", [0, 7, np.int64(7), np.int16(-3), np.uint8(200)])
def test_is_int_accepts_python_and_numpy_ints(x):
    assert is_int(x)


@pytest.mark.parametrize("x", [True, np.bool_(False), 3.0, np.float32(3), "3", None, torch.tensor(3)])
def test_is_int_refuses_bools_floats_strings_and_tensors(x):
    assert not is_int(x)


def test_check_int_returns_a_python_int_within_inclusive_bounds():
    assert check_int("n", 5, low=5, high=5) == 5
    out = check_int("n", np.int64(12), low=0)
    assert out == 12 and type(out) is int
    assert check_int("n", -4) == -4


@pytest.mark.parametrize("x, kw, what", [
    pytest.param(True, {}, "True (bool)", id="bool"),
    pytest.param(2.0, {}, "2.0 (float)", id="float"),
    pytest.param("2", {}, "'2' (str)", id="str"),
    pytest.param(np.float64(2), {}, "(float64)", id="numpy-float"),
    pytest.param(-1, {"low": 0}, "in [0, inf], got -1 (int)", id="below"),
    pytest.param(29, {"low": 1, "high": 28}, "in [1, 28], got 29 (int)", id="above"),
    pytest.param(0, {"high": -1}, "in [-inf, -1], got 0", id="above-high-only"),
])
def test_check_int_errors_name_the_argument_and_what_came(x, kw, what):
    with pytest.raises(InputError) as info:
        check_int("n_tokens", x, **kw)
    assert str(info.value).startswith("n_tokens: expected an int") and what in str(info.value)


def test_check_int_raises_the_error_class_asked_for():
    with pytest.raises(LimitError, match="offset"):
        check_int("offset", 10, high=9, error=LimitError)


# --- check_tokens --------------------------------------------------------------------------------
def test_check_tokens_returns_plain_ints_and_leaves_the_input_alone():
    given = [0, np.int64(6560), 17]
    copy = list(given)
    out = check_tokens(given, vocab=VOCAB, max_count=MAX_TOKENS)
    assert out == [0, 6560, 17] and all(type(t) is int for t in out)
    assert given == copy and type(given[1]) is np.int64
    arr = np.array([5, 6, 7], dtype=np.int32)
    assert check_tokens(arr, vocab=VOCAB, max_count=MAX_TOKENS) == [5, 6, 7]
    assert arr.tolist() == [5, 6, 7]
    assert check_tokens((), vocab=VOCAB, max_count=MAX_TOKENS) == []
    assert check_tokens(list(range(28)), vocab=VOCAB, max_count=MAX_TOKENS) == list(range(28))


@pytest.mark.parametrize("tokens, what", [
    pytest.param("12", "got str", id="string"),
    pytest.param(b"12", "got bytes", id="bytes"),
    pytest.param({1, 2}, "got set", id="set"),
    pytest.param({1: 2}, "got dict", id="dict"),
    pytest.param(7, "got int", id="scalar"),
    pytest.param(np.array(7), "got ndarray", id="numpy-0d"),
    pytest.param(None, "got NoneType", id="none"),
])
def test_check_tokens_refuses_what_is_not_a_sequence(tokens, what):
    with pytest.raises(InputError, match=rf"^tokens: expected a sequence of ints in \[0, 6561\), {what}"):
        check_tokens(tokens, vocab=VOCAB, max_count=MAX_TOKENS)


@pytest.mark.parametrize("tokens, message", [
    pytest.param([1, True, 3], r"tokens\[1\]: expected an int token id, got True \(bool\)", id="bool"),
    pytest.param([1, 2.0], r"tokens\[1\]: expected an int token id, got 2.0 \(float\)", id="float"),
    pytest.param(["1"], r"tokens\[0\]: expected an int token id, got '1' \(str\)", id="str"),
    pytest.param(np.array([1.0, 2.0]), r"tokens\[0\]: .*\(float64\)", id="float-array"),
    pytest.param([0, 6561], r"tokens\[1\]: token id 6561 outside \[0, 6561\)", id="past-vocab"),
    pytest.param([-1], r"tokens\[0\]: token id -1 outside \[0, 6561\)", id="negative"),
    pytest.param(list(range(29)), r"tokens: at most 28 per unit, got 29", id="too-many"),
])
def test_check_tokens_errors_name_the_element_and_what_came(tokens, message):
    with pytest.raises(InputError, match=message):
        check_tokens(tokens, vocab=VOCAB, max_count=MAX_TOKENS)


def test_check_tokens_uses_the_name_it_is_given():
    with pytest.raises(InputError, match=r"^prompt_tokens\[0\]"):
        check_tokens([-5], vocab=VOCAB, max_count=MAX_TOKENS, name="prompt_tokens")


# --- check_codes ---------------------------------------------------------------------------------
def _codes(frames=3):
    return [[(q * 100 + f) % CARD for f in range(frames)] for q in range(N_Q)]


def test_check_codes_from_lists_returns_an_int64_cpu_tensor():
    given = _codes(3)
    copy = [list(r) for r in given]
    out = check_codes(given, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)
    assert out.dtype == torch.int64 and out.device.type == "cpu" and out.shape == (N_Q, 3)
    assert out[7, 2].item() == 702 and out[0, 0].item() == 0
    assert given == copy
    rows = tuple(tuple(r) for r in given)
    assert torch.equal(check_codes(rows, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES), out)
    with_np = [[np.int16(c) for c in r] for r in given]
    assert torch.equal(check_codes(with_np, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES), out)


def _strided():
    """Every other frame of 8: ids q * 100 + 2f."""
    return torch.tensor(_codes(8), dtype=torch.int64)[:, ::2]


@pytest.mark.parametrize("make, step", [
    pytest.param(lambda: torch.tensor(_codes(4), dtype=torch.int32), 1, id="torch-int32"),
    pytest.param(lambda: torch.tensor(_codes(4), dtype=torch.int64), 1, id="torch-int64"),
    pytest.param(lambda: np.array(_codes(4), dtype=np.int64), 1, id="numpy-int64"),
    pytest.param(lambda: np.array(_codes(4), dtype=np.uint16), 1, id="numpy-uint16"),
    pytest.param(_strided, 2, id="torch-strided"),
])
def test_check_codes_from_arrays_returns_an_int64_copy(make, step):
    given = make()
    before = given.clone() if isinstance(given, torch.Tensor) else given.copy()
    dtype = given.dtype
    out = check_codes(given, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)
    expected = torch.tensor([[q * 100 + step * f for f in range(4)] for q in range(N_Q)], dtype=torch.int64)
    assert out.dtype == torch.int64 and out.device.type == "cpu" and torch.equal(out, expected)
    out.fill_(0)                                              # the result is the caller's own copy
    assert given.dtype == dtype
    assert (torch.equal(given, before) if isinstance(given, torch.Tensor) else np.array_equal(given, before))


def test_check_codes_checks_a_numpy_object_array_of_ints_as_lists():
    arr = np.array(_codes(3), dtype=object)
    out = check_codes(arr, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)
    assert out.dtype == torch.int64 and out.tolist() == _codes(3)


def test_check_codes_accepts_a_reversed_numpy_view():
    """A numpy array [n_q, F] with a negative stride (np.flip, x[:, ::-1]) is still an integer array."""
    arr = np.array(_codes(4), dtype=np.int64)[:, ::-1]
    out = check_codes(arr, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)
    assert out[0].tolist() == [3, 2, 1, 0] and out[7].tolist() == [703, 702, 701, 700]


@pytest.mark.parametrize("codes, message", [
    pytest.param("codes", r"^codes: expected 8 codebooks x 1..16 frames .* got str", id="string"),
    pytest.param(5, r"got int", id="scalar"),
    pytest.param(_codes(3)[:7], r"^codes: expected 8 codebooks, got 7", id="seven-codebooks"),
    pytest.param([(1, 2, 3)] * 7 + [np.array([1, 2, 3])], r"^codes\[7\]: expected a list of ints, got ndarray",
                 id="row-not-a-list"),
    pytest.param([[1, 2, True]] * 8, r"^codes\[0\]\[2\]: expected an int code id, got True \(bool\)", id="bool"),
    pytest.param([[1, 2.5, 3]] * 8, r"^codes\[0\]\[1\]: expected an int code id, got 2.5 \(float\)", id="float"),
    pytest.param([[1, 2, 3]] * 7 + [[1, 2]], r"same frame count, got lengths \[2, 3\]", id="ragged"),
    pytest.param([[]] * 8, r"expected 1..16 frames per unit \(12.5 Hz\), got 0", id="no-frames"),
    pytest.param([[0] * 17] * 8, r"expected 1..16 frames per unit \(12.5 Hz\), got 17", id="too-many-frames"),
    pytest.param([[0, 1]] * 7 + [[0, 2048]], r"^codes\[7\]\[1\]: code id 2048 outside \[0, 2048\)", id="past-card"),
    pytest.param([[0, 1]] * 3 + [[-1, 1]] * 5, r"^codes\[3\]\[0\]: code id -1 outside \[0, 2048\)", id="negative"),
    pytest.param(torch.zeros(8, 3, dtype=torch.bool), r"integer tensor \[8, frames\], got dtype torch.bool",
                 id="bool-tensor"),
    pytest.param(torch.zeros(8, 3), r"integer tensor \[8, frames\], got dtype torch.float32", id="float-tensor"),
    pytest.param(np.zeros((8, 3), np.float16), r"^codes: expected an integer array \[8, frames\], got dtype float16",
                 id="float-array"),
    pytest.param(np.full((8, 3), "1"), r"^codes: expected an integer array \[8, frames\], got dtype <U1",
                 id="string-array"),
    pytest.param(np.zeros((8, 3), bool), r"^codes: expected an integer array \[8, frames\], got dtype bool",
                 id="bool-array"),
    pytest.param(torch.quantize_per_tensor(torch.zeros(8, 3), 1.0, 0, torch.qint8),
                 r"^codes: expected an integer tensor \[8, frames\], got dtype torch.qint8", id="quantized-tensor"),
    pytest.param(np.array([[1, "x"]] * 8, dtype=object), r"^codes\[0\]\[1\]: expected an int code id, got 'x' \(str\)",
                 id="object-array-str"),
    pytest.param(np.array([[1, 2.5]] * 8, dtype=object), r"^codes\[0\]\[1\]: expected an int code id, got 2.5",
                 id="object-array-float"),
    pytest.param(np.array([[1, 2]] * 7 + [[1, 4096]], dtype=object), r"^codes\[7\]\[1\]: code id 4096 outside",
                 id="object-array-past-card"),
    pytest.param(torch.zeros(24, dtype=torch.int64), r"expected shape \[8, frames\] .* got \[24\]", id="1d"),
    pytest.param(torch.zeros(4, 3, dtype=torch.int64), r"expected shape \[8, frames\] .* got \[4, 3\]", id="n-q"),
    pytest.param(np.zeros((1, 8, 3), np.int64), r"got \[1, 8, 3\]", id="3d"),
])
def test_check_codes_errors_name_the_argument_and_what_came(codes, message):
    with pytest.raises(InputError, match=message):
        check_codes(codes, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a device tensor as payload")
def test_cuda_check_codes_refuses_a_device_tensor():
    with pytest.raises(InputError, match=r"^codes: expected a CPU tensor \(host payload\), got one on cuda"):
        check_codes(torch.zeros(8, 3, dtype=torch.int64, device="cuda"), n_q=N_Q, cardinality=CARD,
                    max_frames=MAX_FRAMES)


# --- in-place shifts -----------------------------------------------------------------------------
def _buf(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _ref_shift_left(buf, length, by, dim):
    """buf[..., :length-by] = buf[..., by:length], the rest unchanged: built from a copy with torch.cat."""
    src = buf.clone()
    if by <= 0 or by >= length:
        return src
    n = src.shape[dim]
    return torch.cat([src.narrow(dim, by, length - by), src.narrow(dim, length - by, n - (length - by))], dim)


def _ref_move_tail(buf, head, length, tail, dim):
    """buf[..., head:head+tail] = buf[..., length-tail:length], the rest unchanged."""
    src = buf.clone()
    if length - (head + tail) <= 0 or tail == 0:
        return src
    n = src.shape[dim]
    return torch.cat([src.narrow(dim, 0, head), src.narrow(dim, length - tail, tail),
                      src.narrow(dim, head + tail, n - head - tail)], dim)


@pytest.mark.parametrize("shape, dim, length, by", [
    pytest.param((2, 3, 20), -1, 20, 5, id="no-overlap-pieces"),
    pytest.param((2, 3, 20), -1, 20, 3, id="overlapping-shift-3"),
    pytest.param((2, 3, 20), -1, 17, 1, id="shift-1"),
    pytest.param((2, 3, 20), -1, 12, 11, id="keep-1"),
    pytest.param((4, 30, 5), 1, 25, 7, id="middle-dim"),
    pytest.param((2, 3, 20), -1, 20, 0, id="no-shift"),
    pytest.param((2, 3, 20), -1, 9, 9, id="everything-shifted-out"),
])
def test_shift_left_matches_a_reference_built_from_a_copy(shape, dim, length, by):
    buf = _buf(shape, seed=length * 31 + by)
    expected = _ref_shift_left(buf, length, by, dim)
    ptr = buf.data_ptr()
    shift_left_(buf, length, by, dim)
    assert torch.equal(buf, expected) and buf.data_ptr() == ptr


def test_shift_left_by_hand():
    buf = torch.arange(10.0)
    shift_left_(buf, 8, 3)                                  # keep 5 of the first 8, shifted by 3
    assert buf.tolist() == [3, 4, 5, 6, 7, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("shape, dim, head, length, tail", [
    pytest.param((2, 8, 40), -1, 10, 40, 8, id="shift-22-over-tail-8"),
    pytest.param((2, 8, 40), -1, 10, 30, 15, id="overlap-shift-5-tail-15"),
    pytest.param((2, 8, 40), -1, 0, 21, 20, id="overlap-shift-1"),
    pytest.param((3, 45, 2), 1, 30, 45, 10, id="middle-dim-MiniCPM-like"),
    pytest.param((2, 8, 40), -1, 10, 20, 10, id="already-in-place"),
    pytest.param((2, 8, 40), -1, 10, 30, 0, id="no-tail"),
])
def test_move_tail_matches_a_reference_built_from_a_copy(shape, dim, head, length, tail):
    buf = _buf(shape, seed=head * 7 + length + tail)
    expected = _ref_move_tail(buf, head, length, tail, dim)
    ptr = buf.data_ptr()
    move_tail_(buf, head, length, tail, dim)
    assert torch.equal(buf, expected) and buf.data_ptr() == ptr


def test_move_tail_by_hand():
    buf = torch.arange(12.0)
    move_tail_(buf, 2, 9, 4)                                # keep [0, 2) and the last 4 of the first 9
    assert buf.tolist() == [0, 1, 5, 6, 7, 8, 6, 7, 8, 9, 10, 11]


def test_check_tokens_takes_a_1d_integer_cpu_tensor_and_names_any_other():
    assert check_tokens(torch.tensor([5, 6560], dtype=torch.int16), vocab=VOCAB, max_count=MAX_TOKENS) == [5, 6560]
    with pytest.raises(InputError, match=r"^tokens\[1\]: token id 6561 outside"):
        check_tokens(torch.tensor([5, 6561]), vocab=VOCAB, max_count=MAX_TOKENS)
    for bad in (torch.tensor([1.0]), torch.tensor([[1, 2]]), torch.tensor([True]), torch.tensor(3),
                torch.quantize_per_tensor(torch.tensor([1.0, 2.0]), 1.0, 0, torch.quint8)):
        with pytest.raises(InputError, match=r"^tokens: expected a sequence of ints in \[0, 6561\) \(as a tensor: 1-D, dense, integer"):
            check_tokens(bad, vocab=VOCAB, max_count=MAX_TOKENS)


# --- callers' objects that lie: each value is read once, from what is stored ------------------------
class Liar(int):
    """An int whose comparisons, __int__ and __index__ lie (it passes any bound if they are asked)."""
    def __lt__(self, other): return False
    def __gt__(self, other): return False
    def __le__(self, other): return True
    def __ge__(self, other): return True
    def __int__(self): return 0
    def __index__(self): return 0


class Flip(int):
    """An int whose __int__ answers differently on every call."""
    calls = 0

    def __int__(self):
        Flip.calls += 1
        return 10**9 if Flip.calls % 2 == 0 else 1


def test_check_int_reads_an_int_subclass_by_its_value_not_its_methods():
    with pytest.raises(InputError, match=r"^size: expected an int in \[0, 100\], got 1000000000 \(Liar\)$"):
        check_int("size", Liar(10**9), low=0, high=100)
    out = check_int("size", Liar(7), low=0, high=100)
    assert out == 7 and type(out) is int


def test_check_tokens_uses_the_id_it_checked():
    out = check_tokens([Flip(6000), Flip(5)], vocab=VOCAB, max_count=MAX_TOKENS)
    assert out == [6000, 5] and all(type(t) is int for t in out)
    with pytest.raises(InputError, match=r"^tokens\[0\]: token id 1000000000 outside \[0, 6561\)$"):
        check_tokens([Liar(10**9)], vocab=VOCAB, max_count=MAX_TOKENS)


def test_a_numpy_timedelta_is_not_an_int():
    assert not is_int(np.timedelta64(3))
    with pytest.raises(InputError, match=r"^n: expected an int, got .*\(timedelta64\)$"):
        check_int("n", np.timedelta64(3))
    with pytest.raises(InputError, match=r"^tokens\[0\]: expected an int token id"):
        check_tokens([np.timedelta64(3)], vocab=VOCAB, max_count=MAX_TOKENS)


class Raising:
    def __iter__(self):
        yield 1
        raise KeyError("boom")


def test_an_iterable_that_raises_is_an_input_error_naming_the_argument():
    with pytest.raises(InputError, match=r"^tokens: iterating it raised KeyError: 'boom'$"):
        check_tokens(Raising(), vocab=VOCAB, max_count=MAX_TOKENS)


class LyingList(list):
    """A list whose len() and iteration lie about what it stores."""
    def __len__(self): return 3
    def __iter__(self): return iter([0] * 3)


def test_check_codes_reads_what_a_list_stores_not_what_it_says():
    rows = LyingList([LyingList([1, 2]) for _ in range(N_Q)])
    out = check_codes(rows, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)
    assert out.tolist() == [[1, 2]] * N_Q
    short = LyingList([[1]] * (N_Q - 1))
    with pytest.raises(InputError, match=rf"^codes: expected {N_Q} codebooks, got {N_Q - 1}$"):
        check_codes(short, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)
    ragged = [[1, 2]] * (N_Q - 1) + [LyingList([1])]
    with pytest.raises(InputError, match=r"^codes: every codebook needs the same frame count, got lengths \[1, 2\]$"):
        check_codes(ragged, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)


@pytest.mark.parametrize("dtype", [">i8", ">u2", "<i4"])
def test_check_codes_takes_an_integer_array_of_either_byte_order(dtype):
    ids = np.arange(2 * N_Q, dtype=dtype).reshape(N_Q, 2)
    out = check_codes(ids, n_q=N_Q, cardinality=CARD, max_frames=MAX_FRAMES)
    assert out.dtype == torch.int64 and out.tolist() == np.arange(2 * N_Q).reshape(N_Q, 2).tolist()


class IndexLiar(np.int64):
    """A numpy int whose __index__ and __int__ say something else than the value it stores."""
    def __index__(self): return 5
    def __int__(self): return 6


def test_a_numpy_int_subclass_is_read_by_its_stored_value():
    out = check_int("size", IndexLiar(12), low=0)
    assert out == 12 and type(out) is int
    assert check_tokens([IndexLiar(40)], vocab=VOCAB, max_count=MAX_TOKENS) == [40]


class BadRepr:
    def __repr__(self): raise RuntimeError("repr")


def test_shown_never_raises_and_cuts_a_long_value():
    assert shown(BadRepr()) == "<BadRepr>"
    assert shown(Liar(3)) == "3"
    long = shown(list(range(10_000)))
    assert len(long) == SHOWN_CHARS and long.startswith("[0, 1, 2") and long.endswith("...")
    with pytest.raises(InputError, match=r"^n: expected an int, got <BadRepr> \(BadRepr\)$"):
        check_int("n", BadRepr())


GOOD = signature("frame", 1, {"cache": 250}, batch=1)


def test_check_signatures_returns_well_formed_signatures_as_a_list():
    assert check_signatures(iter([GOOD, GOOD._replace(size=0)])) == [GOOD, GOOD._replace(size=0)]
    assert check_signatures(()) == []


@pytest.mark.parametrize("bad, message", [
    (GOOD._replace(size=1.5), r"size 1\.5 \(float\): expected an int >= 0"),
    (GOOD._replace(size=True), r"size True \(bool\): expected an int >= 0"),
    (GOOD._replace(size=1.0), r"size 1\.0 \(float\): expected an int >= 0"),
    (GOOD._replace(size=None), r"size None \(NoneType\): expected an int >= 0"),
    (GOOD._replace(size="x"), r"size 'x' \(str\): expected an int >= 0"),
    (GOOD._replace(size=[1]), r"size \[1\] \(list\): expected an int >= 0"),
    (GOOD._replace(size=-1), r"size -1 \(int\): expected an int >= 0"),
    (GOOD._replace(size=np.int64(1)), r"size 1 \(int64\): expected an int >= 0"),
    (GOOD._replace(step=3), r"step 3: expected a str"),
    (GOOD._replace(lengths=[("cache", 250)]), r"lengths: expected a tuple of \(name, value\) pairs, got list"),
    (GOOD._replace(lengths=(("cache", 2.5),)), r"lengths\['cache'\]: expected an int >= 0, got 2\.5 \(float\)"),
    (GOOD._replace(lengths=(("cache", -1),)), r"lengths\['cache'\]: expected an int >= 0, got -1 \(int\)"),
    (GOOD._replace(lengths=((1, 250),)), r"lengths: expected \(name, value\) pairs, got \(1, 250\)"),
    (GOOD._replace(exact=(("batch", [1]),)), r"exact\['batch'\]: expected a hashable value, got \[1\] \(list\)"),
])
def test_check_signatures_names_the_item_and_the_field_that_is_wrong(bad, message):
    with pytest.raises(InputError, match=rf"^signatures\[1\]: {message} \(build Signatures with signatures\(\)"):
        check_signatures([GOOD, bad])


def test_check_signatures_refuses_what_is_not_an_iterable_of_signatures():
    for bad in (GOOD, "frame", 5, None):
        with pytest.raises(InputError, match=r"^signatures: expected an iterable of Signature"):
            check_signatures(bad)
    with pytest.raises(InputError, match=r"^signatures\[0\]: expected a Signature, got \('frame', 1\) \(tuple\)"):
        check_signatures([("frame", 1)])


def test_check_signatures_turns_a_raising_iterable_into_an_input_error_and_stops_an_endless_one():
    def raising():
        yield GOOD
        raise RuntimeError("boom")
    with pytest.raises(InputError, match=r"^signatures: iterating it raised RuntimeError: boom$"):
        check_signatures(raising())
    import itertools
    endless = itertools.repeat(GOOD)
    with pytest.raises(InputError, match=rf"^signatures: at most {MAX_SIGNATURES} per prepare\(\) call, got more$"):
        check_signatures(endless)
    assert len(check_signatures(itertools.repeat(GOOD, MAX_SIGNATURES))) == MAX_SIGNATURES
