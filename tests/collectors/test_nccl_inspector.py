"""NCCL Inspector output (issue 28, kind 4): the shared case nccl_inspector_records, and files of the
kind written here in the plugin's shape (``ext-profiler/inspector``: one JSON record per line,
``header`` / ``metadata`` / ``coll_perf`` with ``event_trace_ts`` in epoch microseconds)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import analyze, case
from traceprof.collectors.nccl_inspector.parse import parse
from traceprof.core.errors import AnalysisError, TraceFormatError
from traceprof.core.parsed import ParseOptions
from traceprof.ingest import sources
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

CASE = "nccl_inspector_records"
T = 1_767_225_601_000_000  # epoch us


def test_shared_case_records_are_collectives(store):
    """EXPECT.md: communicator 0x7f3a96be51c2d1 (2 ranks), AllReduce coll_sn 1..3 of 67108864 bytes;
    kernel start = 1767225601000000 + 10000 sn us (+40 us on rank 1), exec 400 us on rank 0 and
    360 us on rank 1 (both end together). So: 3 instances of ranks [0, 1], arrival skew 40 us =
    40000 ns with rank 1 last; nccl_sum per rank: 3 instances, mean 400000 ns (rank 0) and 360000 ns
    (rank 1)."""
    folder = case(CASE) / "nccl-inspector-unknown-jobid"
    assert {sources.claim(f).name for f in folder.iterdir()} == {"nccl_inspector"}
    ingest(store, [folder], jobs=1)
    assert store.sql("SELECT rank, source, host, pid, world_size FROM traces ORDER BY rank").rows() == [
        (0, "nccl_inspector", "node-a", "3101", 2),
        (1, "nccl_inspector", "node-a", "3102", 2),
    ]
    assert store.sql("""SELECT DISTINCT rank, pg, op, bytes_in, bytes_out, group_size FROM collectives
                        ORDER BY rank""").rows() == [
        (r, "0x7f3a96be51c2d1", "all_reduce", 67108864, 67108864, 2) for r in (0, 1)
    ]
    # start/end from event_trace_ts: rank 0's sn 1 kernel 1767225601010000 .. 1767225601010400 us
    assert store.sql("SELECT seq, start_ns, end_ns FROM collectives WHERE rank = 0 ORDER BY seq").rows() == [
        (sn, (T + 10_000 * sn) * 1000, (T + 10_000 * sn + 400) * 1000) for sn in (1, 2, 3)
    ]
    inst = store.sql("""SELECT pg, seq, op, ranks_present, arrival_skew_ns, last_rank FROM collective_instances
                        ORDER BY seq""").rows()
    assert inst == [("0x7f3a96be51c2d1", sn, "all_reduce", [0, 1], 40_000, 1) for sn in (1, 2, 3)]
    ranks = analyze(store, "nccl_sum").ranks.sort("rank")
    assert ranks.select("rank", "instances", "avg_ns").rows() == [(0, 3, 400_000), (1, 3, 360_000)]
    # the reported bandwidths stay with each record (events.args): 67108864 B / 400 us = 167.77216 GB/s
    bw = store.sql("""SELECT rank, json_extract(args, '$.coll_perf.coll_algobw_gbs')::DOUBLE,
                             json_extract(args, '$.coll_perf.coll_busbw_gbs')::DOUBLE FROM events
                      WHERE kind = 'collective' GROUP BY ALL ORDER BY rank""").rows()
    assert bw == [(0, 167.77216, 167.77216), (1, 186.413511, 186.413511)]
    with pytest.raises(AnalysisError, match="NCCL Inspector records hold completed collectives only"):
        analyze(store, "desync")


def test_records_without_kernel_times_take_the_reported_exec_time(store, tmp_path):
    """g3 variant nccl_inspector_records/non_verbose_v41: the shared case's records without
    event_trace_sn / event_trace_ts (NCCL_INSPECTOR_DUMP_VERBOSE unset), v4.1. No start or end, so
    no arrival skew; but each record reports coll_exec_time_us (400 us on rank 0, 360 us on rank 1):
    nccl_sum per rank 3 instances, mean 400000 / 360000 ns, as the case (it listed no rank at all)."""
    d = tmp_path / "nccl-inspector-unknown-jobid"
    d.mkdir()
    for f in (case(CASE) / "nccl-inspector-unknown-jobid").iterdir():
        recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        for r in recs:
            r["metadata"]["inspector_output_format_version"] = "v4.1"
            del r["coll_perf"]["event_trace_sn"], r["coll_perf"]["event_trace_ts"]
        (d / f.name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    ingest(store, [d], jobs=1)
    inst = store.sql(
        "SELECT seq, ranks_present, arrival_skew_ns FROM collective_instances ORDER BY seq"
    ).rows()
    assert inst == [(sn, [0, 1], None) for sn in (1, 2, 3)]
    res = analyze(store, "nccl_sum")
    assert res.ranks.sort("rank").select("rank", "instances", "avg_ns", "total_ns").rows() == [
        (0, 3, 400_000, 1_200_000),
        (1, 3, 360_000, 1_080_000),
    ]
    assert any("6 NCCL Inspector records have no kernel times" in str(n) for n in res.notes)


def _rec(
    comm: str,
    rank: int,
    n: int,
    coll: str,
    sn: int,
    size: int,
    start_us: int | None,
    stop_us: int | None,
    *,
    version: str = "v4.0",
    channels: int = 2,
    pid: int = 100,
    verbose: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One Inspector record; channel c starts at ``start_us + c`` and stops at ``stop_us - c`` (the
    collective: earliest start, latest stop); ``stop_us`` 0 leaves channel 1's stop unset (0)."""
    perf: dict[str, Any] = {
        "coll": coll,
        "coll_sn": sn,
        "coll_msg_size_bytes": size,
        "coll_exec_time_us": 1,
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": 1.5,
        "coll_busbw_gbs": 0.75,
        **(extra or {}),
    }
    if verbose:
        kernels = [
            {
                "channel_id": c,
                "kernel_start_ts": start_us + c,
                "kernel_stop_ts": 0 if stop_us == 0 and c == 1 else (stop_us or 0) - c,
                "kernel_record_ts": stop_us,
            }
            for c in range(channels)
        ]
        perf["event_trace_ts"] = {
            "coll_start_ts": start_us - 5,
            "coll_stop_ts": start_us - 2,
            "kernel_events": kernels,
        }
    return {
        "header": {"id": comm, "rank": rank, "n_ranks": n, "nnodes": 1},
        "metadata": {
            "inspector_output_format_version": version,
            "git_rev": "",
            "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": T + 900_000,
            "hostname": f"h{pid}",
            "pid": pid,
        },
        "coll_perf" if coll not in ("Send", "Recv") else "p2p_perf": perf,
    }


