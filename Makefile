# featureline: the two commands of the README, and their parts.
#   make demo   run the demo pipeline end to end (arrives with the batch loader issue)
#   make test   venv + services + generated-file check + the whole test suite
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check venv up down status lint lock help bench-feast bench-views

help:
	@echo "make demo    the main job: services, compile, example data, batch load, summary"
	@echo "make test    create/reuse .venv, start services (features dev up), run every test (parallel, then the serial ones)"
	@echo "make check   the edit-run loop (~3 min): lint, mypy, compile --check, unit + property + fast integration tests"
	@echo "make up|down|status   the local services"
	@echo "make lint    ruff"
	@echo "make bench-feast   the Feast benchmark venv .cache/bench-feast-venv (bench/feast-requirements.txt)"
	@echo "make bench-views   bench/views.py: feature views against Feast (QUICK=1: a 1-minute smoke run)"

# Reinstall only when the lock or the project metadata changed.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(BIN)/features demo

up: venv
	$(BIN)/features dev up

down: venv
	$(BIN)/features dev down

status: venv
	$(BIN)/features dev status

lint: venv
	$(BIN)/ruff check features jobs tests bench fuzz
	$(BIN)/mypy features
	$(BIN)/lint-imports

# pytest exits 5 when no test ran; that is a failure here, as is any other non-zero code.
# Generated sql/ and expectations/ must match the schemas (features compile --check).
# Two phases: every test not marked `serial` on TEST_WORKERS pytest-xdist workers (most of the
# suite waits on services, JVM starts and polls, so workers overlap those waits), then the
# `serial` tests alone. The second phase runs even when the first failed; either failing fails.
TEST_WORKERS ?= 3
PYTEST_ALL := $(BIN)/pytest -p no:cacheprovider --durations=40
test: up
	$(BIN)/ruff check features jobs tests bench fuzz
	$(BIN)/mypy features
	$(BIN)/lint-imports
	$(BIN)/features compile --check
	rc=0; $(PYTEST_ALL) -n $(TEST_WORKERS) -m "not serial" || rc=$$?; \
	$(PYTEST_ALL) -m serial || rc=$$((rc ? rc : $$?)); exit $$rc

# The edit-run loop: the same checks as `make test` on the fast tests only (no test marked
# slow, no Flink job, no Redis Cluster run; about 3 minutes). `make test` stays the whole suite.
CHECK_TESTS := tests/unit tests/property tests/contract tests/integration/test_sdk.py \
	tests/integration/test_sdk_stampede.py tests/integration/test_redis_wire.py \
	tests/integration/test_ddl_applies.py tests/integration/test_health.py
check: up
	$(BIN)/ruff check features jobs tests bench fuzz
	$(BIN)/mypy features
	$(BIN)/lint-imports
	$(BIN)/features compile --check
	$(BIN)/pytest -p no:cacheprovider -q -m "not slow and not flink" -k "not redis-cluster" $(CHECK_TESTS)

# Refresh the lock after changing dependencies in pyproject.toml.
lock: venv
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^-e' > requirements.lock

# The Feast side of bench/views.py lives in its own venv, never in .venv (pinned in
# bench/feast-requirements.txt; `bench/feast_venv.sh --unpinned` moves the pin to the newest
# feast[redis]). Cached: a rerun checks a stamp only.
bench-feast:
	bench/feast_venv.sh

bench-views: bench-feast
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/views.py $(if $(QUICK),--quick,)
