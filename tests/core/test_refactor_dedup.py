"""Helpers that now serve several callers give what each caller computed before on its own."""

from __future__ import annotations

import numpy as np
import polars as pl

from tests.conftest import SAMPLES
from traceprof.analyses._replay import _code
from traceprof.engine.intervals import class_measures, union_ns
from traceprof.ingest.ingest import ingest
from traceprof.storage.runs import run_name
from traceprof.storage.store import Store


def test_run_name_is_the_stored_name(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        ingest(store, [SAMPLES / "clean"], run="first", jobs=1)
        run_id = store.resolve_run("first")
        assert run_name(store, run_id) == "first"


def test_union_ns_and_class_measures_share_one_sweep():
    # 2,000 random intervals on 3 ranks x 4 steps: the union per group that union_ns gives is
    # class_measures' busy_ns, and its compute_ns is union_ns of the compute rows alone.
    rng = np.random.default_rng(7)
    n = 2000
    start = rng.integers(0, 1_000_000, n)
    act = pl.DataFrame(
        {
            "rank": rng.integers(0, 3, n),
            "step": rng.integers(0, 4, n),
            "class": rng.choice(["compute", "comm", "memory"], n),
            "start_ns": start,
            "end_ns": start + rng.integers(0, 5_000, n),
        }
    )
    cm = class_measures(act, ["rank", "step"])
    busy = union_ns(act, ["rank", "step"], "busy_ns").sort("rank", "step")
    assert (
        busy.join(cm.select("rank", "step", "busy_ns"), on=["rank", "step"], how="full")
        .filter(pl.col("busy_ns") != pl.col("busy_ns_right"))
        .is_empty()
    )
    comp = union_ns(act.filter(pl.col("class") == "compute"), ["rank", "step"], "compute_ns")
    assert (
        comp.sort("rank", "step")["compute_ns"].to_list() == cm.sort("rank", "step")["compute_ns"].to_list()
    )
    # no group columns: one total, the union over everything, measured by hand on a merge
    total = union_ns(act, [], "u")["u"].item()
    ivs = sorted(zip(act["start_ns"].to_list(), act["end_ns"].to_list(), strict=True))
    want, hi = 0, None
    for s, e in ivs:
        if e <= s:
            continue
        if hi is None or s > hi:
            want, hi = want + e - s, e
        elif e > hi:
            want, hi = want + e - hi, e
    assert total == want


def test_code_with_known_values_equals_code_computing_them():
    df = pl.DataFrame({"k": ["b", None, "a", "c", "a", "b"]})
    uniq = df["k"].drop_nulls().unique().sort()
    got = df.select(_code("k", uniq))["k"].to_list()
    assert got == df.select(_code("k"))["k"].to_list() == [1, None, 0, 2, 0, 1]
