"""suite.measure.floor (the timeline and memory command) on the fake adapter, and the itemised memory of
suite.measure.memory from hand-made samples and snapshots; a CUDA part runs the real command."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import fakes
import workloads
from suite.measure import floor, memory
from suite.records import REPO_ROOT

MIB = 2**20


def fake_workload(monkeypatch, speak_per_turn=5):
    fakes.register(monkeypatch)
    return fakes.workload(turns=2, speak_per_turn=speak_per_turn)


def roles(part):
    out = {}
    for row in part["timeline"]["units"]:
        out.setdefault(row["role"], []).append(row["index"])
    return out


# --- one process's work ---------------------------------------------------------------------------------
def test_run_mode_on_cpu_walks_warm_timed_and_profiled_units_and_records_no_device_figures(monkeypatch):
    wl = fake_workload(monkeypatch)
    part = floor.run_mode(wl, "cadence", "cpu", warm=2, timed=2, units=2, progress=False)
    # turn 0: SPEAK 2-6 (6 final), turn 1: SPEAK 9-13; a turn's first and final units are never measured
    assert roles(part) == {"warm": [2, 3], "timed": [4, 5], "run": [6, 9], "profiled": [10, 11]}
    summary = part["timeline"]["summary"]
    assert summary["units_profiled"] == 2 and summary["units_timed"] == 2
    assert summary["kernel_busy_ms_p50"] is None and summary["tail_ms_p50"] > 0
    assert summary["stats_in_measured_units"]["replays"] == 4
    items = part["memory"]["items"]
    assert items["arena_reserved_mib"] == round(4096 / MIB, 3) and items["graph_pool_mib"] == round(3072 / MIB, 3)
    for key in ("driver_used_mib", "cuda_context_mib", "graph_exec_mib", "allocator_cache_mib", "unseen_mib"):
        assert items[key] is None, key
    assert part["memory"]["snapshot_after_prepare"] is None and part["memory"]["after_units"] == [2, 3]
    assert part["prepared"]["none"]["captures"] == 3
    assert part["notes"] == []


def test_prepare_met_captures_what_the_warm_units_ran(monkeypatch):
    wl = fake_workload(monkeypatch)
    # warm units 2-6 include the final unit, whose signature prepare(None) does not capture (fakes.VOICE)
    met = floor.run_mode(wl, "cadence", "cpu", warm=5, timed=1, units=1, progress=False)
    assert met["timeline"]["units"][4]["stats"]["eager_fallbacks"] == 1
    assert met["prepared"]["met"]["captures"] == 1 and met["prepared"]["met_signatures"] == 4
    none = floor.run_mode(wl, "cadence", "cpu", warm=5, timed=1, units=1, prepare="none", progress=False)
    assert none["prepared"]["met"] == {}
    unit = floor.run_mode(wl, "cadence", "cpu", warm=1, timed=1, units=1, prepare="unit", progress=False)
    assert all("prepared" in r for r in unit["timeline"]["units"] if r["role"] in ("timed", "profiled"))


def test_a_script_too_short_is_said_and_memory_only_runs_no_timeline(monkeypatch):
    wl = fake_workload(monkeypatch, speak_per_turn=3)
    part = floor.run_mode(wl, "cadence", "cpu", warm=1, timed=0, units=5, progress=False)
    assert part["timeline"]["summary"]["units_profiled"] == 2
    assert part["notes"] == ["the script ran out: 2 of 5 steady SPEAK units profiled"]
    mem_only = floor.run_mode(wl, "stock", "cpu", warm=1, timeline=False, progress=False)
    assert "summary" not in mem_only["timeline"] and mem_only["memory"]["items"]["arena_reserved_mib"] == 0.0


@pytest.mark.parametrize("kwargs,match", [
    ({"warm": -1}, "warm: expected an int >= 0"),
    ({"units": 1.5}, "units: expected an int >= 0"),
    ({"prepare": "oracle"}, "prepare: expected one of"),
])
def test_run_mode_rejects_bad_arguments(monkeypatch, kwargs, match):
    with pytest.raises(ValueError, match=match):
        floor.run_mode(fake_workload(monkeypatch), "cadence", "cpu", progress=False, **kwargs)


# --- the command ----------------------------------------------------------------------------------------
def test_the_command_runs_a_process_per_mode_and_writes_floor_json(tmp_path):
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "impl"), str(REPO_ROOT),
                                                           str(REPO_ROOT / "tests")]))
    out = tmp_path / "floor"
    proc = subprocess.run([sys.executable, "-m", "fake_floor", "--workload", "fake", "--device", "cpu", "--out",
                           str(out), "--units", "1", "--warm-units", "1", "--timed-units", "1", "--depth", "reduced"],
                          cwd=REPO_ROOT, env=environ, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((out / "floor.json").read_text())
    entry = record["workloads"]["fake"]
    assert record["schema"] == floor.SCHEMA and list(entry["processes"]) == ["cadence"]
    assert entry["processes"]["cadence"]["status"] == "done" and entry["memory"] == {}
    assert entry["timeline"]["cadence"]["summary"]["profiled_indices"] == [4]   # warm 2, timed 3
    assert (out / "fake" / "cadence" / "log.txt").is_file()
    assert "fake" in proc.stdout and "floor record:" in proc.stdout


@pytest.mark.parametrize("argv,match", [
    (["--workload", "nope", "--device", "cpu", "--out", "x"], "workload 'nope'"),
    (["--workload", "moshi", "--device", "tpu", "--out", "x"], "--device"),
    (["--workload", "moshi", "--device", "cpu", "--out", "x", "--units", "-1"], "--units"),
    (["--workload", "moshi", "--device", "cpu", "--out", "x", "--timeout-s", "0"], "--timeout-s"),
])
def test_the_command_refuses_bad_arguments_with_exit_2(capsys, argv, match):
    assert floor.main(argv) == 2
    assert match in capsys.readouterr().err


def test_plan_runs_stock_and_cadence_for_memory_and_profiles_the_timeline_modes():
    args = floor.parse_args(["--workload", "all", "--device", "cpu", "--out", "x", "--memory"])
    names = floor._names(args.workload)
    assert names == workloads.names()
    plan = floor._plan(args, names[:1])
    assert plan == [(names[0], "stock", False), (names[0], "cadence", True)]
    args = floor.parse_args(["--workload", "moshi", "--device", "cpu", "--out", "x", "--timeline-modes", "stock,cadence"])
    assert floor._plan(args, ["moshi"]) == [("moshi", "stock", True), ("moshi", "cadence", True)]


def test_merge_pairs_the_modes_memory_and_keeps_failures():
    items = lambda w, pool: {"items": {"weights_mib": w, "graph_pool_mib": pool, "arena_backend": None}}
    prov = {"device": {"gpu_name": "H200"}}
    parts = {("w", "stock"): {"memory": items(10.0, 0.0), "timeline": {"units": []}, "provenance": prov},
             ("w", "cadence"): {"memory": items(9.0, 36.0), "provenance": prov, "prepared": {}, "notes": [],
                                "timeline": {"summary": {"top_causes": []}, "units": []}}}
    outcomes = {("w", "stock"): {"status": "done"}, ("w", "cadence"): {"status": "done"},
                ("v", "cadence"): {"status": "failed", "reason": "exit status 1"}}
    record = floor.merge(parts, outcomes, ["w", "v"], {}, {})
    assert record["workloads"]["w"]["memory_cadence_minus_stock"] == {"weights_mib": -1.0, "graph_pool_mib": 36.0}
    assert list(record["workloads"]["w"]["timeline"]) == ["cadence"]
    assert record["workloads"]["v"] == {"timeline": {}, "memory": {}, "processes": {"cadence": outcomes[("v", "cadence")]}}
    assert record["devices"] == {"w.stock": "H200", "w.cadence": "H200"}


def test_tables_show_the_ratio_and_top_causes():
    summary = {"kernel_busy_ms_p50": 70.0, "wall_ms_profiled_p50": 90.0, "tail_over_kernel_busy_x": 1.2857,
               "tail_ms_p50": 80.0, "tail_over_kernel_busy_x_unprofiled": 1.1429,
               "top_causes": [["eager_op", 6.5], ["graph_launch", 2.25]],
               "data_movement_per_unit_p50": {"movement_kernels": 812.0, "kernels": 10649.0}}
    text = floor.tables({"workloads": {"sa2": {"timeline": {"cadence": {"summary": summary}}, "memory": {}}}})
    assert "1.286" in text and "1.143" in text and "eager_op 6.50, graph_launch 2.25" in text
    assert "812 / 10649" in text


# --- memory items ---------------------------------------------------------------------------------------
def sample(driver, reserved, allocated=None, mapped=10.0, backend="vmm", pool=36.0, primed=8.0):
    return {"driver_used_mib": driver, "reserved_mib": reserved, "allocated_mib": allocated, "arena_reserved_mib": 64.0,
            "arena_mapped_mib": mapped, "arena_backend": backend, "graph_pool_mib": pool, "cublas_primed_mib": primed}


def test_itemise_splits_a_session_into_its_items():
    items = memory.itemise(weights={"parameter_bytes": 100 * MIB, "buffer_bytes": 28 * MIB}, idle_mib=1000.0,
                           context_mib=500.0, model={"allocated_mib": 128.0}, opened=sample(2000.0, 200.0),
                           prepared=sample(2100.0, 250.0), steady=sample(2150.0, 300.0, 260.0, mapped=12.0))
    assert (items["weights_mib"], items["parameters_mib"], items["buffers_mib"]) == (128.0, 100.0, 28.0)
    assert items["graph_exec_mib"] == 50.0            # (2100 - 250 - 10) - (2000 - 200 - 10)
    assert items["allocator_cache_mib"] == 40.0 and items["session_allocated_mib"] == 132.0
    assert items["unseen_mib"] == 338.0               # 2150 - 300 - 12 - 1000 - 500
    assert items["driver_over_idle_mib"] == 1150.0 and items["cuda_context_mib"] == 500.0
    assert (items["graph_pool_mib"], items["cublas_workspace_mib"], items["arena_mapped_mib"]) == (36.0, 8.0, 12.0)
    assert (items["prepare_reserved_mib"], items["prepare_driver_mib"]) == (50.0, 100.0)


def test_itemise_counts_a_prealloc_arena_inside_torch_and_unknowns_as_none():
    items = memory.itemise(weights={"parameter_bytes": 0, "buffer_bytes": 0}, idle_mib=None, context_mib=None,
                           model={}, opened=sample(2000.0, 200.0, backend="prealloc"),
                           prepared=sample(2100.0, 260.0, backend="prealloc"),
                           steady=sample(None, 300.0, 250.0, backend="prealloc"))
    assert items["graph_exec_mib"] == 40.0            # (2100 - 260) - (2000 - 200): the arena is in reserved
    assert items["driver_used_mib"] is None and items["unseen_mib"] is None and items["driver_over_idle_mib"] is None
    assert items["allocator_cache_mib"] == 50.0 and items["session_allocated_mib"] is None


def test_snapshot_sites_group_held_blocks_by_site_and_pool():
    frames = lambda *names: [{"filename": f, "line": i, "name": n} for i, (f, n) in enumerate(names)]
    conv = frames(("/x/torch/nn/modules/conv.py", "forward"), ("/y/transformers/qwen3/model.py", "decode"),
                  ("/r/impl/duplexcadence/graphs.py", "capture"))
    snap = {"segments": [
        {"segment_pool_id": (0, 0), "blocks": [
            {"state": "active_allocated", "size": 4 * MIB, "frames": conv},
            {"state": "active_allocated", "size": 2 * MIB, "frames": conv},
            {"state": "inactive", "size": 64 * MIB, "frames": conv},
            {"state": "active_allocated", "size": 100 * MIB, "frames": []}]},
        {"segment_pool_id": (1, 0), "blocks": [
            {"state": "active_allocated", "size": 8 * MIB,
             "frames": frames(("/x/torch/functional.py", "istft"), ("/x/torch/cuda/graphs.py", "replay"))}]}]}
    out = memory.snapshot_sites(snap, top=5)
    assert out["allocated_bytes"] == 114 * MIB and out["recorded_bytes"] == 14 * MIB
    assert out["by_pool"] == {"default": 6 * MIB, "graph": 8 * MIB}
    # all frames in torch: the innermost names the site
    assert out["sites"][0] == {"site": "x/torch/functional.py:0 istft", "via": None, "pool": "graph",
                               "bytes": 8 * MIB, "blocks": 1}
    assert out["sites"][1] == {"site": "transformers/qwen3/model.py:1 decode",
                               "via": "impl/duplexcadence/graphs.py:2 capture", "pool": "default", "bytes": 6 * MIB,
                               "blocks": 2}
    assert memory.snapshot_sites(None) is None


def test_model_bytes_counts_each_storage_once_through_holders():
    lin = torch.nn.Linear(4, 4)                                  # 16 + 4 floats
    net = torch.nn.Sequential(lin, torch.nn.BatchNorm1d(4))      # + 8 floats of params, 4 + 4 + 1 buffers
    tied = torch.nn.Module()
    tied.again = lin                                             # the same weights a second time
    class Token2wavLike:                                         # a callable object holding modules
        def __init__(self):
            self.flow, self.tables = net, {"tied": tied}

        def __call__(self):
            return None

    holder = {"model": [Token2wavLike()], "text": "x"}
    out = memory.model_bytes(holder)
    assert out == {"parameter_bytes": (20 + 8) * 4, "buffer_bytes": 8 * 4 + 8}
    assert memory.model_bytes(holder, device="cuda") == {"parameter_bytes": 0, "buffer_bytes": 0}


def test_driver_reader_names_the_visible_device(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert memory._visible_device(2) == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert memory._visible_device(1) == "5" and memory._visible_device(2) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2e")
    assert memory._visible_device(0) == "GPU-8f2e"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reader = memory.DriverReader(0)
    assert reader.source is None and reader.used_mib() is None


def test_allocation_history_off_cuda_records_nothing():
    with memory.allocation_history(torch.device("cpu")) as box:
        box["take"]()
    assert box["snapshot"] is None and box["error"] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: profiler trace, driver memory, graphs")
def test_cuda_floor_command_on_a_reduced_workload(tmp_path):
    out = tmp_path / "floor"
    proc = subprocess.run([sys.executable, "-m", "suite.measure.floor", "--workload", "qwen3_omni", "--device", "cuda",
                           "--depth", "reduced", "--out", str(out), "--units", "2", "--warm-units", "3",
                           "--timed-units", "1", "--memory"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=f"{REPO_ROOT / 'impl'}{os.pathsep}{REPO_ROOT}"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    entry = json.loads((out / "floor.json").read_text())["workloads"]["qwen3_omni"]
    summary = entry["timeline"]["cadence"]["summary"]
    assert summary["units_profiled"] == 2 and summary["kernel_busy_ms_p50"] > 0
    assert summary["wall_ms_profiled_p50"] >= summary["gpu_busy_ms_p50"] >= summary["kernel_busy_ms_p50"]
    for row in entry["timeline"]["cadence"]["units"]:
        if row["role"] == "profiled":
            tl = row["timeline"]
            assert tl["wall_ms"] == pytest.approx(tl["gpu_busy_ms"] + tl["gaps_ms"], abs=1e-2)
            assert sum(tl["by_cause"].values()) == pytest.approx(tl["gaps_ms"], abs=1e-2)
    for mode in ("stock", "cadence"):
        items = entry["memory"][mode]["items"]
        assert items["weights_mib"] > 0 and items["driver_used_mib"] > 0 and items["allocator_cache_mib"] >= 0
    cadence = entry["memory"]["cadence"]
    assert cadence["snapshot_after_prepare"] is not None or cadence["history_error"]
