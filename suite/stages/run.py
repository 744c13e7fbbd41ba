"""A sitting over a plan (`Sitting`: the budget rule, the state saved as each stage starts and ends, the
console), one stage at a time on this machine (`run_plan`). A sitting stops cleanly (remaining stages
`pending`) when what is left of `--budget-s` is less than the next stage is expected to need; its first
stage always starts and every timeout is cut to what is left. An attempt is done (exit 0), skipped
(EXIT_UNAVAILABLE) or failed, except a duplex harness exiting EXIT_INVALID beside a complete INVALID record:
done, as a verify stage's INVALID run.json is.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from suite.records import (EXIT_INVALID, STAGE_TIMESPEC, StageState, family, invalid_codes, overlapping, read_json,
                           record_reasons, utc_now)
from suite.stages.plan import Stage, estimate_s, estimated, stage_argv
from suite.stages.process import Outcome, run_process, stopping
from suite.stages.state import State

#: Runs one stage: (stage, stage dir, timeout s, options) -> Outcome.
Executor = Callable[[Stage, Path, float, dict], Outcome]


def subprocess_executor(stage: Stage, out_dir: Path, timeout_s: float, options: dict) -> Outcome:
    """The stage's own process on this machine (`run_process`)."""
    return run_process(stage_argv(stage, str(Path(out_dir).resolve()), options), out_dir, timeout_s,
                       label=f"{stage.name}: ")


def read_verdict(out_dir: Path, st: StageState) -> None:
    """The stage record's verdict, invalid reasons and codes, what differs, the units compared (a paired
    record: the script's units, each in every process and pass) and the GPU it ran on, into st (None and [] where there is no record). verify, memory: run.json; duplex: duplex.json,
    complete (VALID / INVALID) or a checkpoint (PARTIAL, with its runs' reasons so far)."""
    st.verdict, st.invalid_reasons, st.invalid_codes, st.mismatched_units = None, [], [], []
    st.units_compared = None
    if family(st.harness) == "duplex":
        rec = read_json(out_dir / "duplex.json")
        if rec is None:
            return
        st.invalid_reasons = record_reasons(rec)
        st.invalid_codes = invalid_codes(st.invalid_reasons)
        st.mismatched_units = [r for r, c in zip(st.invalid_reasons, st.invalid_codes) if c == "mismatch"]
    else:
        rec = read_json(out_dir / "run.json")
        if rec is None:
            return
        st.invalid_reasons = list(rec.get("invalid_reasons", []))
        st.invalid_codes = list(rec.get("invalid_codes", []))
        comp = rec.get("comparison") or {}
        st.mismatched_units = list(comp.get("mismatched_units", []))
        st.units_compared = comp.get("script_units_compared", comp.get("units_compared"))
    st.verdict = rec.get("verdict")
    st.gpu_name = ((rec.get("provenance") or {}).get("device") or {}).get("gpu_name") or "cpu"


def bytes_clause(st: StageState) -> str:
    """What a stage's record says of the bytes, one clause ('' for a stage that compares none)."""
    if family(st.harness) == "duplex" and st.verdict:
        n = len(st.mismatched_units)
        return f"{n} session(s) DIFFER from themselves alone" if n else "every session byte-identical to itself alone"
    if st.units_compared is not None:
        bad = st.mismatched_units
        return (f"{st.units_compared - len(bad)}/{st.units_compared} units byte-identical, stock vs cadence"
                + (f"; DIFFERING: {bad}" if bad else ""))
    return ""


