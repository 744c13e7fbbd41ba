"""The workload registry, the shipped data files and the session scripts (workloads/).

CPU only, no models: scripts are read with `datasets`, checked against invariants computed here
independently (the exact 12.5 Hz clock, the MiniCPM-o token loop, the VoxConverse SPEAK rule), and
regenerated in memory to prove the committed files are reproducible byte for byte.
"""
from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
import soundfile as sf

import workloads
from workloads import make_sessions
from workloads.common import DATA_DIR, FORMATS, ScriptError, SessionScript, Workload, load_script

# Published in the data provenance (shared/data/README.md), not computed by the code under test.
PUBLISHED_SHA256 = {
    "voice_prompts/ljspeech_LJ001-0001_24k.wav":
        "7ccb6704d610b73f7d53ae2401564e824eece790e454fbc54872108b4c0a207d",
    "voice_prompts/librispeech_8297-275156-0011_24k.wav":
        "7f4906486938121de6118751fe0167c604abc2a3dc57ef8cd40b21e8f9def3dc",
    "turn_taking/voxconverse_two_speaker_turns.csv":
        "bd87373bd8fee81cbf579f02dfc226e640a60bf36771f2c0d193cf17d99ecda6",
}

# (name, model, architecture, stock package, dtype, Euler steps, spec) as the project brief fixes them.
EXPECTED = [
    ("minicpmo45", "MiniCPM-o 4.5", "flow_hift", "minicpmo-utils==1.0.7", "float32", 10, {"n_timesteps": 10}),
    ("minicpmo45_5step", "MiniCPM-o 4.5", "flow_hift", "minicpmo-utils==1.0.7", "float32", 5,
     {"n_timesteps": 5}),
    ("stepaudio2_mini", "Step-Audio 2 mini", "flow_hift", "minicpmo-utils==1.0.7", "float32", 10,
     {"n_timesteps": 10, "variant": "stepaudio2"}),
    ("moshi", "Moshi", "mimi", "moshi==0.2.13", "float32", None, None),
    ("qwen3_omni", "Qwen3-Omni", "code2wav", "transformers==5.17.0", "bfloat16", None, None),
]

# The documented pattern of the default session (workloads/data/README.md): S = SPEAK, . = LISTEN.
PATTERN = "...SS.SSSSSSSSSSSSSSSSS....SSSSSSSSSS....SSS...SSSSSSS."


@pytest.fixture(scope="module")
def scripts() -> dict[str, SessionScript]:
    return {name: workloads.get(name).session_script() for name in workloads.names()}


def clock(k: int) -> int:
    """Frames of an exact 12.5 Hz clock after k one-second units: floor(12.5 k)."""
    return (25 * k) // 2


# --- registry --------------------------------------------------------------------------------------
def test_registry_lists_the_five_workloads_default_first():
    assert workloads.names() == [e[0] for e in EXPECTED]
    assert workloads.DEFAULT == "minicpmo45" == workloads.names()[0]


