"""CPU-only (gloo) runs: the training thread's ops are compute, the gloo work is communication."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import SAMPLES, analyze
from traceprof.ingest.ingest import ingest

US = 1000  # ns per us


def _micro_gloo_trace(path):
    """One rank of a gloo run, by hand (times in us, base 0).

    main thread 1: ProfilerStep#1 [0, 100]; aten::mm [0, 40]; aten::mm [50, 80] with a nested
                   aten::add [55, 60]; c10d::allreduce_ [81, 82] (an enqueue: not compute)
    gloo thread 2: gloo:all_reduce [30, 60] and [85, 95]
    compute = [0,40] ∪ [50,80] = 70 us; comm = [30,60] ∪ [85,95] = 40 us
    overlap = [30,40] + [50,60] = 20 us -> 50 % of comm; exposed = 20 us
    window = [0, 95] = 95 us; busy = [0,80] ∪ [85,95] = 90 us -> idle 5 us; non-compute = 20 us
    """
    X = lambda name, tid, ts, dur, cat="cpu_op": {  # noqa: E731
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 9,
        "tid": tid,
        "ts": ts,
        "dur": dur,
    }
    ev = [
        X("ProfilerStep#1", 1, 0, 100, "user_annotation"),
        X("aten::mm", 1, 0, 40),
        X("aten::mm", 1, 50, 30),
        X("aten::add", 1, 55, 5),
        X("c10d::allreduce_", 1, 81, 1),
        X("gloo:all_reduce", 2, 30, 30, "user_annotation"),
        X("gloo:all_reduce", 2, 85, 10, "user_annotation"),
    ]
    path.mkdir()
    doc = {
        "baseTimeNanoseconds": 0,
        "distributedInfo": {"rank": 0, "world_size": 1, "backend": "gloo"},
        "traceEvents": ev,
    }
    (path / "rank0.json").write_text(json.dumps(doc))
    return path


def test_micro_gloo_trace_by_hand(store, tmp_path):
    ingest(store, [_micro_gloo_trace(tmp_path / "gloo")])
    ov = analyze(store, "overlap").frame.row(0, named=True)
    assert (ov["comm_ns"], ov["compute_ns"], ov["overlap_ns"], ov["exposed_comm_ns"]) == (
        40 * US,
        70 * US,
        20 * US,
        20 * US,
    )
    assert ov["overlap_pct"] == pytest.approx(50.0)
    t = analyze(store, "temporal").frame.row(0, named=True)
    assert (t["window_ns"], t["idle_ns"], t["compute_ns"], t["non_compute_ns"]) == (
        95 * US,
        5 * US,
        70 * US,
        20 * US,
    )


def _merge(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _independent_overlap(path):
    """Overlap of one rank recomputed from the raw JSON with plain Python (ns ints from the
    decimal text), independent of traceprof's parser and SQL."""
    from decimal import Decimal

    doc = json.loads(gzip.open(path).read(), parse_float=Decimal)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    main = {e["tid"] for e in ev if e["name"].startswith("ProfilerStep#")}
    ns = lambda v: int(Decimal(v) * 1000)  # noqa: E731  (Kineto writes <= 3 decimals)
    comm = _merge([(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in ev if e["name"].startswith("gloo:")])
    comp = _merge(
        [
            (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
            for e in ev
            if e.get("cat") == "cpu_op" and e["tid"] in main and not e["name"].startswith("c10d::")
        ]
    )
    total = lambda m: sum(b - a for a, b in m)  # noqa: E731
    both = total(_merge(comm + comp))
    return total(comm), total(comp), total(comm) + total(comp) - both


def test_cpu_sample_every_rank_communicates(store):
    ingest(store, [SAMPLES / "normal"])
    ov = analyze(store, "overlap").frame.sort("rank")
    assert ov["rank"].to_list() == [0, 1, 2, 3]
    for row in ov.iter_rows(named=True):
        assert row["comm_ns"] > 0
        assert 0 < row["overlap_pct"] < 100
        comm, comp, overlap = _independent_overlap(SAMPLES / "normal" / f"rank{row['rank']}.trace.json.gz")
        assert (row["comm_ns"], row["compute_ns"], row["overlap_ns"]) == (comm, comp, overlap)
