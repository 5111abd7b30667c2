"""Shared fixtures: the corpus location, a fresh store, and a helper to run analyses."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import pytest

from traceprof.engine import analysis as registry
from traceprof.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
CORPUS = Path(os.environ.get("TRACEPROF_CORPUS", REPO.parent / "shared" / "corpus"))
CASES = Path(os.environ.get("TRACEPROF_CASES", REPO.parent / "shared" / "cases"))


def _shared(p: Path, what: str) -> Path:
    """``p`` when it exists; else skip the test, or fail it when ``TRACEPROF_REQUIRE_CORPUS`` is set
    (CI: ``.ci/run`` sets it, so a missing ../shared is red, not dozens of silent skips)."""
    if not p.exists():
        if os.environ.get("TRACEPROF_REQUIRE_CORPUS"):
            pytest.fail(f"{what} required (TRACEPROF_REQUIRE_CORPUS is set) but not available: {p}")
        pytest.skip(f"{what} not available: {p}")
    return p


def corpus(rel: str) -> Path:
    """Path of a file or folder of ../shared/corpus (real public traces); see :func:`_shared`."""
    return _shared(CORPUS / rel, "corpus")


def case(name: str) -> Path:
    """Folder of a ../shared/cases input (small traces with exact expected values in EXPECT.md)."""
    return _shared(CASES / name, "case")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "t.duckdb")
    yield s
    s.close()


def sample_run(store: Store, name: str) -> int:
    """Ingest ``sample_traces/NAME`` into ``store`` and return its run id (skip when not recorded)."""
    from traceprof.ingest.ingest import ingest

    path = SAMPLES / name
    if not list(path.glob("rank*.trace.json.gz")):
        pytest.skip(f"{path} not recorded yet")
    ingest(store, [path])
    return store.resolve_run(name)


def analyze(store: Store, name: str, run: str | None = None, **params: object):
    """Run analysis ``name`` with keyword parameters and return its result."""
    an = registry.get(name)
    return an.run(store, an.params(run=run, **params))


#: Corpus runs that the HTA comparisons (idle, kernels) read, and HTA's own load of one.
HTA_CASES = [
    "hta/trace_filter",
    "hta/nccl_parser_config",
    "hta/negative_queue_length_values_check",
    "hta/trace_diff/test",
    "hta/amd_trace",
    "hta/ns_resolution_trace",  # 3 decimals at epoch us: HTA's float64 times (``traceprof.engine.htatime``)
]


@functools.cache
def _load_hta(folder: str):
    from hta.common.trace import Trace

    logging.disable(logging.WARNING)
    try:
        t = Trace(trace_dir=folder)
        t.load_traces(include_last_profiler_step=False, use_multiprocessing=False)
    finally:
        logging.disable(logging.NOTSET)
    return t


def hta_case(store, rel: str):
    """Ingest corpus folder ``rel`` as run "r" and return HTA's Trace of it (loaded once per session)."""
    pytest.importorskip("hta", reason="holistictraceanalysis not installed")
    folder = corpus(rel)
    from traceprof.ingest.ingest import ingest

    ingest(store, [folder], run="r")
    return _load_hta(str(folder))
