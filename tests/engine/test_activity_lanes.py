"""The activity frame's lane text made once per (device, stream) pair, not per row in SQL.

``activity`` used to write each GPU row's lane (``dev D stream S``) in its query, a text built
per row (about a fifth of the query's CPU on 8 x 1 M events). The query now carries the row's
device and stream and ``activity._with_lanes`` writes the text once per combination of the
distinct devices and streams (or, past ``LANE_TEXTS`` combinations, per distinct pair). The
query it ran before (:func:`_old`, the lane made by ``LANE_SQL`` in SQL) is kept here as the
reference: every column of every row must be the same, on generated runs (several devices and
streams, a kernel without a device, a CPU-only rank beside a GPU rank, one rank and several)
and on real ones, for the whole frame, column selections that hold the lane and one step.
"""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.builders import kernel, launch, op, step, write_rank
from tests.conftest import corpus, sample_run
from traceprof.core.classify import VALID_SQL, valid_sql
from traceprof.engine import activity as act_mod
from traceprof.engine.arrivals import excluded_steps
from traceprof.ingest.ingest import ingest

_KEY = ["rank", "start_ns", "end_ns"]


#: The detail columns as the query read them before: a GPU row's launch call joined in SQL (the first
#: runtime or driver call of its trace and correlation id), not looked up after the query.
_OLD_DETAIL = {
    **act_mod._DETAIL,
    "$gpu_detail": ", e.kind, e.trace_id, e.stream, e.correlation, l.tid AS launch_tid, l.ts_ns AS launch_ts_ns",
    "$gpu_join": "\nLEFT JOIN "
    + act_mod._LAUNCH_CTE.replace("$kinds", "kind IN ('cuda_runtime', 'cuda_driver')").replace(
        "$launch_valid", "AND " + valid_sql("")
    )
    + " l ON l.trace_id = e.trace_id AND l.correlation = e.correlation",
}


def _old(store, run_id: int, detail: bool) -> pl.DataFrame:
    """The frame as ``activity`` read it before (not HTA): the lane written per row by
    ``LANE_SQL`` and the launch call joined (:data:`_OLD_DETAIL`) in the query, then sorted and the
    profiler-start transient dropped."""
    sql = act_mod._SQL if act_mod._cpu_ranks(store, run_id) else act_mod._GPU_SQL
    sql = (
        sql.replace("$lane", act_mod.LANE_SQL)
        .replace("$gpu_keys", "")
        .replace("$cpu_keys", "")
        .replace("$valid", VALID_SQL)
    )
    for key, value in _OLD_DETAIL.items():
        sql = sql.replace(key, value if detail else "")
    rows = store.sql(sql.replace("$run", str(int(run_id)))).sort(*_KEY)
    return act_mod._drop_transient(rows, excluded_steps(store, run_id))


def _same(got: pl.DataFrame, ref: pl.DataFrame) -> None:
    """Equal frames: the same columns and types, the same rows in (rank, start, end) order (rows
    tied on those three may come in either order)."""
    assert got.columns == ref.columns and got.schema == ref.schema
    assert got.select(_KEY).equals(ref.select(_KEY))
    assert_frame_equal(got.sort(pl.all(), nulls_last=True), ref.sort(pl.all(), nulls_last=True))


def _check(store, run_id: int) -> None:
    for detail in (False, True):
        ref = _old(store, run_id, detail)
        _same(act_mod.activity(store, run_id, detail=detail), ref)
    ref = _old(store, run_id, True)
    cols = ("rank", "step", "lane", "name", "start_ns", "end_ns")
    _same(act_mod.activity(store, run_id, columns=cols), ref.select(cols))
    compute = ref.filter(pl.col("class") == "compute").select(cols)
    _same(act_mod.activity(store, run_id, columns=cols, classes=("compute",)), compute)
    no_lane = ("rank", "class", "start_ns", "end_ns", "step")
    _same(act_mod.activity(store, run_id, columns=no_lane), ref.select(no_lane))
    for s in ref["step"].drop_nulls().unique().sort().head(2).to_list():
        plain = _old(store, run_id, False)
        _same(act_mod.step_activity(store, run_id, s), plain.filter(pl.col("step") == s))


