"""memcpy_sum against the sources themselves: nsys's SQLite tables and Kineto's JSON."""

from __future__ import annotations

import gzip
import json
import sqlite3
import statistics
from decimal import ROUND_HALF_UP, Decimal

import pytest

from tests.conftest import analyze, corpus
from traceprof.core.errors import AnalysisError
from traceprof.ingest.ingest import ingest


def test_nsys_copy_time_and_bytes_equal_the_export(store):
    # nsys stats' memory reports, recomputed from the export's own rows: per copyKind (1 = HtoD,
    # 2 = DtoH in CUPTI's enum) count, sum(end - start) and bytes; the export has no memset rows.
    path = corpus("nsys/pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    ingest(store, [path], run="saxpy", jobs=1)
    con = sqlite3.connect(path)
    want = {
        {1: "Memcpy HtoD", 2: "Memcpy DtoH"}[k]: (n, t, b, lo, hi)
        for k, n, t, b, lo, hi in con.execute(
            "SELECT copyKind, count(*), sum(end - start), sum(bytes), min(end - start), max(end - start) "
            "FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"
        )
    }
    con.close()
    assert want == {
        "Memcpy HtoD": (10, 186_001_123, 2_621_440_000, 18_112_420, 19_124_598),
        "Memcpy DtoH": (5, 98_698_477, 1_310_720_000, 19_681_488, 19_833_582),
    }
    res = analyze(store, "memcpy_sum", run="saxpy")
    got = {r["name"]: (r["instances"], r["total_ns"], r["min_ns"], r["max_ns"]) for r in res.frame.to_dicts()}
    assert got == {k: (n, t, lo, hi) for k, (n, t, _, lo, hi) in want.items()}
    # shares of the summed time: 186,001,123 / 284,699,600 = 65.33%
    assert res.frame["name"].to_list() == ["Memcpy HtoD", "Memcpy DtoH"]
    assert res.frame["time_pct"][0] == pytest.approx(100 * 186_001_123 / (186_001_123 + 98_698_477))
    sizes = {r["name"]: (r["total_bytes"], r["count"], r["min_bytes"]) for r in res.sizes.to_dicts()}
    assert sizes == {k: (b, n, 262_144_000) for k, (n, _, b, _, _) in want.items()}  # 250 MiB each copy


def test_kineto_copies_equal_the_json(store):
    # Kineto's gpu_memcpy / gpu_memset events of both ranks, read from the JSON with exact decimal
    # microseconds (ns = us * 1000): per operation (name up to the memory kinds), count, sum, median.
    folder = corpus("hta/trace_filter")
    ingest(store, [folder], run="tf", jobs=1)
    durs: dict[str, list[int]] = {}
    sizes: dict[str, list[int]] = {}
    for f in sorted(folder.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()), parse_float=Decimal)
        for ev in doc["traceEvents"]:
            if ev.get("cat") in ("gpu_memcpy", "gpu_memset") and ev.get("ph") == "X":
                name = "Memset" if ev["cat"] == "gpu_memset" else " ".join(ev["name"].split()[:2])
                durs.setdefault(name, []).append(int(Decimal(ev["dur"]) * 1000))
                if "bytes" in ev.get("args", {}):
                    sizes.setdefault(name, []).append(int(ev["args"]["bytes"]))
    res = analyze(store, "memcpy_sum", run="tf")
    got = {r["name"]: (r["instances"], r["total_ns"], r["med_ns"]) for r in res.frame.to_dicts()}
    half_up = lambda x: int(Decimal(x).quantize(Decimal(1), ROUND_HALF_UP))  # noqa: E731 - DuckDB's round()
    assert got == {k: (len(v), sum(v), half_up(statistics.median(v))) for k, v in durs.items()}
    assert set(got) == {"Memcpy DtoD", "Memcpy DtoH", "Memcpy HtoD", "Memset"}
    assert {r["name"]: r["total_bytes"] for r in res.sizes.to_dicts()} == {
        k: sum(v) for k, v in sizes.items()
    }
    assert res.ranks["total_ns"].sum() == sum(map(sum, durs.values()))  # the ranks' rows add up to the run


def test_cpu_run_has_no_copies(store):
    from tests.conftest import SAMPLES

    ingest(store, [SAMPLES / "clean"], jobs=1)
    with pytest.raises(AnalysisError, match="no GPU memory copies"):
        analyze(store, "memcpy_sum")
