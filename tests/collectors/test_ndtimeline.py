"""NDTimeline Parquet collector: bad files give one TraceFormatError naming the file (and row)."""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import corpus
from traceprof.collectors import ndtimeline
from traceprof.core.errors import TraceFormatError
from traceprof.core.parsed import ParseOptions

_ST = "kineto_misc/bytedance_straggler_whatif/trace-ST.parquet"


def test_empty_file_with_the_real_schema(tmp_path):
    path = tmp_path / "trace-empty.parquet"
    pl.read_parquet(corpus(_ST)).head(0).write_parquet(path)
    for mode in ("raise", "skip"):
        with pytest.raises(TraceFormatError, match="no rows") as e:
            ndtimeline.parse(path, ParseOptions(on_bad_event=mode))
        assert e.value.path == str(path.resolve())


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        ("duration", float("nan"), "NaN 'duration' (nan)"),
        # start_ts counts from the step's earliest op (0): -0.5 s was laid before its step silently
        ("start_ts", -0.5, "negative 'start_ts' (-0.5)"),
        ("duration", -0.5, "negative 'duration' (-0.5)"),
        ("duration", float("inf"), "infinite 'duration' (inf)"),
        ("start_ts", None, "null 'start_ts'"),
        ("duration", 5e9, "'duration' beyond 2**62 ns (5000000000.0)"),  # 5e18 ns > 2**62 (4.6e18)
        ("rank", None, "null 'rank'"),
        ("seq_id", 2_000_000, "'seq_id' beyond +-999999 (2000000)"),
    ],
)
def test_nan_or_negative_time_is_a_bad_row(tmp_path, column, value, said):
    # The message names the field and its value (it was one catch-all: "null, NaN, infinite or
    # negative time (or null rank/step/..., or a number beyond its column type ...)"), and skipped
    # rows are counted by that problem, its value left out.
    # Rows 0..9 of the real ST trace, row 3's value set (same float32 column type).
    df = pl.read_parquet(corpus(_ST)).head(10)
    vals = df[column].to_list()
    vals[3] = value
    df = df.with_columns(pl.Series(column, vals, df.schema[column]))
    path = tmp_path / "trace-bad.parquet"
    df.write_parquet(path)
    with pytest.raises(TraceFormatError) as e:
        ndtimeline.parse(path)
    assert e.value.where.startswith("row #3 ")
    assert str(e.value).endswith(f"): {said}; pass --skip-bad-events to skip such rows")
    traces = ndtimeline.parse(path, ParseOptions(on_bad_event="skip"))
    # 10 rows, 1 skipped: 9 read, and counted once (on the first trace) as rejected.
    assert sum(len(t.events) for t in traces) == 9
    assert [t.rejected for t in traces if t.rejected] == [{said.split(" (")[0]: 1}]
    assert all(n >= 0 for t in traces for n in t.events.column("dur_ns").to_pylist())
    assert all(n >= 0 for t in traces for n in t.events.column("ts_ns").to_pylist())


@pytest.mark.parametrize(
    ("meta", "where", "reason"),
    [
        # PyYAML's message is 8 lines with its caret lines; the error is one line naming line:column
        (
            b"dp_size: 2\npp_size: [4\nworld_size: 8\n",
            "line 3:11",
            "invalid meta YAML: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence started at line 2:10); fix the file or move it away",
        ),
        (
            b"dp_size: 2\n\tpp_size: 4\n",
            "line 2:1",
            "invalid meta YAML: found character '\\t' that cannot start any "
            "token (while scanning for the next token); fix the file or move it away",
        ),
        # was a UnicodeDecodeError traceback
        (
            b"trial_name: \xff\n",
            "byte 12",
            "invalid meta YAML: not UTF-8 text (invalid start byte); fix the file or move it away",
        ),
        # was a ValueError traceback (int('four'))
        (b"dp_size: 2\npp_size: four\n", "pp_size", "'four' is not a positive integer"),
        (b"world_size: 0\n", "world_size", "0 is not a positive integer"),
    ],
)
def test_bad_meta_yaml_is_one_line_naming_the_place(tmp_path, meta, where, reason):
    path = tmp_path / "trace-ST.parquet"
    pl.read_parquet(corpus(_ST)).head(10).write_parquet(path)
    side = tmp_path / "meta-ST.yaml"
    side.write_bytes(meta)
    with pytest.raises(TraceFormatError) as e:
        ndtimeline.parse(path)
    assert (e.value.path, e.value.where, e.value.reason) == (str(side), where, reason)
    assert str(e.value) == f"{side}: {where}: {reason}"  # one line


