"""The one REPORT.md of a staged reproduction, and its claims.json: first the verdict table (one row per claim
and workload: suite.report.claims), then a section per claim with its plot and its figures, the run against
reference runs (`--compare`: the reproducibility bars), the stages and provenance as compact lists. `write`
runs after every stage (and from `python -m suite.report`), so an unfinished run has a report of what is
done; `publish` puts a run's report and claims at results/REPORT.md and results/CLAIMS.json.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from suite.records import HARNESSES, device_type, registered, unselected
from suite.records.host_speed import PROBE_REFERENCE_US
from suite.report import dropins, floor
from suite.report.claims import VERDICTS, claim_rows, limit_text, ordered, ratio_bounds, ratio_text
from suite.report.figures import (duplex_figures, gpu_name, load, load_reference, memory_figures, resolve_reference,
                                  speedup, status, timed_note)
from suite.report.plots import plots
from suite.report.runs import compare_lines, gpu_coverage, provenance_list, stages_list
from suite.report.text import DASH, fmt, interval, pct_change, table

CLAIMS_SCHEMA = "duplexcadence.claims/1"
#: Under the speed table when a speed or duplex figure was timed beside another stage.
TIMED_NOTE = ("A figure marked \"timed beside\" comes from a stage that ran while other stages ran on its host "
              "(stages.json's started_utc / ended_utc): the cadence tail is host-bound and runs slower beside "
              "another stage; `suite.reproduce` runs these stages alone on their host.")
#: The harness whose record a claim's figure comes from (its impl/ tree in claims.json).
SOURCE = {"speed": "verify", "tail / kernel-busy": "verify", "bytes equal": "verify", "peak memory": "memory_cadence",
          "memory per session": "memory_cadence", "mean SPEAK vs 1 s": "duplex_cadence",
          "sessions per GPU": "duplex_cadence"}


def counts(state: dict) -> tuple[dict, int, list[str], bool]:
    """(stages per status, legacy entries, default-plan stages never selected, complete?)."""
    out = {s: 0 for s in ("done", "failed", "skipped", "pending", "running")}
    legacy = 0
    for st in state.get("stages", {}).values():
        if st["harness"] not in HARNESSES:
            legacy += 1
            continue
        out[st["status"]] = out.get(st["status"], 0) + 1
    opts = state.get("options", {})
    missing = unselected(state, registered() if device_type(opts.get("device", "cpu")) == "cuda" else None)
    complete = out["failed"] == out["pending"] == out["running"] == 0 and not missing
    return out, legacy, missing, complete


def status_line(state: dict) -> str:
    n, legacy, missing, complete = counts(state)
    rerun = [] if n["failed"] == n["pending"] == n["running"] == 0 else [
        "rerun the same command with `--resume` to run the failed and pending stages (done stages are kept)"]
    if missing:
        rerun.append(f"{len(missing)} stage(s) of the default plan never selected in a sitting: "
                     f"{', '.join(missing)} (`--resume --stages {','.join(missing)}`)")
    return (f"**{'Complete' if complete else 'Incomplete'}**: " + ", ".join(f"{v} {k}" for k, v in n.items()
                                                                            if v or k != "running")
            + (f" (and {legacy} legacy entries of an older version, listed under Stages)" if legacy else "")
            + ("; " + "; ".join(rerun) + "." if rerun else "."))


def verdicts_line(state: dict) -> str:
    """One line: the stage records' verdicts, with the codes of the INVALID ones and the PARTIAL stages."""
    done = {n: st for n, st in state.get("stages", {}).items() if st.get("verdict")}
    partial = [n for n, st in done.items() if st["verdict"] == "PARTIAL"]
    bad = {n: ", ".join(dict.fromkeys(st.get("invalid_codes") or [])) for n, st in done.items()
           if st["verdict"] not in ("VALID", "PARTIAL")}
    return (f"Stage verdicts: {len(done) - len(bad) - len(partial)} VALID, {len(bad)} INVALID"
            + ("".join(f"; {n}: {codes}" for n, codes in bad.items()) if bad else "")
            + (f"; {len(partial)} PARTIAL (failed after measuring some runs): {', '.join(partial)}" if partial else "")
            + ".")


