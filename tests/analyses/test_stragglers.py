"""stragglers: arrival skew, last arrivals, waits, verdict on micro, sample and production traces."""

from __future__ import annotations

import gzip
import json
import math

import polars as pl
import pytest

from tests.builders import BASE, write_ndtimeline, write_rank, write_skewed_pair
from tests.conftest import SAMPLES, analyze, corpus
from traceprof.core.errors import UsageError
from traceprof.engine.verdict import combined_verdict
from traceprof.ingest.ingest import ingest


def _rank(arrivals: list[int], compute: list[tuple[int, int]], lasts: list[int]) -> list[dict]:
    """ProfilerStep#1 over [0, 1000] us; training-thread compute ops (aten::mm) and, per
    collective, its c10d enqueue at the arrival and gloo work [last arrival + 1, + 20] us."""
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 1000,
        }
    ]
    ev += [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": a, "dur": b - a}
        for a, b in compute
    ]
    for arr, last in zip(arrivals, lasts, strict=True):
        ev.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "c10d::allreduce_",
                "pid": 1,
                "tid": 1,
                "ts": arr,
                "dur": 1,
                "args": {"Input Dims": [[[64]], []]},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "gloo:all_reduce",
                "pid": 1,
                "tid": 2,
                "ts": last + 1,
                "dur": 19,
                "args": {"Input Dims": [[64]], "Input type": ["float"]},
            }
        )
    return ev


def test_micro_trace_by_hand(store, tmp_path):
    # Arrivals (us): rank 0 at 100, 200, 300; rank 1 at 110, 210, 310; rank 2 at 400, 450, 500,
    # after 300 us it spent outside any traced op (e.g. a sleep) following its first op.
    arr = {0: [100, 200, 300], 1: [110, 210, 310], 2: [400, 450, 500]}
    comp = {
        0: [(0, 100), (105, 200), (205, 300)],
        1: [(0, 110), (115, 210), (215, 310)],
        2: [(0, 100), (405, 450), (455, 500)],
    }
    lasts = [400, 450, 500]
    for r in range(3):
        write_rank(tmp_path / "run" / f"r{r}.json", _rank(arr[r], comp[r], lasts), r, world=3)
    ingest(store, [tmp_path / "run"])
    # Rank 2 is last at all 3 of 3 with 3 ranks: chance 1/3 each, binomial p = (1/3)^3 = 0.037,
    # not below the default alpha 0.01 (three collectives cannot show it): not named by default.
    res = analyze(store, "stragglers", "run")
    assert res.frame.filter(res.frame["rank"] == 2)["p_value"].item() == pytest.approx(1 / 27)
    assert res.verdict["named"].to_list() == [False]
    # The noise floor (traceprof.analyses._cause): one step, so rank 2's untraced host time (300 us, the others
    # none) above both others' in 1 of 1 step has p = 1/3: a single step cannot show a cause beyond
    # the noise at 0.05, so the test is loosened here too (cause_alpha 0.5) to reach the figures.
    res = analyze(store, "stragglers", "run", alpha=0.05, cause_alpha=0.5)
    per = {r["rank"]: r for r in res.frame.iter_rows(named=True)}
    assert (per[2]["floor_steps_won"], per[2]["floor_steps"], per[2]["floor_p_value"]) == (
        1,
        1,
        pytest.approx(1 / 3),
    )
    # Rank 2 is last at all 3. The others wait from their arrivals to rank 2's, each copy ending at
    # last + 20 (no clip): rank 0 [100, 400) u [200, 450) u [300, 500) = [100, 500), 400 us; rank 1
    # [110, 500), 390 us; caused by rank 2: 400 + 390 = 790 us. (The per-instance sums, 750 + 720 =
    # 1470 us, count the three collectives in flight at once three times.)
    assert per[2]["last_arrival_share"] == 1.0 and per[0]["last_arrival_share"] == 0.0
    assert per[2]["wait_caused_ns"] == 790_000 and per[0]["wait_caused_ns"] == 0
    assert (per[0]["wait_ns"], per[1]["wait_ns"], per[2]["wait_ns"]) == (400_000, 390_000, 0)
    assert res.waits.group_by("rank").agg(pl.col("wait_ns").sum()).sort("rank")["wait_ns"].to_list() == [
        750_000,
        720_000,
        0,
    ]
    # Lateness = arrival - instance median (110, 210, 310): 290, 240, 190 -> median 240 us. Pace:
    # spacing of a rank's arrivals, [100, 100, 100, 100, 50, 50] -> 100 us, so 240%.
    assert per[2]["median_lateness_ns"] == 240_000 and per[2]["late_pct"] == pytest.approx(240.0)
    # Hold-up: the union of [next latest arrival, rank 2's arrival] = [110, 400] u [210, 450] u
    # [310, 500] = [110, 500]: 390 us (a sum would count 720 us, the same wait three times).
    assert per[2]["holdup_ns"] == 390_000 and per[0]["holdup_ns"] == 0
    # Transfer = end (last + 20) - last arrival = 20 us.
    assert per[1]["transfer_ns"] == 20_000
    (v,) = res.verdict.iter_rows(named=True)
    # Before its first late arrival rank 2 spent 300 us outside traced ops, the others none.
    assert (v["rank"], v["named"], v["cause"]) == (2, True, "untraced host time")
    assert v["other_excess_ns"] >= 300_000 - 20_000
    inst = res.instances.rows(named=True)
    assert [i["skew_ns"] for i in inst] == [300_000, 250_000, 200_000]
    assert [i["first_arrival_ns"] - BASE for i in inst] == [100_000, 200_000, 300_000]


