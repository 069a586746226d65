# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint typecheck check bench bench-memory bench-pipeline

$(STAMP): requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	touch $(STAMP)

install: $(STAMP)

# The Procfile's commands find python, celery and uvicorn on PATH: the virtualenv's first.
# Flower's credentials: the demo user's unless FLOWER_BASIC_AUTH is set.
run: export FLOWER_BASIC_AUTH ?= demo:lumastra-demo
run: install
	$(BIN)/python -m lumastra.preflight
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0
	$(BIN)/python manage.py sync_schedules
	$(BIN)/python manage.py bootstrap_demo
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho -d . -f deploy/Procfile start

test: install
	$(BIN)/python -m lumastra.preflight --check-only
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy lumastra tasks orchestrator coverage

check: lint typecheck test

bench: install
	$(BIN)/python bench/throughput.py --json

bench-memory: install
	$(BIN)/python bench/memory.py

bench-pipeline: install
	$(BIN)/python bench/pipeline.py
