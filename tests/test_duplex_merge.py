"""suite.duplex_merge on small synthetic duplexcadence.duplex records (CPU only, no model).

Each part holds one mode of one workload, as when stock and DuplexCadence run in separate processes;
the runs carry only what the merge reads (sessions, metrics, units with index and both sha256s).
"""
from __future__ import annotations

import json

import pytest

from suite import duplex
from suite.duplex_merge import SCHEMA, main, merge

WL = "wl_a"


def units(hashes: list[str], session: int = 0) -> list[dict]:
    return [{"session": session, "index": i, "kind": "SPEAK", "miss": False,
             "sha256_f32": f"{h}-f32", "sha256_pcm16": f"{h}-pcm16"} for i, h in enumerate(hashes)]


def part(mode: str, hashes=("u0", "u1", "u2"), *, period_s=1.0, verdict="VALID", reasons=(), wl_reasons=()):
    """A finished (or PARTIAL) duplex record of one mode: a one-session run and a two-session run."""
    solo = units(list(hashes))
    runs = [{"mode": mode, "sessions": 1, "metrics": {"misses": 0, "units_run": 3}, "units": solo},
            {"mode": mode, "sessions": 2, "metrics": {"misses": 0, "units_run": 6},
             "units": solo + units(list(hashes), session=1)}]
    return {"schema": SCHEMA, "provenance": {"host": f"gpu-{mode}"},
            "parameters": {"period_s": period_s, "ar": "none", "seconds": 60.0, "modes": [mode],
                           "sessions": {mode: [1, 2]}, "policy": {mode: "edf" if mode == "stock" else "threads"}},
            "workloads": {WL: {"workload": WL, "architecture": "flow_hift",
                               "modes": {mode: {"runs": runs, "max_zero_miss_sessions": 2}},
                               "reference": {mode: {"0": len(hashes)}}, "invalid_reasons": list(wl_reasons)}},
            "verdict": verdict, "invalid_reasons": list(reasons)}


def test_equal_one_session_hashes_merge_valid():
    rec = merge([part("stock"), part("cadence")])
    w = rec["workloads"][WL]
    assert set(w["modes"]) == {"stock", "cadence"}
    assert w["modes"]["cadence"]["max_zero_miss_sessions"] == 2
    assert w["reference"] == {"stock": {"0": 3}, "cadence": {"0": 3}}
    assert w["cadence_equals_stock"] is True
    assert rec["verdict"] == "VALID" and rec["invalid_reasons"] == []
    assert rec["schema"] == SCHEMA and rec["merged_from"] == 2
    assert [p["provenance"]["host"] for p in rec["parts"]] == ["gpu-stock", "gpu-cadence"]
    assert rec["parameters"]["modes"] == ["stock", "cadence"]


def test_merged_parameters_keep_every_parts_sessions_and_policy():
    p = merge([part("stock"), part("cadence")])["parameters"]
    assert p["sessions"] == {"stock": [1, 2], "cadence": [1, 2]}
    assert p["policy"] == {"stock": "edf", "cadence": "threads"}


@pytest.mark.parametrize("field", ["sha256_f32", "sha256_pcm16"])
def test_one_unit_differing_makes_it_invalid(field):
    cad = part("cadence")
    solo = cad["workloads"][WL]["modes"]["cadence"]["runs"][0]
    solo["units"][1] = {**solo["units"][1], field: "other"}
    rec = merge([part("stock"), cad])
    assert rec["workloads"][WL]["cadence_equals_stock"] is False
    assert rec["verdict"] == "INVALID"
    assert any(r.startswith(f"{WL}:") and "differ" in r for r in rec["invalid_reasons"])


def test_same_mode_in_two_parts_is_an_error():
    with pytest.raises(ValueError, match=f"{WL!r}.*mode 'stock'"):
        merge([part("stock"), part("stock")])


def test_different_period_is_an_error():
    with pytest.raises(ValueError, match=r"parameters\.period_s"):
        merge([part("stock"), part("cadence", period_s=0.5)])


def test_wrong_schema_is_an_error():
    other = {**part("cadence"), "schema": "duplexcadence.duplex/0"}
    with pytest.raises(ValueError, match=r"records\[1\].*schema"):
        merge([part("stock"), other])


def test_single_record_is_an_error():
    with pytest.raises(ValueError, match="at least 2"):
        merge([part("stock")])


@pytest.mark.parametrize("reasons, verdict", [(["run not finished"], "PARTIAL"),
                                              (["dirty tree: uncommitted changes"], "INVALID")])
