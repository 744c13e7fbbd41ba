"""Whether two run folders' stages produced the same bytes: every unit's sha256 (float32 waveform and int16
PCM) of every mode, stage by stage, for the stages both folders have done (e.g. the verify stages of a
sitting through Ray against the same stages without it).

    python tools/same_bytes.py RUN_A RUN_B

Prints a line per stage (units in both folders, how many differ, how many only one folder has: a run limited
by --max-speak-units plays fewer) and exits 0 when every unit both have is equal, 1 when one differs or no
stage is in both, 2 for a folder that is not a staged run or a done stage whose record does not read.
"""
from __future__ import annotations

import sys
from pathlib import Path

from suite.records import read_json, read_stages
from suite.report.runs import unit_hashes


def hashes(run: Path, name: str) -> dict:
    """(mode, unit index) -> hashes of a done stage's run.json. Raises ValueError naming the file where it does
    not read as a run record with unit hashes."""
    path = run / name / "run.json"
    rec = read_json(path)
    if rec is None:
        raise ValueError(f"{path}: missing or not a JSON object (the stage is done in stages.json)")
    try:
        units = unit_hashes(rec)
        return {(mode, index): h for mode, by_index in units.items() for index, h in by_index.items()}
    except (AttributeError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: its units are not shaped as a run record's ({type(exc).__name__}: {exc})") \
            from None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    a, b = (Path(x) for x in argv)
    try:
        done = [{n for n, st in read_stages(r)["stages"].items() if st.get("status") == "done"} for r in (a, b)]
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bad = compared = 0
    for name in sorted(done[0] & done[1]):
        try:
            ha, hb = hashes(a, name), hashes(b, name)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not ha and not hb:
            continue
        keys = sorted(set(ha) & set(hb), key=str)
        differ = [k for k in keys if ha[k] != hb[k]]
        compared += 1
        bad += bool(differ) or not keys
        print(f"{name}: {len(keys)} units in both, {len(differ)} differ, {len(set(ha) ^ set(hb))} in one only"
              + (f": {differ[:5]}" if differ else ""))
    if not compared:
        print("no stage with unit hashes is done in both folders", file=sys.stderr)
    return 0 if compared and not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