def test_waits_at_overlapping_collectives_are_wall_clock(store, tmp_path):
    # Two ranks; rank 0 arrives at 100 and 120 us at two all-reduces in flight at once (DDP buckets),
    # rank 1 at 300 and 340; then one more, rank 0 at 600, rank 1 at 650. Each copy's gloo work runs
    # [last + 1, last + 20] us (the builder), so its end (last + 20) is after the last arrival.
    arr = {0: [100, 120, 600], 1: [300, 340, 650]}
    comp = {0: [(0, 100)], 1: [(0, 300), (321, 340), (361, 650)]}
    lasts = [300, 340, 650]
    for r in range(2):
        write_rank(tmp_path / "run" / f"r{r}.json", _rank(arr[r], comp[r], lasts), r, world=2)
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "stragglers", "run")
    per = {r["rank"]: r for r in res.frame.iter_rows(named=True)}
    # Rank 0 waits [100, 300) and [120, 340): at the same time, so [100, 340) = 240 us of wall
    # clock, not 200 + 220 = 420; then [600, 650), 50 us: 290 us in all (the per-instance sum, 470
    # us, stays in the waits table). Rank 1, last at all three, never waits and caused those 290 us.
    assert (per[0]["wait_ns"], per[1]["wait_ns"]) == (290_000, 0)
    assert (per[1]["wait_caused_ns"], per[0]["wait_caused_ns"]) == (290_000, 0)
    assert res.waits.filter(pl.col("rank") == 0)["wait_ns"].to_list() == [200_000, 220_000, 50_000]
    # Within rank 0's window: its activity runs from 0 (aten::mm) to 670 us (the last gloo end).
    window = analyze(store, "temporal", "run").frame.filter(pl.col("rank") == 0)["window_ns"].item()
    assert window == 670_000 and per[0]["wait_ns"] <= window


def _share_from_json(run: str, rank: int) -> float:
    """Last-arrival share of ``rank`` computed from the raw traces: the k-th c10d::allreduce_
    (by ts) of every rank is the k-th instance; arrival = base + ts."""
    arrivals = []
    for r in range(4):
        doc = json.loads(gzip.decompress((SAMPLES / run / f"rank{r}.trace.json.gz").read_bytes()))
        ts = sorted(e["ts"] for e in doc["traceEvents"] if e.get("name") == "c10d::allreduce_")
        arrivals.append([doc["baseTimeNanoseconds"] + round(t * 1000) for t in ts])
    lasts = [max(range(4), key=lambda r, k=k: arrivals[r][k]) for k in range(len(arrivals[0]))]
    return lasts.count(rank) / len(lasts)


