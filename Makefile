# The few targets people use. `make demo` and `make test` set everything up on first use.
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

BENCH_VENV := bench/.venv

# Every install comes from the committed lock (uv.lock), made and read by one pinned uv, itself
# installed from PyPI into .uv/: a clean clone on any day gets what the last green run had.
UV_VERSION := 0.13.9
UV := .uv/bin/uv
# uv uses the machine's Python ($(PYTHON)), never one it downloads.
export UV_PYTHON_DOWNLOADS := never
# Bytecode is compiled at install and kept: the suite starts hundreds of Python processes (kill
# trials, examples, workers), and an SDK compiled from source again in each costs seconds.
export UV_COMPILE_BYTECODE := 1
unexport PYTHONDONTWRITEBYTECODE
EXTRAS := --all-extras

.PHONY: demo examples test test-fast test-latest test-oldest simulate check lint docs bench bench-quick lock clean

$(UV):
	$(PYTHON) -m venv .uv
	.uv/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(BIN)/.installed: pyproject.toml uv.lock $(UV)
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --quiet --locked --python $(PYTHON) $(EXTRAS) --group dev
	touch $@

lock: $(UV)                      ## the lock again, with the newest releases the ranges allow
	$(UV) lock --upgrade --python $(PYTHON)

demo: $(BIN)/.installed          ## the support agent: killed mid-effect, resumed, 0 duplicates
	$(BIN)/safepoint demo

# The suite runs on every core, file by file, but for the tests that restart the PostgreSQL
# server under everyone else: those run alone, after.
examples: $(BIN)/.installed      ## a support agent on each SDK, crashed and resumed: no key, no network
	$(BIN)/python examples/anthropic_support.py
	$(BIN)/python examples/openai_support.py
	$(BIN)/python examples/openai_agents_support.py
	$(BIN)/python examples/mcp_support.py
	$(BIN)/python examples/pydantic_ai_support.py
	$(BIN)/python examples/claude_agent_support.py

test: $(BIN)/.installed          ## the whole test suite (CI runs exactly this)
	$(BIN)/pytest -n auto --dist loadfile -m "not serial"
	$(BIN)/pytest -m serial

test-latest: $(UV)              ## the SDK tests, kill trials and examples on the newest releases (not the lock)
	UV=$(UV) $(PYTHON) tools/upstream.py

test-oldest: $(UV)              ## the same on the oldest releases our ranges allow
	UV=$(UV) $(PYTHON) tools/upstream.py --oldest

# The fast tier leaves out by marker what make test alone runs; it names its directories too, so
# that the kill, docs and browser tests are not even imported (seconds of collection per core).
test-fast: $(BIN)/.installed     ## before each commit (~1 min): unit, SQLite, the SDKs on the fake model server
	$(BIN)/pytest -n auto --dist loadfile -m "not kill and not slow and not browser and not serial and not postgres" \
		tests/unit tests/integration tests/ops tests/conformance tests/integrations tests/simulation

# The deterministic simulator (docs/guides/simulation.md): make test runs a fixed budget of it;
# this explores for as long as asked, on every core, and ends with
# "schedules=N requests=M violations=V seed=S". SIM_SEED=… replays one schedule exactly;
# SIM_POSTGRES=<server URL> runs the schedules on PostgreSQL (a database per process).
SIM_SECONDS ?= 60
simulate: $(BIN)/.installed      ## explore interleavings for SIM_SECONDS (60) on every core; SIM_SEED=… replays one
	SIM_SECONDS=$(SIM_SECONDS) SIM_SEED=$(SIM_SEED) SIM_TAPE=$(SIM_TAPE) SIM_POSTGRES=$(SIM_POSTGRES) \
		$(BIN)/python -m safepoint.testing.simulation

lint: $(BIN)/.installed          ## style, formatting and types
	$(BIN)/ruff check src tests bench examples tools
	$(BIN)/ruff format --check src tests bench examples tools
	$(BIN)/mypy

check: lint test

docs: $(BIN)/.installed          ## the documentation site, built into site/ (warnings are errors)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The benchmark's peers (DBOS, LangGraph) and tools live in an environment of their own,
# never in the library's dependencies.
$(BENCH_VENV)/.installed: pyproject.toml uv.lock $(UV)
	UV_PROJECT_ENVIRONMENT=$(BENCH_VENV) $(UV) sync --quiet --locked --python $(PYTHON) \
		--extra postgres --extra anthropic --extra openai --no-default-groups --group bench
	touch $@

bench: $(BENCH_VENV)/.installed  ## safepoint against DBOS and LangGraph (~20 min): docs/benchmarks.md
	$(BENCH_VENV)/bin/python -m bench.run --doc docs/benchmarks.md --chart docs/benchmarks.png

bench-quick: $(BENCH_VENV)/.installed  ## the same workloads, small and once: for development
	$(BENCH_VENV)/bin/python -m bench.run --quick

clean:
	rm -rf $(VENV) $(BENCH_VENV) .venv-newest .venv-oldest .uv site .pytest_cache .mypy_cache .ruff_cache