def _write(path: Path, records: list[Any], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records) + tail)
    return path


def _process(r: int) -> list[Any]:
    """Process of rank r in world communicator 0xaa (2 ranks): AllGather sn 1 (1024 B per rank),
    ReduceScatter sn 1 (512 B per rank), AllGather sn 2, rank 1 arriving 30, 10 and 30 us after
    rank 0; plus its own 1-rank communicator 0xb<r> (rank 0 there), with one record written without
    event_trace_ts; and a v4.1 dump_stats record counting 2 dropped records (process 0 only)."""
    pid = 100 + r
    out: list[Any] = [
        _rec("0xaa", r, 2, "AllGather", 1, 1024, T + 30 * r, T + 100, pid=pid),
        _rec(
            "0xaa",
            r,
            2,
            "ReduceScatter",
            1,
            512,
            T + 200 + 10 * r,
            T + 300,
            pid=pid,
            version="v4.2",
            extra={"coll_algo": "RING", "coll_proto": "LL"},
        ),
        _rec("0xaa", r, 2, "AllGather", 2, 1024, T + 400 + 30 * r, T + 500, pid=pid),
        _rec(f"0xb{r}", 0, 1, "AllReduce", 7, 64, 0, 0, pid=pid, verbose=False),
    ]
    if r == 0:
        out.append(
            {
                "header": {"id": "0xaa", "rank": 0, "n_ranks": 2, "nnodes": 1},
                "metadata": {
                    "inspector_output_format_version": "v4.1",
                    "dump_timestamp_us": T + 900_000,
                    "hostname": "h100",
                    "pid": 100,
                },
                "dump_stats": {"num_dropped_coll_records": 2, "num_dropped_p2p_records": 0},
            }
        )
    return out


