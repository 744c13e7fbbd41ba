"""The plan's stages as Ray tasks: `python -m suite.reproduce --ray auto|local|ADDRESS`.

Each stage is a task of `suite.stages.process.stage_task` on a fresh worker (`max_calls=1`) asking for one
GPU (CUDA; Ray sets its CUDA_VISIBLE_DEVICES) or one CPU, and for HOST_RESOURCE, which every node running
stages declares as HOST_UNITS (`ray start ... --resources='{"duplexcadence_host": 1000}'`; `local` declares
it): a timed stage asks for all of it, any other for one unit, so nothing runs beside a timed stage on its
host and memory stages may share one. The task runs the stage's process in a temporary folder on its node
and returns its files, which the driver writes into the one run folder as the stage ends. A failed attempt
(or a dead worker or node) is run once more, then recorded failed. At most as many stages are in flight as
the nodes have GPUs (CPUs), submitted in plan order. A cluster gets this checkout as the tasks' working_dir.
A stage process gets the driver's host-thread variables (process.THREAD_VARS), not the ones Ray gives its
worker, so its bytes are those of the same stage run without Ray.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from suite.records import REPO_ROOT, StateError, device_type, instant
from suite.stages.plan import Stage, stage_argv
from suite.stages.process import OUT, Outcome, stage_task, thread_env
from suite.stages.run import Sitting
from suite.stages.state import State

HOST_RESOURCE = "duplexcadence_host"
HOST_UNITS = 1000
RETRIES = 1
WORKING_DIR_EXCLUDES = ["results/", ".venv/", ".asv/", ".git/", "*.wav"]


def import_ray():
    """The ray module. Raises StateError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise StateError("--ray: Ray is not installed here; `make reproduce RAY=1 ...` installs the ray extra "
                         "(pip install -e '.[ray]')") from None
    return ray


def connect(address: str, *, num_cpus: int | None = None) -> bool:
    """Connect to the Ray cluster at `address` ("auto", an address) or start a local instance ("local",
    num_cpus: its CPUs, default all); a connection this process already holds is used as it is. Returns True
    when this call started the instance (stop it after). Raises StateError when no cluster answers at
    `address`."""
    ray = import_ray()
    if ray.is_initialized():                 # a connection this process made already: used as it is
        return False
    if address == "local":
        ray.init(num_cpus=num_cpus, resources={HOST_RESOURCE: HOST_UNITS}, include_dashboard=False, log_to_driver=True)
        return True
    try:
        ray.init(address=address, log_to_driver=True,
                 runtime_env={"working_dir": str(REPO_ROOT), "excludes": WORKING_DIR_EXCLUDES})
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StateError(f"--ray {address}: no Ray cluster could be joined there ({first[:200]}); start one "
                         f"(`ray start --head ...`) or use --ray local") from None
    return False


def capacity(device: str) -> int:
    """Stages that may be in flight at once: the GPUs (CUDA) or CPUs (CPU) of the alive nodes that declare
    HOST_RESOURCE. Raises StateError naming the nodes without it when there is none."""
    ray = import_ray()
    key = "GPU" if device_type(device) == "cuda" else "CPU"
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    able = [n for n in nodes if n["Resources"].get(HOST_RESOURCE, 0) >= HOST_UNITS and n["Resources"].get(key, 0) >= 1]
    if not able:
        lacking = [n.get("NodeManagerHostname") for n in nodes if n["Resources"].get(key, 0) >= 1]
        raise StateError(f"--ray: no node with a {key} declares the resource {HOST_RESOURCE!r} "
                         f"(nodes with a {key}: {lacking or 'none'}); start each with `ray start ... "
                         f"--resources='{{\"{HOST_RESOURCE}\": {HOST_UNITS}}}'`")
    return int(sum(n["Resources"][key] for n in able))


def task_options(stage: Stage, device: str) -> dict:
    """A stage's task resources: one GPU (CUDA) or one CPU, and all of its host (timed) or one unit."""
    gpu = device_type(device) == "cuda"
    return {"num_gpus": 1 if gpu else 0, "num_cpus": 1, "max_retries": 0,
            "resources": {HOST_RESOURCE: HOST_UNITS if stage.timed else 1}}


def _receive(ray, ref, out_dir: Path, command: list) -> Outcome:
    """A finished task's outcome, its files written into out_dir; a task that died is a failed attempt."""
    try:
        result = ray.get(ref)
    except ray.exceptions.RayError as exc:          # the task raised, its worker or node died, cancelled
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return Outcome("failed", None, f"{type(exc).__name__}: {first}"[:300], command)
    out_dir.mkdir(parents=True, exist_ok=True)
    for rel, data in result["files"].items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return Outcome(**result["outcome"])


def run_plan_ray(stages: list[Stage], state: State, options: dict, *, address: str, budget_s: float | None = None,
                 provenance: dict | None = None, log: Callable[[str], None] = print,
                 after: Callable[[str], object] | None = None, num_cpus: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> dict:
    """Run the stages as Ray tasks (module docstring) within budget_s seconds: a stage is submitted only
    when the budget rule of `Sitting.begin` lets it start (its timeout is cut at submission). Returns the
    sitting's record. Raises StateError when Ray is missing or no node can run the stages. On an exception
    (KeyboardInterrupt, SIGTERM's SystemExit) the tasks in flight are cancelled and their stages stay
    `running` (failed on resume)."""
    ray = import_ray()
    started = connect(address, num_cpus=num_cpus)
    flight: dict = {}
    try:
        cap = capacity(options["device"])
        sitting = Sitting(stages, state, options, budget_s=budget_s, clock=clock, provenance=provenance or {},
                          log=log, after=after, retries=RETRIES, where=address)
        queue = list(sitting.todo)
        remote = ray.remote(max_calls=1)(stage_task)
        while queue or flight:
            while queue and len(flight) < cap:
                stage = queue.pop(0)
                begun = sitting.begin(stage)
                if begun is None:                     # stopped: it and the rest stay pending
                    continue
                argv = stage_argv(stage, OUT, options)
                ref = remote.options(**task_options(stage, options["device"])).remote(argv, begun[1], f"{stage.name}: ",
                                                                                      thread_env())
                flight[ref] = (stage, begun[0], clock(), argv)
            if not flight:
                break
            (ref,), _ = ray.wait(list(flight), num_returns=1)
            stage, out_dir, t, argv = flight.pop(ref)
            outcome = _receive(ray, ref, out_dir, ["python", "-m", *argv])
            start, end = instant(outcome.started_utc), instant(outcome.ended_utc)
            seconds = (end - start).total_seconds() if start and end else clock() - t   # not its time queued
            if sitting.end(stage, outcome, seconds):
                queue.insert(0, stage)
        return sitting.close()
    except BaseException:
        for ref in flight:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()
