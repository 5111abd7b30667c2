"""Issue 9: the MUST lines of ../shared/cases/ on matching, clocks and the straggler rule, plus
micro traces of the same kinds (hand-worked values in the comments)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.builders import BASE, collective_args, kernel, launch, step, two_host_tp_run, write_rank
from tests.conftest import analyze, case
from traceprof.analyses import _replay, _whatif_fix, stragglers
from traceprof.engine.findings import summarize
from traceprof.engine.verdict import combined_verdict
from traceprof.ingest import clock
from traceprof.ingest.clock import estimate_offsets
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

US = 1000
#: Micro traces start here (us after the base time): a record at ts 0 counts as another clock domain.
T0_US = 1000
#: p2p_and_collective_seq: offsets are us from B = T0 + 100 us.
B = 1767225601000100000


def _offsets(store) -> dict[int, int]:
    return dict(store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").iter_rows())


# --- p2p_and_collective_seq: collective and point-to-point sequence numbers are separate counters


def _p2p_case(store, tmp_path: Path, comms_id: bool) -> None:
    src = case("p2p_and_collective_seq")
    for f in ("rank0.json", "rank1.json"):
        doc = json.loads((src / f).read_text())
        if not comms_id:  # the same kind without Comms Id: (pg, Seq, p2p-or-collective) must do
            for e in doc["traceEvents"]:
                e.get("args", {}).pop("Comms Id", None)
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / f).write_text(json.dumps(doc))
    ingest(store, [tmp_path / "run"], run="p2p")


@pytest.mark.parametrize("comms_id", [True, False])
def test_p2p_and_collective_seq_are_separate_instances(store, tmp_path, comms_id):
    _p2p_case(store, tmp_path, comms_id)
    method = "comms_id" if comms_id else "pg_seq"
    # MUST: 3 instances, never one holding an all-reduce row and a send/recv row.
    mixed = store.sql(
        "SELECT instance_id FROM collectives GROUP BY instance_id "
        "HAVING count(DISTINCT p2p) > 1 OR count(DISTINCT op = 'all_reduce') > 1"
    ).height
    assert mixed == 0
    inst = store.sql(
        """SELECT op, pg, pg_ranks, p2p, seq, ranks_present, first_arrival_ns - $1 AS first, last_arrival_ns - $1 AS last,
                  arrival_skew_ns, last_rank, first_end_ns - $1 AS e0, last_end_ns - $1 AS e1, match_method
           FROM collective_instances ORDER BY instance_id""",
        [B],
    ).rows()
    # p2p Seq 1: send on rank 0 [B+300, B+400] with recv on rank 1 [B+250, B+400] (last: rank 0);
    # p2p Seq 2: recv on rank 0 [B+420, B+800] with send on rank 1 [B+780, B+800];
    # all-reduce, collective Seq 1: rank 0 at B+1100, rank 1 at B+1150 -> skew 50 us, last rank
    # 1, both end at B+1200. A send matched with its recv is op 'send/recv' (it was the op of whichever
    # row came first: rank 0's, 'send' then 'recv').
    assert inst == [
        (
            "send/recv",
            "0",
            "[0, 1]",
            True,
            1,
            [0, 1],
            250 * US,
            300 * US,
            50 * US,
            0,
            400 * US,
            400 * US,
            method,
        ),
        (
            "send/recv",
            "0",
            "[0, 1]",
            True,
            2,
            [0, 1],
            420 * US,
            780 * US,
            360 * US,
            1,
            800 * US,
            800 * US,
            method,
        ),
        (
            "all_reduce",
            "0",
            "[0, 1]",
            False,
            1,
            [0, 1],
            1100 * US,
            1150 * US,
            50 * US,
            1,
            1200 * US,
            1200 * US,
            method,
        ),
    ]
    rows = store.sql(
        "SELECT rank, op, start_ns - $1, end_ns - $1 FROM collectives ORDER BY instance_id, rank", [B]
    ).rows()
    assert rows == [
        (0, "send", 300 * US, 400 * US),
        (1, "recv", 250 * US, 400 * US),
        (0, "recv", 420 * US, 800 * US),
        (1, "send", 780 * US, 800 * US),
        (0, "all_reduce", 1100 * US, 1200 * US),
        (1, "all_reduce", 1150 * US, 1200 * US),
    ]
    assert _offsets(store) == {0: 0, 1: 0}  # the all-reduce ends agree: no clock offset
    # MUST: stragglers' per-instance table has an all_reduce row with skew 50000 ns; its transfer
    # after the last arrival is B+1200 - B+1150 = 50 us.
    res = analyze(store, "stragglers", "p2p")
    ar = res.instances.filter(pl.col("op") == "all_reduce").row(0, named=True)
    assert (ar["skew_ns"], ar["last_rank"], ar["transfer_ns"]) == (50_000, 1, 50_000)


# --- fr_two_groups_same_pg_name: a process group is its name and its member ranks


def test_flight_recorder_groups_with_one_name_and_different_members(store):
    res = ingest(store, [case("fr_two_groups_same_pg_name")], run="fr2")
    # Ranks 0..3 traced; each dump's pg_config shows only its own 2-rank group, so world size is
    # the highest rank + 1 = 4, not the group size 2.
    assert store.runs().select("world_size", "ranks").row(0) == (4, 4)
    # Group B ([2, 3]) is linked to group A by no collective: ingest says so, and the run does not
    # claim aligned clocks (each group is aligned within itself only).
    assert [
        w for w in res.warnings if "ranks 0, 1 (relative to rank 0); ranks 2, 3 (relative to rank 2)" in w
    ]
    assert store.sql("SELECT clock_aligned FROM runs").item() is False
    inst = store.sql(
        "SELECT pg, pg_ranks, seq, ranks_present, ranks_missing, n_ranks, arrival_skew_ns, last_rank "
        "FROM collective_instances ORDER BY pg_ranks, seq"
    ).rows()
    # 6 instances, 3 per group, 2 ranks each (group size 2 in pg_config), nothing missing; group A
    # ([0, 1]): rank 1 created 100 us after rank 0; group B ([2, 3]): rank 3 100 us after rank 2.
    assert inst == (
        [("0", "[0, 1]", k, [0, 1], [], 2, 100_000, 1) for k in (1, 2, 3)]
        + [("0", "[2, 3]", k, [2, 3], [], 2, 100_000, 3) for k in (1, 2, 3)]
    )
    # No clock offsets: within each group the ends agree, and nothing links B to A.
    assert _offsets(store) == {0: 0, 1: 0, 2: 0, 3: 0}
    res = clock.align_run(store, store.resolve_run("fr2"))
    assert dict(res.estimates.select("rank", "component").iter_rows()) == {0: 0, 1: 0, 2: 2, 3: 2}
    assert any(
        "cannot be aligned to each other" in n and "ranks 2, 3 (relative to rank 2)" in n for n in res.notes
    )
    # Stragglers: rank 1 last in 3 of 3 of group A, 100 us after rank 0 (lateness with two ranks
    # = own - other's arrival), causing 3 x 100 us = 300 us of waits; rank 3 the same in group B.
    per = {r["rank"]: r for r in analyze(store, "stragglers", "fr2").frame.iter_rows(named=True)}
    for late, early in ((1, 0), (3, 2)):
        assert (per[late]["last_count"], per[late]["instances"], per[late]["median_lateness_ns"]) == (
            3,
            3,
            100_000,
        )
        assert (per[late]["wait_caused_ns"], per[early]["last_count"], per[early]["wait_caused_ns"]) == (
            300_000,
            0,
            0,
        )
        assert per[late]["holdup_ns"] == 300_000  # three disjoint 100 us waits


def test_flight_recorder_replica_groups_of_different_sizes_are_one_run(store, tmp_path):
    # g3 variant fr_two_groups_same_pg_name/three_groups_sizes_and_states: three replica groups,
    # each with its default pg "0": A [0, 1, 2], B [3, 4], C [5, 6, 7]; all-reduce seq 1..3 at
    # k * 10 ms + 0 / 3 / 6 ms, created (arrival) per rank A 0, 50, 120 us; B 0, 30; C 0, 200, 10;
    # ends together. A dump lists only its own group, so the largest group (3 or 2 ranks) is no
    # world size: the folder is one job (it was split into runs "-world3" and "-world2").
    tmpl = json.loads((case("fr_two_groups_same_pg_name") / "rank0.fr.json").read_text())
    a0 = tmpl["entries"][0]["time_created_ns"]
    d = tmp_path / "three_groups"
    d.mkdir()
    for ranks, base, late, end in (
        ([0, 1, 2], 0, [0, 50, 120], 600),
        ([3, 4], 3_000, [0, 30], 500),
        ([5, 6, 7], 6_000, [0, 200, 10], 700),
    ):
        for j, r in enumerate(ranks):
            doc = json.loads(json.dumps(tmpl))
            doc["pg_config"]["0"]["ranks"] = str(ranks)
            for k, e in enumerate(doc["entries"]):
                e["time_created_ns"] = a0 + (10_000 * k + base + late[j]) * US
                e["time_discovered_started_ns"] = e["time_created_ns"] + 10 * US
                e["time_discovered_completed_ns"] = a0 + (10_000 * k + base + end) * US
            (d / f"rank{r}.fr.json").write_text(json.dumps(doc))
    res = ingest(store, [d])
    assert store.runs().select("name", "world_size", "ranks").rows() == [("three_groups", 8, 8)]
    assert [
        w for w in res.warnings if "ranks 0, 1, 2 (relative to rank 0); ranks 3, 4 (relative to rank 3)" in w
    ]
    inst = store.sql(
        "SELECT pg_ranks, seq, n_ranks, ranks_missing, arrival_skew_ns, last_rank "
        "FROM collective_instances ORDER BY pg_ranks, seq"
    ).rows()
    assert inst == (
        [("[0, 1, 2]", k, 3, [], 120_000, 2) for k in (1, 2, 3)]
        + [("[3, 4]", k, 2, [], 30_000, 4) for k in (1, 2, 3)]
        + [("[5, 6, 7]", k, 3, [], 200_000, 6) for k in (1, 2, 3)]
    )
    assert _offsets(store) == dict.fromkeys(range(8), 0)


def test_flight_recorder_group_missing_from_a_dumps_pg_config(store, tmp_path):
    # g5 variant fr_two_groups_same_pg_name/missing_pg_config_entry_shared_desc: groups "0"
    # default_pg [0..3]; "1" [0, 1], "2" [2, 3], "3" [0, 2], all three described "undefined"
    # (torch's desc for new_group without group_desc). Rank 2's pg_config lacks group "3" (its
    # entries of group 3 are there). all_reduce seq 1, 2 per group at k * 10 ms + 0 / 2 / 2 / 4 ms;
    # created (arrival) us: "0" 0, 20, 40, 60 (ranks 0..3); "1" r0 0, r1 30; "2" r2 0, r3 50;
    # "3" r0 0, r2 70; every member completes at +600 us. Group 3 on rank 2 was given [2, 3] (the
    # first group described "undefined"), which split it into 4 one-rank instances, rank 3 "missing".
    tmpl = json.loads((case("fr_two_groups_same_pg_name") / "rank0.fr.json").read_text())
    a0 = tmpl["entries"][0]["time_created_ns"]
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("undefined", [0, 1]), "2": ("undefined", [2, 3])}
    groups["3"] = ("undefined", [0, 2])
    late = {"0": [0, 20, 40, 60], "1": [0, 30], "2": [0, 50], "3": [0, 70]}
    at = {"0": 0, "1": 2_000, "2": 2_000, "3": 4_000}
    d = tmp_path / "missing_pg_config_entry"
    d.mkdir()
    for r in range(4):
        doc = json.loads(json.dumps(tmpl))
        mine = [g for g, (_, m) in groups.items() if r in m]
        doc["pg_config"] = {
            g: {"name": g, "desc": groups[g][0], "ranks": str(groups[g][1])}
            for g in mine
            if (r, g) != (2, "3")
        }
        doc["pg_status"] = {g: dict.fromkeys(doc["pg_status"]["0"], "2") for g in mine}
        entries = []
        for k in range(2):
            for g in mine:
                e = json.loads(json.dumps(tmpl["entries"][0]))
                created = a0 + (10_000 * k + at[g] + late[g][groups[g][1].index(r)]) * US
                e.update(record_id=len(entries), pg_id=int(g), process_group=[g, groups[g][0]])
                e.update(collective_seq_id=k + 1, op_id=k + 1, time_created_ns=created)
                e["time_discovered_started_ns"] = created + 10 * US
                e["time_discovered_completed_ns"] = a0 + (10_000 * k + at[g] + 600) * US
                entries.append(e)
        doc["entries"] = entries
        (d / f"rank{r}.fr.json").write_text(json.dumps(doc))
    ingest(store, [d])
    inst = store.sql(
        "SELECT pg, pg_ranks, seq, ranks_present, ranks_missing, arrival_skew_ns, last_rank "
        "FROM collective_instances ORDER BY pg, seq"
    ).rows()
    # 8 instances, each with its group's members and none missing: group 3's members come from
    # rank 0's dump ([0, 2]), as rank 2's own cannot say them.
    assert inst == [
        (g, str(m), k, m, [], skew, last)
        for g, m, skew, last in (
            ("0", [0, 1, 2, 3], 60_000, 3),
            ("1", [0, 1], 30_000, 1),
            ("2", [2, 3], 50_000, 3),
            ("3", [0, 2], 70_000, 2),
        )
        for k in (1, 2)
    ]
    assert _offsets(store) == dict.fromkeys(range(4), 0)
    per = {r["rank"]: r for r in analyze(store, "stragglers").frame.iter_rows(named=True)}
    assert {r: (per[r]["instances"], per[r]["last_count"]) for r in per} == {
        0: (6, 0),
        1: (4, 2),
        2: (6, 2),
        3: (4, 4),
    }


# --- clock_offset_3ms: offsets in integer ns end to end


def test_clock_offset_recovered_to_the_nanosecond(store, tmp_path):
    ingest(store, [case("clock_offset_3ms")], run="c3")
    # rank 1's clock reads 3 ms ahead: every matched end differs by exactly 3,000,000 ns.
    got = store.sql("SELECT rank, clock_offset_ns, clock_residual_ns FROM traces ORDER BY rank").rows()
    assert got == [(0, 0, 0), (1, -3_000_000, 0)]
    # The same kind with an odd offset (3 ms + 1 ns): a DOUBLE median of epoch ns (256 ns steps)
    # could not give it.
    for f in ("rank0.json", "rank1.json"):
        doc = json.loads((case("clock_offset_3ms") / f).read_text())
        doc["baseTimeNanoseconds"] += 1 if f == "rank1.json" else 0
        (tmp_path / "odd").mkdir(exist_ok=True)
        (tmp_path / "odd" / f).write_text(json.dumps(doc))
    odd = Store(tmp_path / "odd.duckdb")  # rank0.json is the same file: a second store
    ingest(odd, [tmp_path / "odd"], run="odd")
    assert _offsets(odd) == {0: 0, 1: -3_000_001}
    odd.close()


def test_estimate_offsets_is_exact_on_epoch_scale_ints():
    # Four instances ending at epoch ~1.77e18 ns; rank 1 reads +2,000,003 ns, rank 2 -777 ns off
    # (below the 50 us floor: estimated but not applied), with delays on some instances. Every
    # estimate is an exact integer.
    t0 = 1_767_225_601_123_456_789
    rows = []
    for k in range(6):
        t = t0 + 10_000_000 * k
        rows += [(k, 0, t), (k, 1, t + 2_000_003 + (5_000 if k == 2 else 0)), (k, 2, t - 777)]
    est = estimate_offsets(pl.DataFrame(rows, schema=["instance_id", "rank", "end_ns"], orient="row"))
    assert est["estimate_ns"].to_list() == [0, -2_000_003, 777]
    assert est["offset_ns"].to_list() == [0, -2_000_003, 0]


# --- one_collective_per_step: pace falls back to the step time


def test_one_collective_per_step_names_nobody(store):
    ingest(store, [case("one_collective_per_step")], run="one")
    res = analyze(store, "stragglers", "one")
    # Rank 1 arrives 10 us after rank 0 in both 1000 us steps: 1 % of the step time, the pace
    # fallback (no two collectives in one step); last at 2 of 2 with chance 1/2: p = 0.25.
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["median_lateness_ns"], r1["late_pct"], r1["p_value"]) == (10_000, pytest.approx(1.0), 0.25)
    assert res.frame["named"].sum() == 0 and res.verdict["named"].to_list() == [False]
    assert any("pace 1.00 ms (median step time" in n for n in res.notes)
    # its delays cost 0.5% of step time (< min_cost_pct 1%): the ideal mm is the mean of the two
    # ranks' (+5 us), so rank 1's own adds 5 us to each 1000 us step (0.6% over the ~800 us of
    # traced work before the cost was over the step). It can never be named, said with the
    # figures, not "within the run's noise"; 2 collectives allow p >= 0.5^2 = 0.25 at best
    v = res.verdict.row(0, named=True)
    assert v["status"] == "ok" and "noise" not in v["evidence"]
    assert r1["cost_pct"] == pytest.approx(0.5)
    assert (
        "at 0.5% of step time its delays cost less than the 1% a rank must cost to be named" in v["evidence"]
    )
    assert (
        "nor could 2 collectives with one last rank reach p < 0.01: the smallest p they allow is 0.25"
        in (v["evidence"])
    )


def test_one_collective_in_most_steps_keeps_the_step_pace(store, tmp_path):
    # The case plus one barrier all-reduce (its own group "1", Seq 1, 1 element) in step 101 only:
    # op at 4001125 us, kernel at 4001140 us on both ranks (after the all-reduce's kernels end at
    # 4001120). Arrivals are kernel starts: rank 0's spacing 4001140 - 4001020 = 120 us, rank 1's
    # 4001140 - 4001030 = 110 us, the only spacings within a step (a pace of 110 us made rank 1's
    # 10 us 9.1% of it), and they are across two communicators: the pace is per communicator, and
    # each holds one collective per step, so the pace is the median step time (1000 us; it was
    # so too when counted across communicators, most steps holding 1): rank 1 is a median 10 us late
    # at the 3 collectives (10, 0 at the tied barrier, 10) = 1% of the pace; still nobody named.
    for r in (0, 1):
        doc = json.loads((case("one_collective_per_step") / f"rank{r}.json").read_text())
        evs = doc["traceEvents"]
        op_ev, launch_ev, kern_ev = (
            next(e for e in evs if e.get("name") == n)
            for n in (
                "record_param_comms",
                "cudaLaunchKernel",
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            )
        )
        group = {
            "Process Group Name": "1",
            "Process Group Description": "barrier",
            "Seq": 1,
            "In msg nelems": 1,
            "Out msg nelems": 1,
        }
        for e, ts in ((op_ev, 4001125.0), (launch_ev, 4001126.0), (kern_ev, 4001140.0)):
            extra = json.loads(json.dumps(e))
            extra["ts"], extra["args"]["External id"] = ts, 99
            extra["args"].update(group if e is not launch_ev else {})
            if e is not op_ev:
                extra["args"]["correlation"] = 899
            extra["dur"] = 5.0 if e is kern_ev else extra["dur"]
            evs.append(extra)
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / f"rank{r}.json").write_text(json.dumps(doc))
    ingest(store, [tmp_path / "run"], run="barrier")
    assert store.sql("SELECT count(*) FROM collective_instances").item() == 3
    res = analyze(store, "stragglers", "barrier")
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["median_lateness_ns"], r1["late_pct"]) == (10_000, pytest.approx(1.0))
    assert any(
        "pace 1.00 ms (median step time: one collective per step, so no spacing" in n for n in res.notes
    )
    assert res.frame["named"].sum() == 0


def _one_collective_steps(
    folder: Path,
    n_ranks: int,
    late: dict[int, float],
    steps: bool = True,
    step_us: tuple[float, ...] = (1000.0,),
    n_steps: int = 8,
) -> Path:
    """``n_ranks`` ranks, ``n_steps`` (8) steps of 1000 us (ProfilerStep#1.., left out with ``steps=False``; step s
    lasts ``step_us[s % len(step_us)]`` us from its start, 1000 us apart), each
    holding one mm kernel [20, 720 + late] us into the step and one all-reduce (pg "0", Seq s)
    from its end to 820 + max(late) us; rank r's compute is ``late.get(r, 0)`` us longer. The
    last 180 us of each step are untraced host time."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = list(range(n_ranks))
    slow = max(late.values(), default=0.0)
    for r in ranks:
        ev: list[dict] = []
        for s in range(n_steps):
            b, x = 1000.0 * s, late.get(r, 0.0)
            if steps:
                ev.append(step(s + 1, b, step_us[s % len(step_us)]))
            ar = collective_args(seq=s, ranks=ranks, nelems=1 << 20, out_nelems=1 << 20, group_size=n_ranks)
            ev += [
                launch(b + 10, 10 * s + 1),
                kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 7, b + 20, 700 + x, 10 * s + 1),
                {**launch(b + 700 + x, 10 * s + 2), "args": {"correlation": 10 * s + 2, **ar}},
                kernel(
                    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                    20,
                    b + 720 + x,
                    100 + slow - x,
                    10 * s + 2,
                    **ar,
                ),
            ]
        write_rank(folder / f"rank{r}.json", ev, r, world=n_ranks, backend="nccl")
    return folder