def test_part_verdict_carries_over(reasons, verdict):
    rec = merge([part("stock"), part("cadence", verdict=verdict, reasons=reasons)])
    assert rec["verdict"] == verdict
    assert rec["invalid_reasons"] == [f"part 1: {reasons[0]}"]
    assert rec["workloads"][WL]["cadence_equals_stock"] is True


def test_partial_part_with_a_mismatch_is_invalid():
    # suite.duplex's checkpoint keeps a run's mismatches in the workload only (top level: "run not finished")
    bad = "cadence N=2 session 1: unit 1 differs from the same session run alone"
    rec = merge([part("stock"), part("cadence", verdict="PARTIAL", reasons=["run not finished"],
                                     wl_reasons=[bad])])
    assert rec["verdict"] == "INVALID"
    assert any(bad in r for r in rec["invalid_reasons"])


def write_parts(tmp_path) -> list[str]:
    """A stock part and a cadence part as files; their paths."""
    paths = []
    for mode in ("stock", "cadence"):
        f = tmp_path / f"{mode}.json"
        f.write_text(json.dumps(part(mode)))
        paths.append(str(f))
    return paths


def test_cli_writes_merged_record(tmp_path, capsys):
    paths = write_parts(tmp_path)
    out = tmp_path / "merged"
    assert main([*paths, "--out", str(out), "--no-plots"]) == 0
    rec = json.loads((out / "duplex.json").read_text())
    assert rec["verdict"] == "VALID" and "plots" not in rec
    assert rec["workloads"][WL]["cadence_equals_stock"] is True
    assert "verdict VALID" in capsys.readouterr().out


