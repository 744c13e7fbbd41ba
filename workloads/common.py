"""What a workload is, and the session script it runs: one JSONL row per one-second duplex unit.

A `Workload` says WHAT to run (model, decoder architecture, pinned stock package, dtype, Euler steps,
voice prompt, session script, seeds); the suite says how to measure it and impl/ how to run it fast.
Nothing here measures or builds a model.

Session script rows (workloads/data/sessions/*.jsonl, written by `python -m workloads.make_sessions`):

    {"unit": int, "t_start_s": float, "kind": "LISTEN" | "SPEAK", "turn": int | null, "final": bool,
     "tokens": [int, ...]}            flow_hift: speech token ids @ 25 Hz, at most 25 per unit
     "codes": [[int, ...], ...]}      mimi / code2wav: [codebooks][frames] @ 12.5 Hz, 12 or 13 frames

Rows are units 0, 1, 2, ... in order, unit k starting at k seconds. A LISTEN unit belongs to no turn
(turn null, final false) and carries no tokens (Moshi's LISTEN units carry codes: it emits audio all the
time). Turns are numbered 0, 1, 2, ...; a turn is a run of consecutive SPEAK units whose last unit, and
only that one, is marked final (the end-of-turn flush). The file is read with `datasets`; every line is
also parsed with `json`, because Arrow's column types erase the per-row JSON type (2.0 vs 2) and the
difference between a missing field and null. Any violation raises `ScriptError` naming the file, row,
line, field, what was expected and what came.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import functools

DATA_DIR = Path(__file__).resolve().parent / "data"
UNIT_SECONDS = 1.0              # one duplex unit per second (DESIGN section 1)
ARCHITECTURES = ("flow_hift", "mimi", "code2wav")
DTYPES = ("float32", "bfloat16")
KINDS = ("LISTEN", "SPEAK")
FIELDS = ("unit", "t_start_s", "kind", "turn", "final")
PAYLOAD_KEYS = ("tokens", "codes")

#: Seeds, one per dimension (MLCommons loadgen habit, shared/notes/style.md 11).
#: Must not be changed -- only appended: a workload that needs another seed gets a new name.
#:   weights: the adapter's seeded random weights (`build_model(..., seed=)`); the measured stock
#:            baseline (DESIGN section 7) used 0.
#:   tokens:  the generator of the session script's payloads (workloads/make_sessions.py).
#:   prompt:  voice-prompt stand-ins a model may need (the flow_hift adapter derives its stand-in from
#:            the prompt audio's sha256 and does not read it).
SEEDS: dict[str, dict[str, int]] = {
    "s0": {"weights": 0, "tokens": 1, "prompt": 2},
}


@dataclass(frozen=True)
class PayloadFormat:
    """What one unit's payload is for a decoder architecture."""
    key: str               # "tokens" | "codes"
    vocab: int             # ids in [0, vocab)
    codebooks: int | None  # codes: rows per unit ([codebooks][frames]); None for tokens
    max_len: int           # most tokens per unit, or frames per codebook per unit
    listen: str            # payload on LISTEN units: "none" | "required" | "optional"


#: Per architecture, from the adapters' own declarations (the clocks' unit bounds and the models' vocabularies,
#: each cited there): flow_hift = S3 tokenizer v2 ids, at most MAX_UNIT_TOKENS per unit, none while listening;
#: mimi = 8 codebooks of 2048 bins, 12 or 13 frames per unit at 12.5 Hz, decoded on every unit (moshi's server
#: decodes while it listens: server.py L129-151); code2wav = 16 codebooks of 2048, only while speaking.
#: Read on first use (the module attribute FORMATS, through `__getattr__`): importing an adapter package loads
#: torch, and the records and the report import the workloads without it.
@functools.cache
def formats() -> dict[str, PayloadFormat]:
    from duplexcadence.adapters.code2wav import schedule as c2w
    from duplexcadence.adapters.flow_hift import facts as fh
    from duplexcadence.adapters.mimi import schedule as mimi
    return {
        "flow_hift": PayloadFormat("tokens", fh.VOCAB_SIZE, None, fh.MAX_UNIT_TOKENS, "none"),
        "mimi": PayloadFormat("codes", mimi.CARDINALITY, mimi.N_Q, mimi.UNIT.policy.bound(), "required"),
        "code2wav": PayloadFormat("codes", c2w.CODEBOOK_SIZE, c2w.NUM_QUANTIZERS, c2w.UNIT.policy.bound(), "none"),
    }


