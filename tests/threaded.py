"""Sessions speaking on threads beside one more thread that opens and closes sessions all the time."""
from __future__ import annotations

import random
import threading
import time
from typing import Callable


def beside_churn(speakers: list[Callable[[], None]], open_session: Callable[[int], object], *,
                 seed: int) -> list[str]:
    """Run each of `speakers` on a thread of its own while one more thread opens `open_session(k)` for k = 0,
    1, ..., waits up to 10 ms, closes it and waits up to 10 ms again (pauses seeded by `seed`), until every
    speaker has returned. Returns every exception as "session I: Type: message" (I: the speaker's index) or
    "churn: Type: message"; an empty list when nothing raised."""
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
                time.sleep(rng.uniform(0, 0.01))
                session.close()
                time.sleep(rng.uniform(0, 0.01))
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
