"""REPORT.md of a duplex harness folder (suite.measure.duplex's duplex.json alone), from its record: what ran
and where, then per workload and mode the session limit the counts bracket and one row per count: SPEAK units
and misses, SPEAK units with audio per second (suite.records.speak_per_second), SPEAK time, graph captures
during the cadence and inside timed units (must be 0), steps run eagerly inside units (a signature with no
graph yet; a step family's first run on a session's thread), graph memory, slack jobs past their next
release, and every session's bytes against itself run alone. A staged reproduction renders its duplex stages
in suite.report.document instead.
"""
from __future__ import annotations

import ast
import shlex

from suite.records import speak_per_second
from suite.report.claims import limit_text
from suite.report.figures import gpu_name, is_oracle, mode_figures
from suite.report.text import DASH, fmt, table

MIB = 2 ** 20
COLUMNS = ["sessions", "SPEAK units", "SPEAK units with audio per s", "missed", "SPEAK ms mean / p50 / p99", "lateness at most (ms, < 0: early)",
           "captures in slack / in timed units", "eager steps in units: no graph yet + a family's first on a thread", "graph MiB: most per session / all",
           "slack jobs past their release", "bytes vs alone"]


def _bytes(run: dict) -> str:
    b = run.get("bytes") or {}
    if not b:
        return DASH
    bad, unchecked = len(b.get("mismatches") or []), len(b.get("unchecked") or [])
    text = f"{b.get('checked', 0) - bad} of {b.get('checked', 0)} equal"
    return text + (f", {unchecked} not compared" if unchecked else "")


def _overruns(run: dict):
    """Slack jobs that ran past their session's next release: the record's count, else from its units."""
    if "slack_jobs_overrun" in run:
        return run["slack_jobs_overrun"]
    units = [u for u in run.get("units") or [] if isinstance(u, dict) and "slack_overrun_ms" in u]
    return sum((u["slack_overrun_ms"] or 0) > 0 for u in units) if units else DASH


def _row(run: dict, period_s: float) -> list:
    if run.get("refused"):
        return [run["sessions"], "refused: " + str(run.get("reason") or run.get("refused"))] + [DASH] * 9
    m = run.get("metrics") or {}
    graphs = run.get("graph_bytes_per_session_max")
    return [run["sessions"], m.get("speak_units", DASH), fmt(speak_per_second(run.get("units") or [], period_s), ".2f"),
            m.get("speak_misses", m.get("misses", DASH)),
            " / ".join(fmt(m.get(k), ".1f") for k in ("speak_ms_mean", "speak_ms_p50", "speak_ms_p99")),
            fmt(m.get("max_lateness_ms"), ".0f"),
            f"{run.get('captures_during_cadence', DASH)} / {run.get('captures_inside_timed_units', DASH)}",
            f"{run.get('eager_fallbacks_during_cadence', DASH)} + {run.get('warmup_runs_during_cadence', DASH)}",
            DASH if graphs is None else f"{graphs / MIB:.0f} / {(run.get('graph_bytes_end_total') or 0) / MIB:.0f}",
            _overruns(run), _bytes(run)]


def _command(value) -> str:
    """The recorded command as one shell line (provenance holds the argv list, or its repr)."""
    if isinstance(value, str) and value.startswith("["):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return shlex.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value or DASH)


def render(record: dict, plots: list[str] = ()) -> str:
    """The report's Markdown; plots: image files beside it (suite.report.plots.duplex_plots), shown under
    their workload. Raises KeyError / TypeError for a record without workloads (read_duplex checks that
    before)."""
    prov, params = record.get("provenance") or {}, record.get("parameters") or {}
    reasons = record.get("invalid_reasons") or []
    out = [f"# Duplex sessions: {', '.join(record['workloads'])}", "",
           f"**{record.get('verdict', 'no verdict')}**" + (": " + "; ".join(map(str, reasons)) if reasons else ""), "",
           f"- ran: {prov.get('date_utc', DASH)} on {gpu_name(record) or DASH}, commit {str(prov.get('git_rev'))[:7]}, "
           f"impl tree {str(prov.get('impl_tree'))[:7]}, capture gate {prov.get('capture_gate') or 'not recorded'}",
           f"- cadence: {fmt(params.get('seconds'), 'g')} s per count, period {fmt(params.get('period_s'), 'g')} s, "
           f"scripts {params.get('traffic', DASH)} (recordings: {params.get('recordings') or 'all'}), graphs at open: "
           f"{params.get('prepare', DASH)}",
           f"- command: `{_command(prov.get('command'))}`", "",
           "A count is clean with zero missed units. `N (M missed x/y)`: N clean, M the next count tried missed x of "
           "y units; `N-K`: the limit lies between N and K; `>= N`: no count tried missed; `<= N (...)`: no count "
           "tried was clean. Capture gate: how a capture in one session's slack runs beside other sessions' units "
           "(duplexcadence.gate); slack: where a session's slack work runs (`thread`: on its own thread after its "
           "unit; `idle`: in the scheduler's idle time); bytes vs alone: each session against the same session run "
           "alone.", ""]
    for name, w in record["workloads"].items():
        for mode, m in (w.get("modes") or {}).items():
            fig = mode_figures(m, params.get("seconds"), w.get("ar"))
            search = m.get("search") or {}
            label = "oracle graphs (the sessions' own scripts)" if is_oracle(m) else f"graphs: {m.get('prepare')}"
            first = next((r for r in m.get("runs") or [] if isinstance(r, dict) and r.get("slack")), {})
            out += [f"## {name}, {mode}", "",
                    f"Sessions per GPU: **{limit_text(fig)}** ({label}; policy {m.get('policy', DASH)}, slack "
                    f"{first.get('slack', DASH)})"
                    + (f"; the search stopped: {search['stopped']}" if search.get("stopped") else ""), "",
                    table([_row(r, params.get("period_s") or 1.0) for r in m.get("runs") or [] if isinstance(r, dict)],
                          COLUMNS), ""]
            out += [f"- {n}" for n in (w.get("notes") or [])] + ([""] if w.get("notes") else [])
        mine = [f for f in plots if f.startswith(f"{name}_")]
        out += [f"![{f}]({f})" for f in mine] + ([""] if mine else [])
    return "\n".join(out)