def test_one_collective_per_step_costs_its_share_of_the_whole_step(store, tmp_path):
    """8 ranks, rank 3 10 us late at each of 8 steps (1% of the 1000 us step), the other 7 alike.
    By hand: the ideal mm is the mean over the ranks, 700 + 10/8 = 701.25 us; rank 3's own 710 us
    put back adds 8.75 us to a step: 0.875% of the recorded 1000 us step, under min_cost_pct (1%),
    so nobody is named. It was (alone S - 1) over the replayed ~800 us of work, 1.09%: rank 3 named
    a straggler for 10 us of a 1000 us step, which the case says it is not."""
    ingest(store, [_one_collective_steps(tmp_path / "run", 8, {3: 10.0})], run="eight")
    res = analyze(store, "stragglers", "eight")
    r3 = res.frame.filter(pl.col("rank") == 3).row(0, named=True)
    assert (r3["last_count"], r3["median_lateness_ns"], r3["late_pct"]) == (8, 10_000, pytest.approx(1.0))
    assert r3["cost_pct"] == pytest.approx(0.875, abs=1e-6)
    assert res.frame["named"].sum() == 0


def test_one_collective_without_steps_covers_a_pace_per_collective(store, tmp_path):
    """No ProfilerStep markers: 8 all-reduces 1000 us apart (the pace), rank 1 10 us late at each:
    it held the job up 8 x 10 = 80 us of the 8 x 1000 us the collectives cover, 1.0% (it was 80 us
    of the 7110 us from the first arrival to the last end, 1.13%)."""
    ingest(store, [_one_collective_steps(tmp_path / "run", 2, {1: 10.0}, steps=False)], run="nosteps")
    res = analyze(store, "stragglers", "nosteps")
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["last_count"], r1["holdup_ns"], r1["late_pct"]) == (8, 80_000, pytest.approx(1.0))
    assert r1["holdup_pct"] == pytest.approx(1.0)