def _assert_wall_clock_waits(store, run: str, res) -> None:
    """Invariant on a sample run: each rank's wait (``wait_ns``) is the union of its waits as plain
    SQL computes it (islands of [arrival, last arrival) ended at the copy's end) and never longer
    than its window (temporal); the wait a rank caused is at most the other ranks' windows together.
    On straggler_rank2 the per-instance sum was 386.5 ms for rank 0, whose window is 223.6 ms: the
    DDP buckets' all-reduces run at the same time."""
    import duckdb

    window = dict(analyze(store, "temporal", run).frame.select("rank", "window_ns").iter_rows())
    for r in res.frame.iter_rows(named=True):
        assert r["wait_ns"] <= window[r["rank"]], (run, r["rank"], r["wait_ns"], window[r["rank"]])
        others = sum(v for k, v in window.items() if k != r["rank"])
        assert r["wait_caused_ns"] <= others, (run, r["rank"])
    w = res.waits.to_arrow()  # noqa: F841 (read by the SQL below)
    union = dict(
        duckdb.sql(
            """WITH iv AS (SELECT rank, arrival_ns AS s,
                          least(arrival_ns + wait_ns, coalesce(end_ns, arrival_ns + wait_ns)) AS e
                          FROM w WHERE wait_ns > 0),
               o AS (SELECT *, max(e) OVER (PARTITION BY rank ORDER BY s, e
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM iv WHERE e > s),
               k AS (SELECT *, sum(CASE WHEN before IS NULL OR s > before THEN 1 ELSE 0 END)
                            OVER (PARTITION BY rank ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island FROM o)
               SELECT rank, sum(hi - lo)::BIGINT FROM (SELECT rank, island, min(s) AS lo, max(e) AS hi
                      FROM k GROUP BY rank, island) GROUP BY rank"""
        ).fetchall()
    )
    assert dict(res.frame.select("rank", "wait_ns").iter_rows()) == {
        r: union.get(r, 0) for r in res.frame["rank"]
    }


@pytest.mark.parametrize(
    "run, slow",
    [
        ("straggler_rank2", 2),
        ("straggler_rank3", 3),
        ("sleep_rank1", 1),
        ("normal", None),
        ("normal_repeat", None),
        ("clean", None),
    ],
)
def test_samples_verdict_follows_the_slowed_rank(store, run, slow):
    if not (SAMPLES / run / "rank3.trace.json.gz").exists():
        pytest.skip(f"sample_traces/{run} not recorded")
    ingest(store, [SAMPLES / run], run=run)
    res = analyze(store, "stragglers", run)
    _assert_wall_clock_waits(store, run, res)
    named = res.frame.filter("named")["rank"].to_list()
    if slow is None:
        assert named == [] and "within the run's noise" in res.notes[-1]
        # The most frequent last arrival (binomial p = P(X >= k | n, 1/4)): normal: rank 0 (the
        # TCPStore host) 7 of 12, p = 0.0143 (not < 0.01); normal_repeat: rank 0 9 of 12, p =
        # 0.00039, significant, but its delays cost 3.5% (< 5%); clean: rank 1 7 of 15, p = 0.0566.
        top = res.frame.sort("p_value").row(0, named=True)
        rank, last, n, p = {
            "normal": (0, 7, 12, 0.01425),
            "normal_repeat": (0, 9, 12, 0.000392),
            "clean": (1, 7, 15, 0.0566),
        }[run]
        assert (top["rank"], top["last_count"], top["instances"]) == (rank, last, n)
        assert top["p_value"] == pytest.approx(p, rel=2e-3)
        assert top["cost_pct"] < 5
        return
    assert named == [slow] and res.verdict["rank"].to_list() == [slow]
    row = res.frame.filter(res.frame["rank"] == slow).row(0, named=True)
    # Same share as the plain-JSON recomputation (single host: no clock offset is applied).
    assert row["last_arrival_share"] == pytest.approx(_share_from_json(run, slow))
    assert row["last_arrival_share"] == res.frame["last_arrival_share"].max()
    # straggler_rank2 (30 ms sleep before backward): last at 12 of 12, p = 0.25^12 = 6e-8;
    # straggler_rank3 (15 ms, on a core shared with rank 1): 8 of 12, p = 0.0028; sleep_rank1 (50 ms
    # before each step): 13 of 15, p = 9.2e-7. Their delays alone cost 24%, 6.9% and 32% of step
    # time (>= 5%).
    last, n = {2: (12, 12), 3: (8, 12), 1: (13, 15)}[slow]
    assert (row["last_count"], row["instances"]) == (last, n) and row["p_value"] < 0.003
    assert row["cost_pct"] >= 5
    assert row["wait_caused_ns"] == res.frame["wait_caused_ns"].max()
    # The slowed rank sleeps outside any traced op: that, not compute, made it late.
    assert res.verdict["cause"].to_list() == ["untraced host time"]


