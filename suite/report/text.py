"""Formatting shared by the report: numbers as text, a dash for what is missing, Markdown pipe tables whose
cells are not padded (a long cell costs its own bytes, not every row's)."""
from __future__ import annotations

DASH = "—"


def fmt(value, spec: str = ".1f") -> str:
    """A value as a table cell: a dash for None, yes / no for a bool, `spec` for a float."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def cell(value) -> str:
    """A cell's text: pipes escaped, newlines as spaces."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows, headers) -> str:
    """A Markdown pipe table, cells as given (no number parsing, no padding)."""
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pct_change(new, old) -> float | None:
    """100 * (new - old) / old; None where either is missing or old is 0."""
    return None if new is None or not old else 100.0 * (new - old) / old


def interval(x, lo, hi, spec: str = ".2f", unit: str = "x") -> str:
    """'2.86x [2.83-2.89]', or the figure alone without an interval, or a dash."""
    if x is None:
        return DASH
    return f"{x:{spec}}{unit}" + ("" if lo is None or hi is None else f" [{lo:{spec}}-{hi:{spec}}]")