@pytest.mark.parametrize("name,model,arch,package,dtype,steps,spec", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_workload_facts(name, model, arch, package, dtype, steps, spec):
    wl = workloads.get(name)
    assert (wl.name, wl.model, wl.architecture, wl.stock_package, wl.dtype, wl.euler_steps) == \
        (name, model, arch, package, dtype, steps)
    if spec is not None:
        assert wl.spec == spec
    assert set(wl.seeds) == {"weights", "tokens", "prompt"}
    assert wl.script.is_file() and wl.script.parent == DATA_DIR / "sessions"
    assert wl.token_source and wl.notes


def test_unknown_workload_names_the_known_ones():
    with pytest.raises(KeyError, match="minicpmo45"):
        workloads.get("nope")


def test_voice_prompts():
    lj, libri = (DATA_DIR / "voice_prompts" / f for f in
                 ("ljspeech_LJ001-0001_24k.wav", "librispeech_8297-275156-0011_24k.wav"))
    for name in ("minicpmo45", "minicpmo45_5step"):
        wl = workloads.get(name)
        assert wl.voice_prompt == lj and wl.prompt_seconds == 6.0
    sa = workloads.get("stepaudio2_mini")
    assert sa.voice_prompt == libri and sa.prompt_seconds is None
    for name in ("moshi", "qwen3_omni"):
        assert workloads.get(name).voice_prompt is None and workloads.get(name).prompt_seconds is None
    info = sf.info(str(lj))
    assert (info.samplerate, info.channels) == (24000, 1)
    # 6.0 s at 24 kHz -> 16 kHz samples / 640 = 150 speech tokens @ 25 Hz = 300 mel frames (baseline P)
    assert int(6.0 * 24000) * 16000 // 24000 // 640 == 150
    assert sf.info(str(libri)).frames == 124080                  # 5.17 s: the whole clip


@pytest.mark.parametrize("field,value,match", [
    ("architecture", "wavenet", "architecture"),
    ("dtype", "float16", "dtype"),
    ("euler_steps", 17, "euler_steps"),
    ("spec", {"n_timesteps": 5}, "n_timesteps == euler_steps"),
    ("stock_package", "minicpmo-utils", "exact pin"),
    ("seeds", {"weights": 0}, "seeds"),
])
def test_workload_rejects_bad_fields(field, value, match):
    import dataclasses
    base = dataclasses.asdict(workloads.get("minicpmo45"))
    base[field] = value
    with pytest.raises(ValueError, match=match):
        Workload(**base)


# --- shipped data ----------------------------------------------------------------------------------
@pytest.mark.parametrize("rel", sorted(PUBLISHED_SHA256))
def test_shipped_data_matches_published_sha256(rel):
    assert hashlib.sha256((DATA_DIR / rel).read_bytes()).hexdigest() == PUBLISHED_SHA256[rel]


def test_data_readme_lists_the_hashes_and_attributions():
    text = (DATA_DIR / "README.md").read_text()
    for digest in PUBLISHED_SHA256.values():
        assert digest in text
    for line in ("LibriSpeech ASR corpus (c) 2014 by Vassil Panayotov, CC BY 4.0",
                 "VoxConverse speaker diarisation annotations, Chung et al. 2020", "public domain"):
        assert line in text


# --- the scripts ------------------------------------------------------------------------------------
def test_every_script_is_a_real_session(scripts):
    for name, s in scripts.items():
        assert len(s.turns) >= 2, name
        assert len(s.units) <= 120 and s.seconds == len(s.units), name
        assert [u.index for u in s.units] == list(range(len(s.units))), name
        assert [u.t_start_s for u in s.units] == [float(k) for k in range(len(s.units))], name
        for t, turn in enumerate(s.turns):
            assert {u.turn for u in turn} == {t}
            assert [u.final for u in turn] == [False] * (len(turn) - 1) + [True], (name, t)
            assert [u.index for u in turn] == list(range(turn[0].index, turn[0].index + len(turn)))


def test_default_session_has_enough_speak_units(scripts):
    s = scripts[workloads.DEFAULT]
    assert len(s.speak_units) >= 33                  # >= 30 measured after a 3-unit warm-up


def test_pattern_follows_the_voxconverse_rule(scripts):
    """Re-derive the pattern from the CSV with the documented rule: mpvoh, model = spk01, window
    [17 s, 72 s), SPEAK when spk01 talks >= 0.5 s of the second (overlap counts)."""
    with open(DATA_DIR / "turn_taking" / "voxconverse_two_speaker_turns.csv", newline="") as f:
        segs = [(round(float(r["start_s"]) * 1000), round(float(r["end_s"]) * 1000))
                for r in csv.DictReader(f) if r["recording_id"] == "mpvoh" and r["speaker"] == "spk01"]
    ms = [sum(max(0, min(a + 1000, e) - max(a, s)) for s, e in segs) for a in range(17000, 72000, 1000)]
    derived = "".join("S" if m >= 500 else "." for m in ms)
    assert derived == PATTERN
    for name, s in scripts.items():
        assert "".join("S" if u.kind == "SPEAK" else "." for u in s.units) == PATTERN, name
    firsts = [turn[0] for turn in scripts["minicpmo45"].turns]
    # first units: round_half_up(25 x spoken fraction), at least 8; a full second gives 25
    assert [len(u.tokens) for u in firsts[:-1]] == [max(8, (25 * ms[u.index] + 500) // 1000)
                                                    for u in firsts[:-1]]
    assert [len(u.tokens) for u in firsts] == [16, 20, 25, 25, 25]


def test_flow_tokens_and_end_of_turn_flushes(scripts):
    """Run MiniCPM-o's duplex token loop (unified L5446-5525) over the script, counted here: every
    end-of-turn flush size 3..7 must occur, and every non-final call is a 28-token or flush-loop call."""
    for name in ("minicpmo45", "minicpmo45_5step", "stepaudio2_mini"):
        s = scripts[name]
        flushes, calls = [], []
        for turn in s.turns:
            buf = 3                                      # [4218] * 3 at every turn start
            for u in turn:
                assert all(0 <= t < 6561 for t in u.tokens) and len(u.tokens) <= 25
                buf += len(u.tokens)
                while buf >= 8:                          # pre_lookahead + 5
                    n = min(28, buf)
                    calls.append(n)
                    buf -= min(25, n - 3)
                if u.final:
                    flushes.append(buf)
        assert sorted(flushes) == [3, 4, 5, 6, 7], name
        assert set(calls) <= set(range(8, 29)) and calls.count(28) >= 30, name
        assert all(u.tokens is None for u in s.units if u.kind == "LISTEN"), name


def test_flow_scripts_share_one_file_and_seed():
    flows = [workloads.get(n) for n in ("minicpmo45", "minicpmo45_5step", "stepaudio2_mini")]
    assert len({w.script for w in flows}) == 1 and len({w.seeds["tokens"] for w in flows}) == 1


def test_mimi_codes_on_every_unit_follow_the_exact_clock(scripts):
    s = scripts["moshi"]
    total = 0
    for k, u in enumerate(s.units):
        assert u.codes is not None and len(u.codes) == 8, k
        assert all(len(book) == u.frames for book in u.codes) and u.frames in (12, 13), k
        assert all(0 <= c < 2048 for book in u.codes for c in book)
        total += u.frames
        assert total == clock(k + 1), k
    assert total == 687                                  # floor(12.5 x 55)


def test_code2wav_codes_on_speak_units_follow_the_turn_clock(scripts):
    s = scripts["qwen3_omni"]
    assert all(u.codes is None for u in s.units if u.kind == "LISTEN")
    for turn in s.turns:
        total = 0
        for j, u in enumerate(turn):
            assert len(u.codes) == 16 and u.frames in (12, 13)
            assert all(len(book) == u.frames for book in u.codes)
            assert all(0 <= c < 2048 for book in u.codes for c in book)
            total += u.frames
            assert total == clock(j + 1)


def test_regeneration_is_byte_identical():
    rendered = make_sessions.render_all()
    assert set(rendered) == set((DATA_DIR / "sessions").glob("*.jsonl"))
    for path, text in rendered.items():
        assert path.read_bytes() == text.encode("utf-8"), path.name


def test_other_seed_gives_other_payloads_same_pattern():
    a = make_sessions.rows_for("flow_hift", 1)
    b = make_sessions.rows_for("flow_hift", 2)
    assert [r["kind"] for r in a] == [r["kind"] for r in b]
    assert [r.get("tokens") for r in a] != [r.get("tokens") for r in b]


# --- select -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,n,lengths", [
    ("minicpmo45", 4, [2, 2]),
    ("minicpmo45", 6, [2, 4]),
    ("minicpmo45", 20, [2, 17]),        # turn 2 needs 2 units, only 1 left: stops
    ("minicpmo45", 33, [2, 17, 10, 3]),
    ("moshi", 6, [2, 3]),               # 17 -> 4 would cut 13 (odd): 3 keeps the 12/13 alternation
    ("qwen3_omni", 10, [2, 7]),
], ids=lambda v: str(v) if not isinstance(v, list) else "-".join(map(str, v)))
def test_select_keeps_first_and_final_units(scripts, tmp_path, name, n, lengths):
    s = scripts[name]
    out = s.select(n)
    assert [len(t) for t in out.turns] == lengths
    assert len(out.speak_units) <= n
    assert [u.index for u in out.units] == list(range(len(out.units)))
    for orig, kept in zip(s.turns[:len(out.turns)], out.turns, strict=True):
        assert kept[0].payload == orig[0].payload and kept[-1].payload == orig[-1].payload
        assert kept[-1].final and not any(u.final for u in kept[:-1])
        assert [u.payload for u in kept[:-1]] == [u.payload for u in orig[:len(kept) - 1]]
    # LISTEN units before and between kept turns are all kept; nothing after the last kept turn
    last_orig = s.turns[len(lengths) - 1][-1].index
    assert sum(u.kind == "LISTEN" for u in out.units) == sum(u.kind == "LISTEN" for u in s.units[:last_orig])
    assert out.units[-1].final
    # the result is itself a valid script
    path = tmp_path / "selected.jsonl"
    path.write_text("".join(json.dumps(row(u)) + "\n" for u in out.units))
    again = load_script(path, s.fmt)
    assert again.units == out.units
    if name == "moshi":
        assert sum(u.frames for u in out.units) == clock(len(out.units))


