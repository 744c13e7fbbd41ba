"""The plan of a reproduction: which stages there are, what each may take, the command each runs.

A stage is one harness on one workload (`<workload>.<harness>`), a process of its own with a time budget:
`verify` (`python -m suite.measure.stage verify`: stock against DuplexCadence paired over fresh processes,
every unit compared; VERIFY_PROTOCOL), `memory_stock` / `memory_cadence` (`suite.measure.stage mode`: one
mode in a fresh process), `duplex_stock` / `duplex_cadence` (`python -m suite.measure.duplex`: the search for
the largest session count with zero misses from DUPLEX_SESSIONS' start counts, 60 s of every session's own
script per count, within the stage's budget less DUPLEX_MARGIN_S), `duplex_oracle` (cadence with `--prepare
oracle`; no default plan has it). A stage that cannot run here is skipped with its reason, checked again every
sitting. A verify stage's expected time comes from VERIFY_COST_S and its protocol (`verify_estimate_s`).
A workload built from real weights (`--checkpoint`, parsed by suite.measure.env.parse_checkpoints) is the run's
option "checkpoint"; its stage processes find it in their environment (env.CHECKPOINT_ENV) where the spec is made.
"""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path

import workloads
from duplexcadence import runtime
from suite.records import HARNESS_MODE, HARNESSES, OPTIONAL_HARNESSES, TIMED_HARNESSES, family
from suite.records.paired import Protocol

#: Per-stage time budget in seconds (the stage's process is killed past it), by device type. A duplex
#: stage fills a 10-minute command of a lent GPU (560 s); CPU: 2 cores, the released config, 4 units.
BUDGET_S = {
    "cuda": {"verify": 300, "memory_stock": 180, "memory_cadence": 180, "duplex_stock": 560,
             "duplex_cadence": 560, "duplex_oracle": 560},
    "cpu": {"verify": 1800, "memory_stock": 1200, "memory_cadence": 1200, "duplex_stock": 1800,
            "duplex_cadence": 1800, "duplex_oracle": 1800},
}
#: The paired verify's protocol by device type: suite.records.paired.Protocol's fields that differ from its
#: defaults. CPU: one process, no A/A run, no priming (a check of the pipeline and the bytes, not of speed).
VERIFY_PROTOCOL = {"cuda": {}, "cpu": {"processes": 1, "aa_speak_units": 0, "prime_speak_units": 0}}
#: What a verify process costs on an H200, per workload: "set_up" s (imports, model build, the DuplexCadence
#: session's prepare(None), the priming units: a memory stage's seconds less its units' wall time, and the
#: first units' excess), "stock" / "cadence" s per decoded unit (mean wall time of the verify stages' units
#: after their warm-up). The set-ups of a stage's processes run at once.
VERIFY_COST_S = {
    "minicpmo45": {"set_up": 25.0, "stock": 0.30, "cadence": 0.11},
    "minicpmo45_5step": {"set_up": 22.0, "stock": 0.21, "cadence": 0.075},
    "stepaudio2_mini": {"set_up": 19.0, "stock": 0.195, "cadence": 0.105},
    "moshi": {"set_up": 16.0, "stock": 0.16, "cadence": 0.022},
    "qwen3_omni": {"set_up": 27.0, "stock": 0.022, "cadence": 0.011},
}
SET_UP_CONTENTION = 1.3        # N set-ups at once take the slowest one's time times this (a guess: not measured)
PROFILED_UNIT_X = 5.0          # a unit under the profiler takes this many times its timed wall time ...
PROFILED_UNIT_S = 0.3          # ... plus this (the trace's export and parse)
VERIFY_FIXED_S = 5.0           # the stage's own process: imports, pooling the processes, the record
ESTIMATE_MARGIN = 1.5          # a stage is expected to take up to 1.5x its family's slowest done stage
VERIFY_MARGIN = 1.1            # a verify stage up to 1.1x its estimate from VERIFY_COST_S
DUPLEX_SECONDS = 60            # per session count: zero misses are claimed over 60 s
#: Seconds of a duplex stage's budget kept outside its search: building the model, the process warm-up, the
#: last count's references and record. The search gets the rest (`--budget-s`) and stops with its bracket.
DUPLEX_MARGIN_S = 90
#: suite.measure.duplex arguments per mode ("stock", "cadence") and workload: the search's start (starting
#: points, not measurements; the file says where each came from).
DUPLEX_SESSIONS = json.loads((Path(__file__).with_name("duplex_sessions.json")).read_text())


