"""Matching in SQL (``traceprof.ingest.matching._assign``) against the polars implementation it
replaced, kept here as the reference: the same instance ids, methods and notes on seeded random runs
that exercise every step of the module doc (ids, pg/seq, the three fallbacks, ordinals, all-to-all
sizes, null steps and arrivals) and on real corpus traces.

The one place the two could disagree by design: rows of one ordinal partition that arrive and
start at the same time (or both NULL). The polars sort did not keep their order (``maintain_order``
off), so their ordinals were whatever the sort gave; SQL orders them by ``rowid``. The reference
sorts by rowid last too (stable), which is the order the store gives them in.
"""

from __future__ import annotations

import random

import polars as pl
import pytest

from tests.conftest import corpus
from traceprof.ingest import matching
from traceprof.ingest.ingest import ingest
from traceprof.ingest.matching import _ROWS, CROSS_STEP_SHARE, MIN_STRIDE_DIFFS
from traceprof.storage.store import Store

_GROUP = ["source", "g_pg", "g_ranks", "p2p"]


def _bad_groups_ref(ided: pl.DataFrame, cid: pl.DataFrame) -> pl.DataFrame:
    """The polars step 3 (as it was in traceprof.ingest.matching); ``cid``: the rows with a Comms
    Id, whose point-to-point keys count for the wide rule too."""
    cid = cid.filter(pl.col("p2p"))
    if ided.is_empty() and cid.is_empty():
        return pl.DataFrame(schema={**{c: ided.schema[c] for c in _GROUP}, "why": pl.Utf8})
    # a key astride a step boundary (two adjacent steps, each row the last of its rank's in the earlier
    # step or the first in the later one) counts as one step
    ided = ided.with_columns(
        (pl.col("seq") == pl.col("seq").min().over([*_GROUP, "rank", "step"])).alias("first_in"),
        (pl.col("seq") == pl.col("seq").max().over([*_GROUP, "rank", "step"])).alias("last_in"),
        pl.col("step").min().over([*_GROUP, "seq"]).alias("k_lo"),
        pl.col("step").max().over([*_GROUP, "seq"]).alias("k_hi"),
    )
    at_edge = (
        pl.col("step").is_null()
        | ((pl.col("step") == pl.col("k_lo")) & pl.col("last_in"))
        | ((pl.col("step") == pl.col("k_hi")) & pl.col("first_in"))
    )
    keys = ided.group_by([*_GROUP, "seq"]).agg(
        pl.col("rank").n_unique().alias("n"),
        pl.when(((pl.col("step").max() - pl.col("step").min()) == 1) & at_edge.all())
        .then(1)
        .otherwise(pl.col("step").drop_nulls().n_unique())
        .alias("steps"),
    )
    cross = (
        keys.filter(pl.col("n") >= 2)
        .group_by(_GROUP)
        .agg(
            (pl.col("steps") > 1).mean().alias("share"),
            (pl.col("steps") > 1).sum().alias("k"),
            pl.len().alias("of"),
        )
    )
    cross = cross.filter(pl.col("share") > CROSS_STEP_SHARE).select(
        *_GROUP, pl.format("{} of {} sequence numbers hold rows of different steps", "k", "of").alias("why")
    )
    stride = ided.sort("arrival_ns", "seq", "rid").with_columns(
        pl.col("seq").diff().over([*_GROUP, "rank"]).alias("d")
    )
    per_rank = (
        stride.filter(pl.col("d").is_not_null())
        .group_by([*_GROUP, "rank"])
        .agg(pl.col("d").sort().get((pl.len() - 1) // 2).alias("stride"), pl.len().alias("n"))
        .filter(pl.col("n") >= MIN_STRIDE_DIFFS)
    )
    strides = per_rank.group_by(_GROUP).agg(
        pl.col("stride").n_unique().alias("n"),
        pl.col("stride").min().alias("lo"),
        pl.col("stride").max().alias("hi"),
    )
    strides = strides.filter(pl.col("n") > 1).select(
        *_GROUP, pl.format("ranks step their sequence numbers by {} to {}", "lo", "hi").alias("why")
    )
    cid_keys = cid.group_by([*_GROUP, "comms_id"]).agg(pl.col("rank").n_unique().alias("n"))
    p2p_keys = pl.concat([keys.filter(pl.col("p2p")).select(*_GROUP, "n"), cid_keys.select(*_GROUP, "n")])
    wide = (
        p2p_keys.filter(pl.col("n") >= 2)
        .group_by(_GROUP)
        .agg(
            (pl.col("n") > 2).mean().alias("share"), (pl.col("n") > 2).sum().alias("k"), pl.len().alias("of")
        )
    )
    wide = wide.filter(pl.col("share") > CROSS_STEP_SHARE).select(
        *_GROUP,
        pl.format(
            "{} of {} point-to-point sequence numbers are held by three or more ranks", "k", "of"
        ).alias("why"),
    )
    return pl.concat([cross, strides, wide]).unique(_GROUP, keep="first", maintain_order=True)


def _assign_ref(rows: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The polars steps 1 to 5 (as they were), with rowid as the last sort key (module doc)."""
    rows = rows.sort("rid").with_columns(
        pl.col("pg").fill_null("").alias("g_pg"), pl.col("pg_ranks").fill_null("").alias("g_ranks")
    )
    cid = rows.filter(pl.col("comms_id").is_not_null())
    rest = rows.filter(pl.col("comms_id").is_null())
    ided = rest.filter(pl.col("pg").is_not_null() & pl.col("seq").is_not_null())
    bad = _bad_groups_ref(ided, cid).sort(_GROUP)
    cid = cid.join(bad.filter(pl.col("p2p")).select(_GROUP), on=_GROUP, how="anti")
    notes = [
        f"source {r['source']}, process group {r['g_pg']!r}{' ' + r['g_ranks'] if r['g_ranks'] else ''} "
        f"({'point-to-point' if r['p2p'] else 'collectives'}): {r['why']}, so they cannot be per group; "
        + (
            "a send and a recv that name their peer matched as the k-th transfer between those two "
            "ranks (match_method pair_order), the others left unmatched"  # rows here name no peer
            if r["p2p"]
            else "matched by order within the step instead (match_method step_order)"
        )
        for r in bad.iter_rows(named=True)
    ]
    bad_p2p = ided.join(bad.filter(pl.col("p2p")).select(_GROUP), on=_GROUP, how="semi").select("rid")
    ided = ided.join(bad.select(_GROUP), on=_GROUP, how="anti")
    by_order = (
        rest.join(ided.select("rid"), on="rid", how="anti")
        .join(bad_p2p, on="rid", how="anti")
        .filter(~(pl.col("p2p") & (pl.col("pg").is_null() | pl.col("seq").is_null())))
    )
    size = (
        pl.when(pl.col("op").fill_null("").str.contains("all_to_all"))
        .then(pl.lit("*"))
        .when(pl.col("size").is_null().any().over([*_GROUP, "op"]))
        .then(pl.lit("*"))  # a size unknown on some row of the op: by order alone
        .otherwise(pl.col("size").cast(pl.Utf8))
    )
    # a group some rank of which has no steps (and some other rank has): by order over the run
    by_run = pl.col("stepless").any().over(_GROUP) & ~pl.col("stepless").all().over(_GROUP)
    by_order = by_order.with_columns(by_run.alias("by_run"))
    notes += [
        f"source {r['source']}, process group {r['g_pg']!r}{' ' + r['g_ranks'] if r['g_ranks'] else ''}: "
        f"rank{'s' if len(r['ranks']) > 1 else ''} {', '.join(map(str, r['ranks']))} "
        f"{'have' if len(r['ranks']) > 1 else 'has'} no steps (no ProfilerStep in the trace), so its collectives "
        "without sequence numbers were matched by their order over the run (the k-th of each op and size "
        "on every rank) instead of within the step: right when every rank's trace covers the same steps"
        for r in by_order.filter("by_run")
        .group_by(_GROUP[:3])
        .agg(pl.col("rank").filter("stepless").unique().sort().alias("ranks"))
        .sort(_GROUP[:3])
        .iter_rows(named=True)
    ]
    by_order = by_order.with_columns(pl.when("by_run").then(None).otherwise(pl.col("step")).alias("step"))
    part = [*_GROUP, "op", "_size", "step"]
    by_order = by_order.with_columns(size.alias("_size")).sort(
        "rank", "arrival_ns", "start_ns", "rid", nulls_last=True, maintain_order=True
    )
    by_order = by_order.with_columns(pl.int_range(pl.len()).over([*part, "rank"]).alias("_k"))
    is_fallback = (
        pl.struct(_GROUP).is_in(bad.select(pl.struct(_GROUP)).to_series().implode())
        if bad.height
        else pl.lit(False)
    )
    keyed = pl.concat(
        [
            cid.select(
                "rid",
                "arrival_ns",
                "arr1",
                "arr2",
                pl.lit("comms_id").alias("method"),
                pl.concat_str([pl.lit("c"), "source", "comms_id"], separator="|").alias("key"),
            ),
            ided.select(
                "rid",
                "arrival_ns",
                "arr1",
                "arr2",
                pl.lit("pg_seq").alias("method"),
                pl.concat_str(
                    [pl.lit("s"), *_GROUP[:3], pl.col("p2p").cast(pl.Utf8), pl.col("seq").cast(pl.Utf8)],
                    separator="|",
                ).alias("key"),
            ),
            by_order.select(
                "rid",
                "arrival_ns",
                "arr1",
                "arr2",
                pl.when(is_fallback).then(pl.lit("step_order")).otherwise(pl.lit("ordinal")).alias("method"),
                pl.concat_str(
                    [
                        pl.lit("o"),
                        *_GROUP[:3],
                        pl.col("p2p").cast(pl.Utf8),
                        pl.col("op").fill_null("?"),
                        "_size",
                        pl.col("step").cast(pl.Utf8).fill_null("-"),
                        pl.col("_k").cast(pl.Utf8),
                    ],
                    separator="|",
                ).alias("key"),
            ),
        ]
    )
    # numbered by first arrival, one clock per instance (schema.INSTANCE_ARRIVAL_SQL): the preferred
    # one where every row with a time has it, else the other one where every such row has that
    first1 = (pl.col("arr1").is_not_null() | pl.col("arr2").is_null()).all()
    first2 = (pl.col("arr2").is_not_null() | pl.col("arr1").is_null()).all()
    firsts = (
        keyed.group_by("key")
        .agg(
            pl.coalesce(
                pl.when(first1).then(pl.col("arr1").min()).when(first2).then(pl.col("arr2").min()),
                pl.col("arrival_ns").min(),
            ).alias("first")
        )
        .sort("first", "key", nulls_last=True)
        .with_row_index("instance_id", offset=1)
    )
    return keyed.join(firsts.select("key", "instance_id"), on="key").select(
        "rid", pl.col("instance_id").cast(pl.Int64), "method"
    ), notes


def _both(store: Store, run_id: int) -> tuple[tuple[list, list], tuple[list, list]]:
    """((rid, instance_id, method) rows and notes) of the SQL matching, then of the reference."""
    summary = matching.match_run(store, run_id)
    got = store.con.execute(
        "SELECT rowid, instance_id, match_method FROM collectives WHERE run_id = ? ORDER BY rowid", [run_id]
    ).fetchall()
    rows = store.sql(_ROWS.replace("$run", str(run_id)))
    assigned, notes = _assign_ref(rows) if rows.height else (pl.DataFrame(), [])
    notes += matching.step_shift_notes(store, run_id)  # the steps' alignment: RUN_STEPS_SQL, read by _ROWS
    ref = {r: (i, m) for r, i, m in assigned.iter_rows()} if assigned.height else {}
    want = [(rid, *ref.get(rid, (None, None))) for rid in rows.sort("rid")["rid"].to_list()]
    return (got, list(summary.notes)), (want, notes)


_OPS = ["all_reduce", "all_gather", "all_to_all", "all_to_allv", "send", "recv", None]


def _random_run(store: Store, seed: int) -> int:
    """A run of 1-5 ranks with random collectives rows (every column matching reads)."""
    rnd = random.Random(seed)
    ranks = rnd.randint(1, 5)
    con = store.con
    con.execute("INSERT INTO runs VALUES (1, 'r', NULL, TIMESTAMP '2026-01-01', [], false)")
    for rank in range(ranks):
        # some ranks number their steps differently (RUN_STEPS_SQL maps them by order)
        base = rnd.choice([0, 0, 100])
        for k in range(rnd.randint(0, 3)):
            con.execute(
                "INSERT INTO steps (run_id, rank, trace_id, step) VALUES (1, ?, ?, ?)",
                [rank, rank + 1, base + k],
            )
    rows = []
    groups = [("g0", "[0, 1]"), ("g1", None), ("", "[0, 1, 2]"), (None, None)]
    for rank in range(ranks):
        seq_of: dict[tuple, int] = {}
        stride = rnd.choice([1, 1, 2])
        t = rnd.randint(0, 50)
        for _ in range(rnd.randint(0, 40)):
            pg, pg_ranks = rnd.choice(groups)
            op = rnd.choice(_OPS)
            p2p = rnd.choice([None, None, True, False])
            fam = (pg, pg_ranks, p2p)
            seq_of[fam] = seq_of.get(fam, rnd.randint(0, 3)) + rnd.choice([stride, stride, stride, 1, 3])
            seq = None if rnd.random() < 0.15 else seq_of[fam]
            comms = rnd.choice([None] * 6 + [f"id{rnd.randint(0, 5)}"])
            source = rnd.choice(["nccl_kernel", "nccl_kernel", "record_param_comms", "gloo"])
            t += rnd.choice([0, 1, 7, 100])  # equal arrivals too
            start = None if rnd.random() < 0.1 else t
            enter = None if rnd.random() < 0.3 else t - rnd.randint(0, 5)
            step = rnd.choice([None, 0, 1, 2, 100, 101])
            size = rnd.choice([None, 8, 16, 1024])
            rows.append((rank, rank + 1, source, pg, pg_ranks, seq, p2p, comms, op, size, enter, start, step))
    if seed % 4 == 0:  # a group whose ranks step their sequence numbers by 1 and 2 (step 3's strides)
        for rank in range(ranks):
            for k in range(5):
                seq = k * (1 + rank % 2)
                rows.append(
                    (
                        rank,
                        rank + 1,
                        "nccl_kernel",
                        "gs",
                        None,
                        seq,
                        False,
                        None,
                        "all_reduce",
                        8,
                        None,
                        10 * k,
                        None,
                    )
                )
    rnd.shuffle(rows)  # rowid order is not arrival order
    for r in rows:
        con.execute(
            "INSERT INTO collectives (run_id, rank, trace_id, source, pg, pg_ranks, seq, p2p, comms_id, op, "
            "bytes_in, enter_ns, start_ns, end_ns, step) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [*r[:11], r[11], None if r[11] is None else r[11] + 5, r[12]],
        )
    return 1


@pytest.mark.parametrize("seed", range(60))
def test_sql_matching_equals_the_polars_reference_on_random_runs(store, seed):
    got, want = _both(store, _random_run(store, seed))
    assert got == want


def test_the_random_runs_reach_every_method_and_fallback(tmp_path):
    """The generator above is not vacuous: over its seeds every method and every note kind occurs."""
    methods: set[str] = set()
    notes: list[str] = []
    for seed in range(60):
        with Store(tmp_path / f"s{seed}.duckdb") as s:
            got, _ = _both(s, _random_run(s, seed))
            methods |= {m for _, _, m in got[0] if m}
            notes += got[1]
    assert methods == {"comms_id", "pg_seq", "ordinal", "step_order"}
    text = "\n".join(notes)
    for why in (
        "sequence numbers hold rows of different steps",
        "ranks step their sequence numbers by",
        "point-to-point sequence numbers are held by three or more ranks",
    ):
        assert why in text


@pytest.mark.parametrize(
    "rel",
    [
        "hta/trace_filter",
        "hta/nccl_parser_config",
        "flight_recorder/gloo_cpu_4rank",
        "kineto_misc/bytedance_straggler_whatif/trace-AR.parquet",
        "kineto_misc/bytedance_straggler_whatif/trace-ST.parquet",
    ],
)
def test_sql_matching_equals_the_polars_reference_on_real_traces(store, rel):
    folder = corpus(rel)
    run_id = ingest(store, [folder], run="r").runs["r"]
    got, want = _both(store, run_id)
    assert got == want
    assert any(i is not None for _, i, _ in got[0])


@pytest.mark.parametrize("reverse", [False, True])
def test_an_instances_op_and_step_do_not_follow_the_rows_order(tmp_path, reverse):
    """``collective_instances.op`` and ``.step`` were ``mode()`` of the instance's rows, which on a tie
    returns the value it met first: a send matched with its recv (one row each) was 'send' or 'recv' as
    the rows came. By hand, in either insertion order: the transfer (group pp, seq 1: rank 0 sends in
    step 0, rank 1 receives in step 0) is 'send/recv', step 0; a collective matched by Comms Id whose
    two ranks name it all_reduce / broadcast in steps 4 / 3 (one each: a tie) takes the smallest of
    each, 'all_reduce' and step 3."""
    rows = [
        # rank, source, pg, pg_ranks, seq, p2p, comms_id, op, start_ns, step
        (0, "nccl_kernel", "pp", "[0, 1]", 1, True, None, "send", 100, 0),
        (1, "nccl_kernel", "pp", "[0, 1]", 1, True, None, "recv", 110, 0),
        (0, "nccl_kernel", "dp", "[0, 1]", None, False, "id7", "all_reduce", 200, 4),
        (1, "nccl_kernel", "dp", "[0, 1]", None, False, "id7", "broadcast", 210, 3),
    ]
    with Store(tmp_path / "s.duckdb") as s:
        s.con.execute("INSERT INTO runs VALUES (1, 'r', NULL, TIMESTAMP '2026-01-01', [], false)")
        for rank, source, pg, pg_ranks, seq, p2p, cid, op, start, step in reversed(rows) if reverse else rows:
            s.con.execute(
                "INSERT INTO collectives (run_id, rank, trace_id, source, pg, pg_ranks, seq, p2p, comms_id, op, "
                "bytes_in, start_ns, end_ns, step) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, 8, ?, ?, ?)",
                [rank, rank + 1, source, pg, pg_ranks, seq, p2p, cid, op, start, start + 5, step],
            )
        matching.match_run(s, 1)
        got = s.con.execute("SELECT pg, op, step, n_ranks FROM collective_instances ORDER BY pg").fetchall()
    assert got == [("dp", "all_reduce", 3, 2), ("pp", "send/recv", 0, 2)]


def test_the_arrival_clocks_aggregate_form_is_its_window_forms_min_and_max():
    """``schema.one_clock_sql`` is the one arrival rule in two forms: per row over a window
    (INSTANCE_ARRIVAL_SQL, collective_perf, comm_items) and as an aggregate (collective_instances'
    first / last arrival, the instances' numbering). On every mix of present / missing clocks the
    aggregate is the min / max of the window's arrivals. By hand: instance 1, both rows have the
    preferred clock: 10 .. 30; 2, one row lacks it but both have the other: 6 .. 8; 3, one row has only
    the preferred, the other only the other: NULL (no common clock); 4, no times: NULL; 5, one row has
    no time at all, the other both: the preferred, 40."""
    import duckdb

    from traceprof.core.schema import one_clock_sql

    rows = "(1, 10, 5), (1, 30, 7), (2, NULL, 6), (2, 20, 8), (3, 50, NULL), (3, NULL, 9), (4, NULL, NULL), (5, NULL, NULL), (5, 40, 2)"
    con = duckdb.connect()
    window = con.execute(
        f"""SELECT i, min(arr), max(arr) FROM (SELECT i, {one_clock_sql("a1", "a2", over="PARTITION BY i")} AS arr
            FROM (VALUES {rows}) t(i, a1, a2)) GROUP BY i ORDER BY i"""
    ).fetchall()
    agg = con.execute(
        f"""SELECT i, {one_clock_sql("a1", "a2", agg="min")}, {one_clock_sql("a1", "a2", agg="max")}
            FROM (VALUES {rows}) t(i, a1, a2) GROUP BY i ORDER BY i"""
    ).fetchall()
    assert window == agg == [(1, 10, 30), (2, 6, 8), (3, None, None), (4, None, None), (5, 40, 40)]
    with pytest.raises(ValueError, match="over .* or agg"):
        one_clock_sql("a1", "a2")