def test_records_of_several_ops_and_communicators(tmp_path):
    """coll_sn counts per op: AllGather sn 1 and ReduceScatter sn 1 are two instances (3 in all on
    0xaa, each of ranks [0, 1]; skews 30000, 10000, 30000 ns), never one. Bytes as nccl-tests
    counts them: AllGather in 1024 / out 2 x 1024, ReduceScatter in 2 x 512 / out 512. Channel c
    runs start + c .. stop - c us: start = the earliest (start), end = the latest (stop). Process 1
    is rank 1 in 0xaa and rank 0 in 0xb1: the largest communicator (0xaa) gives its rank, with a
    warning."""
    run = tmp_path / "nccl-inspector-4242"
    for r in (0, 1):
        _write(run / f"h{100 + r}-pid{100 + r}.log", _process(r))
    with Store(tmp_path / "s.duckdb") as store:
        res = ingest(store, [run], jobs=1)
        assert store.sql("SELECT rank, host, world_size, format FROM traces ORDER BY rank").rows() == [
            (0, "h100", 2, "nccl-inspector-v4.0"),
            (1, "h101", 2, "nccl-inspector-v4.0"),
        ]
        inst = store.sql("""SELECT op, seq, ranks_present, arrival_skew_ns, last_rank, match_method
                            FROM collective_instances WHERE pg = '0xaa' ORDER BY first_arrival_ns""").rows()
        assert inst == [
            ("all_gather", 1, [0, 1], 30_000, 1, "comms_id"),
            ("reduce_scatter", 1, [0, 1], 10_000, 1, "comms_id"),
            ("all_gather", 2, [0, 1], 30_000, 1, "comms_id"),
        ]
        rows = store.sql("""SELECT op, seq, bytes_in, bytes_out, start_ns, end_ns FROM collectives
                            WHERE rank = 0 AND pg = '0xaa' ORDER BY start_ns""").rows()
        assert rows == [
            ("all_gather", 1, 1024, 2048, T * 1000, (T + 100) * 1000),
            ("reduce_scatter", 1, 1024, 512, (T + 200) * 1000, (T + 300) * 1000),
            ("all_gather", 2, 1024, 2048, (T + 400) * 1000, (T + 500) * 1000),
        ]
        # the record without event_trace_ts: a collective without times, its event an instant at the dump time
        assert store.sql("""SELECT c.start_ns, c.end_ns, e.kind, e.ts_ns FROM collectives c JOIN events e
                            ON e.rank = c.rank AND e.name = 'AllReduce' WHERE c.rank = 0 AND c.op = 'all_reduce'
                            """).rows() == [(None, None, "instant", (T + 900_000) * 1000)]
        assert (
            store.sql("SELECT DISTINCT skipped FROM traces WHERE rank = 0").item()
            == '{"dump_stats record":1}'
        )
    assert (
        "h101-pid101.log: the process has ranks [0, 1] in its 2 communicators; rank 1 of communicator 0xaa "
        "(2 ranks, the largest) taken as its rank"
    ) in res.warnings
    assert (
        "h100-pid100.log: 1 record(s) without event_trace_ts (written with NCCL_INSPECTOR_DUMP_VERBOSE=0): exec "
        "time and bandwidth kept in events.args, but no start or end, so stragglers cannot time them (nccl_sum "
        "takes coll_exec_time_us); record with NCCL_INSPECTOR_DUMP_VERBOSE=1"
    ) in res.warnings
    assert (
        "h100-pid100.log: the Inspector dropped 2 record(s) (dump_stats: its ring buffer filled before the dump "
        "thread wrote it); those collectives are missing here"
    ) in res.warnings


def test_kernel_time_never_set(tmp_path):
    """Channel 1's kernel_stop_ts is 0 (never set): the collective's end is unknown (NULL, not the
    other channel's stop), its event flagged zero_ts with duration 0."""
    f = _write(tmp_path / "h-pid1.log", [_rec("0xaa", 0, 1, "AllReduce", 1, 8, T, 0)])
    pt = parse(f)
    (row,) = pt.collectives.to_pylist()
    (ev,) = pt.events.to_pylist()
    assert (row["start_ns"], row["end_ns"], ev["flag"], ev["dur_ns"]) == (T * 1000, None, "zero_ts", 0)
    assert pt.flagged == {"zero_ts": 1}


@pytest.mark.parametrize("kernels", [[], None])
def test_verbose_record_without_kernel_events(tmp_path, kernels):
    """A verbose record (event_trace_ts present, coll_start_ts T - 5 us) whose kernel_events is empty or
    absent (kernel times never recorded): start and end unknown (NULL), enter (T - 5) us kept, the
    event flagged zero_ts (not an unflagged 0 ns collective) and said in a warning naming the file.
    Before: an unflagged 0 ns collective event and no warning."""
    rec = _rec("0xaa", 0, 1, "AllReduce", 1, 8, T, T + 100)
    ts = rec["coll_perf"]["event_trace_ts"]
    if kernels is None:
        del ts["kernel_events"]
    else:
        ts["kernel_events"] = kernels
    pt = parse(_write(tmp_path / "h-pid1.log", [rec]))
    (row,) = pt.collectives.to_pylist()
    (ev,) = pt.events.to_pylist()
    assert (row["enter_ns"], row["start_ns"], row["end_ns"]) == ((T - 5) * 1000, None, None)
    assert (ev["flag"], ev["dur_ns"]) == ("zero_ts", 0)
    assert pt.flagged == {"zero_ts": 1}
    assert any(
        w.startswith("h-pid1.log: 1 record(s) with event_trace_ts but no kernel times") for w in pt.warnings
    )


@pytest.mark.parametrize("version", ["v5.0", "v3.1", "4", None])
def test_version_not_read_is_named(tmp_path, version):
    """Only v4.x is read; another version (or none) is refused naming the version and the line."""
    recs = [
        _rec("0xaa", 0, 1, "AllReduce", 1, 8, T, T + 10),
        _rec("0xaa", 0, 1, "AllReduce", 2, 8, T + 20, T + 30),
    ]
    if version is None:
        del recs[1]["metadata"]["inspector_output_format_version"]
    else:
        recs[1]["metadata"]["inspector_output_format_version"] = version
    f = _write(tmp_path / "h-pid1.log", recs)
    with pytest.raises(TraceFormatError) as e:
        parse(f, ParseOptions(on_bad_event="skip"))
    assert str(e.value) == (
        f"{f}: line 2: NCCL Inspector output version {version!r}, which traceprof does not read: "
        "it reads versions v4.0 to v4.x (NCCL 2.28.3+)"
    )


