#!/usr/bin/env bash
# three device calls in one loan, branch concurrent-capture, tree of commit 0476825 (impl tree of that commit)
# 1: the CUDA tests of four files (pytest-1.log); the new draw test failed: IndexError in OwnGenerator._default
export PYTHONUNBUFFERED=1 TORCHDYNAMO_DISABLE=1; WHEELS=.whl make setup
PYTHONPATH=impl:. timeout 190 .venv/bin/python -m pytest -q -m gpu -rs tests/test_rng.py tests/test_stress.py \
  tests/test_flow_hift_cadence_sa2.py tests/test_gate.py
# 2: with 9c6b9c1's change (torch.cuda.init() in OwnGenerator._default; impl tree 2534c08) (pytest-2.log)
PYTHONPATH=impl:. timeout 100 .venv/bin/python -m pytest -q -m gpu -rs tests/test_rng.py tests/test_flow_hift_cadence_sa2.py
# 3: the same tree with OwnGenerator's device_wide() hold replaced by nullcontext (pytest-3-without-the-fix.log)
sed -i 's/with gate.GATE.device_wide():/with contextlib.nullcontext():/' impl/duplexcadence/adapters/flow_hift/stock.py
PYTHONPATH=impl:. timeout 60 .venv/bin/python -m pytest -q -m gpu tests/test_rng.py