def verdict_table(rows) -> str:
    return table([[r.claim, r.workload, r.published_text, r.ours_text, r.stock_text, r.target,
                   f"**{r.verdict}**" + (f" ({r.note})" if r.verdict == "open" and r.note else "")
                   + (f"; oracle beside: {r.oracle}" if r.oracle and r.verdict != "open" else "")]
                  for r in rows], ["claim", "workload", "published", "ours", "stock", "target", "verdict"])


def speed_section(data: dict, files: list[str], prefix: str) -> list[str]:
    rows, timed = [], False
    for w, e in ordered(data):
        rec = (e.get("verify") or {}).get("record")
        sp = speedup(rec)
        if sp is None:
            continue
        timed = timed or bool((e.get("verify") or {}).get("timed"))
        mc = rec["modes"]["cadence"]["metrics"]
        states = "; ".join(f"{k} {interval(x, lo, hi)} ({n})" for k, (x, lo, hi, n) in sp["states"].items()) or DASH
        launches = " -> ".join(fmt(v, ".0f") for v in sp["kernel_launches"])
        rows.append([w, interval(sp["x"], sp["lo"], sp["hi"]) + ("" if sp["protocol"] == "paired" else " (older)"),
                     sp["band"], states, at_reference(sp["host_speed"]),
                     DASH if sp["floor"] is None else interval(*sp["floor"], spec=".3f"),
                     f"{fmt(sp['stock_ms'])} / {fmt(sp['cadence_ms'])}", launches,
                     fmt(mc.get("tail_over_kernel_busy_x"), ".2f"), fmt(mc.get("eager_first_occurrences")),
                     timed_note(e, "verify", "").strip() or "alone"])
    out = ["## Speed", "",
           "Paired (suite.measure.paired): in each of several fresh processes a stock and a DuplexCadence session "
           "of one model instance speak the script in A B B A blocks; the figure is the median of the per-unit "
           "ratios stock / DuplexCadence, its 95% interval a bootstrap over processes and then pairs; per host "
           "state where the launch probe shows two (pairs: count); the A/A run (two stock sessions, same "
           "protocol) is the noise floor. Older records: the median of timing rounds in one process, their "
           "min-max. At the reference host speed: the ratio where the line log(stock / DuplexCadence) against "
           f"the probe reading crosses {PROBE_REFERENCE_US:.1f} us per launch, over the pairs with audio and no "
           "eager step "
           "(suite.records.host_speed), with each arm's slope of log time per us (stock, launch-bound, follows "
           "the host; DuplexCadence should not). Kernel launches per unit and tail / kernel-busy from the CUDA "
           "profiler on untimed units; eager first occurrences: DuplexCadence units whose signature had no graph "
           "yet (run eagerly, counted, captured right after).", ""]
    out += [f"![speed]({prefix}{f})" for f in files] + ([""] if files else [])
    out += [table(rows, ["workload", "ours", "interval", "per host state",
                         f"at {PROBE_REFERENCE_US:.1f} us per launch; slope per us, stock / cadence", "A/A floor",
                         "stock / cadence ms p50",
                         "kernel launches / unit, stock -> cadence", "cadence / kernel-busy", "eager first occurrences",
                         "timed"]) if rows else "No verify record with both modes measured.", ""]
    return out + ([TIMED_NOTE, ""] if timed else [])


def at_reference(fit: dict | None) -> str:
    """A speed row's cell for the fit at the reference host speed: ratio [interval]; the arms' slopes; its flags."""
    if not fit or fit.get("speedup") is None:
        return DASH if not fit else "no fit: " + "; ".join(fit.get("flags") or [])
    return (interval(fit["speedup"], fit["ci_low"], fit["ci_high"]) + f"; {fit['stock_slope']:+.3f} / "
            f"{fit['cadence_slope']:+.3f}" + "".join(f"; {f}" for f in fit.get("flags") or []))


