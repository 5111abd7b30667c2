"""traceprof: profile distributed LLM training traces in one DuckDB store.

The library mirrors the CLI::

    from traceprof import Store, ingest, analysis
    with Store("traceprof.duckdb") as store:
        ingest(store, ["traces/run1"])
        result = analysis.get("overlap").run(store, analysis.get("overlap").params(run="run1"))
        result.to_frame()   # a polars DataFrame
"""

from traceprof.ingest import ingest
from traceprof.store import Store

__version__ = "0.1.0"
__all__ = ["Store", "ingest", "__version__"]