def _fr_pair(folder: Path, ops: list[tuple[tuple[str, str], int, int, tuple[int, int], int]]) -> Path:
    """Flight Recorder JSON dumps of ranks 0 and 1 (pg "0" = [0, 1]) in ``folder``: per op
    ((rank 0's, rank 1's profiling_name), collective_seq_id, p2p_seq_id, (rank 0's, rank 1's
    time_created us after A0), time_discovered_completed us)."""
    a0, us = 1767225601000000000, 1000
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(2):
        entries = [
            {
                "record_id": i,
                "pg_id": 0,
                "process_group": ["0", "default_pg"],
                "collective_seq_id": cseq,
                "p2p_seq_id": pseq,
                "op_id": i + 1,
                "profiling_name": names[r],
                "time_created_ns": a0 + created[r] * us,
                "time_discovered_started_ns": a0 + (created[r] + 10) * us,
                "time_discovered_completed_ns": a0 + done * us,
                "input_sizes": [[1048576]],
                "input_dtypes": ["Float"],
                "output_sizes": [[1048576]],
                "output_dtypes": ["Float"],
                "state": "completed",
                "is_p2p": bool(pseq),
            }
            for i, (names, cseq, pseq, created, done) in enumerate(ops)
        ]
        dump = {
            "version": "2.10",
            "rank": r,
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "entries": entries,
        }
        (folder / f"rank{r}.fr.json").write_text(json.dumps(dump))
    return folder


def test_one_collective_per_communicator_without_steps_paces_across_communicators(store, tmp_path):
    """Flight Recorder, no steps, pg "0" = [0, 1] (g12 variant g19_fr_json_p2p_names): a send / recv
    (p2p counter: its own communicator "0:p2p") then one all_reduce, so no communicator holds two
    collectives of a rank and the per-communicator pace is undefined. Times after A0 (us): rank 0
    send created 100, rank 1 recv 50 (both done 400); all_reduce rank 0 created 1000, rank 1 1040
    (both done 1300). The pace falls back to a rank's spacing across communicators: rank 0
    100 -> 1000 = 900 us, rank 1 50 -> 1040 = 990 us, lower median 900 us. Rank 0's lateness
    (50 us at the p2p, 0 at the all_reduce) median 25 us = 2.78% of it; rank 1 (0, 40) 20 us =
    2.22%. It was 25000 / 1 ns = 2500000% ("pace 0.00 ms (unknown)")."""
    send = (("nccl:send 0->1", "nccl:recv 1<-0"), 0, 1, (100, 50), 400)
    ingest(
        store,
        [_fr_pair(tmp_path / "a", [send, (("nccl:all_reduce",) * 2, 1, 0, (1000, 1040), 1300)])],
        run="p2p1",
    )
    res = analyze(store, "stragglers", "p2p1")
    per = {r["rank"]: r for r in res.frame.iter_rows(named=True)}
    assert (per[0]["median_lateness_ns"], per[1]["median_lateness_ns"]) == (25_000, 20_000)
    assert per[0]["late_pct"] == pytest.approx(100 * 25 / 900)
    assert per[1]["late_pct"] == pytest.approx(100 * 20 / 900)
    assert any(
        "pace 0.90 ms (median spacing of a rank's collectives across communicators" in n for n in res.notes
    )
    # One collective per rank in all (the all_reduce alone): no spacing anywhere, the pace is
    # unknown and late_pct null (it was 40000 / 1 ns = 4000000%), said as "pace unknown".
    ingest(
        store, [_fr_pair(tmp_path / "b", [(("nccl:all_reduce",) * 2, 1, 0, (1000, 1040), 1300)])], run="one"
    )
    res = analyze(store, "stragglers", "one")
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["median_lateness_ns"], r1["late_pct"]) == (40_000, None)
    assert any("pace 0.00 ms (unknown)" in n for n in res.notes)


def test_cost_at_the_floor_is_named_and_just_below_is_shown_below_it(store, tmp_path):
    """The rule: a rank's delays must cost *at least* ``min_cost_pct`` (1 %). As above without steps,
    rank 1 10 us late at each of 8 collectives 1000 us apart: 80 / 8000 us = 1.0 %, named; 9.6 us late:
    76.8 / 8000 us = 0.96 %, not named, and said as 0.96 % (it read "at 1.0% ... its delays cost less
    than the 1%")."""
    ingest(store, [_one_collective_steps(tmp_path / "a", 2, {1: 10.0}, steps=False)], run="at")
    ingest(store, [_one_collective_steps(tmp_path / "b", 2, {1: 9.6}, steps=False)], run="below")
    at, below = analyze(store, "stragglers", "at"), analyze(store, "stragglers", "below")
    r1 = at.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["holdup_ns"], r1["cost_pct"], r1["named"]) == (80_000, pytest.approx(1.0), True)
    r1 = below.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["holdup_ns"], r1["cost_pct"], r1["named"]) == (76_800, pytest.approx(0.96), False)
    text = below.verdict["evidence"][0]
    assert "cost the job 0.96% of the time" in text and "at 0.96% of the time the collectives cover" in text
    assert "1.0%" not in text


def test_a_stepless_straggler_claims_no_cause_without_a_compute_z(store, tmp_path):
    """The case above at 1.0 % (no steps): its compute has no z-score (no compute per step), so no
    cause is claimed (it read "compute z = n/a (no compute traced) ... late because of compute"), and
    the noise-floor excess is of the collectives' spacing (it read "% of a step", "in 8 of 8 steps")."""
    ingest(store, [_one_collective_steps(tmp_path / "a", 2, {1: 10.0}, steps=False)], run="at")
    text = analyze(store, "stragglers", "at").verdict["evidence"][0]
    assert "compute z = n/a (no steps: no compute per step)" in text
    assert "largest excess: compute, but no cause is claimed without a compute z (no steps" in text
    assert "late because of" not in text and "of a step" not in text
    assert "of the collectives' mean spacing" in text
    f = summarize(store, "at")
    found = next(x for x in f.findings if x.topic == "stragglers")
    assert "largest excess: compute (no cause claimed without a compute z)" in found.text
    assert "late because of" not in found.text and "steps would be" not in found.text
    v = {v.topic: v for v in f.verdicts}["stragglers"]
    assert v.text.startswith("straggler: rank 1 (no cause claimed (no compute z); last at 8 of 8 collectives")
    assert "its arrival lateness above every unsuspected rank's in 8 of 8 collectives" in v.text
    assert "of a step" not in v.text and "steps" not in v.text


def test_a_stepless_excess_is_of_the_spacing_between_the_collectives(store, tmp_path):
    """No steps, 8 all-reduces 1000 us apart (first arrivals at 720, 1720, ..., 7720 us), rank 1 10 us
    late at each: its arrival offset (from the other rank's) is +10 us, rank 0's (the noise floor)
    -10 us, an excess of 20 us of the 7000 / 7 = 1000 us mean spacing: 2.0 %. It read 2.3 %: the
    span of all arrivals (to rank 1's last, 7730 us) over the 8 collectives, not over their 7
    intervals, 20 / (7010 / 8) = 2.28 %."""
    ingest(store, [_one_collective_steps(tmp_path / "a", 2, {1: 10.0}, steps=False)], run="at")
    res = analyze(store, "stragglers", "at")
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert r1["excess_pct"] == pytest.approx(2.0)
    assert "by a median +2.0% of the collectives' mean spacing" in res.verdict["evidence"][0]


