# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test screenshots lint typecheck check bench bench-peers bench-memory bench-pipeline bench-sweep bench-observability bench-console bench-media bench-starts bench-coalescing bench-children bench-watcher bench-retention bench-tracing bench-search

# The runtime lock (all the image installs) and what development and CI add; the dev lock
# includes the runtime one (`-r requirements.lock`), so one install takes both.
$(STAMP): requirements.lock requirements-dev.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.lock
	touch $(STAMP)

install: $(STAMP)

# The Procfile's commands find python, celery and uvicorn on PATH: the virtualenv's first.
# Flower's credentials: the demo user's unless FLOWER_BASIC_AUTH is set; a demo SECRET_KEY likewise
# (the role scripts refuse to start without one), and the demo trigger's signing secret. The demo's Redis is this machine's own,
# which keeps nothing on disk: the roles are told that is on purpose here.
run: export FLOWER_BASIC_AUTH ?= demo:lumastra-demo
run: export LUMASTRA_ALLOW_VOLATILE_VALKEY ?= true
run: export LUMASTRA_METRICS_TOKEN ?= lumastra-demo-metrics
run: export LUMASTRA_SECRET_KEY ?= lumastra-demo-secret-key-not-for-production
run: export LUMASTRA_TRIGGER_SECRET_DOWNLOAD_FINISHED ?= lumastra-demo-trigger-secret
run: install
	deploy/system-deps.sh run
	$(BIN)/python -m lumastra.preflight
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0
	$(BIN)/python manage.py sync_schedules
	$(BIN)/python manage.py bootstrap_demo
	$(BIN)/python manage.py load_demo_catalog --items 400 --files --if-empty
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho -d . -f deploy/Procfile start

# `make run` and `make test` first install the Debian packages they need when they can
# (deploy/system-deps.sh), or stop naming each missing one and its install command; a test
# category the machine still cannot run fails, unless LUMASTRA_TEST_SKIP opts out of it.
# The fault battery runs beside the rest of the suite, on stores of its own (its own test
# database and Redis DBs; each scenario starts its own Valkey): both mostly wait on worker
# subprocesses, so side by side they take about as long as the longer of the two. Its output
# follows the rest's; the target fails if either fails.
FAULTS_STORES := DATABASE_URL=postgres://postgres@127.0.0.1:5432/lumastra_faults \
	VALKEY_URL=redis://127.0.0.1:6379/5 VALKEY_CACHE_URL=redis://127.0.0.1:6379/6 \
	CELERY_BROKER_URL=redis://127.0.0.1:6379/7

test: export LUMASTRA_ALLOW_VOLATILE_VALKEY ?= true
test: install
	deploy/system-deps.sh test
	$(BIN)/python -m lumastra.preflight --check-only
	@mkdir -p .pytest_cache
	# The pages' static files, collected once before the two sessions start side by side.
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0
	@$(FAULTS_STORES) $(BIN)/python -m pytest tests/faults > .pytest_cache/faults-run.log 2>&1 & \
	battery=$$!; \
	$(BIN)/python -m pytest --ignore=tests/faults; rest=$$?; \
	wait $$battery; faults=$$?; \
	echo "--- the fault battery (tests/faults, run beside the rest) ---"; \
	cat .pytest_cache/faults-run.log; \
	test $$rest -eq 0 && test $$faults -eq 0

# The README's pictures of the console (docs/screenshots/), taken by the browser tests: only
# here, so `make test` never rewrites the tracked PNGs.
screenshots: install
	LUMASTRA_SCREENSHOTS=1 $(BIN)/python -m pytest tests/browser -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy lumastra tasks orchestrator coverage

check: lint typecheck test

# The benchmarks' peers (bench/peers.py), never installed by `make install`: django-celery-results
# into the project's virtualenv; Procrastinate into one of its own inside it, .venv/peers, because
# with psycopg 3 importable Django would leave psycopg2 for it, project and tests included.
PEERS := $(VENV)/peers
PEERS_STAMP := $(VENV)/.peers-installed

$(PEERS_STAMP): $(STAMP) bench/requirements-peers.lock bench/requirements-peers-procrastinate.lock
	$(BIN)/python -m pip install --quiet -r bench/requirements-peers.lock
	test -x $(PEERS)/bin/python || $(BIN)/python -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet -r bench/requirements-peers-procrastinate.lock
	touch $(PEERS_STAMP)

bench: $(PEERS_STAMP)
	$(BIN)/python bench/throughput.py --json
	$(BIN)/python bench/peers.py --json

bench-peers: $(PEERS_STAMP)
	$(BIN)/python bench/peers.py

bench-memory: install
	$(BIN)/python bench/memory.py

bench-pipeline: install
	$(BIN)/python bench/pipeline.py

bench-sweep: install
	$(BIN)/python bench/sweep.py

bench-console: install
	$(BIN)/python bench/console.py

bench-observability: install
	$(BIN)/python bench/observability.py

bench-media: install
	$(BIN)/python bench/media.py

bench-starts: install
	$(BIN)/python bench/starts.py

bench-coalescing: install
	$(BIN)/python bench/coalescing.py

bench-children: install
	$(BIN)/python bench/children.py

bench-watcher: install
	$(BIN)/python bench/watcher.py

bench-retention: install
	$(BIN)/python bench/retention.py

bench-tracing: install
	$(BIN)/python bench/tracing.py

bench-search: install
	$(BIN)/python bench/search.py
