"""The workload registry: one definition per released model (shared/DESIGN.md section 4).

`names()` lists the workloads in registry order, `get(name)` returns one, `DEFAULT` is the one
`make reproduce` runs. Each model's facts live in its own module, with upstream citations.
"""
from __future__ import annotations

from workloads import minicpmo45, moshi, qwen3_omni, stepaudio2_mini
from workloads.common import Workload

DEFAULT = "minicpmo45"

_REGISTRY: dict[str, Workload] = {
    wl.name: wl
    for module in (minicpmo45, stepaudio2_mini, moshi, qwen3_omni)
    for wl in module.WORKLOADS
}


def names() -> list[str]:
    """Workload names, in registry order (the default first)."""
    return list(_REGISTRY)


def get(name: str) -> Workload:
    """The workload called `name`. Raises KeyError naming the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"workload {name!r}: expected one of {names()}") from None
