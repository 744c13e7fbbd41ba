"""The staged, resumable reproduction: which stages there are, their state on disk, running them in budget.

A **stage** is one harness on one workload, run in a process of its own (`suite.stage_run`, or the
harness's own module), with a time budget. Stage names are `<workload>.<harness>`:

* `verify`: `suite.runner.verify`, stock then cadence on one model instance, per-unit sha256 compared
  (speedup, bitwise equality). Writes `run.json`, `REPORT.md`, `audio_*.wav` (suite.report).
* `memory_stock`, `memory_cadence`: `suite.runner.run_workload` of ONE mode in a fresh process (model
  built, one session): driver-level peak over the idle baseline, so VMM mappings, weights and graph pools
  all count; per-session increment = peak with one session - the model-loaded sample (suite.memory).
  Writes `run.json`, `REPORT.md`.
* `duplex_stock`, `duplex_cadence`: `python -m suite.duplex --modes <mode> --workload W --device D --out DIR`
  (issue 7: SPEAK time against the 1 s cadence, sessions per GPU), ONE mode per stage so that each fits a
  sitting (a lent GPU runs one command for at most 600 s); the counts and policy per mode and workload are
  `DUPLEX_SESSIONS`. Writes `duplex.json` (schema duplexcadence.duplex/2) and plots. `suite.claims` joins
  the two modes' records with `suite.duplex_merge.merge` (stock == cadence recomputed from the one-session
  runs); while only one is done the report shows that mode and the other's status. A duplex stage is
  `done` when its harness ran to the end, whatever the verdict of its duplex.json (suite.duplex exits
  `EXIT_INVALID` for an INVALID record, as a verify stage's INVALID run.json); it is `failed` when the
  process crashed or timed out, its duplex.json then PARTIAL (the runs measured before, still reported).

All write into `<run dir>/<stage name>/`, plus `log.txt` (the process's output).

A stage that cannot run here is **skipped with its reason** (a harness module that is not there yet, a
workload variant its adapter does not implement, a mode the adapter does not declare); skipped stages are
checked again on every run. State lives in `<run dir>/stages.json` (`State`): per stage its status
(`done` | `failed` | `skipped` | `pending`; `running` while its process runs), seconds, attempts, return
code, reason, the stage's verdict (run.json's, or duplex.json's: VALID / INVALID / PARTIAL) with its invalid
reasons, codes and byte mismatches, and provenance (command, git rev, impl/ tree, the GPU it ran on, its
started_utc / ended_utc to the millisecond, and `overlapped`: the stages whose times overlapped its own,
derived from the recorded times when it ended, `overlapping`); per sitting the command, budget, GPUs and
where it stopped. `--resume` keeps `done` stages and reruns `failed` and `pending` ones; a sitting
stops cleanly (state saved, remaining stages `pending`) when what is left of `--budget-s` is less than
the next stage is expected to need (its budget, or 1.5x the slowest done stage of its family once one has
run). The first stage of a sitting always starts; every stage's timeout is its budget cut to what is left.

**Several GPUs of one host** (`--gpus 0,1`, `run_plan(gpus=...)`): stages still start in plan order, up to
one per GPU at a time, each process pinned with CUDA_VISIBLE_DEVICES (it sees its GPU as `cuda`), each
waited on by a thread of its own; the budget rules above hold per stage as it starts. The stages of a
timed harness (`TIMED_HARNESSES`: verify, duplex_stock, duplex_cadence) run alone: one starts when no
other stage runs, and none starts while it runs (the stages after it wait: plan order is kept). Their
host-bound cadence figures are slower beside a stage on the other GPU (MiniCPM-o's tail 137.2 ms p50
against 103.7-105.9 ms alone on the H200); the memory stages measure per-GPU device memory and may run
side by side. Without `--gpus`, one stage at a time and CUDA_VISIBLE_DEVICES as it is. The GPUs are a
property of the sitting, not of the run (not in `options`): a run started on one GPU can be resumed on two.

**Legacy entries**: a stages.json written by an older version may hold a stage whose harness is not in
`HARNESSES` any more (the single `<workload>.duplex` stage, both modes in one process, before it was split
per mode). It is left as recorded: never run, never removed, out of the counts and the estimates;
`python -m suite.reproduce --list` names it, and `suite.claims` still reads a done one's duplex.json when
the per-mode stages have not run.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

SCHEMA = "duplexcadence.stages/1"
HARNESSES = ("verify", "memory_stock", "memory_cadence", "duplex_stock", "duplex_cadence")
#: The harnesses whose figures are times: with several GPUs (run_plan(gpus=...)) their stages run alone on
#: the host. DuplexCadence's tail is host-bound (kernel launches, Python), and a stage running on the
#: host's other GPU slows it: MiniCPM-o cadence tail 137.2 ms p50 beside a memory stage
#: (results/2026-11-30-h200-reproduce-3/, sitting 1, --gpus 0,1) against 103.7 ms alone
#: (results/2026-11-30-h200-reproduce-3-second/) and 105.9 ms (results/2026-11-30-h200-duplex-60s-e/call1);
#: Step-Audio 2 87.2 against 79.9 and 81.3 ms; Moshi 23.2 against 23.4 ms (unaffected). The memory stages
#: measure device memory per GPU (nvml), which a neighbour on another GPU does not change: they may run
#: side by side.
TIMED_HARNESSES = frozenset({"verify", "duplex_stock", "duplex_cadence"})
STATUSES = ("done", "failed", "skipped", "pending", "running")   # running: only while its process runs
#: The harnesses a run selects by default on each device type (`make reproduce` without --stages): all of
#: them on CUDA; verify alone on the CPU (a check of the pipeline and of bit-exactness, suite.reproduce).
#: A CUDA run folder is complete when every registered workload has them all (`unselected`).
DEFAULT_HARNESSES = {"cuda": HARNESSES, "cpu": ("verify",)}
#: Per-stage time budget in seconds (the stage's process is killed past it), by device type. verify and
#: memory: upper bounds chosen so that two or three stages fit one sitting of a 10-minute command (done
#: H200 stages took 24-58 s: results/2026-11-30-h200-reproduce*/stages.json). duplex: one stage fills a
#: sitting of its own (560 s of a 600 s command; pass --budget-s >= 560 or its timeout is cut), see
#: DUPLEX_SESSIONS. stages.json records every stage's seconds; tighten with --stage-budget-s. CPU: 2 cores,
#: released config, 4 SPEAK units (the CPU default verify took about 4 minutes on 2 idle cores; the budget
#: allows a shared machine).
BUDGET_S = {
    "cuda": {"verify": 300, "memory_stock": 180, "memory_cadence": 180, "duplex_stock": 560,
             "duplex_cadence": 560},
    "cpu": {"verify": 1800, "memory_stock": 1200, "memory_cadence": 1200, "duplex_stock": 1800,
            "duplex_cadence": 1800},
}
#: Timing rounds of a verify stage by device type (suite.runner.verify: each further round a fresh session
#: per mode, alternating order, every unit compared again): the report's speedup is the median of the rounds
#: and its noise their spread. 3 on CUDA: MiniCPM-o's 10-step verify took 87-88 s with 3 rounds on the H200
#: (results/2026-11-30-h200-reproduce-4*/stages.json) and 103.8 / 132.2 s with the profile pass after them
#: (results/2026-11-30-h200-reproduce-5*/stages.json, the second on a slower host): inside verify's 300 s.
#: 1 on the CPU (the default CPU reproduction runs 4 units at ~1 minute per unit per mode).
VERIFY_ROUNDS = {"cuda": 3, "cpu": 1}
ESTIMATE_MARGIN = 1.5                   # a stage is expected to take up to 1.5x its family's slowest done stage
#: The duplex stages: tail only (AR none), 60 s per session count (issue 7), stop after a count's first miss.
DUPLEX_SECONDS = 60
#: suite.duplex arguments per mode and workload ("default": any other workload). Each list is sized to fit the
#: 560 s budget, from the H200 timings of results/2026-11-30-h200-duplex-60s*/ (gpu*.log, duplex.json): a process
#: builds the model (~20 s), then per count N runs 60 s; MiniCPM-o DuplexCadence sessions are pooled across the
#: counts of one process and each needed ~9 s of warm-up (graph rehearsal) when first built, ~5 s at 5175f96
#: (1,24,26 took 333.6 s in reproduce-8) and ~3.6 s for 5 steps at 47504c7 (1,24,32 took 315.5 s in
#: reproduce-9), but ~6.3 s for 10 steps at 47504c7 (1,20,24,26 took 424.8 s in reproduce-9-third); the fit test
#: allows 7 s: counts 1,24,25 build 25 sessions, ~175 s + 3 x 60 s + 20 s ~ 375 s
#: (the old 1,16,24,32 at 9 s ran out of 60s-b's limit at 32); stock MiniCPM-o sessions build in ~1-2 s each (a
#: model copy each: 1,2,3,4 is 10 sessions + 4 x 60 s); Moshi and Qwen3-Omni DuplexCadence sessions are built
#: per run at ~1 s each or less (Moshi 1,16,32,48 took 268.8 s in reproduce-9); Step-Audio 2 DuplexCadence
#: sessions are built per run and rehearse their script's turns (~8.8 s each in reproduce-9: 1,2,4,8 took
#: 392.3 s; the fit test allows 10 s: 1,8,16 is ~250 s + 3 x 60 s).
#: Policies: the one that served each mode best on the H200 (MiniCPM-o DuplexCadence on threads, stock on one
#: thread, edf; suite.duplex's default edf elsewhere). The resulting `max_zero_miss_sessions` is a LOWER BOUND
#: (the largest count tried with zero misses), not the exact limit where the counts skip values, and
#: suite.duplex's --bisect, which finds the exact limit, is not used here (its extra 60 s runs would not fit the
#: 560 s).
DUPLEX_SESSIONS = {
    "stock": {
        "minicpmo45": ["--sessions", "1,2,3,4", "--policy", "edf"],       # H200: 2 with zero misses, 3 missed
        # H200: 0 misses at 6 (largest tried, results/2026-11-30-h200-reproduce-8, impl 5175f96), then 2 clean
        # and 4 missed 4/164 (reproduce-9, 47504c7): stock's host-bound time moves; every count up to 6
        "minicpmo45_5step": ["--sessions", "1,2,3,4,6", "--policy", "edf"],
        # H200: 4 clean, 8 missed 453/480 (reproduce-8) and 469/480 (reproduce-9): the counts between
        "moshi": ["--sessions", "1,4,5,6,7"],
        # H200 (reproduce-9): Step-Audio 2 2 clean, 4 missed 26/164 -> 3 decides; Qwen3-Omni 4 clean (largest
        # tried, 21 ms per unit, edf one at a time)
        "stepaudio2_mini": ["--sessions", "1,2,3"],
        "qwen3_omni": ["--sessions", "1,8,16,32"],
        "default": ["--sessions", "1,2,4"],
    },
    "cadence": {
        # H200: 26 missed 21/1066 (-e, impl d4464c0) and 4/1066 (reproduce-7, 5cf9e70), then 0/1066 with the
        # stream leases' finalizer queue (reproduce-8, 5175f96), and 46/1066 again at 47504c7 (reproduce-9,
        # misses 10-25 s into the run), then 24 clean (0/984) and 26 16/1066 at 47504c7 (reproduce-9-third):
        # 25 decides the limit
        "minicpmo45": ["--sessions", "1,24,25", "--policy", "threads"],
        # H200: 0 misses at 32 (largest tried, results/2026-12-01-h200-reproduce-9, 315.5 s): 40 next
        "minicpmo45_5step": ["--sessions", "1,32,40", "--policy", "threads"],
        # H200: 32 with zero misses, 48 missed 2617/2880 (reproduce-9; a unit takes ~24.5 ms and edf runs one
        # at a time, so ~40 fit a second): the counts between
        "moshi": ["--sessions", "1,32,36,40"],
        # H200: Step-Audio 2 rehearsed 0 misses at 8 (largest tried, reproduce-9, 392.3 s); Qwen3-Omni 0 misses
        # at 32 (largest tried, reproduce-9, 272.8 s; 7.7 ms per unit)
        "stepaudio2_mini": ["--sessions", "1,8,16"],
        "qwen3_omni": ["--sessions", "1,32,64,96"],
        "default": ["--sessions", "1,2,4,8"],
    },
}
DUPLEX_MODULE = "suite.duplex"          # issue 7's harness
LOG_TAIL_LINES = 20


def utc_now(timespec: str = "seconds") -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec=timespec)


#: A stage attempt's started_utc / ended_utc: to the millisecond, so that `overlapping` can tell a stage
#: that started as another ended from one that ran beside it (older stages.json files hold whole seconds).
STAGE_TIMESPEC = "milliseconds"


# --- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """One harness on one workload. skip: why it cannot run here (None: it can)."""
    workload: str
    harness: str                     # one of HARNESSES
    budget_s: float                  # wall-clock limit of the stage's process, seconds
    skip: str | None = None

    @property
    def name(self) -> str:
        return f"{self.workload}.{self.harness}"

    @property
    def mode(self) -> str | None:
        """The one mode a memory or duplex stage runs ("stock" | "cadence"), else None."""
        return self.harness.split("_", 1)[1] if "_" in self.harness else None


def family(harness: str) -> str:
    """'memory_stock' -> 'memory', 'duplex_cadence' -> 'duplex'; other harnesses are their own family."""
    return harness.split("_")[0]


def harness_present(module: str) -> bool:
    """True if `module` can be imported (find_spec; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def skip_reason(workload, harness: str) -> str | None:
    """Why `harness` cannot run `workload` here, or None. Imports the workload's adapter module."""
    from duplexcadence import runtime
    from suite import runner

    if workload.architecture not in runtime.ADAPTERS:
        return f"no adapter for architecture {workload.architecture!r} (duplexcadence.runtime.ADAPTERS)"
    adapter = runtime.adapter(workload.architecture)
    variant = (workload.spec or {}).get("variant")
    if variant is not None and variant not in getattr(adapter, "VARIANTS", ()):
        return (f"adapter {adapter.__name__} does not implement the {variant!r} variant yet "
                f"(adapter.VARIANTS); running it would run another model's path")
    if harness in ("verify", "memory_cadence", "duplex_cadence") and not runner.supports_cadence(adapter):
        return f"adapter {adapter.__name__} has no cadence mode"
    if family(harness) == "duplex" and not harness_present(DUPLEX_MODULE):
        return f"harness {DUPLEX_MODULE} is not importable here (issue 7: SPEAK vs cadence, sessions per GPU)"
    return None


def device_type(device: str) -> str:
    """'cuda', 'cuda:1' -> 'cuda'; anything else -> 'cpu' (the keys of BUDGET_S and DEFAULT_HARNESSES)."""
    return "cuda" if device == "cuda" or str(device).startswith("cuda:") else "cpu"


def unselected(state_data: dict, workload_names: list[str] | None = None) -> list[str]:
    """The stages of the default plan that a run folder has never selected, in plan order: per workload
    with a stage in stages.json (and per name in workload_names: on CUDA every registered workload), each
    harness of DEFAULT_HARNESSES[its device type] without an entry. A stage is only in stages.json once a
    sitting selected it (`--stages`), so without this a folder whose sittings never named a stage would
    read complete. Only a CUDA folder is judged so (the reproduction); a CPU folder is a check of the stages
    its sittings selected, and none is missing from it. state_data: stages.json's content (`State.data`)."""
    kind = device_type((state_data.get("options") or {}).get("device", "cpu"))
    if kind != "cuda":
        return []
    have = state_data.get("stages") or {}
    names = list(dict.fromkeys([*(workload_names or []), *(st.get("workload") for st in have.values()
                                                           if st.get("harness") in HARNESSES)]))
    done = {(st.get("workload"), st.get("harness")) for st in have.values()}
    return [f"{w}.{h}" for w in names for h in DEFAULT_HARNESSES[kind] if (w, h) not in done]


def plan(workload_names: list[str], harnesses: list[str], device_type: str, *,
         stage_budget_s: float | None = None) -> list[Stage]:
    """The stages for these workloads x harnesses, workload-major, each with its budget and skip reason.
    Raises KeyError for an unknown workload, ValueError for an unknown harness or device type."""
    import workloads

    bad = [h for h in harnesses if h not in HARNESSES]
    if bad:
        raise ValueError(f"harness {bad}: expected some of {list(HARNESSES)}")
    if device_type not in BUDGET_S:
        raise ValueError(f"device type {device_type!r}: expected one of {list(BUDGET_S)}")
    out = []
    for name in workload_names:
        wl = workloads.get(name)
        for h in harnesses:
            budget = stage_budget_s if stage_budget_s is not None else BUDGET_S[device_type][h]
            out.append(Stage(name, h, float(budget), skip_reason(wl, h)))
    return out


def select(stages: list[Stage], patterns: list[str] | None) -> list[Stage]:
    """The stages any pattern names: an fnmatch glob on the stage name (`minicpmo45.*`, `*.memory_*`), or
    a workload, harness or harness family (`memory`, `duplex`) given alone. None or [] selects all.
    Raises ValueError naming a pattern that selects nothing."""
    if not patterns:
        return list(stages)

    def hit(st: Stage, p: str) -> bool:
        return fnmatch.fnmatchcase(st.name, p) or p in (st.workload, st.harness) or family(st.harness) == p

    empty = [p for p in patterns if not any(hit(s, p) for s in stages)]
    if empty:
        raise ValueError(f"--stages {empty}: no stage matches; stages are "
                         f"{[s.name for s in stages]} (globs, workload or harness names)")
    return [s for s in stages if any(hit(s, p) for p in patterns)]


# --- state on disk -------------------------------------------------------------------------------
@dataclass
class StageState:
    """What stages.json holds for one stage. seconds: wall time of the last attempt."""
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
    dir: str | None = None           # relative to the run dir
    #: the stage record's VALID / INVALID (run.json; duplex.json of a duplex stage, PARTIAL when its
    #: process ended before the harness did); None without a record
    verdict: str | None = None
    invalid_reasons: list = field(default_factory=list)
    invalid_codes: list = field(default_factory=list)
    #: bytes that differ: verify's unit indices; a duplex stage's sessions that differ from themselves alone
    mismatched_units: list = field(default_factory=list)
    git_rev: str | None = None       # of the sitting that ran it
    impl_tree: str | None = None
    gpu: int | None = None           # the --gpus index its last attempt ran on (None: not pinned)
    #: the stages that ran at the same time as its last attempt (`overlapping`, when it ended); None: not
    #: recorded (it has not ended, or an older version ran it: suite.claims derives it from the times)
    overlapped: list | None = None
    log_tail: list = field(default_factory=list)


class StateError(ValueError):
    """stages.json cannot be used as asked (wrong schema, other options, an existing state without resume)."""


def check_data(data, path) -> None:
    """Raises StateError naming `path` if a stages.json's content is not shaped as State reads it: an object,
    `stages` an object of objects with a workload and a harness, only StageState's fields and a known
    status each, a stage's `dir` (None or the stage's own name, a plain folder inside the run folder: join
    copies and replaces it) and its numbers (seconds, budget_s, timeout_s: a number or None), `sittings` a list of
    objects."""
    if not isinstance(data, dict):
        raise StateError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise StateError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    if not isinstance(data.get("stages", {}), dict):
        raise StateError(f"{path}: 'stages': expected an object, got {type(data['stages']).__name__}")
    if not isinstance(data.get("sittings", []), list):
        raise StateError(f"{path}: 'sittings': expected a list, got {type(data['sittings']).__name__}")
    bad = next((s for s in data.get("sittings", []) if not isinstance(s, dict)), None)
    if bad is not None:
        raise StateError(f"{path}: 'sittings': expected a list of objects, got an item {json.dumps(bad)[:40]}")
    opts = data.get("options")
    if not isinstance(opts, dict) or not isinstance(opts.get("device"), str):
        # the device decides what the run is judged against (`unselected`): without it a CUDA run read complete
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


class State:
    """`<run dir>/stages.json`: options, sittings and per-stage states. `save()` writes atomically, one
    save at a time (a lock: several stages may be in flight)."""

    def __init__(self, run_dir: Path, data: dict):
        self.run_dir = Path(run_dir)
        self.data = data
        self.stages: dict[str, StageState] = {k: StageState(**v) for k, v in data.get("stages", {}).items()}
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.run_dir / "stages.json"

    @classmethod
    def open(cls, run_dir: Path, options: dict, *, resume: bool) -> "State":
        """Load run_dir/stages.json (resume) or start a new one (also with resume, when there is none yet,
        so one command serves every sitting). Raises StateError if a state is there without resume, or if
        its options differ from `options`."""
        path = Path(run_dir) / "stages.json"
        if not path.exists():         # --resume on a new folder starts it: one command for every sitting
            return cls(run_dir, {"schema": SCHEMA, "created_utc": utc_now(), "options": options,
                                 "sittings": [], "stages": {}, "compare": []})
        if not resume:
            raise StateError(f"{path} exists: pass --resume to continue that reproduction, or another "
                             f"--run-dir")
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:                   # JSONDecodeError, UnicodeDecodeError
            raise StateError(f"{path}: not JSON ({exc})") from None
        check_data(data, path)
        for st in data.get("stages", {}).values():
            if st.get("status") == "running":    # the sitting ended (killed) while this stage ran
                st["status"], st["reason"] = "failed", "interrupted: the sitting ended while this stage ran"
        if data.get("schema") != SCHEMA:
            raise StateError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
        if data.get("options") != options:
            diff = {k: (data.get("options", {}).get(k), options.get(k))
                    for k in sorted(set(data.get("options", {})) | set(options))
                    if data.get("options", {}).get(k) != options.get(k)}
            raise StateError(f"{path}: started with other options (recorded, given): {diff}; resume with the "
                             f"same options or use another --run-dir")
        return cls(run_dir, data)

    def save(self) -> None:
        with self._lock:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.data["stages"] = {k: asdict(v) for k, v in self.stages.items()}
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.data, indent=1) + "\n")
            os.replace(tmp, self.path)

    def get(self, stage: Stage) -> StageState:
        st = self.stages.get(stage.name)
        if st is None:
            st = self.stages[stage.name] = StageState(stage.workload, stage.harness)
        return st

    def counts(self) -> dict:
        """Stages per status, legacy entries left out."""
        out = {s: 0 for s in STATUSES}
        for st in self.stages.values():
            if st.harness in HARNESSES:
                out[st.status] = out.get(st.status, 0) + 1
        return out

    def legacy(self) -> dict[str, StageState]:
        """Entries whose harness this version does not plan (an older version's stage), by stage name."""
        return {name: st for name, st in self.stages.items() if st.harness not in HARNESSES}


