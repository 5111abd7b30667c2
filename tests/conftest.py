"""Shared fixtures: the corpus location, a fresh store, and a helper to run analyses."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Iterable, Iterator
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


#: The folders that ``traceprof/`` links in as ``traceprof.analyses`` / ``traceprof.collectors``. With
#: the repository on ``sys.path`` they import under these top-level names too, as a second copy of
#: every module (each analysis' Result registered twice: CI's result-cache tests failed after one
#: such import). Tests import ``traceprof.analyses`` / ``traceprof.collectors``; ruff's TID251
#: (pyproject.toml) refuses the import statements, :func:`second_copies` any other import.
SECOND_COPIES = ("analyses", "collectors")


def second_copies(modules: Iterable[str]) -> list[str]:
    """The names in ``modules`` (e.g. ``sys.modules``) that are :data:`SECOND_COPIES` or inside one
    (``analyses``, ``collectors.nsys.ranks``), sorted."""
    return sorted(m for m in modules if m.split(".", 1)[0] in SECOND_COPIES)


def _refuse_second_copies(where: str) -> str | None:
    """What ``where`` did wrong when a second copy is in ``sys.modules`` (its modules are dropped, so
    that the tests after it do not fail for it too), else None. A submodule's import imports its
    package first, so two lookups tell (a test costs no walk over ``sys.modules``)."""
    if not any(name in sys.modules for name in SECOND_COPIES):
        return None
    bad = second_copies(sys.modules)
    for m in bad:
        del sys.modules[m]
    return (
        f"{where} imported {', '.join(bad)}: a second copy of traceprof.{bad[0].split('.', 1)[0]} (each "
        "module loaded twice: an analysis registers twice); import traceprof.analyses / traceprof.collectors instead"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A test module that imports a second copy when collected is a collection error, named."""
    if report.passed and (why := _refuse_second_copies(report.nodeid)):
        report.outcome = "failed"
        report.longrepr = why


@pytest.fixture(autouse=True)
def _no_second_copies(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that imports a second copy while it runs fails, named."""
    yield
    if why := _refuse_second_copies(request.node.nodeid):
        pytest.fail(why, pytrace=False)
