"""Where a result came from, and the determinism flags it ran under.

`provenance()` is generated, never typed: git revision, dirty flag with the `git status --short` lines, the
git tree hash of impl/, the command, python / torch / CUDA / cuDNN and stock package versions, the device, the
weights (`weights`: seeded random, or a checkpoint and its sha256). Outside a git checkout the git fields read "NA". `deterministic()` is the only place the suite changes
torch's global flags, and it restores them on exit. The host probe (`host_op_us`) says how fast the host
launched eager kernels around a measurement.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

import workloads
from duplexcadence import gate, upstream
from suite.records import REPO_ROOT, git

#: Untracked paths under these prefixes do not make the tree dirty: they are outputs, not code.
OUTPUT_PREFIXES = ("results/",)


def status_lines(cwd: Path = REPO_ROOT) -> list[str] | None:
    """`git status --short` lines (tracked changes and untracked files), or None outside git."""
    out = git("status", "--short", cwd=cwd)
    return None if out is None else [line for line in out.splitlines() if line.strip()]


def _status_path(line: str) -> str:
    path = line[3:]
    return path.split(" -> ")[-1].strip('"')


def is_dirty(lines: list[str]) -> bool:
    """True if any tracked file changed, or an untracked file exists outside the output folders."""
    for line in lines:
        if line.startswith("??") and _status_path(line).startswith(OUTPUT_PREFIXES):
            continue
        return True
    return False


def impl_tree(cwd: Path = REPO_ROOT, lines: list[str] | None = None) -> dict:
    """The committed tree hash of impl/ (`git rev-parse HEAD:impl`) and whether the working copy of
    impl/ differs from it; if it does, `impl_worktree_sha256` hashes the files as they are (paths sorted,
    each path and its bytes), so a dirty run still names the code that ran."""
    tree = git("rev-parse", "HEAD:impl", cwd=cwd) or "NA"
    lines = status_lines(cwd) if lines is None else lines
    dirty = any(_status_path(line).startswith("impl/") for line in (lines or []))
    out = {"impl_tree": tree, "impl_dirty": dirty}
    if dirty:
        listed = git("ls-files", "-co", "--exclude-standard", "impl", cwd=cwd) or ""
        digest = hashlib.sha256()
        for rel in sorted(listed.splitlines()):
            path = cwd / rel
            if path.is_file():
                digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
        out["impl_worktree_sha256"] = digest.hexdigest()
    return out


def cpu_info() -> dict:
    """CPU model (from /proc/cpuinfo where present), logical cores, cores this process may use, and the
    host's load average (1, 5, 15 min): host-bound tails slow down beside other work."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_model": model, "cpu_cores": os.cpu_count(), "cpu_cores_usable": usable,
            "torch_threads": torch.get_num_threads(),
            "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


_SMI_FIELDS = ("name", "driver_version", "memory.total", "clocks.sm", "clocks.max.sm", "clocks.mem",
               "power.limit", "pstate")


