"""Write the session scripts, workloads/data/sessions/*.jsonl, from real VoxConverse turn timings.

`python -m workloads.make_sessions` rewrites every script. The output is deterministic:
tests/test_workloads.py regenerates the scripts in memory and compares them byte for byte with the
committed files. workloads/data/README.md ("Session scripts") documents the same rules.

LISTEN/SPEAK pattern (one shared pattern, one file per payload format):
* Timing source: turn_taking/voxconverse_two_speaker_turns.csv, recording `mpvoh` (VoxConverse dev).
  It is a real two-person exchange. In the window, both speakers alternate, and every LISTEN gap holds
  speech of the other speaker. Overlapping speech touches 9 of the 55 units (barge-ins and
  back-channels). Among the conversational candidates, it is the shortest window that meets all of
  these: >= 33 SPEAK units, >= 5 model turns, no one-unit turns, and >= 3 LISTEN units before the
  first turn.
* The model is speaker `spk01`, the more active one in mpvoh (89.7 s of speech against 55.4 s). The
  other speaker is the user.
* Window: [17 s, 72 s) of the recording, 55 units. Unit k covers [17 + k, 18 + k) s and starts at
  session time k s.
* A unit is SPEAK when the model's speaker talks for at least 0.5 s of it. Speech of the user in the
  same second does not matter: in full duplex the model keeps speaking while the user barges in.
  Otherwise the unit is LISTEN.
* A turn is a maximal run of consecutive SPEAK units. Its last unit is marked final.

Payloads (random.Random(seed), seed = the workload's seeds["tokens"], drawn in unit order):
* tokens (flow_hift): speech token ids in [0, 6561).
  - A steady unit carries 25 tokens.
  - The first unit of a turn carries round_half_up(25 x spoken fraction) tokens, at least 8. The
    spoken fraction is the model speaker's speech in that second divided by 1 s.
  - The final unit of turn t carries r = (0, 1, 2, 3, 4)[t % 5] tokens. This also holds for a one-unit
    turn. With the 3 lookahead tokens carried over, the end-of-turn flushes over turns 0..4 are
    `stream(3 + r tokens, last_chunk=True)`, so every size from 3 to 7 occurs.
* codes (mimi, Moshi): every unit carries [8][F_k] ids in [0, 2048), with
  F_k = floor(12.5 (k + 1)) - floor(12.5 k), i.e. 12, 13, 12, ...; Moshi decodes while it listens too.
* codes (code2wav, Qwen3-Omni): each SPEAK unit carries [16][F_j] ids in [0, 2048), where j is the unit's
  position in its turn: the same exact clock, restarted at every turn.
"""
from __future__ import annotations

import functools
import json
import random
from pathlib import Path

from workloads.common import DATA_DIR, FORMATS, UNIT_SECONDS, Workload, read_local

TIMINGS = DATA_DIR / "turn_taking" / "voxconverse_two_speaker_turns.csv"
SESSIONS = DATA_DIR / "sessions"
RECORDING = "mpvoh"
MODEL_SPEAKER = "spk01"
WINDOW_START_MS = 17_000
WINDOW_UNITS = 55
UNIT_MS = 1000
SPEAK_MIN_MS = 500            # SPEAK when the model's speaker talks >= 0.5 s of the unit
STEADY_TOKENS = 25            # 1.00 s @ 25 Hz (MiniCPM-o unified L5446ff: CHUNK_SIZE = 25)
FIRST_MIN_TOKENS = 8          # flush-loop minimum: pre_lookahead + 5 (unified loop)
FINAL_REMAINDERS = (0, 1, 2, 3, 4)   # + 3 carried lookahead tokens = end-of-turn flushes of 3..7


@functools.lru_cache(maxsize=1)
def timing_rows() -> tuple:
    """The rows of the VoxConverse timing file (read once per process)."""
    return tuple(read_local("csv", TIMINGS))


@functools.lru_cache(maxsize=None)
def merged_segments(recording: str, speaker: str) -> tuple[tuple[int, int], ...]:
    """`speaker`'s speech in `recording` as sorted, disjoint [start, end) ms segments (overlaps merged); empty
    when the timing file has no rows for them."""
    segs = sorted((round(r["start_s"] * 1000), round(r["end_s"] * 1000)) for r in timing_rows()
                  if r["recording_id"] == recording and r["speaker"] == speaker)
    merged: list[list[int]] = []
    for s, e in segs:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return tuple((s, e) for s, e in merged)


def speech_ms(recording: str = RECORDING, speaker: str = MODEL_SPEAKER, start_ms: int = WINDOW_START_MS,
              units: int = WINDOW_UNITS) -> list[int]:
    """Milliseconds of `speaker`'s speech in each one-second unit of the window (segments merged).
    Raises ValueError if the recording or speaker is not in the timing file."""
    merged = merged_segments(recording, speaker)
    if not merged:
        raise ValueError(f"{TIMINGS}: no rows for recording {recording!r}, speaker {speaker!r}")
    out = []
    for k in range(units):
        a = start_ms + k * UNIT_MS
        b = a + UNIT_MS
        out.append(sum(max(0, min(b, e) - max(a, s)) for s, e in merged))
    return out


