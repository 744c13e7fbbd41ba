#!/usr/bin/env bash
# Fetch the wheels of tools/lent_gpu/wheels.txt for the lent H200 (CPython 3.12, x86-64 manylinux) into the
# folders it names, at the repository root (ignored by git: add them to .git/info/exclude). Run where pip
# reaches an index:  bash tools/lent_gpu/wheels.sh   (then carry .whl and .whl-ray; about 47 MiB together,
# so the tree that travels must leave that much of the 64 MiB a call carries: docs/gpu.md).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PYTHON:-python3}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
grep -v '^#' tools/lent_gpu/wheels.txt | while read -r folder req how; do
  [ -n "$folder" ] || continue
  mkdir -p "$folder"
  case "${how:-}" in
    build)  "$PY" -m pip wheel -q --no-deps -w "$folder" "$req" ;;
    repack) "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
              "${PLAT[@]}" -d "$tmp" "$req"
            "$PY" tools/repack_ray_wheel.py "$tmp"/ray-*.whl --out "$folder" ;;
    *)      "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
              "${PLAT[@]}" -d "$folder" "$req" ;;
  esac
done
du -sh $(grep -v '^#' tools/lent_gpu/wheels.txt | awk 'NF {print $1}' | sort -u)