def nvidia_smi(index: int | str) -> dict:
    """`nvidia-smi --query-gpu` facts for one GPU ({} if nvidia-smi is absent or fails). index: what
    `nvidia-smi -i` takes: an index in nvidia-smi's own order (CUDA_VISIBLE_DEVICES does not apply) or a
    GPU UUID. Units: memory MiB, clocks MHz, power W."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}",
                              "--format=csv,noheader,nounits", "-i", str(index)],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    keys = ("gpu_name_smi", "driver", "memory_total_mib_smi", "clock_sm_mhz", "clock_sm_max_mhz",
            "clock_mem_mhz", "power_limit_w", "pstate")
    return dict(zip(keys, values))


def device_info(device: str | torch.device = "cpu") -> dict:
    """Facts about the device a run used: always the CPU; for CUDA also GPU name, capability,
    memory (MiB), SM count, driver and clocks (nvidia-smi)."""
    device = torch.device(device)
    out = {"device": str(device), **cpu_info()}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        # by UUID: under CUDA_VISIBLE_DEVICES (a pinned stage) CUDA's index is not nvidia-smi's
        uuid = getattr(props, "uuid", None)
        out.update({"gpu_name": props.name, "gpu_capability": f"{props.major}.{props.minor}",
                    "gpu_memory_mib": props.total_memory // 2**20, "gpu_sm_count": props.multi_processor_count,
                    **({"gpu_uuid": f"GPU-{uuid}"} if uuid else {}), **nvidia_smi(f"GPU-{uuid}" if uuid else index)})
    return out


#: The checkpoints a process builds its workloads from: JSON {workload: path}, read by `checkpoints()`.
#: `suite.reproduce --checkpoint` sets it for its stage processes and `suite.measure.duplex --checkpoint` for
#: itself (both parsed by `parse_checkpoints()`); set it by hand for another harness run alone (suite.measure.stage). Unset: every workload has seeded random weights.
CHECKPOINT_ENV = "DUPLEXCADENCE_CHECKPOINTS"


def checkpoints() -> dict[str, str]:
    """{workload: checkpoint path} from CHECKPOINT_ENV ({} when unset). Raises ValueError for a value that is not
    a JSON object of strings."""
    text = os.environ.get(CHECKPOINT_ENV, "").strip()
    try:
        found = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{CHECKPOINT_ENV}: expected a JSON object {{workload: path}}, got {text!r} ({exc})") from None
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        raise ValueError(f"{CHECKPOINT_ENV}: expected a JSON object {{workload: path}}, got {text!r}")
    return found


def parse_checkpoints(values: list[str] | None, workload_names: list[str]) -> dict[str, str]:
    """`--checkpoint` values, each "WORKLOAD=PATH" (or PATH alone when the run has one workload), as {workload:
    absolute path}. Raises ValueError naming a value without a workload, a workload not in the run (or named
    twice), an empty path or one that does not exist."""
    out = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep:
            if len(workload_names) != 1:
                raise ValueError(f"--checkpoint {value}: say which workload (WORKLOAD=PATH); this run has "
                                 f"{workload_names}")
            name, path = workload_names[0], value
        if name not in workload_names or name in out:
            raise ValueError(f"--checkpoint {value}: {name!r} is {'named twice' if name in out else 'not in this run'}"
                             f" (workloads: {workload_names})")
        if not path.strip():
            raise ValueError(f"--checkpoint {value!r}: no path given (expected WORKLOAD=PATH or PATH)")
        if not Path(path).exists():
            raise ValueError(f"--checkpoint {value}: {path} does not exist")
        out[name] = str(Path(path).resolve())
    return out


@functools.lru_cache(maxsize=None)
def checkpoint_sha256(path: str) -> str:
    """sha256 of a checkpoint: of one file's bytes, or for a directory of the lines "<relative path> <sha256 of the
    file>" of every file under it, sorted by path (a whole Qwen3-Omni checkpoint is read once per process: tens of
    GB). Raises FileNotFoundError naming a missing path."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"checkpoint {root}: does not exist")

    def digest(file: Path) -> str:
        h = hashlib.sha256()
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        return h.hexdigest()
    if root.is_file():
        return digest(root)
    lines = [f"{f.relative_to(root).as_posix()} {digest(f)}\n" for f in sorted(root.rglob("*")) if f.is_file()]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def weights(workload: str, seed: int | None) -> str:
    """What a workload's weights are in this process: "checkpoint PATH sha256 HEX" (CHECKPOINT_ENV), else
    "seeded random (seed N)"."""
    path = checkpoints().get(workload)
    return f"checkpoint {path} sha256 {checkpoint_sha256(path)}" if path else f"seeded random (seed {seed})"


def provenance(command: list[str] | None = None, *, device: str | torch.device = "cpu") -> dict:
    """Everything that says where a result came from. command: argv as run (default: sys.argv)."""
    lines = status_lines()
    cuda = torch.version.cuda
    facts = {"git_rev": git("rev-parse", "HEAD") or "NA",
             "git_dirty": None if lines is None else is_dirty(lines),
             "git_status": lines if lines is not None else "NA", **impl_tree(lines=lines or [])}
    if lines is None and os.environ.get("DUPLEXCADENCE_GIT_REV"):
        # A copied working tree without .git (a lent GPU machine): the caller states the checkout it
        # copied, read with git on the machine it was copied from.
        facts = {"git_rev": os.environ["DUPLEXCADENCE_GIT_REV"],
                 "git_dirty": os.environ.get("DUPLEXCADENCE_GIT_DIRTY", "1") != "0",
                 "git_status": "NA (no .git here; stated by the caller)",
                 "impl_tree": os.environ.get("DUPLEXCADENCE_IMPL_TREE", "NA"), "impl_dirty": None,
                 "git_source": "caller (DUPLEXCADENCE_GIT_REV / _DIRTY / _IMPL_TREE)"}
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **facts,
        "command": list(command if command is not None else sys.argv),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": cuda or "none",
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else "none",
        "packages": upstream.installed_versions(),
        "env": {k: os.environ[k] for k in ("TORCHDYNAMO_DISABLE", "CUDA_VISIBLE_DEVICES",
                                           "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS")
                if k in os.environ},
        "device": device_info(device),
        "capture_gate": gate.GATE.mode,     # what may run beside a CUDA-graph capture (duplexcadence.gate)
        # a record of one workload says its own (session.mode_result); this is every checkpoint in force
        "weights": {name: weights(name, None) for name in checkpoints()} or "seeded random (the workload's seed)",
    }


