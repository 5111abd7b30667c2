"""traceprof: profile distributed LLM training traces in one DuckDB store.

The library mirrors the CLI::

    import traceprof
    from traceprof import Store, ingest

    with Store("traceprof.duckdb") as store:                 # traceprof ingest traces/run1
        ingest(store, ["traces/run1"])
    with traceprof.open("traceprof.duckdb") as s:            # a Session (traceprof.session)
        s.analyze("overlap", run="run1").to_frame()          # traceprof analyze overlap --run run1
        s.summary(run="run1")                                # traceprof summary --run run1
        s.report("report.html", run="run1")                  # traceprof report --run run1
        s.diff("run0", "run1")                               # traceprof diff run0 run1
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Store", "ingest", "open", "__version__"]


def open(db: Any, **options: Any) -> Any:  # noqa: A001 - the library's way in, as builtins.open is Python's
    """Open the store ``db`` as a :class:`traceprof.session.Session` (``with traceprof.open(db) as
    s: s.analyze(...)``); ``options``: those of :func:`traceprof.session.open_session`."""
    from traceprof.session import open_session

    return open_session(db, **options)


def __getattr__(name: str) -> Any:  # lazy, so `python -m traceprof.schema` imports nothing else
    if name == "Store":
        from traceprof.store import Store

        return Store
    if name == "ingest":
        from traceprof.ingest import ingest

        return ingest
    raise AttributeError(name)
