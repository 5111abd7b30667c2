"""Ranks whose process drives several GPUs: every figure that sums GPU busy time is per device (the
rank's figure its devices' summed), every other one says that it merged the rank's devices.

The run (``tests.builders.two_gpu_ranks``): 2 NCCL ranks, each driving GPUs 0 and 1; step s
(b = 1000 s us, 3 steps, ProfilerStep [b, b + 900]) holds a GEMM on device 0 [b + 10, b + 410], a
GEMM on device 1 [b + 210, b + 610] and an all-reduce on device 0 [b + 450, b + 550]. By hand, per
device: the all-reduce is exposed whole (device 0 computes nothing in [450, 550]): 100 us a step,
300 us a rank, 600 us the run. Merged over the rank (before), device 1's GEMM [210, 610] "hid" it: 0.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from tests.builders import SHIFT_US, collective_args, launch, stream_kernel, two_gpu_ranks
from tests.conftest import analyze, case
from traceprof.engine import timing
from traceprof.engine.timeline import step_timeline
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


def test_parallelism_exposed_per_axis_is_per_device(two: Store) -> None:
    # dp (the world group [0, 1]): comm 300 us a rank, exposed per device 300 us a rank, 600 us in
    # all, none hidden (merged, before: exposed 0, hidden 600 us)
    p = analyze(two, "parallelism")
    dp = p.frame.filter(pl.col("axis") == "dp").row(0, named=True)
    assert (dp["comm_ns"], dp["exposed_comm_ns"], dp["hidden_ns"]) == (600 * US, 600 * US, 0)
    assert sorted(p.axis_ranks.select("rank", "comm_ns", "exposed_comm_ns").rows()) == [
        (0, 300 * US, 300 * US),
        (1, 300 * US, 300 * US),
    ]
    assert "rank(s) 0, 1 drive several GPUs: their communication per axis is per device" in _notes(p)


def test_parallelism_on_the_case_matches_gaps(tmp_path: Path) -> None:
    # dp_nccl_both_devices: the two broadcasts (no group: unassigned) are exposed on their devices,
    # 200 + 200 = 400 us, as gaps' total (merged, before: 0, both "hidden" by the other device's GEMM)
    from tests.ingest.test_shapes import _dp_nccl_both_devices

    s = _dp_nccl_both_devices(tmp_path)
    p = analyze(s, "parallelism")
    assert p.frame.select("axis", "comm_ns", "exposed_comm_ns").rows() == [("unassigned", 400 * US, 400 * US)]
    assert int(analyze(s, "gaps").ranks["exposed_ns"].sum()) == 400 * US


def test_pipeline_merges_a_ranks_devices_and_says_so(two: Store) -> None:
    # -p mesh=pp:2: stage r = rank r. Its compute per step is the union over its devices,
    # [10, 410] u [210, 610] = 600 us (wall clock), not 400 + 400; noted.
    p = analyze(two, "parallelism", mesh="pp:2")
    assert p.stages.select("stage", "compute_ns").rows() == [(0, 600 * US), (1, 600 * US)]
    assert (
        "rank(s) 0, 1 drive several GPUs: the pipeline and slow-stage figures take their devices merged"
        in (_notes(p))
    )


def test_stragglers_merge_a_ranks_devices_and_say_so(store: Store, tmp_path: Path) -> None:
    # compute per step: [10, 410] u [210, 610] = 600 us on each rank. Each step also gets the same
    # all-reduce (pg "0", Seq s) on device 1 at [620, 720] us on rank 0 and [650, 750] on rank 1:
    # a rank's arrival is its first device's (450 us on both: skew 0; rank 1's device 1, 30 us
    # late, is not seen) and its end its last device's (720 / 750: transfer 270 / 300 us). Noted.
    folder = two_gpu_ranks(tmp_path / "run")
    name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    for r in (0, 1):
        path = folder / f"rank{r}.json"
        doc = json.loads(path.read_text())
        for s in range(3):
            b, c = 1000.0 * s + SHIFT_US + 30 * r, 10 * s + 4
            ar = collective_args(seq=s, ranks=[0, 1], nelems=1 << 20, out_nelems=1 << 20, group_size=2)
            doc["traceEvents"] += [
                {**launch(b + 615, c), "args": {"correlation": c, **ar}},
                {**stream_kernel(name, b + 620, 100, c, stream=20, device=1, **ar), "pid": 1},
            ]
        path.write_text(json.dumps(doc))
    ingest(store, [folder])
    st = analyze(store, "stragglers")
    assert st.frame.select("rank", "compute_ns").rows() == [(0, 600 * US), (1, 600 * US)]
    assert st.instances["skew_ns"].to_list() == [0, 0, 0]
    assert sorted(set(st.waits.select("rank", "transfer_ns").rows())) == [(0, 270 * US), (1, 300 * US)]
    assert "rank(s) 0, 1 drive several GPUs: their devices are merged: compute per step" in _notes(st)
    assert "at a collective their arrival is their first device's and its end their last device's" in _notes(
        st
    )


def test_timing_samples_are_per_device(two: Store) -> None:
    # per (rank, step): exposed communication 100 us (device 0's all-reduce; device 1 has none);
    # idle: device 0's window [10, 550] = 540 us less busy 400 + 100 = 40 us, device 1's [210, 610]
    # fully busy: 40 us. Merged (before): one window [10, 610] always busy, exposed 0, idle 0.
    t = timing.profile(two, two.resolve_run(None))
    assert t.samples.select("exposed_comm_ns", "idle_ns").unique().rows() == [(100 * US, 40 * US)]
    assert any(SEVERAL in n for n in t.notes)


def test_timeline_says_it_merges_a_ranks_devices(two: Store) -> None:
    tl = step_timeline(two, two.resolve_run(None))
    assert not isinstance(tl, str) and tl.ranks == (0, 1)
    assert tl.note.endswith("rank(s) 0, 1 drive several GPUs: each one's lane merges its devices "
                            "(its communication exposed only where none of them computes; per device: gaps)")  # fmt: skip


def test_one_gpu_ranks_get_no_note(store: Store) -> None:
    ingest(store, [case("one_collective_per_step")])
    run = store.resolve_run(None)
    for name in ("parallelism", "stragglers"):
        assert SEVERAL not in _notes(analyze(store, name))
    tl = step_timeline(store, run)
    assert not isinstance(tl, str) and SEVERAL not in tl.note
    assert not any(SEVERAL in n for n in timing.profile(store, run).notes)


def test_stragglers_device_note_reads_events_not_the_kernels_view(
    two: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # By hand (module doc): ranks 0 and 1 each hold GEMMs on devices 0 and 1 -> the note names 0, 1.
    # Its query reads events (rank, device) alone: the kernels view would also join every GPU row
    # to its launch call and number a launch's rows (0.77 s of CPU on 8 x 1M for a note).
    from traceprof.analyses import stragglers

    asked: list[str] = []
    real = Store.sql

    def spy(self: Store, sql: str, *args: object, **kw: object) -> pl.DataFrame:
        asked.append(sql)
        return real(self, sql, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "sql", spy)
    note = stragglers._multi_device_note(two, two.resolve_run(None))
    assert note is not None and str(note).startswith("rank(s) 0, 1 drive several GPUs")
    assert asked and not any(re.search(r"\bFROM\s+kernels\b", q) for q in asked)
