"""asv benchmarks of DuplexCadence (asv.conf.json: "benchmark_dir": "suite/asv"; suite/asv/README.md).

asv imports this directory as a top-level package named after it (`asv`), from a scratch working
directory; the tests import it as `suite.asv`. Either way the repository's own `workloads`, `suite` and
`duplexcadence` must be the ones imported, so the repository root goes first on `sys.path` (an editable
install made before a package gained its `__init__.py` would otherwise hand out an empty namespace
package). That is the only thing importing this package does.
"""
from __future__ import annotations

import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)