def test_flight_recorder_only_run_names_rank2_with_compute_na(store):
    # Flight Recorder dumps hold collectives but no compute: compute_z is null, and the verdict
    # must still name the slowed rank 2 (its 30 ms sleep) with compute shown as n/a (it crashed
    # formatting None with :.1f).
    files = sorted((SAMPLES / "straggler_rank2").glob("rank*.fr.json"))
    if len(files) < 4:
        pytest.skip("sample_traces/straggler_rank2 Flight Recorder dumps not recorded")
    ingest(store, files, run="s2fr")
    res = analyze(store, "stragglers", "s2fr")
    assert res.frame["compute_z"].null_count() == res.frame.height
    assert res.verdict["rank"].to_list() == [2]
    assert "compute z = n/a" in res.verdict["evidence"][0]


def test_flight_recorder_only_run_does_not_claim_noise_it_did_not_measure(store):
    # corpus gloo_cpu_4rank: Flight Recorder dumps only (no steps, no compute). Rank 1 arrives last
    # at 8 of 17 all-reduces, chance 1/4 each: p = P(X >= 8 | 17, 1/4) = 0.040 (not < 0.01, so not a
    # suspect and no noise-floor test runs: floor_* null), yet its delays cost 4.0% (>= 1%). The
    # verdict said "ok ... the skew is within the run's noise", a noise nothing measured: inconclusive.
    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")], run="fr")
    res = analyze(store, "stragglers", "fr")
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    p = sum(math.comb(17, k) * 0.25**k * 0.75 ** (17 - k) for k in range(8, 18))
    assert (r1["last_count"], r1["instances"]) == (8, 17) and r1["p_value"] == pytest.approx(p)
    assert res.frame["floor_steps"].null_count() == res.frame.height and round(r1["cost_pct"], 1) == 4.0
    v = res.verdict.row(0, named=True)
    assert (v["status"], v["rank"], v["named"]) == ("inconclusive", 1, False)
    assert v["evidence"].startswith("no straggler named: rank 1 arrived last at 8 of 17 collectives")
    assert v["evidence"].endswith(
        "naming needs p < 0.01, and with collectives only (no steps) no noise floor was measured: nothing "
        "tells whether delays costing 4.0% are the run's noise"
    )
    assert "within the run's noise" not in v["evidence"]
    summary = combined_verdict(store, "fr")
    assert summary.status == "inconclusive" and "no noise floor was measured" in summary.text


def test_production_traces(store):
    # AR: one worker artificially slowed (dp rank 0 of stage 0, global rank 0): named, for compute.
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-AR.parquet")])
    res = analyze(store, "stragglers", "trace-AR")
    assert res.verdict["rank"].to_list() == [0] and res.verdict["cause"].to_list() == ["compute"]
    assert res.frame.filter(res.frame["rank"] == 0)["compute_z"].item() > 10
    # SE: sequence-length imbalance moves from worker to worker: no single straggler.
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-SE.parquet")])
    assert analyze(store, "stragglers", "trace-SE").verdict["named"].to_list() == [False]


