"""Issue 27, item 2: the straggler rule at the flip points of its new parts.

Hand-worked micro traces of 4 gloo ranks, 3 steps of 4 all-reduces each (12 collectives). In each
step every rank, for each of its 4 buckets, computes (aten::mm ops on the training thread), spends
some untraced host time (a gap) and enqueues its all-reduce; its gloo work runs on another thread
from its arrival to 0.5 ms after the bucket's last arrival. Rank 3 arrives last at all 12
collectives (binomial p = 0.25^12 = 6e-8): a suspect. Whether it is *named* depends on its cause
and the noise floor: the same measure on ranks 0, 1, 2.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.builders import write_rank
from tests.conftest import analyze
from traceprof.analyses._common import ratio_interval
from traceprof.engine.verdict import combined_verdict
from traceprof.ingest.ingest import ingest

STEP_MS = 80.0
MM = {"Input Dims": [[64, 128], [128, 512]], "Input type": ["float", "float"]}  # 2*64*128*512 FLOPs


def _rank(buckets: list[list[tuple[list[float], float]]]) -> list[dict]:
    """One rank: ``buckets[step][k] = (mm durations in ms, gap ms)``; step s starts at 80 s ms.
    Returns the events (arrival of a bucket = the end of its mm ops + its gap)."""
    ev = []
    for s, bks in enumerate(buckets):
        t0 = s * STEP_MS
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s + 1}",
                "pid": 1,
                "tid": 1,
                "ts": t0 * 1000,
                "dur": STEP_MS * 1000,
            }
        )
        t = t0
        for mms, gap in bks:
            for d in mms:
                ev.append(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "aten::mm",
                        "pid": 1,
                        "tid": 1,
                        "ts": round(t * 1000, 3),
                        "dur": round(d * 1000, 3),
                        "args": MM,
                    }
                )
                t += d
            t += gap
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "c10d::allreduce_",
                    "pid": 1,
                    "tid": 1,
                    "ts": round(t * 1000, 3),
                    "dur": 1,
                    "args": {"Input Dims": [[[64]], []]},
                }
            )
    return ev


def _with_gloo(runs: dict[int, list[list[tuple[list[float], float]]]]) -> dict[int, list[dict]]:
    """Each rank's events plus its gloo work: from its arrival to 0.5 ms after the bucket's last."""
    arrivals = {}
    for r, b in runs.items():
        arr = []
        for s, bks in enumerate(b):
            t = s * STEP_MS
            for mms, gap in bks:
                t += sum(mms) + gap
                arr.append(t)
        arrivals[r] = arr
    out = {}
    for r, b in runs.items():
        ev = _rank(b)
        for k, a in enumerate(arrivals[r]):
            last = max(arrivals[q][k] for q in runs)
            ev.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "gloo:all_reduce",
                    "pid": 1,
                    "tid": 2,
                    "ts": round(a * 1000, 3),
                    "dur": round((last + 0.5 - a) * 1000, 3),
                    "args": {"Input Dims": [[64]], "Input type": ["float"]},
                }
            )
        out[r] = ev
    return out


def _ingest(store, tmp_path, runs, name: str):
    for r, ev in _with_gloo(runs).items():
        write_rank(tmp_path / name / f"rank{r}.json", ev, r, world=4)
    ingest(store, [tmp_path / name], run=name)
    return analyze(store, "stragglers", name)


def _steps(bucket: tuple[list[float], float], n: int = 3) -> list[list[tuple[list[float], float]]]:
    return [[bucket] * 4 for _ in range(n)]


@pytest.mark.parametrize("noisy_step", [False, True])
def test_host_time_against_the_noise_floor(store, tmp_path, noisy_step):
    # Rank 3 per bucket: 5 ms of aten::mm, a 3 ms gap: arrives 8 ms after its previous arrival;
    # ranks 0-2: 6 ms of aten::mm, a 1 ms gap: 7 ms. Rank 3 is last at all 12 (p = 6e-8). Before
    # those arrivals it spent 1 ms less compute and 2 ms more untraced host time than the others'
    # median: the cause is untraced host time. Per step, its host time is 4 x 3 = 12 ms against
    # 4 x 1 = 4 ms on each unsuspected rank: above the floor (4 ms) in 3 of 3 steps, chance 1/4
    # each: p = (1/4)^3 = 1/64 = 0.016 < 0.05: named, by a median excess of (12 - 4) / 80 = 10%
    # of a step (steps of 80 ms). (Each window runs from the rank's previous arrival; time its own gloo work covers
    # counts as communication, not host time.) With noisy_step, rank 0 in step 2 computes 1 ms and
    # waits 6.5 ms per bucket, arriving every 7.5 ms (still before rank 3): its windows hold 6.5,
    # 6.5, 6 and 5.5 ms of host time (its gloo work, [7.5k, 8k + 0.5], covers the rest): 24.5 ms
    # that step, above rank 3's 12, so rank 3 is above the floor in 2 of 3 steps:
    # p = 3 (1/4)^2 (3/4) + (1/4)^3 = 0.156: within the noise, not named.
    runs = {r: _steps(([6.0], 1.0)) for r in range(3)}
    runs[3] = _steps(([5.0], 3.0))
    if noisy_step:
        runs[0][1] = [([1.0], 6.5)] * 4
    res = _ingest(store, tmp_path, runs, "host")
    r3 = res.frame.filter(pl.col("rank") == 3).row(0, named=True)
    assert r3["last_count"] == 12 and r3["p_value"] == pytest.approx(0.25**12)
    assert r3["cause"] == "untraced host time"
    if noisy_step:
        assert (r3["floor_steps_won"], r3["floor_steps"]) == (2, 3)
        assert r3["floor_p_value"] == pytest.approx(3 * 0.25**2 * 0.75 + 0.25**3)
        assert not r3["named"] and res.verdict["evidence"][0].startswith("no straggler: rank 3")
        assert "within the run's noise" in res.verdict["evidence"][0]
        v = combined_verdict(store, "host")
        assert v.status == "ok" and v.stragglers == ()
    else:
        assert (r3["floor_steps_won"], r3["floor_steps"]) == (3, 3)
        assert r3["floor_p_value"] == pytest.approx(1 / 64)
        assert r3["excess_pct"] == pytest.approx(100 * (12 - 4) / 80)
        assert r3["named"] and res.verdict["cause"][0] == "untraced host time"
        v = combined_verdict(store, "host")
        assert v.status == "problem" and v.stragglers == (3,) and v.cause == "rank"


def test_above_the_floor_by_a_hair_is_the_floors_spread(store, tmp_path):
    # As above, but rank 0 is nearly as slow as rank 3 (a core-mate under the same load): per
    # bucket ranks 1-2 compute 6 ms and wait 1 ms, rank 0 6 ms and 2.9 ms, rank 3 6 ms and 3 ms.
    # Rank 3 arrives 0.1 ms after rank 0 at each bucket: last at all 12 (p = 6e-8), late from
    # untraced host time (3 ms against the others' median 1 ms before each arrival), and its host
    # time per step, 4 x 3 = 12 ms, is above the floor, rank 0's 4 x 2.9 = 11.6 ms, in 3 of 3 steps
    # (p = 1/64 < 0.05), but by (12 - 11.6) / 80 = 0.5% of a step: under min_cost_pct (1%), the
    # floor's own spread, so it is not named though its delays cost more than 1% (calibration:
    # a healthy rank named at +0.7% of a step, costing 34.7%).
    runs = {r: _steps(([6.0], 1.0)) for r in (1, 2)}
    runs[0] = _steps(([6.0], 2.9))
    runs[3] = _steps(([6.0], 3.0))
    res = _ingest(store, tmp_path, runs, "hair")
    r3 = res.frame.filter(pl.col("rank") == 3).row(0, named=True)
    assert r3["last_count"] == 12 and r3["p_value"] == pytest.approx(0.25**12)
    assert r3["cause"] == "untraced host time"
    assert (r3["floor_steps_won"], r3["floor_steps"]) == (3, 3)
    assert r3["floor_p_value"] == pytest.approx(1 / 64)
    assert r3["excess_pct"] == pytest.approx(100 * (12 - 11.6) / 80)
    assert r3["cost_pct"] >= 1.0  # material: only the size of its excess over the floor keeps it unnamed
    assert not r3["named"] and res.verdict["evidence"][0].startswith("no straggler: rank 3")
    assert (
        "by a median +0.5% of a step (naming needs 1% or more): within the run's noise"
        in (res.verdict["evidence"][0])
    )
    v = combined_verdict(store, "hair")
    assert v.status == "ok" and v.stragglers == ()


@pytest.mark.parametrize("extra_on", ["rank3", "every rank"])
def test_extra_work_names_a_compute_straggler_uniform_work_does_not(store, tmp_path, extra_on):
    # Every rank per bucket runs 5 ms of aten::mm and, the extra work, a second 2 ms aten::mm
    # (rank3: only rank 3; every rank: all of them); ranks 0-2 without it compute 6 ms, with it
    # 4 + 2 ms, and wait 1 ms: 7 ms per bucket. Rank 3 computes 5 + 2 = 7 ms and waits 0.5 ms:
    # 7.5 ms, last at all 12. In step 2 rank 0 computes 7.2 ms and waits 0.1 ms (7.3 ms, still
    # before rank 3): its 4 x 7.2 = 28.8 ms of compute that step exceed rank 3's 28 ms, so rank 3's
    # compute is above the floor in 2 of 3 steps (p = 0.156): timing alone cannot name it. With
    # the extra matmul on rank 3 only, it runs 8 aten::mm per step where the others run 4: 2x the
    # FLOPs (every call is (64,128) @ (128,512)): +100% FLOPs, exact: named. With the extra
    # matmul on every rank, all run 8 per step: the same work, so no rank is a straggler from it.
    extra = extra_on == "rank3"
    runs = {r: _steps(([6.0], 1.0) if extra else ([4.0, 2.0], 1.0)) for r in range(3)}
    runs[0][1] = [([7.2], 0.1) if extra else ([5.2, 2.0], 0.1)] * 4
    runs[3] = _steps(([5.0, 2.0], 0.5))
    res = _ingest(store, tmp_path, runs, "work")
    r3 = res.frame.filter(pl.col("rank") == 3).row(0, named=True)
    assert r3["last_count"] == 12 and r3["cause"] == "compute"
    assert (r3["floor_steps_won"], r3["floor_steps"]) == (2, 3)
    if extra:
        assert r3["extra_work_pct"] == pytest.approx(100.0) and r3["named"]
        assert "+100.0% FLOPs per step (+4 aten::mm per step)" in res.verdict["evidence"][0]
    else:
        assert r3["extra_work_pct"] is None and not r3["named"]
        assert combined_verdict(store, "work").stragglers == ()


def test_ratio_interval_flip_point():
    # Two steps with per-step ratios 1 and 3 (den 1 each): a resample of 2 steps is {1,1} (ratio
    # 1, chance 1/4), {1,3} (2, 1/2) or {3,3} (3, 1/4): the 2.5th and 97.5th percentiles would be
    # the two step values, no interval at all: below 5 steps there is none (nan), so nothing rests
    # on one (test_straggler_power).
    assert all(np.isnan(x) for x in ratio_interval(np.array([1.0, 3.0]), np.array([1.0, 1.0])))
    # 5 steps with ratios 1.2 or 1.3: every resample lies in [1.2, 1.3]: the low end >= 1.2 > 1.1
    lo, hi = ratio_interval(np.array([1.2, 1.3, 1.2, 1.3, 1.2]), np.ones(5))
    assert 1.2 <= lo <= hi <= 1.3
    # one step, no steps: nothing
    assert all(np.isnan(x) for x in ratio_interval(np.array([2.0]), np.array([1.0])))
    assert all(np.isnan(x) for x in ratio_interval(np.array([]), np.array([])))


def test_variability_is_not_a_problem(store, tmp_path):
    # No rank is last more often than chance: in step s, rank s computes 12 ms per bucket where the
    # others compute 6 (each rank slow in its own step, rank 3 never): the job is slower than its
    # ideal from op-time spread alone (every op at its mean would be faster), but there is no rank,
    # group or stage to blame. Ranks 0, 1, 2 are last at 4 collectives each (p = 0.35): no suspect.
    # What-if: each bucket's aten::mm at its mean over 4 ranks x 3 steps, (3 x 12 + 9 x 6) / 12 =
    # 7.5 ms; a step without host gaps takes the slow rank's 4 x 12 ms + the last 0.5 ms transfer
    # recorded and 4 x 7.5 + 0.5 ideal: S = 48.5 / 30.5 = 1.590 in every step; 3 steps are too few
    # for an interval (test_straggler_power), so not even "straggling" is shown, and the verdict
    # is the run's variability.
    runs = {r: [[(([12.0] if s == r else [6.0]), 1.0)] * 4 for s in range(3)] for r in range(4)}
    _ingest(store, tmp_path, runs, "spread")
    wi = analyze(store, "whatif", "spread")
    v = combined_verdict(store, "spread")
    assert wi.summary["slowdown"][0] == pytest.approx(48.5 / 30.5)  # slower than its ideal ...
    assert wi.summary["slowdown_lo"][0] is None and not wi.summary["straggling"][0]
    assert v.status == "ok" and not v.straggling and v.stragglers == ()  # ... but no cause: not a problem
    assert "the run's variability, not a problem" in v.text
    assert "(no 95% intervals: 3 steps are too few to resample;" in v.text
    assert "too few steps for an interval, so not even that is shown" in v.text
