"""A test that cannot reach its significance level decides nothing: too few collectives or steps
give ``inconclusive`` with the figures, never "the run's noise"; too few steps give no interval.

Micro traces of 2 GPU ranks (u4's new-user trial, /work/trial1_inputs/gen.py): every 1,000 us
bucket, each rank runs one GEMM kernel (rank 0 400 us, rank 1 700 us, no noise) from 20 us, then
an all-reduce whose NCCL kernel starts when its GEMM ends (+5 us: the arrival) and ends for both
at 825 us. Rank 1 arrives last at every collective, 300 us after rank 0.

By hand: at each collective the last rank is rank 0 or 1 with chance 1/2, so rank 1 last at all n
has binomial p = 0.5^n: 0.0625 at n = 4, 0.0156 at 6 (both >= alpha 0.01, whatever the data),
0.0078 at 7 (< 0.01): 7 collectives are needed. What-if: transfer = 825 - 725 = 100 us on both;
recorded step 700 + 100 = 800 us, ideal (GEMM at its mean 550) 650 us: S = 800/650 = 1.231; rank
1's delays alone add 150 us to the 1000 us step (the 175 us after 825 are untraced): they cost 15.0%.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.builders import collective_args, kernel, kineto, launch, step
from tests.conftest import analyze
from traceprof.analyses._common import ratio_interval
from traceprof.engine.findings import summarize
from traceprof.engine.verdict import combined_verdict
from traceprof.ingest.ingest import ingest

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _rank(rank: int, steps: int, buckets: int = 1) -> list[dict]:
    """One rank's events: ``steps`` ProfilerSteps of ``buckets`` GEMM + all-reduce pairs each."""
    ev: list[dict] = []
    corr = 1
    gemm = 700.0 if rank == 1 else 400.0
    for s in range(steps):
        t0 = 1000.0 * buckets * s
        ev.append(step(s, t0, 1000.0 * buckets))
        for b in range(buckets):
            t, seq = t0 + 1000.0 * b, s * buckets + b + 1
            ev.append(launch(t + 12, corr))
            ev.append(kernel("volta_sgemm_128x64_nn", 7, t + 20, gemm, corr))
            comm = collective_args(seq=seq, ranks=[0, 1], nelems=1048576, out_nelems=1048576, group_size=2)
            ev.append(launch(t + 31, corr + 1))
            start = t + 20 + gemm + 5
            ev.append(kernel(NCCL, 20, start, t + 825 - start, corr + 1, **comm))
            corr += 2
    return ev


@pytest.fixture
def two_ranks(store, tmp_path):
    def make(steps: int, buckets: int = 1) -> str:
        d = tmp_path / f"s{steps}x{buckets}"
        d.mkdir()
        for r in range(2):
            kineto(d / f"rank{r}.json.gz", _rank(r, steps, buckets), rank=r, world_size=2)
        name = f"s{steps}x{buckets}"
        ingest(store, [d], run=name)
        return name

    return make


@pytest.mark.parametrize("steps", [4, 6])
def test_too_few_collectives_are_inconclusive(store, two_ranks, steps):
    run = two_ranks(steps)
    st = analyze(store, "stragglers", run)
    v = st.verdict.row(0, named=True)
    assert st.verdict.height == 1 and v["status"] == "inconclusive" and v["rank"] == 1 and not v["named"]
    p = 0.5**steps  # rank 1 last at all of them: the smallest p there is
    assert st.frame.filter(st.frame["rank"] == 1)["p_value"][0] == pytest.approx(p)
    ev = v["evidence"]
    assert ev.startswith("too few collectives to test for a straggler: rank 1 arrived last at ")
    assert f"{steps} of {steps} collectives" in ev and f"binomial p = {p:.2g}" in ev
    assert "not below 0.01: that needs 7 at chance 0.50 per collective" in ev
    assert "cost the job 15.0% of step time" in ev and "noise" not in ev
    cv = combined_verdict(store, run)
    assert cv.status == "inconclusive" and cv.stragglers == () and not cv.straggling
    assert (
        cv.text.startswith("too few collectives") and "variability" not in cv.text and "noise" not in cv.text
    )
    assert cv.figures["untested"] == 1
    # 4 or 6 steps: no interval (fewer than 5 steps, or none rests on it anyway at 6: S = 1.231 both)
    wi = analyze(store, "whatif", run).summary.row(0, named=True)
    assert wi["slowdown"] == pytest.approx(800 / 650)
    if steps < 5:
        assert wi["slowdown_lo"] is None and wi["host_slowdown_hi"] is None and not wi["straggling"]
        assert "(no 95% intervals: 4 steps are too few to resample;" in cv.text


@pytest.mark.parametrize("steps", [7, 20])
def test_enough_collectives_name_rank_1(store, two_ranks, steps):
    # 7 collectives: p = 0.5^7 = 0.0078 < 0.01; its compute above rank 0's in 7 of 7 steps: p 0.0078 < 0.05
    run = two_ranks(steps)
    v = analyze(store, "stragglers", run).verdict.row(0, named=True)
    assert (v["rank"], v["status"], v["named"], v["cause"]) == (1, "problem", True, "compute")
    cv = combined_verdict(store, run)
    assert cv.status == "problem" and cv.stragglers == (1,)
    assert f"last at {steps} of {steps} collectives" in cv.text
    # every step alike: every resample's ratio is 800/650, so the interval is that point
    assert "what-if S = 1.231 [1.231, 1.231]" in cv.text