def _set(rec: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """``rec`` with the field at ``path`` (keys and list indices) set to ``value``."""
    at: Any = rec
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    return rec


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("{not json", "not JSON"),
        # a time written as a string or a float is no integer (a string was read silently): the
        # same rule as Flight Recorder's times
        (
            json.dumps(
                _set(
                    _rec("0xaa", 0, 1, "AllReduce", 3, 8, T, T + 10),
                    ("coll_perf", "event_trace_ts", "kernel_events", 0, "kernel_start_ts"),
                    str(T),
                )
            ),
            "'kernel_events[].kernel_start_ts' not a non-negative integer",
        ),
        (
            json.dumps(
                _set(
                    _rec("0xaa", 0, 1, "AllReduce", 3, 8, T, T + 10),
                    ("metadata", "dump_timestamp_us"),
                    float(T + 900_000),
                )
            ),
            "'metadata.dump_timestamp_us' not a non-negative integer",
        ),
        # coll_sn and the message size are a record's numbers too (traceprof.core.values.record_int):
        # "3" and 8.0 were read as 3 and 8 silently, while the times beside them were refused
        (
            json.dumps(_set(_rec("0xaa", 0, 1, "AllReduce", 3, 8, T, T + 10), ("coll_perf", "coll_sn"), "3")),
            "'coll_perf.coll_sn' not a non-negative integer",
        ),
        (
            json.dumps(
                _set(
                    _rec("0xaa", 0, 1, "AllReduce", 3, 8, T, T + 10),
                    ("coll_perf", "coll_msg_size_bytes"),
                    8.0,
                )
            ),
            "'coll_perf.coll_msg_size_bytes' not a non-negative integer",
        ),
        (
            '{"header": {"id": "0xaa"}, "metadata": {}}',
            "not an NCCL Inspector record (no 'header', 'metadata' and 'coll_perf' / 'p2p_perf')",
        ),
        (
            json.dumps(_rec("0xaa", 0, 1, "AllReduce", -3, 8, T, T + 10)),
            "'coll_perf.coll_sn' not a non-negative integer",
        ),
        (
            json.dumps(_rec("0xaa", 5, 2, "AllReduce", 3, 8, T, T + 10)),
            "'header.rank' not below 'header.n_ranks'",
        ),
        (
            json.dumps(_rec("0xaa", 0, 1, "AllReduce", 3, 8, T + 50, T + 10)),
            "kernel stop before kernel start",
        ),
        (
            json.dumps(_rec("0xaa", 0, 1, "AllReduce", 3, 8, T, T + 10, extra={"coll_busbw_gbs": -1.0})),
            "'coll_perf.coll_busbw_gbs' not a non-negative number",
        ),
        (
            json.dumps(_rec("0xaa", 0, 1, "AllReduce", 3, 8, T, T + 10, extra={"coll_algobw_gbs": "fast"})),
            "'coll_perf.coll_algobw_gbs' not a non-negative number",
        ),
    ],
)
def test_bad_record_names_file_and_line_or_is_skipped(tmp_path, bad, reason):
    """A bad record on line 2 of 3: an error naming the file and line 2; with --skip-bad-events the
    two good records are stored and the bad one counted by reason."""
    good = [_rec("0xaa", 0, 1, "AllReduce", sn, 8, T + 20 * sn, T + 20 * sn + 10) for sn in (1, 2)]
    f = _write(tmp_path / "h-pid1.log", [good[0], bad, good[1]])
    with pytest.raises(TraceFormatError) as e:
        parse(f)
    assert str(e.value).startswith(f"{f}: line 2: {reason}")
    assert str(e.value).endswith("; pass --skip-bad-events to skip such records")
    pt = parse(f, ParseOptions(on_bad_event="skip"))
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1, 2]
    assert pt.rejected == {reason: 1} and pt.events_read == 3


def test_cut_short_last_line_and_gzip(tmp_path):
    """The process died while writing: the last line is half a record (no newline). It is dropped
    with a warning and counted; the same file gzipped reads the same."""
    whole = json.dumps(_rec("0xaa", 0, 1, "AllReduce", 2, 8, T + 20, T + 30))
    f = _write(tmp_path / "h-pid1.log", [_rec("0xaa", 0, 1, "AllReduce", 1, 8, T, T + 10)], tail=whole[:70])
    pt = parse(f)
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1]
    assert pt.rejected == {"last record cut short": 1}
    assert pt.warnings == [
        "h-pid1.log: the last record (line 2) is cut short (the process died while writing?): dropped"
    ]
    gz = tmp_path / "h-pid2.log.gz"
    gz.write_bytes(gzip.compress(f.read_bytes()))
    assert sources.claim(gz).name == "nccl_inspector"
    assert parse(gz).collectives.to_pylist() == pt.collectives.to_pylist()


