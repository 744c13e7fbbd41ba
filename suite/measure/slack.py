"""The capture policy a server can run: graphs from the clocks, captured in a session's slack, never inside a
timed unit, never from the session's future.

At open the harness calls `session.prepare(None)` (voice registration: what the clocks say every turn of the
voice needs), and with `--prepare turns` also `session.prepare(turn_family(...))`: every signature a turn of full
units between a first and a last unit of any size meets, from the clocks alone. Then, per unit of the cadence (`SlackCapture`):

* `note(unit, ...)`, right after the unit's work and its lateness are recorded (outside its timed window): the
  session's counters since the last slack job give what ran inside the unit (captures: must stay 0; eager
  first occurrences, `eager_fallbacks`); the signatures the unit met come from the clocks copied before it,
  advanced by the unit's payload size and final flag (`ClockState.unit`: what `speak` computed from the same
  payload); those not asked for yet are kept for the job. Host arithmetic only.
* the job (`job(left)`), in the session's slack (suite.measure.scheduler: on the session's own thread under
  "threads", in the scheduler's idle time or right after the unit under "edf"): the likely next unit's
  signatures, `unit(max_payload, final=False)` of a copy of the clocks now (a turn opened first where the last
  one ended), then those noted since the last job, each captured with `session.prepare([it])` under `lock`
  (the model's tail lock for sessions that are not concurrent); prepare skips what it holds already. The
  likely next unit's signatures are always prepared: left for later, the next unit would meet them without a
  graph and run eagerly, and a session that is always late would never capture. `left()` gives the seconds
  before the slack must end (the scheduler: the session's next release on the period grid); a signature
  noted from past units is started only while its cost, the time the last prepare that captured (or tried
  to) a signature of its step took here, fits in what is left (a step not timed yet: while any time is left;
  a prepare of a signature the session held already does not count). The rest waits for a later
  slack (counted: `deferred`), so catching up on past units does not run into the next one.

Nothing here reads a unit before it has run: the next unit's prediction uses only the clocks and the declared
`Capabilities.max_payload`. The per-session figures (`summary`): captures during the cadence, captures inside
timed units, eager first occurrences, warm-up runs inside units, the slack jobs, their time and the signatures
they left for a later slack.
"""
from __future__ import annotations

import contextlib
import time

from duplexcadence.clocks import ClockError
from duplexcadence.errors import InputError
from duplexcadence.session import SessionStats

COUNTERS = ("captures", "eager_fallbacks", "warmup_runs", "capture_failures")


def next_signatures(clocks, capabilities, turn_open: bool) -> list:
    """The likely next unit's signatures, walked on `clocks` (a copy the caller gives up: it is advanced): a full
    unit (capabilities.max_payload), not final, in a new turn where none is open (a session whose turn_state is
    "stream" never opens one). [] where the clocks refuse it (a bound: nothing further can run at that size)."""
    try:
        if not turn_open and capabilities.turn_state != "stream":
            clocks.start_turn()
        return clocks.unit(capabilities.max_payload, False)
    except InputError:
        return []


def turn_family(clocks, capabilities, max_full: int = 8) -> list:
    """Every signature a turn can meet from `clocks` (a copy is walked), known from the clocks alone: a turn
    opened, its first unit of any size (0 to capabilities.max_payload tokens or frames, final or not), then full
    units until one repeats the previous one's signatures (at most `max_full`), and after each of those the final
    unit of any size. What the clocks say every turn of a voice can need where its units are full between a
    first and a last unit of any size; a turn that carries a shorter unit inside it can meet others. Sizes the
    clocks refuse are left out. Ordered, without repeats."""
    found: dict = {}

    def add(c, size, final):
        try:
            found.update(dict.fromkeys(c.copy().unit(size, final)))
        except (InputError, ClockError):
            pass
    c, prev = clocks.copy(), None
    c.start_turn()
    for k in range(max_full):
        for size in range(capabilities.max_payload + 1):
            add(c, size, True)
            if k == 0:
                add(c, size, False)
        try:
            sigs = c.unit(capabilities.max_payload, False)
        except (InputError, ClockError):
            break
        found.update(dict.fromkeys(sigs))
        if sigs == prev:
            break
        prev = sigs
    return list(found)


