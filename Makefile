# dw_dagster: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCALE ?= 0.01

.PHONY: install demo test bench validate clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

## Run the grocery store-sales incident end to end (detect → receipt) on embedded DuckDB.
demo: install
	$(BIN)/dw-dagster demo store-sales --scale $(SCALE)

## Install what the tests need and run them.
test: install
	$(BIN)/python -m pytest dw_dagster_tests -q -p no:cacheprovider

## Benchmarks against peers measured in the same run; writes bench_results.json (BENCH_ARGS="--scale 10" for 100M rows).
bench: install
	$(BIN)/python -m pip install --quiet 'reladiff[duckdb]'
	$(BIN)/python -m dw_dagster_tests.benchmarks.run $(BENCH_ARGS)

## Load the example code location the way `dagster dev` does.
validate: install
	$(BIN)/dagster definitions validate -w workspace.yaml

clean:
	rm -rf $(VENV) .dw_demo dbt_project/target dbt_project/logs
