"""The one REPORT.md of a staged reproduction: a table per claim, plots, the stages, provenance. `write`
runs after every stage (and from `python -m suite.report`), so an unfinished run has a report of what is
done. A figure of a stage that ran beside another on its host is marked "timed beside"; a failed duplex
stage still gives the runs it checkpointed, marked PARTIAL; `--compare REF` judges ours against references.
"""
from __future__ import annotations

import json
from pathlib import Path

from suite.records import HARNESSES, TIMED_HARNESSES, device_type, registered, unselected
from suite.report.claims import (bitwise_table, host_state_table, memory_table, session_table, sessions_table,
                                 speak_table, speedup_table)
from suite.report.figures import load, load_reference, resolve_reference
from suite.report.plots import plots
from suite.report.runs import between_runs_table, compare_table, gpu_coverage, provenance_table, stages_table
from suite.report.text import DASH, table

#: Under the speedup table when a speed or duplex figure was timed beside another stage.
TIMED_NOTE = ("A figure marked \"timed beside\" comes from a stage that ran while other stages ran on its host "
              "(stages.json's started_utc / ended_utc): the cadence tail is host-bound (kernel launches, Python) and "
              "runs slower beside another stage; `suite.reproduce` now runs these stages alone on their host.")


def render(data: dict, refs: dict[str, dict] | None = None, written: list[str] | None = None,
           results_root: Path | None = None) -> str:
    """REPORT.md text of a loaded staged run (`load`); refs: workload -> reference record."""
    state = data["state"]
    counts = {s: 0 for s in ("done", "failed", "skipped", "pending", "running")}
    legacy = 0
    for st in state.get("stages", {}).values():
        if st["harness"] not in HARNESSES:              # an older version's stage: listed, not counted
            legacy += 1
            continue
        counts[st["status"]] = counts.get(st["status"], 0) + 1
    opts = state.get("options", {})
    missing = unselected(state, registered() if device_type(opts.get("device", "cpu")) == "cuda" else None)
    complete = counts["failed"] == counts["pending"] == counts["running"] == 0 and not missing
    rerun = [] if counts["failed"] == counts["pending"] == counts["running"] == 0 else [
        "rerun the same command with `--resume` to run the failed and pending stages (done stages are kept)"]
    if missing:
        rerun.append(f"{len(missing)} stage(s) of the default plan never selected in a sitting: "
                     f"{', '.join(missing)} (`--resume --stages {','.join(missing)}`)")
    parts = [f"# DuplexCadence reproduction {data['run_dir'].name}", "",
             f"**{'Complete' if complete else 'Incomplete'}**: " + ", ".join(f"{v} {k}" for k, v in counts.items()
                                                                             if v or k != "running")
             + (f" (and {legacy} legacy entries of an older version, listed under Stages)" if legacy else "")
             + ("; " + "; ".join(rerun) + "." if rerun else ""), "",
             verdicts_line(state), "",
             gpu_coverage(data, results_root), "",
             "Published figures: one H200, released MiniCPM-o 4.5 weights, whole SPEAK unit. Ours: seeded "
             "random weights, the token-to-audio tail unless a row says otherwise, on the device below. "
             "Compare ratios, not absolute times. Tail-time bands are p10-p90 over the measured units of round 1; "
             "a speedup's band is the min-max of the stage's timing rounds (\"N rounds\": fresh sessions of "
             "one process, alternating order) or, for a record of one round, [stock p10 / cadence p90, stock "
             "p90 / cadence p10] (\"units\"). Host us / eager op: suite.measure.env.host_op_us around each round (the "
             "stock tails are host-bound).", "",
             "## Speedup (stock / cadence tail time per SPEAK unit)", "", speedup_table(data), "",
             *([TIMED_NOTE, ""] if any(h.get("timed") and h["state"].get("harness") in TIMED_HARNESSES
                                       for e in data["workloads"].values() for h in e.values()) else []),
             *host_state_section(data),
             "## Peak memory (over the idle baseline)", "", memory_table(data), "",
             "## Per-session increment", "", session_table(data), "",
             "## SPEAK time against the 1 s cadence", "", speak_table(data), "",
             "## Sessions per GPU", "", sessions_table(data), "",
             "Session counts are the largest count tried with zero missed units (suite/stages/duplex_sessions.json "
             "per mode and workload), then the first larger count that missed (its misses / units): together "
             "a bracket on the limit, the limit itself only where the two counts are consecutive (`python -m "
             "suite.measure.duplex --bisect` finds it); \"largest tried\": no count missed, a lower bound. The ratio "
             "comes from the two brackets (a range or a bound where a limit is not exact), and only from two modes "
             "measured on one GPU type. \"oracle\": the sessions' graphs were captured from their own script "
             "before the cadence (foreknowledge a server does not have), never the headline.", "",
             "## Bitwise equality (per unit sha256, stock vs cadence)", "", bitwise_table(data), ""]
    if written:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in written] + [""]
    else:
        parts += ["## Plots", "", "None: no stage with both modes measured yet, or matplotlib missing.", ""]
    if refs:
        parts += ["## Against the reference run", "",
                  "Ours is within the reference's noise when our speedup lies in the reference's band (its "
                  "rounds' min-max, or its unit band for a record of one round). The reference's memory may come from one process for both modes (its runner subtracts "
                  "what the first mode left); ours from one process per mode where the memory stages ran.", "",
                  compare_table(data, refs), "",
                  "## Between runs (the noise between processes and sittings)", "",
                  "One run's timing rounds share a process and a few minutes of the host; on a host whose speed "
                  "changes they under-state the noise between runs. Pooled over the reference runs of the same impl/ tree, their rounds' min-max is that "
                  "noise as measured so far; more runs can still widen it.", "", between_runs_table(data, refs), ""]
    parts += ["## Stages", "", stages_table(data), "",
              "Each stage's own REPORT.md, run.json and log.txt are in its folder (`<stage>/`).", "",
              "## Provenance", "", provenance_table(data), "",
              "## Parameters used", "",
              table([[k, DASH if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)]
                      for k, v in opts.items()], ["option", "value"]), ""]
    return "\n".join(parts)


