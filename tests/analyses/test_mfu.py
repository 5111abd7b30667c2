"""MFU: device peaks from the trace's device properties, step times, sources, recomputation."""

from __future__ import annotations

import polars as pl
import pytest

from tests.builders import GPU_STEP, op, write_rank, write_run
from tests.conftest import analyze, corpus, sample_run
from traceprof.core.errors import UsageError
from traceprof.engine.peaks import kernel_dtype, match_device
from traceprof.ingest.ingest import ingest


@pytest.mark.parametrize(
    "name, dtype, tflops",
    [
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
    ],
)
def test_peak_table(name, dtype, tflops):
    dev = match_device(name)
    assert (dev.peak(dtype) if dev else None) == tflops


def test_gpu_corpus_trace_uses_the_a100_tf32_peak(store):
    # Kineto deviceProperties: 8 x "NVIDIA A100-PG509-200"; rank 0 of world 2; no shapes recorded,
    # so the FLOPs are declared: 4e13 per step for the job -> 2e13 per rank. Its matrix kernels are
    # TF32 tensor-op kernels (grep the trace: cutlass_80_tensorop_s1688gemm_*, sm80_xmma_*_tf32f32_*),
    # so the peak is the A100's dense TF32 156 TFLOP/s, not fp32 19.5 (8x too high an MFU) nor bf16 312.
    ingest(store, [corpus("hta/nccl_parser_config")])
    res = analyze(store, "mfu", model_flops_per_step=4e13)
    # Step time from plain SQL: each step's window (critical_path's step account): from the end of
    # the previous step's GPU work (the first: its ProfilerStep's start) to the end of its own.
    span = {s: ns for _, s, ns in _windows_sql(store)}
    assert len(span) == 3
    for r in res.frame.iter_rows(named=True):
        assert (r["device"], r["peak_device"], r["peak_tflops"], r["dtype"]) == (
            "NVIDIA A100-PG509-200",
            "A100",
            156.0,
            "tf32",
        )
        assert r["step_ns"] == span[r["step"]] and r["step_time_source"] == "device"
        assert r["flops"] == 2e13 and r["flops_source"] == "declared"
        assert r["mfu_pct"] == pytest.approx(100 * 2e13 / (span[r["step"]] * 1e-9) / 156e12)
        assert r["hfu_pct"] is None  # recomputation unknown
    job = res.job.row(0, named=True)
    assert job["mfu_pct"] == pytest.approx(100 * 3 * 2e13 / (sum(span.values()) * 1e-9) / 156e12)
    assert (job["dtype"], job["dtype_source"], job["peak_device"]) == ("tf32", "kernels", "A100")
    assert any("peak 156 TFLOP/s" in n and "A100-PG509-200" in n for n in res.notes)
    assert any(
        n.startswith("precision tf32 from the kernels") and "tensorop_s1688gemm" in n for n in res.notes
    )
    bf16 = analyze(store, "mfu", model_flops_per_step=4e13, dtype="bf16")
    assert set(bf16.frame["peak_tflops"]) == {312.0} and bf16.job["dtype_source"][0] == "declared"
    full = analyze(store, "mfu", model_flops_per_step=4e13, recompute="full").frame.row(0, named=True)
    assert full["hfu_pct"] == pytest.approx(full["mfu_pct"] * 4 / 3)  # forward (1/3 of 6N) done twice


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("sm80_xmma_gemm_tf32f32_tf32f32_f32_nn_n_tilesize128x128x16", "tf32"),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4::Params)",
            "tf32",
        ),
        (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16",
            "tf32",
        ),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn", "bf16"),
        ("void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "bf16"),
        ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", "fp16"),
        ("volta_h884gemm_64x64_ldg8_nn", "fp16"),
        ("ampere_sgemm_32x32_sliced1x4_tn", "fp32"),
        ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", "fp8"),
        ("void at::native::vectorized_elementwise_kernel<4, float>", None),  # not a matrix kernel
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", None),
    ],
)
def test_kernel_dtype_from_names(name, dtype):
    assert kernel_dtype(name) == dtype


