"""Stage state (`stages.json`, STAGES_SCHEMA): the harnesses a reproduction plans, `StageState` per stage,
`check_stages`, and when stages overlapped. Re-exported by suite.records."""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

STAGES_SCHEMA = "duplexcadence.stages/1"


# --- harnesses and stages ----------------------------------------------------------------------------
#: harness -> the one mode its process runs (None: both, verify). duplex_oracle: cadence sessions whose
#: graphs are also captured from their own script before the cadence (labelled, never the headline).
HARNESS_MODE = {"verify": None, "memory_stock": "stock", "memory_cadence": "cadence",
                "duplex_stock": "stock", "duplex_cadence": "cadence", "duplex_oracle": "cadence"}
HARNESSES = tuple(HARNESS_MODE)
#: Harnesses a pattern selects only when it names them ("oracle" in it): not part of any default plan.
OPTIONAL_HARNESSES = frozenset({"duplex_oracle"})
#: Stages whose figures are times: nothing else runs on their host while they run.
TIMED_HARNESSES = frozenset({"verify", "duplex_stock", "duplex_cadence", "duplex_oracle"})
#: What a run selects by default (no --stages); a CUDA run folder is complete when every registered
#: workload has these.
DEFAULT_HARNESSES = {"cuda": HARNESSES[:5], "cpu": ("verify",)}
DUPLEX_STAGES = {"stock": "duplex_stock", "cadence": "duplex_cadence", "oracle": "duplex_oracle"}
STATUSES = ("done", "failed", "skipped", "pending", "running")
#: started_utc / ended_utc to the millisecond (older stages.json hold whole seconds)
STAGE_TIMESPEC = "milliseconds"
#: Exit statuses of the stage processes besides 0 (record written) and 2 (bad arguments): a duplex
#: harness that wrote a complete INVALID record; a verify / memory stage whose mode the adapter lacks.
EXIT_INVALID = 1
EXIT_UNAVAILABLE = 4


def family(harness: str) -> str:
    """'memory_stock' -> 'memory', 'duplex_cadence' -> 'duplex'; other harnesses are their own family."""
    return harness.split("_")[0]


def device_type(device: str) -> str:
    """'cuda', 'cuda:1' -> 'cuda'; anything else -> 'cpu'."""
    return "cuda" if str(device).split(":")[0] == "cuda" else "cpu"


def utc_now(timespec: str = "seconds") -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec=timespec)


@dataclass
class StageState:
    """What stages.json holds for one stage (its last attempt)."""
    workload: str
    harness: str
    status: str = "pending"
    reason: str = ""
    seconds: float | None = None
    attempts: int = 0
    budget_s: float | None = None
    timeout_s: float | None = None
    returncode: int | None = None
    started_utc: str | None = None
    ended_utc: str | None = None
    command: list = field(default_factory=list)
    dir: str | None = None              # relative to the run dir: the stage's own name
    verdict: str | None = None          # its record's VALID / INVALID (duplex: PARTIAL while unfinished)
    invalid_reasons: list = field(default_factory=list)
    invalid_codes: list = field(default_factory=list)
    #: bytes that differ: verify's unit indices; a duplex stage's sessions differing from themselves alone
    mismatched_units: list = field(default_factory=list)
    units_compared: int | None = None   # verify: SPEAK units compared byte for byte
    git_rev: str | None = None          # of the sitting that ran it
    impl_tree: str | None = None
    gpu: int | None = None              # the GPU index it ran on (on its node), None: not pinned
    node: str | None = None             # the host that ran it (a Ray node), None: the sitting's own
    gpu_name: str | None = None         # the device it ran on (its record's GPU, else "cpu")
    overlapped: list | None = None      # the stages whose times overlapped its own (None: not recorded)
    log_tail: list = field(default_factory=list)


class StateError(ValueError):
    """A stages.json that cannot be used as asked (schema, shape, options, an existing run without resume)."""


