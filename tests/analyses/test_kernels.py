"""kernels: classes of all NCCL/RCCL name families, statistics by hand, and agreement with HTA."""

from __future__ import annotations

import logging

import polars as pl
import pytest

from tests.builders import kernel, kineto, launch
from tests.conftest import HTA_CASES, analyze, hta_case
from traceprof.core.errors import UsageError
from traceprof.ingest.ingest import ingest

# Times in us. Stream 7 compute, stream 20 communication, stream 30 copies:
#   gemm        [0, 10) [20, 30) [40, 70)  (durations 10, 10, 30)
#   ncclKernel_AllReduce_RING_LL_Sum_float           [5, 25)    comm (old family)
#   ncclDevKernel_AllGather_RING_LL(...)              [60, 80)   comm (NCCL 2.19+ family)
#   ncclSymkDevKernel_AllReduce_...                   [90, 95)   comm (symmetric-memory family)
#   rcclReduceScatterKernel (hypothetical ROCm name)  [100, 102) comm (rccl)
#   Memcpy HtoD                                       [8, 12)    memory
# Unions: compute [0,10)+[20,30)+[40,70) = 50; comm [5,25)+[60,80)+[90,95)+[100,102) = 47;
# memory [8,12) = 4. Busy = union of all = [0,30) + [40,80) + [90,95) + [100,102) = 77.
# Overlap types (sweep): [0,5) compute 5; [5,8) compute+comm 3; [8,10) all three 2; [10,12) comm+memory 2;
# [12,20) comm 8; [20,25) compute+comm 5; [25,30) compute 5; [40,60) compute 20; [60,70) compute+comm 10;
# [70,80) comm 10; [90,95) comm 5; [100,102) comm 2.
#   compute 30, compute+comm 18, comm 25, compute+comm+memory 2, comm+memory 2: total 77.
EVENTS = [
    kernel("gemm", 7, 0, 10, 1),
    kernel("gemm", 7, 20, 10, 2),
    kernel("gemm", 7, 40, 30, 3),
    kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", 20, 5, 20, 4),
    kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, 60, 20, 5),
    kernel("ncclSymkDevKernel_AllReduce_AGxLL_R_sum_bf16(ncclSymkDevWorkArgs4K)", 20, 90, 5, 6),
    kernel("rcclReduceScatterKernel", 20, 100, 2, 7),
    kernel("Memcpy HtoD (Pinned -> Device)", 30, 8, 4, 8, cat="gpu_memcpy"),
    *(launch(-1.0 - i, i) for i in range(1, 9)),
]


def test_classes_types_and_stats_by_hand(store, tmp_path):
    ingest(store, [kineto(tmp_path / "r0.json.gz", EVENTS)], run="r")
    res = analyze(store, "kernels", "r", top=0)
    r = res.frame.row(0, named=True)
    assert (r["compute_ns"], r["comm_ns"], r["memory_ns"], r["busy_ns"]) == (50_000, 47_000, 4_000, 77_000)
    assert (r["kernels"], r["kernel_ns"]) == (8, 50_000 + 47_000 + 4_000)
    # The class unions overlap (50 + 47 + 4 = 101 > 77), so they get no shares; the exclusive
    # split from the sweep below adds up to busy time: compute only 30, comm only 25, memory only
    # 0, two or more classes 18 + 2 + 2 = 22 (30 + 25 + 0 + 22 = 77).
    excl = (r["compute_only_ns"], r["comm_only_ns"], r["memory_only_ns"], r["overlapped_ns"])
    assert excl == (30_000, 25_000, 0, 22_000)
    assert r["comm_only_pct"] == pytest.approx(100 * 25 / 77)
    assert sum(
        r[f"{c}_pct"] for c in ("compute_only", "comm_only", "memory_only", "overlapped")
    ) == pytest.approx(100)
    assert "compute_pct" not in res.frame.columns
    types = dict(zip(res.types["kernel_type"], res.types["time_ns"], strict=True))
    assert types == {
        "compute": 30_000,
        "compute+comm": 18_000,
        "comm": 25_000,
        "compute+comm+memory": 2_000,
        "comm+memory": 2_000,
    }
    assert res.types["pct"].sum() == pytest.approx(100.0)
    top = res.top
    classes = dict(zip(top["name"], top["class"], strict=True))
    assert {n for n, c in classes.items() if c == "comm"} == {e["name"] for e in EVENTS[3:7]}
    assert classes["Memcpy HtoD (Pinned -> Device)"] == "memory" and classes["gemm"] == "compute"
    g = top.filter(top["name"] == "gemm").row(0, named=True)
    # gemm durations 10, 10, 30 us: total 50, mean 50/3, median 10, p95 = 10 + 0.9 * (30 - 10) = 28
    # (linear interpolation at rank 0.95 * 2 = 1.9), std = sqrt(((10-50/3)^2 * 2 + (30-50/3)^2) / 2).
    assert (g["position"], g["count"], g["total_ns"], g["min_ns"], g["max_ns"]) == (
        1,
        3,
        50_000,
        10_000,
        30_000,
    )
    # Statistics are whole ns: mean 16_666.67 -> 16_667; std 11_547.005 -> 11_547.
    assert (g["mean_ns"], g["median_ns"], g["p95_ns"]) == (round(50_000 / 3), 10_000, 28_000)
    assert g["std_ns"] == round((((10 - 50 / 3) ** 2 * 2 + (30 - 50 / 3) ** 2) / 2) ** 0.5 * 1000)
    for frame in res.frames().values():
        assert all(t == pl.Int64 for c, t in frame.schema.items() if c.endswith("_ns")), frame.schema
    assert g["pct"] == pytest.approx(100 * 50 / 101)
    # Ties (the two 20 us collectives) are ordered by name.
    assert analyze(store, "kernels", "r", top=2).top["name"].to_list() == ["gemm", EVENTS[4]["name"]]