def _windows_sql(store) -> list[tuple[int, int, int]]:
    """(rank, step, step window ns) by plain SQL: a step ends where its GPU work ends (else its
    ProfilerStep), never before the previous step's end, and starts where that one ended (the
    first: the earlier of its ProfilerStep's start and its first GPU activity's)."""
    return store.sql(
        """SELECT rank, step,
                  e - coalesce(lag(e) OVER w, least(cpu_start_ns, coalesce(device_start_ns, cpu_start_ns)))
           FROM (SELECT *, max(coalesce(device_end_ns, cpu_end_ns)) OVER (PARTITION BY rank ORDER BY step
                 ROWS UNBOUNDED PRECEDING) AS e FROM steps)
           WINDOW w AS (PARTITION BY rank ORDER BY step) ORDER BY rank, step"""
    ).rows()


def _gpu_run(tmp_path, device1: str, step_us: int = 1000, kernel_us: tuple[int, int] = (100, 400)):
    """One step: ProfilerStep#1 [0, 1000 us]; aten::mm bf16 1024^3 (2*1024^3 = 2,147,483,648 FLOPs)
    launches one kernel on device 1 that runs [100, 500 us]: the step's window runs from its start
    (0) to the end of its GPU work (500 us): 500,000 ns (not the kernel's span, 400 us).
    ``step_us``, ``kernel_us`` (start, duration): another step length and kernel, us."""
    ev = [
        op("ProfilerStep#1", 0, step_us, cat="user_annotation"),
        op("aten::mm", 5, 20, [[1024, 1024], [1024, 1024]], ["c10::BFloat16", "c10::BFloat16"]),
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 9,
            "tid": 1,
            "ts": 10,
            "dur": 5,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "sm90_gemm",
            "pid": 1,
            "tid": 7,
            "ts": kernel_us[0],
            "dur": kernel_us[1],
            "args": {"correlation": 1, "device": 1, "stream": 7},
        },
    ]
    devices = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}, {"id": 1, "name": device1}]
    return write_run(tmp_path / "gpu", ev, devices=devices)


def test_shapes_dtype_and_the_device_the_rank_used(store, tmp_path):
    ingest(store, [_gpu_run(tmp_path, "NVIDIA H100 80GB HBM3")])
    r = analyze(store, "mfu").frame.row(0, named=True)
    assert (r["flops_source"], r["dtype"], r["device"], r["peak_tflops"]) == (
        "shapes",
        "bf16",
        "NVIDIA H100 80GB HBM3",
        989.4,
    )
    assert r["step_ns"] == 500_000
    assert r["tflops"] == pytest.approx(2 * 1024**3 / 500e-6 / 1e12)  # 4.2950 TFLOP/s
    assert r["mfu_pct"] == pytest.approx(100 * 2 * 1024**3 / 500e-6 / 989.4e12)
    # Executed (shape) FLOPs include the recomputed forward: model = executed / (1 + 1/3).
    rec = analyze(store, "mfu", recompute="full").frame.row(0, named=True)
    assert rec["mfu_pct"] == pytest.approx(r["mfu_pct"] * 3 / 4) and rec["hfu_pct"] == pytest.approx(
        r["mfu_pct"]
    )
    with pytest.raises(UsageError):
        analyze(store, "mfu", recompute="sometimes")


def test_unknown_device_says_so(store, tmp_path):
    ingest(store, [_gpu_run(tmp_path, "Mystery Accelerator 9000")])
    res = analyze(store, "mfu")
    assert res.frame["mfu_pct"].to_list() == [None] and res.frame["tflops"][0] > 0
    assert any("unknown device 'Mystery Accelerator 9000'" in n for n in res.notes)
    assert analyze(store, "mfu", peak_tflops=100.0).frame["mfu_pct"][0] == pytest.approx(
        100 * 2 * 1024**3 / 500e-6 / 100e12
    )


