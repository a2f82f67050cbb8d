# dw_dagster: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCALE ?= 0.01

.PHONY: install browser-deps demo demo-orders demo-migration test bench validate clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# the library with its test extra and the examples distribution (demos, fake servers, their dbt project), both editable
$(VENV)/.installed: $(BIN)/activate pyproject.toml examples/pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]' -e ./examples
	touch $@

install: $(VENV)/.installed

## Run the grocery store-sales incident end to end (detect → receipt) on embedded DuckDB.
demo: install
	$(BIN)/dw-dagster demo store-sales --scale $(SCALE)

## The orders-stream incident (dead-letter rows, a migration with rollback, a guarded replay).
demo-orders: install
	$(BIN)/dw-dagster demo orders

## A migration in two waves (parity per table pair, a repair, the owner's sign-off, a reopening); SOURCE=postgres for the loopback server.
SOURCE ?= duckdb
demo-migration: install
	$(BIN)/dw-dagster demo migration --source $(SOURCE)

## Debian's Chromium and ChromeDriver for the browser test (e2e/browser.py), only when missing; needs root or sudo.
browser-deps:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "installing Debian's chromium and chromium-driver (apt-get) ..."; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; \
	fi

## Install what the tests need and run them: two pytest-xdist workers, each test file on one worker
## (a file's tests share their servers and fixtures), handed out slowest first in conftest.py's order
## (--no-loadscope-reorder: xdist would sort them by their number of tests); PYTEST_WORKERS=0 runs them in one process.
PYTEST_WORKERS ?= 2
test: install browser-deps
	$(BIN)/python -m pytest dw_dagster_tests -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

## Benchmarks against peers measured in the same run; writes bench_results.json (BENCH_ARGS="--scale 10" for 100M rows).
## rowdiff_crossdb_100m (memory curve up to 100M rows per side) runs only by hand:
## make bench BENCH_ARGS="--scale 10 --repeat 1 --only rowdiff_crossdb_100m" (or --big to add it to the whole run).
bench: install
	$(BIN)/python -m pip install --quiet 'reladiff[duckdb,postgresql]'
	$(BIN)/python -m dw_dagster_tests.benchmarks.run $(BENCH_ARGS)

## Load the example code location the way `dagster dev` does.
validate: install
	$(BIN)/dagster definitions validate -w workspace.yaml

clean:
	rm -rf $(VENV) .dw_demo examples/dw_dagster_examples/dbt_project/target examples/dw_dagster_examples/dbt_project/logs