def memory_section(data: dict, files: list[str], prefix: str) -> list[str]:
    rows = []
    for w, e in ordered(data):
        m = memory_figures(e)
        s, c = m.get("stock", {}), m.get("cadence", {})
        if not s and not c:
            continue
        ratio = c.get("session") / s["session"] if s.get("session") and c.get("session") is not None else None
        change = pct_change(c.get("peak"), s.get("peak"))
        rows.append([w, fmt(s.get("peak"), ".0f"), fmt(c.get("peak"), ".0f"),
                     DASH if change is None else f"{change:+.1f}%",
                     f"{fmt(s.get('session'), '.0f')} / {fmt(c.get('session'), '.0f')}"
                     + ("" if ratio is None else f" ({ratio:.2f})"),
                     f"{fmt(c.get('arena'), '.0f')} / {fmt(c.get('pool'), '.0f')}",
                     "; ".join(sorted({x["how"] for x in m.values()}))])
    out = ["## Memory", "", "Peak at the driver over the idle baseline with one session, one process per mode; per "
           "session: that peak less the model loaded without a session.", ""]
    out += [f"![memory]({prefix}{f})" for f in files] + ([""] if files else [])
    return out + [table(rows, ["workload", "stock peak MiB", "cadence peak MiB", "change", "per session MiB, stock / "
                               "cadence (ratio)", "cadence arena / graph pool MiB", "measured as"])
                  if rows else "No memory stage done.", ""]


def demand_text(graphs: dict, entries: dict) -> str:
    """'; 9.3 SPEAK/s x 84.6 ms = 0.78 s of kernels per s': the count's SPEAK units with audio per second times
    the steady unit's kernel-busy time in this run's DuplexCadence verify (one session, profiled); '' where
    either is missing."""
    per_s = graphs.get("speak_per_s")
    rec = (entries.get("verify") or {}).get("record") or {}
    k_ms = (((rec.get("modes") or {}).get("cadence") or {}).get("metrics") or {}).get("kernel_busy_ms_per_unit_p50")
    if per_s is None or not isinstance(k_ms, (int, float)):
        return ""
    return f"; {per_s:.1f} SPEAK/s x {k_ms:.1f} ms = {per_s * k_ms / 1000:.2f} s of kernels per s"


def sessions_section(data: dict, files: list[str], prefix: str) -> list[str]:
    rows = []
    for w, e in ordered(data):
        d = duplex_figures(e, w)
        if not d or not d["modes"]:
            continue
        fs, fc = d["modes"].get("stock"), d["modes"].get("cadence")
        oracle = ((duplex_figures(e, w, ("duplex_oracle",)) or {}).get("modes") or {}).get("cadence")
        how = ("oracle graphs" if fc and fc.get("oracle") else "unseen scripts" if fc and fc.get("unseen")
               else "one shared script")
        if how == "unseen scripts" and str(fc.get("prepare") or "").startswith("learned:"):
            how += f", {fc['prepare']} graphs learned from the other recordings"
        elif how == "unseen scripts" and fc.get("prepare") == "turns":
            how += ", every turn's graphs from the clocks"
        missing = "".join(f"; {m}: {status(e, h)}" for m, h in (("stock", "duplex_stock"), ("cadence", "duplex_cadence"))
                          if m not in d["modes"])
        g = (fc or {}).get("graphs")
        graphs = DASH if not g else (f"N={g['sessions']}: {g['graph_mib_per_session_max']:.0f} MiB, {g['captures']} "
                                     f"captures ({g['captures_inside_timed_units']} in a timed unit), "
                                     f"{g['eager_steps']} eager steps" + demand_text(g, e))
        rows.append([w, limit_text(fs), limit_text(fc), ratio_text(*ratio_bounds(fs, fc)), how,
                     limit_text(oracle) if oracle else DASH, graphs,
                     " / ".join(fmt(m.get("speak_vs_period_pct_mean"), "+.1f") for m in (fs or {}, fc or {})),
                     ", ".join(d["files"]) + "".join(f"; {m}: {mark}" for m, mark in d["marks"].items()) + missing
                     + timed_note(e, ("duplex_stock", "duplex_cadence")) + (f"; {d['error']}" if d["error"] else "")])
    out = ["## Sessions per GPU and SPEAK time", "",
           "N sessions on the one-second cadence for 60 s per count; a count is clean with zero missed units. "
           "`N (M missed x/y)`: N clean, M the next count tried missed x of y units; `N-K (...)`: the limit lies "
           "between N and K; `>= N`: no count tried missed. The targets are for unseen scripts: a figure whose "
           "sessions shared one script, or whose graphs came from their own script (oracle), is shown beside, "
           "never as the headline." + (" Kernels per s: the count's SPEAK units with audio per second times one "
           "unit's kernel-busy time in this run's verify, what a GPU running one kernel at a time would need; above "
           "1 only kernels of several sessions running at once can keep up." if any("SPEAK/s" in r[6] for r in rows)
           else ""), ""]
    out += [f"![sessions]({prefix}{f})" for f in files] + ([""] if files else [])
    return out + [table(rows, ["workload", "stock sessions", "DuplexCadence sessions", "cadence / stock", "scripts",
                               "with oracle graphs", "DuplexCadence graphs: most per session, captures, eager",
                               "1 session mean SPEAK vs 1 s, stock / cadence (%)", "records"])
                  if rows else "No duplex stage done.", ""]


