"""`make report ARGS=FOLDER`: rebuild results folders' reports from their records alone.

    python -m suite.report FOLDER [FOLDER ...] [--compare REF ...]

stages.json: the merged report and plots (--compare first records reference runs in it); run.json: its own
REPORT.md; duplex.json alone: its plots. Every folder is checked before any is written; with none named it
exits 2 and rewrites nothing (committed reports were rendered by the code of their day).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from suite.records import read_duplex
from suite.report import document, single
from suite.report.plots import duplex_plots


def record_compare(folder: Path, compare: list[str]) -> None:
    """Set stages.json's `compare` list atomically, touching nothing else in it."""
    path = folder / "stages.json"
    data = json.loads(path.read_text())
    data["compare"] = list(dict.fromkeys(str(c) for c in compare))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def checked(folder: str | Path, compare: list[str] | None):
    """Check one folder's report can be rebuilt, writing nothing; returns the call that writes it. Raises
    FileNotFoundError naming what is missing, ValueError for a malformed record or reference, or compare on a
    folder that is not a staged reproduction."""
    folder = Path(folder)
    if (folder / "stages.json").is_file():
        document.prepare(folder, compare)

        def write_staged() -> Path:
            if compare:
                record_compare(folder, compare)
            return document.write(folder)
        return write_staged
    if compare:
        raise ValueError(f"--compare {' '.join(compare)}: only for a staged reproduction (a folder with "
                         f"stages.json); {folder} is not one")
    if not (folder / "run.json").is_file() and (folder / "duplex.json").is_file():
        record = read_duplex(folder / "duplex.json")

        def write_plots() -> Path:
            duplex_plots(record, folder)
            return folder / "duplex.json"
        return write_plots
    text = single.render_file(folder / "run.json")

    def write_single() -> Path:
        (folder / "REPORT.md").write_text(text)
        return folder / "REPORT.md"
    return write_single


def rebuild(folder: str | Path, compare: list[str] | None = None) -> Path:
    """Rebuild one folder's report (module docstring). Raises as `checked`; nothing is written unless it
    renders."""
    return checked(folder, compare)()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suite.report",
                                 description="Rebuild REPORT.md of result folders from their records.")
    ap.add_argument("folders", nargs="*", metavar="FOLDER",
                    help="results folders: staged reproductions (stages.json), single runs (run.json) or duplex "
                         "harness folders (duplex.json); at least one")
    ap.add_argument("--compare", action="append", default=None, metavar="REF",
                    help="a reference run folder (repeatable) for a staged reproduction: recorded in its stages.json "
                         "and reported beside it")
    args = ap.parse_args(argv)
    if not args.folders:
        print("error: FOLDER: none given; expected one or more results folders holding stages.json, run.json or "
              "duplex.json, e.g. `make report ARGS=results/<run>` (nothing was rebuilt)", file=sys.stderr)
        return 2
    writers = []
    for folder in args.folders:
        try:
            writers.append(checked(folder, args.compare))
        except (FileNotFoundError, ValueError) as exc:     # ValueError: StateError, a bad record
            print(f"error: {exc} (nothing was rebuilt)", file=sys.stderr)
            return 1
    for write in writers:
        print(f"wrote {write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
