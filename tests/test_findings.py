"""Findings: ranked by cost, one verdict per topic, what does not apply listed once."""

from __future__ import annotations

from tests.conftest import SAMPLES, corpus
from traceprof.findings import summarize
from traceprof.ingest import ingest


def test_regression_against_a_baseline_is_a_finding(store):
    # extra_matmul adds +17.8 % FLOPs to the same job (sample_traces/README.md): compute_ns regresses.
    ingest(store, [SAMPLES / "normal", SAMPLES / "extra_matmul"])
    f = summarize(store, "extra_matmul", baseline="normal")
    reg = [x for x in f.findings if x.topic == "regression"]
    assert len(reg) == 1 and reg[0].problem and "REGRESSION normal -> extra_matmul" in reg[0].text
    assert "aten::mm" in reg[0].text  # the op that grew
    costs = [x.cost_pct for x in f.findings if x.cost_pct is not None]
    assert costs == sorted(costs, reverse=True)  # ranked by cost
    assert [x.cost_pct is None for x in f.findings] == sorted(x.cost_pct is None for x in f.findings)
    assert {v.topic for v in f.verdicts} == {"stragglers", "communication", "idle", "utilization", "regression"}
    assert {m.analysis for m in f.missing} == {"idle", "kernels", "launch"}  # CPU-only sample: no GPU kernels
    frame = f.to_frame()
    assert frame.columns == ["position", "topic", "cost_pct", "problem", "finding"] and frame.height == len(f.findings)


def test_baseline_that_cannot_be_compared_is_a_verdict_not_an_error(store):
    ingest(store, [SAMPLES / "normal", corpus("hta/nccl_parser_config")])
    f = summarize(store, "nccl_parser_config", baseline="normal")
    v = {v.topic: v for v in f.verdicts}["regression"]
    assert v.status == "n/a" and "not comparable" in v.text


def test_tf32_mfu_finding_names_precision_and_peak(store):
    ingest(store, [corpus("hta/nccl_parser_config")])
    f = summarize(store, None, params={"mfu": {"model_flops_per_step": "4e13"}})
    mfu = [x for x in f.findings if x.topic == "mfu"][0]
    assert "tf32 peak 156 TFLOP/s, A100; precision from kernels" in mfu.text
