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