def __getattr__(name: str):
    if name == "FORMATS":
        return formats()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Workload:
    """One released model's stock decoder run on one scripted session. Paths are absolute.

    seeds: {"weights", "tokens", "prompt"} from `SEEDS`; spec: passed to the adapter (e.g.
    {"n_timesteps": 10}); script: the session JSONL (`session_script()` loads it).
    Raises ValueError naming the field for an unknown architecture/dtype or inconsistent steps.
    """
    name: str
    model: str
    architecture: str
    stock_package: str
    dtype: str
    euler_steps: int | None
    voice_prompt: Path | None
    prompt_seconds: float | None
    script: Path
    token_source: str
    seeds: dict
    spec: dict
    notes: str

    def __post_init__(self):
        def bad(field, expected):
            raise ValueError(f"workload {self.name!r}: {field}: expected {expected}, "
                             f"got {getattr(self, field)!r}")
        if self.architecture not in ARCHITECTURES:
            bad("architecture", f"one of {ARCHITECTURES}")
        if self.dtype not in DTYPES:
            bad("dtype", f"one of {DTYPES}")
        if "==" not in self.stock_package:
            bad("stock_package", "an exact pin 'name==version'")
        if self.architecture == "flow_hift":
            if not isinstance(self.euler_steps, int) or not 1 <= self.euler_steps <= 16:
                bad("euler_steps", "an int in [1, 16] for flow_hift (the DiT cache holds 16 steps)")
            if self.spec.get("n_timesteps") != self.euler_steps:
                bad("spec", f"n_timesteps == euler_steps ({self.euler_steps})")
        elif self.euler_steps is not None:
            bad("euler_steps", f"None ({self.architecture} has no ODE)")
        if set(self.seeds) != {"weights", "tokens", "prompt"}:
            bad("seeds", "keys {'weights', 'tokens', 'prompt'}")
        if self.voice_prompt is None and self.prompt_seconds is not None:
            bad("prompt_seconds", "None when there is no voice prompt")

    @property
    def payload_format(self) -> PayloadFormat:
        return formats()[self.architecture]

    def session_script(self) -> SessionScript:
        """The session script, validated against this architecture's payload format."""
        return load_script(self.script, self.payload_format)


# --- the session script --------------------------------------------------------------------------
class ScriptError(ValueError):
    """A session script that breaks the schema; names the file, row, line, field, expected and got."""

    def __init__(self, path, *, expected: str, got: str, row: int | None = None, line: int | None = None,
                 field: str | None = None):
        self.path, self.row, self.line, self.field = Path(path), row, line, field
        self.expected, self.got = expected, got
        where = str(path) if row is None else f"{path}: row {row} (line {line})"
        what = f", field '{field}'" if field else ""
        super().__init__(f"{where}{what}: expected {expected}, got {got}")


@dataclass(frozen=True)
class Unit:
    """One one-second unit. tokens: speech token ids @ 25 Hz; codes: [codebooks][frames] @ 12.5 Hz.
    At most one of them is set; both are None for a unit without payload."""
    index: int
    t_start_s: float
    kind: str
    turn: int | None
    final: bool
    tokens: tuple[int, ...] | None = None
    codes: tuple[tuple[int, ...], ...] | None = None

    @property
    def payload(self):
        return self.tokens if self.tokens is not None else self.codes

    @property
    def frames(self) -> int:
        """Codec frames this unit carries (0 without codes)."""
        return len(self.codes[0]) if self.codes else 0


def _min_keep(n: int, parity: bool) -> int:
    """Fewest units a kept turn of n units can be cut to (first + final; codes: an even cut)."""
    return n if n <= 2 else (3 if parity and n % 2 else 2)


def _fit(n: int, allowance: int, parity: bool) -> int:
    """Most units (<= allowance) a turn of n units can be cut to, or 0 if it cannot be kept."""
    for k in range(min(n, allowance), 0, -1):
        if k == n or (k >= 2 and (not parity or (n - k) % 2 == 0)):
            return k
    return 0