def test_end_before_last_arrival_is_flagged_not_negative(store, tmp_path):
    # Rank 0 arrives at 10 ms and its copy ends at 12 ms; rank 1 arrives at 30 ms (ends 32 ms):
    # transfer = end - last arrival is 12 - 30 = -18 ms on rank 0, impossible for an all-reduce,
    # so it is clipped to 0 and flagged; rank 1's is 32 - 30 = 2 ms. Only 2 of the job's 3 ranks
    # are traced, which a note says. Arrival offsets (two ranks: own - other's) are -20 and +20 ms;
    # lateness is the non-negative part: 0 and 20 ms.
    write_skewed_pair(tmp_path / "run", world=3)
    ingest(store, [tmp_path / "run"], align=False)
    res = analyze(store, "stragglers", "run")
    w = {r["rank"]: r for r in res.waits.iter_rows(named=True)}
    assert (w[0]["transfer_ns"], w[0]["end_before_last_arrival"]) == (0, True)
    assert (w[1]["transfer_ns"], w[1]["end_before_last_arrival"]) == (2_000_000, False)
    assert (w[0]["arrival_offset_ns"], w[1]["arrival_offset_ns"]) == (-20_000_000, 20_000_000)
    assert (w[0]["lateness_ns"], w[1]["lateness_ns"]) == (0, 20_000_000)
    per = {r["rank"]: r for r in res.frame.iter_rows(named=True)}
    assert (per[0]["transfer_ns"], per[0]["median_lateness_ns"], per[0]["late_pct"]) == (0, 0, 0.0)
    assert res.instances["ends_before_last_arrival"].to_list() == [1]
    assert any(
        "1 of 2 rank copies (all_reduce) ended before the last rank arrived, by up to 18.000 ms" in n
        for n in res.notes
    )
    assert any(
        n.startswith("2 of 3 ranks traced: ") and "among the traced ranks only" in n for n in res.notes
    )
    for frame in res.frames().values():
        for col, dtype in frame.schema.items():
            if col.endswith("_ns"):
                assert dtype == pl.Int64, col


def test_lateness_is_never_negative_on_pipeline_traces(store):
    # SE pairs the sends and receives of two pipeline stages: the earlier stage arrives ~0.2 s
    # before its peer at most of them (signed offsets down to -0.25 s); lateness counts only
    # arriving after the median, so it is >= 0, and the signed value stays in arrival_offset_ns.
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-SE.parquet")])
    res = analyze(store, "stragglers", "trace-SE")
    assert res.frame["median_lateness_ns"].min() >= 0 and res.frame["late_pct"].min() >= 0
    assert res.waits["lateness_ns"].min() == 0 and res.waits["arrival_offset_ns"].min() < -100_000_000
    assert (res.waits["transfer_ns"] >= 0).all()


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("alpha", 1.5, "between 0 and 1"),
        ("alpha", float("nan"), "finite"),
        ("min_cost_pct", -1, ">= 0"),
        ("cause_alpha", -1, "between 0 and 1"),
    ],
)
def test_bad_params(key, value, expected):
    from traceprof.analyses.stragglers import Params

    with pytest.raises(UsageError, match=f"{key}=.*{expected}"):
        Params(**{key: value})


def test_flight_recorder_source_on_a_run_with_steps(store):
    # sample_traces/straggler_rank2 holds gloo Kineto traces (4 all-reduces per step) and gloo
    # Flight Recorder dumps (no steps, no end times) of the same job; rank 2 sleeps before each step.
    if not (SAMPLES / "straggler_rank2" / "rank2.fr.json").exists():
        pytest.skip("sample_traces/straggler_rank2 not recorded")
    ingest(store, [SAMPLES / "straggler_rank2"], run="s2")
    res = analyze(store, "stragglers", "s2", source="fr")
    # FR instances lie in the Kineto step holding their arrival: the pace is the spacing of the 4
    # all-reduces of a step, not the median step time ("one collective per step").
    assert not [n for n in res.notes if "one collective per step" in n]
    assert [n for n in res.notes if "median spacing of a rank's collectives" in n]
    # No end times: no what-if replay, the cost is the hold-up; rank 2 named as with source=gloo.
    assert [
        n
        for n in res.notes
        if "cost_pct: hold-up (no what-if replay: the source records no collective end" in n
    ]
    assert res.verdict["rank"].to_list() == [2]
    # an unknown source is one line naming the run's sources
    with pytest.raises(
        UsageError,
        match=r"^unknown source 'bogus': run 's2' has collectives from fr, gloo \(-p source=NAME\)$",
    ):
        analyze(store, "stragglers", "s2", source="bogus")


