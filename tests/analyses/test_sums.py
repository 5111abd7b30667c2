"""kernel_sum / nvtx_sum / nccl_sum on sources other than nsys (nsys: tests/collectors/test_nsys.py), checked
against statistics computed here from the raw trace files."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict

import pytest

from tests.conftest import SAMPLES, analyze, corpus
from traceprof.core.errors import AnalysisError
from traceprof.ingest.ingest import ingest


def _stats(durs: list[int]) -> dict[str, int]:
    return {
        "instances": len(durs),
        "total_ns": sum(durs),
        "min_ns": min(durs),
        "max_ns": max(durs),
        "med2": int(2 * statistics.median(durs)),
    }


def test_kernel_sum_on_kineto(store):
    path = corpus("hta/nccl_parser_config/nccl_data.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    by_name: dict[str, list[int]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            by_name[e["name"]].append(round(e["dur"] * 1000))
    ingest(store, [path], run="k")
    got = {r["name"]: r for r in analyze(store, "kernel_sum", "k").frame.iter_rows(named=True)}
    assert set(got) == set(by_name)
    for name, durs in by_name.items():
        want = _stats(durs)
        r = got[name]
        assert (r["instances"], r["total_ns"], r["min_ns"], r["max_ns"]) == (
            want["instances"],
            want["total_ns"],
            want["min_ns"],
            want["max_ns"],
        ), name
        assert abs(2 * r["med_ns"] - want["med2"]) <= 1  # median of an even count: x.5 rounded
    nccl = analyze(store, "nccl_sum", "k").kernels
    assert set(nccl["name"]) == {n for n in by_name if "nccl" in n.lower()}


def test_nvtx_sum_on_kineto_cpu_run(store):
    run = SAMPLES / "normal"
    ingest(store, [run], run="n", jobs=1)
    want: dict[str, list[int]] = defaultdict(list)
    for f in sorted(run.glob("rank*.trace.json.gz")):
        for e in json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "user_annotation":
                want[e["name"]].append(round(e["dur"] * 1000))
    got = {r["name"]: r for r in analyze(store, "nvtx_sum", "n").frame.iter_rows(named=True)}
    assert set(got) == set(want)
    for name, durs in want.items():
        assert (got[name]["instances"], got[name]["total_ns"]) == (len(durs), sum(durs)), name
    with pytest.raises(AnalysisError, match="no GPU kernels; kernel_sum needs a GPU trace"):
        analyze(store, "kernel_sum", "n")


def test_nccl_sum_on_flight_recorder_only(store):
    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")], run="fr", jobs=1)
    res = analyze(store, "nccl_sum", "fr")
    counts = defaultdict(int)
    for r in range(4):
        doc = json.loads(corpus(f"flight_recorder/gloo_cpu_4rank/fr_rank{r}.json").read_text())
        for e in doc["entries"]:
            counts[e["profiling_name"].split(":")[1]] += 1
    assert dict(zip(res.frame["name"], res.frame["instances_total"], strict=True)) == dict(counts)
    assert "counts only" in res.notes[0]


def _flagged_run(store, tmp_path):
    """One rank, ProfilerStep#1 over [0, 200) us (base time BASE_NS, ns of the epoch):
    kernel A [10, 20) us, launch at 5;  kernel B [30, 34) us, launch at 25;
    kernel C, 3 us, launched at 40 but stamped 1,000 s before it (another clock domain: ingest flags
      it before_launch, as v35_kernel_far_early of the t11 trial);
    memcpy M [50, 52) us, launch at 45; memcpy N, 2 us, launched at 60, stamped 1,000 s early too;
    a record_function range "open" that begins at 70 us and never ends (a 'B' without its 'E':
      unmatched_begin, duration unknown, stored as 0) and a range "closed" [80, 85) us."""
    from tests.builders import kernel, kineto, launch, step

    early = -1_000_000_000  # us: 1,000 s before the trace
    events = [
        step(1, 0, 200),
        kernel("A", 7, 10, 10, 1),
        launch(5, 1),
        kernel("B", 7, 30, 4, 2),
        launch(25, 2),
        kernel("C", 7, early, 3, 3),
        launch(40, 3),
        kernel("Memcpy DtoH (Device -> Pageable)", 7, 50, 2, 4, cat="gpu_memcpy"),
        launch(45, 4, name="cudaMemcpyAsync"),
        kernel("Memcpy DtoH (Device -> Pageable)", 7, early, 2, 5, cat="gpu_memcpy"),
        launch(60, 5, name="cudaMemcpyAsync"),
        {"ph": "B", "cat": "user_annotation", "name": "open", "pid": 1, "tid": 1, "ts": 70},
        {"ph": "X", "cat": "user_annotation", "name": "closed", "pid": 1, "tid": 1, "ts": 80, "dur": 5},
    ]
    (tmp_path / "f").mkdir()
    kineto(tmp_path / "f" / "rank0.json.gz", events)
    ingest(store, [tmp_path / "f"], run="f")


def test_sums_count_a_flagged_records_duration_and_say_so(store, tmp_path):
    # kernel_sum: A 10 + B 4 + C 3 = 17 us over 3 kernels (C's start is another clock's, its
    # duration the GPU's own); before: C left out silently (2 kernels, 14 us). memcpy_sum: M 2 + N 2.
    _flagged_run(store, tmp_path)
    ks = analyze(store, "kernel_sum", "f")
    assert (int(ks.frame["instances"].sum()), int(ks.frame["total_ns"].sum())) == (3, 17_000)
    assert any("1 kernels flagged at ingest (events.flag: before_launch 1) counted" in n for n in ks.notes)
    ms = analyze(store, "memcpy_sum", "f")
    assert (int(ms.frame["instances"].sum()), int(ms.frame["total_ns"].sum())) == (2, 4_000)
    assert any(
        "1 copies/memsets flagged at ingest (events.flag: before_launch 1) counted" in n for n in ms.notes
    )


def test_nvtx_sum_leaves_out_a_range_never_closed_and_says_so(store, tmp_path):
    # "open" has no duration (unmatched_begin, stored 0): before, an instance of 0 ns; now left out,
    # with a note. ProfilerStep#1 200 us and "closed" 5 us remain.
    _flagged_run(store, tmp_path)
    ns = analyze(store, "nvtx_sum", "f")
    assert sorted(ns.frame["name"]) == ["ProfilerStep#1", "closed"]
    assert any("1 ranges flagged at ingest (events.flag: unmatched_begin 1) left out" in n for n in ns.notes)


def test_time_analyses_say_a_flagged_gpu_record_is_left_out(store, tmp_path):
    # temporal's window: A [10, 20) .. M [50, 52) -> 42 us, busy 10 + 4 + 2 = 16, idle 26: C and N
    # are left out (another clock's start), and every time-based analysis says so with the count
    # (before: kernels alone did; temporal, idle, launch said nothing)
    _flagged_run(store, tmp_path)
    te = analyze(store, "temporal", "f")
    assert te.frame.row(0, named=True)["window_ns"] == 42_000
    want = "2 GPU record(s) flagged at ingest (events.flag: before_launch 2) left out of windows, idle and latency"
    for name in ("temporal", "idle", "kernels", "launch", "overlap"):
        notes = [str(n) for n in analyze(store, name, "f").notes]
        assert any(want in n for n in notes), (name, notes)
    # hta=true keeps them, as HTA flags nothing, and says so
    notes = [str(n) for n in analyze(store, "temporal", "f", hta=True).notes]
    assert any(
        "2 GPU record(s) flagged at ingest (events.flag: before_launch 2) not left out" in n for n in notes
    )


def test_both_flagged_notes_come_from_one_formatter(store, tmp_path, monkeypatch):
    # The count per flag: before_launch 2 + far_outside 1,234 = 1,236 records, thousands separated,
    # flags in the order given. kernel_sum's note (analyses._summary.flagged_notes) and the time
    # analyses' note (traceprof.engine.activity.flagged_note) both build it with flagged_text: each
    # built its own copy before.
    from traceprof.analyses import _summary
    from traceprof.core.classify import flagged_text
    from traceprof.engine import activity

    want = "1,236 kernels flagged at ingest (events.flag: before_launch 2, far_outside 1,234)"
    assert flagged_text([("before_launch", 2), ("far_outside", 1_234)], "kernels") == want
    _flagged_run(store, tmp_path)
    run_id = store.resolve_run("f")
    marked = lambda counts, what: "<" + flagged_text(counts, what) + ">"  # noqa: E731
    monkeypatch.setattr(_summary, "flagged_text", marked, raising=False)
    monkeypatch.setattr(activity, "flagged_text", marked, raising=False)
    select = "FROM events e WHERE e.run_id = $run AND e.kind = 'kernel'"
    assert _summary.flagged_notes(store, run_id, select, "kernels")[0].startswith(
        "<1 kernels flagged at ingest (events.flag: before_launch 1)> counted"
    )
    assert str(activity.flagged_note(store, run_id)).startswith(
        "<2 GPU record(s) flagged at ingest (events.flag: before_launch 2)> left out"
    )
