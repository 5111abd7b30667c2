"""Each finding of the attack on main in issue 29 (besides the SQL sandbox: tests/test_sandbox.py),
reproduced: one clear line naming the file, or the right result; never a traceback, never a hang.

Hangs are run in a child process with a time limit, so that a regression fails the test instead of
stopping the suite.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests._cli_inproc import run
from tests.builders import micro_trace
from tests.conftest import REPO, SAMPLES, case, corpus

CLI = [sys.executable, "-m", "traceprof.cli"]


def _cli(
    *args: str | bytes, timeout: float = 90, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process; a hang fails the test (TimeoutExpired) after ``timeout`` s."""
    r = subprocess.run([*CLI, *args], capture_output=True, timeout=timeout, cwd=cwd)
    return subprocess.CompletedProcess(
        r.args, r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    )


def _one_line(err: str, *needles: str) -> str:
    """The single error line of ``err`` (no traceback), holding every needle."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# -- hangs ---------------------------------------------------------------------------------------


def test_pickle_of_shared_references_is_refused_at_once(tmp_path):
    # 40 levels, each holding the previous level twice: a few hundred bytes that stand for 2**40
    # values once walked as a tree (it never finished: the plain-data check walked the tree)
    x: list = []
    for _ in range(40):
        x = [x, x]
    d = tmp_path / "fr"
    d.mkdir()
    f = d / "nccl_trace_rank_0"
    f.write_bytes(pickle.dumps({"rank": 0, "entries": x}, protocol=4))
    assert f.stat().st_size < 400
    start = time.monotonic()
    r = _cli("ingest", str(d), "--db", str(tmp_path / "s.duckdb"), timeout=60)
    assert r.returncode == 1 and time.monotonic() - start < 60
    _one_line(r.stderr, str(f), "pickle expands to over 1,000,000 values through shared references")
    assert not (tmp_path / "s.duckdb").exists()


def _dump_pickle(entries: bytes) -> bytes:
    """Pickle opcodes of ``{"rank": 0, "entries": <entries>}`` (protocol 2), ``entries`` given as
    opcodes: pickle.dumps cannot write what the attack writes by hand."""
    return b"\x80\x02}(X\x04\x00\x00\x00rankK\x00X\x07\x00\x00\x00entries" + entries + b"u."


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        # a list appended to itself: EMPTY_LIST, BINPUT 0, BINGET 0, APPEND
        (b"]q\x00h\x00a", "pickle holds itself (a reference cycle); refused"),
        # 5000 empty lists, each appended to the one before: nested 5000 deep
        (b"]" * 5000 + b"a" * 4999, "pickle nested deeper than 100 levels of arrays or objects; refused"),
    ],
)
def test_pickle_cycles_and_deep_nesting_are_refused(tmp_path, entries, message):
    d = tmp_path / "fr"
    d.mkdir()
    f = d / "nccl_trace_rank_0"
    f.write_bytes(_dump_pickle(entries))
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err) == f"error: {f}: {message}"


def test_a_pickle_sharing_a_list_reads_like_the_json(tmp_path):
    """Shared references within the bound are read as copies: a dump whose entries share one
    ``input_sizes`` list (as a memoizing pickler may write it) gives the same store as its JSON."""
    from traceprof.collectors.flight_recorder.parse import parse

    doc = json.loads((corpus("flight_recorder/gloo_cpu_4rank") / "fr_rank0.json").read_text())
    shared = [[4, 4]]
    for e in doc["entries"]:
        e["input_sizes"] = shared
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(doc, protocol=4))
    (tmp_path / "rank0.fr.json").write_text(json.dumps(doc))
    a = parse(tmp_path / "nccl_trace_rank_0")
    b = parse(tmp_path / "rank0.fr.json")
    assert a.collectives.to_pylist() == b.collectives.to_pylist() and a.collectives.num_rows == len(
        doc["entries"]
    )


def _nd_run(tmp_path: Path, meta: bytes) -> Path:
    import polars as pl

    d = tmp_path / "nd"
    d.mkdir()
    pl.read_parquet(corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")).head(10).write_parquet(
        d / "trace-X.parquet"
    )
    (d / "meta-X.yaml").write_bytes(meta)
    return d


def test_yaml_billion_laughs_is_refused(tmp_path):
    # nine nested aliases of nine: 9**9 strings once the trial name is encoded (past 1.7 GB before)
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    d = _nd_run(tmp_path, ("\n".join([*lines, "trial_name: *a8", "dp_size: 2"]) + "\n").encode())
    r = _cli("ingest", str(d), "--db", str(tmp_path / "s.duckdb"), timeout=60)
    assert r.returncode == 1
    _one_line(
        r.stderr, f"{d / 'meta-X.yaml'}: line 2:10: invalid meta YAML: an alias (*name): aliases are not read"
    )


@pytest.mark.parametrize(
    ("depth", "message"),
    [
        (5000, "meta-X.yaml: invalid meta YAML: nested too deeply (over ~1000 levels of arrays or objects)"),
        (150, "meta-X.yaml: meta YAML nested deeper than 100 levels of arrays or objects; refused"),
    ],
)
def test_yaml_nested_deeply_is_one_line(tmp_path, depth, message):
    d = _nd_run(tmp_path, b"dp_size: 2\nx: " + b"[" * depth + b"1" + b"]" * depth + b"\n")
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err).endswith(message)


def test_yaml_over_a_mebibyte_is_refused(tmp_path):
    d = _nd_run(tmp_path, b"dp_size: 2\n" + b"#" * (1 << 20) + b"\n")  # 11 + 1,048,576 + 1 bytes
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1
    _one_line(err, "meta-X.yaml: meta YAML of 1,048,588 bytes", "refused above 1,048,576 bytes")


@pytest.mark.parametrize("command", ["ingest", "sql"])
@pytest.mark.parametrize("which", ["store", "wal"])
def test_a_fifo_as_the_store_is_refused_at_once(tmp_path, command, which):
    db = tmp_path / "s.duckdb"
    fifo = db if which == "store" else tmp_path / "s.duckdb.wal"
    os.mkfifo(fifo)
    args = ["ingest", str(SAMPLES / "normal")] if command == "ingest" else ["sql", "SELECT 1"]
    r = _cli(*args, "--db", str(db), timeout=60)  # it blocked forever before
    assert r.returncode == 1
    _one_line(
        r.stderr, f"{fifo}: a FIFO (named pipe), not a regular file; --db takes a store file or a new path"
    )


def test_a_device_as_the_store_and_a_fifo_as_input_are_refused(tmp_path):
    code, _, err = run("ingest", str(SAMPLES / "normal"), "--db", "/dev/null")
    assert (
        code == 1
        and _one_line(err)
        == "error: /dev/null: a character device, not a regular file; --db takes a store file or a new path"
    )
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    r = _cli("ingest", str(fifo), "--db", str(tmp_path / "s.duckdb"), timeout=60)
    assert (
        r.returncode == 1
        and _one_line(r.stderr) == f"error: {fifo}: a FIFO (named pipe), not a trace file or a folder"
    )
    assert sorted(os.listdir(tmp_path)) == ["rank0.json"]  # no store, no lock file


# -- tracebacks ----------------------------------------------------------------------------------


def test_base_time_beyond_int64_is_one_line(tmp_path):
    doc = json.loads((case("cuda_graph_launch") / "rank0.json").read_text())
    doc["baseTimeNanoseconds"] = -(2**63) - 5  # was an OverflowError in kineto/decode.py
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    code, _, err = run("ingest", str(tmp_path / "rank0.json"), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1
    _one_line(err, "rank0.json: baseTimeNanoseconds: -9223372036854775813 is beyond int64")


@pytest.mark.parametrize(
    ("field", "text"), [("ts", "1e300"), ("dur", "1e300"), ("dur", "1e23"), ("ts", "-1e300")]
)
def test_a_time_beyond_int64_is_said_one_way(tmp_path, field, text):
    # before: "ts": 1e300 was "bad time: 1e300 us is out of range", "dur": 1e23 "'dur' beyond int64
    # (1e23 us)"; both are the README's "'<field>' beyond int64 (<value> us)"
    ev = {"ph": "X", "cat": "cpu_op", "name": "far", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    body = json.dumps({"traceEvents": [{**ev, field: 12345}]}).replace("12345", text)
    (tmp_path / "rank0.json").write_text(body)
    code, _, err = run("ingest", str(tmp_path / "rank0.json"), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1
    _one_line(err, f"rank0.json: event #0 (ph='X', name='far'): {field!r} beyond int64 ({text} us)")


def test_base_time_plus_ts_beyond_int64_rejects_those_events_not_wraps(tmp_path):
    # base within int64, base + ts not: numpy's in-place add wrapped silently in the fast path
    base = 2**63 - 1_000_000  # 1 ms below the top: events after 1000 us no longer fit
    doc = micro_trace(["aten::mm", "aten::add"], base_ns=base)
    doc["traceEvents"].append(
        {"ph": "X", "cat": "cpu_op", "name": "late", "pid": 1, "tid": 1, "ts": 5000, "dur": 1}
    )
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(tmp_path / "rank0.json"), "--db", str(db))
    assert code == 1
    # event #3: ProfilerStep#1, aten::mm, aten::add come first; base + 5000 us = 2**63 + 4,000,000
    _one_line(
        err,
        "rank0.json: event #3 (ph='X', name='late')",
        f"'ts' beyond int64 (5000 us after baseTimeNanoseconds {base})",
    )
    code, _, err = run("ingest", str(tmp_path / "rank0.json"), "--db", str(db), "--skip-bad-events")
    assert code == 0, err
    rows = (
        duckdb.connect(str(db), read_only=True)
        .execute("SELECT name, ts_ns FROM events ORDER BY ts_ns")
        .fetchall()
    )
    assert rows == [("ProfilerStep#1", base), ("aten::mm", base + 1000), ("aten::add", base + 2000)]


@pytest.mark.parametrize(
    ("depth", "message"),
    [
        (
            5000,
            "invalid JSON: nested too deeply (over ~1000 levels of arrays or objects)",
        ),  # was a RecursionError
        (150, "sidecar nested deeper than 100 levels of arrays or objects; refused"),
    ],
)
def test_sidecar_nested_deeply_is_one_line(tmp_path, depth, message):
    shutil.copy(SAMPLES / "normal" / "rank0.trace.json.gz", tmp_path / "rank0.trace.json.gz")
    side = tmp_path / "rank0.meta.json"
    side.write_text('{"rank": 0, "x": ' + "[" * depth + "]" * depth + "}")
    code, _, err = run("ingest", str(tmp_path), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err) == f"error: {side}: {message}"


def _plugin_dump(path: Path, args: str) -> Path:
    path.write_text(
        "[\n"
        '{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 0, "pid": 1, "tid": 1, "ts": 1.000, '
        f'"args": {{"CommHash": 77, "Rank": 0, "Count": 8, "Datatype": "ncclFloat32", {args}}}}},\n'
        '{"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 0, "pid": 1, "tid": 1, "ts": 2.000},\n'
        "{}]\n"
    )
    return path


def test_plugin_argument_nested_3000_deep_is_one_line(tmp_path):
    f = _plugin_dump(
        tmp_path / "nccl_profile_rank0.txt", '"SeqNum": 0, "X": ' + "[" * 3000 + "1" + "]" * 3000
    )
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err) == (
        f"error: {f}: line 2: invalid JSON: nested too deeply (over ~1000 levels of arrays or objects)"
    )


def test_plugin_negative_seqnum_is_an_error_as_documented(tmp_path):
    f = _plugin_dump(tmp_path / "nccl_profile_rank0.txt", '"SeqNum": -1')
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(f), "--db", str(db))
    assert code == 1 and _one_line(err) == (
        f"error: {f}: event #0 (COLL 'AllReduce'): negative 'SeqNum' (-1); "
        "pass --skip-bad-events to skip such events"
    )
    # skipped: its only collective goes, so nothing is left to store
    code, _, err = run("ingest", str(f), "--db", str(db), "--skip-bad-events")
    assert code == 1 and _one_line(
        err, "no valid COLL or P2P event: all skipped ({\"negative 'SeqNum'\": 1})"
    )


@pytest.mark.parametrize("command", [["ingest", str(SAMPLES / "normal")], ["sql", "SELECT 1"]])
def test_a_store_path_that_is_not_utf8_is_one_line(tmp_path, command):
    # bytes that are not UTF-8 in argv: DuckDB threw std::bad_cast
    r = subprocess.run(
        [*CLI, *command, "--db", b"\xff.duckdb"], capture_output=True, cwd=tmp_path, timeout=90
    )
    assert r.returncode == 1 and b"Traceback" not in r.stderr and b"bad_cast" not in r.stderr, r.stderr
    assert r.stderr.decode() == (
        "error: \\udcff.duckdb: the store path is not UTF-8 (DuckDB takes UTF-8 paths only); "
        "use another --db path, or run from a folder whose path is UTF-8\n"
    )
    assert os.listdir(tmp_path) == []


def test_deep_brackets_are_invalid_json_not_another_format(tmp_path):
    # '[' * 200000 was "valid JSON but not a Kineto trace" (msgspec stops at the first byte)
    f = tmp_path / "rank0.json"
    f.write_text("[" * 200_000)
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert (
        code == 1
        and _one_line(err)
        == f"error: {f}: invalid JSON: nested too deeply (over ~1000 levels of arrays or objects)"
    )
    f.write_text("[" * 10 + "1")  # truncated, and shallow
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err, f"{f}: byte 11: truncated JSON")
    f.write_text("[1, 2]")  # an array is JSON, and not a trace
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err, "valid JSON but not a Kineto trace")


def _nsys_copy(tmp_path: Path, *sql: str) -> Path:
    import sqlite3

    f = tmp_path / "rank0.sqlite"
    shutil.copy(case("nsys_graph_level_trace") / "train_rank0.sqlite", f)
    f.chmod(0o644)
    con = sqlite3.connect(f)
    for q in sql:
        con.execute(q)
    con.commit()
    con.close()
    return f


def test_nsys_error_with_schema_text_is_one_line(tmp_path):
    # SQLite quotes the schema text it cannot read; with line breaks in it the error spanned lines
    f = _nsys_copy(
        tmp_path,
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_master SET sql = 'CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT "
        "NOT NULL) x''a\nb\nc''' WHERE name = 'StringIds'",
    )
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err) == (
        f"error: {f}: unreadable SQLite file (malformed database schema "
        "(StringIds) - unrecognized token: \"x'a b c'\")"
    )


def test_nsys_device_id_beyond_int32_is_the_row_named(tmp_path):
    # events.device is INTEGER: pyarrow raised ArrowInvalid (a traceback) building the table
    f = _nsys_copy(
        tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 9223372036854775807 WHERE rowid = 1"
    )
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err) == (
        f"error: {f}: CUPTI_ACTIVITY_KIND_KERNEL row id 1: deviceId beyond int32 "
        "(deviceId=9223372036854775807, start=120000, end=220000); pass --skip-bad-events to skip such rows"
    )
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"), "--skip-bad-events")
    assert code == 0, err
    rejected = (
        duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
        .execute("SELECT rejected FROM traces")
        .fetchone()
    )
    assert json.loads(rejected[0]) == {"CUPTI_ACTIVITY_KIND_KERNEL: deviceId beyond int32": 1}


@pytest.mark.parametrize(
    ("sql", "rejected"),
    [
        # TARGET_INFO_GPU values beyond the devices columns (or text in them) were ArrowInvalid tracebacks
        ("UPDATE TARGET_INFO_GPU SET id = 1099511627776", {"TARGET_INFO_GPU: 'device' beyond int32": 1}),
        (
            "UPDATE TARGET_INFO_GPU SET smCount = 9223372036854775807",
            {"TARGET_INFO_GPU: 'sm_count' beyond int32": 1},
        ),
        ("UPDATE TARGET_INFO_GPU SET totalMemory = 'abc'", {}),
        # a step number beyond int32 (the steps column): the range stays an annotation, not a step
        ("UPDATE NVTX_EVENTS SET text = 'ProfilerStep#99999999999'", {}),
    ],
)
def test_nsys_numbers_beyond_their_columns_are_left_out(tmp_path, sql, rejected):
    f = _nsys_copy(tmp_path, sql)
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(f), "--db", str(db))
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    assert json.loads(con.execute("SELECT rejected FROM traces").fetchone()[0] or "{}") == rejected
    assert con.execute("SELECT count(*) FROM steps WHERE step > 2147483647").fetchone() == (0,)
    if "totalMemory" in sql:  # the device is kept, its memory unknown
        assert con.execute("SELECT memory_bytes FROM devices").fetchall() == [(None,)]


def test_yaml_integer_over_4300_digits_is_one_line(tmp_path):
    d = _nd_run(tmp_path, b"dp_size: 2\nx: " + b"9" * 5000 + b"\n")
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err, "meta-X.yaml: invalid meta YAML: Exceeds the limit (4300 digits)")


def test_pickle_integer_too_big_to_print_is_one_line(tmp_path):
    # a LONG4 opcode can hold any integer; Python cannot format one over 4300 digits (a ValueError
    # in the record check's message)
    d = tmp_path / "fr"
    d.mkdir()
    f = d / "nccl_trace_rank_0"
    body = (10**5000).to_bytes(2077, "little", signed=True)
    f.write_bytes(_dump_pickle(b"]\x8b" + len(body).to_bytes(4, "little") + body + b"a"))
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err) == (
        f"error: {f}: pickle holds dump['entries'][0]: an integer of 16,610 bits, "
        "which no dump field holds; refused (plain data only)"
    )


# -- smaller -------------------------------------------------------------------------------------


def test_a_missing_input_leaves_no_store_and_no_lock(tmp_path):
    code, _, err = run("ingest", str(tmp_path / "nothere.json"), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err) == f"error: {tmp_path / 'nothere.json'}: no such file or directory"
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def small_db(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    (d / "run").mkdir()
    (d / "run" / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm", "\u202eevil"])))
    db = d / "s.duckdb"
    assert run("ingest", str(d / "run"), "--db", str(db))[0] == 0
    return db


@pytest.mark.parametrize("command", [["report", "-o"], ["export", "perfetto", "-o"]])
def test_a_full_disk_leaves_no_cut_file(small_db, tmp_path, monkeypatch, command):
    """ENOSPC while the output is written: one line, no 0-byte (or cut) file, no temporary file, and
    an earlier file at that path kept whole. (The disk fills as the data is flushed: fsync fails.)"""
    from traceprof.core import fileio

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / ("r.html" if command[0] == "report" else "t.json.gz")
    monkeypatch.setattr(fileio.os, "fsync", full)
    code, _, err = run(*command, str(out), "--db", str(small_db))
    assert code == 1 and _one_line(err) == (
        f"error: {out}: cannot write: No space left on device; nothing written "
        "(an earlier file there is kept)"
    )
    assert os.listdir(tmp_path) == []
    out.write_bytes(b"earlier")
    assert run(*command, str(out), "--db", str(small_db))[0] == 1
    assert os.listdir(tmp_path) == [out.name] and out.read_bytes() == b"earlier"
    monkeypatch.undo()
    code, _, err = run(*command, str(out), "--db", str(small_db))
    assert code == 0 and os.listdir(tmp_path) == [out.name], err
    data = out.read_bytes()
    assert (
        (gzip.decompress(data) if out.suffix == ".gz" else data)
        .strip()
        .endswith(b"}" if out.suffix == ".gz" else b"</html>")
    )


def test_output_through_a_symlink_and_to_a_device(small_db, tmp_path):
    target = tmp_path / "real.json"
    (tmp_path / "link.json").symlink_to(target)
    code, _, err = run("export", "perfetto", "-o", str(tmp_path / "link.json"), "--db", str(small_db))
    assert (
        code == 0 and (tmp_path / "link.json").is_symlink() and json.loads(target.read_text())["traceEvents"]
    ), err
    code, _, err = run("export", "perfetto", "-o", "/dev/null", "--db", str(small_db))
    assert code == 0 and Path("/dev/null").is_char_device(), err


def test_json_output_escapes_bidi_and_keeps_the_value(small_db):
    # table and CSV showed \u202e escaped; JSON printed the override raw (it reverses the terminal line)
    code, out, err = run(
        "sql",
        "SELECT name FROM events WHERE kind = 'cpu_op' ORDER BY ts_ns",
        "--db",
        str(small_db),
        "-f",
        "json",
    )
    assert code == 0 and "\u202e" not in out and '"\\u202eevil"' in out, err
    assert json.loads(out) == [{"name": "aten::mm"}, {"name": "\u202eevil"}]
    code, out, err = run("analyze", "kernel_sum", "--db", str(small_db), "-f", "json")
    assert "\u202e" not in out


# -- every numeric option ------------------------------------------------------------------------

_EXTREMES = ["inf", "-inf", "nan", "1e308", "-1e308", "-1", "0", "9223372036854775807", "9223372036854775808"]


@pytest.fixture(scope="module")
def normal_store(tmp_path_factory):
    from traceprof.storage.store import Store

    db = tmp_path_factory.mktemp("normal") / "s.duckdb"
    assert run("ingest", str(SAMPLES / "normal"), "--db", str(db))[0] == 0
    with Store(db, read_only=True) as s:
        yield s


def test_every_numeric_analysis_parameter_is_range_checked_or_safe(normal_store):
    """Each int/float parameter of each analysis, at the edges: refused in one line (UsageError), or
    accepted and the analysis still ends with a result or its own one-line error; never a traceback."""
    import dataclasses

    from traceprof.core.errors import TraceprofError, UsageError
    from traceprof.engine import analysis as registry
    from traceprof.engine.session import Session

    registry.load_all()
    tried = accepted = 0
    for name in registry.names():
        an = registry.get(name)
        for f in dataclasses.fields(an.params):
            if f.name == "run" or not isinstance(f.default, (int, float)) or isinstance(f.default, bool):
                if f.name != "peak_tflops":  # None by default: a number when given
                    continue
            for raw in _EXTREMES:
                tried += 1
                try:
                    params = registry.make_params(an, None, {f.name: raw})
                except UsageError as e:
                    assert "\n" not in str(e) and f.name in str(e), str(e)
                    continue
                accepted += 1
                with Session(normal_store, many=False):
                    try:
                        an.run(normal_store, params)
                    except TraceprofError as e:
                        assert "\n" not in str(e), (name, f.name, raw, str(e))
    assert tried > 100 and accepted > 0, (tried, accepted)


def test_an_insert_duckdb_cannot_hold_is_one_line_naming_the_files(tmp_path, monkeypatch):
    # one event with 7 MB of args: DuckDB ran out of its 96 MB ingest limit; its message spanned
    # eight lines (with advice to SET settings) and named no file. Found by the fuzzer (a pickle
    # whose shared references expand to 7 MB of args; such a pickle is refused now, a JSON file is not).
    # Such a value is now over the 1 MiB limit of a field (tests/ingest/test_long_text.py), refused
    # naming the event.
    doc = micro_trace(["aten::mm"])
    doc["traceEvents"][1]["args"] = {"x": [[1] * 2_400_000]}  # "1, " x 2.4 M: 7.2 MB of text
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(doc))
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(err, f"{f}: event #1 (", "'args' longer than 1 MiB (7,200,009 bytes)")
    # Many values under it can still be more than DuckDB holds under its limit: a trace holds at most
    # limits.MAX_LONG_TEXT_BYTES (48 MiB) of long text, and several files of a run that fit alone may
    # not together. Both on smaller limits here (the real ones take files of 50-100 MB): 8 MiB and
    # DuckDB's ingest memory limit at 16 MB.
    from traceprof.core import limits
    from traceprof.storage import store

    monkeypatch.setattr(limits, "MAX_LONG_TEXT_BYTES", 8 * 2**20)
    monkeypatch.setattr(store, "INGEST_MEMORY_LIMIT_MB", 16)
    ops = [{**doc["traceEvents"][1], "ts": 1 + i / 2} for i in range(12)]  # in the step (0-100 us)
    doc["traceEvents"][1:2] = [
        {**op, "args": {"x": chr(97 + i % 26) * 1_000_000}} for i, op in enumerate(ops)
    ]
    f.write_text(json.dumps(doc))  # 12 MB of args in values of 1 MB: '{"x": "' + 1 M + '"}', 1,000,009 bytes
    # 8 MiB = 8,388,608 bytes: 8 values take 8,000,072, the 9th (event #9; #0 is the step) 9,000,081;
    # refused before the store is touched
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(
        err,
        f"{f}: event #9 (",
        "'args' past the 8 MiB of values of 40 KiB or more a trace may hold (1,000,009",
    )
    assert not (tmp_path / "s.duckdb").exists()
    # three ranks of 8 of them (8 MB each, under it alone): 24 MB, more than DuckDB holds under 16 MB
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    for rank in (0, 1, 2):
        d = micro_trace(["aten::mm"], rank=rank, world=3)
        d["traceEvents"][1:2] = [
            {**d["traceEvents"][1], "ts": 1 + i / 2, "args": {"x": chr(97 + i % 26) * 1_000_000}}
            for i in range(8)
        ]
        (run_dir / f"rank{rank}.json").write_text(json.dumps(d))
    # the run's files together are held to the budget too (DuckDB holds them in one transaction):
    # rank1's first value takes them to 9,000,081 bytes, past 8 MiB; refused before the store is touched
    code, _, err = run("ingest", str(run_dir), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(
        err,
        f"{run_dir}/rank1.json: event (cat='cpu_op', name='aten::mm', ts_ns=1700000000000001000): ",
        "'args' past the 8 MiB of values of 40 KiB or more that the files of a run ingested together may "
        "hold (1,000,009 bytes; 9,000,081 bytes of such text with it, 3 files)",
    )
    assert not (tmp_path / "s.duckdb").exists()
    # were that check not there, DuckDB's own failure is one line as well, naming the files
    monkeypatch.setattr(limits, "drop_run_long_text", lambda traces, on_bad_event: None)
    code, _, err = run("ingest", str(run_dir), "--db", str(tmp_path / "s.duckdb"))
    if code == 0:  # a DuckDB that holds it: stored whole
        got = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True).execute(
            "SELECT count(*) FROM events WHERE name = 'aten::mm'"
        )
        assert got.fetchall() == [(24,)]
        return
    assert code == 1 and _one_line(
        err,
        f"ingest of run 'job' ({run_dir}/rank0.json, {run_dir}/rank1.json, {run_dir}/rank2.json) failed, "
        "store unchanged: ",
        "ingest memory limit (16 MB)",
        "ingest them a few at a time with the same --run",
    )
    assert not (tmp_path / "s.duckdb").exists()


@pytest.mark.slow
def test_many_collectives_are_matched_within_the_ingest_memory_limit(tmp_path, monkeypatch):
    # 2 ranks x 100,000 steps (benchmarks/gen_trace.py, one all-reduce a step) ran out of DuckDB's
    # 96 MB ingest limit building collective_instances (per-instance lists and modes of the whole run
    # in one statement), and the error blamed long text the files do not hold. Here on a smaller scale:
    # 2 x 5,000 steps under 40 MB and 20 MB, the instances built 2,000 collectives rows at a time.
    from traceprof.ingest import matching
    from traceprof.storage import store

    job = tmp_path / "job"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gen_trace.py"), str(job), "--ranks", "2"]
        + ["--events", "100000", "--steps", "5000"],
        check=True,
        capture_output=True,
    )
    monkeypatch.setattr(matching, "INSTANCE_CHUNK_ROWS", 2000, raising=False)
    db = tmp_path / "s.duckdb"
    # under 20 MB matching fails: the message names that step, not long text (the files hold none),
    # and does not suggest ingesting fewer files (the step reads the whole run)
    monkeypatch.setattr(store, "INGEST_MEMORY_LIMIT_MB", 20)
    code, _, err = run("ingest", str(job), "--db", str(db))
    line = _one_line(
        err,
        f"ingest of run 'job' ({job}/rank0.trace.json, {job}/rank1.trace.json) failed, store unchanged: "
        "Out of Memory Error: ",
        "; DuckDB's ingest memory limit (20 MB) was too small for matching the run's collectives across "
        "ranks and aligning its clocks",
    )
    assert code == 1 and "long text" not in line and "a few at a time" not in line
    assert not db.exists()
    monkeypatch.setattr(store, "INGEST_MEMORY_LIMIT_MB", 40)  # DuckDB needs ~27 MiB with 2 threads here
    code, _, err = run("ingest", str(job), "--db", str(db))
    assert code == 0, err
    con = duckdb.connect(str(db), read_only=True)
    # one all-reduce a step on both ranks, matched by process group and sequence number
    assert con.execute(
        """SELECT count(*), count(DISTINCT instance_id), min(instance_id), max(instance_id),
                  count(*) FILTER (WHERE ranks_present = [0, 1] AND len(ranks_missing) = 0
                                   AND match_method = 'pg_seq' AND ordinal = 0)
           FROM collective_instances"""
    ).fetchall() == [(5000, 5000, 1, 5000, 5000)]
    # step k's instance is the k-th by first arrival, its ordinal over the whole run (not a chunk)
    assert con.execute(
        "SELECT count(DISTINCT step), count(*) FILTER (WHERE n_ranks = 2) FROM collective_instances"
    ).fetchall() == [(5000, 5000)]


@pytest.mark.parametrize("column", ["stage", "dp_rank", "seq_id"])
def test_ndtimeline_null_group_columns_are_bad_rows(tmp_path, column):
    # a null stage / dp_rank / seq_id was a TypeError (None + 1) building the group names; found by the fuzzer
    import polars as pl

    df = pl.read_parquet(corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")).head(10)
    vals = df[column].to_list()
    vals[4] = None
    f = tmp_path / "trace-X.parquet"
    df.with_columns(pl.Series(column, vals, df.schema[column])).write_parquet(f)
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and _one_line(
        err, f"{f}: row #4 (optype=", f"): null {column!r}; pass --skip-bad-events"
    )
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"), "--skip-bad-events")
    assert code == 0, err
    n = (
        duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
        .execute("SELECT count(*) FROM events")
        .fetchone()
    )
    assert n == (9,)


def test_damaged_parquet_is_one_line_never_an_abort(tmp_path):
    """One bit flipped in each of the first 400 bytes of an NDTimeline file (page headers among
    them): polars' reader aborted the whole process on some (a 2**61-byte allocation: SIGABRT, no
    message at all) and panicked on others; pyarrow reads and checks the file now. In a child
    process, so that an abort fails this test rather than the suite."""
    import polars as pl

    seed = tmp_path / "seed.parquet"
    pl.read_parquet(corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")).head(
        400
    ).write_parquet(seed)
    script = f"""
