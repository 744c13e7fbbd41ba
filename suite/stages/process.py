"""A stage's process: run it, time-limited, logged, killed with its sitting; and the same as a Ray task.

`run_process` runs `python -m <argv>` from the repository root (impl/ and the root first on PYTHONPATH) in
a session of its own, output to `<dir>/log.txt`, the whole group killed at its timeout, and killed when
the process that started it dies (Linux: PR_SET_PDEATHSIG). `stage_task` is what a Ray worker runs: the
same in a temporary folder, returning the folder's files to the driver. This module imports nothing
heavy, so a Ray worker starts fast.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from suite.records import EXIT_UNAVAILABLE, REPO_ROOT, STAGE_TIMESPEC, utc_now

LOG_TAIL_LINES = 20
RELAY_S = 60.0          # the last line of a running stage's log, relayed this often (once; then that it runs)
OUT = "{out}"           # stands for the stage's folder in a task's argv (the worker makes it)


@dataclass
class Outcome:
    """What one attempt of a stage came to. status: "done" | "failed" | "skipped". started / ended: when its
    process ran (utc, ms); node, gpu: where (None: this machine, not pinned)."""
    status: str
    returncode: int | None = None
    reason: str = ""
    command: list = field(default_factory=list)
    log_tail: list = field(default_factory=list)
    started_utc: str | None = None
    ended_utc: str | None = None
    node: str | None = None
    gpu: int | None = None


#: Process-group ids of the stage processes running now: `kill_live_stages` ends them with the sitting.
_LIVE: set[int] = set()
_LIVE_LOCK = threading.RLock()
_STOPPING = threading.Event()


def stopping() -> bool:
    """True once `kill_live_stages` ran: the sitting is being stopped."""
    return _STOPPING.is_set()


def kill_live_stages() -> list[int]:
    """SIGKILL the process group of every stage process running now (each runs in a session of its own, so
    a signal to the sitting does not reach it); no stage process starts after this. Returns their ids."""
    killed = []
    with _LIVE_LOCK:
        _STOPPING.set()
        pgids = list(_LIVE)
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        except ProcessLookupError:
            pass
    return killed


def _tail(path: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    try:
        return [line[:300] for line in path.read_text(errors="replace").splitlines()[-n:]]
    except OSError:
        return []


#: Host-thread variables a stage process takes from the driver, not from the worker that starts it: a Ray
#: worker sets OMP_NUM_THREADS to its task's CPUs (1), and the flow_hift voice prompt's host features then come
#: out other bytes than with torch's default threads.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def thread_env() -> dict[str, str | None]:
    """This process's THREAD_VARS (None: unset), for `run_process(threads=...)` on another process or node."""
    return {k: os.environ.get(k) for k in THREAD_VARS}


def run_process(argv: list[str], out_dir: Path, timeout_s: float, *, label: str = "",
                relay: Callable[[str], None] | None = print, threads: dict[str, str | None] | None = None) -> Outcome:
    """Run `python -m argv` from the repository root with impl/ and the root first on PYTHONPATH, in a
    session of its own, output to out_dir/log.txt; the group killed at timeout_s. relay: gets the log's last
    line every RELAY_S seconds while it runs (None: silent). threads: THREAD_VARS to set (None: unset) instead
    of this process's (`thread_env()` of the driver)."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", *argv]
    env = dict(os.environ)
    for key, value in (threads or {}).items():
        if key not in THREAD_VARS:
            raise ValueError(f"threads: expected keys among {THREAD_VARS}, got {key!r}")
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    roots = [str(REPO_ROOT / "impl"), str(REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(roots + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                 if p and p not in roots])
    log = out_dir / "log.txt"
    started, proc = utc_now(STAGE_TIMESPEC), None
    with open(log, "w") as fh:
        try:
            with _LIVE_LOCK:
                if _STOPPING.is_set():
                    return Outcome("failed", None, "the sitting was stopped before this stage started", argv)
                proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                        start_new_session=True, preexec_fn=_die_with_parent)
                _LIVE.add(proc.pid)
            deadline, t0, relayed = time.monotonic() + timeout_s, time.monotonic(), None
            while True:
                try:
                    rc = proc.wait(timeout=max(0.0, min(RELAY_S, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        return Outcome("failed", None, f"timed out after {timeout_s:.0f} s (killed); rerun with "
                                       f"--resume and a larger --stage-budget-s", argv, _tail(log), started,
                                       utc_now(STAGE_TIMESPEC))
                    if relay is not None and (last := _tail(log, 1)):
                        fresh, relayed = last[0] != relayed, last[0]
                        relay(f"  | {label}{last[0]}" if fresh else
                              f"  | {label}(running {time.monotonic() - t0:.0f} s, no new line)")
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
                _LIVE.discard(proc.pid)
    ended, tail = utc_now(STAGE_TIMESPEC), _tail(log)
    if rc == 0:
        return Outcome("done", rc, "", argv, tail, started, ended)
    if rc == EXIT_UNAVAILABLE:
        return Outcome("skipped", rc, tail[-1] if tail else "mode not available", argv, tail, started, ended)
    return Outcome("failed", rc, f"exit status {rc}: " + (tail[-1] if tail else "no output"), argv, tail, started,
                   ended)




def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when its parent dies (a killed sitting or Ray worker)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):                   # not Linux: the timeout still ends it
        pass


def stage_task(argv: list[str], timeout_s: float, label: str = "", threads: dict | None = None) -> dict:
    """A Ray task: `run_process` in a fresh temporary folder (`OUT` in argv stands for it; threads: the
    driver's `thread_env()`), then the folder's files as bytes. Returns {"outcome": Outcome fields with this
    node and GPU, "files": {path: bytes}}."""
    import ray

    tmp = Path(tempfile.mkdtemp(prefix="duplexcadence-stage-"))
    try:
        outcome = run_process([a.replace(OUT, str(tmp)) for a in argv], tmp, timeout_s, label=label,
                              threads=threads)
        files = {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gpus = ray.get_gpu_ids()
    outcome.node = socket.gethostname()
    outcome.gpu = int(gpus[0]) if gpus else None
    return {"outcome": asdict(outcome), "files": files}