def test_max_named_share_zero_names_no_rank(store, tmp_path):
    # Two ranks, one 100 ms step, 8 all-reduces: rank 0 enqueues at 10, 20, ..., 80 ms, rank 1 1 ms
    # later each time (gloo work from rank 1's arrival, 0.5 ms). Rank 1 is last at 8 of 8: p =
    # 0.5^8 = 0.0039 < 0.01. Its cost, the what-if host-gap replay: gaps (arrival - previous end)
    # rank 0: 0, then 8.5 ms x 7; rank 1: 1, then 9.5 x 7; typical (median of 2) 0.5 and 9.0. With
    # typical gaps the ends are 11, 20.5, ... 11 + 7 x 9.5 = 77.5 (step from 10: 67.5 ms); with
    # rank 1's own gaps 11.5 + 7 x 10 = 81.5 (71.5 ms): 4 ms more, of the 100 ms step: cost 4.0%
    # >= 1% (71.5 / 67.5 - 1 = 5.9% was over the replayed 67.5 ms, not the step). Its cause,
    # untraced host time, is above rank 0's in the one step (77.5 vs 76.5 ms of windows without
    # traced work): p = 1/2, which one step with one other rank cannot bring below 0.05, so the
    # noise-floor test is loosened (cause_alpha 0.6): it qualifies and is named; with
    # max_named_share=0 no rank is.
    for r in range(2):
        ev = [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": 0,
                "dur": 100_000,
            }
        ]
        for k in range(1, 9):
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "c10d::allreduce_",
                    "pid": 1,
                    "tid": 1,
                    "ts": (10 * k + r) * 1000,
                    "dur": 0,
                    "args": {"Input Dims": [[[256]], []]},
                }
            )
            ev.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "gloo:all_reduce",
                    "pid": 1,
                    "tid": 2,
                    "ts": (10 * k + 1) * 1000,
                    "dur": 500,
                    "args": {"Input Dims": [[256]], "Input type": ["float"]},
                }
            )
        write_rank(tmp_path / "run" / f"r{r}.json", ev, r)
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "stragglers", "run", cause_alpha=0.6)
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["last_count"], r1["p_value"]) == (8, pytest.approx(0.5**8))
    assert (r1["floor_steps_won"], r1["floor_steps"], r1["floor_p_value"]) == (1, 1, 0.5)
    assert r1["cost_pct"] == pytest.approx(100 * (71.5 - 67.5) / 100)
    assert r1["named"]
    res = analyze(store, "stragglers", "run", max_named_share=0.0, cause_alpha=0.6)
    assert not res.frame["named"].any() and res.verdict["rank"].to_list() == [None]
    assert res.verdict["evidence"][0].startswith(
        "no rank named (max_named_share = 0); 1 of 2 ranks pass the rule"
    )


def test_an_underflowed_p_value_is_not_printed_as_zero() -> None:
    # 5,919 last arrivals of 10,000 with chance 1/8: the binomial tail underflows to 0.0 in floats.
    from traceprof.analyses.stragglers import Params, _figures

    row = {
        "rank": 3,
        "last_count": 5919,
        "instances": 10000,
        "_decided": 10000,
        "_last_steps": [],
        "_steps": 100,
        "chance_share": 0.125,
        "p_value": 0.0,
        "cost_pct": 85.3,
        "holdup_ns": 1.3e9,
        "median_lateness_ns": 2.43e6,
        "late_pct": 3068.0,
    }
    assert "binomial p < 1e-300)" in _figures(row, Params())
    assert "binomial p = 0.037)" in _figures({**row, "p_value": 0.037}, Params())


# --- a slow pipeline stage is reported as that stage, not as straggler ranks (issue 32) ------------

U = 7_812_500  # ns: 1/128 s, exact in NDTimeline's float32 seconds