def test_the_median_step_of_an_even_count_is_the_mean_of_the_middle_two(store, tmp_path):
    """2 ranks x 8 steps lasting 950 and 1000 us by turns: 16 steps, the middle two 950 and 1000 us,
    median 975 us (the lower median, 950 us, was taken). Rank 1 is 10 us late at each all-reduce:
    late_step_pct = 10 / 975 = 1.026 % (was 10 / 950 = 1.053 %)."""
    ingest(store, [_one_collective_steps(tmp_path / "r", 2, {1: 10.0}, step_us=(950.0, 1000.0))], run="r")
    r1 = analyze(store, "stragglers", "r").frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert r1["median_lateness_ns"] == 10_000
    assert r1["late_step_pct"] == pytest.approx(100 * 10 / 975)


def test_the_floor_allows_float_noise_and_shows_each_side() -> None:
    # (0.3 - 0.2) x 10 is 1 by hand and 0.9999999999999998 in floats: it reaches the 1 % floor
    noisy = (0.3 - 0.2) * 10
    assert noisy < 1.0 and stragglers._reaches(noisy, 1.0)
    assert not stragglers._reaches(0.999, 1.0)
    shown = [stragglers._pct_shown(x, 1.0) for x in (noisy, 1.0, 0.96, 0.996, 1.04, 0.5)]
    assert shown == ["1.0", "1.0", "0.96", "0.996", "1.0", "0.5"]
    assert stragglers._pct_shown(0.97, 1.0, "+") == "+0.97"


def _pp4(rank: int, comms_id: bool) -> list[dict]:
    """Rank ``rank`` of a 4-stage pipeline in one group "0" = [0, 1, 2, 3] (c10d's seqP2P_ counts
    each rank's own point-to-point ops: rank r's recv from r - 1 is its Seq 1, its send to r + 1
    Seq 1 on rank 0, Seq 2 on ranks 1 and 2), then an all-reduce of the group (collective Seq 1)
    whose kernel starts at T0_US + 1100 + 20 r us and ends at T0_US + 1200. A ``Comms Id`` hashes
    (pg, Seq, p2p, ranks), the same on every rank: here 1000 + Seq (p2p) / 2000 + Seq."""
    g = [0, 1, 2, 3]
    ops = ([("recv", 1, 250 + 300 * (rank - 1), 150)] if rank else []) + (
        [("send", 2 if rank else 1, 300 + 300 * rank, 100)] if rank < 3 else []
    )
    ops.append(("allreduce", 1, 1100 + 20 * rank, 100 - 20 * rank))
    ev: list[dict] = [step(1, T0_US, 1500)]
    for k, (op, seq, start, dur) in enumerate(ops):
        p2p = op != "allreduce"
        more: dict = {"Comms Id": (1000 if p2p else 2000) + seq} if comms_id else {}
        if p2p:
            more |= {
                "Src Rank": rank if op == "send" else rank - 1,
                "Dst Rank": rank + 1 if op == "send" else rank,
            }
        args = collective_args(op=op, seq=seq, ranks=g, nelems=1024, group_size=4, **more)
        name = "ncclDevKernel_SendRecv" if p2p else "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
        ev += [launch(T0_US + start - 10, 60 + k, 2), kernel(name, 20, T0_US + start, dur, 60 + k, **args)]
    return ev


@pytest.mark.parametrize("comms_id", [True, False])
def test_p2p_of_a_group_wider_than_a_pair_never_share_an_instance(store, tmp_path, comms_id):
    # Seq 1 is held by 4 ranks (rank 0's send, the recvs of ranks 1 to 3) and Seq 2 by 2 (the
    # sends of ranks 1 and 2, different transfers): 1 of 2 p2p keys on 3+ ranks (50% > 10%), so
    # the group's p2p rows are not matched by Seq, Comms Id or not (a Comms Id is the same counter
    # hashed), with the note, but each send / recv names its peer: the k-th transfer from rank r to
    # r + 1 (g7): recv at T0+250+300r, send at T0+300+300r, both ending at T0+400+300r: skew 50 us,
    # last rank r, the pair's two ranks only. The all-reduce is one instance of the 4 ranks:
    # arrivals T0+1100 .. T0+1160, skew 60 us, last rank 3, all ending at T0+1200.
    for r in range(4):
        write_rank(tmp_path / "run" / f"r{r}.json", _pp4(r, comms_id), r, world=4, backend="nccl")
    warned = ingest(store, [tmp_path / "run"], run="pp4").warnings
    assert any(
        "'0' [0, 1, 2, 3] (point-to-point): 1 of 2 point-to-point sequence numbers are held by three or more "
        "ranks"
        in w
        and "matched as the k-th transfer between those two ranks (match_method pair_order)" in w
        for w in warned
    )
    inst = store.sql(
        """SELECT ranks_present, ranks_missing, first_arrival_ns - $1, arrival_skew_ns, last_rank,
                  last_end_ns - $1, match_method FROM collective_instances ORDER BY first_arrival_ns""",
        [BASE],
    ).rows()
    pairs = [
        ([r, r + 1], [], (T0_US + 250 + 300 * r) * US, 50 * US, r, (T0_US + 400 + 300 * r) * US, "pair_order")
        for r in range(3)
    ]
    method = "comms_id" if comms_id else "pg_seq"
    assert inst == [
        *pairs,
        ([0, 1, 2, 3], [], (T0_US + 1100) * US, 60 * US, 3, (T0_US + 1200) * US, method),
    ]
    assert store.sql("SELECT count(*) FROM collectives WHERE p2p AND instance_id IS NULL").item() == 0


# --- micro traces of the same kinds


def _nccl(seqs: list[int], step_of: list[int] | None = None) -> list[dict]:
    """A GPU rank with one all-reduce (pg "0", Seq seqs[k]) per 100 us, kernel at T0_US + 100k + 20
    us, in ProfilerStep#(step_of[k]) (all in step 1 by default), each step 100 us per collective."""
    step_of = step_of or [1] * len(seqs)
    ev = []
    for s in sorted(set(step_of)):
        ks = [k for k, x in enumerate(step_of) if x == s]
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "pid": 1,
                "tid": 1,
                "ts": T0_US + 100 * ks[0],
                "dur": 100 * len(ks),
            }
        )
    for k, seq in enumerate(seqs):
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": T0_US + 100 * k + 10,
                "dur": 2,
                "args": {"correlation": 50 + k},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "pid": 0,
                "tid": 7,
                "ts": T0_US + 100 * k + 20,
                "dur": 40,
                "args": {
                    "correlation": 50 + k,
                    "device": 0,
                    "stream": 7,
                    **collective_args(seq=seq, nelems=1024),
                },
            }
        )
    return ev


def test_sequence_numbers_with_different_strides_fall_back_to_order(store, tmp_path):
    # Rank 0 numbers its all-reduces 1, 3, 5, 7 (a counter shared with another group), rank 1 1,
    # 2, 3, 4: (pg, seq) would pair rank 0's 2nd with rank 1's 3rd. Strides 2 vs 1 -> the group
    # falls back to order within the step: 4 instances of both ranks, method step_order, and a note.
    write_rank(tmp_path / "run" / "r0.json", _nccl([1, 3, 5, 7]), 0, backend="nccl")
    write_rank(tmp_path / "run" / "r1.json", _nccl([1, 2, 3, 4]), 1, backend="nccl")
    warned = ingest(store, [tmp_path / "run"], run="stride").warnings
    assert any("ranks step their sequence numbers by 1 to 2," in w and "step_order" in w for w in warned)
    inst = store.sql(
        "SELECT n_ranks, match_method, first_arrival_ns - $1 FROM collective_instances ORDER BY instance_id",
        [BASE],
    ).rows()
    assert inst == [(2, "step_order", (T0_US + 100 * k + 20) * US) for k in range(4)]
    res = analyze(store, "stragglers", "stride")
    assert any("cannot be per process group" in n for n in res.notes)


def test_sequence_numbers_landing_in_different_steps_fall_back_to_order(store, tmp_path):
    # Rank 0's seqs 1..4 lie in steps 1, 1, 1, 2; rank 1's in steps 1, 2, 2, 2 with seqs 1, 2, 3,
    # 4 (same stride): seqs 2 and 3 would pair step 1 of rank 0 with step 2 of rank 1, neither
    # astride the boundary (rank 0's Seq 2 is not its last of step 1, rank 1's Seq 3 not its first of
    # step 2; steps 1, 1, 2, 2 on rank 0 made Seq 2 one collective astride it, matched by pg_seq).
    # 2 of 4 keys span two steps (50% > 10%): matched by order within the step instead.
    write_rank(tmp_path / "run" / "r0.json", _nccl([1, 2, 3, 4], [1, 1, 1, 2]), 0, backend="nccl")
    write_rank(tmp_path / "run" / "r1.json", _nccl([1, 2, 3, 4], [1, 2, 2, 2]), 1, backend="nccl")
    ingest(store, [tmp_path / "run"], run="steps")
    methods = store.sql("SELECT DISTINCT match_method FROM collective_instances").rows()
    assert methods == [("step_order",)]


def _a2a(nelems: int) -> list[dict]:
    """A GPU rank with two all-to-alls without process group or sequence number (DeepEP-like:
    only the launching op names them): nccl:all_to_all annotations around the launches, kernels
    of ``nelems`` elements (different per rank, as all-to-all splits are)."""
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": T0_US,
            "dur": 400,
        }
    ]
    for k in range(2):
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "nccl:all_to_all",
                "pid": 1,
                "tid": 1,
                "ts": T0_US + 100 * k + 5,
                "dur": 20,
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": T0_US + 100 * k + 10,
                "dur": 2,
                "args": {"correlation": 80 + k},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
                "pid": 0,
                "tid": 9,
                "ts": T0_US + 100 * k + 30,
                "dur": 30,
                "args": {"correlation": 80 + k, "device": 0, "stream": 9, "In msg nelems": nelems + k},
            }
        )
    return ev


def test_all_to_all_without_ids_matches_by_order_despite_sizes(store, tmp_path):
    # Ranks send different amounts (1000 vs 3000 elements): the k-th all_to_all of each rank in
    # the step is one instance (ordinal, size left out of the key for all-to-alls).
    write_rank(tmp_path / "run" / "r0.json", _a2a(1000), 0, backend="nccl")
    write_rank(tmp_path / "run" / "r1.json", _a2a(3000), 1, backend="nccl")
    ingest(store, [tmp_path / "run"], run="a2a")
    inst = store.sql(
        "SELECT op, pg, n_ranks, match_method FROM collective_instances ORDER BY instance_id"
    ).rows()
    assert inst == [("all_to_all", None, 2, "ordinal")] * 2


