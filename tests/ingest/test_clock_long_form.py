"""estimate_offsets on the long form (instance, rank, end rows) gives the frames of the dense
instances x ranks estimator it replaced, kept below as the reference, on generated ends of many
shapes (sub-groups, chains, unlinked sets, missing ranks, clocks decades apart, ties, repeated rows)
and on the end times of real traces."""

from __future__ import annotations

import math
import warnings

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.conftest import SAMPLES, corpus
from traceprof.ingest.clock import _ENDS, MIN_OFFSET_NS, _int_median, _modal, estimate_offsets
from traceprof.ingest.ingest import ingest

# --- the reference: the dense estimator as it was before the long form (main at 1faf383), its
# components found by a search rather than a union-find and its frame built from Python ints


def _dense_components(e: np.ndarray) -> np.ndarray:
    # a search from each rank not yet reached, in rank order, over the rows both have a value on
    # (the dense code took a union-find over the same rows; the labels are the same: lowest column)
    has = ~np.isnan(e)
    comp = np.full(e.shape[1], -1)
    for j in range(e.shape[1]):
        if comp[j] >= 0:
            continue
        comp[j], todo = j, [j]
        while todo:
            linked = has[has[:, todo.pop()]].any(axis=0) & (comp < 0)
            comp[linked] = j
            todo += np.nonzero(linked)[0].tolist()
    return comp


def _dense_row_int_median(x: np.ndarray) -> np.ndarray:
    out = np.full(x.shape[0], np.nan)
    for i, row in enumerate(x):
        v = row[~np.isnan(row)]
        if len(v):
            out[i] = _int_median(v)
    return out