def _pp4_dp2(folder, slow: dict[int, tuple[float, float]]):
    """NDTimeline, pp 4 x dp 2 (rank = 2 stage + dp_rank, as the OSDI'25 ST trace), 12 steps. Each
    step every rank computes (forward-compute) from 0 to its arrival, then joins the world
    grad-norm all-reduce (optimizer-clip-main-grad, seq_id 0), which ends on every rank 1 U after the
    last arrival. Compute is 1 U, except ``slow[rank]`` = (U in even steps, U in odd steps)."""
    rows = []
    for step in range(12):
        arr = {r: slow.get(r, (1.0, 1.0))[step % 2] for r in range(8)}
        end = max(arr.values()) + 1
        for r in range(8):
            base = {"dp_rank": r % 2, "stage": r // 2, "rank": r, "step": step, "mc": 0, "gmc": r // 2}
            rows.append(
                {
                    **base,
                    "optype": "forward-compute",
                    "start_ts": 0.0,
                    "duration": arr[r] / 128,
                    "seq_id": 0,
                    "mb_id": 0,
                }
            )
            rows.append(
                {
                    **base,
                    "optype": "optimizer-clip-main-grad",
                    "start_ts": arr[r] / 128,
                    "duration": (end - arr[r]) / 128,
                    "seq_id": 0,
                    "mb_id": -1,
                }
            )
    return write_ndtimeline(folder, rows, "PP", dp=2, pp=4)


def test_ranks_of_a_slow_stage_are_that_stage_not_stragglers(store, tmp_path):
    # Stage 3 (ranks 6, 7) computes 2 U and 2.25 U, alternating which is slower: rank 6 is last at
    # the 6 even steps' all-reduces, rank 7 at the 6 odd ones (chance 1/8 each: binomial P(X >= 6
    # of 12) = sum over k = 6..12 of C(12, k) (1/8)^k (7/8)^(12-k) = 1.794e-3 < 0.01); each
    # computes more than every other rank in all 12 steps, so both pass stragglers' rule (2 of 8 ranks: a quarter, few enough to name). But the whole stage computes
    # 2.125 U against its peers' 1 U (+100% > 10%, each rank at least +100%): parallelism's slow
    # stage 3; its ranks are reported as part of it, not named.
    from traceprof.engine.verdict import combined_verdict

    ingest(store, [_pp4_dp2(tmp_path / "pp", {6: (2.25, 2.0), 7: (2.0, 2.25)})], run="pp")
    res = analyze(store, "stragglers", "pp")
    f = res.frame.filter(pl.col("rank").is_in([6, 7])).sort("rank")
    assert (
        f["last_count"].to_list() == [6, 6]
        and f["p_value"].to_list() == [pytest.approx(1.794e-3, rel=1e-3)] * 2
    )
    assert f["qualifies"].to_list() == [True, True] and f["named"].to_list() == [False, False]
    assert f["slow_group"].to_list() == ["pipeline stage 3"] * 2 and not res.frame["named"].any()
    v = res.verdict.sort("rank")
    assert v.select("rank", "named", "slow_group", "cause").rows() == [
        (6, False, "pipeline stage 3", "compute"),
        (7, False, "pipeline stage 3", "compute"),
    ]
    assert all(
        e.startswith(
            "part of slow pipeline stage 3: named as that group, not as a straggler (slow stage: "
            "pipeline stage 3 (ranks 6, 7)"
        )
        for e in v["evidence"]
    )
    assert not any(n.startswith("straggler:") for n in res.notes)
    # the combined verdict (summary, report) names the stage and the same two ranks as absorbed
    cv = combined_verdict(store, "pp")
    assert cv.text.startswith("slow stage: pipeline stage 3 (ranks 6, 7)") and cv.stragglers == ()
    assert cv.figures["mesh_absorbed"] == [6, 7]


def test_a_slow_rank_whose_stage_is_not_slow_is_still_named(store, tmp_path):
    # Only rank 6 computes 2 U (every step): last at 12 of 12 (p = 8^-12 = 1.455e-11); its stage-mate rank 7
    # computes 1 U, so no stage or replica is slow (each of its ranks must exceed its peers): rank 6
    # is named, with no slow_group.
    ingest(store, [_pp4_dp2(tmp_path / "pp", {6: (2.0, 2.0)})], run="pp")
    res = analyze(store, "stragglers", "pp")
    r6 = res.frame.filter(pl.col("rank") == 6).row(0, named=True)
    assert (r6["last_count"], r6["named"], r6["slow_group"]) == (12, True, None)
    assert r6["p_value"] == pytest.approx(8.0**-12)
    assert res.verdict.select("rank", "named", "slow_group").rows() == [(6, True, None)]
    assert res.verdict["evidence"][0].startswith("straggler: rank 6 arrived last at 12 of 12")


@pytest.mark.parametrize(
    "trial, rows",
    [
        ("ST", [(6, False, "pipeline stage 3"), (7, False, "pipeline stage 3")]),
        ("AR", [(0, True, None)]),
    ],
)
def test_production_trace_verdict_tables_agree_with_the_summary(store, trial, rows):
    # ST: the last pipeline stage (ranks 6, 7) is slow: its ranks are part of it, not stragglers,
    # as the summary's "slow stage: pipeline stage 3"; AR: one slow worker (rank 0), still named.
    from traceprof.engine import findings

    ingest(store, [corpus(f"kineto_misc/bytedance_straggler_whatif/trace-{trial}.parquet")], run=trial)
    res = analyze(store, "stragglers", trial)
    assert res.verdict.select("rank", "named", "slow_group").sort("rank").rows() == rows
    top = findings.summarize(store, trial).findings[0].text
    assert top.startswith(
        "slow stage: pipeline stage 3 (ranks 6, 7)" if trial == "ST" else "rank 0 is a straggler"
    )


def test_window_coverage_by_rank_equals_clipping_every_interval() -> None:
    """``_split_windows`` takes each rank's merged intervals as a slice of one sorted frame
    (``stragglers._by_rank``) and their covered length before a time by a search
    (``stragglers._coverage``); the straightforward way clips every interval of the rank at the
    time and sums (worked on random merged intervals of 5 ranks, one with none, and random times
    before, inside, between and after them)."""
    import numpy as np
    import polars as pl

    from traceprof.analyses import stragglers

    rng = np.random.default_rng(3)
    rows = []
    for rank in (4, 0, 2, 9):  # rank 7 has no interval
        edges = np.sort(rng.choice(10_000, 2 * int(rng.integers(1, 30)), replace=False))
        rows += [(rank, int(s), int(e)) for s, e in edges.reshape(-1, 2)]
    rows = [rows[i] for i in rng.permutation(len(rows))]  # any row order
    iv = pl.DataFrame(rows, schema=["rank", "start_ns", "end_ns"], orient="row")
    by = stragglers._by_rank(iv)
    assert sorted(by) == [0, 2, 4, 9]
    t = rng.integers(-100, 10_100, 200)
    for rank in (0, 2, 4, 7, 9):
        mine = [(s, e) for r, s, e in rows if r == rank]
        want = [sum(max(0, min(e, x) - s) for s, e in mine) for x in t.tolist()]
        got = stragglers._coverage(*by.get(rank, (np.zeros(0, np.int64), np.zeros(0, np.int64))), t)
        assert got.tolist() == want


def test_an_unknown_pace_is_none_and_late_pct_is_decided_from_it() -> None:
    """``_pace_ns`` returns None for an unknown pace (stragglers decides ``late_pct`` from that, not
    from its display text); it returned 1 ns. By hand, no steps: ranks 0 and 1 each hold one
    collective in communicator "0" and one in "1" arriving at the same ns (rank 0 at 1000, rank 1
    at 1040), so no communicator spaces two of a rank's collectives and the spacing across
    communicators is 0 (not a pace): unknown. With rank 0's second collective 500 ns later the
    spacing across communicators is 500 ns (rank 1's 0 is no spacing)."""
    from traceprof.analyses.stragglers import _pace_ns

    w = pl.DataFrame(
        {
            "rank": [0, 0, 1, 1],
            "step": [None] * 4,
            "pg": ["0", "1", "0", "1"],
            "arrival_ns": [1000, 1000, 1040, 1040],
        },
        schema_overrides={"step": pl.Int64},
    )
    assert _pace_ns(w, None) == (None, "unknown")
    later = w.with_columns(pl.Series("arrival_ns", [1000, 1500, 1040, 1040]))
    assert _pace_ns(later, None) == (
        500,
        "median spacing of a rank's collectives across communicators: one collective per communicator",
    )