def _gloo_steps(arrivals_ms: list[float], step_ms: list[tuple[float, float]]) -> list[dict]:
    """A CPU rank: ProfilerStep#(k+1) over step_ms[k]; an aten::mm from the step start to the
    arrival, the c10d::allreduce_ enqueue at arrivals_ms[k] and its gloo work from the latest
    arrival of that step (given by the caller through step_ms end - 1 ms) for 0.5 ms."""
    ev = []
    for k, ((a, b), arr) in enumerate(zip(step_ms, arrivals_ms, strict=True)):
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{k + 1}",
                "pid": 1,
                "tid": 1,
                "ts": T0_US + a * 1000,
                "dur": (b - a) * 1000,
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": T0_US + a * 1000,
                "dur": (arr - a) * 1000,
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "c10d::allreduce_",
                "pid": 1,
                "tid": 1,
                "ts": T0_US + arr * 1000,
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
                "ts": T0_US + (b - 1) * 1000,
                "dur": 500,
                "args": {"Input Dims": [[64]], "Input type": ["float"]},
            }
        )
    return ev


def test_profiler_start_transient_is_left_out(store, tmp_path):
    # Two ranks, four 10 ms steps. Rank 1's profiler started 2 s late: its step 1 starts at 2000
    # ms (rank 0's at 0) and it arrives at 2005 ms, rank 0 at 5 ms (skew 2 s). Afterwards rank 1
    # arrives 0.1 ms after rank 0 in every step (skews 0.1 ms). Median skew 0.1 ms, median step
    # 10 ms: threshold max(20 x 0.1, 10) = 10 ms; the leading 2 s instance is the transient (the
    # profiling starts differ by 2,000 ms, at least half the skew), step 1 leaves stragglers and whatif.
    steps0 = [(0, 2010), (2010, 2020), (2020, 2030), (2030, 2040)]
    write_rank(tmp_path / "run" / "r0.json", _gloo_steps([5, 2015, 2025, 2035], steps0), 0)
    write_rank(
        tmp_path / "run" / "r1.json",
        _gloo_steps([2005, 2015.1, 2025.1, 2035.1], [(2000, 2010), *steps0[1:]]),
        1,
    )
    ingest(store, [tmp_path / "run"], run="tr")
    res = analyze(store, "stragglers", "tr")
    assert res.instances.height == 3 and res.instances["skew_ns"].to_list() == [100_000] * 3
    (note,) = [n for n in res.notes if n.startswith("profiler-start transient")]
    assert (
        "the first collective to arrive (all_reduce #1; step 1) waited up to 2,000.0 ms" in note
        and "2,000.0 ms apart" in note
    )
    wi = analyze(store, "whatif", "tr")
    assert wi.frame["step"].to_list() == [2, 3, 4] and wi.summary["transient_steps"].item() == 1


def _fr_two_ranks(d: Path, times_us: list[tuple[int, int, int]]) -> Path:
    """Flight Recorder dumps of ranks 0, 1 (pg "0" = [0, 1], no steps): all_reduce seq k + 1 created
    at times_us[k][0] on rank 0 and times_us[k][1] on rank 1, completed at times_us[k][2] (us)."""
    tmpl = json.loads((case("fr_two_groups_same_pg_name") / "rank0.fr.json").read_text())
    a0 = tmpl["entries"][0]["time_created_ns"]
    d.mkdir()
    for r in (0, 1):
        doc = json.loads(json.dumps(tmpl))
        entries = []
        for k, t in enumerate(times_us):
            e = json.loads(json.dumps(tmpl["entries"][0]))
            e.update(record_id=k, collective_seq_id=k + 1)
            e["time_created_ns"] = a0 + t[r] * US
            e["time_discovered_started_ns"] = e["time_created_ns"] + 10 * US
            e["time_discovered_completed_ns"] = a0 + t[2] * US
            entries.append(e)
        doc["entries"] = entries
        (d / f"rank{r}.fr.json").write_text(json.dumps(doc))
    return d


def test_no_steps_and_median_skew_zero_is_no_transient(store, tmp_path):
    """Without steps the transient threshold's floor is the spacing of a rank's collectives, not
    1 ns (g13 h09: Inspector records without steps where half the collectives have skew 0).

    By hand: 6 all_reduces 10 ms apart, rank 1 40 us late at the first 2, on time after: skews
    40, 40, 0, 0, 0, 0 us; the lower median skew is 0, so 20 x median = 0 and, without steps, the
    threshold was max(0, 0, 1) = 1 ns: the first 2 were a "profiler-start transient" and left out
    (rank 1 last at 0 of 4, wait caused 0). Now the floor is the median spacing of a rank's
    arrivals, 10 ms: nothing is left out; rank 1 last at 2 (4 ties), wait caused 2 x 40 = 80 us.
    A real transient is still left out: rank 1 started 2 s late (its first all_reduce created at
    2 s, rank 0's at 0, both complete at 2 s + 600 us; then every 10 ms, rank 1 40 us late once):
    skews 2 s, 40 us, 0, 0, 0, 0; threshold max(0, 10 ms) = 10 ms: the first instance only."""
    t = [(10_000 * k, 10_000 * k + (40 if k < 2 else 0), 10_000 * k + 600) for k in range(6)]
    ingest(store, [_fr_two_ranks(tmp_path / "late40", t)], run="late40")
    res = analyze(store, "stragglers", "late40")
    assert not [n for n in res.notes if n.startswith("profiler-start transient")]
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["instances"], r1["last_count"], r1["tie_count"], r1["wait_caused_ns"]) == (6, 2, 4, 80_000)
    s = 2_000_000
    t = [(0, s, s + 600)] + [
        (s + 10_000 * k, s + 10_000 * k + (40 if k == 1 else 0), s + 10_000 * k + 600) for k in range(1, 6)
    ]
    ingest(store, [_fr_two_ranks(tmp_path / "start2s", t)], run="start2s")
    res = analyze(store, "stragglers", "start2s")
    (note,) = [n for n in res.notes if n.startswith("profiler-start transient")]
    assert "the first collective to arrive" in note and "the median spacing of a rank's collectives" in note
    assert res.frame.filter(pl.col("rank") == 1)["instances"].item() == 5


def test_stall_before_the_first_collective_is_not_a_transient(store, tmp_path):
    # Both ranks start profiling together (step 1 at 0 ms on both), but rank 1 computes 2 s before
    # its first all-reduce (arrives at 2005 ms, rank 0 at 5). The skews and the threshold are those
    # of the test above, but the profiling starts differ by 0 ms, less than half the 2 s skew: a
    # real stall, kept. Rank 1 is last at all 4 instances: p = 0.5^4 = 0.0625 (not < 0.01), but its
    # 2,000 ms hold-up exceeds 20 x the median skew (median of 2000, 0.1, 0.1, 0.1 ms = 0.1 ms):
    # an episodic stall, named (its cost is far above 5%).
    steps0 = [(0, 2010), (2010, 2020), (2020, 2030), (2030, 2040)]
    write_rank(tmp_path / "run" / "r0.json", _gloo_steps([5, 2015, 2025, 2035], steps0), 0)
    write_rank(tmp_path / "run" / "r1.json", _gloo_steps([2005, 2015.1, 2025.1, 2035.1], steps0), 1)
    ingest(store, [tmp_path / "run"], run="stall")
    res = analyze(store, "stragglers", "stall")
    assert not [n for n in res.notes if n.startswith("profiler-start transient")]
    assert res.instances.height == 4 and res.instances["skew_ns"].to_list() == [2_000_000_000] + [100_000] * 3
    r1 = res.frame.filter(res.frame["rank"] == 1).row(0, named=True)
    assert r1["p_value"] == pytest.approx(0.5**4) and r1["named"]
    # holdup_pct follows its rule: hold-up (2005 - 5 = 2000 ms, then 3 x 0.1 ms: 2000.3 ms) over
    # the median step time (10 ms: steps of 2010, 10, 10, 10 ms on both ranks) x 4 steps = 40 ms,
    # not over the steps' own durations (2040 ms).
    assert r1["holdup_ns"] == 2_000_300_000 and r1["holdup_pct"] == pytest.approx(100 * 2000.3 / 40)
    assert "named for one hold-up of 2000.00 ms" in res.verdict["evidence"][0]
    v = combined_verdict(store, "stall")
    assert v.stragglers == (1,) and "p = 0.062 (not more often than chance: an episodic stall)" in v.text
    wi = analyze(store, "whatif", "stall")
    assert wi.summary["transient_steps"].item() == 0 and wi.frame["step"].to_list() == [1, 2, 3, 4]


def test_ties_are_ties(store, tmp_path):
    # Three ranks; at both collectives ranks 1 and 2 arrive at the same last instant (200 us),
    # rank 0 at 100 us: no rank is "last" (last_rank null), nobody gets the credit (not the lowest
    # rank), both count a tie.
    for r, arr in ((0, 100), (1, 200), (2, 200)):
        ev = [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": T0_US,
                "dur": 1000,
            }
        ]
        for k in range(2):
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "c10d::allreduce_",
                    "pid": 1,
                    "tid": 1,
                    "ts": T0_US + arr + 400 * k,
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
                    "ts": T0_US + 201 + 400 * k,
                    "dur": 19,
                    "args": {"Input Dims": [[64]], "Input type": ["float"]},
                }
            )
        write_rank(tmp_path / "run" / f"r{r}.json", ev, r, world=3)
    ingest(store, [tmp_path / "run"], run="tie")
    assert store.sql("SELECT last_rank FROM collective_instances").rows() == [(None,), (None,)]
    res = analyze(store, "stragglers", "tie")
    per = {r["rank"]: r for r in res.frame.iter_rows(named=True)}
    assert [(per[r]["last_count"], per[r]["tie_count"]) for r in (0, 1, 2)] == [(0, 0), (0, 2), (0, 2)]
    assert res.instances["last_rank"].null_count() == 2


