"""Analysis speed on a synthetic store of about one million events across 8 ranks.

Usage: python benchmarks/bench_analyses.py [--ranks 8] [--steps 48] [--repeat 3] [--db FILE]

The store is written directly as ``ParsedTrace`` tables (no JSON), shaped like a data-parallel GPU
job: per rank and step 1000 compute kernels (a tenth on a second stream), each launched by a
``cudaLaunchKernel`` inside an ``aten::`` op inside a top-level op (forward, then
``autograd::engine::evaluate_function: ...`` in backward), 8 NCCL all-reduces on a third stream
launched during backward (waiting for the compute before them), 2 memcpys, and a ProfilerStep
annotation: 2646 events per rank and step. Kernel starts follow the launches and the stream order
(start = max(launch + 4 us, previous end on the stream)); times are ns-resolution epoch ns.

Then it times temporal, overlap, idle, kernels, launch and gaps (default parameters) on it and
prints the median of ``--repeat`` runs of each and of the whole set.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from traceprof import analysis as registry
from traceprof.parsed import ParsedTrace
from traceprof.schema import table
from traceprof.store import Store

ANALYSES = ("temporal", "overlap", "idle", "kernels", "launch", "gaps")
KERNELS_PER_STEP = 1000
FORWARD = 400  # the first FORWARD kernels of a step are forward, the rest backward
NCCL_PER_STEP = 8
BASE_NS = 1_750_000_000_000_000_000
US = 1000
COMPUTE_NAMES = [
    "ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn",
    "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_nn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>",
    "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
    "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8>>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
    "triton_poi_fused_add_mul_0",
]
FWD_OPS = ["aten::linear", "aten::addmm", "aten::layer_norm", "aten::gelu", "aten::softmax"]
BWD_OPS = ["autograd::engine::evaluate_function: AddmmBackward0", "autograd::engine::evaluate_function: GeluBackward0",
           "autograd::engine::evaluate_function: NativeLayerNormBackward0"]
NCCL_NAME = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _stream_order(ready: np.ndarray, dur: np.ndarray, after: int) -> np.ndarray:
    """Start times of kernels run in order on one stream: start_i = max(ready_i, end_{i-1}), end_{-1} = after."""
    d_before = np.concatenate([[0], np.cumsum(dur)[:-1]])
    ends = np.cumsum(dur) + np.maximum.accumulate(np.maximum(ready - d_before, after))
    return ends - dur


def _rank(rank: int, steps: int, rng: np.random.Generator) -> ParsedTrace:
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ("kind", "name", "ts_ns", "dur_ns", "tid", "stream",
                                                         "correlation", "step")}
    step_rows, coll_rows = [], []

    def add(kind, name, ts, dur, tid, stream, corr, step):
        n = len(ts)
        cols["kind"].append(np.full(n, kind, dtype=object))
        cols["name"].append(np.asarray(name, dtype=object) if not isinstance(name, str) else np.full(n, name, dtype=object))
        cols["ts_ns"].append(np.asarray(ts, dtype=np.int64))
        cols["dur_ns"].append(np.asarray(dur, dtype=np.int64))
        cols["tid"].append(np.full(n, tid, dtype=object))
        cols["stream"].append(np.full(n, stream if stream is not None else -1, dtype=np.int64))
        cols["correlation"].append(np.asarray(corr, dtype=np.int64) if corr is not None else np.full(n, -1, np.int64))
        cols["step"].append(np.full(n, step, dtype=np.int64))

    t = BASE_NS + rank * 37_123  # ranks start a little apart
    end7 = end8 = end20 = t
    corr0 = 0
    for s in range(steps):
        n = KERNELS_PER_STEP
        gaps = 6 * US + rng.integers(0, 4 * US, n)
        launch = t + 50 * US + np.cumsum(gaps)
        corr = corr0 + np.arange(n)
        corr0 += n + NCCL_PER_STEP + 2
        dur = np.where(rng.random(n) < 0.2, rng.integers(2 * US, 6 * US, n),
                       rng.lognormal(np.log(15 * US), 0.8, n).astype(np.int64) + US)
        on8 = (np.arange(n) % 10 == 3) & (np.arange(n) < FORWARD)
        start = np.empty(n, dtype=np.int64)
        start[~on8] = _stream_order(launch[~on8] + 4 * US, dur[~on8], end7)
        start[on8] = _stream_order(launch[on8] + 4 * US, dur[on8], end8)
        end7, end8 = int((start + dur)[~on8].max()), int((start + dur)[on8].max())
        names = np.array(COMPUTE_NAMES, dtype=object)[rng.integers(0, len(COMPUTE_NAMES), n)]
        add("kernel", names, start, dur, "7", None, corr, s)
        cols["stream"][-1][:] = np.where(on8, 8, 7)
        add("cuda_runtime", "cudaLaunchKernel", launch, np.full(n, 3 * US), "100", None, corr, s)
        # aten ops around pairs of launches, top-level ops around groups of four aten ops
        a_start, a_end = launch[0::2] - US, launch[1::2] + 4 * US
        bwd = np.arange(len(a_start)) * 2 >= FORWARD
        add("cpu_op", np.where(bwd, "aten::mm", np.array(FWD_OPS, dtype=object)[np.arange(len(a_start)) % 5]),
            a_start, a_end - a_start, "100", None, None, s)
        t_start, t_end = a_start[0::4] - 500, a_end[3::4] + 500
        tbwd = np.arange(len(t_start)) * 8 >= FORWARD
        add("cpu_op", np.where(tbwd, np.array(BWD_OPS, dtype=object)[np.arange(len(t_start)) % 3], "forward"),
            t_start, t_end - t_start, "100", None, None, s)
        # NCCL all-reduces launched in backward, after every 75th backward kernel
        idx = FORWARD + 74 + 75 * np.arange(NCCL_PER_STEP)
        idx = idx[idx < n]
        c_launch = launch[idx] + 1500
        c_dur = rng.integers(400 * US, 1500 * US, len(idx))
        c_start = _stream_order(np.maximum(c_launch + 5 * US, start[idx] + dur[idx]), c_dur, end20)
        end20 = int((c_start + c_dur).max())
        c_corr = corr0 - NCCL_PER_STEP - 2 + np.arange(len(idx))
        add("kernel", NCCL_NAME, c_start, c_dur, "20", 20, c_corr, s)
        add("cuda_runtime", "cudaLaunchKernel", c_launch, np.full(len(idx), 4 * US), "100", None, c_corr, s)
        for k in range(len(idx)):
            coll_rows.append({"source": "nccl_kernel", "pg": "0", "seq": s * NCCL_PER_STEP + k, "op": "all_reduce",
                              "dtype": "BFloat16", "nelems_in": 12_500_000, "nelems_out": 12_500_000,
                              "bytes_in": 25_000_000, "bytes_out": 25_000_000, "group_size": 8,
                              "enter_ns": int(c_launch[k]), "start_ns": int(c_start[k]),
                              "end_ns": int(c_start[k] + c_dur[k]), "stream": 20, "tid": None, "step": s,
                              "ordinal": s * NCCL_PER_STEP + k})
        m_launch = t + np.array([5, 20]) * US
        m_corr = corr0 - 2 + np.arange(2)
        add("memcpy", "Memcpy HtoD (Pinned -> Device)", m_launch + 10 * US, np.full(2, 30 * US), "21", 21, m_corr, s)
        add("cuda_runtime", "cudaMemcpyAsync", m_launch, np.full(2, 5 * US), "100", None, m_corr, s)
        step_end = max(int(launch[-1]) + 200 * US, end20 + 100 * US)
        add("step", f"ProfilerStep#{s}", [t], [step_end - t], "100", None, None, s)
        step_rows.append({"step": s, "cpu_start_ns": t, "cpu_end_ns": step_end, "device_start_ns": int(start.min()),
                          "device_end_ns": max(end7, end8, end20), "is_last": s == steps - 1})
        t = step_end

    arrays = {k: np.concatenate(v) for k, v in cols.items()}
    gpu = np.isin(arrays["kind"], ["kernel", "memcpy"])
    n = len(arrays["kind"])
    events = pa.table({
        "kind": pa.array(arrays["kind"], pa.string()),
        "cat": pa.array(np.where(arrays["kind"] == "step", "user_annotation", arrays["kind"]), pa.string()),
        "name": pa.array(arrays["name"], pa.string()),
        "ts_ns": arrays["ts_ns"], "dur_ns": arrays["dur_ns"],
        "pid": pa.array(np.where(gpu, "0", "1"), pa.string()),
        "tid": pa.array(arrays["tid"], pa.string()),
        "device": pa.array(np.where(gpu, 0, 0), pa.int32(), mask=~gpu),
        "stream": pa.array(arrays["stream"], pa.int64(), mask=~gpu),
        "correlation": pa.array(arrays["correlation"], pa.int64(), mask=arrays["correlation"] < 0),
        "external_id": pa.array(np.zeros(n, np.int64), pa.int64(), mask=np.ones(n, bool)),
        "step": pa.array(arrays["step"], pa.int32()),
        "args": pa.array(np.full(n, "{}", dtype=object), pa.string()),
    })
    return ParsedTrace(
        path=f"/synthetic/rank{rank}.json", sha256=hashlib.sha256(f"bench{rank}{steps}".encode()).hexdigest(),
        bytes=0, source="kineto", format="synthetic", rank=rank, world_size=None,
        trace={"base_time_ns": 0, "backend": "nccl", "device_name": "NVIDIA H100 80GB HBM3"},
        events=events,
        steps=pa.Table.from_pylist(step_rows),
        collectives=pa.Table.from_pylist(coll_rows),
        events_read=n,
    )


def build(db: Path, ranks: int, steps: int) -> int:
    """Write the synthetic run into store ``db``; returns the number of events."""
    rng = np.random.default_rng(0)
    traces = [_rank(r, steps, rng) for r in range(ranks)]
    for t in traces:
        t.world_size = ranks
        assert set(t.events.column_names) <= set(table("events").column_names)
    with Store(db) as s:
        s.insert_run("bench", traces)
    return sum(t.events.num_rows for t in traces)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--db", type=Path, default=None, help="keep the store in this file")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        db = a.db or Path(d) / "bench.duckdb"
        if db.exists():
            db.unlink()
        t0 = time.perf_counter()
        n = build(db, a.ranks, a.steps)
        print(f"store: {n:,} events, {a.ranks} ranks, {a.steps} steps, built in {time.perf_counter() - t0:.1f} s")
        registry.load_all()
        times: dict[str, list[float]] = {name: [] for name in ANALYSES}
        totals = []
        with Store(db, read_only=True) as store:
            for _ in range(a.repeat):
                t_all = time.perf_counter()
                for name in ANALYSES:
                    an = registry.get(name)
                    t1 = time.perf_counter()
                    an.run(store, an.params(run="bench"))
                    times[name].append(time.perf_counter() - t1)
                totals.append(time.perf_counter() - t_all)
        for name in ANALYSES:
            print(f"{name:10} median {statistics.median(times[name]):.3f} s")
        print(f"{'total':10} median {statistics.median(totals):.3f} s  runs {[round(x, 3) for x in totals]}")


if __name__ == "__main__":
    main()
