"""The state of a reproduction on disk: `<run dir>/stages.json`, a `suite.records.StageState` per stage (status,
seconds, attempts, reason, its record's verdict and byte mismatches, where and when it ran, the stages that
overlapped it on its node) and a record per sitting. `--resume` keeps done stages and reruns failed and
pending ones; one left `running` by a killed sitting is failed ("interrupted"). Legacy entries (harnesses
this version does not plan) are kept as recorded: never run, never removed, out of the counts.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from pathlib import Path

from suite.records import HARNESSES, STAGES_SCHEMA, STATUSES, StageState, StateError, check_stages, utc_now


class State:
    """stages.json: options, sittings and per-stage states. `save()` writes atomically, one save at a time."""

    def __init__(self, run_dir: Path, data: dict):
        self.run_dir = Path(run_dir)
        self.data = data
        self.stages: dict[str, StageState] = {k: StageState(**v) for k, v in data.get("stages", {}).items()}
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.run_dir / "stages.json"

    @classmethod
    def open(cls, run_dir: Path, options: dict, *, resume: bool) -> "State":
        """Load run_dir/stages.json (resume) or start a new one (also with resume, when there is none yet, so
        one command serves every sitting). Raises StateError if a state is there without resume, is not JSON
        or mis-shaped, or was started with other options."""
        path = Path(run_dir) / "stages.json"
        if not path.exists():
            return cls(run_dir, {"schema": STAGES_SCHEMA, "created_utc": utc_now(), "options": options,
                                 "sittings": [], "stages": {}, "compare": []})
        if not resume:
            raise StateError(f"{path} exists: pass --resume to continue that reproduction, or another --run-dir")
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise StateError(f"{path}: not JSON ({exc})") from None
        check_stages(data, path)
        for st in data.get("stages", {}).values():
            if st.get("status") == "running":    # the sitting ended (killed) while this stage ran
                st["status"], st["reason"] = "failed", "interrupted: the sitting ended while this stage ran"
        if data.get("options") != options:
            old = data.get("options", {})
            diff = {k: (old.get(k), options.get(k)) for k in sorted(set(old) | set(options))
                    if old.get(k) != options.get(k)}
            raise StateError(f"{path}: started with other options (recorded, given): {diff}; resume with the "
                             f"same options or use another --run-dir")
        return cls(run_dir, data)

    def save(self) -> None:
        with self._lock:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.data["stages"] = {k: asdict(v) for k, v in self.stages.items()}
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.data, indent=1) + "\n")
            os.replace(tmp, self.path)

    def get(self, stage) -> StageState:
        st = self.stages.get(stage.name)
        if st is None:
            st = self.stages[stage.name] = StageState(stage.workload, stage.harness)
        return st

    def counts(self) -> dict:
        """Stages per status, legacy entries left out."""
        out = {s: 0 for s in STATUSES}
        for st in self.stages.values():
            if st.harness in HARNESSES:
                out[st.status] += 1
        return out

    def legacy(self) -> dict[str, StageState]:
        """Entries whose harness this version does not plan, by stage name."""
        return {name: st for name, st in self.stages.items() if st.harness not in HARNESSES}
