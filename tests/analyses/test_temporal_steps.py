"""temporal's per-step table on a hand-made trace whose all-reduce crosses a step boundary: the steps'
parts partition the rank's time (t14 D5)."""

from __future__ import annotations

from tests.builders import collective_args, kernel, kineto, launch, step
from tests.conftest import analyze
from traceprof.ingest.ingest import ingest

# One rank, times in us. ProfilerStep#1 [0, 100), #2 [100, 200). Launches (the step is the launch's):
#   step 1: K1 compute [10, 60), N1 all_reduce [60, 130) (runs 30 us into step 2, under K2 for 20 of them);
#   step 2: K2 compute [110, 150), N2 all_reduce [160, 170);
#   none (launched at 210, after the last step): K3 compute [220, 230).
# Rank: window [10, 230) = 220; busy [10, 150) + [160, 170) + [220, 230) = 160, idle 60; compute
#   50 + 40 + 10 = 100; non-compute 160 - 100 = 60 (N1's [60, 110) and N2).
# Step spans (each ends where its activity ends, the next starts there): 1 = [10, 130) (K1, N1),
#   2 = [130, 170) (K2, N2 launched in it end by 170). All activity cut to the spans:
#   step 1: K1 50 + K2's [110, 130) 20 = compute 70; busy [10, 130) = 120, idle 0, non-compute 50
#     (N1's [60, 110): its [110, 130) is hidden behind K2, as overlap says: exposed 50).
#   step 2: K2's [130, 150) = compute 20, N2 10, busy 30, idle 10, non-compute 10 (overlap: exposed 10).
#   Sum: window 160, compute 90, non-compute 60, idle 10; outside every span [170, 230): compute 10
#   (K3), idle 50. So 160 + 60 = 220, 90 + 10 = 100, 60 = 60, 10 + 50 = 60.
# Before (each step the span of the activity launched in it): step 1 [10, 130) compute 50,
#   non-compute 70 (all of N1 past K1); step 2 [110, 170) = 60, compute 40, non-compute 10, idle 10:
#   non-compute 80 over the steps against the rank's 60.
AR = collective_args("allreduce", pg="0", nelems=1024, out_nelems=1024)
EVENTS = [
    step(1, 0, 100),
    step(2, 100, 100),
    launch(5, 1, 0.5),
    launch(55, 2, 0.5),
    launch(105, 3, 0.5),
    launch(155, 4, 0.5),
    launch(210, 5, 0.5),
    kernel("K1", 7, 10, 50, 1),
    kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 20, 60, 70, 2, **AR),
    kernel("K2", 7, 110, 40, 3),
    kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 20, 160, 10, 4, **AR),
    kernel("K3", 7, 220, 10, 5),
]
PARTS = ("window_ns", "compute_ns", "non_compute_ns", "idle_ns")


def test_temporal_steps_partition_the_rank_with_a_comm_across_the_boundary(store, tmp_path):
    kineto(tmp_path / "rank0.json.gz", EVENTS)
    ingest(store, [tmp_path / "rank0.json.gz"], run="x")
    te = analyze(store, "temporal", "x")
    rank = te.frame.row(0, named=True)
    assert tuple(rank[c] for c in PARTS) == (220_000, 100_000, 60_000, 60_000)  # unchanged
    steps = {r["step"]: r for r in te.steps.iter_rows(named=True)}
    assert sorted(steps) == [1, 2]
    assert tuple(steps[1][c] for c in PARTS) == (120_000, 70_000, 50_000, 0)
    assert tuple(steps[2][c] for c in PARTS) == (40_000, 20_000, 10_000, 10_000)
    assert steps[2]["idle_pct"] == 25.0
    # non-compute is only communication here: it is overlap's exposed communication, step by step
    ov = {r["step"]: r["exposed_comm_ns"] for r in analyze(store, "overlap", "x").steps.iter_rows(named=True)}
    assert {s: steps[s]["non_compute_ns"] for s in steps} == ov == {1: 50_000, 2: 10_000}


def test_temporal_steps_note_the_activity_outside_every_step(store, tmp_path):
    """t17: the steps table left out activity outside every step span without a word. Hand value
    (the trace above): rank window 220 us less the spans 120 + 40 = 160 us: [170, 230) = 60 us (K3,
    launched after the last step, 10 us, and the idle around it) is outside, named with the window."""
    kineto(tmp_path / "rank0.json.gz", EVENTS)
    ingest(store, [tmp_path / "rank0.json.gz"], run="x")
    te = analyze(store, "temporal", "x")
    said = [n for n in te.notes if n.startswith("activity outside every step span")]
    assert len(said) == 1 and said[0].endswith(": rank 0 60 us of 220 us"), te.notes


def test_temporal_steps_tiled_whole_say_nothing(store, tmp_path):
    """Without K3 the spans [10, 130) + [130, 170) = 160 us are the whole window [10, 170): no note."""
    kineto(tmp_path / "rank0.json.gz", [e for e in EVENTS if e.get("name") != "K3"])
    ingest(store, [tmp_path / "rank0.json.gz"], run="x")
    te = analyze(store, "temporal", "x")
    assert not [n for n in te.notes if n.startswith("activity outside every step span")], te.notes