def test_cpu_sample_needs_a_user_peak(store):
    sample_run(store, "normal")
    res = analyze(store, "mfu")
    assert res.frame["mfu_pct"].null_count() == res.frame.height == 12
    assert any(n.startswith("CPU-only run") for n in res.notes)
    # With a peak: tflops from the sidecar FLOPs and the step windows (CPU ranks: from the previous
    # ProfilerStep's end to this one's), by plain SQL.
    window = {(r, s): ns for r, s, ns in _windows_sql(store)}
    expected = dict(
        ((r, s), f / window[(r, s)] / 1e3)
        for r, s, f in store.sql(
            """SELECT s.rank, s.step, CAST(k.value AS DOUBLE)
           FROM steps s JOIN traces t USING (run_id, rank), json_each(t.flops_per_step) k
           WHERE CAST(k.key AS INTEGER) = s.step"""
        ).rows()
    )
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


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"peak_tflops": 0}, r"peak_tflops=0: must be a finite number > 0"),
        ({"peak_tflops": -5.0}, r"peak_tflops=-5.0: must be a finite number > 0"),
        ({"peak_tflops": "nan"}, r"peak_tflops='nan': expected a finite number"),
        ({"peak_tflops": float("inf")}, r"peak_tflops=inf: expected a finite number"),
        ({"peak_tflops": "fast"}, r"peak_tflops='fast': expected a number"),
        (
            {"model_flops_per_step": -1e12},
            r"model_flops_per_step=-1000000000000.0: must be >= 0 \(0: not given\)",
        ),
        ({"layers": -2}, r"layers=-2: must be >= 0"),
        ({"flops_source": "guess"}, r"flops_source='guess': choose one of auto, declared"),
        ({"dtype": "int8"}, r"dtype='int8': expected one of"),
        ({"recompute": "2"}, r"recompute='2': expected none, full or a fraction 0..1"),
    ],
)
def test_bad_params(params, expected):
    from traceprof.analyses.mfu import Params

    with pytest.raises(UsageError, match=expected):
        Params(**params)


def test_peak_from_the_cli_string(store, tmp_path):
    # The CLI hands "-p peak_tflops=100" over as a string (its default is None): converted.
    from traceprof.analyses.mfu import Params

    assert Params(peak_tflops="100").peak_tflops == 100.0 and Params().peak_tflops is None


def test_job_mfu_over_ranks_with_different_devices(store, tmp_path):
    # Two ranks of one job on different GPUs: rank 0 an A100 (dense bf16 312 TFLOP/s), rank 1 an
    # H100 SXM (989.4). One ProfilerStep each: 1000 us on rank 0, 800 us on rank 1. Declared job
    # FLOPs 1e11 per step, split over the ranks: 5e10 each.
    # Per rank: rank 0 100 * 5e10 / 1e-3 s / 312e12 = 16.026 %; rank 1 100 * 5e10 / 0.8e-3 / 989.4e12
    # = 6.317 %. Job: all FLOPs over the slowest rank's step time and the summed peaks:
    # 100 * 1e11 / 1e-3 / (312 + 989.4)e12 = 7.684 %, not the mean of the ranks (11.17 %); job
    # tflops per device 1e11 / 1e-3 / 1e12 / 2 = 50; peak_tflops per device (312 + 989.4) / 2.
    for rank, dur, dev in ((0, 1000, "NVIDIA A100-SXM4-80GB"), (1, 800, "NVIDIA H100 80GB HBM3")):
        write_run(
            tmp_path / "job",
            [op("ProfilerStep#1", 0, dur, cat="user_annotation"), op("aten::mm", 10, dur - 20)],
            rank=rank,
            world=2,
            devices=[{"id": 0, "name": dev, "totalGlobalMem": 85e9, "numSms": 132}],
        )
    ingest(store, [tmp_path / "job"], run="job")
    res = analyze(store, "mfu", "job", model_flops_per_step=1e11, dtype="bf16")
    per = {r["rank"]: r for r in res.frame.iter_rows(named=True)}
    assert (per[0]["peak_tflops"], per[1]["peak_tflops"]) == (312.0, 989.4)
    assert per[0]["mfu_pct"] == pytest.approx(100 * 5e10 / 1e-3 / 312e12)
    assert per[1]["mfu_pct"] == pytest.approx(100 * 5e10 / 0.8e-3 / 989.4e12)
    job = res.job.row(0, named=True)
    assert (job["ranks"], job["steps"], job["time_ns"]) == (2, 1, 1_000_000)
    assert job["mfu_pct"] == pytest.approx(100 * 1e11 / 1e-3 / (312 + 989.4) / 1e12)
    assert job["tflops"] == pytest.approx(50.0) and job["peak_tflops"] == pytest.approx((312 + 989.4) / 2)


def test_mfu_above_100_percent_is_called_impossible(store):
    # 4e16 FLOPs per step on the same A100 trace: 1000x the steps' real work, so every step's MFU
    # (100 * 2e16 / step_s / 156e12) is far above 100 %.
    ingest(store, [corpus("hta/nccl_parser_config")])
    res = analyze(store, "mfu", model_flops_per_step=4e16)
    assert (res.frame["mfu_pct"] > 100).all()
    assert any(n.startswith("MFU above 100% in 3 of 3 step(s)") and "impossible" in n for n in res.notes)
    assert not any("MFU above 100%" in n for n in analyze(store, "mfu", model_flops_per_step=4e13).notes)


