"""Ingest speed: traceprof's ingest of a real Kineto trace next to HTA's load of the same file.

Usage: python benchmarks/bench_ingest.py [TRACE_DIR] [--repeat N]
Default TRACE_DIR: ../shared/corpus/hta/df_index_resolver (216k events, 2.9 MB gzipped).
Prints the median wall time of N runs of each, measured in this one process.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

from traceprof.ingest import ingest
from traceprof.store import Store

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "hta" / "df_index_resolver"


def time_traceprof(folder: Path) -> float:
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        with Store(Path(d) / "b.duckdb") as s:
            ingest(s, [folder])
        return time.perf_counter() - t0


def time_hta(folder: Path) -> float | None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    TraceAnalysis(trace_dir=str(folder))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace_dir", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    folder = Path(a.trace_dir)
    ours = [time_traceprof(folder) for _ in range(a.repeat)]
    hta = [t for t in (time_hta(folder) for _ in range(a.repeat)) if t is not None]
    print(f"trace: {folder}")
    print(f"traceprof ingest (parse + store, fresh DuckDB file): median {statistics.median(ours):.2f} s  runs {[round(x, 2) for x in ours]}")
    if hta:
        print(f"HTA TraceAnalysis load:                            median {statistics.median(hta):.2f} s  runs {[round(x, 2) for x in hta]}")
    else:
        print("HTA not installed (pip install holistictraceanalysis) - no comparison")


if __name__ == "__main__":
    main()
