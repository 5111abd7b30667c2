"""Large synthetic Kineto (torch.profiler) traces of a data-parallel GPU job, for the benchmarks.

Usage: python benchmarks/gen_trace.py OUT_DIR --ranks 8 --events 1000000 --steps 1000 [--gzip]

Writes ``OUT_DIR/rank<R>.trace.json[.gz]``, new-style Kineto JSON (top-level
``baseTimeNanoseconds``, ``distributedInfo``, ``deviceProperties``; ``ts``/``dur`` microseconds
with 3 decimals relative to the base, the base after the events, one event over several lines, as
libkineto writes them), shaped like one rank of a DDP job. Per step (``--events``
/ ``--steps`` events; at least 20):

  1. a ``ProfilerStep#N`` user annotation on the main thread around the step's CPU work;
  2. ``k`` compute kernels on stream 7, each launched by a ``cudaLaunchKernel`` runtime call (its
     ``correlation`` and ``External id`` in the kernel's args) inside an ``aten::`` cpu_op; the
     kernel starts at max(launch + 5 us, end of the previous kernel on the stream);
  3. ``c`` NCCL all-reduces on stream 20 (one per 100 events of the step, at least one), each
     launched by a ``cudaLaunchKernel`` inside ``record_param_comms``, with the collective's
     process group and sequence number (``Process Group Name``, ``Seq``) and sizes in the args of
     the kernel and of the op; launched after 70 % of the step's compute launches, starting once the
     compute kernel before it has ended, so they partly overlap the rest of the step's compute and
     are partly exposed;
  4. one top-level ``forward`` cpu_op around the step's launches;
  5. with ``--group G`` (a divisor of ``--ranks``): one all-gather per step on the rank's sub-group
     of ``G`` consecutive ranks (process group ``"1+r//G"``, its own ``Seq``; 3 more events a step),
     as tensor-parallel groups inside a data-parallel job.

So ``3k + 3c + 2`` events per step (``+ 3`` with ``--group``); ``k`` is chosen to reach ``--events``. Kernel durations, launch
gaps and collective sizes are pseudo-random (seeded by rank: the same arguments give the same
files). Ranks share one clock with a few microseconds of offset each.
"""

from __future__ import annotations

import argparse
import gzip
import io
import time
from pathlib import Path

import numpy as np

BASE_NS = 1_750_000_000_000_000_000
US = 1000
PID, TID, COMPUTE_STREAM, NCCL_STREAM = 4242, 4242, 7, 20
KERNELS = [
    "ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
    "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
    "triton_poi_fused_add_mul_0",
]
OPS = ["aten::mm", "aten::add", "aten::_flash_attention_forward", "aten::native_layer_norm", "aten::mul"]
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _ev(head: str, ts: str, dur: str, args: str) -> str:
    """One event in libkineto's layout (its line breaks and indentation)."""
    return (
        f'  {{\n    "ph": "X", {head},\n    "ts": {ts}, "dur": {dur},\n'
        f'    "args": {{\n      {args}\n    }}\n  }}'
    )


