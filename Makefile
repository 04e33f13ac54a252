VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: setup test-deps test test-fast demo lint bench

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# What the tests need outside Python: Debian's chromium (the dashboard's browser tests; Playwright's
# own download does not work here) and g++ (the CPU's MoE kernel). PostgreSQL is started by
# `test` itself (.ci/postgres.sh); as another user than root its cases are skipped.
test-deps:
	@command -v chromium >/dev/null && command -v g++ >/dev/null \
		|| { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium g++ >/dev/null; } \
		|| echo "make test-deps: install chromium and g++ (as root) for the browser and kernel tests"

test: setup test-deps
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	MOESCOPE_TEST_PG_URL="$${MOESCOPE_TEST_PG_URL:-$$(bash .ci/postgres.sh)}" \
		$(PY) -m pytest -q -ra --durations=15

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

demo: setup
	$(VENV)/bin/moescope demo

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench: setup
	$(PY) -m benchmarks.speed.offline_throughput