def _flags() -> dict:
    return {"cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


@contextlib.contextmanager
def deterministic():
    """Run the block with cuDNN deterministic on, cuDNN benchmark off and TF32 off (matmul and cuDNN).

    Yields a dict: `set` (the flags in force inside the block) and `previous` (those restored on exit),
    to be written into the result record. Both modes of a comparison run under the same flags.
    """
    previous = _flags()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    record = {"set": _flags(), "previous": previous}
    try:
        yield record
    finally:
        torch.backends.cudnn.deterministic = previous["cudnn_deterministic"]
        torch.backends.cudnn.benchmark = previous["cudnn_benchmark"]
        torch.backends.cuda.matmul.allow_tf32 = previous["cuda_matmul_allow_tf32"]
        torch.backends.cudnn.allow_tf32 = previous["cudnn_allow_tf32"]


def _count(name: str, value, least: int = 1) -> int:
    """`value` as a count >= least for argument `name`; ValueError naming it otherwise (bools, floats, text)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")
    return value


def host_op_us(device: str | torch.device = "cpu", *, ops: int = 1000, repeats: int = 5,
               buffers: tuple[torch.Tensor, torch.Tensor] | None = None, warmup: int = 100) -> float:
    """Median microseconds per eager `torch.add` of a 1-element tensor on `device` over `repeats` batches of
    `ops` ops, synchronised around each batch: the host's cost of launching one tiny kernel now (the stock
    tails are host-bound, so their time moves with it). buffers: (input, output) tensors to use (no
    allocation); warmup: untimed ops first. Raises ValueError for ops / repeats not an int >= 1, warmup < 0."""
    ops, repeats, warmup = _count("ops", ops), _count("repeats", repeats), _count("warmup", warmup, 0)
    device = torch.device(device)
    sync = (lambda: gate.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if buffers is None:
        x = torch.zeros(1, device=device)
        y = torch.empty_like(x)
    else:
        x, y = buffers
    for _ in range(min(ops, warmup)):                    # warm the dispatcher and the kernel
        torch.add(x, 1.0, out=y)
    batches = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(ops):
            torch.add(x, 1.0, out=y)
        sync()
        batches.append((time.perf_counter() - t0) * 1e6 / ops)
    batches.sort()
    return float(batches[len(batches) // 2])


#: Eager ops of the per-unit launch probe (`host_op_us(ops=...)`, one batch: ~1-2 ms on CUDA).
UNIT_PROBE_OPS = 100


def nvml_handle(device: str | torch.device):
    """(pynvml module, NVML handle) of CUDA device `device` (by its UUID, else by index), or (None, None)
    without a CUDA device, pynvml or an NVML library. Never raises."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, None
    try:
        import pynvml
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        try:
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    except Exception:  # no pynvml, no NVML library, or an older driver: say so by returning nothing
        return None, None


# --- command-line values every harness takes -----------------------------------------------------------------
def out_folder(text: str) -> str:
    """An argparse type: a folder to write into, new or existing: not empty, not a file, not under a file."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder (new or existing), got an empty path")
    path = Path(text)
    there = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if not there.is_dir():
        raise argparse.ArgumentTypeError(f"expected a folder (new or existing), got {text!r}: {there} is a file")
    return text


def device_arg(text: str) -> str:
    """An argparse type: "cpu", or "cuda" / "cuda:N" naming a CUDA device this machine has."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index is not None):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise argparse.ArgumentTypeError(f"expected a CUDA device this machine has ({torch.cuda.device_count()} "
                                         f"here), got {text!r}")
    return text


def seed_arg(text: str) -> int:
    """An argparse type: a weights seed, an int in [0, 2**63)."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"expected an int in [0, 2**63), got {text!r}")
    return value


def check_steps_apply(names, steps) -> None:
    """Raises ValueError naming --steps unless every workload in `names` takes `steps` Euler steps (the
    workload's own check: an int in [1, 16] for flow_hift, none for a codec decoder). None: each its own."""
    if steps is None:
        return
    for name in names:
        w = workloads.get(name)
        try:
            dataclasses.replace(w, euler_steps=steps, spec={**w.spec, "n_timesteps": steps})
        except ValueError as exc:
            raise ValueError(f"--steps {steps}: {exc}") from None
