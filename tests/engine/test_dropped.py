"""Dropped collectives (``traceprof.engine.dropped``): a traced rank that skips a matched collective
inside its traced window is a desync; the gate (``diff``) and the ``desync`` analysis say so.

The micro-job (hand-built gloo traces, 2 ranks): ProfilerStep#3..#5 over [0, 1], [1, 2], [2, 3] ms;
in each step an all-reduce of 100 floats (400 B, enqueued at +100 us) and one of 200 floats (800 B,
enqueued at +300 us). Instances are numbered by first arrival: step 3 -> 1 (400 B), 2 (800 B); step
4 -> 3, 4; step 5 -> 5, 6. So the 800 B all-reduce of step 4 is instance 4.
"""

from __future__ import annotations

from pathlib import Path

from tests.builders import gloo_rank, write_rank
from traceprof.engine import dropped
from traceprof.engine.diff import diff_runs
from traceprof.engine.findings import summarize
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


def _rank(late_us: int, drop: tuple[int, ...] = (), steps: int = 3) -> list[dict]:
    """One rank's steps #3.. (module doc); the 800 B all-reduce left out of the steps in ``drop``;
    enqueues ``late_us`` later (so that two healthy runs are different files)."""
    ev: list[dict] = []
    for s in range(steps):
        t0 = 1000 * s
        ops = [(t0 + 100 + late_us, t0 + 400, t0 + 500, 100)]
        if 3 + s not in drop:
            ops.append((t0 + 300 + late_us, t0 + 600, t0 + 700, 200))
        ev += gloo_rank(ops, step=3 + s, t0=t0)
    return ev


def _run(
    tmp_path: Path, store: Store, name: str, drops: dict[int, tuple[int, ...]], late_us: int = 0
) -> None:
    for rank in (0, 1):
        write_rank(tmp_path / name / f"r{rank}.json", _rank(late_us + 7 * rank, drops.get(rank, ())), rank)
    ingest(store, [tmp_path / name])


def test_a_rank_that_skips_a_collective_inside_its_window_dropped_it(store, tmp_path):
    # Rank 1 leaves out the 800 B all-reduce of step 4 (instance 4: module doc); its window is
    # [0, 3] ms, which holds that instance (enqueued at 1.3 ms): dropped. Before: nothing said it
    # (ingest's "miss some ranks" warning only); the summary had no desync finding.
    _run(tmp_path, store, "cand", {1: (4,)})
    got = dropped.dropped(store, 1)
    assert got.select("rank", "instance_id", "op", "step", "bytes").rows() == [(1, 4, "all_reduce", 4, 800)]
    assert dropped.dropped_text(got) == (
        "rank 1 dropped 1 collective its peers ran inside its traced window (instance 4: all_reduce 800 B; step 4)"
    )
    s = summarize(store, "cand")
    desync = [v for v in s.verdicts if v.topic == "desync"]
    assert [v.status for v in desync] == ["problem"]
    assert (
        "rank 1 dropped 1 collective" in desync[0].text and "instance 4: all_reduce 800 B" in desync[0].text
    )


def test_a_collective_beyond_the_end_of_a_ranks_trace_is_not_dropped(store, tmp_path):
    # Rank 1's trace stops after step 4 (window [0, 2] ms): step 5's instances 5 and 6 miss it, but
    # they lie beyond its window (enqueued at 2.1 and 2.3 ms): the edge of a trace, not a desync.
    write_rank(tmp_path / "edge" / "r0.json", _rank(0), 0)
    write_rank(tmp_path / "edge" / "r1.json", _rank(7, steps=2), 1)
    ingest(store, [tmp_path / "edge"])
    missing = store.sql(
        "SELECT instance_id FROM collective_instances WHERE len(ranks_missing) > 0 ORDER BY 1"
    )["instance_id"].to_list()
    assert missing == [5, 6]
    assert dropped.dropped(store, 1).is_empty()


def test_the_gate_fails_a_run_whose_rank_dropped_a_collective(store, tmp_path):
    # Baselines a, b healthy (0 dropped); candidate c: rank 1 drops instance 4 (1 dropped). Before:
    # exit 0 or 4 (the counts differ between steps: noise-tested). After: the dropped_collectives
    # row regresses (1 > 0, exact): exit 3, the summary names the rank, instance, op and bytes.
    _run(tmp_path, store, "a", {}, 0)
    _run(tmp_path, store, "b", {}, 3)
    _run(tmp_path, store, "c", {1: (4,)}, 5)
    res = diff_runs(store, "a,b", "c")
    assert res.exit_code == 3
    row = res.frame.filter(res.frame["metric"] == dropped.METRIC).row(0, named=True)
    assert (row["base"], row["cand"], row["layer"], row["verdict"]) == (0, 1, "structural", "regression")
    assert "desync: rank 1 dropped 1 collective" in res.summary
    assert "instance 4: all_reduce 800 B; step 4" in res.summary
    # the reverse: the dropping run as the baseline has no desync the candidate lacks
    assert (
        dropped.METRIC
        not in diff_runs(store, "c", "a")
        .frame.filter(diff_runs(store, "c", "a").frame["regressed"])["metric"]
        .to_list()
    )


def test_fewer_collectives_on_every_rank_pass_but_are_named_first(store, tmp_path):
    # Candidate u: both ranks leave out the 800 B all-reduce in every step (a fused bucket, or a
    # dropped one): collectives 4 -> 2 per step (-50.0%), bytes 2,400 -> 800 (-66.7%); no rank
    # misses a collective its peers ran, so no desync: not gated (exit 0), but the summary opens
    # with it and names the collective: -1 all_reduce per step on every rank (-1,600 B = 1.56 KiB in all).
    # Before: "structure shrank (decreases are not gated): collectives -50.0%, ..." after the
    # verdict, with nothing named.
    _run(tmp_path, store, "a", {}, 0)
    _run(tmp_path, store, "b", {}, 3)
    _run(tmp_path, store, "u", {0: (3, 4, 5), 1: (3, 4, 5)}, 5)
    res = diff_runs(store, "a,b", "u")
    assert res.exit_code in (0, 4)
    assert not res.regressed
    body = res.summary.split(": ", 1)[1]
    assert body.startswith("FEWER COLLECTIVES (not gated")
    assert "collectives -50.0%, comm_bytes -66.7% per step: -1 all_reduce" in body
    assert "per step on every rank (-1.56 KiB per step in all)" in body
    # and the reverse (more collectives) stays a regression
    assert diff_runs(store, "u", "a").exit_code == 3


def test_a_step_with_fewer_collectives_is_named(store, tmp_path):
    # Candidate s: both ranks leave out the 800 B all-reduce in step 4 only: job collectives per
    # step 4, 2, 4 (hand: 2 ranks x 2, then 2 x 1), bytes 2,400, 800, 2,400 (2 x (400 + 800), 2 x 400). Not exact (counts differ between steps): noise-
    # tested, as before, but the summary named no step and said "no structural change"; now it names
    # step 4: 2 (the other steps 4).
    _run(tmp_path, store, "a", {}, 0)
    _run(tmp_path, store, "b", {}, 3)
    _run(tmp_path, store, "s", {0: (4,), 1: (4,)}, 5)
    res = diff_runs(store, "a,b", "s")
    assert "no structural change" not in res.summary
    assert "step counts differ, so no exact structural comparison" in res.summary
    assert "collectives ('s': step 4: 2 (the other steps 4))" in res.summary
    assert "comm_bytes ('s': step 4: 800 (the other steps 2,400))" in res.summary