@dataclass(frozen=True)
class Stage:
    """One harness on one workload. skip: why it cannot run here (None: it can)."""
    workload: str
    harness: str
    budget_s: float
    skip: str | None = None
    expected_s: float | None = None     # a verify stage's estimate (verify_estimate_s), None: none

    @property
    def name(self) -> str:
        return f"{self.workload}.{self.harness}"

    @property
    def mode(self) -> str | None:
        """The one mode a memory or duplex stage runs, else None."""
        return HARNESS_MODE.get(self.harness)

    @property
    def timed(self) -> bool:
        """A stage whose figures are times: nothing else runs on its host while it runs."""
        return self.harness in TIMED_HARNESSES


def served_variants(architecture: str) -> set:
    """The spec variants the released models of `architecture` select (duplexcadence.runtime.MODELS)."""
    return {e.spec.get("variant") for e in runtime.MODELS.values() if e.architecture == architecture} - {None}


def skip_reason(workload, harness: str) -> str | None:
    """Why `harness` cannot run `workload` here, or None. Imports the workload's adapter module."""
    if workload.architecture not in runtime.ADAPTERS:
        return f"no adapter for architecture {workload.architecture!r} (duplexcadence.runtime.ADAPTERS)"
    adapter = runtime.adapter(workload.architecture)
    variant = (workload.spec or {}).get("variant")
    if variant is not None and variant not in served_variants(workload.architecture):
        return (f"adapter {adapter.__name__} serves no {variant!r} variant (no duplexcadence.runtime.MODELS entry "
                f"of architecture {workload.architecture!r} selects it); running it would run another model's path")
    if HARNESS_MODE[harness] != "stock" and "cadence" not in getattr(adapter, "MODES", runtime.MODES):
        return f"adapter {adapter.__name__} has no cadence mode"
    return None


def plan(workload_names: list[str], harnesses: list[str], device_type: str, *,
         stage_budget_s: float | None = None, options: dict | None = None) -> list[Stage]:
    """The stages for these workloads x harnesses, workload-major, each with its budget, skip reason and (a
    verify stage on CUDA) its expected seconds under the run's options (`verify_protocol`). Raises KeyError
    for an unknown workload, ValueError for an unknown harness or device type."""
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
            expected = (verify_estimate_s(wl, device_type, options or {}) if h == "verify" else None)
            out.append(Stage(name, h, float(budget), skip_reason(wl, h), expected))
    return out


def verify_protocol(options: dict, device_type: str) -> Protocol:
    """A verify stage's protocol: VERIFY_PROTOCOL's for the device type, then the run's `processes` and
    `passes` where it sets them. Raises ValueError for a count out of range."""
    chosen = {**VERIFY_PROTOCOL[device_type],
              **{k: options[k] for k in ("processes", "passes") if options.get(k) is not None}}
    return Protocol(**chosen)


def verify_estimate_s(workload, device_type: str, options: dict) -> float | None:
    """Seconds a verify stage of `workload` is expected to take on an H200 (VERIFY_COST_S; None for a CPU
    run or a workload without costs): the processes' set-ups at once, then each process's A/A and A/B runs
    in turn (stock and cadence per decoded unit of the script, cut as the options cut it), the profiled
    units, and the stage's own process."""
    cost = VERIFY_COST_S.get(workload.name)
    if device_type != "cuda" or cost is None:
        return None
    p = verify_protocol(options, device_type)
    script = workload.session_script()
    if options.get("max_speak_units"):
        script = script.select(options["max_speak_units"], min_turns=2)
    units = [u for u in script.units if options.get("seconds") is None or u.t_start_s < options["seconds"]]
    decoded = [u for u in units if u.kind == "SPEAK" or u.payload is not None]
    speak = sum(u.kind == "SPEAK" for u in units)
    aa, seen = 0, 0
    for u in decoded:
        if seen == p.aa_speak_units:
            break
        aa += 1
        seen += u.kind == "SPEAK"
    pair = cost["stock"] + cost["cadence"]
    per_process = 2 * cost["stock"] * aa + p.passes * len(decoded) * pair
    profiled = min(p.profiled_speak_units, speak) * (pair * (PROFILED_UNIT_X - 1) + PROFILED_UNIT_S)
    set_up = cost["set_up"] * (SET_UP_CONTENTION if p.processes > 1 else 1.0)
    return set_up + p.processes * per_process + profiled + VERIFY_FIXED_S