# --- running -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one attempt of a stage came to. status: "done" | "failed" | "skipped"."""
    status: str
    returncode: int | None = None
    reason: str = ""
    command: list = field(default_factory=list)
    log_tail: list = field(default_factory=list)


#: Runs one stage: (stage, stage dir, timeout s, options, *, gpu) -> Outcome. gpu: the --gpus index to pin
#: the stage to, or None (not pinned). Called from a worker thread when run_plan has gpus.
Executor = Callable[..., Outcome]


def _load(run_dir: Path) -> dict:
    path = Path(run_dir) / "stages.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise StateError(f"{path}: no stages.json (expected a reproduction's run folder)") from None
    except ValueError as exc:
        raise StateError(f"{path}: not JSON ({exc})") from None
    except OSError as exc:                      # a file given for the folder, no permission
        raise StateError(f"{path}: cannot read ({exc.strerror or exc}; expected a run folder's "
                         f"stages.json)") from None
    check_data(data, path)                      # the schema too
    return data


def join(run_dir: Path, others: list[Path]) -> State:
    """Join into `run_dir` the stages that other run folders of the SAME reproduction ran: sittings on
    different machines, or on a lent machine that starts each call from a fresh copy without the folder of
    the sittings before. Every folder's recorded options must equal run_dir's (a new run_dir takes the
    first folder's). A stage that is done, failed or skipped in another folder and not done in run_dir is
    taken over with its folder (copied; run_dir's own attempt's folder replaced); a stage done in both
    raises StateError (two results for one stage: keep one by hand), as does a folder that is run_dir.
    The sittings are concatenated in order of their start (each joined one gains `joined_from`).
    Nothing is written unless every folder passes the checks. Returns the saved State."""
    import shutil

    run_dir = Path(run_dir)
    others = [Path(o) for o in others]
    if not others:
        raise StateError("join: expected at least one run folder to join")
    loaded = [(o, _load(o)) for o in others]
    if (run_dir / "stages.json").exists():
        data = _load(run_dir)
    else:
        first = loaded[0][1]
        data = {"schema": SCHEMA, "created_utc": first.get("created_utc", utc_now()), "options": first["options"],
                "sittings": [], "stages": {}, "compare": list(first.get("compare", []))}
    taken: dict[str, tuple[Path, dict]] = {}
    for other, od in loaded:
        if other.resolve() == run_dir.resolve():
            raise StateError(f"join: {other} is the run folder itself")
        if od.get("options") != data.get("options"):
            diff = {k: (data["options"].get(k), od["options"].get(k))
                    for k in sorted(set(data["options"]) | set(od["options"]))
                    if data["options"].get(k) != od["options"].get(k)}
            raise StateError(f"join: {other}/stages.json was started with other options (ours, theirs): {diff}")
        for name, st in od.get("stages", {}).items():
            if st.get("status", "pending") in ("pending", "running"):
                continue
            ours = taken.get(name, (None, data["stages"].get(name)))[1]
            if ours and ours.get("status") == "done":
                if st.get("status") == "done":
                    where = taken[name][0] if name in taken else run_dir
                    raise StateError(f"join: stage {name!r} is done in both {where} and {other}; keep one")
                continue
            taken[name] = (other, st)
    for name, (other, st) in taken.items():      # every check before the first write
        if st.get("status") == "done" and st.get("dir") and not (other / st["dir"]).is_dir():
            raise StateError(f"join: stage {name!r} is done in {other} but its folder {other / st['dir']} is "
                             f"not there (a done stage's records live in it)")
        if not other.is_dir():
            raise StateError(f"join: {other}: expected a run folder")
    if run_dir.exists() and not run_dir.is_dir():
        raise StateError(f"join: --run-dir {run_dir}: expected a folder, got a file")
    for name, (other, st) in taken.items():
        data["stages"][name] = st
    for other, od in loaded:
        data["sittings"] += [{**s, "joined_from": str(other)} for s in od.get("sittings", [])]
    data["sittings"].sort(key=lambda s: s.get("started_utc") or "")
    data["created_utc"] = min([data.get("created_utc") or utc_now()]
                              + [od.get("created_utc") for _, od in loaded if od.get("created_utc")])
    # The folders are copied first, beside run_dir's own (.join-new-<stage>), then swapped in by renames,
    # ours set aside (.join-old-<stage>) until stages.json is saved: a failure puts run_dir back as it was.
    created = not run_dir.exists()
    staged: list[tuple[Path | None, Path, Path]] = []          # (new copy or None, our folder, ours set aside)
    swapped: list[tuple[Path | None, Path, Path]] = []

    def undo():
        for new, dst, old in reversed(swapped):
            if new is not None and (dst.exists() or dst.is_symlink()):
                dst.rename(new)
            if old.exists() or old.is_symlink():
                old.rename(dst)
        for new, _, _ in staged:
            if new is not None:
                shutil.rmtree(new, ignore_errors=True)
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.glob(".join-*"):                  # left by a join that was killed
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        for name, (other, st) in taken.items():
            if not st.get("dir"):
                continue
            src, dst = other / st["dir"], run_dir / st["dir"]
            new = run_dir / f".join-new-{st['dir']}" if src.is_dir() else None
            staged.append((new, dst, run_dir / f".join-old-{st['dir']}"))
            if new is not None:
                shutil.copytree(src, new, symlinks=True)
        for new, dst, old in staged:
            if dst.exists() or dst.is_symlink():
                dst.rename(old)
            swapped.append((new, dst, old))
            if new is not None:
                new.rename(dst)
        state = State(run_dir, data)
        state.save()
    except OSError as exc:
        undo()
        raise StateError(f"join: cannot put the stage folders into {run_dir} ({exc.strerror or exc}); "
                         f"nothing joined") from None
    for _, _, old in swapped:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        elif old.exists() or old.is_symlink():
            old.unlink()
    return state


def stage_argv(stage: Stage, out_dir: Path, options: dict) -> list[str]:
    """The module and arguments of a stage's process (after `python -m`).
    options: device, steps, seconds, max_speak_units, depth, seed, notes (the run's --options)."""
    if family(stage.harness) == "duplex":
        per_workload = DUPLEX_SESSIONS[stage.mode]
        argv = [DUPLEX_MODULE, "--workload", stage.workload, "--device", options["device"], "--modes", stage.mode,
                "--out", str(out_dir), "--ar", "none", "--seconds", str(DUPLEX_SECONDS), "--after-miss", "0",
                "--quiet", *per_workload.get(stage.workload, per_workload["default"])]
        if options.get("depth") and options["depth"] != "released":
            argv += ["--depth", options["depth"]]
        if options.get("steps"):
            argv += ["--steps", str(options["steps"])]
        return argv
    argv = ["suite.stage_run", stage.harness if stage.harness == "verify" else "mode",
            "--workload", stage.workload, "--device", options["device"], "--out", str(out_dir),
            "--depth", options.get("depth") or "released", "--no-progress"]
    if stage.mode:
        argv += ["--mode", stage.mode]
    else:
        rounds = options.get("rounds") or VERIFY_ROUNDS["cuda" if options["device"].startswith("cuda") else "cpu"]
        argv += ["--rounds", str(rounds)]
    for key in ("steps", "seconds", "max_speak_units", "seed"):
        if options.get(key) is not None:
            argv += [f"--{key.replace('_', '-')}", str(options[key])]
    for note in options.get("notes") or []:
        argv += ["--note", note]
    return argv


def _tail(text: str, n: int = LOG_TAIL_LINES) -> list[str]:
    return [line[:300] for line in text.splitlines()[-n:]]


def visible_device(gpu: int) -> str:
    """The CUDA_VISIBLE_DEVICES value that shows a stage only GPU `gpu`: this process's CUDA index `gpu`,
    i.e. entry `gpu` of its own CUDA_VISIBLE_DEVICES where that is set, else `gpu` itself. Raises ValueError
    if this process does not see that many GPUs."""
    own = os.environ.get("CUDA_VISIBLE_DEVICES")
    if own is None or not own.strip():
        return str(gpu)
    entries = [e.strip() for e in own.split(",")]
    if not 0 <= gpu < len(entries):
        raise ValueError(f"--gpus {gpu}: CUDA_VISIBLE_DEVICES={own!r} shows {len(entries)} GPU(s) to this process")
    return entries[gpu]


#: Process-group ids of the stage processes running now (each stage runs in a session of its own, so a
#: signal to the sitting does not reach it): `kill_live_stages` ends them when the sitting is stopped.
_LIVE_STAGES: set[int] = set()
_LIVE_LOCK = threading.RLock()          # reentrant: the handler may run in the thread that holds it
_STOPPING = threading.Event()           # set by kill_live_stages: no stage process starts after it


def kill_live_stages() -> list[int]:
    """SIGKILL the process group of every stage process running now; returns their ids. Called when the
    sitting itself is stopped (suite.reproduce's SIGTERM handler): a stage process outlived a `timeout`
    that killed the sitting and ran on for up to its budget (a helper's finding, 2026-12-01)."""
    killed = []
    with _LIVE_LOCK:                     # a stage between Popen and its registration is seen or not started
        _STOPPING.set()
        pgids = list(_LIVE_STAGES)
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        except ProcessLookupError:
            pass
    return killed


def subprocess_executor(stage: Stage, out_dir: Path, timeout_s: float, options: dict, *,
                        gpu: int | None = None) -> Outcome:
    """Run the stage as `python -m <argv>` from the repository root, in its own process group, output to
    out_dir/log.txt; killed (the whole group) at timeout_s. gpu: pin the process to that GPU
    (CUDA_VISIBLE_DEVICES = `visible_device(gpu)`; it sees it as `cuda`, device 0), named on log.txt's first
    line; None: the environment as it is. Exit 0: done; 4: skipped (the mode is not available,
    stage_run.EXIT_UNAVAILABLE); anything else, or the timeout: failed."""
    from suite import env

    out_dir = out_dir.resolve()                   # the child runs from the repository root
    argv = [sys.executable, "-m", *stage_argv(stage, out_dir, options)]
    child_env = dict(os.environ)
    roots = [str(env.REPO_ROOT / "impl"), str(env.REPO_ROOT)]
    child_env["PYTHONPATH"] = os.pathsep.join(roots + [p for p in child_env.get("PYTHONPATH", "").split(
        os.pathsep) if p and p not in roots])
    if gpu is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = visible_device(gpu)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "log.txt"
    with open(log, "w") as fh:
        if gpu is not None:
            fh.write(f"# stage {stage.name} on GPU {gpu} (CUDA_VISIBLE_DEVICES={child_env['CUDA_VISIBLE_DEVICES']})\n")
            fh.flush()
        proc = None
        try:
            with _LIVE_LOCK:
                if _STOPPING.is_set():
                    return Outcome("failed", None, "the sitting was stopped before this stage started", argv)
                proc = subprocess.Popen(argv, cwd=env.REPO_ROOT, env=child_env, stdout=fh,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                _LIVE_STAGES.add(proc.pid)
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)      # our own child's group, by its id
            proc.wait()
            return Outcome("failed", None, f"timed out after {timeout_s:.0f} s (killed); rerun with "
                           f"--resume and a larger --stage-budget-s", argv, _tail(log.read_text()))
        except BaseException:                        # Ctrl-C or the sitting's own exit: the stage goes too
            if proc is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            raise
        finally:
            if proc is not None:
                _LIVE_STAGES.discard(proc.pid)
    tail = _tail(log.read_text())
    if rc == 0:
        return Outcome("done", rc, "", argv, tail)
    from suite.stage_run import EXIT_UNAVAILABLE
    if rc == EXIT_UNAVAILABLE:
        return Outcome("skipped", rc, (tail[-1] if tail else "mode not available"), argv, tail)
    return Outcome("failed", rc, f"exit status {rc}: " + (tail[-1] if tail else "no output"), argv, tail)


def inline_executor(stage: Stage, out_dir: Path, timeout_s: float, options: dict, *,
                    gpu: int | None = None) -> Outcome:
    """Run a suite.stage_run stage in this process (tests: fake adapters registered in-process are seen).
    No timeout is enforced. The duplex stages are not run inline, nor a stage pinned to a GPU (failed,
    with the reason)."""
    from suite import stage_run

    argv = stage_argv(stage, out_dir, options)
    if argv[0] != "suite.stage_run":
        return Outcome("failed", None, f"{argv[0]} is not run inline", argv)
    if gpu is not None:
        return Outcome("failed", None, f"a stage run inline cannot be pinned to GPU {gpu} (one process)", argv)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        rc = stage_run.main(argv[1:])
    except Exception as exc:                       # a crash of the stage, recorded like a child's
        return Outcome("failed", None, f"{type(exc).__name__}: {exc}", argv)
    if rc == 0:
        return Outcome("done", rc, "", argv)
    if rc == stage_run.EXIT_UNAVAILABLE:
        return Outcome("skipped", rc, "mode not available", argv)
    return Outcome("failed", rc, f"exit status {rc}", argv)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_verdict(out_dir: Path, st: StageState) -> None:
    """The stage record's verdict, invalid reasons and codes, and what differs, into st (None and [] where
    there is no record). verify, memory: run.json (mismatched_units: unit indices). duplex: duplex.json,
    complete (VALID / INVALID) or a checkpoint (PARTIAL, with its runs' reasons so far:
    `suite.duplex.record_reasons`), codes by `suite.duplex.invalid_codes`, mismatched_units: the reasons
    that are about bytes (a session differing from the same session alone)."""
    st.verdict, st.invalid_reasons, st.invalid_codes, st.mismatched_units = None, [], [], []
    if family(st.harness) == "duplex":
        rec = _read_json(out_dir / "duplex.json")
        if rec is None:
            return
        from suite.duplex import invalid_codes, record_reasons
        st.verdict = rec.get("verdict")
        st.invalid_reasons = record_reasons(rec)
        st.invalid_codes = invalid_codes(st.invalid_reasons)
        st.mismatched_units = [r for r, c in zip(st.invalid_reasons, st.invalid_codes) if c == "mismatch"]
        return
    rec = _read_json(out_dir / "run.json")
    if rec is not None:
        st.verdict = rec.get("verdict")
        st.invalid_reasons = list(rec.get("invalid_reasons", []))
        st.invalid_codes = list(rec.get("invalid_codes", []))
        st.mismatched_units = list((rec.get("comparison") or {}).get("mismatched_units", []))


def _ran_to_the_end(stage: Stage, outcome: Outcome, st: StageState) -> bool:
    """A failed outcome that is a complete INVALID record, not a crash: a duplex stage whose process exited
    with suite.duplex's EXIT_INVALID and left duplex.json with verdict INVALID (st, read). A Python
    exception also exits 1, but leaves the last checkpoint (PARTIAL) or nothing (one while plotting, after
    the complete record, is taken as the end); a timeout or a signal has no such exit status."""
    if outcome.status != "failed" or family(stage.harness) != "duplex" or st.verdict != "INVALID":
        return False
    from suite.duplex import EXIT_INVALID
    return outcome.returncode == EXIT_INVALID


def _instant(text: str | None) -> _dt.datetime | None:
    """A recorded time (utc_now: whole seconds or finer) as an aware datetime; None if absent or unreadable."""
    try:
        t = _dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def overlapping(name: str, stages: dict[str, dict], ended: dict[str, str] | None = None) -> list[str]:
    """The names of the stages whose [started_utc, ended_utc] overlapped stage `name`'s, in `stages`' order,
    from the recorded times alone (stages.json's "stages", or StageState fields as dicts). A `running` stage
    is open-ended unless `ended` gives its end (name -> utc time: ended, not yet recorded). Intervals that
    only touch do not overlap (a stage started as another ended: the same second in an older file's whole
    seconds). Left out: a stage never started, or whose ended_utc is missing or earlier than its
    started_utc (an attempt cut off with its sitting: no end of it was recorded). [] when `name` is left out."""
    ended = ended or {}
    spans = {}
    for n, st in stages.items():
        start = _instant(st.get("started_utc"))
        if start is None:
            continue
        if n in ended:
            end = _instant(ended[n])
        elif st.get("status") == "running":
            end = None                             # still running: open-ended
        else:
            end = _instant(st.get("ended_utc"))
            if end is None or end < start:
                continue
        spans[n] = (start, end)
    if name not in spans:
        return []
    a0, a1 = spans[name]
    return [n for n, (b0, b1) in spans.items()
            if n != name and (a1 is None or b0 < a1) and (b1 is None or a0 < b1)]


def estimate_s(stage: Stage, state: State) -> float:
    """Seconds this stage is expected to need: ESTIMATE_MARGIN x the slowest done stage of its harness
    family in this run (any workload; legacy entries left out), capped at its budget; its budget when none
    is done yet."""
    seen = [st.seconds for st in state.stages.values()
            if st.status == "done" and st.seconds is not None and st.harness in HARNESSES
            and family(st.harness) == family(stage.harness)]
    return min(stage.budget_s, ESTIMATE_MARGIN * max(seen)) if seen else stage.budget_s


def run_plan(stages: list[Stage], state: State, options: dict, *, budget_s: float | None = None,
             execute: Executor = subprocess_executor, clock: Callable[[], float] = time.monotonic,
             provenance: dict | None = None, log: Callable[[str], None] = print,
             after: Callable[[], object] | None = None, gpus: list[int] | None = None) -> dict:
    """Run the stages in plan order within budget_s seconds (None: no total budget), saving state as each
    starts and ends.

    Kept: `done` stages. Recorded without running: `skipped` (Stage.skip). Stopped: when what is left is
    less than the stage is expected to need (`estimate_s`: its budget until a stage of its family has
    run, then 1.5x the slowest such) and it is not the sitting's first stage to start; it and all after it
    stay `pending`. A stage's timeout is its budget, cut to what is left of the sitting.
    gpus: None runs one stage at a time in this thread, as `execute(..., gpu=None)`. A list of GPU indices
    runs up to len(gpus) stages at once, started in plan order: the next stage waits for a free GPU g,
    then passes the budget check (so the check sees the time left when it would start), and a worker
    thread waits on `execute(..., gpu=g)` (the subprocess executor pins the process with
    CUDA_VISIBLE_DEVICES); the stage's `gpu` is recorded. A stage of a timed harness (`TIMED_HARNESSES`)
    runs alone: it waits until no stage is in flight, and while it runs the next stage waits for it to
    end; a waiting stage holds back every stage after it (plan order is kept). A stop leaves the stages in
    flight to finish, each within its timeout, so within the sitting. All bookkeeping, saves, `log` and
    `after` run in the calling thread. Every stage that ends records `overlapped` (`overlapping`: the
    stages whose started_utc..ended_utc overlapped its own; its end is taken in the worker, as `execute`
    returns).
    Returns the sitting's record (also appended to state.data["sittings"]):
    {started_utc, ended_utc, budget_s, gpus, ran, kept, stopped (reason or None), ...provenance git fields}.
    A stage is saved as `running` while its process runs (a killed sitting leaves it so; `State.open`
    turns it into `failed`, rerun on resume). An exception from `execute`, or a KeyboardInterrupt,
    propagates; with gpus only once the other stages in flight have returned (their processes are not
    killed; each ends by its timeout), and their outcomes are not recorded: they stay `running`.
    after: called after every stage that ran (the report)."""
    provenance = provenance or {}
    t0 = clock()
    sitting = {"started_utc": utc_now(), "budget_s": budget_s, "gpus": list(gpus) if gpus else None,
               "command": options.get("command"), "git_rev": provenance.get("git_rev"),
               "impl_tree": provenance.get("impl_tree"), "ran": [], "kept": [], "skipped": [], "stopped": None}
    state.data.setdefault("sittings", []).append(sitting)
    free: list[int | None] = list(gpus) if gpus else [None]
    flight: dict[Future, Stage] = {}
    started = 0

    def attempt(stage: Stage, out_dir: Path, timeout: float, gpu: int | None) -> tuple[Outcome, float, str]:
        t = clock()
        outcome = execute(stage, out_dir, timeout, options, gpu=gpu)
        return outcome, clock() - t, utc_now(STAGE_TIMESPEC)

    def timed(s: Stage) -> bool:
        return s.harness in TIMED_HARNESSES

    def finish(fut: Future) -> None:
        stage = flight.pop(fut)
        st = state.stages[stage.name]
        free.append(st.gpu)
        outcome, seconds, ended = fut.result()     # an executor's exception propagates from here
        st.seconds, st.ended_utc = round(seconds, 3), ended
        st.status, st.returncode, st.reason = outcome.status, outcome.returncode, outcome.reason
        ends = {s.name: f.result()[2] for f, s in flight.items() if f.done() and f.exception() is None}
        st.overlapped = overlapping(stage.name, {n: vars(x) for n, x in state.stages.items()}, ends)
        if outcome.status == "failed" and outcome.reason.startswith("timed out") and st.timeout_s < stage.budget_s:
            st.reason = (f"the sitting's --budget-s ran out during the stage (timeout cut to {st.timeout_s:.0f} s "
                         f"of its {stage.budget_s:g} s budget); rerun with --resume")
        st.command, st.log_tail = list(outcome.command), list(outcome.log_tail)
        _read_verdict(state.run_dir / stage.name, st)
        if _ran_to_the_end(stage, outcome, st):    # done, verdict INVALID: as a verify stage's
            st.status, st.reason = "done", ""
        sitting["ran"].append(stage.name)
        log(f"stage {stage.name}: {st.status} in {st.seconds:.1f} s" + _on(st.gpu)
            + (f" beside {', '.join(st.overlapped)}" if st.overlapped else "")
            + (f" (verdict {st.verdict})" if st.verdict else "") + (f": {st.reason}" if st.reason else ""))
        if st.log_tail:                            # the stage's own summary (or its error)
            log("  | " + "\n  | ".join(st.log_tail[-12:]))
        state.save()
        if after is not None:
            after()

    def finish_done() -> None:
        for fut in [f for f in flight if f.done()]:
            finish(fut)

    with (ThreadPoolExecutor(max_workers=len(gpus), thread_name_prefix="stage") if gpus
          else contextlib.nullcontext()) as pool:
        for stage in stages:
            finish_done()
            st = state.get(stage)
            st.budget_s = stage.budget_s
            st.dir = stage.name
            if st.status == "done":
                sitting["kept"].append(stage.name)
                continue
            if stage.skip:
                st.status, st.reason = "skipped", stage.skip
                sitting["skipped"].append(stage.name)
                state.save()
                continue
            # wait for a stage to end while every GPU is busy, or while this stage or one in flight is timed
            # (it runs alone; the stages after this one wait behind it: plan order)
            while flight and not sitting["stopped"] and (
                    not free or timed(stage) or any(timed(s) for s in flight.values())):
                finish(next(iter(wait(flight, return_when=FIRST_COMPLETED).done)))
            left = None if budget_s is None else budget_s - (clock() - t0)
            need = estimate_s(stage, state)
            if sitting["stopped"] or (left is not None and (left <= 0 or (started and left < need))):
                if not sitting["stopped"]:
                    sitting["stopped"] = (f"budget: {max(left, 0):.0f} s of --budget-s {budget_s:g} left before "
                                          f"{stage.name}, which is expected to need {need:.0f} s; rerun with --resume")
                    log(f"stop: {sitting['stopped']}")
                last = f"; last attempt {st.status}: {st.reason}" if st.status == "failed" else ""
                st.status, st.reason = "pending", "not run yet: " + sitting["stopped"] + last
                continue
            gpu = free.pop(0)
            timeout = stage.budget_s if left is None else min(stage.budget_s, left)
            out_dir = state.run_dir / stage.name
            if out_dir.exists():
                _clear(out_dir)
            st.attempts += 1
            st.started_utc, st.ended_utc, st.timeout_s, st.gpu = utc_now(STAGE_TIMESPEC), None, timeout, gpu
            st.overlapped = None
            st.git_rev, st.impl_tree = provenance.get("git_rev"), provenance.get("impl_tree")
            st.status, st.reason = "running", ""
            state.save()
            log(f"stage {stage.name}: start{_on(gpu)} (budget {stage.budget_s:g} s, timeout {timeout:.0f} s)")
            started += 1
            if pool is None:                          # one at a time, in this thread (no GPU pinning)
                fut: Future = Future()
                flight[fut] = stage
                fut.set_result(attempt(stage, out_dir, timeout, gpu))
            else:
                flight[pool.submit(attempt, stage, out_dir, timeout, gpu)] = stage
            finish_done()
        while flight:
            finish(next(iter(wait(flight, return_when=FIRST_COMPLETED).done)))
    sitting["ended_utc"] = utc_now()
    state.save()
    return sitting


def _on(gpu: int | None) -> str:
    return "" if gpu is None else f" on GPU {gpu}"


def _clear(folder: Path) -> None:
    """Remove the files an earlier attempt left in a stage folder (not the folder)."""
    for p in sorted(folder.rglob("*"), reverse=True):
        if p.is_dir():
            p.rmdir()
        else:
            p.unlink()
