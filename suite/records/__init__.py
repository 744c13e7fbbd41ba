"""The records every harness writes and the report reads: schemas, reading and writing, and the constants
a report needs. Nothing here measures anything or imports torch; `suite.report` imports this module only.

* run records (`run.json`, schema RUN_SCHEMA): one verify or one-mode session run, `UnitRecord` per unit;
* duplex records (`duplex.json`, DUPLEX_SCHEMA): per workload and mode the search's counts and bracket, each
  count's run (sessions' script sources and join times, per-session graph and capture figures) with its units
  as one table (`pack_units`);
* stage state (`stages.json`, STAGES_SCHEMA): `StageState` per stage, checked by `check_stages`.
Keys carry their units (`tail_ms_p50`, `peak_alloc_mib`). Older records stay readable: duplex schema /1
(units as a list of objects) and /2 (one shared script, a fixed list of counts), stage entries of harnesses
this version does not plan (`legacy`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf

import workloads
# stage state lives in suite.records.stages; its names are importable from here too (noqa: F401)
from suite.records.stages import (  # noqa: F401
    DEFAULT_HARNESSES, DUPLEX_STAGES, EXIT_INVALID, EXIT_UNAVAILABLE, HARNESS_MODE, HARNESSES, OPTIONAL_HARNESSES,
    STAGE_TIMESPEC, STAGES_SCHEMA, STATUSES, TIMED_HARNESSES, StageState, StateError, check_stages, device_type,
    family, instant, overlapping, read_stages, unselected, utc_now)

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_SCHEMA = "duplexcadence.run/1"
#: A paired verify record (suite.measure.verify): run/1's fields plus `paired` (suite.records.paired).
VERIFY_SCHEMA = "duplexcadence.verify/1"
#: A drop-in speed record (suite.measure.dropin): the stock call's loop against the drop-in's, paired.
DROPIN_SCHEMA = "duplexcadence.dropin/1"
DUPLEX_SCHEMA = "duplexcadence.duplex/3"
DUPLEX_READ_SCHEMAS = ("duplexcadence.duplex/1", "duplexcadence.duplex/2", DUPLEX_SCHEMA)
SAMPLE_RATE = 24000                 # every UnitOutput is @ 24 kHz (duplexcadence.session)
UNIT_PERIOD_S = 1.0                 # the duplex cadence: one unit per second

#: The published DuplexCadence figures (one H200, MiniCPM-o 4.5 at 10 Euler steps, released weights, whole
#: SPEAK unit), and the one configuration they were measured on (`published_for`).
PUBLISHED = {"speedup_x": 2.85, "peak_memory_change_pct": -38.8,
             "speak_vs_period_pct_stock": 14.0, "speak_vs_period_pct_cadence": -2.0}
PUBLISHED_MODEL = "MiniCPM-o 4.5"
PUBLISHED_STEPS = 10
#: A duplex record whose parameters.traffic is this ran every session on a script of its own, unseen before
#: its units arrived (workloads.traffic); any other record played one shared script.
UNSEEN_TRAFFIC = "voxconverse"

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


def read_dropins(folder: Path) -> list[dict]:
    """The drop-in records (DROPIN_SCHEMA) in `folder` (its dropin_*.json), by name; [] for none."""
    found = [read_json(p) for p in sorted(Path(folder).glob("dropin_*.json"))]
    return [r for r in found if r and r.get("schema") == DROPIN_SCHEMA]


def headline(memory: dict) -> tuple[str, float | None]:
    """(key, MiB) of the memory figure compared between modes: the session's peak over the idle baseline,
    driver level on CUDA, RSS on CPU."""
    for key in ("peak_over_idle_driver_mib", "peak_over_idle_rss_mib"):
        if key in memory:
            return key, memory[key]
    return "none", None


# --- stress records -------------------------------------------------------------------------------------
#: stress.json (suite.measure.stress): sessions opening, speaking and closing on many threads, against each alone
STRESS_SCHEMA = "duplexcadence.stress/1"


# --- duplex records ------------------------------------------------------------------------------------
MIN_SECONDS = 60.0                          # zero misses are claimed over 60 s runs
NOT_FINISHED = "run not finished"           # the reason of a checkpoint (verdict PARTIAL)
DIRTY_TREE = "dirty tree: uncommitted changes (see provenance.git_status)"
SHORT_RUN = "max zero-miss sessions is over a shorter run"
CAPTURE_IN_UNIT = "graph capture(s) inside timed units"    # the end of a reason: "<mode> N=<n>: <k> " + this
#: Per-unit columns stored once per record (`unit_hashes`) and referred to by position.
INTERNED_COLUMNS = ("sha256_f32", "sha256_pcm16")


def record_reasons(record: dict) -> list[str]:
    """A duplex record's invalid reasons; a checkpoint's (PARTIAL) include its workloads' reasons so far."""
    reasons = list(record.get("invalid_reasons") or [])
    if record.get("verdict") == "PARTIAL":
        reasons += [r for w in (record.get("workloads") or {}).values() for r in w.get("invalid_reasons") or []]
    return reasons