def host_state_section(data: dict) -> list[str]:
    """The "Host state per unit" section's lines, or [] when no record carries per-unit samples."""
    rows = host_state_table(data)
    if rows is None:
        return []
    return ["## Host state per unit (verify, round 1)", "",
            "Sampled right after each timed SPEAK unit, outside its timed region (suite.measure.env.UnitHostSampler): "
            "launch us = microseconds per eager torch.add launch (100 ops), CPU loop us = a pure-Python loop, "
            "SM MHz = the GPU's SM clock (NVML). rho: Spearman rank correlation with the unit's tail time "
            "(a dash: constant or under 3 units).", "", rows, ""]


def verdicts_line(state: dict) -> str:
    """One line: the stage records' verdicts, with the reasons of the INVALID ones and the stages whose
    record is PARTIAL (a duplex stage that failed after checkpointing)."""
    done = {n: st for n, st in state.get("stages", {}).items() if st.get("verdict")}
    partial = [n for n, st in done.items() if st["verdict"] == "PARTIAL"]
    bad = {n: ", ".join(dict.fromkeys(st.get("invalid_codes") or [])) for n, st in done.items()
           if st["verdict"] not in ("VALID", "PARTIAL")}
    return (f"Stage verdicts: {len(done) - len(bad) - len(partial)} VALID, {len(bad)} INVALID"
            + ("".join(f"; {n}: {codes}" for n, codes in bad.items()) if bad else "")
            + (f"; {len(partial)} PARTIAL (failed after measuring some runs): {', '.join(partial)}" if partial else "")
            + ".")


def prepare(run_dir: str | Path, compare: list[str] | None = None, results_root: str | Path | None = None) -> tuple:
    """Load the staged run and its references and render the report in memory, writing nothing: what
    `write` checks first. Returns (data, refs, root). Raises FileNotFoundError (missing stages.json or
    reference) and ValueError (a malformed record or reference; TypeError, KeyError and AttributeError
    from a record of the wrong shape are raised as ValueError naming the folder)."""
    run_dir = Path(run_dir)
    data = load(run_dir)
    refs: dict[str, list] = {}
    folders, seen = [], set()
    for ref in (compare if compare is not None else data["state"].get("compare", [])):
        path = resolve_reference(ref, run_dir)
        if path.resolve() not in seen:                 # a folder named twice is one reference, not two
            seen.add(path.resolve())
            folders.append((ref, path))
    names = [Path(ref).name or str(ref) for ref, _ in folders]
    unique = len(set(names)) == len(names)             # else label each by the path as given
    for (ref, path), name in zip(folders, names):
        if path.resolve() == run_dir.resolve():
            raise ValueError(f"reference run {ref}: it is the run itself ({run_dir})")
        try:
            loaded = load_reference(path)
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"reference run {ref}: a record of the wrong shape ({type(exc).__name__}: {exc})") \
                from None
        for w, rec in loaded.items():
            refs.setdefault(w, []).append((name if unique else str(ref), rec))
    root = Path(results_root) if results_root is not None else run_dir.parent
    try:
        render(data, refs, [], root)   # a malformed record fails here, before any plot is rewritten
    except (TypeError, KeyError, AttributeError, StopIteration) as exc:
        raise ValueError(f"{run_dir}: a record of the wrong shape in the run or its references "
                         f"({type(exc).__name__}: {exc})") from None
    return data, refs, root


def write(run_dir: str | Path, compare: list[str] | None = None, results_root: str | Path | None = None) -> Path:
    """Load the staged run, draw the plots, write REPORT.md; returns its path. compare: reference run folders
    (default: those recorded in stages.json; `resolve_reference`). Raises as `prepare` does, before writing."""
    run_dir = Path(run_dir)
    data, refs, root = prepare(run_dir, compare, results_root)
    written = plots(data, run_dir)
    path = run_dir / "REPORT.md"
    path.write_text(render(data, refs, written, root))
    return path
