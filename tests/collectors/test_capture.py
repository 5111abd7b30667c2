"""End-to-end check of the Kineto capture side: a 2-rank gloo job profiled into tmp_path.

Each rank runs ``y = x @ W^T`` (one bias-free ``nn.Linear`` under ``no_grad``) then all-reduces
``y``, for ``STEPS`` iterations; the profiler records ``ACTIVE`` of them. The only op with a FLOP
formula is that one ``aten::mm`` (the all-reduce's reduction is done by gloo, not by an aten op), so
torch's count for each step, worked out by hand, is ``2 * M * K * N`` = 2 * 16 * 32 * 8 = 8192
(one multiply and one add per term of each of the M*N dot products of length K).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

WORLD_SIZE = 2
M, K, N = 16, 32, 8  # x is (M, K); the Linear maps K -> N features
FLOPS_PER_STEP = 2 * M * K * N
WAIT, WARMUP, ACTIVE = 0, 1, 2
STEPS = WAIT + WARMUP + ACTIVE + 1  # one unprofiled step after the active window
SIDECAR_KEYS = {
    "format",
    "version",
    "rank",
    "world_size",
    "host",
    "pid",
    "device",
    "device_count",
    "backend",
    "torch_version",
    "profiled_steps",
    "flops_per_step",
    "flops_total",
    "flops_method",
    "trace_file",
}


def _worker(rank: int, out_dir: str, store: str) -> None:
    import torch.distributed as dist

    from traceprof.collectors.kineto.capture import profile_ranks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE)
    lin = torch.nn.Linear(K, N, bias=False)
    x = torch.randn(M, K)
    with torch.no_grad(), profile_ranks(out_dir, wait=WAIT, warmup=WARMUP, active=ACTIVE) as prof:
        for _ in range(STEPS):
            dist.all_reduce(lin(x))
            prof.step()
    dist.destroy_process_group()
    # torch 2.13's CPU profiler with gloo aborts about 1 process in 3 at interpreter exit, after
    # everything above has run and the files are written ("terminate called without an active
    # exception", SIGABRT; a plain profiler without gloo, or gloo without the profiler, never did in
    # 12-14 runs each): not traceprof's code, so the rank leaves without the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("capture")
    mp.spawn(_worker, args=(str(out), str(out / "store")), nprocs=WORLD_SIZE)
    return out


@pytest.mark.parametrize("rank", range(WORLD_SIZE))
def test_files_and_sidecar(capture_dir: Path, rank: int) -> None:
    meta = json.loads((capture_dir / f"rank{rank}.meta.json").read_text())
    assert SIDECAR_KEYS <= meta.keys()
    assert meta["format"] == "traceprof-kineto-meta" and meta["version"] == 1
    assert (meta["rank"], meta["world_size"], meta["backend"]) == (rank, WORLD_SIZE, "gloo")
    assert meta["torch_version"] == torch.__version__
    assert meta["trace_file"] == f"rank{rank}.trace.json.gz"
    # Steps are numbered from 0; the active window starts after WAIT + WARMUP steps.
    assert meta["profiled_steps"] == list(range(WAIT + WARMUP, WAIT + WARMUP + ACTIVE))

    trace = json.loads(gzip.decompress((capture_dir / meta["trace_file"]).read_bytes()))
    assert trace["distributedInfo"]["rank"] == rank
    names = [e.get("name", "") for e in trace["traceEvents"]]
    steps = sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))
    assert steps == meta["profiled_steps"]
    assert names.count("gloo:all_reduce") == ACTIVE


@pytest.mark.parametrize("rank", range(WORLD_SIZE))
def test_sidecar_flops_match_hand_count(capture_dir: Path, rank: int) -> None:
    meta = json.loads((capture_dir / f"rank{rank}.meta.json").read_text())
    assert meta["flops_per_step"] == {str(s): FLOPS_PER_STEP for s in meta["profiled_steps"]}
    assert meta["flops_total"] == ACTIVE * FLOPS_PER_STEP
    assert meta["flops_by_op"] == {"aten::mm": ACTIVE * FLOPS_PER_STEP}
    assert meta["flops_outside_steps"] == 0
