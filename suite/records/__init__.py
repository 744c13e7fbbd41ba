"""The records every harness writes and the report reads: schemas, reading and writing, and the constants
a report needs. Nothing here measures anything or imports torch; `suite.report` imports this module only.

* run records (`run.json`, schema RUN_SCHEMA): one verify or one-mode session run, `UnitRecord` per unit;
* duplex records (`duplex.json`, DUPLEX_SCHEMA): each run's units as one table (`pack_units`);
* stage state (`stages.json`, STAGES_SCHEMA): `StageState` per stage, checked by `check_stages`.
Keys carry their units (`tail_ms_p50`, `peak_alloc_mib`). Older records stay readable: duplex schema /1
(units as a list of objects), stage entries of harnesses this version does not plan (`legacy`).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import soundfile as sf

import workloads

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_SCHEMA = "duplexcadence.run/1"
#: A paired verify record (suite.measure.verify): run/1's fields plus `paired` (suite.records.paired).
VERIFY_SCHEMA = "duplexcadence.verify/1"
DUPLEX_SCHEMA = "duplexcadence.duplex/2"
DUPLEX_READ_SCHEMAS = ("duplexcadence.duplex/1", DUPLEX_SCHEMA)
STAGES_SCHEMA = "duplexcadence.stages/1"
SAMPLE_RATE = 24000                 # every UnitOutput is @ 24 kHz (duplexcadence.session)
UNIT_PERIOD_S = 1.0                 # the duplex cadence: one unit per second

#: The published DuplexCadence figures (one H200, MiniCPM-o 4.5, whole SPEAK unit).
PUBLISHED = {"speedup_x": 2.85, "peak_memory_change_pct": -38.8,
             "speak_vs_period_pct_stock": 14.0, "speak_vs_period_pct_cadence": -2.0}
PUBLISHED_ARCHITECTURE = "flow_hift"    # the architecture they were measured on

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
    `dir` the stage's own plain name, numbers where numbers go, `sittings` a list of objects."""
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
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise StateError(f"{path}: stage {name!r}: {key!r}: expected a number or null, "
                                 f"got {json.dumps(v)[:40]}")


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


# --- run records ---------------------------------------------------------------------------------------
@dataclass
class UnitRecord:
    """One unit of the script as it ran. LISTEN units without payload have no timing or hashes."""
    index: int                      # unit index in the session script
    kind: str                       # "LISTEN" | "SPEAK"
    turn: int | None                # turn number in the script (None: a LISTEN unit)
    final: bool                     # last unit of its turn (flushes the stream)
    t_start_s: float                # unit start in the session, seconds
    payload: str                    # "tokens" (speech tokens @ 25 Hz) | "frames" (codec frames) | "none"
    payload_size: int               # tokens or codec frames passed to speak()
    samples: int = 0                # audio samples out @ 24 kHz
    tail_ms: float | None = None    # CUDA events (CUDA) or perf_counter (CPU) around speak()
    wall_ms: float | None = None    # perf_counter around speak(), always
    measured: bool = False          # counted in the statistics (SPEAK, after warm-up)
    sha256_f32: str | None = None   # of the float32 little-endian waveform bytes
    sha256_pcm16: str | None = None  # of the int16 little-endian PCM bytes
    std: float | None = None        # of the float32 waveform
    clipped_frac: float | None = None  # fraction of samples with |x| >= the clip level
    stats: dict | None = None       # SessionStats counters after the unit (cumulative; `detail` left out)
    kernels: dict | None = None     # profiled units (CUDA): launches, kernels, kernel-busy ms
    host: dict | None = None        # verify's timed SPEAK units: host / GPU state right after
    info: dict = field(default_factory=dict)   # UnitOutput.info


