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