def bytes_section(data: dict) -> list[str]:
    rows = []
    for w, e in ordered(data):
        rec = (e.get("verify") or {}).get("record")
        comp = (rec or {}).get("comparison")
        if not comp:
            continue
        n, bad = comp["units_compared"], comp.get("mismatches") or comp["mismatched_units"]
        aa = comp.get("aa_units_compared")
        again = [r for r in (comp.get("rounds") or [])[1:] if isinstance(r, dict)]
        later = sum(int(r.get("units_compared") or 0) for r in again)
        rows.append([w, f"{n - len(bad)}/{n}", str(comp["mismatched_units"]) if bad else "none",
                     DASH if not aa else f"{aa - len(comp['aa_mismatched_units'])}/{aa}",
                     DASH if not later else f"{later - sum(len(r.get('mismatched_units') or []) for r in again)}/{later}",
                     rec["verdict"]])
    return ["## Bytes", "", "Every unit of both modes hashed (sha256 of the float32 waveform and of the int16 PCM) "
            "and compared; in a paired record every pair of every process.", "",
            table(rows, ["workload", "stock vs cadence identical", "differing units", "A/A identical",
                         "older records: later rounds identical", "stage verdict"]) if rows else "No verify record.", ""]


def render(data: dict, refs: dict | None = None, written: dict | None = None, results_root: Path | None = None,
           prefix: str = "") -> str:
    """REPORT.md text of a loaded staged run (`load`). refs: workload -> [(label, reference record)];
    written: the plots by section (`plots`); prefix: put before each plot's file name (a report published
    elsewhere)."""
    written, state = written or {}, data["state"]
    rows = claim_rows(data)
    parts = [f"# DuplexCadence reproduction {data['run_dir'].name}", "", status_line(state), verdicts_line(state),
             gpu_coverage(data, results_root), "",
             "Verdicts: " + "; ".join(f"**{k}**: {v}" for k, v in VERDICTS.items()) + ".", "",
             "Published: the paper's figures, MiniCPM-o 4.5 at 10 Euler steps on one H200 with the released weights, "
             "the whole SPEAK unit; beside that configuration only. Ours: seeded random weights, the token-to-audio "
             "tail unless a row says otherwise, on the device under Provenance. Stock: the same figure for the stock "
             "path (ms per unit, MiB, sessions).", "",
             "## Verdicts", "", verdict_table(rows), "",
             *speed_section(data, written.get("speed", []), prefix),
             *memory_section(data, written.get("memory", []), prefix),
             *floor.section(data.get("floors") or []),
             *sessions_section(data, written.get("sessions", []), prefix),
             *bytes_section(data), *dropins.section(data.get("dropins") or [])]
    if refs:
        parts += ["## Against the reference run", "", *compare_lines(data, refs)]
    opts = state.get("options", {})
    parts += ["## Stages", "", *stages_list(data), "",
              "Each stage's folder holds its record, `log.txt` (what the stage printed) and its own REPORT.md.", "",
              "## Provenance", "", *provenance_list(data), "",
              "Parameters: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in opts.items()), ""]
    return "\n".join(parts)


def claims_json(data: dict, run: str | None = None) -> dict:
    """claims.json: the verdict table as data, each row with its run and the impl/ tree of its record."""
    run = run or data["run_dir"].name
    rows = []
    for r in claim_rows(data):
        e = data["workloads"].get(r.workload, {}).get(SOURCE.get(r.claim, "verify"), {})
        rec = e.get("record") or (e.get("duplex") or {}).get("record") or {}
        rows.append({**r.to_dict(), "run": run, "impl_tree": (rec.get("provenance") or {}).get("impl_tree"),
                     "gpu": gpu_name(rec) if rec else None})
    return {"schema": CLAIMS_SCHEMA, "run": run, "complete": counts(data["state"])[3], "verdicts": VERDICTS,
            "claims": rows}


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
        render(data, refs, {}, root)   # a malformed record fails here, before any plot is rewritten
        claims_json(data)
    except (TypeError, KeyError, AttributeError, StopIteration, ValueError) as exc:
        raise ValueError(f"{run_dir}: a record of the wrong shape in the run or its references "
                         f"({type(exc).__name__}: {exc})") from None
    return data, refs, root


def write(run_dir: str | Path, compare: list[str] | None = None, results_root: str | Path | None = None) -> Path:
    """Load the staged run, draw the plots, write REPORT.md and claims.json; returns REPORT.md's path.
    compare: reference run folders (default: those recorded in stages.json; `resolve_reference`). Raises as
    `prepare` does, before writing."""
    run_dir = Path(run_dir)
    data, refs, root = prepare(run_dir, compare, results_root)
    written = plots(data, run_dir)
    path = run_dir / "REPORT.md"
    path.write_text(render(data, refs, written, root))
    (run_dir / "claims.json").write_text(json.dumps(claims_json(data), indent=1) + "\n")
    return path


def publish(run_dir: str | Path, results_root: str | Path) -> tuple[Path, Path]:
    """The run's report at the fixed paths `<results_root>/REPORT.md` (its plots linked in the run's folder)
    and `<results_root>/CLAIMS.json`, after writing the run's own (`write`). Returns both paths. Raises as
    `prepare` does, and ValueError for a run folder outside results_root or a destination that cannot be
    written (checked before anything is)."""
    run_dir, root = Path(run_dir).resolve(), Path(results_root).resolve()
    try:
        prefix = Path(os.path.relpath(run_dir, root)).as_posix() + "/"
    except ValueError:
        raise ValueError(f"--publish: {run_dir} is not on the drive of {root}") from None
    if prefix.startswith("../"):
        raise ValueError(f"--publish: {run_dir} is not inside {root}; publish a run folder under it")
    data, refs, _ = prepare(run_dir, None, root)
    for path in (root / "REPORT.md", root / "CLAIMS.json"):
        if path.exists() and not path.is_file() or not os.access(path if path.exists() else root, os.W_OK):
            raise ValueError(f"--publish: {path} cannot be written (a folder, or no write access)")
    written = plots(data, run_dir)
    (run_dir / "REPORT.md").write_text(render(data, refs, written, root))
    (run_dir / "claims.json").write_text(json.dumps(claims_json(data), indent=1) + "\n")
    report, claims = root / "REPORT.md", root / "CLAIMS.json"
    report.write_text(render(data, refs, written, root, prefix=prefix))
    claims.write_text(json.dumps(claims_json(data), indent=1) + "\n")
    return report, claims
