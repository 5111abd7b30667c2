"""launch's kernels: ``first_of_launch`` computed in polars equals the ``kernels`` view's window.

launch used to read its kernels with the view's ``first_of_launch`` (a ``row_number()`` window
over every GPU row of a trace, partitioned by correlation id, ordered by start and duration:
most of the view's time on 8 x 1 M events). It now reads the view's rows without that column and
computes it (``launch._kernels``). :data:`OLD` is the query it ran before, kept here as the
reference: the rows must be the same, flags and all, on generated traces (graph replays, memcpy
and memset rows and flagged rows sharing a launch's correlation id, launches missing from the
trace) and on real ones.
"""

from __future__ import annotations

import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.builders import kernel, kineto, launch, step
from tests.conftest import case, corpus
from traceprof.analyses import launch as launch_mod
from traceprof.core.classify import valid_sql
from traceprof.ingest.ingest import ingest

#: The query launch ran before (the ``kernels`` view's own ``first_of_launch``): the reference.
OLD = f"""
SELECT trace_id, rank, device, stream, step, ts_ns, dur_ns, end_ns, correlation, launch_ts_ns,
       launch_name ILIKE '%GraphLaunch%' AS graph_call, first_of_launch, flag = 'launch_skew' AS skewed
FROM kernels
WHERE run_id = ? AND kind = 'kernel' AND {valid_sql("")}
"""

#: Every row has a distinct (correlation, start, duration), so that the first row of a launch is
#: one row (DuckDB's window picks any of tied rows).
_ORDER = ["trace_id", "correlation", "ts_ns", "dur_ns", "stream", "device"]


def _new_and_old(store, run_id: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    traces = store.sql("SELECT trace_id FROM traces WHERE run_id = ? ORDER BY trace_id", [run_id])
    new = pl.concat(
        [launch_mod._kernels(launch_mod._gpu_rows(store, run_id, t)) for t in traces["trace_id"].to_list()]
    )
    # launch_rows: a window count over the kept rows of each (trace, correlation id), in SQL
    old = store.sql(
        f"SELECT *, count(*) OVER (PARTITION BY trace_id, correlation) AS launch_rows FROM ({OLD})", [run_id]
    )
    # (``measured`` and ``first_gpu_ns``, launch's own columns, are tested in tests/ingest/test_shapes.py)
    new = new.drop("measured", "first_gpu_ns").with_columns(pl.col("launch_rows").cast(pl.Int64))
    return new.sort(_ORDER), old.sort(_ORDER)


def _events(seed: int) -> list[dict]:
    """A random trace in us: kernels, memcpy and memset rows on 3 streams whose correlation ids
    come from a small pool (so that several rows share a launch: graph replays, a memcpy before the
    launch's kernel), launches for most ids (some graph launches), some rows placed before their
    launch call (flagged at ingest), and steps over the whole span."""
    rnd = random.Random(seed)
    events = [step(1, 0, 5_000), step(2, 5_000, 5_000)]
    ids = list(range(1, 60))
    starts = rnd.sample(range(100, 9_000_000), 400)  # distinct starts (in 0.001 us)
    for i, ts in enumerate(starts):
        cat = rnd.choice(["kernel"] * 6 + ["gpu_memcpy", "gpu_memset"])
        events.append(
            kernel(
                f"k{i % 7}",
                rnd.choice([7, 9, 11]),
                ts / 1000,
                rnd.randint(1, 40_000) / 1000,
                rnd.choice(ids),
                cat,
            )
        )
    for c in ids:
        if rnd.random() < 0.85:  # some launches missing from the trace
            name = "cudaGraphLaunch" if rnd.random() < 0.2 else "cudaLaunchKernel"
            events.append(launch(rnd.randint(0, 9_000_000) / 1000, c, name=name))
    return events


@pytest.mark.parametrize("seed", range(6))
def test_first_of_launch_equals_the_views_window_on_generated_traces(store, tmp_path, seed):
    ingest(store, [kineto(tmp_path / "r0.json.gz", _events(seed))], run="r")
    new, old = _new_and_old(store, 1)
    # the draw covers what the rule is about: launches of several rows, and some not first
    assert old.height > 100 and 0 < old["first_of_launch"].sum() < old.height
    assert (old.group_by("correlation").len()["len"] > 1).any()
    rows = store.sql("SELECT kind, flag FROM kernels WHERE run_id = 1")  # rows launch leaves out
    assert (rows["kind"] != "kernel").sum() > 0 and rows["flag"].drop_nulls().len() > 0
    assert_frame_equal(new, old, check_exact=True)


@pytest.mark.parametrize(
    "path",
    [
        lambda: case("cuda_graph_launch"),
        lambda: case("kernel_before_its_launch"),
        lambda: corpus("hta/negative_queue_length_values_check"),
        lambda: corpus("hta/nccl_parser_config"),
    ],
    ids=["cuda_graph_launch", "kernel_before_its_launch", "negative_queue_length", "nccl_parser_config"],
)
def test_first_of_launch_equals_the_views_window_on_real_traces(store, path):
    ingest(store, [path()], run="r")
    new, old = _new_and_old(store, 1)
    assert old.height > 0
    assert_frame_equal(new, old, check_exact=True)


@pytest.mark.parametrize("seed", range(3))
def test_launch_calls_of_a_run_equal_the_views_when_an_id_has_several_calls(store, tmp_path, seed):
    """The launch call of a GPU row is the first (by start) runtime call of its trace and
    correlation id, as the view joins it, also where an id has several calls (a graph launch
    and a plain one, either first) and when the whole run's rows are read at once (2 ranks)."""
    rnd = random.Random(100 + seed)
    paths = []
    for rank in range(2):
        events = _events(seed + rank)
        for c in rnd.sample(range(1, 60), 20):  # a second call of the id, either side of the first
            name = rnd.choice(["cudaGraphLaunch", "cudaLaunchKernel"])
            events.append(launch(rnd.randint(0, 9_000_000) / 1000 + 0.0005, c, name=name))
        paths.append(kineto(tmp_path / f"r{rank}.json.gz", events, rank=rank, world_size=2))
    ingest(store, paths, run="r")
    old = store.sql(
        f"SELECT *, count(*) OVER (PARTITION BY trace_id, correlation) AS launch_rows FROM ({OLD})", [1]
    ).sort(_ORDER)
    calls = store.sql(
        "SELECT count(*) - count(DISTINCT (trace_id, correlation)) AS n FROM events WHERE kind = 'cuda_runtime'"
    )
    assert calls["n"][0] > 20  # ids with several calls
    assert old["graph_call"].sum() > 0 and old["launch_ts_ns"].null_count() > 0
    new = launch_mod._kernels(launch_mod._gpu_rows(store, 1))
    new = new.drop("measured", "first_gpu_ns").with_columns(pl.col("launch_rows").cast(pl.Int64))
    assert_frame_equal(new.sort(_ORDER), old, check_exact=True)
