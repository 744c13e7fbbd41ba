"""tools/duplex_stalls.py: eager units, slack captures and their wall time, start delays, per count of a record."""
from __future__ import annotations

import json

import pytest

from tools import duplex_stalls

COLS = ["session", "index", "kind", "release_ms", "start_ms", "service_ms", "miss", "tail_ms", "eager_fallbacks",
        "slack_ms", "slack_captures", "slack_overrun_ms"]


def _record(tmp_path, rows, gate=None):
    provenance = {"capture_gate": gate} if gate else {}
    rec = {"parameters": {}, "provenance": provenance, "workloads": {"w": {"modes": {"cadence": {"runs": [
        {"sessions": 2, "prepare": "voice", "wall_s": 61.5, "units": {"columns": COLS, "rows": rows, "interned": []}}]}}}}}
    (tmp_path / "duplex.json").write_text(json.dumps(rec))
    return tmp_path


def test_rows_count_eager_units_slack_capture_time_and_start_delays(tmp_path):
    rows = [[0, 0, "SPEAK", 0, 0, 100, False, 100, 0, 0.4, 0, 0.0],       # replayed, on time
            [0, 1, "SPEAK", 1000, 1000, 900, True, 1200, 2, 500.0, 2, 400.0],  # eager, missed, two slack captures
            [1, 0, "SPEAK", 500, 800, 300, False, 300, 1, 100.0, 1, 0.0],     # eager, 300 ms late to start
            [1, 1, "LISTEN", 1500, None, None, False, None, None, None, None, None],
            [1, 2, "SPEAK", 2500, 3300, 250, True, 250, 0, None, None, None]]  # replayed, missed: started late
    (row,) = duplex_stalls.rows_of(_record(tmp_path, rows))
    assert (row["speak_units"], row["missed"], row["eager_units"], row["missed_eager"]) == (4, 2, 2, 1)
    assert row["missed_replayed"] == 1 and row["slack_jobs_overrun"] == 1 and row["capture_gate"] == "not recorded"
    assert row["eager_tail_s_sum"] == pytest.approx(1.5) and row["eager_tail_ms_p50"] == pytest.approx(750)
    assert row["slack_captures"] == 3 and row["slack_capture_wall_s"] == pytest.approx(0.6)
    assert row["ms_per_slack_capture"] == pytest.approx(200) and row["replay_tail_ms_p50"] == pytest.approx(175)
    assert row["start_delay_ms_p90"] == pytest.approx(650)


def test_a_record_s_capture_gate_is_read_and_a_path_without_a_record_exits_2(tmp_path, capsys):
    (row,) = duplex_stalls.rows_of(_record(tmp_path, [[0, 0, "SPEAK", 0, 0, 1, False, 1, 0, 0, 0, 0]],
                                           gate="concurrent"))
    assert row["capture_gate"] == "concurrent" and row["ms_per_slack_capture"] is None
    with pytest.raises(SystemExit) as exc:
        duplex_stalls.main([str(tmp_path / "nothing")])
    assert exc.value.code == 2 and "nor a folder holding one" in capsys.readouterr().err


def test_speak_units_per_second_and_the_kernel_demand_they_make(tmp_path):
    """Per session over its own span (first release to one period after its last): session 0 releases at 0
    and 1 s, one of its two units made audio: 1 / 2 s; session 1 at 0.5, 1.5 and 2.5 s, two SPEAK units with
    audio: 2 / 3 s. Summed: 7/6 per second with both active; at 280 ms of kernel time each, 0.33 s a second."""
    cols = COLS + ["samples"]
    rows = [[0, 0, "SPEAK", 0, 0, 100, False, 100, 0, None, None, None, 24000],
            [0, 1, "SPEAK", 1000, 1000, 100, False, 100, 0, None, None, None, 0],
            [1, 0, "SPEAK", 500, 500, 100, False, 100, 0, None, None, None, 24000],
            [1, 1, "LISTEN", 1500, None, None, False, None, None, None, None, None, None],
            [1, 2, "SPEAK", 2500, 2500, 100, False, 100, 0, None, None, None, 12000]]
    rec = {"parameters": {}, "provenance": {}, "workloads": {"w": {"modes": {"cadence": {"runs": [
        {"sessions": 2, "prepare": "voice", "wall_s": 4.0, "units": {"columns": cols, "rows": rows, "interned": []}}]}}}}}
    (tmp_path / "duplex.json").write_text(json.dumps(rec))
    (row,) = duplex_stalls.rows_of(tmp_path)
    assert row["speak_per_s"] == pytest.approx(1 / 2 + 2 / 3) and row["kernel_ms_per_unit"] is None
    assert row["kernel_demand"] is None
    run = tmp_path / "run"
    (run / "w.verify").mkdir(parents=True)
    (run / "w.verify" / "run.json").write_text(json.dumps(
        {"modes": {"cadence": {"metrics": {"kernel_busy_ms_per_unit_p50": 280.0}}}}))
    (row,) = duplex_stalls.rows_of(tmp_path, run)
    assert row["kernel_ms_per_unit"] == 280.0 and row["kernel_demand"] == pytest.approx(7 / 6 * 0.28)


def test_a_kernels_option_that_is_not_a_folder_exits_2(tmp_path, capsys):
    _record(tmp_path, [[0, 0, "SPEAK", 0, 0, 1, False, 1, 0, 0, 0, 0]])
    with pytest.raises(SystemExit) as exc:
        duplex_stalls.main([str(tmp_path), "--kernels", str(tmp_path / "nothing")])
    assert exc.value.code == 2 and "--kernels: expected a run folder" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "{", "[]", "{}", '{"workloads": {"w": {"modes": 5}}}'])
def test_a_damaged_record_or_a_bad_json_path_is_a_usage_error(tmp_path, capsys, text):
    (tmp_path / "duplex.json").write_text(text)
    with pytest.raises(SystemExit) as exc:
        duplex_stalls.main([str(tmp_path)])
    assert exc.value.code == 2 and "not a duplex record this tool can read" in capsys.readouterr().err
    _record(tmp_path, [[0, 0, "SPEAK", 0, 0, 1, False, 1, 0, 0, 0, 0]])
    for out in (tmp_path, tmp_path / "nothing" / "x.json"):
        with pytest.raises(SystemExit) as exc:
            duplex_stalls.main([str(tmp_path), "--json", str(out)])
        assert exc.value.code == 2 and "--json: expected a file in an existing folder" in capsys.readouterr().err
