"""temporal's and overlap's class measures: shared in a report session, and temporal's per-device
measures taken from the per-rank ones where each rank is one device.

Before, temporal and overlap each swept the run's activity per rank and per (rank, step)
(``intervals.class_measures``: 1.1 s of a report on 8 x 1 M events, done twice), and temporal
swept the GPU rows again per (rank, device). The straightforward computation is kept here as the
reference: the results must be equal frame for frame.
"""

from __future__ import annotations

import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.conftest import case, sample_run
from traceprof.analyses import overlap, temporal
from traceprof.engine import intervals, session
from traceprof.engine.analysis import FrameResult
from traceprof.ingest.ingest import ingest


def _old_device_measures(act: pl.DataFrame) -> pl.DataFrame:
    """temporal's per-device measures as it computed them before: a sweep of the GPU rows."""
    gpu = act.filter(pl.col("device_kind") == "gpu").select("rank", "device", "class", "start_ns", "end_ns")
    return intervals.class_measures(gpu, ["rank", "device"]) if not gpu.is_empty() else pl.DataFrame()


def _activity(seed: int, kind: str) -> pl.DataFrame:
    """A random activity frame sorted by rank, start and end: 4 ranks of overlapping rows of three
    classes. ``kind``: ``one`` (GPU rows, one device per rank), ``null`` (one null device per
    rank), ``multi`` (a rank on two devices), ``cpu`` (a rank of CPU rows beside GPU ranks)."""
    rnd = random.Random(seed)
    rows = []
    for rank in range(4):
        for _ in range(rnd.randint(1, 60)):
            start = rnd.randint(0, 1_000)
            device: int | None = rank % 2
            dk = "gpu"
            if kind == "null":
                device = None
            elif kind == "multi" and rank == 1:
                device = rnd.choice([0, 1])
            elif kind == "cpu" and rank == 2:
                device, dk = None, "cpu"
            rows.append(
                {
                    "rank": rank,
                    "class": rnd.choice(["compute", "comm", "memory"]),
                    "start_ns": start,
                    "end_ns": start + rnd.randint(0, 200),
                    "step": rnd.choice([None, 1, 2]),
                    "device_kind": dk,
                    "device": device,
                }
            )
    schema = {"rank": pl.Int32, "step": pl.Int32, "device": pl.Int32}
    return pl.DataFrame(rows, schema_overrides=schema).sort("rank", "start_ns", "end_ns")


@pytest.mark.parametrize("kind", ["one", "null", "multi", "cpu"])
@pytest.mark.parametrize("seed", range(5))
def test_device_measures_equal_a_sweep_of_the_gpu_rows(seed, kind):
    act = _activity(seed, kind)
    multi = bool(temporal.multi_device_ranks(act))
    assert multi == (kind == "multi" and act.filter(pl.col("rank") == 1)["device"].n_unique() > 1)
    got = temporal._device_measures(act, intervals.class_measures(act, ["rank"]), multi)
    assert_frame_equal(got, _old_device_measures(act), check_exact=True)


def _standalone(store, name: str, run_id: int) -> FrameResult:
    """``name`` run as ``traceprof analyze`` runs it (its own session, one analysis)."""
    with session.Session(store, many=False) as s:
        return s.analyze(name, str(run_id))


@pytest.mark.parametrize("source", ["two_gpus_one_process", "sample"])
def test_a_report_session_computes_each_grouping_once_with_the_standalone_results(store, source, monkeypatch):
    if source == "sample":
        run_id = sample_run(store, "straggler_rank2")
    else:
        ingest(store, [case(source)], run="r")
        run_id = 1
    alone = {n: _standalone(store, n, run_id) for n in ("temporal", "overlap")}
    calls: list[tuple[str, ...]] = []
    sweep = intervals.class_measures

    def counted(act, by):
        calls.append(tuple(by))
        return sweep(act, by)

    monkeypatch.setattr(intervals, "class_measures", counted)
    monkeypatch.setattr(temporal, "class_measures", counted)
    monkeypatch.setattr(overlap, "class_measures", counted)
    with session.Session(store, many=True) as s:
        both = {n: s.analyze(n, str(run_id)) for n in ("temporal", "overlap")}
    # one sweep per grouping for both analyses (chunked sweeps call it again per piece: the top
    # calls are what counts); the per-device measures come from the per-rank ones on a run of one
    # device per rank; on a process of two GPUs temporal and overlap each sweep its GPU rows
    devices = [("rank", "device")] * 2 if source == "two_gpus_one_process" else []
    assert [c for c in calls if c in {("rank",), ("rank", "step"), ("rank", "device")}] == [
        ("rank",),
        ("rank", "step"),
        *devices,
    ]
    for n in both:
        assert both[n].notes == alone[n].notes
        for k, frame in alone[n].frames().items():
            assert_frame_equal(both[n].frames()[k], frame, check_exact=True)
