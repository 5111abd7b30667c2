"""Ranks whose process drives several GPUs: every figure that sums GPU busy time is per device (the
rank's figure its devices' summed), every other one says that it merged the rank's devices.

The run (``tests.builders.two_gpu_ranks``): 2 NCCL ranks, each driving GPUs 0 and 1; step s
(b = 1000 s us, 3 steps, ProfilerStep [b, b + 900]) holds a GEMM on device 0 [b + 10, b + 410], a
GEMM on device 1 [b + 210, b + 610] and an all-reduce on device 0 [b + 450, b + 550]. By hand, per
device: the all-reduce is exposed whole (device 0 computes nothing in [450, 550]): 100 us a step,
300 us a rank, 600 us the run. Merged over the rank (before), device 1's GEMM [210, 610] "hid" it: 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import two_gpu_ranks
from tests.conftest import analyze, case
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

US = 1000
SEVERAL = "drive several GPUs"


@pytest.fixture
def two(store: Store, tmp_path: Path) -> Store:
    ingest(store, [two_gpu_ranks(tmp_path / "run")])
    return store


def _notes(res: object) -> str:
    return " | ".join(str(n) for n in res.notes)  # type: ignore[attr-defined]


def test_gaps_name_their_device(two: Store) -> None:
    # 6 gaps (2 ranks x 3 steps), each the whole 100 us all-reduce on device 0
    g = analyze(two, "gaps")
    assert g.gaps.columns[:3] == ["rank", "device", "step"]
    assert sorted(g.gaps.select("rank", "device", "step", "dur_ns").rows()) == [
        (r, 0, s, 100 * US) for r in (0, 1) for s in (1, 2, 3)
    ]


def test_gaps_device_on_the_case_and_on_one_gpu_ranks(tmp_path: Path) -> None:
    # two_gpus_one_process/dp_nccl_both_devices (tests/ingest/test_shapes.py): the broadcast on
    # device 0 [500, 700] and the one on device 1 [800, 1000] us are one gap each, on their device.
    # one_collective_per_step: one GPU per rank (device 0), its gaps name it.
    from tests.ingest.test_shapes import _dp_nccl_both_devices

    g = analyze(_dp_nccl_both_devices(tmp_path), "gaps")
    assert g.gaps.sort("start_ns").select("device", "dur_ns").rows() == [(0, 200 * US), (1, 200 * US)]
    one = Store(tmp_path / "one.duckdb")
    ingest(one, [case("one_collective_per_step")])
    g1 = analyze(one, "gaps")
    assert g1.gaps.height and g1.gaps["device"].to_list() == [0] * g1.gaps.height
    assert SEVERAL not in _notes(g1)