def jsonable(obj):
    """Plain JSON types: numpy scalars converted, Paths as str (relative to the repository root when inside
    it), tuples to lists, dataclasses to dicts, other objects to str."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        try:
            return str(obj.resolve().relative_to(REPO_ROOT))
        except ValueError:
            return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    return str(obj)


def run_record(first: dict, modes: dict, comparison: dict | None, verdict: str, reasons: list, codes: list,
               notes: list) -> dict:
    """A run.json record. first: the run's common facts (workload, device, depth, parameters, seeds,
    provenance, determinism); modes: mode -> its part (units, memory, metrics, session_stats, verdict)."""
    return jsonable({"schema": RUN_SCHEMA, **{k: first[k] for k in (
        "workload", "device", "depth", "parameters", "seeds", "provenance", "determinism")},
        "sample_rate": SAMPLE_RATE, "modes": modes, "comparison": comparison, "verdict": verdict,
        "invalid_reasons": list(reasons), "invalid_codes": list(codes), "notes": list(notes)})


def device_short_name(info: dict) -> str:
    """A short file-name-safe device name: 'cpu', or the GPU model ('NVIDIA H200' -> 'h200')."""
    name = info.get("gpu_name")
    if not name:
        return "cpu"
    words = [w for w in name.lower().replace("nvidia", "").replace("geforce", "").split() if w]
    return "".join(c if c.isalnum() or c == "-" else "-" for c in ("-".join(words) or "gpu"))


def write_run(folder: Path, record: dict, audio: dict) -> Path:
    """Write run.json and audio_<mode>.wav (int16 PCM mono, 24 kHz, soundfile) of a run record into
    `folder` (made if missing); `record` gains run_id and audio (file, samples, sha256 of each mode's whole
    PCM). Returns folder/run.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record["run_id"] = folder.name
    record["audio"] = {}
    for mode, pcm in audio.items():
        pcm = np.ascontiguousarray(pcm, dtype="<i2").reshape(-1)
        sf.write(folder / f"audio_{mode}.wav", pcm, SAMPLE_RATE, subtype="PCM_16")
        record["audio"][mode] = {"file": f"audio_{mode}.wav", "samples": int(pcm.size),
                                 "sha256_pcm16": hashlib.sha256(pcm.tobytes()).hexdigest()}
    path = folder / "run.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def read_json(path: Path) -> dict | None:
    """A JSON object from `path`; None when missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def headline(memory: dict) -> tuple[str, float | None]:
    """(key, MiB) of the memory figure compared between modes: the session's peak over the idle baseline,
    driver level on CUDA, RSS on CPU."""
    for key in ("peak_over_idle_driver_mib", "peak_over_idle_rss_mib"):
        if key in memory:
            return key, memory[key]
    return "none", None


# --- duplex records ------------------------------------------------------------------------------------
MIN_SECONDS = 60.0                          # zero misses are claimed over 60 s runs
NOT_FINISHED = "run not finished"           # the reason of a checkpoint (verdict PARTIAL)
DIRTY_TREE = "dirty tree: uncommitted changes (see provenance.git_status)"
SHORT_RUN = "max zero-miss sessions is over a shorter run"
#: Per-unit columns stored once per record (`unit_hashes`) and referred to by position.
INTERNED_COLUMNS = ("sha256_f32", "sha256_pcm16")


def record_reasons(record: dict) -> list[str]:
    """A duplex record's invalid reasons; a checkpoint's (PARTIAL) include its workloads' reasons so far."""
    reasons = list(record.get("invalid_reasons") or [])
    if record.get("verdict") == "PARTIAL":
        reasons += [r for w in (record.get("workloads") or {}).values() for r in w.get("invalid_reasons") or []]
    return reasons


def invalid_codes(reasons: list[str]) -> list[str]:
    """One code per duplex invalid reason: "partial", "dirty_tree", "short_run", and "mismatch" for any
    other (a workload's reasons all compare bytes; an unknown reason counts as one, so it fails)."""
    def code(reason: str) -> str:
        if reason == NOT_FINISHED:
            return "partial"
        if reason == DIRTY_TREE:
            return "dirty_tree"
        return "short_run" if reason.endswith(SHORT_RUN) else "mismatch"
    return [code(r) for r in reasons]


def max_zero_miss(runs: list[dict]) -> int | None:
    """Largest N such that every run with N' <= N had zero misses (None if the smallest already missed)."""
    best = None
    for r in sorted(runs, key=lambda r: r["sessions"]):
        if r.get("refused") or r["metrics"]["misses"]:
            break
        best = r["sessions"]
    return best


def _runs(record: dict):
    """Every run dict of a duplex record (workloads -> modes -> runs), skipping what is not shaped so."""
    for w in (record.get("workloads") or {}).values():
        for m in ((w or {}).get("modes") or {}).values() if isinstance(w, dict) else ():
            for run in (m or {}).get("runs") or () if isinstance(m, dict) else ():
                if isinstance(run, dict):
                    yield run


