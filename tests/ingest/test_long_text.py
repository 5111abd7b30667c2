"""Text too long to store (``traceprof.core.limits.MAX_FIELD_BYTES``, 1 MiB): one rule for every
collector. Without ``--skip-bad-events`` one line naming the file and the record, the store as it
was; with it the record is skipped, counted under ``'<field>' longer than 1 MiB``, and the rest stored.

Before the rule, a Kineto event with 12 MB or more of args failed the whole run at DuckDB's 96 MB
ingest memory limit with a message that named no record, and ``--skip-bad-events`` did not help.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests._cli_inproc import run
from tests.builders import write_ndtimeline
from tests.conftest import corpus
from traceprof.core.errors import TraceFormatError
from traceprof.core.limits import MAX_FIELD_BYTES, drop_long_text
from traceprof.core.parsed import ParseOptions
from traceprof.storage.store import Store

SKIP = ParseOptions(on_bad_event="skip")
#: A value one byte over the limit, and one exactly at it.
OVER, AT = "x" * (MAX_FIELD_BYTES + 1), "x" * MAX_FIELD_BYTES


def _op(i: int, **extra: object) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5, **extra}


def _kineto(path: Path, events: list[dict]) -> Path:
    doc = {"baseTimeNanoseconds": 0, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    path.write_text(json.dumps(doc))  # the args text stored is the file's: {"blob": "..."}
    return path


def _events(db: Path) -> list[tuple[str, int]]:
    with Store(db, read_only=True) as s:
        return [tuple(r) for r in s.con.execute("SELECT name, ts_ns FROM events ORDER BY ts_ns").fetchall()]


def _runs(db: Path) -> list[str]:
    with Store(db, read_only=True) as s:
        return [r[0] for r in s.con.execute("SELECT name FROM runs ORDER BY run_id").fetchall()]


#: (what is too long in event #2, the field named). The args text is the JSON as written:
#: '{"blob": "' + value + '"}' is 12 bytes more than the value.
LONG = {
    "args": ({"args": {"blob": "x" * (MAX_FIELD_BYTES - 11)}}, "'args'"),
    "args_utf8": ({"args": {"blob": "\u00e9" * (MAX_FIELD_BYTES // 2)}}, "'args'"),  # 2 bytes a char
    "name": ({"name": OVER}, "'name'"),
    "cat": ({"cat": OVER}, "'cat'"),
}


@pytest.mark.parametrize("general", [False, True], ids=["columnar", "per_event"])
@pytest.mark.parametrize("what", sorted(LONG))
def test_kineto_event_with_long_text(tmp_path, what, general):
    extra, field = LONG[what]
    events = [_op(i) for i in range(5)]
    events[2] = {**events[2], **extra}
    if general:  # a B/E pair: the parser's per-event path
        events += [{**_op(9), "ph": "B", "dur": None}, {**_op(9), "ph": "E", "ts": 95}]
        for e in events[-2:]:
            del e["dur"]
    db = tmp_path / "s.duckdb"
    ok = _kineto(tmp_path / "ok.json", [_op(0)])
    assert run("ingest", str(ok), "--db", str(db))[0] == 0
    bad = _kineto(tmp_path / "bad.json", events)
    code, _, err = run("ingest", str(bad), "--db", str(db))
    (line,) = err.strip().splitlines()
    assert code == 1 and line.startswith(f"error: {bad}: event #2 (cat=") and "Traceback" not in err
    assert "ts_ns=20000)" in line and f"{field} longer than 1 MiB (" in line, line
    assert len(line) < 400  # the long value itself is not printed
    assert _runs(db) == ["ok"]  # the store as it was
    code, _, err = run("ingest", str(bad), "--db", str(db), "--skip-bad-events")
    assert code == 0 and f"1 record(s) not stored: 1 {field} longer than 1 MiB" in err, err
    # named as other skipped kinds' first events are (it was counted only)
    assert f"1 {field} longer than 1 MiB (first: event #2 (cat=" in err, err
    # the other events, as written: op i at 10*i us (ns in the store); the B/E pair one event
    want = (
        [("op0", 0)] + [(f"op{i}", 10_000 * i) for i in (0, 1, 3, 4)] + ([("op9", 90_000)] if general else [])
    )
    assert _events(db) == sorted(want, key=lambda r: r[1])


def test_kineto_args_at_the_limit_are_stored(tmp_path):
    # '{"blob": "' + 1 MiB - 12 characters + '"}': exactly MAX_FIELD_BYTES bytes
    bad = _kineto(tmp_path / "t.json", [_op(0, args={"blob": "x" * (MAX_FIELD_BYTES - 12)})])
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(bad), "--db", str(db))[0] == 0
    with Store(db, read_only=True) as s:
        assert s.con.execute("SELECT octet_length(args::VARCHAR::BLOB) FROM events").fetchall() == [
            (MAX_FIELD_BYTES,)
        ]


def test_kineto_thread_name_too_long(tmp_path):
    meta = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": OVER}}
    bad = _kineto(tmp_path / "t.json", [_op(0), _op(1), meta])
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(bad), "--db", str(db))
    assert code == 1 and not db.exists()
    assert f"error: {bad}: thread_name of pid/tid '1/1': 'args.name' longer than 1 MiB (" in err, err
    code, _, err = run("ingest", str(bad), "--db", str(db), "--skip-bad-events")
    assert code == 0 and "1 'args.name' longer than 1 MiB" in err, err
    assert _events(db) == [("op0", 0), ("op1", 10_000)]
    with Store(db, read_only=True) as s:
        (meta_text,) = s.con.execute("SELECT meta FROM traces").fetchone()
    assert json.loads(meta_text)["thread_names"] == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [("profiling_name", OVER), ("process_group", [OVER, "default_pg"]), ("thread_id", OVER)],
)
def test_flight_recorder_entry_too_long(tmp_path, field, value):
    """The message names the dump's own field (``profiling_name``), not the store column it fills
    (``op``), whichever text field of the entry is too long."""
    from traceprof.collectors.flight_recorder.parse import parse

    def entry(seq: int, **over: object) -> dict:
        return {
            "collective_seq_id": seq,
            "process_group": ["0", "default_pg"],
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": 10 * seq,
            "time_discovered_started_ns": 10 * seq + 1,
            "time_discovered_completed_ns": 10 * seq + 5,
            **over,
        }

    path = tmp_path / "rank0.fr.json"
    doc = {"version": "2.10", "pg_config": {}, "entries": [entry(1), entry(2, **{field: value})]}
    path.write_text(json.dumps(doc))
    # OVER is 2**20 + 1 bytes of 'x': one byte over the 1 MiB limit
    with pytest.raises(
        TraceFormatError, match=rf"entry #1 .*: '{field}' longer than 1 MiB \(1,048,577 bytes\)"
    ):
        parse(path)
    pt = parse(path, SKIP)
    assert pt.collectives.column("seq").to_pylist() == [1]
    assert pt.rejected == {f"'{field}' longer than 1 MiB": 1}


def test_flight_recorder_time_beyond_int64_names_the_dump_field(tmp_path):
    from traceprof.collectors.flight_recorder.parse import parse

    e = {
        "collective_seq_id": 1,
        "process_group": ["0", "default_pg"],
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 10,
        "time_discovered_started_ns": 2**63,  # int64's largest is 2**63 - 1
    }
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({"version": "2.10", "pg_config": {}, "entries": [e]}))
    with pytest.raises(
        TraceFormatError, match=r"'time_discovered_started_ns' beyond int64 \(9223372036854775808\)"
    ):
        parse(path)


def test_nccl_plugin_event_too_long(tmp_path):
    from traceprof.collectors.nccl_profiler.parse import parse

    def coll(seq: int, ts: int, **args: object) -> list[dict]:
        head = {"name": "AllReduce", "cat": "COLL", "id": seq, "pid": 1, "tid": 1}
        a = {"SeqNum": seq, "CommHash": 7, "Rank": 0, "Count": 4, "Datatype": "ncclFloat32", **args}
        return [{**head, "ph": "b", "ts": ts, "args": a}, {**head, "ph": "e", "ts": ts + 5}]

    path = tmp_path / "nccl_profile_7_0.json"
    path.write_text(json.dumps([*coll(0, 10), *coll(1, 20, Algorithm=OVER)]))
    with pytest.raises(TraceFormatError, match=r"'args' longer than 1 MiB"):
        parse(path)
    pt = parse(path, SKIP)
    assert pt.collectives.column("seq").to_pylist() == [0]
    assert pt.rejected == {"'args' longer than 1 MiB": 1}


def test_nsys_name_too_long(tmp_path):
    from traceprof.collectors.nsys.parse import parse

    path = tmp_path / "n.sqlite"
    shutil.copy(corpus("nsys") / "pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite", path)
    with sqlite3.connect(path) as con:
        before = parse(path).events.num_rows
        (sid,) = con.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()
        (n,) = con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE demangledName = ?", (sid,)
        ).fetchone()
        con.execute("UPDATE StringIds SET value = ? WHERE id = ?", (OVER, sid))
    with pytest.raises(TraceFormatError, match=r"row \(cat='kernel', name='xxx.*'name' longer than 1 MiB"):
        parse(path)
    pt = parse(path, SKIP)
    assert pt.events.num_rows == before - n and n == 5
    assert pt.rejected["'name' longer than 1 MiB"] == n


def test_ndtimeline_optype_too_long(tmp_path):
    from traceprof.collectors.ndtimeline import parse

    row = dict(rank=0, step=0, stage=0, dp_rank=0, mc=0, gmc=0, mb_id=0, seq_id=0, duration=0.001)
    rows = [{**row, "start_ts": 0.0, "optype": "forward-compute"}, {**row, "start_ts": 0.01, "optype": OVER}]
    path = write_ndtimeline(tmp_path, rows, "t", 1, 1)
    with pytest.raises(
        TraceFormatError, match=r"row #1 \(optype='xxx.*: 'optype' longer than 1 MiB \(1,048,577 bytes\)"
    ):
        parse(path)
    (pt,) = parse(path, SKIP)
    assert pt.events.column("name").to_pylist() == ["forward-compute"]
    assert pt.rejected == {"'optype' longer than 1 MiB": 1}


def test_drop_long_text_on_every_column_kind():
    # Arrow (measured from offsets), a dictionary of few values (Strs), Python lists; row 1 and 3 long
    from traceprof.collectors.kineto._values import Strs

    cols = {
        "name": Strs.of(["a", OVER, "b", "c"]),
        "args": pa.array(["{}", "{}", "{}", OVER]),
        "tid": ["1", "1", "1", "1"],
        "ts_ns": np.array([0, 10, 20, 30]),
    }
    idx, rejected = [5, 6, 7, 8], {}
    drop_long_text("f.json", cols, idx, "skip", rejected)
    assert idx == [5, 7] and cols["ts_ns"].tolist() == [0, 20] and list(cols["name"]) == ["a", "b"]
    assert cols["args"].to_pylist() == ["{}", "{}"] and cols["tid"] == ["1", "1"]
    assert rejected == {"'name' longer than 1 MiB": 1, "'args' longer than 1 MiB": 1}
    with pytest.raises(TraceFormatError, match=r"f.json: event #3 \(name=None, ts_ns=2\): 'tid' longer"):
        drop_long_text(
            "f.json", {"name": [None, None], "ts_ns": [1, 2], "tid": ["1", AT + "y"]}, [0, 3], "raise", {}
        )
    cols = {"name": [AT, "\u00e9" * (MAX_FIELD_BYTES // 2)]}  # at the limit: kept (bytes, not characters)
    drop_long_text("f.json", cols, None, "raise", {})
    assert len(cols["name"]) == 2


def test_trace_level_text_and_reasons_quoting_the_trace(tmp_path):
    from traceprof.collectors.kineto.parse import parse

    # an unknown phase of 2 MB: the event is skipped by design of the source, its reason quotes
    # the value, cut to 120 characters (it was printed whole in the warning and stored)
    f = _kineto(
        tmp_path / "ph.json", [_op(0), {**_op(1), "ph": "Q" * 2**21}, {**_op(2), "ph": "Q" * 2**21 + "R"}]
    )
    pt = parse(f)
    ((reason, n),) = pt.rejected.items()
    assert (
        n == 2
        and len(reason) == 120
        and reason.startswith("unknown phase ph='QQQ")
        and reason.endswith("...")
    )
    # a trace-level text (distributedInfo.backend) over the limit: one line naming the file
    doc = {
        "baseTimeNanoseconds": 0,
        "distributedInfo": {"rank": 0, "world_size": 1, "backend": OVER},
        "traceEvents": [_op(0)],
    }
    (tmp_path / "b.json").write_text(json.dumps(doc))
    with pytest.raises(
        TraceFormatError, match=r"b.json: the trace's backend \('xxx.*'backend' longer than 1 MiB"
    ):
        parse(tmp_path / "b.json")


def test_nccl_plugin_name_too_long_is_named_as_the_dump_spells_it(tmp_path):
    # the event name fills both the event's name and the collective's op: the message names 'name'
    from traceprof.collectors.nccl_profiler.parse import parse

    def coll(seq: int, ts: int, name: str) -> list[dict]:
        head = {"name": name, "cat": "COLL", "id": seq, "pid": 1, "tid": 1}
        a = {"SeqNum": seq, "CommHash": 7, "Rank": 0, "Count": 4, "Datatype": "ncclFloat32"}
        return [{**head, "ph": "b", "ts": ts, "args": a}, {**head, "ph": "e", "ts": ts + 5}]

    path = tmp_path / "nccl_profile_7_0.json"
    path.write_text(json.dumps([*coll(0, 10, "AllReduce"), *coll(1, 20, OVER)]))
    with pytest.raises(TraceFormatError, match=r"'name' longer than 1 MiB \(1,048,577 bytes\)"):
        parse(path)
    assert parse(path, SKIP).rejected == {"'name' longer than 1 MiB": 1}


def test_nccl_inspector_communicator_too_long_is_named_as_the_record_spells_it(tmp_path):
    # header.id fills the collective's pg: the message names 'header.id', not 'pg'
    from tests.collectors.test_nccl_inspector import _rec, _write
    from traceprof.collectors.nccl_inspector.parse import parse

    t = 1_700_000_000_000_000  # us
    path = _write(
        tmp_path / "h-pid100.log",
        [
            _rec("0xaa", 0, 1, "AllReduce", 1, 64, t, t + 10),
            _rec(OVER, 0, 1, "AllReduce", 2, 64, t + 20, t + 30),
        ],
    )
    with pytest.raises(TraceFormatError, match=r"line 2: 'header.id' longer than 1 MiB \(1,048,577 bytes\)"):
        parse(path)
    assert parse(path, SKIP).rejected == {"'header.id' longer than 1 MiB": 1}


def test_many_long_args_past_the_trace_budget_are_refused_naming_the_record(tmp_path, monkeypatch):
    # 1,600 args of 64 KiB (105 MB), each under the 1 MiB field limit, failed together at DuckDB's
    # 96 MB ingest memory limit ("failed to pin block", naming no record, after parsing it all; the
    # budget is 48 MiB). The same rule, on a 2 MiB budget here to keep the file small (4 MB).
    from traceprof.core import limits

    assert (limits.MAX_LONG_TEXT_BYTES, limits.LONG_TEXT_BYTES) == (48 * 2**20, 40 * 2**10)
    monkeypatch.setattr(limits, "MAX_LONG_TEXT_BYTES", 2 * 2**20)
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(_kineto(tmp_path / "ok.json", [_op(0)])), "--db", str(db))[0] == 0
    before = db.read_bytes()
    blob = "x" * 65536
    bad = _kineto(tmp_path / "many.json", [_op(i, args={"blob": blob}) for i in range(60)])
    # each args text is '{"blob": "' + 65,536 x + '"}' = 65,548 bytes; 2 MiB = 2,097,152 bytes:
    # 31 of them take 2,031,988, the 32nd (event #31) 2,097,536, past it
    code, _, err = run("ingest", str(bad), "--db", str(db))
    assert code == 1 and err == (
        f"error: {bad}: event #31 (cat='cpu_op', name='op31', ts_ns=310000): 'args' past the 2 MiB "
        "of values of 40 KiB or more a trace may hold (65,548 bytes; 2,097,536 bytes of such text with "
        "it): the store could not take it in; pass --skip-bad-events to skip such events\n"
    )
    assert db.read_bytes() == before and _runs(db) == ["ok"]  # refused before the store was touched
    # with --skip-bad-events: the first 31 stored, the other 29 counted
    code, _, err = run("ingest", str(bad), "--db", str(db), "--skip-bad-events")
    assert code == 0 and "29 record(s) not stored: 29 'args' past the 2 MiB of values of 40 KiB" in err
    with Store(db, read_only=True) as s:
        got = s.con.execute(
            "SELECT count(*), max(ts_ns), sum(octet_length(args::VARCHAR::BLOB)) FROM events e "
            "JOIN runs r USING (run_id) WHERE r.name = 'many'"
        ).fetchall()
    assert got == [(31, 300_000, 31 * 65_548)]


def test_the_long_text_budget_on_every_column_kind(monkeypatch):
    # the same rule on Arrow, Strs and list columns, fields of a row added up; a budget of 1 MiB
    # of values of 10 KiB or more here (the real ones are 48 MiB and 40 KiB)
    from traceprof.collectors.kineto._values import Strs
    from traceprof.core import limits

    monkeypatch.setattr(limits, "LONG_TEXT_BYTES", 10 * 2**10)
    monkeypatch.setattr(limits, "MAX_LONG_TEXT_BYTES", 2**20)
    long = "y" * 300 * 2**10  # 300 KiB: long; "short" (5 bytes) is not counted
    cols = {
        "name": Strs.of(["a", long, "b", "c", "d", long]),
        "args": pa.chunked_array([["{}", long], [long, "short", long, long]]),
        "tid": ["1", "1", long, "1", "1", "1"],
        "ts_ns": np.arange(6),
    }
    # running total (KiB): row 1: 600, row 2: 600 + 600 = 1,200 > 1,024 -> bad, named by its first
    # largest field, args (not counted), row 3: 600, row 4: 900, row 5: 900 + 600 = 1,500 -> bad (name)
    idx, rejected = [0, 1, 2, 3, 4, 5], {}
    drop_long_text("f.json", cols, idx, "skip", rejected)
    assert idx == [0, 1, 3, 4] and cols["ts_ns"].tolist() == [0, 1, 3, 4]
    assert cols["args"].num_chunks == 2  # filtered, not joined into one chunk
    why = "past the 1 MiB of values of 10 KiB or more a trace may hold"
    assert rejected == {f"'args' {why}": 1, f"'name' {why}": 1}
    with pytest.raises(
        TraceFormatError,
        match=r"f.json: event #3 .*'name' past the 1 MiB .* \(307,200 bytes; 1,228,800 bytes",
    ):
        drop_long_text(
            "f.json", {"name": [long, long, long, long], "ts_ns": [0, 1, 2, 3]}, [0, 1, 2, 3], "raise", {}
        )


def test_long_text_of_a_runs_files_together_is_held_to_the_budget(tmp_path, monkeypatch):
    # DuckDB's limit is on the ingest's transaction, which holds every file of a run: 4 ranks of
    # 700 args of 64 KiB (44 MiB each, under the 48 MiB a trace may hold) failed at the commit
    # ("failed to pin block of size 256.0 KiB"), naming the files but no record; 2 ranks of 35 MiB
    # too. Now the record that takes the run's files together past the budget is a bad record,
    # refused before the store is touched. On a 2 MiB budget here (3 files of 1.25 MiB).
    from traceprof.core import limits

    monkeypatch.setattr(limits, "MAX_LONG_TEXT_BYTES", 2 * 2**20)
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(_kineto(tmp_path / "ok.json", [_op(0)])), "--db", str(db))[0] == 0
    before = db.read_bytes()
    job = tmp_path / "job"
    job.mkdir()
    for rank in range(3):
        doc = {
            "baseTimeNanoseconds": 0,
            "distributedInfo": {"rank": rank, "world_size": 3},
            "traceEvents": [_op(i, args={"blob": "x" * 65536}) for i in range(20)],
        }
        (job / f"rank{rank}.json").write_text(json.dumps(doc))
    # each args text is 65,548 bytes ('{"blob": "' + 65,536 + '"}'); 2 MiB = 2,097,152 bytes: rank0's 20
    # take 1,310,960, rank1's first 12 take 2,097,536 with them, past it: its event op11 (ts 110 us)
    code, _, err = run("ingest", str(job), "--db", str(db))
    assert code == 1 and err == (
        f"error: {job}/rank1.json: event (cat='cpu_op', name='op11', ts_ns=110000): 'args' past the 2 MiB "
        "of values of 40 KiB or more that the files of a run ingested together may hold (65,548 bytes; "
        "2,097,536 bytes of such text with it, 3 files): the store could not take it in; ingest the files a "
        "few at a time with the same --run; pass --skip-bad-events to skip such events\n"
    )
    assert db.read_bytes() == before and _runs(db) == ["ok"]
    # skipped: rank0's 20 and rank1's first 11 (1,310,960 + 721,028 = 2,031,988 bytes) stored
    code, _, err = run("ingest", str(job), "--db", str(db), "--skip-bad-events")
    assert code == 0 and "rank1.json: 9 record(s) not stored: 9 'args' past the 2 MiB" in err
    assert "rank2.json: 20 record(s) not stored" in err
    with Store(db, read_only=True) as s:
        got = s.con.execute(
            "SELECT t.rank, t.events_kept, t.events_rejected, count(e.ts_ns), max(e.ts_ns) FROM traces t "
            "JOIN runs r USING (run_id) LEFT JOIN events e USING (trace_id) WHERE r.name = 'job' "
            "GROUP BY ALL ORDER BY 1"
        ).fetchall()
    assert got == [(0, 20, 0, 20, 190_000), (1, 11, 9, 11, 100_000), (2, 0, 20, 0, None)]


def test_collectives_long_text_counts_toward_the_runs_budget(monkeypatch):
    # On a budget of 100,000 bytes (values of 40,960 bytes or more): a run's first file holds an
    # event of 50,000 bytes of args and 2 collectives whose pg_ranks are 45,000 bytes each (a
    # group of some 7,000 ranks). 50,000 + 45,000 = 95,000 fit; the second collective takes the run
    # to 140,000: left out, counted. Before, only event rows counted: both collectives were kept,
    # 140,000 bytes past the budget. A lone file's events (held to it by its parser, not listed in
    # long_text) count too once another table holds long text: 50,000 + 45,000 + 45,000 again.
    from traceprof.core import limits
    from traceprof.core.parsed import ParsedTrace

    monkeypatch.setattr(limits, "MAX_LONG_TEXT_BYTES", 100_000)

    def trace(name: str) -> ParsedTrace:
        events = pa.table({"cat": ["cpu_op"], "name": ["op0"], "ts_ns": [0], "args": ["x" * 50_000]})
        colls = pa.table({"op": ["all_reduce"] * 2, "seq": [1, 2], "pg_ranks": ["7" * 45_000] * 2})
        return ParsedTrace(name, "", 0, "kineto", "kineto-new", 0, 2, events=events, collectives=colls)

    a, b = trace("/r/rank0.json"), trace("/r/rank1.json")
    a.long_text, b.long_text = limits.long_text_rows(a.events), limits.long_text_rows(b.events)
    limits.drop_run_long_text([a, b], "skip")
    assert (a.events.num_rows, a.collectives["seq"].to_pylist()) == (1, [1])
    assert (b.events.num_rows, b.collectives.num_rows) == (0, 0)
    reason = "'pg_ranks' past the 0.0953674 MiB of values of 40 KiB or more that the files of a run ingested together may hold"
    assert a.rejected == {reason: 1} and b.rejected == {reason: 2, reason.replace("pg_ranks", "args"): 1}
    with pytest.raises(TraceFormatError) as e:
        limits.drop_run_long_text([trace("/r/rank0.json")], "raise")
    assert "collective (op='all_reduce', seq=2): 'pg_ranks' past the" in str(e.value)
    assert "(45,000 bytes; 140,000 bytes of such text with it, 1 files)" in str(e.value)
