"""Shared fixtures: the corpus location, a fresh store, and a helper to run analyses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from traceprof import analysis as registry
from traceprof.store import Store

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
CORPUS = Path(os.environ.get("TRACEPROF_CORPUS", REPO.parent / "shared" / "corpus"))


def corpus(rel: str) -> Path:
    """Path of a corpus file or folder; skips the test when ../shared/corpus is absent, or fails it
    when ``TRACEPROF_REQUIRE_CORPUS`` is set (CI: ``.ci/run`` sets it, so a missing corpus is red,
    not 38 silent skips)."""
    p = CORPUS / rel
    if not p.exists():
        if os.environ.get("TRACEPROF_REQUIRE_CORPUS"):
            pytest.fail(f"corpus required (TRACEPROF_REQUIRE_CORPUS is set) but not available: {p}")
        pytest.skip(f"corpus not available: {p}")
    return p


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "t.duckdb")
    yield s
    s.close()


def analyze(store: Store, name: str, run: str | None = None, **params: object):
    """Run analysis ``name`` with keyword parameters and return its result."""
    an = registry.get(name)
    return an.run(store, an.params(run=run, **params))