@pytest.mark.parametrize("name", ["h-pid1.log", "h-pid1.jsonl", "records.json"])
def test_claimed_by_content_whatever_the_name(tmp_path, name):
    f = _write(tmp_path / name, [_rec("0xaa", 0, 1, "AllReduce", 1, 8, T, T + 10)])
    assert sources.claim(f).name == "nccl_inspector"


def test_p2p_records_are_unmatched_point_to_point_rows(tmp_path):
    """A ``p2p_perf`` record (Send of 4096 bytes to peer 1): a point-to-point row of pg 0xaa:p2p,
    no sequence number (p2p_sn does not pair a send with its recv), 100 us long."""
    rec = _rec("0xaa", 0, 2, "AllReduce", 1, 8, T, T + 10)
    perf = rec.pop("coll_perf")
    rec["p2p_perf"] = {
        "p2p": "Send",
        "p2p_peer": 1,
        "p2p_sn": 4,
        "p2p_msg_size_bytes": 4096,
        "p2p_exec_time_us": 100,
        "event_trace_ts": {
            **perf["event_trace_ts"],
            "kernel_events": [
                {
                    "channel_id": 0,
                    "kernel_start_ts": T,
                    "kernel_stop_ts": T + 100,
                    "kernel_record_ts": T + 100,
                }
            ],
        },
    }
    pt = parse(_write(tmp_path / "h-pid1.log", [_rec("0xaa", 0, 2, "AllReduce", 1, 8, T, T + 10), rec]))
    p2p = [r for r in pt.collectives.to_pylist() if r["p2p"]]
    assert [
        (r["pg"], r["seq"], r["op"], r["bytes_in"], r["end_ns"] - r["start_ns"], r["comms_id"]) for r in p2p
    ] == [("0xaa:p2p", None, "send", 4096, 100_000, None)]


def test_records_printed_over_several_lines(tmp_path):
    """Records as the plugin's README prints them (indented, one object over many lines) read as the
    same collectives; a broken object is an error naming its first line (the records after it cannot
    be found), a last object cut short is dropped with a warning."""
    recs = [_rec("0xaa", 0, 1, "AllReduce", sn, 8, T + 20 * sn, T + 20 * sn + 10) for sn in (1, 2, 3)]
    flat = parse(_write(tmp_path / "flat" / "h-pid1.log", recs))
    text = "\n".join(json.dumps(r, indent=2) for r in recs) + "\n"
    pretty = tmp_path / "pretty" / "h-pid1.log"
    pretty.parent.mkdir()
    pretty.write_text(text)
    assert sources.claim(pretty).name == "nccl_inspector"
    assert parse(pretty).collectives.to_pylist() == flat.collectives.to_pylist()
    per = text.count("\n") // 3  # lines per record; record 2 starts on line per + 1
    pretty.write_text(text.replace('"coll_sn": 2', '"coll_sn": 2 2'))
    with pytest.raises(
        TraceFormatError, match=rf"h-pid1.log: line {per + 1}: not JSON .*the records after it "
    ):
        parse(pretty)
    pretty.write_text(text[: len(text) - 40])
    pt = parse(pretty)
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1, 2] and pt.rejected == {
        "last record cut short": 1
    }


def test_reported_bandwidth_beside_the_computed_one(store):
    """Shared case nccl_inspector_records (EXPECT.md): 67108864 bytes; rank 0's kernel runs 400 us,
    rank 1's 360 us (it starts 40 us later; both end together). The Inspector divides by each rank's
    own time: algbw 67108864 / 400 us = 167.77216 GB/s (rank 0), / 360 us = 186.413511 (rank 1);
    busbw = algbw x 2(n-1)/n = algbw for n = 2. collective_perf computes from the transfer, end -
    last arrival = 360 us on both ranks: 186.41351 GB/s each (rank 0's 40 us of waiting left out).
    nccl_sum's bandwidth row (6 calls) shows both: the reported medians are the mean of the middle
    two, (167.77216 + 186.413511) / 2 = 177.0928355."""
    ingest(store, [case(CASE) / "nccl-inspector-unknown-jobid"], jobs=1)
    rows = store.sql("""SELECT rank, transfer_ns, algbw_gbps, busbw_gbps, reported_algbw_gbps, reported_busbw_gbps
                        FROM collective_perf ORDER BY rank, seq""").rows()
    computed = 67108864 / 360_000
    assert (
        rows
        == [(0, 360_000, pytest.approx(computed), pytest.approx(computed), 167.77216, 167.77216)] * 3
        + [(1, 360_000, pytest.approx(computed), pytest.approx(computed), 186.413511, 186.413511)] * 3
    )
    bw = analyze(store, "nccl_sum").bandwidth.row(0, named=True)
    assert (bw["source"], bw["op"], bw["calls"]) == ("nccl_inspector", "all_reduce", 6)
    assert bw["reported_algbw_gbps"] == bw["reported_busbw_gbps"] == pytest.approx(177.0928355)
    assert bw["busbw_gbps"] == pytest.approx(computed)
    head = next(
        n for n in analyze(store, "nccl_sum").notes if n.startswith("all_reduce, 64 MiB-128 MiB messages")
    )
    assert head.endswith(
        "; the source reports busbw 177 GB/s (median; its own time, which may include waiting for peers)"
    )


def test_reported_bandwidth_without_kernel_times_and_other_sources(tmp_path):
    """A record written without event_trace_ts has no transfer time, so no computed bandwidth: its
    reported figures (1.5 and 0.75 GB/s, _rec's) alone make its bandwidth row. Another source's rows
    (the NCCL plugin case) have NULL reported columns."""
    recs = [_rec("0xc", r, 2, "AllReduce", 1, 4096, 0, 0, verbose=False, pid=r) for r in (0, 1)]
    for r in (0, 1):
        _write(tmp_path / "nccl-inspector-1" / f"h-pid{r}.log", [recs[r]])
    with Store(tmp_path / "s.duckdb") as store:
        ingest(store, [tmp_path / "nccl-inspector-1"], jobs=1)
        assert (
            store.sql(
                "SELECT algbw_gbps, reported_algbw_gbps, reported_busbw_gbps FROM collective_perf"
            ).rows()
            == [(None, 1.5, 0.75)] * 2
        )
        bw = analyze(store, "nccl_sum").bandwidth.row(0, named=True)
        assert (bw["calls"], bw["busbw_gbps"], bw["reported_algbw_gbps"], bw["reported_busbw_gbps"]) == (
            2,
            None,
            1.5,
            0.75,
        )
        assert any(
            n.endswith(
                "(most transfer time, 2 calls): the source reports busbw 0.75 GB/s (median; its own "
                "time, which may include waiting for peers)"
            )
            for n in analyze(store, "nccl_sum").notes
        )
    with Store(tmp_path / "p.duckdb") as store:
        ingest(store, [case("nccl_plugin_zero_timestamps") / "quoted"], jobs=1)
        got = store.sql(
            "SELECT count(*), count(reported_algbw_gbps), count(reported_busbw_gbps) FROM collective_perf"
        )
        assert got.row(0) == (6, 0, 0)


def test_header_rank_written_as_text_is_said_and_counted(store, tmp_path):
    # header.rank "1" and n_ranks "2" were read as 1 and 2 without a word; the one rule of
    # traceprof.core.values.identity_int: read as the integer, said and counted per record.
    recs = [_rec("0xaa", 1, 2, "AllReduce", sn, 8, T + 10 * sn, T + 10 * sn + 5) for sn in (1, 2)]
    recs[0]["header"].update(rank="1", n_ranks="2")
    f = _write(tmp_path / "h-pid1.log", recs)
    pt = parse(f)
    assert (pt.rank, pt.world_size) == (1, 2)
    assert "h-pid1.log: 1 record(s) with header.rank a string: read as its integer" in pt.warnings
    assert "h-pid1.log: 1 record(s) with header.n_ranks a string: read as its integer" in pt.warnings
    ingest(store, [f], run="i")
    assert store.runs()["issues"].to_list() == [
        "1 repaired: header.rank a string: read as its integer; "
        "1 repaired: header.n_ranks a string: read as its integer"
    ]


def test_a_record_written_twice_is_kept_once_and_counted(tmp_path):
    # AllGather sn 1 written twice (every field equal: line 2 copies line 1), then the same
    # collective dumped again at a later dump time (line 3: a re-dump, no copy), then sn 2. Kept:
    # lines 1, 3 and 4; the copy is said and counted in traces.meta.repaired. Before: 4 rows.
    first = _rec("0xaa", 0, 2, "AllGather", 1, 1024, T, T + 100)
    later = json.loads(json.dumps(first))
    later["metadata"]["dump_timestamp_us"] = T + 1_900_000
    path = _write(
        tmp_path / "h100-pid100.log",
        [first, first, later, _rec("0xaa", 0, 2, "AllGather", 2, 1024, T + 400, T + 500)],
    )
    pt = parse(path)
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1, 1, 2]
    assert json.loads(pt.trace["meta"])["repaired"] == {"exact duplicate record dropped": 1}
    assert "h100-pid100.log: 1 duplicate record dropped (first: line 2)" in pt.warnings


def _mesh(tmp_path: Path, tp1: str = "0xa1") -> Path:
    """A 2x2 mesh with no world communicator (as /work/g3_inputs' mesh_2x2_no_world_comm): pids
    4000..4003, tp 0xa0 = {4000: rank 0, 4001: 1}, tp ``tp1`` = {4002: 0, 4003: 1}, dp 0xb0 =
    {4000: 0, 4002: 1}, dp 0xb1 = {4001: 0, 4003: 1}; every communicator of 2 ranks. tp AllReduce
    sn 1, 2 (8 MiB): comm rank 0 starts T + 1000 k, rank 1 10 us later, both stop T + 1000 k + 300;
    dp AllReduce sn 1 (32 MiB): comm rank 0 at T + 5000, rank 1 20 us later, stop T + 5600."""
    where = {4000: (("0xa0", 0), ("0xb0", 0)), 4001: (("0xa0", 1), ("0xb1", 0))}
    where |= {4002: ((tp1, 0), ("0xb0", 1)), 4003: ((tp1, 1), ("0xb1", 1))}
    folder = tmp_path / "nccl-inspector-7001"
    for pid, ((tp, tr), (dp, dr)) in where.items():
        recs = [
            _rec(tp, tr, 2, "AllReduce", k, 8 << 20, T + 1000 * k + 10 * tr, T + 1000 * k + 300, pid=pid)
            for k in (1, 2)
        ]
        recs.append(_rec(dp, dr, 2, "AllReduce", 1, 32 << 20, T + 5000 + 20 * dr, T + 5600, pid=pid))
        _write(folder / f"h{pid}-pid{pid}.log", recs)
    return folder


def test_mesh_without_a_world_communicator_is_one_job(tmp_path):
    """Each file's header.rank is its rank within a 2-rank communicator, so two files say rank 0 (on
    4eb6579 refused: "two traces of one rank are two jobs"). The four processes share communicators
    (0xa0 joins 4000 and 4001, 0xb0 4000 and 4002, 0xb1 4001 and 4003): one job of 4 ranks, numbered
    in (host, pid) order with a note, since no record holds a global rank; 6 instances of 2 ranks:
    0xa0 sn 1, 2 of [0, 1]; 0xa1 of [2, 3]; 0xb0 of [0, 2]; 0xb1 of [1, 3]; skew 10 us (tp), 20 us (dp)."""
    folder = _mesh(tmp_path)
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [folder], jobs=1)
        assert list(res.runs) == ["nccl-inspector-7001"]
        assert store.sql("SELECT pid, rank, world_size FROM traces ORDER BY pid").rows() == [
            ("4000", 0, 4),
            ("4001", 1, 4),
            ("4002", 2, 4),
            ("4003", 3, 4),
        ]
        inst = store.sql("""SELECT pg, seq, list(rank ORDER BY rank), max(enter_ns) - min(enter_ns)
                            FROM collectives GROUP BY pg, seq ORDER BY pg, seq""").rows()
        assert inst == [
            ("0xa0", 1, [0, 1], 10_000),
            ("0xa0", 2, [0, 1], 10_000),
            ("0xa1", 1, [2, 3], 10_000),
            ("0xa1", 2, [2, 3], 10_000),
            ("0xb0", 1, [0, 2], 20_000),
            ("0xb1", 1, [1, 3], 20_000),
        ]
        assert store.sql("SELECT count(*) FROM collective_instances").item() == 6
        assert any("numbered 0..3" in w for w in res.warnings)
        assert not any("two jobs" in w or "the process has ranks" in w for w in res.warnings)


def test_mesh_whose_records_conflict_is_refused_saying_what(tmp_path):
    """Pids 4002 and 4003 say they are ranks 0 and 1 of 0xa0, which 4000 and 4001 already are: one
    rank of a communicator cannot be two processes, so the files are refused naming the conflict
    (not "two traces of one rank are two jobs")."""
    folder = _mesh(tmp_path, tp1="0xa0")
    with Store(tmp_path / "t.duckdb") as store:
        with pytest.raises(
            TraceFormatError,
            match=r"rank 0 of communicator 0xa0 is both h4000-pid4000.log and h4002-pid4002.log",
        ):
            ingest(store, [folder], jobs=1)
        with pytest.raises(TraceFormatError, match="rank 0 of communicator 0xa0 is both"):
            ingest(store, [folder], run="one", jobs=1)
        assert store.sql("SELECT count(*) FROM runs").item() == 0


def _v14(tmp_path: Path, rank0_enter: bool = True) -> Path:
    """g9 v14's run (the tests below): communicator W, 2 ranks, AllReduce sn 1..3 at T, T + 10 ms,
    T + 20 ms, rank 1's kernels 40 us after rank 0's, each ending at T + 10 ms (sn - 1) + 400 us;
    rank 1's sn 2 record without kernel times; ``rank0_enter`` False: rank 0's sn 2 record without
    coll_start_ts too."""
    run = tmp_path / "nccl-inspector-unknown-jobid"
    for r in (0, 1):
        recs = [
            _rec(
                "W",
                r,
                2,
                "AllReduce",
                sn,
                8,
                T + 10_000 * (sn - 1) + 40 * r,
                T + 10_000 * (sn - 1) + 400,
                pid=r,
            )
            for sn in (1, 2, 3)
        ]
        if r == 1:
            recs[1]["coll_perf"]["event_trace_ts"]["kernel_events"] = []
        elif not rank0_enter:
            del recs[1]["coll_perf"]["event_trace_ts"]["coll_start_ts"]
        _write(run / f"node-a-pid420{r}.log", recs)
    return run


def test_stragglers_pace_and_time_covered_count_only_instances_with_known_arrivals(tmp_path):
    """t10 insp2: communicator W, 2 ranks, AllReduce sn 1..3 at T, T + 10 ms, T + 20 ms, rank 1's
    kernels 40 us after rank 0's, every collective ends at its start + 400 us; for sn 2 rank 1's
    record has no kernel times and rank 0's no coll_start_ts: no clock common to the two, so sn 2's
    arrivals are unknown and stragglers reads sn 1 and 3. By hand: rank 0's arrivals T and T + 20 ms
    are 2 collectives apart, pace 20 / 2 = 10 ms (it was 20 ms, the gap over sn 2 counted as one);
    time covered (no steps) = max(span from the first arrival to the last end, 20.4 ms; 2
    instances x the pace, 20 ms) = 20.4 ms (it was 2 x 20 = 40 ms). Rank 1's hold-up 2 x 40 us =
    80 us = 80 / 20,400 = 0.39 % of it (was 0.2 %); its median lateness 40 us = 0.4 % of the pace."""
    run = _v14(tmp_path, rank0_enter=False)
    with Store(tmp_path / "s.duckdb") as store:
        ingest(store, [run], jobs=1)
        assert store.sql("SELECT seq, arrival_skew_ns FROM collective_instances ORDER BY seq").rows() == [
            (1, 40_000),
            (2, None),
            (3, 40_000),
        ]
        res = analyze(store, "stragglers")
        (head,) = [n for n in res.notes if n.startswith("source nccl_inspector")]
        assert "pace 10.00 ms" in head and "time covered 20.4 ms" in head
        one = res.frame.filter(pl.col("rank") == 1).row(0, named=True)
        assert one["holdup_ns"] == 80_000
        assert one["holdup_pct"] == pytest.approx(100 * 80 / 20_400)
        assert one["late_pct"] == pytest.approx(100 * 40 / 10_000)


def test_one_arrival_clock_per_instance_when_a_record_lacks_kernel_times(tmp_path):
    """g9 v14: communicator W, 2 ranks, AllReduce sn 1..3 at T, T + 10 ms, T + 20 ms; rank 1's kernels
    start 40 us after rank 0's, coll_start_ts (enter) 5 us before each kernel start; rank 1's sn 2
    record has kernel_events [] (start unknown). Hand values: sn 1 and 3 compare kernel starts
    (40 - 0 = 40 us); sn 2 compares both ranks' enqueues ((40 - 5) - (0 - 5) = 40 us): skew 40,000 ns
    each, rank 0's wait 3 x 40,000 = 120,000 ns, rank 0's sn 2 arrival T + 10 ms - 5 us (its enqueue).
    Before: sn 2 set rank 0's kernel start against rank 1's enqueue: skew 35,000, wait 115,000."""
    run = _v14(tmp_path)
    with Store(tmp_path / "s.duckdb") as store:
        ingest(store, [run], jobs=1)
        assert store.sql(
            "SELECT seq, arrival_skew_ns, last_rank FROM collective_instances ORDER BY seq"
        ).rows() == [(1, 40_000, 1), (2, 40_000, 1), (3, 40_000, 1)]
        assert store.sql(
            "SELECT arrival_ns, wait_ns FROM collective_perf WHERE rank = 0 AND seq = 2"
        ).rows() == [((T + 10_000 - 5) * 1000, 40_000)]
        res = analyze(store, "stragglers")
        assert res.frame.filter(pl.col("rank") == 0)["wait_ns"].to_list() == [120_000]
        assert (
            "arrival clock: nccl_inspector: 1 of 3 instances compare every rank's CPU enqueue time (a rank's "
            "record lacks the kernel start; one clock per instance, else the gap between the two would count "
            "as skew)"
        ) in res.notes


def test_the_pid_comes_from_the_records_else_the_file_name(tmp_path):
    """The Inspector writes ``<hostname>-pid<pid>.log`` and ``metadata.pid`` in each record. By
    hand: records of pid 100 -> the trace's pid '100'; the same records without ``metadata.pid`` in
    ``h-pid4242.log`` -> '4242' (was None); and in a file named otherwise -> None."""
    recs = [_rec("0xaa", 0, 1, "AllGather", 1, 1024, T, T + 100, pid=100)]
    pt = parse(_write(tmp_path / "a" / "h-pid4242.log", recs), ParseOptions())
    assert pt.trace["pid"] == "100"
    for rec in recs:
        del rec["metadata"]["pid"]
    pt = parse(_write(tmp_path / "b" / "h-pid4242.log", recs), ParseOptions())
    assert pt.trace["pid"] == "4242"
    pt = parse(_write(tmp_path / "c" / "inspector.log", recs), ParseOptions())
    assert pt.trace["pid"] is None