def pack_units(record: dict) -> dict:
    """A copy of a duplex record whose runs hold their units as one table {"columns", "rows", "interned"}:
    keys once per run, each distinct sha256 once per record in `unit_hashes` (rows hold its position); a
    row lacking a key holds null there. A run whose units are a table already is kept."""
    out = json.loads(json.dumps(jsonable(record)))
    hashes: dict[str, int] = {h: i for i, h in enumerate(out.get("unit_hashes") or [])}
    for run in _runs(out):
        units = run.get("units")
        if isinstance(units, list):
            cols = list(dict.fromkeys(k for u in units for k in u))
            interned = [c for c in cols if c in INTERNED_COLUMNS]
            rows = [[(hashes.setdefault(u[c], len(hashes)) if c in interned and u.get(c) is not None else u.get(c))
                     for c in cols] for u in units]
            run["units"] = {"columns": cols, "rows": rows, "interned": interned}
    if hashes:
        out["unit_hashes"] = list(hashes)
    return out


def unpack_units(record: dict) -> dict:
    """In place: every run's unit table back to a list of {column: value} rows (interned columns resolved
    through `unit_hashes`, then dropped); a list (schema /1) is kept. Returns the record. Raises ValueError
    naming the run for a table not shaped as `pack_units` writes it."""
    hashes = record.get("unit_hashes", [])
    if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
        raise ValueError(f"'unit_hashes': expected a list of sha256 strings, got {json.dumps(hashes)[:60]}")
    for run in _runs(record):
        units = run.get("units")
        if units is None or isinstance(units, list):     # none: a refused run measured no unit
            continue
        where = f"run N={run.get('sessions')} {run.get('mode')}: 'units'"
        if not isinstance(units, dict):
            raise ValueError(f"{where}: expected a table {{'columns', 'rows', 'interned'}} or a list of rows, "
                             f"got {type(units).__name__}")
        cols, rows, interned = units.get("columns"), units.get("rows"), units.get("interned")
        if (not isinstance(cols, list) or not all(isinstance(c, str) for c in cols) or len(set(cols)) != len(cols)):
            raise ValueError(f"{where}: 'columns': expected distinct strings, got {json.dumps(cols)[:60]}")
        if (not isinstance(interned, list) or not all(isinstance(c, str) for c in interned)
                or not set(interned) <= set(cols) & set(INTERNED_COLUMNS)):
            raise ValueError(f"{where}: 'interned': expected a list of columns among {list(INTERNED_COLUMNS)}, "
                             f"got {json.dumps(interned)[:60]}")
        if not isinstance(rows, list) or any(not isinstance(r, list) or len(r) != len(cols) for r in rows):
            raise ValueError(f"{where}: expected {{'columns': [...], 'rows': [[one value per column], ...]}}")
        at = [i for i, c in enumerate(cols) if c in interned]
        out = []
        for r in rows:
            row = list(r)
            for i in at:
                if row[i] is not None:
                    if type(row[i]) is not int or not 0 <= row[i] < len(hashes):
                        span = f"0-{len(hashes) - 1}" if hashes else "none: unit_hashes is empty or missing"
                        raise ValueError(f"{where}: column {cols[i]!r} holds {row[i]!r}, expected a position in "
                                         f"unit_hashes ({span})")
                    row[i] = hashes[row[i]]
            out.append(dict(zip(cols, row)))
        run["units"] = out
    record.pop("unit_hashes", None)
    return record


def read_duplex(path: Path) -> dict:
    """A duplex.json with units as rows of objects. Raises OSError, ValueError (not JSON, a bad table)."""
    return unpack_units(json.loads(Path(path).read_text()))


def write_duplex(path: Path, record: dict) -> None:
    """Write a duplex record atomically (a process killed mid-write leaves the previous checkpoint), compact,
    each run's units as one table (`pack_units`)."""
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(pack_units(record), separators=(",", ":")))
    tmp.replace(path)


# --- the checkout and the registry ---------------------------------------------------------------------
def git(*args: str, cwd: Path = REPO_ROOT) -> str | None:
    """stdout of `git <args>` (stripped), or None outside a checkout or without git."""
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.rstrip("\n") if out.returncode == 0 else None


def registered() -> list[str]:
    """The registered workloads' names (a CUDA run's default plan covers them all)."""
    return list(workloads.names())


def architecture(name: str) -> str | None:
    """A registered workload's decoder architecture; None for a name not registered."""
    try:
        return workloads.get(name).architecture
    except KeyError:
        return None
