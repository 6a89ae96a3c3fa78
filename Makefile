# The few targets people use. `make demo` and `make test` set everything up on first use.
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: demo test check lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[postgres]' --group dev
	touch $@

demo: $(BIN)/.installed          ## the support agent: killed mid-effect, resumed, 0 duplicates
	$(BIN)/safepoint demo

test: $(BIN)/.installed          ## the whole test suite (CI runs exactly this)
	$(BIN)/pytest

lint: $(BIN)/.installed          ## style and types
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

check: lint test

bench: $(BIN)/.installed         ## per-step cost on SQLite, with the commit floor beside it
	$(BIN)/python bench/steps.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
