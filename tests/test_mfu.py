"""MFU: device peaks from the trace's device properties, step times, sources, recomputation."""

from __future__ import annotations

import pytest

from tests.conftest import analyze, corpus
from tests.test_flops import op, sample_run, write_run
from traceprof.errors import UsageError
from traceprof.ingest import ingest
from traceprof.peaks import match_device


@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA A100-PG509-200", "bf16", 312.0),
    ("NVIDIA A100-PCIE-40GB", "tf32", 156.0),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H100 NVL", "fp8", 1670.5),
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA B200", "bf16", 2250.0),
    ("AMD Instinct MI300X", "bf16", 1307.4),
    ("Tesla V100-SXM2-32GB", "fp16", 125.0),
    ("Tesla V100-SXM2-32GB", "bf16", None),  # V100 has no bf16 tensor cores: unknown, not guessed
    ("NVIDIA GB200", "bf16", None),  # not B200
    ("AMD Radeon Graphics", "bf16", None),
    ("cpu", "fp32", None),
])
def test_peak_table(name, dtype, tflops):
    dev = match_device(name)
    assert (dev.peak(dtype) if dev else None) == tflops


def test_gpu_corpus_trace_uses_the_a100_peak(store):
    # Kineto deviceProperties: 8 x "NVIDIA A100-PG509-200"; rank 0 of world 2; no shapes recorded,
    # so the FLOPs are declared: 4e13 per step for the job -> 2e13 per rank.
    ingest(store, [corpus("hta/nccl_parser_config")])
    res = analyze(store, "mfu", model_flops_per_step=4e13)
    # Step time from plain SQL: the device span of each ProfilerStep.
    span = dict(store.sql("SELECT step, device_end_ns - device_start_ns FROM steps ORDER BY step").rows())
    assert len(span) == 3
    for r in res.frame.iter_rows(named=True):
        assert (r["device"], r["peak_device"], r["peak_tflops"], r["dtype"]) == ("NVIDIA A100-PG509-200", "A100", 312.0, "bf16")
        assert r["step_ns"] == span[r["step"]] and r["step_time_source"] == "device"
        assert r["flops"] == 2e13 and r["flops_source"] == "declared"
        assert r["mfu_pct"] == pytest.approx(100 * 2e13 / (span[r["step"]] * 1e-9) / 312e12)
        assert r["hfu_pct"] is None  # recomputation unknown
    job = res.job.row(0, named=True)
    assert job["mfu_pct"] == pytest.approx(100 * 3 * 2e13 / (sum(span.values()) * 1e-9) / 312e12)
    assert any("peak 312 TFLOP/s" in n and "A100-PG509-200" in n for n in res.notes)
    assert any("dtype unknown" in n for n in res.notes)
    tf32 = analyze(store, "mfu", model_flops_per_step=4e13, dtype="tf32").frame
    assert set(tf32["peak_tflops"]) == {156.0}
    full = analyze(store, "mfu", model_flops_per_step=4e13, recompute="full").frame.row(0, named=True)
    assert full["hfu_pct"] == pytest.approx(full["mfu_pct"] * 4 / 3)  # forward (1/3 of 6N) done twice


def _gpu_run(tmp_path, device1: str):
    """One step: ProfilerStep#1 [0, 1000 us]; aten::mm bf16 1024^3 (2*1024^3 = 2,147,483,648 FLOPs)
    launches one kernel on device 1 that runs [100, 500 us]: device span 400 us = 400,000 ns."""
    ev = [
        op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        op("aten::mm", 5, 20, [[1024, 1024], [1024, 1024]], ["c10::BFloat16", "c10::BFloat16"]),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 1, "ts": 10, "dur": 5,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 1, "tid": 7, "ts": 100, "dur": 400,
         "args": {"correlation": 1, "device": 1, "stream": 7}},
    ]
    devices = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}, {"id": 1, "name": device1}]
    return write_run(tmp_path / "gpu", ev, devices=devices)


