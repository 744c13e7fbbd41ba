"""Formatting shared by the report's tables: numbers as text, a dash for what is missing, pipe tables."""
from __future__ import annotations

from tabulate import tabulate

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


def table(rows, headers) -> str:
    """A Markdown pipe table, cells as given (no number parsing)."""
    return tabulate(rows, headers=headers, tablefmt="pipe", disable_numparse=True)


def pct_change(new, old) -> float | None:
    """100 * (new - old) / old; None where either is missing or old is 0."""
    return None if new is None or not old else 100.0 * (new - old) / old