def select(stages: list[Stage], patterns: list[str] | None) -> list[Stage]:
    """The stages any pattern names: an fnmatch glob on the stage name (`minicpmo45.*`, `*.memory_*`), or a
    workload, harness or harness family (`memory`, `duplex`) alone; an optional harness (duplex_oracle) only
    by a pattern with "oracle" in it. None or [] selects all. Raises ValueError naming a pattern that selects
    nothing."""
    if not patterns:
        return list(stages)

    def hit(st: Stage, p: str) -> bool:
        if st.harness in OPTIONAL_HARNESSES and "oracle" not in p:
            return False
        return fnmatch.fnmatchcase(st.name, p) or p in (st.workload, st.harness) or family(st.harness) == p

    empty = [p for p in patterns if not any(hit(s, p) for s in stages)]
    if empty:
        raise ValueError(f"--stages {empty}: no stage matches; stages are "
                         f"{[s.name for s in stages]} (globs, workload or harness names)")
    return [s for s in stages if any(hit(s, p) for p in patterns)]


def _family_seconds(stage: Stage, stages: dict) -> list[float]:
    """Seconds of the done stages of `stage`'s harness family in this run (legacy entries left out)."""
    return [st.seconds for st in stages.values()
            if st.status == "done" and st.seconds is not None and st.harness in HARNESSES
            and family(st.harness) == family(stage.harness)]


def estimated(stage: Stage, stages: dict) -> bool:
    """Whether `estimate_s` rests on a figure (a verify estimate, a done stage of the family), not on the budget."""
    return stage.expected_s is not None or bool(_family_seconds(stage, stages))


def estimate_s(stage: Stage, stages: dict) -> float:
    """Seconds this stage is expected to need, capped at its budget: a stage with `expected_s` (verify on
    CUDA) VERIFY_MARGIN x that; else ESTIMATE_MARGIN x the slowest done stage of its harness family in this
    run (legacy entries left out); its budget when none is done. stages: name -> StageState."""
    if stage.expected_s is not None:
        return min(stage.budget_s, VERIFY_MARGIN * stage.expected_s)
    seen = _family_seconds(stage, stages)
    return min(stage.budget_s, ESTIMATE_MARGIN * max(seen)) if seen else stage.budget_s


def stage_argv(stage: Stage, out_dir: str, options: dict) -> list[str]:
    """The module and arguments of a stage's process (after `python -m`). options: the run's (device,
    steps, seconds, max_speak_units, depth, seed, notes)."""
    if family(stage.harness) == "duplex":
        per = DUPLEX_SESSIONS[stage.mode]
        search_s = max(stage.budget_s - DUPLEX_MARGIN_S, stage.budget_s / 2)
        argv = ["suite.measure.duplex", "--workload", stage.workload, "--device", options["device"], "--modes",
                stage.mode, "--out", str(out_dir), "--ar", "none", "--seconds", str(DUPLEX_SECONDS),
                "--budget-s", f"{search_s:g}", *per.get(stage.workload, per["default"])["args"]]
        if stage.harness == "duplex_oracle":
            argv += ["--prepare", "oracle"]
        if options.get("depth") and options["depth"] != "released":
            argv += ["--depth", options["depth"]]
        if options.get("steps"):
            argv += ["--steps", str(options["steps"])]
        return argv
    argv = ["suite.measure.stage", "verify" if stage.harness == "verify" else "mode", "--workload", stage.workload,
            "--device", options["device"], "--out", str(out_dir), "--depth", options.get("depth") or "released"]
    if stage.mode:
        argv += ["--mode", stage.mode]
    else:
        p = verify_protocol(options, "cuda" if options["device"].startswith("cuda") else "cpu")
        argv += ["--processes", str(p.processes), "--passes", str(p.passes), "--warmup-pairs", str(p.warmup_pairs),
                 "--aa-units", str(p.aa_speak_units), "--prime-units", str(p.prime_speak_units)]
    for key in ("steps", "seconds", "max_speak_units", "seed"):
        if options.get(key) is not None:
            argv += [f"--{key.replace('_', '-')}", str(options[key])]
    for note in options.get("notes") or []:
        argv += ["--note", note]
    return argv