def _dense_fit_component(e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = e.shape[1]
    off = np.full(n, np.nan)
    half = np.full(n, np.inf)
    off[0], half[0] = 0.0, 0.0
    for j in range(1, n):
        c, w = _modal(e[:, j] - e[:, 0])
        if not math.isnan(c):
            off[j], half[j] = -c, w
    while np.isnan(off).any():
        known = ~np.isnan(off)
        consensus = _dense_row_int_median(e[:, known] + off[known])
        progressed = False
        for u in np.nonzero(~known)[0]:
            c, w = _modal(e[:, u] - consensus)
            if not math.isnan(c):
                off[u], half[u], progressed = -c, w, True
        if not progressed:
            off[np.isnan(off)] = 0.0
    return off, half


def dense_estimate_offsets(ends: pl.DataFrame, min_offset_ns: int = MIN_OFFSET_NS) -> pl.DataFrame:
    multi = ends.filter(pl.len().over("instance_id") >= 2)
    if multi.is_empty():
        return pl.DataFrame()
    bases = multi.group_by("rank").agg(pl.col("end_ns").cast(pl.Int64).min().alias("_base"))
    base_of = {int(r): int(b) for r, b in bases.iter_rows()}
    wide = (
        multi.join(bases, on="rank")
        .with_columns((pl.col("end_ns").cast(pl.Int64) - pl.col("_base")).cast(pl.Float64))
        .pivot(on="rank", index="instance_id", values="end_ns", aggregate_function="min", sort_columns=True)
    )
    ranks = np.array(sorted(int(c) for c in wide.columns if c != "instance_id"))
    e = wide.select([str(r) for r in ranks]).to_numpy().astype(np.float64)
    comp = _dense_components(e)
    off: list[int] = [0] * len(ranks)
    half = np.zeros(len(ranks))
    res = np.zeros(len(ranks))
    thr = np.full(len(ranks), math.inf)
    for root in np.unique(comp):
        cols = np.nonzero(comp == root)[0]
        sub = e[:, cols]
        sub = sub[(~np.isnan(sub)).sum(axis=1) >= 2]
        o, h = _dense_fit_component(sub)
        corr = sub + o
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            spread = corr - np.nanmin(corr, axis=1)[:, None]
        r = np.array([_int_median(c[~np.isnan(c)]) for c in spread.T])
        t = np.maximum.reduce([np.full(len(cols), float(min_offset_ns)), 2.0 * h, 2.0 * np.maximum(r, r[0])])
        t[0] = math.inf
        half[cols], res[cols], thr[cols] = h, r, t
        ref = base_of[int(ranks[cols[0]])]
        for k, j in enumerate(cols):
            off[j] = int(o[k]) - base_of[int(ranks[j])] + ref
    n = np.sum(~np.isnan(e), axis=0)
    applied = [o if abs(o) >= t else 0 for o, t in zip(off, thr, strict=True)]
    columns = {
        "rank": ranks,
        "component": ranks[comp],
        "instances": n,
        "estimate_ns": off,
        "residual_ns": res,
        "spread_ns": np.round(np.minimum(half, 2**62)),
        "threshold_ns": np.where(np.isinf(thr), -1, np.round(np.minimum(thr, 2**62))),
        "offset_ns": applied,
    }
    return pl.DataFrame(
        {k: [int(x) for x in v] for k, v in columns.items()},
        schema={k: pl.Int32 if k in ("rank", "component") else pl.Int64 for k in columns},
    )


def _same(ends: pl.DataFrame, min_offset_ns: int = MIN_OFFSET_NS) -> pl.DataFrame:
    got = estimate_offsets(ends, min_offset_ns)
    assert_frame_equal(got, dense_estimate_offsets(ends, min_offset_ns))
    return got


# --- generated ends


def _job(rng: np.random.Generator, shape: str) -> pl.DataFrame:
    """Ends of one generated job: ``groups`` (lists of ranks) each with collectives completing at
    true times t; rank r records t + clock[r] + delay, delay >= 0 (0 on about half the rows; small
    integer choices, so values tie), some (instance, rank) rows missing."""
    world = int(rng.integers(2, 40))
    ranks = rng.choice(np.arange(3 * world), size=world, replace=False)  # not 0..n-1, not sorted
    g = int(rng.integers(2, 6))
    if shape == "one":
        groups = [list(ranks)]
    elif shape == "subgroups":  # tensor-parallel groups and the data-parallel groups across them
        groups = [list(ranks[i : i + g]) for i in range(0, world, g)]
        groups += [list(ranks[i::g]) for i in range(g)]
    elif shape == "subgroups_only":  # groups that never meet: as many components
        groups = [list(ranks[i : i + g]) for i in range(0, world, g)]
    elif shape == "chain":  # neighbours only: one component, estimated round by round
        groups = [list(ranks[i : i + 2]) for i in range(world - 1)]
    elif shape == "mixed":  # random sub-groups, some with a single member
        groups = [
            list(rng.choice(ranks, size=int(rng.integers(1, world + 1)), replace=False)) for _ in range(6)
        ]
    else:
        raise AssertionError(shape)
    scale = [1_000, 50_000, 3_000_000][int(rng.integers(0, 3))]
    clock = {int(r): int(rng.integers(-5, 6)) * scale for r in ranks}
    for r in rng.choice(ranks, size=int(rng.integers(0, 3)), replace=False):
        clock[int(r)] -= 10**18  # a capture-relative clock beside epoch ones
    base = 1_767_225_601_123_456_789
    missing = float(rng.choice([0.0, 0.1, 0.3]))
    rows = []
    inst = int(rng.integers(-1000, 1000))
    for members in groups:
        for _ in range(int(rng.integers(1, 12))):
            inst += int(rng.integers(1, 50))
            t = base + int(rng.integers(0, 10**12))
            for r in members:
                if rng.random() < missing:
                    continue
                delay = 0 if rng.random() < 0.5 else int(rng.choice([1, 2, 1_000, 70_000, 400_000]))
                rows.append((inst, int(r), t + clock[int(r)] + delay))
                if rng.random() < 0.03:  # a repeated row of one rank (the later one)
                    rows.append((inst, int(r), t + clock[int(r)] + delay + 5))
    perm = rng.permutation(len(rows))
    return pl.DataFrame([rows[i] for i in perm], schema=["instance_id", "rank", "end_ns"], orient="row")


@pytest.mark.parametrize("shape", ["one", "subgroups", "subgroups_only", "chain", "mixed"])
def test_long_form_equals_the_dense_estimator_on_generated_jobs(shape):
    rng = np.random.default_rng(["one", "subgroups", "subgroups_only", "chain", "mixed"].index(shape))
    compared = 0
    for _ in range(60):
        ends = _job(rng, shape)
        try:
            ref = dense_estimate_offsets(ends)
        except IndexError:  # the dense code failed on a rank alone on every instance (repeated rows)
            continue
        got = estimate_offsets(ends)
        assert_frame_equal(got, ref)
        for floor in (0, 10**9):
            _same(ends, floor)
        compared += 1
    assert compared >= 50


def test_a_rank_alone_on_its_instances_is_its_own_reference():
    # Instance 7 has two rows, both rank 5's: it passes the "two or more rows" filter but links
    # nothing, so rank 5 is a component of its own (offset 0, residual 0, threshold -1) with one
    # instance. The dense estimator raised IndexError here (the median of no spreads).
    rows = [(1, 0, 100), (1, 1, 300), (2, 0, 1_100), (2, 1, 1_250), (7, 5, 40), (7, 5, 50)]
    est = estimate_offsets(pl.DataFrame(rows, schema=["instance_id", "rank", "end_ns"], orient="row"))
    r5 = est.filter(pl.col("rank") == 5).row(0, named=True)
    assert r5 == {
        "rank": 5, "component": 5, "instances": 1, "estimate_ns": 0, "residual_ns": 0, "spread_ns": 0,
        "threshold_ns": -1, "offset_ns": 0,
    }  # fmt: skip
    # ranks 0 and 1: differences 200 and 150 ns; the window of max(2, ceil(2/3)) = 2 values holds
    # both: floor(175) -> estimate -175, below the 50 us floor.
    assert est.filter(pl.col("rank") == 1)["estimate_ns"].to_list() == [-175]


def test_a_chain_of_pairs_is_estimated_round_by_round():
    # Ranks 0-1, 1-2, 2-3 share instances pairwise only; rank r's clock reads +r ms and nobody is
    # delayed, so each round recovers the next rank exactly: rank 2 against rank 1's corrected
    # ends, rank 3 against rank 2's. Estimates 0, -1, -2, -3 ms, all in one component of rank 0.
    rows = []
    for k in range(3):
        for i in range(3):
            t = 10**18 + 10_000_000 * (3 * i + k)
            rows += [(10 * i + k, i, t + i * 1_000_000), (10 * i + k, i + 1, t + (i + 1) * 1_000_000)]
    est = _same(pl.DataFrame(rows, schema=["instance_id", "rank", "end_ns"], orient="row"))
    assert est["estimate_ns"].to_list() == [0, -1_000_000, -2_000_000, -3_000_000]
    assert est["component"].to_list() == [0, 0, 0, 0]


# --- real traces: the end times clock alignment reads (the synced-by-source filter off for NDTimeline)


def _ends(store, run: str) -> pl.DataFrame:
    run_id = store.resolve_run(run)
    sql = _ENDS.replace("AND NOT t.synced", "")
    return store.sql(sql, [run_id])


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(lambda: SAMPLES / "straggler_rank2", id="sample_straggler_rank2"),
        pytest.param(lambda: SAMPLES / "sleep_rank1", id="sample_sleep_rank1"),
        pytest.param(lambda: corpus("hta/trace_filter"), id="corpus_hta_trace_filter"),
        pytest.param(
            lambda: corpus("kineto_misc/bytedance_straggler_whatif/trace-AR.parquet"),
            id="corpus_ndtimeline_ar",
        ),
        pytest.param(
            lambda: corpus("kineto_misc/bytedance_straggler_whatif/trace-SE.parquet"),
            id="corpus_ndtimeline_se",
        ),
        pytest.param(
            lambda: corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet"),
            id="corpus_ndtimeline_st",
        ),
    ],
)
def test_long_form_equals_the_dense_estimator_on_real_traces(store, src):
    path = src()
    if path.is_dir() and not any(path.glob("*.json*")):
        pytest.skip(f"{path} not recorded")
    ingest(store, [path], run="r", align=False)
    ends = _ends(store, "r")
    assert ends["rank"].n_unique() >= 2
    _same(ends)
