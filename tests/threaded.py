"""Sessions speaking on threads beside one more thread that opens and closes sessions all the time."""
from __future__ import annotations

import random
import threading
import time
from typing import Callable


def beside_churn(speakers: list[Callable[[], None]], open_session: Callable[[int], object], *,
                 seed: int, pause_s: float = 0.01) -> list[str]:
    """Run each of `speakers` on a thread of its own while one more thread opens `open_session(k)` for k = 0,
    1, ..., waits up to `pause_s`, closes it and waits up to `pause_s` again (pauses seeded by `seed`; none
    with pause_s=0: back to back), until every speaker has returned. Returns every exception as
    "session I: Type: message" (I: the speaker's index) or "churn: Type: message"; an empty list when
    nothing raised."""
    errors, done = [], threading.Event()

    def run(i):
        try:
            speakers[i]()
        except Exception as exc:   # noqa: BLE001 - every exception is a failure, returned
            errors.append(f"session {i}: {type(exc).__name__}: {exc}")

    def churn():
        rng, k = random.Random(seed), 0
        try:
            while not done.is_set():
                session = open_session(k)
                if pause_s:
                    time.sleep(rng.uniform(0, pause_s))
                session.close()
                if pause_s:
                    time.sleep(rng.uniform(0, pause_s))
                k += 1
        except Exception as exc:   # noqa: BLE001
            errors.append(f"churn: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(speakers))]
    opener = threading.Thread(target=churn)
    opener.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    opener.join()
    return errors


class Held:
    """`enter()`'s context manager entered on a daemon thread of its own and held until `let_go()` (at most
    `timeout` s): `entered` is set once inside. With `log`, `enter_note` is appended on entry and `leave_note`
    just before leaving; `hold=False` leaves at once (a thread that only has to get in)."""

    def __init__(self, enter: Callable[[], object], *, log: list | None = None, enter_note=None, leave_note=None,
                 hold: bool = True, timeout: float = 10.0):
        self.entered, self.release = threading.Event(), threading.Event()
        if not hold:
            self.release.set()

        def run():
            with enter():
                if enter_note is not None:
                    log.append(enter_note)
                self.entered.set()
                self.release.wait(timeout)
                if leave_note is not None:
                    log.append(leave_note)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def let_go(self) -> None:
        self.release.set()
