"""traceprof: profile distributed LLM training traces in one DuckDB store.

The library mirrors the CLI::

    from traceprof import Store, ingest, analysis
    with Store("traceprof.duckdb") as store:
        ingest(store, ["traces/run1"])
        an = analysis.get("overlap")
        an.run(store, an.params(run="run1")).to_frame()   # a polars DataFrame
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Store", "ingest", "__version__"]


def __getattr__(name: str) -> Any:  # lazy, so `python -m traceprof.schema` imports nothing else
    if name == "Store":
        from traceprof.store import Store

        return Store
    if name == "ingest":
        from traceprof.ingest import ingest

        return ingest
    raise AttributeError(name)
