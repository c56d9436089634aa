# Two commands do all the set-up on a fresh machine with Python 3.11:
#   make quick   - create .venv and run the quick digits sweep (embedded MNIST subset, CPU)
#   make test    - create .venv and run the tests: all three tiers, in one run
#   make test-fast - the unit tier: no Ray, no sweep driver, no signals (markers, pyproject.toml)
#   make test-integration - sweeps and trials on one shared local Ray
#   make test-system - signals, SIGKILL, node loss, several nodes, trackers, servers
#   make test-ray-newest - the tests that lean on Ray most, under the newest Ray allowed
#   make gpu-check - on a machine with a CUDA GPU: CUDA tests, a paper-preset slice, a report
#   make .venv/.installed TORCH_CUDA=cu126 - torch's CUDA 12.6 build, for NVIDIA drivers 525-579
#     (unset: PyPI's CUDA 13.0 build, driver >= 580; the builds: tools/torch_builds.txt)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: quick test test-fast test-integration test-system test-ray-newest system-packages lint gpu-check clean-venv

# torch pinned: these wheels are on local disk here; a bare range would fetch GBs. uv installs
# what pip would (the highest version across pip's sources, tools/pip_sources.py) in 40% of
# pip's time (docs/MEASURED.md, "The test suite's time"); pip does it where uv cannot be had.
# Compiled as pip does: where PYTHONDONTWRITEBYTECODE is set (CI), every process would
# otherwise compile torch and Ray again at each import (the suite took 1.5x as long).
# torch's build: TORCH_CUDA unset installs PyPI's torch (its CUDA 13.0 build: NVIDIA driver >= 580);
# TORCH_CUDA=BUILD, one of tools/torch_builds.txt (cu126: driver >= 525; cpu), installs the pins
# +BUILD (torch 2.14.1+BUILD) from https://download.pytorch.org/whl/BUILD, the rest as before.
# Another value: one error line, exit status 2, nothing run. A venv keeps the build it got (a
# later make without TORCH_CUDA leaves it there); naming another build installs that one.
TORCH_CUDA ?=
ifneq ($(TORCH_CUDA),)
TORCH_CUDA_ERROR := $(shell sh tools/torch_build.sh '$(TORCH_CUDA)' 2>&1)
$(if $(TORCH_CUDA_ERROR),$(error $(TORCH_CUDA_ERROR)))
endif
# A venv still to be made: PYTHON must be 3.10+ (one error line, nothing run, else).
ifeq ($(wildcard $(VENV)/.installed),)
PYTHON_ERROR := $(shell sh tools/python_check.sh '$(PYTHON)' 2>&1)
$(if $(PYTHON_ERROR),$(error $(PYTHON_ERROR)))
endif
TORCH_BUILD := $(if $(TORCH_CUDA),+$(TORCH_CUDA))
TORCH_INDEX := $(if $(TORCH_CUDA),--extra-index-url https://download.pytorch.org/whl/$(TORCH_CUDA) )
TORCH_MARK := $(if $(TORCH_CUDA),$(VENV)/.torch-$(TORCH_CUDA))
REQUIREMENTS := $(TORCH_INDEX)torch==2.14.1$(TORCH_BUILD) torchvision==0.29.1$(TORCH_BUILD) -e '.[dev,mlflow,wandb]'
# pyproject allows Ray 2.58-2.60 (the tests pass on both ends); .venv gets the release the
# cluster images carry (cluster.yaml, Dockerfile), .venv-ray-newest the newest.
RAY_TESTED := 2.58.1
RAY_NEWEST := 2.60.*
# ray[default] (the job server of the job test's head) beside the environment, not in it: in it,
# every Ray the tests start would run the full dashboard agent (tools/ray_default_extras.py).
UV_VERSION := 0.13.9

$(VENV)/.installed: pyproject.toml tools/ray_default_extras.py $(TORCH_MARK)
	$(if $(TORCH_MARK),rm -f $(VENV)/.torch-*)
	$(PYTHON) -m venv $(VENV)
	if $(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION); then \
	  $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) \
	    --index-strategy unsafe-best-match \
	    $$($(PY) tools/pip_sources.py) $(REQUIREMENTS) 'ray[tune]==$(RAY_TESTED)'; \
	else \
	  echo "uv not installable: installing with pip"; \
	  $(PY) -m pip install --quiet --upgrade pip && \
	  $(PY) -m pip install --quiet $(REQUIREMENTS) 'ray[tune]==$(RAY_TESTED)'; \
	fi
	$(PY) tools/ray_default_extras.py $(VENV)/ray-default
	$(if $(TORCH_MARK),touch $(TORCH_MARK))
	touch $@

# The venv's mark of the TORCH_CUDA build it has: missing (none was named, or another),
# the install runs again.
ifneq ($(TORCH_MARK),)
$(TORCH_MARK): ;
endif

quick: $(VENV)/.installed
	$(PY) sweeps/digits_grid.py --preset quick $(ARGS)

# Two test processes, whole files each: a Ray test leaves a core idle much of its time and the
# one-core tests fill it (docs/MEASURED.md, "The test suite's time"). The slowest 25 are listed:
# CI's budget is 15 minutes.
test: $(VENV)/.installed system-packages
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 $(ARGS)
	$(MAKE) --no-print-directory test-ray-newest

# The newest Ray pyproject allows, everything else as .venv. Its tests: the trial's record and
# session under Tune, resume, --done, warm starts, the lambda search's resume, the stop, Ray's
# internals (sweeps/ray_private.py); the rest of the Ray tier runs in .venv only (CI's time).
NEWEST_VENV := .venv-ray-newest
NEWEST_TESTS := tests/test_ray_adapter.py tests/test_records.py tests/test_session_tune.py \
  tests/test_finished_trials.py tests/test_warm_start.py tests/test_lambda_search.py
$(NEWEST_VENV)/.installed: pyproject.toml $(VENV)/.installed
	$(PYTHON) -m venv $(NEWEST_VENV)
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(NEWEST_VENV)/bin/python \
	  --index-strategy unsafe-best-match $$($(PY) tools/pip_sources.py) $(REQUIREMENTS) \
	  'ray[tune]==$(RAY_NEWEST)'
	touch $@

test-ray-newest: $(NEWEST_VENV)/.installed system-packages
	$(NEWEST_VENV)/bin/python -c "import ray; print('tests under Ray', ray.__version__)"
	$(NEWEST_VENV)/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder \
	  -m "not system" $(NEWEST_TESTS) $(ARGS)

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 -m "not ray and not system" $(ARGS)

test-integration: $(VENV)/.installed system-packages
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "ray and not system" $(ARGS)

test-system: $(VENV)/.installed system-packages
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m system $(ARGS)

# rsync, Slurm and munge, which the system tests run: installed where root and apt-get are,
# else one line naming them and the command (tools/system_packages.sh).
system-packages:
	@tools/system_packages.sh

# ~5 minutes on one GPU; writes bench/results/gpu/<device>.md. ARGS="--root DIR" for MNIST.
gpu-check: $(VENV)/.installed
	$(PY) bench/gpu_check.py $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean-venv:
	rm -rf $(VENV)