def test_bad_top():
    from traceprof.analyses.kernels import Params

    with pytest.raises(UsageError, match=r"top=-1: must be >= 0 \(0: all kernels\)"):
        Params(top=-1)


@pytest.mark.slow
@pytest.mark.parametrize("rel", HTA_CASES)
def test_kernels_match_hta(store, rel):
    t = hta_case(store, rel)
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.utils.utils import get_kernel_type

    res = analyze(store, "kernels", "r", hta=True, top=0)
    sym = t.symbol_table.get_sym_table()
    names = {"COMPUTATION": "compute", "COMMUNICATION": "comm", "MEMORY": "memory"}
    for rank in t.get_ranks():
        g = t.get_trace(rank)
        g = g[g["stream"].ne(-1)].copy()
        g["s_name"] = g["name"].map(lambda i: sym[i])
        g["kernel_type"] = g["s_name"].map(get_kernel_type)
        logging.disable(logging.WARNING)
        try:
            ktt = BreakdownAnalysis._get_gpu_kernel_type_time(g.copy(), list(names))
        finally:
            logging.disable(logging.NOTSET)
        mine = res.types.filter(res.types["rank"] == int(rank))
        ours = dict(zip(mine["kernel_type"], zip(mine["time_ns"], mine["pct"], strict=True), strict=True))
        total = ktt["sum"].sum()
        theirs = {
            "+".join(names[p] for p in k.split(" overlapping ")): v
            for k, v in zip(ktt["kernel_type"], ktt["sum"], strict=True)
        }
        assert set(ours) == {k for k, v in theirs.items() if v > 0}
        for k, v in theirs.items():
            if v > 0:
                assert ours[k][0] == pytest.approx(v * 1000, abs=1000), k  # whole us vs ns
                assert ours[k][1] == pytest.approx(100 * v / total, abs=0.1), k
        # Per-name statistics against HTA's own rows (its un-folded group-by, as in its all_kernel_df).
        per_name = (
            g[g["kernel_type"] != "OTHER"]
            .groupby("s_name")["dur"]
            .agg(["count", "sum", "mean", "max", "min"])
        )
        top = res.top.filter(res.top["rank"] == int(rank))
        assert top.height == len(per_name)
        for row in top.iter_rows(named=True):
            h = per_name.loc[row["name"]]
            assert row["count"] == h["count"]
            assert row["total_ns"] == pytest.approx(h["sum"] * 1000, abs=1000)
            assert row["mean_ns"] == pytest.approx(h["mean"] * 1000, abs=1000)
            assert (row["max_ns"], row["min_ns"]) == (
                pytest.approx(h["max"] * 1000),
                pytest.approx(h["min"] * 1000),
            )