def test_too_few_steps_for_the_cause_test(store, two_ranks):
    # 4 steps of 2 buckets: rank 1 last at 8 of 8 (p = 0.5^8 = 0.0039 < 0.01): a suspect; its compute
    # above rank 0's in 4 of 4 steps: p = 0.5^4 = 0.0625, the smallest 4 steps allow, not < 0.05
    # (5 steps are needed): inconclusive, not "within the run's noise"
    run = two_ranks(4, buckets=2)
    v = analyze(store, "stragglers", run).verdict.row(0, named=True)
    assert (v["status"], v["rank"], v["named"], v["cause"]) == ("inconclusive", 1, False, "compute")
    ev = v["evidence"]
    assert ev.startswith("too few steps to test the cause: rank 1 arrived last at 8 of 8 collectives")
    assert (
        "in 4 of 4 steps" in ev
        and "the smallest p that test can give (above the floor in all of them) is 0.062" in ev
    )
    assert "that needs 5 steps at chance 0.50 per step" in ev and "noise (the other ranks" not in ev
    assert combined_verdict(store, run).status == "inconclusive"


def test_communication_says_the_waits_are_for_an_untested_rank(store, two_ranks):
    run = two_ranks(4)
    comm = next(v for v in summarize(store, run).verdicts if v.topic == "communication")
    # the waits for rank 1 (300 us of each 1,000 us step on rank 0) are set apart; the transfer
    # (100 us, exposed on both) is communication's whatever rank 1 is
    assert comm.text.startswith(
        "exposed communication beyond waiting for rank 1 (the straggler test could not"
    )


def test_no_interval_over_too_few_steps():
    # Two steps with per-step ratios 1 and 3: a bootstrap over them only returns {1,1}, {1,3} or
    # {3,3}: its "95% interval" [1, 3] is the two step values. Below 5 steps: no interval.
    for n in (1, 2, 3, 4):
        lo, hi = ratio_interval(np.arange(1.0, n + 1.0), np.ones(n))
        assert np.isnan(lo) and np.isnan(hi)
    # 5 steps with equal ratios 1.2: every resample is 1.2, the interval that point
    assert ratio_interval(np.full(5, 1.2), np.ones(5)) == pytest.approx((1.2, 1.2))
    # 5 steps 1..5: the interval lies strictly inside [1, 5] (a resample of one step repeated has
    # chance 5^-5 = 0.03%, far below 2.5%), around the mean 3
    lo, hi = ratio_interval(np.arange(1.0, 6.0), np.ones(5))
    assert 1.0 < lo < 3.0 < hi < 5.0


def _stalled(rank: int, steps: int) -> list[dict]:
    """Rank 0: a 400 us GEMM per 1,000 us step, 1,500 us in step 5 (one stall); rank 1: 450 us in
    every step. Then an all-reduce whose kernel starts 5 us after the GEMM ends (the arrival)."""
    ev: list[dict] = []
    for s in range(steps):
        t, corr = 1000.0 * s, 2 * s + 1
        gemm = 450.0 if rank == 1 else 400.0 + (1100.0 if s == 5 else 0.0)
        ev += [
            step(s, t, 1000.0),
            launch(t + 12, corr),
            kernel("volta_sgemm_128x64_nn", 7, t + 20, gemm, corr),
        ]
        comm = {
            "Collective name": "allreduce",
            "Process Group Name": "0",
            "Process Group Ranks": "[0, 1]",
            "Group size": 2,
            "Seq": s + 1,
        }
        start = t + 20 + gemm + 5
        end = t + 20 + 1500 + 5 + 100 if s == 5 else t + 825
        ev += [launch(t + 31, corr + 1), kernel(NCCL, 20, start, end - start, corr + 1, **comm)]
    return ev


def test_no_rank_to_compare_the_cause_with_is_inconclusive(store, tmp_path):
    # Rank 1 arrives last at 99 of 100 collectives (all but step 5): p = P(X >= 99 | 100, 1/2) =
    # 101 / 2^100 = 8e-29, a suspect, late from compute, its delays costing over 1%. Rank 0 held
    # collective 6 up by 1,100 - 50 = 1,050 us > 20 x the median skew (50 us): episodic, so no
    # rank is left unsuspected to be the noise floor of rank 1's compute. Before: "ok", "no
    # unsuspected rank to compare its compute with: within the run's noise".
    for r in range(2):
        kineto(tmp_path / f"rank{r}.json.gz", _stalled(r, 100), rank=r, world_size=2)
    ingest(store, [tmp_path], run="stall")
    st = analyze(store, "stragglers", "stall")
    r1 = st.frame.filter(st.frame["rank"] == 1).row(0, named=True)
    assert (r1["last_count"], r1["p_value"]) == (99, pytest.approx(101 / 2**100))
    assert r1["cost_pct"] >= 1.0 and r1["floor_steps"] is None and not r1["named"]
    v = st.verdict.row(0, named=True)
    assert (v["status"], v["rank"], v["cause"]) == ("inconclusive", 1, "compute")
    assert v["evidence"].startswith("no rank to compare with: rank 1 arrived last at 99 of 100 collectives")
    assert v["evidence"].endswith(
        "late because of compute, but every other rank is suspected too (last significantly often, or one "
        "hold-up over 20 x the median skew), so nothing tells whether its compute is beyond the run's noise"
    )
    assert combined_verdict(store, "stall").status == "inconclusive"