def turns_of(speech: list[int]) -> list[int | None]:
    """Turn number of each unit (None for LISTEN): turns are maximal runs of SPEAK units."""
    out: list[int | None] = []
    turn = -1
    for k, ms in enumerate(speech):
        speak = ms >= SPEAK_MIN_MS
        if speak and (k == 0 or out[-1] is None):
            turn += 1
        out.append(turn if speak else None)
    return out


def frames_in_unit(k: int) -> int:
    """Codec frames in one-second unit k of an exact 12.5 Hz clock: floor(12.5(k+1)) - floor(12.5k)."""
    return (25 * (k + 1)) // 2 - (25 * k) // 2


def token_counts(speech: list[int], turns: list[int | None]) -> list[int]:
    """Speech tokens per unit (0 for LISTEN): a turn's first unit by spoken fraction (a one-unit turn too: a
    remainder alone would leave Step-Audio 2 a final call of 1 token, which upstream cannot run), steady 25,
    final r."""
    out = []
    for k, t in enumerate(turns):
        first = t is not None and (k == 0 or turns[k - 1] != t)
        if t is None:
            out.append(0)
        elif first:
            out.append(max(FIRST_MIN_TOKENS, (STEADY_TOKENS * speech[k] + UNIT_MS // 2) // UNIT_MS))
        elif k + 1 == len(turns) or turns[k + 1] != t:
            out.append(FINAL_REMAINDERS[t % len(FINAL_REMAINDERS)])
        else:
            out.append(STEADY_TOKENS)
    return out


def rows_for(architecture: str, seed: int, *, recording: str = RECORDING, speaker: str = MODEL_SPEAKER,
             start_ms: int = WINDOW_START_MS, units: int = WINDOW_UNITS) -> list[dict]:
    """The script rows of one payload format, payloads drawn from random.Random(seed) in unit order, on the
    LISTEN/SPEAK pattern of `speaker` in `units` seconds of `recording` from `start_ms` (default: the
    committed scripts' window)."""
    fmt = FORMATS[architecture]
    speech = speech_ms(recording, speaker, start_ms, units)
    turns = turns_of(speech)
    counts = token_counts(speech, turns)
    rng = random.Random(seed)
    rows = []
    for k, t in enumerate(turns):
        final = t is not None and (k + 1 == len(turns) or turns[k + 1] != t)
        row = {"unit": k, "t_start_s": k * UNIT_SECONDS, "kind": "LISTEN" if t is None else "SPEAK",
               "turn": t, "final": final}
        if fmt.key == "tokens" and t is not None:
            row["tokens"] = [rng.randrange(fmt.vocab) for _ in range(counts[k])]
        elif fmt.key == "codes" and (t is not None or fmt.listen == "required"):
            pos = k if fmt.listen == "required" else k - turns.index(t)   # session or turn clock
            frames = frames_in_unit(pos)
            row["codes"] = [[rng.randrange(fmt.vocab) for _ in range(frames)] for _ in range(fmt.codebooks)]
        rows.append(row)
    return rows


def render(workload: Workload) -> str:
    """The JSONL text of a workload's script: compact rows, one per line, newline-terminated."""
    rows = rows_for(workload.architecture, workload.seeds["tokens"])
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)


def render_all() -> dict[Path, str]:
    """Every registered workload's script text by path. Raises ValueError if two workloads share a
    script path but not its architecture and tokens seed."""
    import workloads

    out: dict[Path, str] = {}
    owner: dict[Path, Workload] = {}
    for name in workloads.names():
        wl = workloads.get(name)
        first = owner.setdefault(wl.script, wl)
        if (first.architecture, first.seeds["tokens"]) != (wl.architecture, wl.seeds["tokens"]):
            raise ValueError(f"{wl.script}: shared by {first.name!r} and {wl.name!r}, which differ in "
                             f"architecture or seeds['tokens']")
        out.setdefault(wl.script, render(wl))
    return out


def main(argv: list[str] | None = None) -> None:
    """Rewrite every script. It takes no arguments: any (or --help) prints the usage and writes nothing."""
    import argparse
    argparse.ArgumentParser(prog="python -m workloads.make_sessions",
                            description=__doc__.split("\n\n")[0]).parse_args(argv)
    SESSIONS.mkdir(parents=True, exist_ok=True)
    for path, text in render_all().items():
        path.write_text(text, encoding="utf-8", newline="\n")
        print(f"{path.relative_to(DATA_DIR.parent.parent)}: {text.count(chr(10))} units, {len(text)} bytes")


if __name__ == "__main__":
    main()
