# traceprof: `make demo` (set up, run the main job on sample_traces/, write report.html)
#            `make test` (set up with test dependencies, run the tests)
PY     ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is capture-only; this exact pin takes the local CPU build (an unpinned torch pulls CUDA).
TORCH  := torch==2.13.0
DB     ?= demo.duckdb

.PHONY: demo test install install-test lint schema-doc bench clean fuzz

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
	$(BIN)/traceprof runs --db $(DB)
	$(BIN)/traceprof analyze overlap --db $(DB) --run normal
	$(BIN)/traceprof analyze temporal --db $(DB) --run normal
	$(BIN)/traceprof report --db $(DB) --run normal -o report.html

test: install-test
	$(BIN)/python -m pytest -q

# Long property-based fuzz run of ingest over every input kind (tests/test_fuzz.py, tests/fuzzing.py):
# FUZZ_EXAMPLES inputs per kind (the suite runs 20); outcome counts per kind go to fuzz-report.json,
# and the inputs that failed stay in fuzz-inputs/.
FUZZ_EXAMPLES ?= 400
fuzz: install-test
	FUZZ_RANDOM=1 FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_REPORT=fuzz-report.json FUZZ_DIR=fuzz-inputs \
		$(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_fuzz.py

lint: install-test
	$(BIN)/ruff check traceprof collectors analyses tests
	$(BIN)/mypy

schema-doc:
	$(BIN)/python -m traceprof.schema > docs/schema.md

bench: install-test
	$(BIN)/python benchmarks/bench.py

clean:
	rm -rf $(VENV) *.duckdb *.duckdb.results report.html .pytest_cache fuzz-report.json fuzz-inputs