def _p2p(ops: list[tuple[str, int, int]]) -> list[dict]:
    """A GPU rank of a 3-rank pipeline on process group "0" [0, 1, 2]: per (op, Seq, peer), a
    SendRecv kernel with Collective name send/recv, every 100 us from T0_US."""
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": T0_US,
            "dur": 400,
        }
    ]
    for k, (op, seq, peer) in enumerate(ops):
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": T0_US + 100 * k + 10,
                "dur": 2,
                "args": {"correlation": 60 + k},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_SendRecv",
                "pid": 0,
                "tid": 9,
                "ts": T0_US + 100 * k + 20,
                "dur": 40,
                "args": {
                    "correlation": 60 + k,
                    "device": 0,
                    "stream": 9,
                    "Collective name": op,
                    "Process Group Name": "0",
                    "Process Group Ranks": "[0, 1, 2]",
                    "Seq": seq,
                    "Src Rank" if op == "recv" else "Dst Rank": peer,
                    "In msg nelems": 64,
                    "dtype": "Float",
                },
            }
        )
    return ev


def test_point_to_point_counters_of_a_wide_group_are_not_matched_by_seq(store, tmp_path):
    # c10d numbers a rank's point-to-point ops in a group with one counter: rank 0 sends to 1 (its
    # p2p Seq 1), rank 1 receives from 0 (Seq 1) then sends to 2 (Seq 2), rank 2 receives from 1
    # (Seq 1). Key Seq 1 would hold ranks 0, 1 and 2 (three ends of two transfers): the group's
    # p2p sequence numbers are not per transfer, so they are not matched by Seq, with a warning;
    # each row names its peer, so the k-th transfer between two ranks is (g7): 0 -> 1 (send and
    # recv both at T0+20: skew 0, a tie) and 1 -> 2 (recv T0+20, send T0+120: skew 100 us, last 1).
    # That recv ends at T0+60, 60 us before its send starts, but no collective links the ranks' clocks
    # (no end times on two ranks: not aligned; hosts unknown), so the pair check
    # (traceprof.ingest.pair_check) compares sizes only (64 and 64 elements) and keeps the pair.
    write_rank(tmp_path / "run" / "r0.json", _p2p([("send", 1, 1)]), 0, world=3, backend="nccl")
    write_rank(
        tmp_path / "run" / "r1.json", _p2p([("recv", 1, 0), ("send", 2, 2)]), 1, world=3, backend="nccl"
    )
    write_rank(tmp_path / "run" / "r2.json", _p2p([("recv", 1, 1)]), 2, world=3, backend="nccl")
    warned = ingest(store, [tmp_path / "run"], run="pp").warnings
    inst = store.sql(
        """SELECT ranks_present, first_arrival_ns - $1, arrival_skew_ns, last_rank, match_method
           FROM collective_instances ORDER BY ranks_present""",
        [BASE],
    ).rows()
    assert inst == [
        ([0, 1], (T0_US + 20) * US, 0, None, "pair_order"),
        ([1, 2], (T0_US + 20) * US, 100 * US, 1, "pair_order"),
    ]
    assert not [w for w in warned if "paired by order" in w]
    assert any(
        "1 of 1 point-to-point sequence numbers are held by three or more ranks" in w
        and "(match_method pair_order)" in w
        for w in warned
    )


def _varying_steps(
    folder: Path,
    late: float,
    pad: float = 0.0,
    lengths: tuple[float, ...] = (700.0, 1000.0, 1300.0) * 3,
    late_in: frozenset[int] | None = None,
) -> Path:
    """2 ranks, steps of ``lengths`` us (default 9 of 700 / 1000 / 1300 us, three times: varying work,
    e.g. sequence lengths) plus ``pad`` us idle at their end, each one mm kernel of the step's work
    (length - 300 us: 400 / 700 / 1000) and one all-reduce that ends 100 us after the last arrival;
    rank 1's mm ``late`` us longer in every step (only in the steps ``late_in``, 0-based, when given)."""
    folder.mkdir()
    for r in (0, 1):
        ev: list[dict] = []
        b = 0.0
        for s, length in enumerate(lengths):
            work, x = length - 300.0, late * r * (late_in is None or s in late_in)
            ev.append(step(s + 1, b, length + pad))
            ar = collective_args(seq=s, ranks=[0, 1], nelems=1 << 20, out_nelems=1 << 20, group_size=2)
            ev += [
                launch(b + 10, 10 * s + 1),
                kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 7, b + 20, work + x, 10 * s + 1),
                {**launch(b + 20 + work + x - 5, 10 * s + 2), "args": {"correlation": 10 * s + 2, **ar}},
                kernel(
                    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                    20,
                    b + 20 + work + x,
                    100.0 + late * (late_in is None or s in late_in) - x,
                    10 * s + 2,
                    **ar,
                ),
            ]
            b += length + pad
        write_rank(folder / f"rank{r}.json", ev, r, world=2, backend="nccl")
    return folder


def test_steps_of_different_lengths_are_pooled_within_their_step(store, tmp_path):
    """2 ranks, 9 steps of 700 / 1000 / 1300 us (three times: varying work, e.g. sequence lengths),
    each one mm kernel of the step's work (400 / 700 / 1000 us) and one all-reduce; rank 1's mm 10 us
    longer in every step (1% of the 1000 us median step). By hand: the ideal mm of a step is the mean
    over its ranks, its work + 5 us; rank 1's own time put back adds 5 us to every step: 0.5% of the
    1000 us median step, so nobody is named. Pooled over all steps (the ideal mm 705 us everywhere)
    the 1300 us steps sat 300 us over their ideal on both ranks, all of it blamed on rank 1, a hair
    later: cost 10.3%, rank 1 named a straggler for 10 us."""
    ingest(store, [_varying_steps(tmp_path / "run", 10.0)], run="varying")
    w = analyze(store, "whatif", "varying")
    assert w.summary["pool"].item() == "step"
    # each step's ideal is 5 us under its replay: 405 / 705 / 1005 + the all-reduce's 100 us
    assert (w.frame["nogap_ns"] - w.frame["ideal_ns"]).to_list() == [5_000.0] * 9
    res = analyze(store, "stragglers", "varying")
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["last_count"], r1["median_lateness_ns"], r1["late_pct"]) == (9, 10_000, pytest.approx(1.0))
    assert r1["cost_pct"] == pytest.approx(0.5, abs=1e-6)
    assert res.frame["named"].sum() == 0
    # the run's steps alike (the case's shape): pooled over steps as before
    ingest(store, [_one_collective_steps(tmp_path / "alike", 2, {1: 10.0})], run="alike")
    assert analyze(store, "whatif", "alike").summary["pool"].item() == "all"


@pytest.mark.parametrize(
    ("late", "slowdown", "cost"), [(140.0, 940 / 870, 70 / 1200), (200.0, 1000 / 900, 100 / 1200)]
)
def test_a_material_straggler_does_not_pool_steps_of_different_lengths_over_all(
    store, tmp_path, late, slowdown, cost
):
    """The steps of :func:`_varying_steps`, each with 200 us idle at its end (steps of 900 / 1200 /
    1500 us), rank 1's mm 140 or 200 us longer in every step (12-17% of the 1200 us median step).
    Its lateness is rank 1's own, the same in every step: it is not noise, and the steps still do
    different work, so each op's ideal is pooled within its step. By hand: the ideal mm of a step is
    its work + late / 2, the all-reduce's transfer 100 us; replayed without gaps a step takes its
    work + late + 100, 800 + late us on average over the steps, and its ideal 800 + late / 2: S
    940 / 870 = 1.0805 (200 us: 1000 / 900 = 1.1111); rank 1's own times put back add late / 2 to
    every step, 70 us (100 us) of the 1200 us median step: 5.83% (8.33%), named. Pooled over all
    steps, as when the spread across a step's ranks (rank 1's lateness) counted as noise, each mm's
    ideal was 700 + late / 2 everywhere, the 400 us steps' ideals capped at their replay: S
    940 / 793.3 = 1.185 and rank 1's cost 12.2% (1000 / 833.3 = 1.200, 13.9%)."""
    ingest(store, [_varying_steps(tmp_path / "run", late, pad=200.0)], run="late")
    w = analyze(store, "whatif", "late")
    assert w.summary["pool"].item() == "step"
    assert (w.frame["nogap_ns"] - w.frame["ideal_ns"]).to_list() == [late / 2 * 1e3] * 9
    assert w.summary["slowdown"].item() == pytest.approx(slowdown, rel=1e-9)
    res = analyze(store, "stragglers", "late")
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert r1["cost_pct"] == pytest.approx(100 * cost, abs=1e-6)
    assert res.frame["named"].to_list() == [False, True]


@pytest.mark.parametrize(
    ("late", "slowdown", "cost"), [(0.0, 816.25 / 810.625, 0.0), (30.0, 846.25 / 830.9375, 15.3125 / 1015)]
)
def test_steps_that_drift_under_the_floor_are_pooled_over_all_with_or_without_a_straggler(
    store, tmp_path, late, slowdown, cost
):
    """2 ranks, 8 steps of 1000 / 1010 / 1020 / 1030 / 1040 / 1000 / 1010 / 1020 us (mm work 700..740
    us: every rank 0-40 us slower together, 2.0% of the 716.25 us mean work, under
    ``whatif.STEP_WORK_MIN_PCT``, 2.5%), no noise, rank 1 on time or 30 us late in every step: pooled
    over all steps both times, the straggler does not decide the pool (the spread across a step's
    ranks pooled the healthy run within its steps and the late one over all). By hand, on time: every
    step's ideal 716.25 + 100 us, capped at the 700 / 710 us steps' 800 / 810: S 816.25 / 810.625;
    late 30 us: the ideal mm 716.25 + 15, a step 831.25 capped at the two 700 us steps' 830: mean
    830.9375, S 846.25 / 830.9375 = 1.0184; rank 1's cost: its own times put back, the recorded
    846.25 us, 15.3125 us over the ideal, of the median step (the mean of the middle two, 1010 and
    1020 us: 1015 us): 1.51%."""
    drift = (1000.0, 1010.0, 1020.0, 1030.0, 1040.0, 1000.0, 1010.0, 1020.0)
    ingest(store, [_varying_steps(tmp_path / "run", late, lengths=drift)], run="drift")
    w = analyze(store, "whatif", "drift")
    assert w.summary["pool"].item() == "all"
    assert w.summary["slowdown"].item() == pytest.approx(slowdown, rel=1e-9)
    res = analyze(store, "stragglers", "drift")
    r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
    assert r1["cost_pct"] == pytest.approx(100 * cost, abs=1e-6)