def test_waterfall_by_hand_on_a_gpu_step(store, tmp_path):
    # tests.builders.GPU_STEP: one rank, window 150 us = compute 70 + memory 25 +
    # host_bound 40 + idle 15 us. Declared 4e9 FLOPs per step at a 100 TFLOP/s peak need
    # 4e9 / 1e14 s = 40 us at peak: MFU 40 us; kernel efficiency 70 - 40 = 30 us.
    # pct of 150 us: idle 10, exposed comm 0, wait 0, host 26.67, memory 16.67, efficiency 20, MFU 26.67.
    ingest(store, [write_rank(tmp_path / "r0.json", GPU_STEP, 0, world=1, backend="nccl")], run="g")
    res = analyze(store, "mfu", "g", model_flops_per_step=4e9, peak_tflops=100.0)
    wf = res.waterfall
    assert wf.columns == ["component", "ns", "pct", "detail"]
    assert wf.select("component", "ns").rows() == [
        ("idle", 15_000),
        ("exposed communication", 0),
        ("waiting for peers", 0),
        ("launch/host-bound", 40_000),
        ("memory", 25_000),
        ("kernel efficiency", 30_000),
        ("MFU", 40_000),
    ]
    assert wf["pct"].to_list() == pytest.approx([10.0, 0.0, 0.0, 80 / 3, 50 / 3, 20.0, 80 / 3])
    assert sum(wf["pct"]) == pytest.approx(100.0)
    assert "causal attention" in wf["detail"][-1] and "declared" in wf["detail"][-1]
    assert any(n.startswith("FLOPs convention: a multiply-add counts 2; causal attention") for n in res.notes)
    # the job row divides by the step's window (0..150 us, the account's): 4e9 / 150 us / 1e14 = 26.67%,
    # the waterfall's MFU row (it divided by the kernels' span, 10..150 us: 28.6%)
    assert res.job["mfu_pct"][0] == pytest.approx(100 * 4e9 / 150e-6 / 1e14)


@pytest.mark.parametrize(
    "peak, why",
    [
        (None, "n/a: the device peak is unknown (pass -p peak_tflops=)"),
        # 4e9 FLOPs at 10 TFLOP/s: 400 us at peak, more than the 150 us step: MFU 266.7%
        (10.0, "n/a: MFU above 100% (266.7%)"),
        # at 40 TFLOP/s: 100 us at peak, within the step but more than the 70 us of compute
        (40.0, "n/a: at peak the FLOPs need 0.1 ms, more than the 0.1 ms that compute ran"),
    ],
)
def test_waterfall_refuses_an_impossible_or_unknown_mfu(store, tmp_path, peak, why):
    ingest(store, [write_rank(tmp_path / "r0.json", GPU_STEP, 0, world=1, backend="nccl")], run="g")
    params = {"model_flops_per_step": 4e9} | ({"peak_tflops": peak} if peak else {})
    wf = analyze(store, "mfu", "g", **params).waterfall
    mfu = wf.row(6, named=True)
    assert (mfu["component"], mfu["ns"], mfu["pct"]) == ("MFU", None, None) and mfu["detail"].startswith(why)
    # the compute time is not split: one row holds all of it, and the known rows still add up to 100
    assert wf.row(5)[:2] == ("kernel efficiency", 70_000)
    assert sum(wf["pct"].drop_nulls()) == pytest.approx(100.0)


def test_waterfall_of_a_sample_run_adds_up_to_its_step_account(store):
    # straggler_rank2 (CPU, gloo) with a stated peak of 1 TFLOP/s: 1,511,071,744 sidecar FLOPs per
    # step and rank need 1.511 ms each at peak. The rows are critical_path's sums over the 12 rank
    # steps (exact ns), kernel efficiency the rest of compute; the pcts add up to 100.
    from tests.conftest import SAMPLES

    ingest(store, [SAMPLES / "straggler_rank2"])
    wf = analyze(store, "mfu", peak_tflops=1.0).waterfall
    acc = analyze(store, "critical_path").frame
    got = dict(wf.select("component", "ns").rows())
    assert got["idle"] == acc["idle_ns"].sum() and got["waiting for peers"] == acc["wait_ns"].sum()
    assert got["exposed communication"] == acc["transfer_ns"].sum()
    assert got["launch/host-bound"] == acc["host_bound_ns"].sum() and got["memory"] == 0
    assert got["MFU"] == round(12 * 1_511_071_744 / 1e3)  # FLOPs / (1 TFLOP/s) in ns
    assert got["kernel efficiency"] + got["MFU"] == acc["compute_ns"].sum()
    assert sum(got.values()) == acc["step_ns"].sum() and sum(wf["pct"]) == pytest.approx(100.0)