def _us(ns: int) -> str:
    """Relative ns as Kineto's microsecond text with 3 decimals."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def _collective(kernel: str, ls: int, st: int, d: int, ext: int, corr: int, meta: str) -> list[str]:
    """The three events of one collective: its ``record_param_comms`` op (launched at ``ls``), the
    ``cudaLaunchKernel`` and the NCCL ``kernel`` (from ``st``, ``d`` long), with the ``meta`` args."""
    cpu = f'"pid": {PID}, "tid": {TID}'
    return [
        _ev(
            f'"cat": "cpu_op", "name": "record_param_comms", {cpu}',
            _us(ls - 1 * US),
            "8.000",
            f'"External id": {ext}, {meta}',
        ),
        _ev(
            f'"cat": "cuda_runtime", "name": "cudaLaunchKernel", {cpu}',
            _us(ls),
            "4.000",
            f'"External id": {ext}, "cbid": 211, "correlation": {corr}',
        ),
        _ev(
            f'"cat": "kernel", "name": "{kernel}", "pid": 0, "tid": {NCCL_STREAM}',
            _us(st),
            _us(d),
            f'"External id": {ext}, "queued": 0, "device": 0, "context": 1, '
            f'"stream": {NCCL_STREAM}, "correlation": {corr}, {meta}',
        ),
    ]


def _meta(name: str, in_nel: int, out_nel: int, size: int, pg: str, desc: str, ranks: str, seq: int) -> str:
    """The Kineto ``args`` of an NCCL collective kernel (record_param_comms' fields), without braces."""
    return (
        f'"Collective name": "{name}", "In msg nelems": {in_nel}, "Out msg nelems": {out_nel}, '
        f'"Group size": {size}, "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]", '
        f'"Process Group Name": "{pg}", "Process Group Description": "{desc}", '
        f'"Process Group Ranks": "{ranks}", "Seq": {seq}'
    )


def _shape(events: int, steps: int) -> tuple[int, int]:
    """(compute kernels k, collectives c) per step for ``events`` events over ``steps`` steps."""
    per_step = events // steps
    if per_step < 20:
        raise SystemExit(f"--events/--steps = {per_step}: need at least 20 events per step")
    c = max(1, per_step // 100)
    return (per_step - 2 - 3 * c) // 3, c


def _header(rank: int, world: int, group: int = 0) -> str:
    ranks = ", ".join(str(r) for r in range(world))
    sub = ""
    if group:
        g = rank // group
        members = ", ".join(str(r) for r in range(g * group, (g + 1) * group))
        sub = (
            f', {{"pg_name": "{1 + g}", "pg_desc": "tp_group", "backend_config": "cuda:nccl", '
            f'"pg_size": {group}, "ranks": [{members}]}}'
        )
    return (
        '{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", '
        '"totalGlobalMem": 85520809984, "computeMajor": 9, "computeMinor": 0, "numSms": 132}], '
        f'"distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}, "pg_count": {1 + bool(group)}, '
        f'"pg_config": [{{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", '
        f'"pg_size": {world}, "ranks": [{ranks}]}}{sub}], "nccl_version": "2.21.5"}}, '
        f'"host_name": "node{rank // 8:03d}",\n  "traceEvents": [\n'
    )


# libkineto writes these after the events
TRAILER = f'\n],\n  "traceName": "synthetic.json",\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {BASE_NS}}}\n'


def _rank_events(
    rank: int, world: int, steps: int, k: int, c: int, out: io.TextIOBase, group: int = 0
) -> int:
    """Write one rank's events (comma-separated JSON objects, one a line); returns their number."""
    rng = np.random.default_rng(rank)
    ranks = "[" + ", ".join(str(r) for r in range(world)) + "]"
    t = 10_000 * US + rank * 3_217  # CPU clock (relative ns)
    gpu_free = nccl_free = 0
    corr = ext = seq = sub_seq = 0
    g = rank // group if group else 0
    members = "[" + ", ".join(str(r) for r in range(g * group, (g + 1) * group)) + "]"
    n = 0
    first = True
    for s in range(steps):
        lines: list[str] = []
        step_start = t
        gaps = rng.integers(5 * US, 9 * US, k)
        launch = t + 20 * US + np.cumsum(gaps)
        dur = np.where(rng.random(k) < 0.3, rng.integers(2 * US, 6 * US, k), rng.integers(6 * US, 14 * US, k))
        which = rng.integers(0, len(KERNELS), k)
        ends = np.empty(k, dtype=np.int64)
        free = gpu_free
        for j in range(k):
            ls = int(launch[j])
            st = max(ls + 5 * US, free)
            d = int(dur[j])
            free = st + d
            ends[j] = free
            w = int(which[j])
            corr += 1
            ext += 1
            cpu = f'"pid": {PID}, "tid": {TID}'
            lines.append(
                _ev(
                    f'"cat": "cpu_op", "name": "{OPS[w]}", {cpu}',
                    _us(ls - 1 * US),
                    "5.000",
                    f'"External id": {ext}, "Sequence number": {ext}',
                )
            )
            lines.append(
                _ev(
                    f'"cat": "cuda_runtime", "name": "cudaLaunchKernel", {cpu}',
                    _us(ls),
                    "3.000",
                    f'"External id": {ext}, "cbid": 211, "correlation": {corr}',
                )
            )
            lines.append(
                _ev(
                    f'"cat": "kernel", "name": "{KERNELS[w]}", "pid": 0, "tid": {COMPUTE_STREAM}',
                    _us(st),
                    _us(d),
                    f'"External id": {ext}, "queued": 0, "device": 0, "context": 1, '
                    f'"stream": {COMPUTE_STREAM}, "correlation": {corr}, "registers per thread": 64, '
                    '"grid": [132, 1, 1], "block": [256, 1, 1]',
                )
            )
        gpu_free = free
        after = [int(k * 0.7 + (k * 0.3) * i / c) for i in range(c)]
        for j in after:
            ls = int(launch[min(j, k - 1)]) + 2 * US
            st = max(ls + 6 * US, int(ends[min(j, k - 1)]), nccl_free)
            nel = int(rng.integers(1 << 20, 1 << 24))
            d = 10 * US + nel // 400
            nccl_free = st + d
            corr += 1
            ext += 1
            seq += 1
            meta = _meta("allreduce", nel, nel, world, "0", "default_pg", ranks, seq)
            lines += _collective(NCCL, ls, st, d, ext, corr, meta)
        if group:  # the sub-group's all-gather: the same size on every member (seeded by group and step)
            ls = int(launch[-1]) + 10 * US
            st = max(ls + 6 * US, nccl_free)
            nel = (1 << 20) + (s * 7919 + g * 104729) % (1 << 22)
            d = 10 * US + nel // 400
            nccl_free = st + d
            corr += 1
            ext += 1
            sub_seq += 1
            meta = _meta(
                "_allgather_base", nel // group, nel, group, str(1 + g), "tp_group", members, sub_seq
            )
            lines += _collective(NCCL_AG, ls, st, d, ext, corr, meta)
        cpu_end = int(launch[-1]) + 30 * US
        cpu = f'"pid": {PID}, "tid": {TID}'
        lines.append(
            _ev(
                f'"cat": "cpu_op", "name": "forward", {cpu}',
                _us(step_start + 10 * US),
                _us(cpu_end - step_start - 15 * US),
                "",
            )
        )
        lines.append(
            _ev(
                f'"cat": "user_annotation", "name": "ProfilerStep#{s}", {cpu}',
                _us(step_start),
                _us(cpu_end - step_start),
                f'"External id": {ext}',
            )
        )
        ext += 1
        # The next step starts when the CPU is done, or waits for the GPU when it is far behind.
        t = max(cpu_end + 5 * US, min(gpu_free, nccl_free) - 200 * US)
        out.write(("" if first else ",\n") + ",\n".join(lines))
        first = False
        n += len(lines)
    return n


def generate(
    out_dir: Path, ranks: int, events: int, steps: int, gzip_out: bool, group: int = 0
) -> list[Path]:
    """Write ``ranks`` trace files of about ``events`` events and ``steps`` steps each (``group``:
    the size of the sub-groups with an all-gather a step, 0 for none; it divides ``ranks``).

    Returns:
        The paths written.
    """
    if group and ranks % group:
        raise SystemExit(f"--group {group}: must divide --ranks {ranks}")
    out_dir.mkdir(parents=True, exist_ok=True)
    k, c = _shape(events, steps)
    paths = []
    for r in range(ranks):
        path = out_dir / f"rank{r}.trace.json{'.gz' if gzip_out else ''}"
        raw = gzip.open(path, "wt", compresslevel=1) if gzip_out else open(path, "w")  # noqa: SIM115
        with raw as f:
            f.write(_header(r, ranks, group))
            _rank_events(r, ranks, steps, k, c, f, group)
            f.write(TRAILER)
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--events", type=int, default=2_000_000, help="events per rank (about)")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--gzip", action="store_true", help="write .json.gz (compression level 1)")
    ap.add_argument("--group", type=int, default=0, help="sub-group size (an all-gather a step in each)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    paths = generate(a.out, a.ranks, a.events, a.steps, a.gzip, a.group)
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files, {size / 1e6:.0f} MB, in {time.perf_counter() - t0:.1f} s to {a.out}")


if __name__ == "__main__":
    main()