def test_a_rank_late_in_some_steps_of_different_lengths_is_not_noise(store, tmp_path):
    """The steps of :func:`_varying_steps` (9 of 700 / 1000 / 1300 us, mm work 400 / 700 / 1000 us,
    200 us idle at their end), rank 1's mm 300 us longer in the first 5 of the 9 steps, no other
    noise. Its lateness comes and goes: a rank x step interaction, all of it the two-way fit's
    residual (rank 1's +66.7 us in its late steps, -83.3 us in the others: noise 111.8 us; the
    spread of the steps' means, 250 us, under 3 x that), so the steps were pooled over all: S
    1.189. The robust noise (each rank's median over steps taken out) is 0: rank 1's median step is
    a late one, so only the 4 others hold a residual (+-150 us) and the median residual is 0. The
    steps, which do different work, are pooled within each step. By hand: a step's ideal mm is the
    mean of its two ranks, work + 150 us in a late step; the all-reduce's transfer 100 us; replayed
    without gaps a step takes work + late + 100 us, on average (6300 + 5 x 300) / 9 + 100 =
    966.67 us, its ideal (6300 + 5 x 150) / 9 + 100 = 883.33 us: S = 8700 / 7950 = 1.0943 (what
    ``-p pool=step`` gave)."""
    late_in = frozenset(range(5))
    ingest(store, [_varying_steps(tmp_path / "run", 300.0, pad=200.0, late_in=late_in)], run="some")
    w = analyze(store, "whatif", "some")
    assert w.summary["pool"].item() == "step"
    assert w.summary["slowdown"].item() == pytest.approx(8700 / 7950, rel=1e-9)
    gap = [150_000.0 if s in late_in else 0.0 for s in range(9)]
    assert (w.frame["nogap_ns"] - w.frame["ideal_ns"]).to_list() == gap


#: 4 ranks, 9 steps of 1000 us, one all-reduce per step after the mm (700 us + the rank's lateness,
#: :func:`_one_collective_steps`), transfer 100 us. By hand: a step replays without gaps in 700 +
#: max(late) + 100 us; the ideal mm is the mean over the 4 ranks, 700 + sum(late) / 4 us. Fixing one
#: rank alone sets its mm to the smaller of its own and that ideal: the next latest rank still bounds
#: the step. The bound shares fix the ranks one after another (the largest fix first, then the most
#: lateness; ranks alike together, sharing equally): each saves the layer between its lateness and
#: the next one down (the last down to the ideal), % of nogap - ideal.
SEVERAL_LATE = {
    # 940 us, ideal 860: fixing rank 1 alone 900 (rank 3 bounds): 940 / 900 = 1.044, saving 40 us
    # (its hold-up, 9 x 40 = 0.36 ms); rank 3 alone saves nothing; shares 40 / 80 and 40 / 80
    "two unequal": ({1: 140.0, 3: 100.0}, 940, 860, {1: 940 / 900}, {1: 50.0, 3: 50.0}),
    # 900 us, ideal 850: neither alone saves anything (the other bounds); together 50 us, half each
    "two equal": ({1: 100.0, 3: 100.0}, 900, 850, {}, {1: 50.0, 3: 50.0}),
    # 950 us, ideal 892.5: rank 1 alone 920 (rank 2 bounds): 950 / 920; then rank 2 down to 900,
    # rank 3 down to 892.5: 30, 20 and 7.5 us of 57.5
    "three unequal": (
        {1: 150.0, 2: 120.0, 3: 100.0},
        950,
        892.5,
        {1: 950 / 920},
        {1: 3000 / 57.5, 2: 2000 / 57.5, 3: 750 / 57.5},
    ),
    # 900 us, ideal 875: 25 us, a third each
    "three equal": ({1: 100.0, 2: 100.0, 3: 100.0}, 900, 875, {}, {1: 100 / 3, 2: 100 / 3, 3: 100 / 3}),
    # one late rank: its fix is the whole excess, 940 / 835, as its recorded times put back on the ideal
    "one": ({1: 140.0}, 940, 835, {1: 940 / 835}, {1: 100.0}),
}


@pytest.mark.parametrize("case_name", list(SEVERAL_LATE))
def test_several_late_ranks_each_bound_steps_with_their_share(store, tmp_path, case_name):
    """Each rank that bounds steps gets its share (``bound_pct``), and a rank's fix alone
    (``fix_slowdown``, the straggler finding's speed-up) leaves the others' lateness in place
    (:data:`SEVERAL_LATE`, hand values). Before, whatif had only the largest rank's recorded times
    put back on the ideal (940 / 860 with two late ranks: rank 1 "100% of the excess", the finding
    "1.08x faster" without it), the next one's lateness counted as its own, and a rank never last
    (rank 3) had no share."""
    late, nogap, ideal, fixes, bound = SEVERAL_LATE[case_name]
    ingest(store, [_one_collective_steps(tmp_path / "run", 4, late, n_steps=9)], run="late")
    w = analyze(store, "whatif", "late")
    assert w.summary["slowdown"].item() == pytest.approx(nogap / ideal, rel=1e-9)
    ranks = w.blame.filter((pl.col("by") == "rank") & (pl.col("kind") == "blocking"))
    fix = {int(g): x for g, x in ranks.select("group", "fix_slowdown").rows()}
    assert fix == pytest.approx({r: fixes.get(r, 1.0) for r in range(4)}, rel=1e-9)
    share = {int(g): x for g, x in ranks.select("group", "bound_pct").rows()}
    assert share == pytest.approx({r: bound.get(r, 0.0) for r in range(4)}, abs=1e-9)
    named = [f"rank {r} {bound[r]:.0f}%" for r in sorted(bound, key=lambda r: (-bound[r], r))]
    note = next(n for n in w.notes if n.startswith("blocking: ranks that bound steps"))
    assert all(x in note for x in named), note
    # the shares are of the saving with every rank fixed, told apart from S's excess
    assert "each one's % of the saving with every rank fixed (bound_pct; not of S's excess" in note
    # stragglers' cost stays the time a rank's recorded times (up to the collectives it was last at,
    # alone) add to the ideal, of the 1000 us step: what its delays cost an ideal job (two unequal:
    # rank 1 80 us, 8.0%); a rank never last alone (ties, or a second late rank) has none
    res = analyze(store, "stragglers", "late")
    cost = dict(res.frame.select("rank", "cost_pct").iter_rows())
    top = {r: nogap - ideal for r in fixes}
    assert cost == pytest.approx({r: 100 * top.get(r, 0.0) / 1000 for r in range(4)}, abs=1e-6)
    if case_name == "two unequal":
        r1 = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
        assert (r1["holdup_ns"], r1["named"]) == (360_000, True)
        # the finding: its delays alone add 8% of a step (cost_pct: 80 us over the 1000 us recorded
        # step), fixing it alone buys 1.04x (940 -> 900 us)
        found = next(x for x in summarize(store, "late").findings if x.topic == "stragglers")
        assert (
            "its delays alone add 8% of a step (what-if), and fixing it alone, the other ranks' lateness kept, "
            "steps would be 1.04x faster" in (found.text)
        )
        # rank 3's 50% is of the saving with every rank fixed (80 us: rank 1's fix 40 us first, then
        # rank 3's 40 us), not of S's excess (rank 1 alone "100% of the excess")
        assert (
            "; then rank 3 (50%) bound them (whatif's bound shares: % of the saving with every rank fixed, "
            "the ranks fixed one after another, the largest fix alone first)" in found.text
        )


#: :data:`SEVERAL_LATE`'s cases: the replays ``_whatif_fix.fixes`` makes for the blocking kind (none
#: of the recorded base, the frame's own; ``PutBack.step_t`` calls): one per late rank's fix (none
#: for the only late rank: it is all fixed), one with all fixed, and one per bound turn but the first
#: (one rank: its fix) and the one fixing the last lateness (all fixed). Before: the base replayed per
#: kind, and every turn replayed: 7, 6, 8, 7 and 3 calls.
FIX_REPLAYS = {
    "two unequal": 2 + 1,  # turns [1], [3]: the first and the last
    "two equal": 2 + 1,  # one turn [1, 3]: the last
    "three unequal": 3 + 1 + 1,  # turns [1], [2], [3]: [2] replayed
    "three equal": 3 + 1,  # one turn [1, 2, 3]
    "one": 0 + 1,  # one turn [1]: the last
}


@pytest.mark.parametrize("case_name", list(SEVERAL_LATE))
def test_fixes_replay_only_what_they_cannot_take_from_others(store, tmp_path, monkeypatch, case_name):
    """``_whatif_fix.fixes`` takes the recorded replay from the frame's (no replay of its own, but in
    ``step_t``) and
    replays only what no other replay gives (:data:`FIX_REPLAYS`); the figures stay those of
    :func:`test_several_late_ranks_each_bound_steps_with_their_share`."""
    calls = {"replay": 0, "step_t": 0, "kind": ""}
    inside = [False]
    fixes, step_t, replay_weights = _whatif_fix.fixes, _whatif_fix.PutBack.step_t, _replay.replay_weights

    def counted_fixes(*args):  # (tl, w_base, [val,] w_fix, ranks)
        w_base, w_fix = args[1], args[-2]
        inside[0] = True
        calls["step_t"] = 0
        try:
            out = fixes(*args)
        finally:
            inside[0] = False
        # the blocking kind's fixes are the ones with lateness in durations (host: no gap is late)
        if bool(np.any(w_fix < w_base)):
            calls["kind"] = f"{calls['kind']}+{calls['step_t']}"
        return out

    def counted_step_t(self, at, w_at):  # its own full replays (many nodes changed) not counted
        was, inside[0] = inside[0], False
        calls["step_t"] += was
        try:
            return step_t(self, at, w_at)
        finally:
            inside[0] = was

    def counted_replay(tl, w):
        calls["replay"] += inside[0]
        return replay_weights(tl, w)

    monkeypatch.setattr(_whatif_fix, "fixes", counted_fixes)
    monkeypatch.setattr(_whatif_fix.PutBack, "step_t", counted_step_t)
    monkeypatch.setattr(_replay, "replay_weights", counted_replay)
    late, nogap, ideal, fix, bound = SEVERAL_LATE[case_name]
    ingest(store, [_one_collective_steps(tmp_path / "run", 4, late, n_steps=9)], run="late")
    w = analyze(store, "whatif", "late")
    assert calls["replay"] == 0
    assert calls["kind"] == f"+{FIX_REPLAYS[case_name]}"
    ranks = w.blame.filter((pl.col("by") == "rank") & (pl.col("kind") == "blocking"))
    got = {int(g): x for g, x in ranks.select("group", "fix_slowdown").rows()}
    assert got == pytest.approx({r: fix.get(r, 1.0) for r in range(4)}, rel=1e-9)
    share = {int(g): x for g, x in ranks.select("group", "bound_pct").rows()}
    assert share == pytest.approx({r: bound.get(r, 0.0) for r in range(4)}, abs=1e-9)