def test_shapes_dtype_and_the_device_the_rank_used(store, tmp_path):
    ingest(store, [_gpu_run(tmp_path, "NVIDIA H100 80GB HBM3")])
    r = analyze(store, "mfu").frame.row(0, named=True)
    assert (r["flops_source"], r["dtype"], r["device"], r["peak_tflops"]) == ("shapes", "bf16", "NVIDIA H100 80GB HBM3", 989.4)
    assert r["step_ns"] == 400_000
    assert r["tflops"] == pytest.approx(2 * 1024**3 / 400e-6 / 1e12)  # 5.3687 TFLOP/s
    assert r["mfu_pct"] == pytest.approx(100 * 2 * 1024**3 / 400e-6 / 989.4e12)
    # Executed (shape) FLOPs include the recomputed forward: model = executed / (1 + 1/3).
    rec = analyze(store, "mfu", recompute="full").frame.row(0, named=True)
    assert rec["mfu_pct"] == pytest.approx(r["mfu_pct"] * 3 / 4) and rec["hfu_pct"] == pytest.approx(r["mfu_pct"])
    with pytest.raises(UsageError):
        analyze(store, "mfu", recompute="sometimes")


def test_unknown_device_says_so(store, tmp_path):
    ingest(store, [_gpu_run(tmp_path, "Mystery Accelerator 9000")])
    res = analyze(store, "mfu")
    assert res.frame["mfu_pct"].to_list() == [None] and res.frame["tflops"][0] > 0
    assert any("unknown device 'Mystery Accelerator 9000'" in n for n in res.notes)
    assert analyze(store, "mfu", peak_tflops=100.0).frame["mfu_pct"][0] == pytest.approx(
        100 * 2 * 1024**3 / 400e-6 / 100e12)


def test_cpu_sample_needs_a_user_peak(store):
    sample_run(store, "normal")
    res = analyze(store, "mfu")
    assert res.frame["mfu_pct"].null_count() == res.frame.height == 12
    assert any(n.startswith("CPU-only run") for n in res.notes)
    # With a peak: tflops from the sidecar FLOPs and the ProfilerStep durations, by plain SQL.
    expected = dict(((r, s), f / ns / 1e3) for r, s, f, ns in store.sql(
        """SELECT s.rank, s.step, CAST(k.value AS DOUBLE), s.cpu_end_ns - s.cpu_start_ns
           FROM steps s JOIN traces t USING (run_id, rank), json_each(t.flops_per_step) k
           WHERE CAST(k.key AS INTEGER) = s.step""").rows())
    user = analyze(store, "mfu", peak_tflops=0.05).frame
    for r in user.iter_rows(named=True):
        assert r["flops_source"] == "sidecar" and r["step_time_source"] == "cpu"
        assert r["tflops"] == pytest.approx(expected[(r["rank"], r["step"])])
        assert r["mfu_pct"] == pytest.approx(100 * r["tflops"] / 0.05)


def test_missing_device_name_says_what_to_do(store):
    # The 2023 traces carry no deviceProperties (and no collector sidecar): the device is unknown
    # because the trace does not name it, not because a name "None" is missing from the table.
    ingest(store, [corpus("hta/trace_filter")])
    assert store.sql("SELECT count(*) FROM devices").item() == 0
    res = analyze(store, "mfu")
    (note,) = [n for n in res.notes if "peak_tflops" in n and "recomput" not in n]
    assert "names no device" in note and "-p peak_tflops=" in note and "None" not in note
    assert res.frame["mfu_pct"].null_count() == res.frame.height


@pytest.mark.parametrize("params, expected", [
    ({"peak_tflops": 0}, r"peak_tflops=0: must be a finite number > 0"),
    ({"peak_tflops": -5.0}, r"peak_tflops=-5.0: must be a finite number > 0"),
    ({"peak_tflops": "nan"}, r"peak_tflops='nan': expected a finite number"),
    ({"peak_tflops": float("inf")}, r"peak_tflops=inf: expected a finite number"),
    ({"peak_tflops": "fast"}, r"peak_tflops='fast': expected a number"),
    ({"model_flops_per_step": -1e12}, r"model_flops_per_step=-1000000000000.0: must be >= 0 \(0: not given\)"),
    ({"layers": -2}, r"layers=-2: must be >= 0"),
    ({"flops_source": "guess"}, r"flops_source='guess': choose one of auto, declared"),
    ({"dtype": "int8"}, r"dtype='int8': expected one of"),
    ({"recompute": "2"}, r"recompute='2': expected none, full or a fraction 0..1"),
])
def test_bad_params(params, expected):
    from analyses.mfu import Params
    with pytest.raises(UsageError, match=expected):
        Params(**params)


def test_peak_from_the_cli_string(store, tmp_path):
    # The CLI hands "-p peak_tflops=100" over as a string (its default is None): converted.
    from analyses.mfu import Params
    assert Params(peak_tflops="100").peak_tflops == 100.0 and Params().peak_tflops is None
