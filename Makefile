# traceprof: `make demo` (set up, ingest sample_traces/, the findings of a straggler run, the CI gate
#                        on an added matmul, write report.html)
#            `make test` (set up with test dependencies, run the whole suite: about 35 min on 2 cores)
#            `make check` (the inner loop, under 3 min on 2 cores: lint and the quick tests of CHECK_TESTS)
#            `make lint` (ruff check, ruff format --check, mypy, the import contract: what CI fails on)
#            `make smoke` (build the wheel, install it in a fresh venv, run it from another folder)
#            `make docs` (regenerate docs/schema.md, docs/analyses.md and the README's tables)
PY     ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is capture-only; this exact pin takes the local CPU build (an unpinned torch pulls CUDA).
TORCH  := torch==2.13.0
DB     ?= demo.duckdb

.PHONY: demo test check install install-test lint smoke schema-doc docs bench clean fuzz

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]' $(TORCH)

demo: install
	rm -f $(DB)
	$(BIN)/traceprof ingest sample_traces --db $(DB)
	@echo; echo "== What is wrong with run straggler_rank2? (README: What the findings mean) =="
	$(BIN)/traceprof summary --db $(DB) --run straggler_rank2
	@echo; echo "== The CI gate: extra_matmul against normal (exit 3 = regression; make goes on) =="
	@echo "$(BIN)/traceprof diff normal extra_matmul --db $(DB) --table metrics"
	@$(BIN)/traceprof diff normal extra_matmul --db $(DB) --table metrics; code=$$?; \
	  echo "diff exited $$code: 3 means a regression was found (extra_matmul adds a matmul per block, +17.8% FLOPs), which fails a CI job; 0 ok, 4 inconclusive"
	$(BIN)/traceprof report --db $(DB) --run straggler_rank2 -o report.html
	@echo; echo "report of straggler_rank2: $(abspath report.html) (open it in any browser, offline)"

test: install-test
	$(BIN)/python -m pytest -q

# The quick tests for the inner loop (unit and CLI-surface tests; `make test` runs the rest).
CHECK_TESTS ?= tests/core tests/cli/test_docs.py tests/engine/test_options.py tests/engine/test_specs.py \
	tests/engine/test_intervals.py tests/render/test_markdown.py tests/ingest/test_run_names.py \
	tests/storage/test_runs.py tests/cli/test_quickstart.py
check: lint
	$(BIN)/python -m pytest -q -x -p no:cacheprovider -m "not slow" $(CHECK_TESTS)

# Long property-based fuzz run of ingest over every input kind (tests/ingest/test_fuzz.py, tests/fuzzing.py):
# FUZZ_EXAMPLES inputs per kind (the suite runs 20); outcome counts per kind go to fuzz-report.json,
# and the inputs that failed stay in fuzz-inputs/.
FUZZ_EXAMPLES ?= 400
fuzz: install-test
	FUZZ_RANDOM=1 FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_REPORT=fuzz-report.json FUZZ_DIR=fuzz-inputs \
		$(BIN)/python -m pytest -q -s -p no:cacheprovider tests/ingest/test_fuzz.py

# Every Python folder of the repository; mypy's files (pyproject) are the traceprof package, which
# holds analyses/ and collectors/ as traceprof.analyses and traceprof.collectors.
SRC := traceprof collectors analyses tests benchmarks scripts

lint: install-test
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)
	$(BIN)/mypy
	$(BIN)/lint-imports

# What a user who pip-installs traceprof gets (scripts/wheel_smoke.py): the wheel holds the traceprof
# package only, and its CLI ingests and summarises a sample from another folder.
smoke: install-test
	$(BIN)/python scripts/wheel_smoke.py

schema-doc:
	$(BIN)/python -m traceprof.core.schema > docs/schema.md

# Generated references (each checked by a test): the store's schema, the analyses' specs, and the
# README's command and kernel-family tables (traceprof/docs.py).
docs: schema-doc
	$(BIN)/python -m traceprof.render.analysis_docs > docs/analyses.md
	$(BIN)/python -m traceprof.docs README.md

bench: install-test
	$(BIN)/python benchmarks/bench.py

clean:
	rm -rf $(VENV) *.duckdb *.duckdb.results report.html .pytest_cache .mypy_cache .ruff_cache fuzz-report.json fuzz-inputs build *.egg-info