def test_a_long_step_with_one_short_kernel_uses_the_step_time(store, tmp_path):
    # hta/call_stack's shape: a 413 ms ProfilerStep [0, 413,000 us] whose one kernel runs 45 us,
    # [395,000, 395,045 us]. The step's window: 0 .. the kernel's end = 395,045 us, as critical_path's
    # account has it; declared 1e12 FLOPs at a 100 TFLOP/s peak: 1e12 / 0.395045 s = 2.5313 TFLOP/s,
    # MFU 2.5313 % (the kernel's span alone, 45 us, claimed 22,222 TFLOP/s: 8,779x).
    ingest(store, [_gpu_run(tmp_path, "NVIDIA H100 80GB HBM3", step_us=413_000, kernel_us=(395_000, 45))])
    res = analyze(store, "mfu", model_flops_per_step=1e12, peak_tflops=100.0)
    r = res.frame.row(0, named=True)
    assert (r["step_ns"], r["step_time_source"]) == (395_045_000, "device")
    assert r["tflops"] == pytest.approx(1e12 / 0.395045 / 1e12)
    assert r["mfu_pct"] == pytest.approx(100 * 1e12 / 0.395045 / 100e12)
    assert res.job["mfu_pct"][0] == pytest.approx(r["mfu_pct"])
    # the same step time as critical_path's step account
    assert analyze(store, "critical_path").frame["step_ns"].to_list() == [395_045_000]


def test_job_throughput_counts_the_time_of_the_rank_steps_it_has():
    # 2 ranks, steps 4-6 of 1 ms, 1 GFLOP per rank-step, peak 10 TFLOP/s each; rank 1's trace lacks
    # step 4. Device time: 1 ms x 1 + 1 ms x 2 + 1 ms x 2 = 5 ms for 5 GFLOP: 1 TFLOP/s per device
    # (the FLOPs of 5 rank-steps over the time of 6 read 0.833), MFU 10 %.
    from traceprof.analyses.mfu import _job

    rows = [(0, 4), (0, 5), (0, 6), (1, 5), (1, 6)]
    frame = pl.DataFrame(
        {
            "rank": [r for r, _ in rows],
            "step": [s for _, s in rows],
            "step_ns": [1_000_000] * 5,
            "flops": [1e9] * 5,
            "peak_tflops": [10.0] * 5,
            "flops_source": ["shapes"] * 5,
        }
    )
    job = _job(frame, None).row(0, named=True)
    assert job["tflops"] == pytest.approx(1.0) and job["mfu_pct"] == pytest.approx(10.0)
    assert (job["ranks"], job["steps"], job["time_ns"], job["peak_tflops"]) == (2, 3, 3_000_000, 10.0)
    # every rank in every step: as before, FLOPs / (time x ranks)
    full = _job(frame.vstack(frame.head(1).with_columns(pl.lit(1, pl.Int64).alias("rank"))), None).row(
        0, named=True
    )
    assert full["tflops"] == pytest.approx(6e9 / 3e6 / 1e3 / 2) and full["mfu_pct"] == pytest.approx(10.0)