def _gpu_rank(rnd: random.Random) -> list[dict]:
    """Steps, launches and kernels on 2 devices x 3 streams, some without a launch, one kernel
    with no device in its args (its pid's)."""
    events = [step(1, 0, 4_000), step(2, 4_000, 4_000)]
    for i in range(300):
        ts = rnd.randint(10, 7_900_000) / 1000
        device, stream = rnd.randrange(2), rnd.choice([7, 20, 1_000_003])
        cat = rnd.choice(["kernel"] * 5 + ["gpu_memcpy", "gpu_memset"])
        name = rnd.choice(["gemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "relu"])
        events.append(kernel(name, stream, ts, rnd.randint(1, 3_000) / 1000, i, cat, device=device))
        if rnd.random() < 0.9:
            events.append(launch(max(ts - rnd.randint(1, 50), 0.5), i))
    no_device = kernel("gemm", 7, 5_000.5, 1.0, 9_999)
    del no_device["args"]["device"]
    return [*events, no_device]


def _cpu_rank(rnd: random.Random) -> list[dict]:
    """A gloo rank with no GPU rows: ProfilerSteps, training-thread ops and gloo annotations."""
    events = [step(1, 0, 4_000), step(2, 4_000, 4_000)]
    for i in range(120):
        ts = rnd.randint(10, 7_900_000) / 1000
        events.append({**op(f"aten::op{i % 5}", ts, 2.0), "pid": 1})
        if i % 10 == 0:
            events.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "gloo:all_reduce",
                    "pid": 1,
                    "tid": 1,
                    "ts": ts + 1,
                    "dur": 5.0,
                }
            )
    return events


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cpu", [False, True])
@pytest.mark.parametrize("texts", [act_mod.LANE_TEXTS, 0])  # 0: the join on distinct pairs
def test_lanes_equal_the_per_row_sql_text_on_generated_runs(
    store, tmp_path: Path, monkeypatch, seed: int, cpu: bool, texts: int
):
    monkeypatch.setattr(act_mod, "LANE_TEXTS", texts)
    rnd = random.Random(seed)
    folder = tmp_path / "run"
    write_rank(folder / "rank0.json", _gpu_rank(rnd), 0, world=3)
    write_rank(folder / "rank1.json", _cpu_rank(rnd) if cpu else _gpu_rank(rnd), 1, world=3)
    write_rank(folder / "rank2.json", _gpu_rank(rnd), 2, world=3)
    ingest(store, [folder], run="r")
    run_id = store.resolve_run("r")
    lanes = act_mod.activity(store, run_id)["lane"]
    assert "dev 1 stream 1000003" in lanes.to_list()
    assert any(x.startswith("tid ") for x in lanes.drop_nulls().to_list()) == cpu
    _check(store, run_id)


def test_lanes_of_one_rank_equal_the_per_row_sql_text(store, tmp_path: Path):
    """One rank: the frame is read whole (no rank groups)."""
    write_rank(tmp_path / "one" / "rank0.json", _gpu_rank(random.Random(7)), 0, world=1)
    ingest(store, [tmp_path / "one"], run="one")
    _check(store, store.resolve_run("one"))


@pytest.mark.parametrize("name", ["normal", "pipeline_2stage"])
def test_lanes_equal_the_per_row_sql_text_on_sample_runs(store, name: str):
    _check(store, sample_run(store, name))


@pytest.mark.parametrize("rel", ["hta/cpu_only", "hta/triton_example"])
def test_lanes_equal_the_per_row_sql_text_on_corpus_traces(store, rel: str):
    ingest(store, [corpus(rel)], run="c")
    _check(store, store.resolve_run("c"))


@pytest.mark.parametrize("texts", [act_mod.LANE_TEXTS, 0])
def test_null_device_and_stream_give_the_sql_text(monkeypatch, texts: int):
    """A null device is ``?``, a null stream a null lane, as ``LANE_SQL`` says in DuckDB (Kineto
    fills the device from the pid, so these come from other sources); CPU rows keep their text."""
    rows = pl.DataFrame(
        {
            "lane": [None, None, None, None, "tid 5", None],
            "_lane_device": [0, None, 3, None, None, 0],
            "_lane_stream": [7, 7, None, None, None, -2],
        },
        schema={"lane": pl.String, "_lane_device": pl.Int32, "_lane_stream": pl.Int64},
    )
    monkeypatch.setattr(act_mod, "LANE_TEXTS", texts)
    got = act_mod._with_lanes(rows)
    con = duckdb.connect()
    con.register("e", rows.rename({"_lane_device": "device", "_lane_stream": "stream"}).to_arrow())
    ref = [r[0] for r in con.execute(f"SELECT coalesce(lane, {act_mod.LANE_SQL}) FROM e").fetchall()]
    assert got.columns == ["lane"]
    assert got["lane"].to_list() == ref
    assert got["lane"].to_list() == [
        "dev 0 stream 7",
        "dev ? stream 7",
        None,
        None,
        "tid 5",
        "dev 0 stream -2",
    ]
