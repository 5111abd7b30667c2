"""CI must fail, not skip, when the corpus is missing (.ci/run sets TRACEPROF_REQUIRE_CORPUS)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def _pytest(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRACEPROF_REQUIRE_CORPUS"}
    env.update({"TRACEPROF_CORPUS": "/nonexistent/corpus", **env_extra})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/engine/test_verdict.py::test_production_traces"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_missing_corpus_skips_locally_and_fails_in_ci():
    # The three artifact-trace tests of test_verdict read the corpus: without it they skip (exit
    # 0, "3 skipped"); with TRACEPROF_REQUIRE_CORPUS=1 (what .ci/run exports) they fail (exit 1).
    local = _pytest({})
    assert local.returncode == 0 and "3 skipped" in local.stdout, local.stdout
    ci = _pytest({"TRACEPROF_REQUIRE_CORPUS": "1"})
    assert ci.returncode == 1 and "3 failed" in ci.stdout and "corpus required" in ci.stdout, ci.stdout
    assert "TRACEPROF_REQUIRE_CORPUS=1" in (REPO / ".ci" / "run").read_text()