class Sitting:
    """One sitting over a plan: the budget rule, the state saved as each stage starts and ends, the log.
    `begin(stage)` returns (stage dir, timeout) or None (stopped: the stage stays pending); `end(...)`
    records an attempt and says whether to retry it (a failed attempt, fewer than 1 + retries so far)."""

    def __init__(self, stages: list[Stage], state: State, options: dict, *, budget_s: float | None,
                 clock: Callable[[], float], provenance: dict, log: Callable[[str], None],
                 after: Callable[[str], object] | None, retries: int = 0, where: str | None = None):
        self.state, self.options, self.budget_s, self.clock, self.log = state, options, budget_s, clock, log
        self.after, self.retries, self.provenance = after, retries, provenance
        self.t0 = clock()
        self.record = {"started_utc": utc_now(), "budget_s": budget_s, "ray": where, "command": options.get("command"),
                       "git_rev": provenance.get("git_rev"), "impl_tree": provenance.get("impl_tree"), "ran": [],
                       "kept": [], "skipped": [], "stopped": None}
        state.data.setdefault("sittings", []).append(self.record)
        self.todo: list[Stage] = []
        for stage in stages:
            st = state.get(stage)
            st.budget_s, st.dir = stage.budget_s, stage.name
            if st.status == "done":
                self.record["kept"].append(stage.name)
            elif stage.skip:
                st.status, st.reason = "skipped", stage.skip
                self.record["skipped"].append(stage.name)
            else:
                self.todo.append(stage)
        self.number: dict[str, int] = {}
        state.save()
        total = sum(estimate_s(s, state.stages) for s in self.todo)
        unknown = sum(estimate_s(s, state.stages) for s in self.todo if not estimated(s, state.stages))
        time = (f"about {_duration(total)} of stage time" if not unknown else
                f"at most {_duration(total)} of stage time (their budgets: no stage of their kind has run yet)"
                if unknown == total else f"about {_duration(total)} of stage time ({_duration(unknown)} of it the "
                f"budgets of stages of a kind not run yet)")
        log(f"plan: {len(self.todo)} stage(s) to run, {time}"
            + (f"; {len(self.record['kept'])} done (kept)" if self.record["kept"] else "")
            + (f"; {len(self.record['skipped'])} skipped" if self.record["skipped"] else "")
            + (f"; on Ray ({where})" if where else ""))

    def begin(self, stage: Stage) -> tuple[Path, float] | None:
        st = self.state.get(stage)
        left = None if self.budget_s is None else self.budget_s - (self.clock() - self.t0)
        need = estimate_s(stage, self.state.stages)
        if self.record["stopped"] or (left is not None and (left <= 0 or (self.number and left < need))):
            if not self.record["stopped"]:
                self.record["stopped"] = (f"budget: {max(left, 0):.0f} s of --budget-s {self.budget_s:g} left before "
                                          f"{stage.name}, which is expected to need {need:.0f} s; rerun with --resume")
                self.log(f"stop: {self.record['stopped']}")
            last = f"; last attempt {st.status}: {st.reason}" if st.status == "failed" else ""
            st.status, st.reason = "pending", "not run yet: " + self.record["stopped"] + last
            self.state.save()
            return None
        timeout = stage.budget_s if left is None else min(stage.budget_s, left)
        out_dir = self.state.run_dir / stage.name
        if out_dir.exists():
            _clear(out_dir)
        self.number.setdefault(stage.name, len(self.number) + 1)
        st.attempts += 1
        st.started_utc, st.ended_utc, st.timeout_s, st.overlapped = utc_now(STAGE_TIMESPEC), None, timeout, None
        st.git_rev, st.impl_tree = self.provenance.get("git_rev"), self.provenance.get("impl_tree")
        st.status, st.reason = "running", ""
        self.state.save()
        expect = f"expected about {_duration(need)}" if estimated(stage, self.state.stages) else "no estimate yet"
        self.log(f"{self._label(stage)}: start{' again' if st.attempts > 1 and self.retries else ''} ({expect}, "
                 f"budget {stage.budget_s:g} s, timeout {timeout:.0f} s)")
        return out_dir, timeout

    def end(self, stage: Stage, outcome: Outcome, seconds: float, ended: dict | None = None) -> bool:
        """Record an attempt. ended: name -> end time of stages that ended but are not recorded yet."""
        st = self.state.stages[stage.name]
        st.seconds = round(seconds, 3)
        st.started_utc = outcome.started_utc or st.started_utc
        st.ended_utc = outcome.ended_utc or utc_now(STAGE_TIMESPEC)
        st.node, st.gpu = outcome.node, outcome.gpu
        st.status, st.returncode, st.reason = outcome.status, outcome.returncode, outcome.reason
        st.command, st.log_tail = list(outcome.command), list(outcome.log_tail)
        if outcome.status == "failed" and outcome.reason.startswith("timed out") and st.timeout_s < stage.budget_s:
            st.reason = (f"the sitting's --budget-s ran out during the stage (timeout cut to {st.timeout_s:.0f} s "
                         f"of its {stage.budget_s:g} s budget); rerun with --resume")
        read_verdict(self.state.run_dir / stage.name, st)
        if (outcome.status == "failed" and family(stage.harness) == "duplex" and st.verdict == "INVALID"
                and outcome.returncode == EXIT_INVALID):
            st.status, st.reason = "done", ""          # a complete INVALID record: done, as verify's
        st.overlapped = overlapping(stage.name, {n: vars(x) for n, x in self.state.stages.items()}, ended)
        self.record["ran"].append(stage.name)
        where = "".join(f" {k} {v}" for k, v in (("on", st.node), ("GPU", st.gpu)) if v is not None)
        self.log(f"{self._label(stage)}: {st.status} in {st.seconds:.1f} s{where}"
                 + "".join(f"; {c}" for c in (bytes_clause(st),) if c)
                 + (f"; beside {', '.join(st.overlapped)}" if st.overlapped else "")
                 + (f"; record verdict {st.verdict}" + (f" ({', '.join(dict.fromkeys(st.invalid_codes))})"
                                                       if st.invalid_codes else "") if st.verdict else "")
                 + (f": {st.reason}" if st.reason else ""))
        if st.log_tail and st.status != "done":
            self.log("  | " + "\n  | ".join(st.log_tail[-12:]))
        cut = st.timeout_s is not None and st.timeout_s < stage.budget_s     # the sitting's budget ended it
        retry = st.status == "failed" and st.attempts <= self.retries and not cut and not stopping()
        if retry:
            st.reason = f"attempt {st.attempts} failed ({st.reason}); retried"
        self.state.save()
        if self.after is not None:
            self.after(stage.name)
        return retry

    def close(self) -> dict:
        """End the sitting. The stages it ran get their `overlapped` again, from every stage's final times
        (on Ray a stage's real start is known only when its task returns)."""
        stages = {n: vars(x) for n, x in self.state.stages.items()}
        for name in dict.fromkeys(self.record["ran"]):
            self.state.stages[name].overlapped = overlapping(name, stages)
        self.record["ended_utc"] = utc_now()
        self.state.save()
        return self.record

    def _label(self, stage: Stage) -> str:
        return f"stage {self.number.get(stage.name, '?')} of {len(self.todo)} {stage.name}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _clear(folder: Path) -> None:
    """Remove the files an earlier attempt left in a stage folder (not the folder)."""
    for p in sorted(folder.rglob("*"), reverse=True):
        if p.is_dir():
            p.rmdir()
        else:
            p.unlink()


def run_plan(stages: list[Stage], state: State, options: dict, *, budget_s: float | None = None,
             execute: Executor = subprocess_executor, clock: Callable[[], float] = time.monotonic,
             provenance: dict | None = None, log: Callable[[str], None] = print,
             after: Callable[[str], object] | None = None, retries: int = 0) -> dict:
    """Run the stages one at a time in plan order within budget_s seconds (None: no budget), saving state as
    each starts and ends (`Sitting`). Kept: done stages; recorded without running: skipped ones; a failed
    attempt is run again up to `retries` times. after(stage name): after every attempt (the report).
    Returns the sitting's record (also in state.data["sittings"]). A stage is saved as `running` while its
    process runs (a killed sitting leaves it so; `State.open` fails it, rerun on resume). An exception
    from `execute`, or a KeyboardInterrupt, propagates."""
    sitting = Sitting(stages, state, options, budget_s=budget_s, clock=clock, provenance=provenance or {},
                      log=log, after=after, retries=retries)
    for stage in sitting.todo:
        while (begun := sitting.begin(stage)) is not None:
            t = clock()
            outcome = execute(stage, begun[0], begun[1], options)
            if not sitting.end(stage, outcome, clock() - t):
                break
    return sitting.close()