def test_a_step_holding_a_lost_step_sets_no_figure(store, tmp_path):
    # 2 ranks, steps 1-3 of 1 ms each ([0, 1], [1, 2], [2, 3] ms); rank 1's trace lost its step 2, so its
    # step 3's window runs from the end of its step 1: [1, 3] ms, two steps' time with one step's
    # FLOPs. Declared 1e11 FLOPs per step, 5e10 per rank-step; peak 100 TFLOP/s.
    # Left out, the device time is 1 ms x 2 + 1 ms x 1 + 1 ms x 1 (step 3 on rank 0 alone) = 4 ms
    # for 4 x 5e10 FLOPs:
    # 2e11 / 4e-3 s / 1e12 = 50 TFLOP/s per device, MFU 50 %, job time 3 ms.
    # Counted (as before), rank 1's 2 ms set step 3: 2.5e11 / 7e-3 / 1e12 = 35.7 TFLOP/s, time 4 ms.
    for rank, steps in ((0, (1, 2, 3)), (1, (1, 3))):
        events = []
        for s in steps:
            t = (s - 1) * 1000
            events += [op(f"ProfilerStep#{s}", t, 1000, cat="user_annotation"), op("aten::mm", t + 10, 980)]
        write_run(tmp_path / "job", events, rank=rank, world=2)
    ingest(store, [tmp_path / "job"], run="job")
    res = analyze(store, "mfu", "job", model_flops_per_step=1e11, peak_tflops=100.0)
    held = res.frame.filter((pl.col("rank") == 1) & (pl.col("step") == 3)).row(0, named=True)
    assert held["step_ns"] == 2_000_000 and held["flops"] == pytest.approx(5e10)
    assert (held["tflops"], held["mfu_pct"]) == (None, None)
    assert res.frame.filter(pl.col("tflops").is_null()).height == 1
    job = res.job.row(0, named=True)
    assert job["tflops"] == pytest.approx(50.0) and job["mfu_pct"] == pytest.approx(50.0)
    assert (job["flops"], job["time_ns"]) == (pytest.approx(2e11), 3_000_000)
    assert (
        "rank 1's step 3 holds the time of its lost step 2 too, but one step's FLOPs: its TFLOP/s and MFU "
        "are left empty, and the job's figures and the waterfall leave it out"
    ) in res.notes
    # the waterfall's account leaves it out too: 4 rank-steps of 1 ms, 4 x 5e10 / 1e14 s = 2 ms at peak
    wf = dict(res.waterfall.select("component", "ns").rows())
    assert wf["MFU"] == 2_000_000 and sum(wf.values()) == 4_000_000


def _renumbered(tmp_path, drop_sidecar_step: str | None = None):
    """sample_traces/normal with rank 1's ProfilerStep#4..6 renamed #104..106 in its trace only
    (t14 stepshift); ``drop_sidecar_step``: a step removed from rank 1's sidecar too."""
    import gzip
    import json
    import shutil

    from tests.conftest import SAMPLES

    d = tmp_path / "stepshift"
    shutil.copytree(SAMPLES / "normal", d)
    f = d / "rank1.trace.json.gz"
    text = gzip.decompress(f.read_bytes()).decode()
    for k in (4, 5, 6):
        text = text.replace(f'"ProfilerStep#{k}"', f'"ProfilerStep#{100 + k}"')
    f.write_bytes(gzip.compress(text.encode()))
    if drop_sidecar_step:
        meta = d / "rank1.meta.json"
        m = json.loads(meta.read_text())
        m["flops_per_step"].pop(drop_sidecar_step)
        meta.write_text(json.dumps(m))
    return d


def test_a_rank_whose_trace_renumbers_its_steps_is_not_dropped(store, tmp_path):
    """t14 D3: every rank's sidecar counts 1,511,071,744 FLOPs per step (steps 4..6); rank 1's trace
    numbers them #104..#106. By hand: 4 ranks x 3 steps x 1,511,071,744 = 18,132,860,928 FLOPs over 3
    steps (before: 3 ranks, 13,599,645,696 FLOPs, no note): rank 1 lined up by order, with a note,
    and its steps joined with the others' #4..#6 in the job (time as sample 'normal' alone)."""
    ingest(store, [_renumbered(tmp_path)], run="shift")
    sample_run(store, "normal")
    res = analyze(store, "mfu", "shift")
    job = res.job.row(0, named=True)
    assert (job["ranks"], job["steps"], job["flops"]) == (4, 3, 18_132_860_928.0)
    assert job["time_ns"] == analyze(store, "mfu", "normal").job["time_ns"][0]
    assert res.frame.filter(pl.col("rank") == 1)["flops"].to_list() == [1_511_071_744.0] * 3
    assert any(
        "rank 1: trace steps #104..#106 are not in its sidecar, which numbers #4..#6: lined up by order" in n
        for n in map(str, res.notes)
    )


def test_a_rank_step_without_sidecar_flops_is_named(store, tmp_path):
    """Rank 1's sidecar lacks step 5 as well: 3 trace steps, 2 sidecar counts, not lined up; its 3
    steps are left out, named. By hand: 3 ranks x 3 x 1,511,071,744 = 13,599,645,696 FLOPs."""
    ingest(store, [_renumbered(tmp_path, drop_sidecar_step="5")], run="shift")
    res = analyze(store, "mfu", "shift")
    assert (res.job["ranks"][0], res.job["flops"][0]) == (3, 13_599_645_696.0)
    assert any(
        "rank 1: trace steps #104..#106 have no sidecar FLOPs (its sidecar numbers #4, #6): left out" in n
        for n in map(str, res.notes)
    )
