"""Nsight Systems SQLite exports: ingest of the corpus files, and analyses checked against SQL written
directly on the SQLite file (never on our store)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import analyze, corpus
from traceprof.collectors.nsys.parse import parse
from traceprof.core.errors import NotATraceError, TraceFormatError, UsageError
from traceprof.core.parsed import ParseOptions
from traceprof.ingest import sources
from traceprof.ingest.ingest import ingest

SAXPY = "nsys/pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
CLOVER = "nsys/pipit_perlmutter-cloverleaf-cuda.sqlite"
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")

# Union of intervals in plain SQLite: gaps-and-islands over rows sorted by start.
_UNION = """
WITH a AS ({rows}),
b AS (SELECT start, end, max(end) OVER (ORDER BY start, end ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pe FROM a),
c AS (SELECT start, end, sum(CASE WHEN pe IS NULL OR start > pe THEN 1 ELSE 0 END)
        OVER (ORDER BY start, end ROWS UNBOUNDED PRECEDING) AS island FROM b)
SELECT coalesce(sum(e - s), 0) FROM (SELECT min(start) AS s, max(end) AS e FROM c GROUP BY island)
"""


def _q(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _gpu_rows(db: Path, where: str = "1") -> str:
    have = {r[0] for r in _q(db, "SELECT name FROM sqlite_master")}
    return " UNION ALL ".join(
        f"SELECT k.start, k.end FROM {t} k LEFT JOIN StringIds s ON s.id = {'k.demangledName' if 'KERNEL' in t else 'NULL'} "
        f"WHERE {where if 'KERNEL' in t else '1'}"
        for t in GPU_TABLES
        if t in have
    )


def _union(db: Path, rows: str) -> int:
    return _q(db, _UNION.format(rows=rows))[0][0]


@pytest.mark.parametrize("rel", [SAXPY, CLOVER])
def test_corpus_exports_ingest_and_match_sql(store, rel):
    db = corpus(rel)
    res = ingest(store, [db], run="r")
    assert res.added == [str(db.resolve())]
    (epoch,) = _q(db, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    # Every kernel, with its demangled name and exact epoch ns.
    want = sorted(
        (epoch + s, e - s, n)
        for s, e, n in _q(
            db,
            "SELECT k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName",
        )
    )
    got = sorted(store.sql("SELECT ts_ns, dur_ns, name FROM events WHERE kind = 'kernel'").rows())
    assert got == want
    # Every kernel links to its runtime call by correlation id (launch linking).
    linked = store.sql(
        "SELECT count(*) AS n FROM kernels WHERE kind = 'kernel' AND launch_ts_ns IS NOT NULL"
    )["n"][0]
    (sql_linked,) = _q(
        db,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE EXISTS (SELECT 1 FROM "
        "CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId)",
    )[0]
    assert linked == sql_linked == len(want)
    # temporal: window = first to last GPU activity; busy = union; compute = union of kernels.
    (lo, hi) = _q(db, " SELECT min(start), max(end) FROM (" + _gpu_rows(db) + ")")[0]
    busy = _union(db, _gpu_rows(db))
    compute = _union(db, "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL")
    t = analyze(store, "temporal", "r").frame.row(0, named=True)
    assert (t["window_ns"], t["idle_ns"], t["compute_ns"], t["non_compute_ns"]) == (
        hi - lo,
        hi - lo - busy,
        compute,
        busy - compute,
    )
    # kernels: kernel time is the sum of all GPU rows; memory = union of copies.
    k = analyze(store, "kernels", "r").frame.row(0, named=True)
    (total,) = _q(db, "SELECT sum(end - start) FROM (" + _gpu_rows(db) + ")")[0]
    assert (k["kernel_ns"], k["busy_ns"], k["compute_ns"], k["comm_ns"]) == (total, busy, compute, 0)
    assert k["memory_ns"] == _union(db, "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    # Devices from TARGET_INFO_GPU.
    assert sorted(store.sql("SELECT device, name, sm_count FROM devices").rows()) == sorted(
        _q(db, "SELECT id, name, smCount FROM TARGET_INFO_GPU")
    )


def test_kernel_sum_matches_sql(store):
    db = corpus(CLOVER)
    ingest(store, [db], run="r")
    got = analyze(store, "kernel_sum", "r").frame
    rows = _q(
        db,
        """SELECT s.value, count(*), sum(k.end - k.start), min(k.end - k.start), max(k.end - k.start),
                            avg(k.end - k.start)
                     FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName GROUP BY s.value""",
    )
    assert got.height == len(rows)
    by_name = {r["name"]: r for r in got.iter_rows(named=True)}
    total_all = sum(r[2] for r in rows)
    for name, n, total, lo, hi, avg in rows:
        r = by_name[name]
        assert (r["instances"], r["total_ns"], r["min_ns"], r["max_ns"]) == (n, total, lo, hi)
        assert r["avg_ns"] == int(avg + 0.5)  # durations are positive: round half up
        assert r["time_pct"] == pytest.approx(100 * total / total_all)
        durs = [
            d
            for (d,) in _q(
                db,
                f"""SELECT k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                                         ON s.id = k.demangledName WHERE s.value = '{name.replace("'", "''")}'
                                         ORDER BY 1""",
            )
        ]
        mid = len(durs) // 2
        med = durs[mid] if len(durs) % 2 else (durs[mid - 1] + durs[mid]) / 2
        assert r["med_ns"] == int(med + 0.5)
        mean = sum(durs) / len(durs)
        std = (sum((d - mean) ** 2 for d in durs) / (len(durs) - 1)) ** 0.5 if len(durs) > 1 else 0.0
        assert abs(r["stddev_ns"] - std) <= 0.5 + 1e-6 * std


def test_nvtx_sum_matches_sql(store):
    db = corpus(SAXPY)
    ingest(store, [db], run="r")
    got = {r["name"]: r for r in analyze(store, "nvtx_sum", "r").frame.iter_rows(named=True)}
    rows = _q(
        db,
        """SELECT coalesce(n.text, s.value), count(*), sum(n.end - n.start), min(n.end - n.start),
                            max(n.end - n.start)
                     FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                     WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL GROUP BY 1""",
    )
    assert {r[0] for r in rows} == set(got) == {"MPI_Init", "MPI_Send", "MPI_Recv", "MPI_Finalize", "saxpy"}
    for name, n, total, lo, hi in rows:
        assert (got[name]["instances"], got[name]["total_ns"], got[name]["min_ns"], got[name]["max_ns"]) == (
            n,
            total,
            lo,
            hi,
        )
    # nsys's MPI tracing names the thread "MPI Rank 0": the rank comes from there.
    assert store.sql("SELECT rank FROM traces")["rank"].to_list() == [0]


def _add_nccl(src: Path, dst: Path, rank: int, delay_ns: int) -> None:
    """A copy of the saxpy export for ``rank`` with RANK in the environment, three NCCL all-reduce
    kernels (each overlapping the first half of a saxpy kernel; on a late rank starting ``delay_ns``
    later, ending at the same time), a step-named NVTX range around everything, and an NVTX range that never ends."""
    shutil.copy(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT)")
    con.execute(
        "INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENV', ?)",
        (f"PATH=/bin\nRANK={rank}\nWORLD_SIZE=2",),
    )
    con.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 39")  # the "MPI Rank 0" thread name
    name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    con.execute("INSERT INTO StringIds VALUES (900001, ?)", (name,))
    con.execute("INSERT INTO StringIds VALUES (900002, 'ncclDevKernel_AllReduce_Sum_f32_RING_LL')")
    con.execute("INSERT INTO StringIds VALUES (900003, 'cudaLaunchKernel_v7000')")
    kernels = con.execute(
        "SELECT start, end, deviceId, contextId, streamId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "ORDER BY start LIMIT 3"
    ).fetchall()
    gtid = con.execute("SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1").fetchone()[0]
    for i, (s, e, dev, ctx, _stream, gpid) in enumerate(kernels):
        start, end = s - (e - s) // 2, s + (e - s) // 2  # a late rank starts later, ends together
        start += delay_ns
        corr = 800000 + i
        con.execute(
            """INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId,
                         globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY,
                         blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId)
                       VALUES (?, ?, ?, ?, 99, ?, ?, 900001, 900002, 32, 2, 1, 1, 256, 1, 1, 0, 0, 0, 0, ?)""",
            (start, end, dev, ctx, corr, gpid, 900 + i),
        )
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
            "returnValue) VALUES (?, ?, 0, ?, ?, 900003, 0)",
            (start - 5000, start - 1000, gtid, corr),
        )
    lo, hi = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, 'ProfilerStep#7', ?)",
        (lo - 10_000_000, hi + 10_000_000, gtid),
    )
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, NULL, 59, 'unclosed', ?)",
        (hi, gtid),
    )
    con.commit()
    con.close()


def test_two_ranks_with_nccl_kernels_match_sql(store, tmp_path):
    src = corpus(SAXPY)
    run = tmp_path / "job"
    run.mkdir()
    for r in (0, 1):
        _add_nccl(src, run / f"report_{r}.sqlite", r, delay_ns=200_000 * r)
    res = ingest(store, [run], jobs=1)
    assert set(res.runs) == {"job"}
    tr = store.sql("SELECT rank, world_size, events_flagged FROM traces ORDER BY rank").rows()
    assert tr == [(0, 2, 1), (1, 2, 1)]  # rank from RANK, world from WORLD_SIZE; the open NVTX range flagged
    (flag, kind, dur) = store.sql(
        "SELECT flag, kind, dur_ns FROM events WHERE name = 'unclosed' AND rank = 0"
    ).row(0)
    assert (flag, kind, dur) == ("unmatched_begin", "instant", 0)
    # NCCL kernels are classed comm by the shared classifier and become matched collectives.
    coll = store.sql(
        "SELECT rank, op, step, instance_id, match_method FROM collectives ORDER BY rank, start_ns"
    ).rows()
    assert [c[1] for c in coll] == ["all_reduce"] * 6 and {c[2] for c in coll} == {7}
    assert {c[4] for c in coll} == {"ordinal"} and len({c[3] for c in coll}) == 3
    assert store.sql("SELECT step FROM steps WHERE rank = 1").rows() == [(7,)]
    for r in (0, 1):
        db = run / f"report_{r}.sqlite"
        comm_rows = "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE streamId = 99"
        compute_rows = "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE streamId <> 99"
        comm, compute = _union(db, comm_rows), _union(db, compute_rows)
        # comm ∩ compute = |comm| + |compute| - |comm ∪ compute|
        both = comm + compute - _union(db, f"{comm_rows} UNION ALL {compute_rows}")
        o = (
            analyze(
                store,
                "overlap",
                "job",
            )
            .frame.filter(rank=r)
            .row(0, named=True)
        )
        assert (o["comm_ns"], o["compute_ns"], o["overlap_ns"], o["exposed_comm_ns"]) == (
            comm,
            compute,
            both,
            comm - both,
        )
        assert o["overlap_pct"] == pytest.approx(100 * both / comm)
        k = analyze(store, "nccl_sum", "job").kernels.row(0, named=True)
        assert k["instances"] == 6
        (n, total) = _q(db, f"SELECT count(*), sum(end - start) FROM ({comm_rows})")[0]
        per = analyze(store, "nccl_sum", "job").ranks.filter(rank=r).row(0, named=True)
        assert (per["name"], per["instances"], per["total_ns"]) == ("all_reduce", n, total)
    s = analyze(store, "stragglers", "job")
    assert s.frame.filter(rank=1)["last_arrival_share"][0] == pytest.approx(1.0)


def test_sqlite_files_never_read_as_json(tmp_path):
    other = tmp_path / "notes.json"  # an SQLite file with a JSON name: still sniffed as SQLite
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    assert sources.claim(other).name == "nsys"
    with pytest.raises(NotATraceError, match="not an Nsight Systems export"):
        parse(other)
    junk = tmp_path / "x.bin"
    junk.write_bytes(b"\x00\x01")
    with pytest.raises(UsageError, match="it reads: .*Nsight Systems SQLite"):
        from traceprof.ingest.ingest import discover

        discover([junk])


def test_nsys_rep_without_nsys_says_how(tmp_path, monkeypatch):
    rep = tmp_path / "rank0.nsys-rep"
    rep.write_bytes(b"not really")
    monkeypatch.setenv("PATH", str(tmp_path))
    from traceprof.collectors.nsys.export import sqlite_for
    from traceprof.core.errors import TraceFormatError

    with pytest.raises(TraceFormatError, match="nsys export --type sqlite -o rank0.sqlite rank0.nsys-rep"):
        sqlite_for(rep)


def test_collect_nsys_needs_nsys_and_names_outputs_per_rank(tmp_path, monkeypatch):
    from traceprof.collectors.nsys.export import launch_nsys, profile_command

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match=r"^--nsys: nsys \(Nsight Systems CLI\) is not on PATH"):
        launch_nsys(["train.py"], tmp_path / "out", nproc=2)
    cmd = profile_command(["python", "train.py"], tmp_path)
    assert cmd[:2] == ["nsys", "profile"] and "--trace=cuda,nvtx,osrt" in cmd and "--export=sqlite" in cmd
    assert f"--output={tmp_path / 'rank%q{RANK}'}" in cmd and cmd[-2:] == ["python", "train.py"]


def test_cuda_graph_kernels_link_to_their_graph_launch(store, tmp_path):
    """Three graph kernels carry the correlation id of one cudaGraphLaunch (as CUPTI records them):
    all are kept and linked, latency is measured once, from the launch to the first kernel."""
    db = tmp_path / "graph_rank0.sqlite"
    shutil.copy(corpus(SAXPY), db)
    db.chmod(0o644)
    con = sqlite3.connect(db)
    con.execute("INSERT INTO StringIds VALUES (900010, 'cudaGraphLaunch_v10000')")
    s0, e0, dev, ctx, stream, gpid, name_id = con.execute(
        "SELECT start, end, deviceId, contextId, streamId, globalPid, demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "ORDER BY start DESC LIMIT 1"
    ).fetchone()
    gtid = con.execute("SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1").fetchone()[0]
    t0 = (
        e0 + 1_000_000
    )  # launch 1 ms after the last kernel; kernels start 20 us later, 10 us each, back to back
    con.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
        "returnValue) VALUES (?, ?, 0, ?, 700001, 900010, 0)",
        (t0, t0 + 5_000, gtid),
    )
    for i in range(3):
        start = t0 + 20_000 + 10_000 * i
        con.execute(
            """INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId,
                         globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY,
                         blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId,
                         graphNodeId) VALUES (?, ?, ?, ?, ?, 700001, ?, ?, ?, 32, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, ?, ?)""",
            (start, start + 10_000, dev, ctx, stream, gpid, name_id, name_id, 990 + i, 50 + i),
        )
    con.commit()
    con.close()
    ingest(store, [db], run="g")
    rows = store.sql("""SELECT launch_name, launch_ts_ns, first_of_launch FROM kernels WHERE correlation = 700001
                        ORDER BY ts_ns""").rows()
    (epoch,) = _q(db, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0]
    assert [(n, t) for n, t, _ in rows] == [("cudaGraphLaunch", epoch + t0)] * 3
    assert [f for _, _, f in rows] == [True, False, False]
    la = analyze(store, "launch", "g").frame.row(0, named=True)
    assert (la["graph_launches"], la["graph_kernels"], la["launches"]) == (
        1,
        3,
        6,
    )  # 5 saxpy launches + 1 graph
    assert la["latency_max_ns"] >= 20_000


_INT64_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("table", "set_", "reason"),
    [
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "end = NULL", "NULL end"),  # was a TypeError traceback
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "end = 'x'", "end not an integer"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "start = NULL", "NULL start"),  # was dropped uncounted
        (
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "end = 'x'",
            "end not an integer",
        ),  # text sorts above ints: was a negative dur
        ("CUPTI_ACTIVITY_KIND_KERNEL", "end = start - 1", "end before start"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "start = -5", "negative start"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", f"end = {_INT64_MAX}", "end beyond int64 on the epoch clock"),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "end = NULL", "NULL end"),  # was stored with a NULL duration
        ("NVTX_EVENTS", "start = 2.5", "start not an integer"),
        # ids that are not integers (a damaged export): the lane or the launch link would be wrong
        ("CUPTI_ACTIVITY_KIND_KERNEL", "correlationId = 'x'", "correlationId not an integer"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "deviceId = 'd'", "deviceId not an integer"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "streamId = 1.5", "streamId not an integer"),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId = 'x'", "correlationId not an integer"),
    ],
)
def test_rows_with_unusable_times_raise_or_are_counted(store, tmp_path, table, set_, reason):
    """Row 1 of one table gets a bad start/end: strict ingest names the file, table and row id; with
    skip, exactly that row is missing and counted under "<table>: <reason>"."""
    db = tmp_path / "rank0.sqlite"
    shutil.copy(corpus(SAXPY), db)
    db.chmod(0o644)
    where = (
        "rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71))"
        if table == "NVTX_EVENTS"
        else "rowid = 1"
    )
    con = sqlite3.connect(db)
    # The same table without its NOT NULL constraints (as a damaged or hand-made export has it).
    con.executescript(
        f"ALTER TABLE {table} RENAME TO old; CREATE TABLE {table} AS SELECT * FROM old; DROP TABLE old"
    )
    con.execute(f"UPDATE {table} SET {set_} WHERE {where}")
    con.commit()
    (rowid,) = con.execute(f"SELECT min(rowid) FROM {table} WHERE {where}").fetchone()
    con.close()
    with pytest.raises(TraceFormatError) as e:
        parse(db)
    assert f"{db.name}: {table} row id {rowid}: {reason} (" in str(e.value)
    assert "--skip-bad-events" in str(e.value)
    t = parse(db, ParseOptions(on_bad_event="skip"))
    assert t.rejected == {f"{table}: {reason}": 1}
    clean = parse(corpus(SAXPY))
    assert t.events.num_rows == clean.events.num_rows - 1
    dur = t.events.column("dur_ns").to_pylist()
    assert None not in dur and min(dur) >= 0
    assert max(t.events.column("ts_ns").to_pylist()) + max(dur) <= _INT64_MAX


def test_end_at_the_int64_limit_on_the_epoch_clock_is_kept_and_analyses_run(store, tmp_path):
    """end = int64 max - session start: epoch + end is exactly int64 max, the last accepted value
    (kept in raw_dur_ns; the kernel itself is clipped to the next one's start on its stream)."""
    db = tmp_path / "rank0.sqlite"
    shutil.copy(corpus(SAXPY), db)
    db.chmod(0o644)
    con = sqlite3.connect(db)
    (epoch,) = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = ? WHERE rowid = 1", (_INT64_MAX - epoch,))
    con.commit()
    con.close()
    ingest(store, [db], run="r")
    assert store.sql("SELECT max(ts_ns + raw_dur_ns) FROM events WHERE kind = 'kernel'").rows() == [
        (_INT64_MAX,)
    ]
    assert store.sql("SELECT count(*) FROM events WHERE flag = 'overrun'").rows() == [(1,)]
    for name in ("temporal", "overlap", "kernels", "kernel_sum", "idle", "launch"):
        analyze(store, name, "r")


def test_export_without_string_ids_names_the_missing_table(tmp_path):
    db = tmp_path / "rank0.sqlite"
    shutil.copy(corpus(SAXPY), db)
    db.chmod(0o644)
    con = sqlite3.connect(db)
    con.execute("DROP TABLE StringIds")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError) as e:
        parse(db)
    assert not isinstance(e.value, NotATraceError)
    assert str(e.value) == (
        f"{db}: StringIds: missing: the table of names (kernels, CUDA calls) that every "
        "export has; the export is incomplete: export the .nsys-rep again (nsys export "
        "--type sqlite)"
    )


def test_an_export_without_runtime_calls_names_its_process(tmp_path):
    """The corpus saxpy export with its CUPTI_ACTIVITY_KIND_RUNTIME rows deleted: the trace's pid
    was None (read from runtime calls only). Its 24 NVTX rows are process 1230493's (PROCESSES:
    ./saxpy-mpi-cuda; globalTid bits 24-47), so by hand its pid is '1230493', as the whole export's."""
    src = corpus("nsys/pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    whole = parse(src, ParseOptions())
    db = tmp_path / "nort.sqlite"
    shutil.copy(src, db)
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    pt = parse(db, ParseOptions())
    assert (whole.trace["pid"], pt.trace["pid"]) == ("1230493", "1230493")