class SlackCapture:
    """The capture policy of one cadence session (module docstring). lock: a context manager held around every
    `prepare` of the slack (None: none). `start()` after the session's prepare(None) and warm-up, before its
    first unit; then `note(...)` after every unit with work, and the returned `job` in its slack."""

    def __init__(self, session, lock=None):
        self.session = session
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.known: set = set()             # signatures passed to prepare in the slack (captured, or refused)
        self.pending: dict = {}             # met since the last job, not asked for yet (ordered)
        self.clocks = None                  # the session's clocks before its next unit
        self.last: SessionStats | None = None
        self.turn_open = False
        self.cost: dict = {}                # step name -> seconds the last capturing prepare of one took
        self.totals = {"in_units": dict.fromkeys(COUNTERS, 0), "in_slack": dict.fromkeys(COUNTERS, 0),
                       "jobs": 0, "signatures_asked": 0, "deferred": 0, "slack_ms": 0.0, "slack_ms_max": 0.0}
        self.units: list[dict] = []         # per unit with work: index and what ran inside it

    def start(self, turn_open: bool = False) -> None:
        """Before the cadence: the counters and clocks the first unit is compared with."""
        self.last, self.clocks, self.turn_open = self.session.stats(), self.session.clocks(), turn_open

    def note(self, unit, *, opened_turn: bool, turn_open: bool):
        """After `unit` (a suite.measure.duplex_session.DuplexUnit with work) ran: what ran inside it, the
        signatures it met that the slack has not asked for yet. Returns the slack job (`job`)."""
        now = self.session.stats()
        inside = {k: getattr(now, k) - getattr(self.last, k) for k in COUNTERS}
        for k, v in inside.items():
            self.totals["in_units"][k] += v
        met, clocks = [], self.clocks
        try:
            if opened_turn:
                clocks.start_turn()
            met = clocks.unit(unit.size, unit.kind == "SPEAK" and unit.final)
        except InputError:          # speak accepted the unit, so its clocks do too; nothing to capture if not
            met = []
        new = [s for s in met if s not in self.known]
        self.pending.update(dict.fromkeys(new))
        self.units.append({"index": unit.index, **inside, "met": len(met), "new_signatures": len(new)})
        self.clocks, self.last, self.turn_open = self.session.clocks(), now, turn_open
        return self.job

    def next_signatures(self) -> list:
        """The likely next unit's signatures from the session's clocks now (`next_signatures`)."""
        return next_signatures(self.session.clocks(), self.session.capabilities, self.turn_open)

    def job(self, left=None) -> dict:
        """The slack work: capture the likely next unit's signatures (always), then what the last units met
        without a graph, one prepare each, while its step's cost fits in `left()` seconds (None: no bound,
        e.g. a session run alone). Returns {"signatures", "captures", "capture_failures", "warmup_runs",
        "deferred", "ms"}."""
        t0 = time.perf_counter()
        nxt = set(self.next_signatures())
        want = [s for s in dict.fromkeys([*nxt, *self.pending]) if s not in self.known]
        before, asked = self.session.stats(), []
        for sig in want:
            if sig not in nxt and left is not None and left() <= self.cost.get(sig.step, 0.0):
                break                               # no time for it in this slack: a later one takes it
            t, was = time.perf_counter(), self.session.stats()
            with self.lock:
                self.session.prepare([sig])
            now = self.session.stats()
            if any(getattr(now, k) > getattr(was, k) for k in ("captures", "capture_failures", "warmup_runs")):
                self.cost[sig.step] = time.perf_counter() - t   # a prepare that held it already costs nothing
            self.known.add(sig)
            asked.append(sig)
        self.pending = {s: None for s in self.pending if s not in self.known}
        deferred = len(want) - len(asked)
        after = self.session.stats()
        delta = {k: getattr(after, k) - getattr(before, k) for k in COUNTERS}
        for k, v in delta.items():
            self.totals["in_slack"][k] += v
        ms = (time.perf_counter() - t0) * 1e3
        self.totals["jobs"] += 1
        self.totals["signatures_asked"] += len(asked)
        self.totals["deferred"] += deferred
        self.totals["slack_ms"] += ms
        self.totals["slack_ms_max"] = max(self.totals["slack_ms_max"], ms)
        self.last = after
        return {"signatures": len(asked), "captures": delta["captures"], "capture_failures": delta["capture_failures"],
                "warmup_runs": delta["warmup_runs"], "deferred": deferred, "ms": ms}

    def summary(self) -> dict:
        """Per session over the cadence: captures during the cadence (in the slack) and inside timed units (must
        be 0), eager first occurrences (eager_fallbacks inside units), warm-up runs inside units, slack jobs,
        signatures asked for, signatures left for a later slack (each time one was), slack time."""
        u, s = self.totals["in_units"], self.totals["in_slack"]
        return {"captures_during_cadence": s["captures"], "captures_inside_timed_units": u["captures"],
                "eager_fallbacks": u["eager_fallbacks"], "warmup_runs_inside_units": u["warmup_runs"],
                "capture_failures": s["capture_failures"] + u["capture_failures"],
                "slack_warmup_runs": s["warmup_runs"], "slack_jobs": self.totals["jobs"],
                "signatures_asked": self.totals["signatures_asked"], "signatures_deferred": self.totals["deferred"],
                "slack_ms_total": self.totals["slack_ms"],
                "slack_ms_max": self.totals["slack_ms_max"]}