def _stage_rank(rank: int) -> list[dict]:
    """Rank ``rank`` of a two-stage pipeline on two hosts (``test_unaligned_clock_sets_*``), us on
    its own clock: node-1 (ranks 2, 3) runs 3000 us ahead. True times: TP all_reduce of stage 0 (pg
    "1" = [0, 1]) r0 [0, 200], r1 [20, 200]; send r0 -> r2, r1 -> r3 (pg "3" = [0, 2], "4" = [1, 3], p2p
    Seq 1) [300, 400], recv [250, 400]; TP all_reduce of stage 1 (pg "2" = [2, 3]) r2 [500, 700],
    r3 [530, 700]."""
    ahead = 3000 if rank >= 2 else 0
    ar = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    sr = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    if rank < 2:
        peer = collective_args(
            "send", 1, pg=str(3 + rank), ranks=[rank, rank + 2], p2p_src=rank, p2p_dst=rank + 2
        )
        ops = [
            (ar, collective_args("allreduce", 1, pg="1", ranks=[0, 1]), (0, 20)[rank], 200),
            (sr, peer, 300, 400),
        ]
    else:
        peer = collective_args(
            "recv", 1, pg=str(1 + rank), ranks=[rank - 2, rank], p2p_src=rank - 2, p2p_dst=rank
        )
        ops = [
            (sr, peer, 250, 400),
            (ar, collective_args("allreduce", 1, pg="2", ranks=[2, 3]), (500, 530)[rank - 2], 700),
        ]
    events = [step(1, ahead, 1000)]
    for i, (name, args, a, b) in enumerate(ops):
        events.append(launch(ahead + a - 8, 70 + i))
        events.append(kernel(name, 20, ahead + a, b - a, 70 + i, **args))
    return events


def test_unaligned_clock_sets_leave_their_links_out(store, tmp_path):
    """Pipeline stages on two hosts linked by send / recv only: no collective with end times links
    the hosts, so their clocks cannot be aligned (node-1's 3 ms stays in) and the transfers between
    them have no measurable arrival skew (g13 h17).

    By hand: before, the two p2p instances had skews 2,950 us (r2 recv at 3250 vs r0 send at 300) and
    2,950 us, rank 3 last at 2 of 2 (held up 2,980 us), rank 2 at 1; now they are left out with a
    note: 2 instances, the TP all_reduces: rank 1 last (20 us late: wait caused 20 us), rank 3 last
    (30 us late: 30 us)."""
    for r in range(4):
        write_rank(
            tmp_path / "pp" / f"r{r}.json", _stage_rank(r), r, world=4, backend="nccl", host=f"node-{r // 2}"
        )
    ingest(store, [tmp_path / "pp"], run="pp")
    res = analyze(store, "stragglers", "pp")
    assert sorted(res.instances["pg"].to_list()) == ["1", "2"]
    assert res.instances.sort("pg")["skew_ns"].to_list() == [20_000, 30_000]
    got = {
        r["rank"]: (r["instances"], r["last_count"], r["wait_caused_ns"])
        for r in res.frame.iter_rows(named=True)
    }
    assert got == {0: (1, 0, 0), 1: (1, 1, 20_000), 2: (1, 0, 0), 3: (1, 1, 30_000)}
    assert [n for n in res.notes if "could not be aligned to each other" in n and n.startswith("2 matched")]


def _stages(store, tmp_path) -> None:
    """The two-stage pipeline of :func:`_stage_rank` ingested as run "pp"."""
    for r in range(4):
        write_rank(
            tmp_path / "pp" / f"r{r}.json", _stage_rank(r), r, world=4, backend="nccl", host=f"node-{r // 2}"
        )
    ingest(store, [tmp_path / "pp"], run="pp")


def test_unaligned_clock_sets_whatif_measures_each_set_on_its_own_clock(store, tmp_path):
    """whatif on the pipeline of :func:`_stage_rank` (g13 h17): the send / recv instances are left
    out (their arrivals are on different clocks), so each stage is one all_reduce, and each stage's
    step is measured on its own clock; the job's step is the longer stage's.

    By hand (us, own clocks): stage 0 r0 [0, 200], r1 [20, 200]: 200 from its first arrival; stage 1
    r2 [3500, 3700], r3 [3530, 3700]: 200 from 3500; actual = max(200, 200) = 200 (before: 3700 - 0 =
    3700, node-1's 3 ms in it). No host gaps: transfers from the last arrival, 180 and 170: nogap
    180. The earliest item of stage 1 had a host gap of 3500 us from the run's step start (before:
    host slowdown 1.9 and more), now 0: r1's 20 and r3's 30 are its only gaps."""
    _stages(store, tmp_path)
    res = analyze(store, "whatif", "pp")
    row = res.frame.row(0, named=True)
    assert (row["actual_ns"], row["replay_ns"], row["nogap_ns"]) == (200_000, 200_000, 180_000)


def test_unaligned_clock_sets_critical_path_job_step_on_one_clock(store, tmp_path):
    """critical_path's job step on the pipeline of :func:`_stage_rank`: each stage's step windows on
    its own clock, the job's step the longer stage's, its path within that stage.

    By hand (us): stage 0's windows run from the ProfilerStep start 0 to the last kernel end 400
    (send [300, 400]): 400; stage 1's from 3000 to 3700 (all_reduce end): 700. Job step 1 = 700 on
    stage 1's clock, ending on rank 2 (rank 2 and 3 end together: the lower); before: 3000 + 700 =
    3700 from stage 0's start, 3000 of it idle "outside the rank's profiled span". The path: rank 2's
    transfer [3530, 3700] (170), crossing to rank 3 (last at 3530), host-bound [3400, 3530] (130),
    its recv [3250, 3400] (150, transfer: its wait is not measurable) and host-bound [3000, 3250]
    (250): 170 + 130 + 150 + 250 = 700."""
    _stages(store, tmp_path)
    res = analyze(store, "critical_path", "pp")
    assert res.steps.select("step", "step_ns", "end_rank", "crossings").rows() == [(1, 700_000, 2, 1)]
    path = res.path.sort("seq").select("rank", "kind", "duration_ns").rows()
    assert path == [
        (3, "host_bound", 250_000),
        (3, "transfer", 150_000),
        (3, "host_bound", 130_000),
        (2, "transfer", 170_000),
    ]
    assert int(res.path["duration_ns"].sum()) == 700_000


def test_unaligned_clock_sets_leave_point_to_point_pairs_out(store):
    """``arrivals.p2p_items`` (send / recv that matching left unmatched, e.g. gloo's) across clock
    sets that could not be aligned to each other: hosts a (ranks 0, 1) and b (2, 3), each linked
    inside by an all_reduce (instances 1, 2), nothing across (runs.clock_aligned false). Rank 0
    sends to rank 1 (start 1000, recv 1200) and to rank 2 (start 2000, recv at 5000 on b's clock).

    By hand: the 0 -> 1 pair stays (arrivals 1000, 1200: rank 0 waits 200 ns); the 0 -> 2 pair's
    wait of 3000 ns is across the clocks, so it is left out, and the note counts it (1)."""
    from traceprof.engine.arrivals import p2p_items, unaligned_note

    con = store.con
    con.execute("INSERT INTO runs VALUES (1, 'r', 4, TIMESTAMP '2026-01-01', [], false)")
    for r in range(4):
        con.execute(
            "INSERT INTO traces (trace_id, run_id, rank, host, clock_offset_ns, clock_residual_ns) "
            "VALUES (?, 1, ?, ?, 0, 0)",
            [r + 1, r, "ab"[r // 2]],
        )
        con.execute(
            "INSERT INTO collectives (run_id, rank, trace_id, source, pg, p2p, op, bytes_in, start_ns, end_ns, "
            "instance_id) VALUES (1, ?, ?, 'gloo', 'tp', false, 'all_reduce', 8, 100, 500, ?)",
            [r, r + 1, 1 + r // 2],
        )
    for rank, op, peer, start in (
        (0, "send", 1, 1000),
        (1, "recv", 0, 1200),
        (0, "send", 2, 2000),
        (2, "recv", 0, 5000),
    ):
        con.execute(
            "INSERT INTO collectives (run_id, rank, trace_id, source, p2p, op, peer, bytes_in, start_ns, end_ns) "
            "VALUES (1, ?, ?, 'gloo', true, ?, ?, 8, ?, ?)",
            [rank, rank + 1, op, peer, start, start + 500],
        )
    got = p2p_items(store, 1).sort("rank")
    assert got.select("rank", "op", "arrival_ns").rows() == [(0, "send", 1000), (1, "recv", 1200)]
    note = unaligned_note(store, 1)
    assert note is not None and note.startswith("1 matched collective(s) or transfer(s)")


def test_unaligned_clock_sets_whatif_each_step_from_each_sets_own_start(store, tmp_path):
    """Two hosts that share no collective (tensor-parallel groups "1" = [0, 1] on node-0, "2" =
    [2, 3] on node-1, 3000 us ahead), two steps: each step of each set is measured from that set's
    own start of the step, so the sets' offsets differing from step to step do not enter it.

    By hand (us, own clocks): step 1: node-0 all_reduce r0 [100, 300], r1 [120, 300]: 200; node-1
    r2 [3500, 3700], r3 [3530, 3700]: 200; job 200 (before 3700 - 100 = 3600). Step 2: node-0 r0
    [1100, 1500], r1 [1200, 1500]: 400; node-1 r2, r3 [4600, 4700]: 100; job 400 (before 4700 -
    1100 = 3600)."""
    spans = {0: [(100, 300), (1100, 1500)], 1: [(120, 300), (1200, 1500)], 2: [(500, 700), (1600, 1700)]}
    spans[3] = [(530, 700), (1600, 1700)]
    two_host_tp_run(tmp_path / "tp", spans)
    ingest(store, [tmp_path / "tp"], run="tp")
    res = analyze(store, "whatif", "tp")
    assert res.frame.sort("step").select("step", "actual_ns").rows() == [(1, 200_000), (2, 400_000)]