def test_select_whole_script_when_it_fits(scripts):
    s = scripts["minicpmo45"]
    assert s.select(len(s.speak_units)).units == s.units


@pytest.mark.parametrize("name,n,min_turns,match", [
    ("minicpmo45", 3, 2, "need at least 4"),
    ("moshi", 4, 2, "need at least 5"),
    ("minicpmo45", 100, 6, "has 5 turns"),
    ("minicpmo45", 0, 2, "max_speak_units"),
])
def test_select_rejects_impossible_requests(scripts, name, n, min_turns, match):
    with pytest.raises(ValueError, match=match):
        scripts[name].select(n, min_turns=min_turns)


def row(u) -> dict:
    out = {"unit": u.index, "t_start_s": u.t_start_s, "kind": u.kind, "turn": u.turn, "final": u.final}
    if u.tokens is not None:
        out["tokens"] = list(u.tokens)
    if u.codes is not None:
        out["codes"] = [list(b) for b in u.codes]
    return out


# --- malformed scripts ------------------------------------------------------------------------------
def base_rows() -> list[dict]:
    """A small valid tokens script: 2 LISTEN, turn 0 (2 units), LISTEN, turn 1 (1 unit)."""
    return [
        {"unit": 0, "t_start_s": 0.0, "kind": "LISTEN", "turn": None, "final": False},
        {"unit": 1, "t_start_s": 1.0, "kind": "LISTEN", "turn": None, "final": False},
        {"unit": 2, "t_start_s": 2.0, "kind": "SPEAK", "turn": 0, "final": False, "tokens": [5] * 25},
        {"unit": 3, "t_start_s": 3.0, "kind": "SPEAK", "turn": 0, "final": True, "tokens": [6, 7]},
        {"unit": 4, "t_start_s": 4.0, "kind": "LISTEN", "turn": None, "final": False},
        {"unit": 5, "t_start_s": 5.0, "kind": "SPEAK", "turn": 1, "final": True, "tokens": []},
    ]