@dataclass(frozen=True)
class SessionScript:
    """A validated session: `units` in order (index k starts at k seconds), payloads in `fmt`."""
    path: Path
    units: tuple[Unit, ...]
    fmt: PayloadFormat

    @property
    def speak_units(self) -> list[Unit]:
        return [u for u in self.units if u.kind == "SPEAK"]

    @property
    def turns(self) -> list[list[Unit]]:
        """SPEAK units grouped by turn, in order; each list ends with the turn's final unit."""
        out: list[list[Unit]] = []
        for u in self.speak_units:
            if u.turn == len(out):
                out.append([])
            out[-1].append(u)
        return out

    @property
    def seconds(self) -> float:
        return len(self.units) * UNIT_SECONDS

    def select(self, max_speak_units: int, min_turns: int = 2) -> SessionScript:
        """A shorter session of at most `max_speak_units` SPEAK units over at least `min_turns` turns.

        Keeps whole turns from the first on; a turn that does not fit is cut to its first units plus
        its final unit (so the end-of-turn flush still happens), and the turns after it are dropped,
        except those still needed for `min_turns`, which are cut to their first and final unit. LISTEN
        units before and between kept turns are kept; units after the last kept turn are dropped
        (unless every turn is kept whole: then the script comes back unchanged). Kept units are
        renumbered (index, t_start_s); payloads are unchanged. For codes scripts a turn is only cut by an
        even number of units, so 12/13-frame units keep alternating on the exact 12.5 Hz clock.
        Raises ValueError if min_turns cannot be met.
        """
        for name, value in (("max_speak_units", max_speak_units), ("min_turns", min_turns)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        turns, parity = self.turns, self.fmt.key == "codes"
        if len(turns) < min_turns:
            raise ValueError(f"min_turns={min_turns}: {self.path} has {len(turns)} turns")
        costs = [_min_keep(len(t), parity) for t in turns]
        if max_speak_units < sum(costs[:min_turns]):
            raise ValueError(f"max_speak_units={max_speak_units}: the first {min_turns} turns of {self.path} "
                             f"need at least {sum(costs[:min_turns])} (first and final unit of each)")
        if max_speak_units >= len(self.speak_units):
            return self
        kept: set[int] = set()
        left = max_speak_units
        for i, turn in enumerate(turns):
            k = _fit(len(turn), left - sum(costs[i + 1:min_turns]), parity)
            if k == 0:
                break
            kept.update(u.index for u in (turn if k == len(turn) else turn[:k - 1] + [turn[-1]]))
            left -= k
        last = max(kept)
        units = [u for u in self.units if u.index <= last and (u.kind == "LISTEN" or u.index in kept)]
        units = [replace(u, index=j, t_start_s=j * UNIT_SECONDS) for j, u in enumerate(units)]
        return SessionScript(self.path, tuple(units), self.fmt)


def load_script(path, fmt: PayloadFormat | None = None) -> SessionScript:
    """Read and validate a session script (JSONL, schema in the module docstring).

    fmt: the payload format to enforce (`FORMATS[architecture]`); None infers it from the file (the
    payload key; 6561 token ids or 2048 code bins; the codebook count of the first codes row).
    Raises ScriptError for a missing file, invalid JSONL, and any row that breaks the schema.
    """
    path = Path(path)
    if not path.is_file():
        raise ScriptError(path, expected="an existing session script (JSONL)", got="no such file")
    raw = _json_rows(path)
    rows = read_local("json", path)
    if len(rows) != len(raw):
        raise ScriptError(path, expected=f"{len(raw)} rows (one per non-blank line)",
                          got=f"{len(rows)} rows from datasets")
    fmt = fmt or _infer_format(raw)
    units = [_unit(path, i, line, row, fmt) for i, ((line, _), row) in enumerate(zip(raw, rows, strict=True))]
    _check_turns(path, units, [line for line, _ in raw])
    return SessionScript(path, tuple(units), fmt)


def script_from_rows(rows: list[dict], fmt: PayloadFormat, name: str) -> SessionScript:
    """A session script made in memory (e.g. `workloads.traffic`), validated as `load_script` validates a
    file; `name` stands in for the path in errors and records. Raises ScriptError as load_script does."""
    path = Path(name)
    for i, row in enumerate(rows):
        _check_types(path, i, i + 1, row)
    units = [_unit(path, i, i + 1, row, fmt) for i, row in enumerate(rows)]
    _check_turns(path, units, list(range(1, len(rows) + 1)))
    return SessionScript(path, tuple(units), fmt)


def read_local(builder: str, path: Path) -> list[dict]:
    """Rows of a local data file read with `datasets.load_dataset(builder, data_files=path)`, kept in
    memory with a throwaway cache directory; datasets' progress bars are off for the call only."""
    import datasets

    bars_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with tempfile.TemporaryDirectory() as cache:
            ds = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache,
                                       keep_in_memory=True)
            return ds.to_list()
    finally:
        if bars_on:
            datasets.enable_progress_bars()


