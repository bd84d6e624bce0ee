# Two commands on a fresh machine: `make demo` and `make test`. Everything else is installed here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# checkov pins boto3==1.35.49, which conflicts with boto3/awscli in requirements-dev.txt: it gets its own venv,
# and tests/test_security_gates.py runs it as a program.
CHECKOV_VENV := .venv-checkov
# jsii prints a banner about the Node.js version on every start; the CDK CLI pin is what matters.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export PATH := $(CURDIR)/$(BIN):$(CURDIR)/node_modules/.bin:$(PATH)

.PHONY: run-deps deps test lint unit quick synth review demo bench clean docs

# pytest-xdist: the suite runs in PYTEST_WORKERS processes. Most tests wait on sockets, polls and subprocesses, so
# more workers than cores pay off (docs: test strategy, with the measurements). A module whose tests share a
# module-scoped fixture (a deployed emulated cloud, a synthesized app) runs whole on one worker (tests/parallel.py).
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --no-loadscope-reorder

# cdk.json runs `python3 -O app.py` (docs/benchmarks.md, "Synth speed"). pip writes only plain bytecode, and where
# PYTHONDONTWRITEBYTECODE is set every -O synth would compile aws-cdk-lib's modules again. One import of the app
# and every module of training_app, compliance and training_constructs under -O, bytecode writing on, writes the
# optimized bytecode of all they use (tests/test_app.py checks the venv for it).
SYNTH_IMPORTS := import app, importlib, pkgutil; [importlib.import_module(m.name) for p in ("training_app", "compliance", "training_constructs") for m in pkgutil.walk_packages(importlib.import_module(p).__path__, p + ".")]

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -O -c '$(SYNTH_IMPORTS)'
	touch $@

# `trainctl`, the package's console script (pyproject.toml), installed editable. Setuptools' compat mode puts the
# checkout on the venv's sys.path (a .pth file), so `.venv/bin/trainctl review` imports the CDK app from any folder.
# Offline: setuptools comes from requirements-dev.txt.
$(BIN)/trainctl: pyproject.toml $(BIN)/.installed
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
		--config-settings editable_mode=compat --editable .
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

# aws-cdk-lib's CloudFormation validation engine, copied out of its jsii bundle into the venv: app.py starts it in a
# process of its own (cfn_validate/__init__.py says why). Without it, app.py runs aws-cdk-lib's own copy.
$(VENV)/.cfn-validate: $(BIN)/.installed cfn_validate/__init__.py cfn_validate/__main__.py
	$(BIN)/python -m cfn_validate
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# What the app, the demo and the benchmarks need; make test also needs checkov's venv.
run-deps: $(BIN)/.installed $(BIN)/trainctl $(VENV)/.cfn-validate node_modules/.installed

# The two virtual environments install side by side: each is mostly pip's CPU work (unpacking, compiling bytecode),
# and the machine has 2 cores.
deps:
	$(MAKE) --no-print-directory -j3 $(BIN)/.installed $(CHECKOV_VENV)/.installed node_modules/.installed
	$(MAKE) --no-print-directory run-deps

lint: deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/actionlint
	# On-node code on its own: it imports spot_training as the node sees it (bootstrap_scripts on sys.path).
	cd bootstrap_scripts && ../$(BIN)/mypy --config-file ../pyproject.toml --cache-dir ../.mypy_cache/bootstrap node_agent.py spot_training

# The whole suite; the 25 slowest tests at the end, so that every CI log shows where the time goes.
unit: deps
	$(BIN)/pytest $(PYTEST_PARALLEL) --durations=25

# The edit loop: unit and template tests, without the emulated cloud, real nodes, training processes or whole
# toolchains run end to end (marker "slow", tests/parallel.py).
quick: run-deps
	$(BIN)/pytest $(PYTEST_PARALLEL) -m "not slow"

test: lint docs unit

synth: run-deps
	cdk synth --quiet

# The pull-request review (review_gates/pull_request.py, run by .github/workflows/review.yml): the BASE ref's
# synth beside the working tree's, the gates, and trainctl review's Markdown (OUT=FILE writes it there as well).
ifneq ($(filter review,$(MAKECMDGOALS)),)
ifeq ($(BASE),)
$(error make review needs BASE, the git ref to compare with: make review BASE=origin/main)
endif
endif
review: deps
	$(BIN)/python -m review_gates --base "$(BASE)" $(if $(OUT),--out "$(OUT)")

# The local emulated cloud: deploy TrainingStack, train the example through a spot interruption, summarize.
demo: run-deps
	$(BIN)/python -m emulator demo

# Ratios measured side by side (see benchmarks/bench.py); writes benchmarks/RESULTS.md. Not part of make test.
bench: run-deps
	$(BIN)/python -m benchmarks.bench

# --- docs (issue 44): the site from docs/ and mkdocs.yml. --strict fails on a broken link or a missing page; not
# --quiet, which hides the warnings --strict counts. docs_gen --check fails on a stale generated reference page.
docs: run-deps
	$(BIN)/python -m docs_gen --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
# --- end docs

clean:
	rm -rf site cdk.out .pytest_cache .mypy_cache .ruff_cache
