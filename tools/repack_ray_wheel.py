"""Repack a ray wheel without the Java jars Python never loads (`ray/jars/`, ~31 MB of the ~79 MB wheel), for
a machine that takes a limited number of bytes per call.

    python tools/repack_ray_wheel.py ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl --out DIR

Writes DIR/<the same wheel name>: every other member unchanged, RECORD without the dropped files (pip checks
each installed file's hash against RECORD). Prints the sizes. Exit status 2 for a file that is not a ray
wheel or an --out that is the wheel's own folder.
"""
from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

DROP = ("ray/jars/",)


def repack(wheel: Path, out_dir: Path) -> Path:
    """The wheel without DROP's members, as out_dir/<wheel name>. Raises ValueError for a wheel without a
    ray-*.dist-info/RECORD, or out_dir the wheel's own folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel.name
    if target.resolve() == wheel.resolve():
        raise ValueError(f"--out {out_dir}: the wheel's own folder; the repacked wheel would replace it")
    with zipfile.ZipFile(wheel) as src:
        records = [n for n in src.namelist() if n.endswith(".dist-info/RECORD") and n.startswith("ray-")]
        if len(records) != 1:
            raise ValueError(f"{wheel}: expected one ray-*.dist-info/RECORD, found {records}")
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename.startswith(DROP):
                    continue
                data = src.read(info)
                if info.filename == records[0]:
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(line for line in lines if not line.startswith(DROP)).encode()
                dst.writestr(info, data, compress_type=info.compress_type)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/repack_ray_wheel.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        target = repack(args.wheel, args.out)
    except (ValueError, zipfile.BadZipFile, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mib = 2 ** 20
    print(f"{args.wheel.name}: {args.wheel.stat().st_size / mib:.1f} MiB -> {target} {target.stat().st_size / mib:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