def test_meta_size_written_as_text_is_said_and_counted(store, tmp_path):
    # The real ST trace and meta with world_size quoted ("8"), read as 8 without a word before; the
    # one rule of traceprof.core.values.identity_int: read as the integer, said once and counted.
    import shutil

    from traceprof.ingest.ingest import ingest

    src = corpus(_ST)
    shutil.copy(src, tmp_path / src.name)
    meta = (src.parent / "meta-ST.yaml").read_text()
    assert "world_size: 8\n" in meta
    (tmp_path / "meta-ST.yaml").write_text(meta.replace("world_size: 8\n", 'world_size: "8"\n'))
    traces = ndtimeline.parse(tmp_path / src.name)
    assert {t.world_size for t in traces} == {8}
    assert [w for t in traces for w in t.warnings] == [
        "meta-ST.yaml: world_size is '8', a string: read as its integer"
    ]
    ingest(store, [tmp_path / src.name], run="st")
    assert store.runs()["issues"].to_list() == ["1 repaired: world_size a string: read as its integer"]


def test_a_row_written_twice_is_kept_once_and_counted(tmp_path):
    # Rows 0..9 of the real ST trace (no two alike) and row 3 again as row 10 (every column equal:
    # a copy): 10 rows kept, the copy said and counted on the first trace. Before: 11 events.
    df = pl.read_parquet(corpus(_ST)).head(10)
    df = pl.concat([df, df.slice(3, 1)])
    path = tmp_path / "trace-dup.parquet"
    df.write_parquet(path)
    traces = ndtimeline.parse(path)
    assert sum(len(t.events) for t in traces) == 10
    import json

    assert json.loads(traces[0].trace["meta"])["repaired"] == {"exact duplicate record dropped": 1}
    optype = df["optype"][3]
    assert (
        f"trace-dup.parquet: 1 duplicate record dropped (first: row #10 (optype='{optype}'))"
        in traces[0].warnings
    )


def test_a_run_with_steps_but_no_step_events_ranks_by_step_time(store, tmp_path):
    """NDTimeline's steps are rows of the steps table, with no step event: the ranking said "the run
    has no steps: each rank's window is its first to last activity" above "step account" findings.

    A hand-built job: dp 2, 8 steps; rank 1's forward takes 3 s, rank 0's 1 s, then 1 s backward
    and a reduce-scatter of both that ends at 4.5 s: rank 0 waits 2 s a step for rank 1."""
    from traceprof.engine.findings import summarize
    from traceprof.ingest.ingest import ingest

    rows = []
    for step in range(1, 9):
        for rank, fwd in ((0, 1.0), (1, 3.0)):
            rows += [
                (rank, 0, rank, step, "forward-compute", 0.0, fwd, 0, 0, 0, 0),
                (rank, 0, rank, step, "backward-compute", fwd, 1.0, 0, 0, 0, 0),
                (rank, 0, rank, step, "grads-reduce-scatter", fwd + 1.0, 3.5 - fwd, 0, -1, -1, -1),
            ]
    real = pl.read_parquet(corpus(_ST)).schema
    pl.DataFrame(rows, schema=real, orient="row").write_parquet(tmp_path / "trace-T.parquet")
    (tmp_path / "meta-T.yaml").write_text(
        "trial_name: T\nrun_id: 0\ndp_size: 2\ndsp_size: 1\npp_size: 1\ntp_size: 1\nvpp_size: 1\nworld_size: 2\n"
    )
    ingest(store, [tmp_path / "trace-T.parquet"], run="t")
    assert store.sql("SELECT count(*) AS n FROM steps")["n"].to_list() == [16]
    assert store.sql("SELECT count(*) AS n FROM events WHERE kind = 'step'")["n"].to_list() == [0]
    f = summarize(store, "t")
    assert not f.stepless
    assert f.ranking.startswith("Ranked by the time each could recover by the step account (critical_path)")
    [s] = [x for x in f.findings if x.topic == "stragglers"]
    # rank 0's waits: 2 s in each of 8 steps, of 2 ranks' step time: 8 steps of 4.5 s laid 1 ms
    # apart (a window runs to the next step's start), 72.014 s
    assert s.recoverable_pct == pytest.approx(100 * 16 / (2 * (8 * 4.5 + 7 * 0.001)))
    assert s.text.endswith("step account: the others' waits for it 22.2% of all ranks' step time")
