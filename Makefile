# DuplexCadence. Every target does its own set-up (the virtual environment in .venv).
# `make reproduce`  the main job, staged and resumable (suite/stages/; per workload verify, memory_stock,
#                   memory_cadence, duplex_stock, duplex_cadence): writes results/<date>-<device>-reproduce/
#                   stages.json, one folder per stage and one merged REPORT.md (CPU default: minicpmo45 verify, 4 units).
#                   RAY=1 installs the ray extra: make reproduce RAY=1 ARGS="--ray local" (or --ray auto / ADDRESS)
# `make report`     rebuilds REPORT.md of the named results folders from their JSON: make report ARGS=results/<run>
#                   (one folder or more; with none it exits 2 and rewrites nothing); a second run of a tree
#                   against the first: make report ARGS="results/<run>-second --compare results/<run>";
#                   the published reference: make report ARGS="results/<run> --publish" (results/REPORT.md, CLAIMS.json)
# `make test`       the test suite (CPU; GPU-only tests skip with the reason); installs the ray extra for the Ray tests
# `make test-gpu`   every CUDA test (tests marked gpu: those that skip without CUDA), on a CUDA machine; the log
#                   in $(GPU_LOG) (default results/_scratch/test-gpu.log); fails if no CUDA device is visible
# `make bench`      pytest-benchmark microbenchmarks of the runtime's parts
# `make asv`        asv benchmarks against the current environment, kept under results/asv (history accumulates);
#                   ASV_MACHINE=h200 names the machine (default: asv's, from the hostname, which a lent GPU host
#                   changes on every loan). ASV_PYTHONPATH: the benchmarks import this checkout, not the tree a
#                   shared venv's editable install points at (asv drops PYTHONPATH, passes ASV_PYTHONPATH)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Offline wheels (e.g. carried to a GPU machine without network): WHEELS=.whl make ...
WHEELS ?=
#: asv names an `existing` environment after its python's path; a wrapper at this fixed path runs the
#: checkout's venv python, so every clone and every lent machine's copy adds to one history line per machine.
ASV_PYTHON ?= /tmp/duplexcadence-asv/python
PIP_OFFLINE := $(if $(WHEELS),--no-index --find-links $(WHEELS),)
# Options for reproduce: make reproduce ARGS="--device cuda --stages 'minicpmo45.*' --run-dir DIR --resume --budget-s 570"
# (exit status 3: budget spent with stages pending; run the same command again; a duplex stage needs --budget-s >= 560)
ARGS ?=
# RAY=1: install the ray extra before reproduce (the stages as Ray tasks: ARGS="--ray local|auto|ADDRESS")
RAY ?=
# stepaudio2 wraps its encoder chunk in torch.compile(backend="eager"): tracing and recompiling for every
# new shape is host overhead only (the same aten kernels run), minutes per session on a CPU. Off by default
# for both modes alike, recorded in every result; `make reproduce TORCHDYNAMO_DISABLE=0` keeps it.
export TORCHDYNAMO_DISABLE ?= 1

GPU_LOG ?= results/_scratch/test-gpu.log

.PHONY: setup ray reproduce report test test-gpu bench asv clean
setup: $(VENV)/.stamp
ray: $(VENV)/.ray-stamp

# torch: reuse a CUDA-enabled torch already on the machine (GPU hosts), else the pinned CPU wheel. Where that
# torch lives in a virtual environment itself (the lent H200: /opt/torch/.venv), --system-site-packages sees only
# the base interpreter's packages, so _host_site.pth adds the host environment's site-packages after our own.
# The stock packages are installed without their conflicting pins (stock-packages.txt says why).
$(VENV)/.stamp: pyproject.toml stock-packages.txt
	@if $(PYTHON) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  echo "setup: using the machine's CUDA torch ($$($(PYTHON) -c 'import torch;print(torch.__version__)'))"; \
	  $(PYTHON) -m venv --system-site-packages $(VENV); \
	  $(PYTHON) -c 'import site; print("\n".join(site.getsitepackages()))' \
	    > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_host_site.pth"; \
	else \
	  $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q $(PIP_OFFLINE) torch==2.13.0; \
	fi
	$(PY) -m pip install -q $(PIP_OFFLINE) --no-deps -r stock-packages.txt
	$(PY) -m pip install -q $(PIP_OFFLINE) $(if $(WHEELS),--no-build-isolation,) -e .
	@touch $@

# the optional ray extra (pyproject.toml); offline: WHEELS=dir holding the ray wheel (tools/repack_ray_wheel.py
# makes one without its Java jars) and its dependencies
$(VENV)/.ray-stamp: $(VENV)/.stamp pyproject.toml
	$(PY) -m pip install -q $(PIP_OFFLINE) $(if $(WHEELS),--no-build-isolation,) -e ".[ray]"
	@touch $@

reproduce: setup $(if $(RAY),ray,)
	$(PY) -m suite.reproduce $(ARGS)

report: setup
	$(PY) -m suite.report $(ARGS)

test: setup ray
	$(PY) -m pytest -q --durations=25 tests

test-gpu: setup
	@$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'test-gpu: no CUDA device visible')"
	mkdir -p $(dir $(GPU_LOG))
	set -o pipefail; $(PY) -m pytest -q -m gpu -rs tests 2>&1 | tee $(GPU_LOG)

bench: setup
	$(PY) -m pytest -q --benchmark-enable --benchmark-only suite/bench

asv: setup
	$(PY) -m pip install -q $(PIP_OFFLINE) "asv>=0.6"
	$(VENV)/bin/asv machine --yes $(if $(ASV_MACHINE),--machine $(ASV_MACHINE),)
	mkdir -p $(dir $(ASV_PYTHON)) && printf '#!/bin/sh\nexec "%s" "$$@"\n' "$(abspath $(PY))" > $(ASV_PYTHON).$$$$ \
		&& chmod +x $(ASV_PYTHON).$$$$ && mv $(ASV_PYTHON).$$$$ $(ASV_PYTHON)
	ASV_PYTHONPATH=$(CURDIR)/impl:$(CURDIR) $(VENV)/bin/asv run --environment existing:$(ASV_PYTHON) --set-commit-hash $${DUPLEXCADENCE_GIT_REV:-$$(git rev-parse HEAD)} $(if $(ASV_MACHINE),--machine $(ASV_MACHINE),) $(ARGS)
	$(VENV)/bin/asv publish

clean:
	rm -rf $(VENV) .asv