def invalid_codes(reasons: list[str]) -> list[str]:
    """One code per duplex invalid reason: "partial", "dirty_tree", "short_run", "capture_in_timed_unit", and
    "mismatch" for any other (a workload's other reasons compare bytes; an unknown reason counts as one, so it
    fails)."""
    def code(reason: str) -> str:
        if reason == NOT_FINISHED:
            return "partial"
        if reason == DIRTY_TREE:
            return "dirty_tree"
        if reason.endswith(CAPTURE_IN_UNIT):
            return "capture_in_timed_unit"
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


def speak_per_second(units: list[dict], period_s: float = 1.0) -> float | None:
    """SPEAK units that made audio (samples not 0; a unit without the column counts) per second of a duplex
    run with every session active: per session (`session`; units without one are one session) its units with
    audio over its own span, its first release to one period after its last (`release_ms`), summed over the
    sessions (they join at different times, so the run's whole span would dilute the rate). None without
    released units."""
    spans: dict = {}
    for u in units:
        if isinstance(u, dict) and u.get("release_ms") is not None:
            audio = (u.get("kind") == "SPEAK" and u.get("service_ms") is not None and u.get("samples", 1) != 0)
            lo, hi, n = spans.get(u.get("session"), (u["release_ms"], u["release_ms"], 0))
            spans[u.get("session")] = (min(lo, u["release_ms"]), max(hi, u["release_ms"]), n + audio)
    if not spans:
        return None
    return sum(n / ((hi - lo) / 1000 + period_s) for lo, hi, n in spans.values())


def _runs(record: dict):
    """Every run dict of a duplex record (workloads -> modes -> runs), skipping what is not shaped so."""
    for w in (record.get("workloads") or {}).values():
        for m in ((w or {}).get("modes") or {}).values() if isinstance(w, dict) else ():
            runs = m.get("runs") if isinstance(m, dict) else None
            for run in runs if isinstance(runs, list) else ():
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


def published_for(workload: dict | None, steps: int | None) -> bool:
    """True when a workload (a record's `workload`, or the registry's as a dict) at `steps` Euler steps is the
    configuration the published figures were measured on: PUBLISHED_MODEL at PUBLISHED_STEPS."""
    return bool(workload) and workload.get("model") == PUBLISHED_MODEL and steps == PUBLISHED_STEPS


def registry_workload(name: str) -> dict | None:
    """A registered workload's model, architecture and Euler steps as a dict; None for a name not registered."""
    try:
        w = workloads.get(name)
    except KeyError:
        return None
    return {"name": w.name, "model": w.model, "architecture": w.architecture, "euler_steps": w.euler_steps}


def verify_protocol(record: dict | None) -> str | None:
    """How a verify record timed its speedup: "paired" (VERIFY_SCHEMA: pairs over processes), "rounds" (timing
    rounds in one process, older records), "units" (one round: only a unit band), None without a comparison."""
    comp = (record or {}).get("comparison")
    if not comp:
        return None
    if record.get("schema") == VERIFY_SCHEMA or comp.get("protocol") == "paired":
        return "paired"
    return "rounds" if len(comp.get("rounds") or []) >= 2 else "units"
