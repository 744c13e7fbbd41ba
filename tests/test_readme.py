"""README.md: its Python example runs and prints what it says; its size and its links hold.

The example is the README's only ```python block. It is written for a GPU at the released depth; here it
runs on CPU at reduced depth by one rule: the literal `device="cuda", depth="released"` in it is replaced
with `device="cpu", depth="reduced"` (the test fails if that literal is gone, so the rule cannot silently
stop applying). What it must print: for each of its three units, the unit number, 23040 samples (12 Mimi
frames x 1920 samples @ 24 kHz) and True (stock and DuplexCadence bytes equal), then the session's
SessionStats.
"""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GPU_ARGS = 'device="cuda", depth="released"'
CPU_ARGS = 'device="cpu", depth="reduced"'
MAX_BYTES = 10_000


def example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, f"README.md: expected one ```python block, found {len(blocks)}"
    return blocks[0]


def test_readme_example_runs_and_prints_equal_bytes():
    code = example()
    assert GPU_ARGS in code, f"the example no longer contains {GPU_ARGS!r}: update the CPU rule here"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(GPU_ARGS, CPU_ARGS), "README.md example", "exec"), {"__name__": "readme"})
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["0 23040 True", "1 23040 True", "2 23040 True"], lines
    assert len(lines) == 4 and lines[3].startswith("SessionStats("), lines


def test_readme_is_one_screen():
    size = len(README.read_bytes())
    assert size < MAX_BYTES, f"README.md is {size} bytes, over {MAX_BYTES}: move detail to docs/"


def test_links_in_readme_and_docs_point_at_files():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 1, "docs/ has no pages"
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing
