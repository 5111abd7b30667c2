"""CI must fail, not skip, when the corpus is missing (.ci/run sets TRACEPROF_REQUIRE_CORPUS)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def _pytest(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRACEPROF_REQUIRE_CORPUS"}
    env.update({"TRACEPROF_CORPUS": "/nonexistent/corpus", **env_extra})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/engine/test_verdict.py::test_production_traces",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_missing_corpus_skips_locally_and_fails_in_ci():
    # The three artifact-trace tests of test_verdict read the corpus: without it they skip (exit
    # 0, "3 skipped"); with TRACEPROF_REQUIRE_CORPUS=1 (what .ci/run exports) they fail (exit 1).
    local = _pytest({})
    assert local.returncode == 0 and "3 skipped" in local.stdout, local.stdout
    ci = _pytest({"TRACEPROF_REQUIRE_CORPUS": "1"})
    assert ci.returncode == 1 and "3 failed" in ci.stdout and "corpus required" in ci.stdout, ci.stdout
    assert "TRACEPROF_REQUIRE_CORPUS=1" in (REPO / ".ci" / "run").read_text()


def test_ci_fails_on_lint_format_types_imports_and_the_wheel_before_the_tests():
    # .ci/run (set -e) runs make lint, make smoke, make test in that order; make lint runs the four
    # checks, each a command that exits non-zero on an error (so make, then CI, stops).
    run = (REPO / ".ci" / "run").read_text()
    assert "set -euo pipefail" in run
    steps = [ln.strip() for ln in run.splitlines() if ln.strip().startswith("make ")]
    assert steps == ["make lint", "make smoke", "make test"]
    make = (REPO / "Makefile").read_text()
    lint = make.split("\nlint:")[1].split("\n\n")[0]
    assert [ln.split()[0] for ln in lint.strip().splitlines()[1:]] == [
        "$(BIN)/ruff",
        "$(BIN)/ruff",
        "$(BIN)/mypy",
        "$(BIN)/lint-imports",
    ]
    assert "ruff check $(SRC)" in lint and "ruff format --check $(SRC)" in lint
    src = make.split("\nSRC := ")[1].split("\n")[0].split()
    assert set(src) >= {"traceprof", "collectors", "analyses", "tests", "benchmarks", "scripts"}
    assert "scripts/wheel_smoke.py" in make.split("\nsmoke:")[1].split("\n\n")[0]