def test_cli_missing_file_is_one_line_error(tmp_path, capsys):
    f = tmp_path / "stock.json"
    f.write_text(json.dumps(part("stock")))
    missing = tmp_path / "nope.json"
    out = tmp_path / "merged"
    assert main([str(f), str(missing), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m suite.duplex_merge: error:")
    assert "nope.json" in err
    assert not (out / "duplex.json").exists()


@pytest.mark.parametrize("content,match", [
    ("not json{", "bad.json: not JSON"),
    ("[1, 2]", "bad.json: expected a JSON object"),
    ('"str"', "bad.json: expected a JSON object"),
    ('{"schema": "duplexcadence.duplex/1"}', "bad.json: missing key 'parameters'"),
])
def test_cli_bad_record_is_one_line_error_naming_the_file(tmp_path, capsys, content, match):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(part("stock")))
    bad.write_text(content)
    out = tmp_path / "merged"
    assert main([str(bad), str(good), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m suite.duplex_merge: error:") and match in err
    assert not out.exists()


@pytest.mark.parametrize("argv", [["--out", "x"], ["a.json", "b.json"]])
def test_cli_usage_errors_are_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m suite.duplex_merge: error:")


def test_cli_out_that_is_a_file_is_one_line_error(tmp_path, capsys):
    paths = write_parts(tmp_path)
    f = tmp_path / "a-file"
    f.write_text("x")
    assert main([*paths, "--out", str(f), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and f.read_text() == "x"


def test_reasons_of_a_checkpoint_and_their_codes():
    """suite.duplex.record_reasons: a checkpoint's runs' reasons so far besides its top level's (merge and
    suite.stages read them so); invalid_codes: one per reason, any reason not named counted as bytes."""
    differs = "cadence N=2 session 1: unit 1 differs from the same session run alone"
    cut = part("cadence", verdict="PARTIAL", reasons=[duplex.NOT_FINISHED], wl_reasons=[differs])
    assert duplex.record_reasons(cut) == [duplex.NOT_FINISHED, differs]
    done = part("cadence", verdict="INVALID", reasons=[differs], wl_reasons=[differs])
    assert duplex.record_reasons(done) == [differs]                  # the top level has them all
    reasons = [duplex.NOT_FINISHED, duplex.DIRTY_TREE, f"12 s < 60 s: {duplex.SHORT_RUN}", differs,
               "session 3: no solo reference for variant 1", "cadence solo run differs from the stock solo run"]
    assert duplex.invalid_codes(reasons) == ["partial", "dirty_tree", "short_run", "mismatch", "mismatch", "mismatch"]


def test_a_part_with_no_workloads_is_an_error():
    # it used to merge VALID (exit 0) with the other part's mode alone: nothing to pair, nothing compared
    empty = {**part("stock"), "workloads": {}}
    with pytest.raises(ValueError, match=r"records\[0\]: no workloads"):
        merge([empty, part("cadence")])


@pytest.mark.parametrize("mutate,match", [
    (lambda r: r.update(workloads=[]), "'workloads': expected an object"),
    (lambda r: r["workloads"][WL].update(modes=[]), "'modes': expected an object"),
    (lambda r: r["workloads"][WL]["modes"].update(stock=[]), "mode 'stock': expected an object"),
    (lambda r: r["workloads"][WL]["modes"]["stock"].update(runs={}), "'runs': expected a list"),
])
def test_cli_mis_shaped_record_is_one_line_error_naming_the_file(tmp_path, capsys, mutate, match):
    rec = part("stock")
    mutate(rec)
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps(rec))
    good.write_text(json.dumps(part("cadence")))
    out = tmp_path / "merged"
    assert main([str(bad), str(good), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m suite.duplex_merge: error:")
    assert "bad.json" in err and match in err
    assert not out.exists()


# --- duplex.json's unit table (suite.duplex.pack_units / unpack_units) ------------------------------------
def test_unit_table_gives_the_rows_back_and_stores_each_hash_once():
    """Each run's units as one table: keys once per run, each distinct sha256 once per record (a session of a
    multi-session run repeats its one-session run's hashes). Unpacking gives the rows back; a key a row
    lacked reads null."""
    rec = part("cadence")
    rec["workloads"][WL]["modes"]["cadence"]["runs"][0]["units"].append(
        {"session": 0, "index": 3, "kind": "LISTEN", "miss": False})              # no hashes on a LISTEN unit
    packed = duplex.pack_units(rec)
    assert packed is not rec and rec["workloads"][WL]["modes"]["cadence"]["runs"][0]["units"][0]["sha256_f32"]
    assert sorted(packed["unit_hashes"]) == sorted({f"u{i}-{k}" for i in range(3) for k in ("f32", "pcm16")})
    table = packed["workloads"][WL]["modes"]["cadence"]["runs"][1]["units"]
    assert table["columns"][:2] == ["session", "index"] and set(table["interned"]) == set(duplex.INTERNED_COLUMNS)
    assert len(json.dumps(packed)) < len(json.dumps(rec))
    back = duplex.unpack_units(json.loads(json.dumps(packed)))
    assert "unit_hashes" not in back
    expect = json.loads(json.dumps(rec))
    expect["workloads"][WL]["modes"]["cadence"]["runs"][0]["units"][3].update(sha256_f32=None, sha256_pcm16=None)
    assert back == expect
    assert duplex.unpack_units(json.loads(json.dumps(rec))) == rec           # a list (older records) is kept
    assert duplex.pack_units(packed) == packed                               # a table is kept


def _set_hash(t: dict, value) -> None:
    t["rows"][0][t["columns"].index("sha256_f32")] = value


@pytest.mark.parametrize("mutate, match", [
    (lambda t: t["rows"][0].pop(), "one value per column"),
    (lambda t: t.update(rows={}), "one value per column"),
    (lambda t: _set_hash(t, 99), "position in unit_hashes"),
    (lambda t: _set_hash(t, "u0-f32"), "position in unit_hashes"),
    (lambda t: _set_hash(t, True), "position in unit_hashes"),           # a bool is no position
    (lambda t: t.pop("interned"), "'interned'"),
    (lambda t: t.update(interned="sha256_f32"), "'interned'"),
    (lambda t: t.update(interned=["index"]), "'interned'"),
    (lambda t: t["columns"].__setitem__(1, "session"), "distinct strings"),
    (lambda t: t.update(columns="session"), "distinct strings"),
])
def test_a_mis_shaped_unit_table_is_an_error_naming_the_run(tmp_path, capsys, mutate, match):
    packed = duplex.pack_units(part("stock"))
    mutate(packed["workloads"][WL]["modes"]["stock"]["runs"][1]["units"])
    with pytest.raises(ValueError, match=match) as exc:
        duplex.unpack_units(json.loads(json.dumps(packed)))
    assert "run N=2 stock" in str(exc.value)
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps(packed))
    good.write_text(json.dumps(part("cadence")))
    assert main([str(bad), str(good), "--out", str(tmp_path / "merged"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json" in err and match in err and not (tmp_path / "merged").exists()


def test_cli_merges_a_table_record_with_a_list_record_and_writes_a_table(tmp_path):
    """A part written by suite.duplex now (a table) merges with one written before (a list of rows): the
    one-session hashes compare equal through the table, and the merged duplex.json is a table again."""
    stock, cadence = tmp_path / "stock.json", tmp_path / "cadence.json"
    stock.write_text(json.dumps(duplex.pack_units(part("stock"))))
    cadence.write_text(json.dumps({**part("cadence"), "schema": "duplexcadence.duplex/1"}))   # as written before
    assert main([str(stock), str(cadence), "--out", str(tmp_path / "m"), "--no-plots"]) == 0
    raw = json.loads((tmp_path / "m" / "duplex.json").read_text())
    assert isinstance(raw["workloads"][WL]["modes"]["stock"]["runs"][0]["units"], dict) and raw["unit_hashes"]
    rec = duplex.read_record(tmp_path / "m" / "duplex.json")
    assert rec["workloads"][WL]["cadence_equals_stock"] is True
    assert rec["workloads"][WL]["modes"]["cadence"]["runs"][1]["units"] == part("cadence")["workloads"][WL][
        "modes"]["cadence"]["runs"][1]["units"]
    differ = tmp_path / "differ.json"
    differ.write_text(json.dumps(duplex.pack_units(part("cadence", ("u0", "X", "u2")))))
    assert main([str(stock), str(differ), "--out", str(tmp_path / "d"), "--no-plots"]) == 1


@pytest.mark.parametrize("hashes", ["abc", {"0": "x"}, 3, [1, 2]])
def test_unit_hashes_that_are_not_a_list_of_strings_are_an_error(tmp_path, capsys, hashes):
    packed = {**duplex.pack_units(part("stock")), "unit_hashes": hashes}
    with pytest.raises(ValueError, match="'unit_hashes': expected a list of sha256 strings"):
        duplex.unpack_units(json.loads(json.dumps(packed)))
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps(packed))
    good.write_text(json.dumps(part("cadence")))
    assert main([str(bad), str(good), "--out", str(tmp_path / "m"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json" in err and not (tmp_path / "m").exists()


def test_cli_out_under_a_file_is_one_line_error(tmp_path, capsys):
    paths = write_parts(tmp_path)
    f = tmp_path / "a-file"
    f.write_text("x")
    assert main([*paths, "--out", str(f / "sub"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and f.read_text() == "x"


def test_a_record_that_cannot_be_plotted_is_an_error_and_makes_no_folder(tmp_path, capsys):
    paths = write_parts(tmp_path)        # the synthetic runs carry no miss_rate, their units no release times
    out = tmp_path / "merged"
    assert main([*paths, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cannot be plotted (KeyError" in err and "--no-plots" in err
    assert not out.exists()


def test_the_plots_land_in_out_beside_the_record(tmp_path):
    paths = []
    for mode in ("stock", "cadence"):
        rec = part(mode)
        for run in rec["workloads"][WL]["modes"][mode]["runs"]:
            run["metrics"]["miss_rate"] = 0.0
            for u in run["units"]:
                u.update(release_ms=1000.0 * u["index"], speak_ms=80.0 + u["index"])
        (tmp_path / f"{mode}.json").write_text(json.dumps(rec))
        paths.append(str(tmp_path / f"{mode}.json"))
    out = tmp_path / "merged"
    assert main([*paths, "--out", str(out)]) == 0
    rec = json.loads((out / "duplex.json").read_text())
    assert rec["plots"] and sorted(rec["plots"]) == sorted(p.name for p in out.glob("*.png"))


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", ""])
def test_a_workload_name_that_is_a_path_is_refused(tmp_path, capsys, name):
    # it names the plot files: '../../x' wrote them outside --out (a helper's attack, 2026-12-01)
    paths = []
    for mode in ("stock", "cadence"):
        rec = part(mode)
        rec["workloads"] = {name: rec["workloads"][WL]}
        (tmp_path / f"{mode}.json").write_text(json.dumps(rec))
        paths.append(str(tmp_path / f"{mode}.json"))
    before = sorted(tmp_path.parent.rglob("*"))
    assert main([*paths, "--out", str(tmp_path / "o" / "p")]) == 2
    assert "expected a workload name (no path separators)" in capsys.readouterr().err
    assert sorted(tmp_path.parent.rglob("*")) == before


def test_an_empty_out_and_units_that_cannot_be_written_leave_nothing(tmp_path, capsys, monkeypatch):
    paths = write_parts(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main([*paths, "--out", ""]) == 2 and "--out: expected a folder" in capsys.readouterr().err
    rec = json.loads((tmp_path / "cadence.json").read_text())
    rec["workloads"][WL]["modes"]["cadence"]["runs"][-1]["units"] = [1, 2, 3]   # not the plotted or solo run
    (tmp_path / "cadence.json").write_text(json.dumps(rec))
    before = sorted(tmp_path.rglob("*"))
    assert main([*paths, "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    assert "cannot be written" in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == before
