"""`make report ARGS=FOLDER`: rebuild results folders' reports from their records alone.

    python -m suite.report FOLDER [FOLDER ...] [--compare REF ...]
    python -m suite.report RUN --publish [--results DIR]

stages.json: the merged report, claims.json and plots (--compare first records reference runs in it);
run.json: its own REPORT.md; duplex.json alone: its REPORT.md (suite.report.duplex) and plots; drop-in records alone (dropin_*.json): their
lines. --publish: one staged run's report and claims also at the fixed paths DIR/REPORT.md and
DIR/CLAIMS.json (default results/: the latest complete reference, as chosen by whoever publishes). Every
folder is checked before any is written; with none named it exits 2 and rewrites nothing (committed reports
were rendered by the code of their day).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from suite.records import DUPLEX_READ_SCHEMAS, REPO_ROOT, read_dropins, read_duplex
from suite.report import document, dropins, duplex, single
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
        path = folder / "duplex.json"
        try:
            record = read_duplex(path)
            if not isinstance(record, dict) or record.get("schema") not in DUPLEX_READ_SCHEMAS:
                raise ValueError(f"'schema': expected one of {list(DUPLEX_READ_SCHEMAS)}, got "
                                 f"{(record.get('schema') if isinstance(record, dict) else type(record).__name__)!r}")
            staging = Path(tempfile.mkdtemp(prefix="duplex-report-"))
            try:                                    # plots drawn aside first: a bad record writes nothing here
                plots = duplex_plots(record, staging)
                text = duplex.render(record, plots)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"{path}: not a duplex record this report can read ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from None

        def write_duplex() -> Path:
            for name in plots:
                shutil.move(str(staging / name), str(folder / name))
            shutil.rmtree(staging, ignore_errors=True)
            (folder / "REPORT.md").write_text(text)
            return folder / "REPORT.md"
        write_duplex.discard = lambda: shutil.rmtree(staging, ignore_errors=True)
        return write_duplex
    text = (dropins.render(folder) if not (folder / "run.json").is_file() and read_dropins(folder)
            else single.render_file(folder / "run.json"))

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
    ap.add_argument("--publish", action="store_true",
                    help="also write this staged run's report and claims to DIR/REPORT.md and DIR/CLAIMS.json")
    ap.add_argument("--results", default=str(REPO_ROOT / "results"), metavar="DIR",
                    help="where --publish writes (default: this checkout's results/)")
    args = ap.parse_args(argv)
    if not args.folders:
        print("error: FOLDER: none given; expected one or more results folders holding stages.json, run.json or "
              "duplex.json, e.g. `make report ARGS=results/<run>` (nothing was rebuilt)", file=sys.stderr)
        return 2
    if args.publish:
        if len(args.folders) != 1 or args.compare or not (Path(args.folders[0]) / "stages.json").is_file():
            print("error: --publish: name one staged run folder (with stages.json), without --compare (nothing was "
                  "rebuilt)", file=sys.stderr)
            return 2
        try:
            paths = document.publish(args.folders[0], args.results)
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc} (nothing was rebuilt)", file=sys.stderr)
            return 1
        for path in paths:
            print(f"wrote {path}")
        return 0
    writers = []
    for folder in args.folders:
        try:
            writers.append(checked(folder, args.compare))
        except (FileNotFoundError, ValueError) as exc:     # ValueError: StateError, a bad record
            for write in writers:                           # what earlier folders drew aside
                getattr(write, "discard", lambda: None)()
            print(f"error: {exc} (nothing was rebuilt)", file=sys.stderr)
            return 1
    for write in writers:
        print(f"wrote {write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