import sys
from pathlib import Path
from traceprof.collectors import ndtimeline
from traceprof.core.errors import TraceFormatError
data = Path({str(seed)!r}).read_bytes()
out = Path({str(tmp_path / "trace-X.parquet")!r})
counts = {{"stored": 0, "error": 0}}
for i in range(400):
    out.write_bytes(data[:i] + bytes([data[i] ^ 1]) + data[i + 1:])
    try:
        ndtimeline.parse(out)
        counts["stored"] += 1
    except TraceFormatError as e:
        assert "\\n" not in str(e) and str(out) in str(e), str(e)
        counts["error"] += 1
print(counts["stored"], counts["error"], flush=True)
# pyarrow and polars loaded together abort about 1 process in 15 at interpreter exit ("terminate
# called without an active exception"; the good file parsed 400 times does it too): that is after
# every result above, so the child leaves without the teardown
import os
os._exit(0)
"""
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    stored, errors = map(int, r.stdout.split())
    assert stored + errors == 400 and errors > 0


def test_an_integer_too_long_to_print_is_shown_by_its_size(tmp_path):
    # 5000 dims of 1,000,000 multiply to a 100,000-bit element count: the message that named it
    # raised ValueError (Python prints no integer over 4300 digits); found by the fuzzer
    doc = json.loads((corpus("flight_recorder/gloo_cpu_4rank") / "fr_rank0.json").read_text())
    doc["entries"][0]["output_sizes"] = [[1_000_000] * 5000]
    f = tmp_path / "rank0.fr.json"
    f.write_text(json.dumps(doc))
    code, _, err = run("ingest", str(f), "--db", str(tmp_path / "s.duckdb"))
    name = doc["entries"][0]["profiling_name"]
    assert code == 1 and _one_line(err) == (
        f"error: {f}: entry #0 ({name!r}): 'nelems_out' beyond int64 (<an integer "
        f"of {(10**30000).bit_length():,} bits>); pass --skip-bad-events to skip "
        "such entries"
    )


def test_fr_group_numbers_beyond_their_columns_are_ignored(tmp_path):
    # pg_config ranks and pg_status sequence numbers of 30 digits went into traces.meta, which
    # orjson then could not read back ("number is infinity": a traceback when the file also held
    # invalid UTF-8, whose repair rewrites the meta); found by the fuzzer
    doc = json.loads((corpus("flight_recorder/gloo_cpu_4rank") / "fr_rank0.json").read_text())
    doc["pg_config"][""]["ranks"] = "[0, 1, 2, " + "9" * 30 + "]"
    doc["pg_status"]["0"]["last_completed_collective"] = "9" * 30
    f = tmp_path / "rank0.fr.json"
    f.write_bytes(
        json.dumps(doc)
        .replace('"comm_lib_version": "', '"comm_lib_version": "\\xff')
        .encode()
        .replace(b"\\xff", b"\xff")
    )
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(f), "--db", str(db))
    assert code == 0 and "invalid UTF-8" in err, err
    meta = json.loads(
        duckdb.connect(str(db), read_only=True).execute("SELECT meta FROM traces").fetchone()[0]
    )
    assert meta["groups"] == {"0": None} and meta["progress"]["0"]["completed"] is None
    assert meta["repaired"] == {"invalid UTF-8 replaced by U+FFFD": 1}
    code, out, err = run("analyze", "desync", "--db", str(db), "-f", "json")
    assert code == 0, err