# --- row checks ----------------------------------------------------------------------------------
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _json_rows(path: Path) -> list[tuple[int, dict]]:
    """(line number, row) for every non-blank line, with each field's JSON type checked."""
    out = []
    for line, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        row_i = len(out)
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScriptError(path, row=row_i, line=line, expected="one JSON object per line (JSONL)",
                              got=f"invalid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(row, dict):
            raise ScriptError(path, row=row_i, line=line, expected="a JSON object",
                              got=type(row).__name__)
        _check_types(path, row_i, line, row)
        out.append((line, row))
    if not out:
        raise ScriptError(path, expected="at least one row", got="an empty file")
    return out


def _check_types(path, row_i, line, row: dict) -> None:
    def fail(field, expected, got):
        raise ScriptError(path, row=row_i, line=line, field=field, expected=expected, got=got)
    for key in row:
        if key not in FIELDS + PAYLOAD_KEYS:
            fail(key, f"only the fields {list(FIELDS + PAYLOAD_KEYS)}", "an unknown field")
    for key in FIELDS:
        if key not in row:
            fail(key, "the field to be present", "missing")
    if "tokens" in row and "codes" in row:
        fail("codes", "either 'tokens' or 'codes'", "both")
    checks = (("unit", _is_int, "an int"),
              ("t_start_s", lambda x: _is_int(x) or isinstance(x, float), "a number of seconds"),
              ("kind", lambda x: isinstance(x, str), "a string"),
              ("turn", lambda x: x is None or _is_int(x), "an int or null"),
              ("final", lambda x: isinstance(x, bool), "true or false"))
    for key, ok, expected in checks:
        if not ok(row[key]):
            fail(key, expected, json.dumps(row[key]))
    if "tokens" in row:
        if not isinstance(row["tokens"], list):
            fail("tokens", "a list of int token ids", json.dumps(row["tokens"]))
        for j, t in enumerate(row["tokens"]):
            if not _is_int(t):
                fail(f"tokens[{j}]", "an int token id", json.dumps(t))
    if "codes" in row:
        if not isinstance(row["codes"], list):
            fail("codes", "a list of codebooks (lists of int code ids)", json.dumps(row["codes"]))
        for q, book in enumerate(row["codes"]):
            if not isinstance(book, list):
                fail(f"codes[{q}]", "a list of int code ids", json.dumps(book))
            for j, c in enumerate(book):
                if not _is_int(c):
                    fail(f"codes[{q}][{j}]", "an int code id", json.dumps(c))


def _infer_format(raw: list[tuple[int, dict]]) -> PayloadFormat:
    keys = {k for _, row in raw for k in PAYLOAD_KEYS if k in row}
    if keys == {"codes"}:
        books = next((len(row["codes"]) for _, row in raw if row.get("codes")), None)
        return PayloadFormat("codes", 2048, books, 13, "optional")
    return replace(formats()["flow_hift"], listen="none")


def _unit(path: Path, i: int, line: int, row: dict, fmt: PayloadFormat) -> Unit:
    """Build unit i from its datasets row, checking values (types were checked by `_check_types`)."""
    def fail(field, expected, got):
        raise ScriptError(path, row=i, line=line, field=field, expected=expected, got=got)
    if row["unit"] != i:
        fail("unit", f"{i} (units are numbered 0, 1, 2, ... in row order)", str(row["unit"]))
    if float(row["t_start_s"]) != i * UNIT_SECONDS:
        fail("t_start_s", f"{i * UNIT_SECONDS} (unit {i} x {UNIT_SECONDS} s)", str(row["t_start_s"]))
    kind, turn, final = row["kind"], row["turn"], row["final"]
    if kind not in KINDS:
        fail("kind", f"one of {list(KINDS)}", json.dumps(kind))
    if kind == "LISTEN" and turn is not None:
        fail("turn", "null on a LISTEN unit (it belongs to no turn)", str(turn))
    if kind == "LISTEN" and final:
        fail("final", "false on a LISTEN unit", "true")
    if kind == "SPEAK" and (turn is None or turn < 0):
        fail("turn", "an int >= 0 on a SPEAK unit", "null" if turn is None else str(turn))
    other = "codes" if fmt.key == "tokens" else "tokens"
    if row.get(other) is not None:
        fail(other, f"'{fmt.key}' (this script's payload)", f"'{other}'")
    value = row.get(fmt.key)
    if kind == "LISTEN" and fmt.listen == "none" and value:
        fail(fmt.key, "no payload on a LISTEN unit (omitted or [])", f"{len(value)} entries")
    need = kind == "SPEAK" or fmt.listen == "required"
    if need and value is None:
        fail(fmt.key, f"a payload on a {kind} unit (tokens may be [])", "missing or null")
    if fmt.key == "tokens":
        tokens = tuple(value or ())
        if len(tokens) > fmt.max_len:
            fail("tokens", f"at most {fmt.max_len} tokens per unit", str(len(tokens)))
        for j, t in enumerate(tokens):
            if not 0 <= t < fmt.vocab:
                fail(f"tokens[{j}]", f"a token id in [0, {fmt.vocab})", str(t))
        return Unit(i, i * UNIT_SECONDS, kind, turn, final, tokens=tokens if value is not None else None)
    if not value:
        if need:
            fail("codes", f"{fmt.codebooks} codebooks of 1..{fmt.max_len} frames", "[]")
        return Unit(i, i * UNIT_SECONDS, kind, turn, final)
    if fmt.codebooks is not None and len(value) != fmt.codebooks:
        fail("codes", f"{fmt.codebooks} codebooks", f"{len(value)} codebooks")
    frames = len(value[0])
    if not 1 <= frames <= fmt.max_len:
        fail("codes[0]", f"1..{fmt.max_len} frames per unit", f"{frames} frames")
    for q, book in enumerate(value):
        if len(book) != frames:
            fail(f"codes[{q}]", f"{frames} frames (as codes[0])", f"{len(book)} frames")
        for j, c in enumerate(book):
            if not 0 <= c < fmt.vocab:
                fail(f"codes[{q}][{j}]", f"a code id in [0, {fmt.vocab})", str(c))
    return Unit(i, i * UNIT_SECONDS, kind, turn, final, codes=tuple(tuple(b) for b in value))


def _check_turns(path: Path, units: list[Unit], lines: list[int]) -> None:
    """Turns are numbered 0, 1, 2, ...; each is a run of SPEAK units ending in its one final unit."""
    def fail(i, field, expected, got):
        raise ScriptError(path, row=i, line=lines[i], field=field, expected=expected, got=got)
    open_turn, last_row, done = None, None, -1   # open turn, its last row, highest finalised turn
    for u in units:
        if open_turn is not None and (u.kind == "LISTEN" or u.turn != open_turn):
            fail(last_row, "final", f"true on the last SPEAK unit of turn {open_turn} (row {u.index} "
                 f"is {u.kind} turn {u.turn})", "false")
        if u.kind == "LISTEN":
            continue
        if u.turn <= done:
            fail(u.index, "turn", f"turn {done + 1} (turn {u.turn} was finalised earlier: 'final' is "
                 f"only allowed on a turn's last SPEAK unit)", str(u.turn))
        if open_turn is None and u.turn != done + 1:
            fail(u.index, "turn", f"{done + 1} (turns are numbered 0, 1, 2, ... in order)", str(u.turn))
        open_turn, last_row = u.turn, u.index
        if u.final:
            open_turn, done = None, u.turn
    if open_turn is not None:
        fail(last_row, "final", f"true on the last SPEAK unit of turn {open_turn} (end of file)", "false")