def write(tmp_path: Path, rows, name="bad.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_base_script_is_valid(tmp_path):
    s = load_script(write(tmp_path, base_rows(), "ok.jsonl"))
    assert [len(t) for t in s.turns] == [2, 1] and s.units[3].tokens == (6, 7) and s.fmt.key == "tokens"


def _edit(i, **fields):
    def apply(rows):
        for k, v in fields.items():
            if v is KeyError:
                del rows[i][k]
            else:
                rows[i][k] = v
        return rows
    return apply


CASES = [  # (id, edit, row, field, words in the message)
    ("missing-field", _edit(2, final=KeyError), 2, "final", "missing"),
    ("unknown-field", _edit(3, speaker="spk01"), 3, "speaker", "unknown field"),
    ("kind", _edit(2, kind="TALK"), 2, "kind", "LISTEN"),
    ("token-range", _edit(3, tokens=[6, 6561]), 3, "tokens[1]", "[0, 6561)"),
    ("token-negative", _edit(3, tokens=[-1]), 3, "tokens[0]", "[0, 6561)"),
    ("token-float", _edit(3, tokens=[6, 2.5]), 3, "tokens[1]", "2.5"),
    ("token-whole-float", _edit(3, tokens=[6, 2.0]), 3, "tokens[1]", "2.0"),
    ("token-string", _edit(2, tokens=["7"]), 2, "tokens[0]", '"7"'),
    ("token-bool", _edit(3, tokens=[True]), 3, "tokens[0]", "true"),
    ("too-many-tokens", _edit(2, tokens=[1] * 26), 2, "tokens", "at most 25"),
    ("speak-turn-null", _edit(2, turn=None), 2, "turn", "SPEAK"),
    ("listen-with-turn", _edit(1, turn=0), 1, "turn", "LISTEN"),
    ("listen-final", _edit(4, final=True), 4, "final", "LISTEN"),
    ("listen-with-tokens", _edit(4, tokens=[1, 2]), 4, "tokens", "no payload"),
    ("final-not-last", _edit(2, final=True), 3, "turn", "finalised"),
    ("no-final", _edit(3, final=False), 3, "final", "last SPEAK unit of turn 0"),
    ("no-final-at-eof", _edit(5, final=False), 5, "final", "end of file"),
    ("turn-skipped", _edit(5, turn=2), 5, "turn", "1 (turns are numbered"),
    ("unit-gap", _edit(3, unit=4), 3, "unit", "expected 3"),
    ("t-start", _edit(3, t_start_s=2.5), 3, "t_start_s", "3.0"),
    ("speak-no-payload", _edit(2, tokens=KeyError), 2, "tokens", "missing"),
    ("both-payloads", _edit(2, codes=[[1]]), 2, "codes", "both"),
]


@pytest.mark.parametrize("edit,row_i,field,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_rows_name_row_and_field(tmp_path, edit, row_i, field, words):
    path = write(tmp_path, edit(base_rows()))
    with pytest.raises(ScriptError) as info:
        load_script(path)
    err = info.value
    assert (err.path, err.row, err.field) == (path, row_i, field), str(err)
    assert str(path) in str(err) and f"row {row_i} (line {row_i + 1})" in str(err)
    assert f"field '{field}'" in str(err) and words in str(err)


def test_unit_after_finalised_turn_past_a_listen(tmp_path):
    rows = base_rows()
    rows[2]["final"] = True                               # turn 0 ends at row 2 ...
    rows[3] = {"unit": 3, "t_start_s": 3.0, "kind": "LISTEN", "turn": None, "final": False}
    rows[4] = {"unit": 4, "t_start_s": 4.0, "kind": "SPEAK", "turn": 0, "final": True, "tokens": [1]}
    with pytest.raises(ScriptError, match="finalised") as info:    # ... and comes back at row 4
        load_script(write(tmp_path, rows))
    assert (info.value.row, info.value.field) == (4, "turn")


def test_codes_rows_are_checked_against_the_format(tmp_path):
    def codes_rows(books=(8, 8), frames=(12, 13)):
        return [
            {"unit": 0, "t_start_s": 0.0, "kind": "LISTEN", "turn": None, "final": False,
             "codes": [[1] * frames[0] for _ in range(books[0])]},
            {"unit": 1, "t_start_s": 1.0, "kind": "SPEAK", "turn": 0, "final": True,
             "codes": [[2] * frames[1] for _ in range(books[1])]},
        ]
    assert len(load_script(write(tmp_path, codes_rows(), "ok.jsonl"), FORMATS["mimi"]).units) == 2
    with pytest.raises(ScriptError, match="8 codebooks") as info:
        load_script(write(tmp_path, codes_rows(books=(8, 7))), FORMATS["mimi"])
    assert (info.value.row, info.value.field) == (1, "codes")
    with pytest.raises(ScriptError, match="2 codebooks") as info:        # inferred from the first row
        load_script(write(tmp_path, codes_rows(books=(2, 3))))
    assert (info.value.row, info.value.field) == (1, "codes")
    with pytest.raises(ScriptError, match="1..13 frames") as info:
        load_script(write(tmp_path, codes_rows(frames=(12, 14))), FORMATS["mimi"])
    assert (info.value.row, info.value.field) == (1, "codes[0]")
    rows = codes_rows()
    rows[1]["codes"][3] = [2] * 12
    with pytest.raises(ScriptError, match=r"13 frames \(as codes\[0\]\)") as info:
        load_script(write(tmp_path, rows), FORMATS["mimi"])
    assert (info.value.row, info.value.field) == (1, "codes[3]")
    rows = codes_rows()
    rows[1]["codes"][7][12] = 2048
    with pytest.raises(ScriptError, match=r"\[0, 2048\)") as info:
        load_script(write(tmp_path, rows), FORMATS["mimi"])
    assert info.value.field == "codes[7][12]"
    rows = codes_rows()
    del rows[0]["codes"]                                  # Moshi decodes while listening too
    with pytest.raises(ScriptError, match="payload on a LISTEN unit") as info:
        load_script(write(tmp_path, rows), FORMATS["mimi"])
    assert (info.value.row, info.value.field) == (0, "codes")
    with pytest.raises(ScriptError, match="no payload on a LISTEN unit"):   # Code2Wav does not
        load_script(write(tmp_path, codes_rows(books=(16, 16))), FORMATS["code2wav"])
    with pytest.raises(ScriptError, match="'tokens'") as info:
        load_script(write(tmp_path, codes_rows()), FORMATS["flow_hift"])
    assert info.value.field == "codes"


def test_invalid_jsonl_names_the_line(tmp_path):
    rows = base_rows()
    rows[3] = '{"unit": 3, "t_start_s": 3.0, "kind": "SPEAK"'
    with pytest.raises(ScriptError, match="JSONL") as info:
        load_script(write(tmp_path, rows))
    assert (info.value.row, info.value.line, info.value.field) == (3, 4, None)
    with pytest.raises(ScriptError, match="a JSON object") as info:
        load_script(write(tmp_path, ['[1, 2]']))
    assert info.value.row == 0


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ScriptError, match="no such file") as info:
        load_script(tmp_path / "absent.jsonl")
    assert info.value.path == tmp_path / "absent.jsonl" and info.value.row is None
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ScriptError, match="empty file"):
        load_script(tmp_path / "empty.jsonl")


def test_make_sessions_takes_no_arguments_and_writes_nothing_when_given_one():
    before = {p: p.stat().st_mtime_ns for p in make_sessions.SESSIONS.glob("*.jsonl")}
    for argv in (["--bogus"], ["--help"]):
        with pytest.raises(SystemExit):
            make_sessions.main(argv)
    assert before and {p: p.stat().st_mtime_ns for p in make_sessions.SESSIONS.glob("*.jsonl")} == before