def check_stages(data, path) -> None:
    """Raises StateError naming `path` unless stages.json's content is shaped as it is written: an object of
    the schema, `options` with the run's device, `stages` objects of StageState's fields with a known status,
    `dir` the stage's own plain name, finite numbers >= 0 where numbers go, lists of names where lists go,
    `compare` a list of folder names, `sittings` a list of objects."""
    if not isinstance(data, dict):
        raise StateError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != STAGES_SCHEMA:
        raise StateError(f"{path}: schema {data.get('schema')!r}, expected {STAGES_SCHEMA!r}")
    if not isinstance(data.get("stages", {}), dict):
        raise StateError(f"{path}: 'stages': expected an object, got {type(data['stages']).__name__}")
    if not isinstance(data.get("sittings", []), list):
        raise StateError(f"{path}: 'sittings': expected a list, got {type(data['sittings']).__name__}")
    bad = next((s for s in data.get("sittings", []) if not isinstance(s, dict)), None)
    if bad is not None:
        raise StateError(f"{path}: 'sittings': expected a list of objects, got an item {json.dumps(bad)[:40]}")
    compare = data.get("compare", [])
    if not isinstance(compare, list) or not all(isinstance(c, str) and c for c in compare):
        raise StateError(f"{path}: 'compare': expected a list of reference run folders (strings), got "
                         f"{json.dumps(compare)[:60]}")
    opts = data.get("options")
    if not isinstance(opts, dict) or not isinstance(opts.get("device"), str):
        raise StateError(f"{path}: 'options': expected an object with the run's 'device' (as suite.reproduce "
                         f"writes it), got {json.dumps(opts)[:80]}")
    known = {f.name for f in fields(StageState)}
    for name, st in data.get("stages", {}).items():
        if not isinstance(st, dict):
            raise StateError(f"{path}: stage {name!r}: expected an object, got {type(st).__name__}")
        missing = [k for k in ("workload", "harness") if not isinstance(st.get(k), str)]
        unknown = sorted(set(st) - known)
        if missing or unknown:
            raise StateError(f"{path}: stage {name!r}: " + (f"no {missing[0]!r}" if missing else
                                                             f"unknown field(s) {unknown}"))
        if st.get("status", "pending") not in STATUSES:
            raise StateError(f"{path}: stage {name!r}: status {st['status']!r}, expected one of {STATUSES}")
        d = st.get("dir")
        if d is not None and (d != name or name in (".", "..") or any(c in name for c in "/\\\0")):
            raise StateError(f"{path}: stage {name!r}: 'dir': expected the stage's own folder {name!r} inside the "
                             f"run folder (as the runner writes it), got {json.dumps(d)[:60]}")
        for key in ("seconds", "budget_s", "timeout_s"):
            v = st.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                raise StateError(f"{path}: stage {name!r}: {key!r}: expected a finite number >= 0 or null, "
                                 f"got {json.dumps(v)[:40]}")
        for key in ("overlapped", "mismatched_units"):
            v = st.get(key)
            if v is not None and not isinstance(v, list):
                raise StateError(f"{path}: stage {name!r}: {key!r}: expected a list or null, got {json.dumps(v)[:40]}")
        if not all(isinstance(o, str) for o in st.get("overlapped") or []):
            raise StateError(f"{path}: stage {name!r}: 'overlapped': expected stage names, got "
                             f"{json.dumps(st['overlapped'])[:40]}")


def read_stages(run_dir: Path) -> dict:
    """stages.json of a run folder, checked. Raises FileNotFoundError when it is missing or unreadable,
    StateError when it is not JSON or mis-shaped."""
    path = Path(run_dir) / "stages.json"
    try:
        text = path.read_text()
    except OSError:
        raise FileNotFoundError(f"{path}: missing or unreadable (a folder written by python -m suite.reproduce)") \
            from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateError(f"{path}: not JSON ({exc})") from None
    check_stages(data, path)
    return data


def unselected(data: dict, workload_names: list[str] | None = None) -> list[str]:
    """The stages of the default plan a CUDA run folder has never selected, in plan order, for every
    workload with a stage there and every name in `workload_names`; [] for a CPU folder (a check of the
    stages its sittings chose). data: stages.json's content."""
    kind = device_type((data.get("options") or {}).get("device", "cpu"))
    if kind != "cuda":
        return []
    have = data.get("stages") or {}
    names = list(dict.fromkeys([*(workload_names or []),
                                *(st.get("workload") for st in have.values() if st.get("harness") in HARNESSES)]))
    done = {(st.get("workload"), st.get("harness")) for st in have.values()}
    return [f"{w}.{h}" for w in names for h in DEFAULT_HARNESSES[kind] if (w, h) not in done]


def instant(text: str | None) -> _dt.datetime | None:
    """A recorded time as an aware datetime; None when absent or unreadable."""
    try:
        t = _dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def overlapping(name: str, stages: dict[str, dict], ended: dict[str, str] | None = None) -> list[str]:
    """The stages whose [started_utc, ended_utc] overlapped stage `name`'s, in `stages`' order, from the
    recorded times alone, and only those on the same node (`node`; None is the sitting's own host). A
    `running` stage is open-ended unless `ended` gives its end. Intervals that only touch do not overlap.
    Left out: a stage never started, or whose end is missing or before its start."""
    ended = ended or {}
    spans = {}
    for n, st in stages.items():
        start = instant(st.get("started_utc"))
        if start is None:
            continue
        if n in ended:
            end = instant(ended[n])
        elif st.get("status") == "running":
            end = None
        else:
            end = instant(st.get("ended_utc"))
            if end is None or end < start:
                continue
        spans[n] = (start, end, st.get("node"))
    if name not in spans:
        return []
    a0, a1, node = spans[name]
    return [n for n, (b0, b1, other) in spans.items()
            if n != name and other == node and (a1 is None or b0 < a1) and (b1 is None or a0 < b1)]
