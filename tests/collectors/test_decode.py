"""The columnar Kineto decoder (``traceprof.collectors.kineto.decode``) against a plain JSON reference.

The reference decodes the document with the standard library (numbers as ``Decimal``, so times are
exact) and converts each field as the general per-event parser does. Documents: hand-made ones
for every case the splitter and the typed decode must handle (keys after the events, an ``INFO``
array whose strings hold ``]``, ``},`` inside a name, nested args, string/float pids, hex stream
ids, null args, missing times, more than 3 decimals, exponents), all split into tiny batches; and
the corpus and sample traces.
"""

from __future__ import annotations

import gzip
import importlib
import json
from decimal import Decimal
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from tests.builders import micro_trace
from tests.conftest import CORPUS, SAMPLES
from traceprof.collectors.kineto._values import int_or_none
from traceprof.collectors.kineto.decode import decode
from traceprof.core.errors import TraceFormatError
from traceprof.core.parsed import ParseOptions
from traceprof.core.timeconv import us_to_ns
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


def _ref_ns(v: object) -> int | None:
    return None if v is None else us_to_ns(v if isinstance(v, Decimal | int) else Decimal(str(v)))


def _check(data: bytes, batch_bytes: int) -> None:
    d = decode(data, batch_bytes=batch_bytes)
    assert d is not None
    doc = json.loads(data, parse_float=Decimal)
    events = doc.pop("traceEvents")
    plain = json.loads(data)["traceEvents"]  # numbers as the general decoder gives them (floats)
    assert len(d) == len(events)
    assert {len(c) for c in (d.ts_ns, d.ts_ok, d.dur_ns, d.dur_ok, d.args, d.correlation)} == {len(events)}
    assert set(d.top) == set(doc)
    texts = d.args.to_pylist()
    for i, e in enumerate(events):
        args = plain[i].get("args", {})
        ids = args if isinstance(args, dict) else {}
        assert (d.ph[i], d.cat[i], d.name[i]) == (e.get("ph", ""), e.get("cat", ""), e.get("name", "")), i
        assert (d.pid[i], d.tid[i]) == tuple(
            "" if e.get(k) is None else str(e.get(k)) for k in ("pid", "tid")
        ), i
        for col, ok, key in ((d.ts_ns, d.ts_ok, "ts"), (d.dur_ns, d.dur_ok, "dur")):
            assert bool(ok[i]) == (key in e), (i, key)
            if key in e:
                assert int(col[i]) == _ref_ns(e[key]), (i, key, e[key])
        assert json.loads(texts[i], parse_float=Decimal) == e.get("args", {}), i
        assert d.correlation[i] == int_or_none(ids.get("correlation")), i
        assert d.external_id[i] == int_or_none(ids.get("External id")), i
        assert d.device[i] == int_or_none(ids.get("device")), i
        assert d.stream[i] == int_or_none(ids.get("stream")), i


EDGE = b"""{
  "schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}],
  "distributedInfo": {"rank": 3, "world_size": 8},
  "traceEvents": [
  {"ph": "X", "cat": "kernel", "name": "k<{lambda()#1}>},{x", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2.125,
   "args": {"External id": 1, "device": 0, "stream": 7, "correlation": 11, "grid": [1, 1, 1]}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "Spans", "tid": "", "ts": 1712195495519689.047,
   "dur": 63.813, "args": {"nested": {"a": [1, {"b": "]},"}]}, "External id": 2}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "pid": 1, "tid": 2, "ts": 7, "dur": 1.0005,
   "args": {"stream": "0x0", "device": "1", "correlation": 5.0}},
  {"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 1.5, "tid": 2, "ts": 1.5e3, "args": null},
  {"ph": "s", "id": 1, "pid": 1, "tid": 2, "ts": 3, "cat": "ac2g", "name": "ac2g"},
  {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
  {"ph": "X", "cat": "cpu_op", "name": "no dur", "pid": 1, "tid": 2, "ts": 4.25},
  {"ph": "X", "cat": "cpu_op", "name": "\\"quoted\\" \\u00e9", "pid": 1, "tid": 2, "ts": 0.001, "dur": 0}
  ],
  "INFO": ["CuptiActivityProfiler.cpp:1232] Traces Recorded:", "x]y"],
  "traceName": "/tmp/t.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000}
"""


@pytest.mark.parametrize("batch_bytes", [1, 64, 200, 1 << 20])
def test_edge_cases_match_reference(batch_bytes: int) -> None:
    _check(EDGE, batch_bytes)
    d = decode(EDGE, batch_bytes)
    assert d.top["baseTimeNanoseconds"] == 1_700_000_000_000_000_000 and d.top["distributedInfo"]["rank"] == 3
    assert not d.lanes_plain  # the float pid 1.5


def test_a_trace_without_events_is_stored_empty(tmp_path: Path) -> None:
    # "traceEvents": [] made the time columns one row long for zero events, and ingest crashed
    # (IndexError in decode.rows): a rank that recorded nothing is stored with no events.
    from traceprof.collectors.kineto import parse  # the package's parse(): the parser module's function

    path = tmp_path / "rank1.json"
    path.write_text(
        json.dumps(
            {"distributedInfo": {"rank": 1, "world_size": 2}, "baseTimeNanoseconds": 5, "traceEvents": []}
        )
    )
    pt = parse(path)
    assert (pt.rank, pt.events_read, pt.events.num_rows, pt.collectives.num_rows) == (1, 0, 0, 0)


def test_events_first_or_alone() -> None:
    _check(b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}], "baseTimeNanoseconds": 5}', 1)
    _check(b'{"traceEvents": []}', 1)
    _check(b'{"a": 1, "traceEvents": [{"ph": "X", "ts": 1, "dur": 2}, {"ph": "X", "ts": 2, "dur": 2}]}', 1)


@pytest.mark.parametrize(
    "doc",
    [
        b'[{"ph": "X"}]',  # not an object
        b'{"traceEvents": [{"ph": "X", "ts": 1}',  # truncated
        b'{"traceEvents": [{"ph": "X", "name": 5}]}',  # a name that is not a string
        b'{"other": 1}',  # no events
    ],
)
def test_general_path_needed(doc: bytes) -> None:
    assert decode(doc, 1) is None


def _traces() -> list[Path]:
    found = [p for p in SAMPLES.rglob("*.trace.json.gz")][:8]
    hta = CORPUS / "hta"
    if hta.exists():
        found += [p for p in hta.rglob("*.json*") if "execution_trace/benchmark_simple_add_et" not in str(p)]
    return found


@pytest.mark.parametrize("path", _traces(), ids=lambda p: p.parent.name + "/" + p.name)
def test_real_traces_match_reference(path: Path) -> None:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    _check(data, 1 << 16)


@pytest.mark.parametrize("piece", [1, 7, 100])
def test_pieces_decode_as_the_whole(piece: int) -> None:
    # A streaming source (e.g. gunzip output) in pieces of any size gives the same columns.
    whole = decode(EDGE, 64)
    parts = decode((EDGE[i : i + piece] for i in range(0, len(EDGE), piece)), 64)
    assert parts is not None and whole is not None
    assert (
        parts.name.tolist(),
        parts.pid.tolist(),
        parts.args.to_pylist(),
        parts.correlation.tolist(),
        parts.top,
    ) == (
        whole.name.tolist(),
        whole.pid.tolist(),
        whole.args.to_pylist(),
        whole.correlation.tolist(),
        whole.top,
    )
    assert (parts.ts_ns == whole.ts_ns).all() and (parts.dur_ok == whole.dur_ok).all()


@pytest.mark.parametrize("space", [b" ", b"\n", b"\r\n\t "])
def test_a_long_run_of_whitespace_between_events_is_not_held(space: bytes) -> None:
    # 48 MiB of JSON whitespace after "[" and between two events, streamed in 1 MiB pieces: the
    # splitter drops it as it comes (it held the whole run, then a joined copy of it: 6.5 GB for 3 GB)
    import tracemalloc

    run = space * ((24 << 20) // len(space))
    ev = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 2, "ts": 1.5, "dur": 2}'

    def pieces():
        yield b'{"traceEvents": ['
        for part in (run, ev + b",", run, ev):
            yield from (part[i : i + (1 << 20)] for i in range(0, len(part), 1 << 20))
        yield b'], "baseTimeNanoseconds": 7}'

    tracemalloc.start()
    try:
        got = decode(pieces(), 1 << 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got is not None and got.name.tolist() == ["k", "k"] and got.top == {"baseTimeNanoseconds": 7}
    assert got.ts_ns.tolist() == [1500, 1500]
    assert peak < 8 << 20, peak  # a few pieces, never the 24 MiB run


def test_only_json_whitespace_is_dropped() -> None:
    # \x0b and \x0c are whitespace to bytes.isspace, not to JSON: the document stays invalid
    assert decode(b'{"traceEvents": [\x0b{"ph": "X", "ts": 1, "dur": 2}]}', 1) is None


_PARSE = importlib.import_module("traceprof.collectors.kineto.parse")


@pytest.mark.parametrize("fast", [True, False])
def test_an_id_with_a_fraction_is_no_id(fast: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "correlation": 1.5 was truncated to 1, pairing the kernel with another kernel's launch
    kernels = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{c}",
            "pid": 0,
            "tid": 7,
            "ts": 10 + i,
            "dur": 1,
            "args": {"correlation": c, "device": 0},
        }
        for i, c in enumerate([1, 1.5, 3.0, 2.5e0])
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": kernels}))
    if not fast:
        monkeypatch.setattr(_PARSE, "decode_columns", lambda data, **kw: None)
    ev = _PARSE.parse(path).events.sort_by("ts_ns")
    assert ev.column("correlation").to_pylist() == [1, None, 3, None]
    assert int_or_none(2.0) == 2 and int_or_none(-0.5) is None and int_or_none(1e300) is None
    assert int_or_none(1e20, keep_large=True) == 10**20


def _bad_args_trace(path: Path) -> Path:
    """Event #2 a sound kernel; #3 args.device 2**70; #4 args.correlation 1.5; #5 args a list;
    distributedInfo.rank "abc"."""
    kernel = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "dur": 10}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 10,
            "dur": 5,
            "args": {"correlation": 1},
        },
        {**kernel, "name": "k1", "ts": 20, "args": {"correlation": 1, "device": 0, "stream": 7}},
        {**kernel, "name": "k2", "ts": 40, "args": {"correlation": 2, "device": 2**70, "stream": 7}},
        {**kernel, "name": "k3", "ts": 60, "args": {"correlation": 1.5, "device": 0, "stream": 7}},
        {**kernel, "name": "k4", "ts": 80, "args": [1, 2]},
    ]
    path.write_text(json.dumps({"distributedInfo": {"rank": "abc", "world_size": 1}, "traceEvents": events}))
    return path


@pytest.mark.parametrize("fast", [True, False])
def test_an_event_without_ph_is_named_in_its_warning(
    fast: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An event with no 'ph' (or a phase no profiler writes, 'Q') is not stored, counted as an unknown
    # phase; the warning said "1 record(s) not stored: 1 unknown phase ph=''" without naming it, where
    # every other bad-event message names "event #N (ph=..., name=...)". The first of each reason is
    # named now, on the column path and on the general loop alike.
    doc = micro_trace(["a", "b", "c", "d"])  # event #0: ProfilerStep#1, #1..#4: a..d
    del doc["traceEvents"][2]["ph"]  # "b"
    doc["traceEvents"][3]["ph"] = "Q"  # "c"
    del doc["traceEvents"][4]["ph"]  # "d": the second without ph, counted, not named
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    if not fast:
        monkeypatch.setattr(_PARSE, "decode_columns", lambda data, **kw: None)
    t = _PARSE.parse(path)
    assert t.rejected == {"unknown phase ph=''": 2, "unknown phase ph='Q'": 1}
    assert t.first_rejected == {
        "unknown phase ph=''": "event #2 (ph='', name='b')",
        "unknown phase ph='Q'": "event #3 (ph='Q', name='c')",
    }
    with Store(tmp_path / "s.duckdb") as store:
        res = ingest(store, [path], jobs=1)
        assert store.sql("SELECT name FROM events WHERE kind = 'cpu_op'")["name"].to_list() == ["a"]
    assert (
        "rank0.json: 3 record(s) not stored: 2 unknown phase ph='' (first: event #2 (ph='', name='b')), "
        "1 unknown phase ph='Q' (first: event #3 (ph='Q', name='c'))"
    ) in res.warnings


@pytest.mark.parametrize("fast", [True, False])
def test_bad_id_args_are_rejected_or_kept_and_counted(
    fast: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # args.device = 2**70 was stored as a NULL device (a phantom lane in idle); 1.5 and a list of
    # args were read as no ids and "abc" as no rank, all without a word or an issues count. A
    # value beyond its column rejects its event (as an id beyond int64 did); one that is no
    # integer keeps the event without it (an id of 1.5 is no id), each said and counted.
    path = _bad_args_trace(tmp_path / "t.json")
    if not fast:
        monkeypatch.setattr(_PARSE, "decode_columns", lambda data, **kw: None)
    with pytest.raises(
        TraceFormatError,
        match=r"event #3 \(ph='X', name='k2'\): 'device' beyond int32 \(1180591620717411303424\)",
    ):
        _PARSE.parse(path)
    t = _PARSE.parse(path, ParseOptions(on_bad_event="skip"))
    ev = t.events.sort_by("ts_ns")
    assert ev.column("name").to_pylist() == ["ProfilerStep#1", "cudaLaunchKernel", "k1", "k3", "k4"]
    assert ev.column("correlation").to_pylist() == [None, 1, 1, None, None]
    assert ev.column("device").to_pylist()[2:] == [0, 0, 0]  # k4: its pid, as without args
    assert t.rejected == {"'device' beyond int32": 1}
    assert json.loads(t.trace["meta"])["repaired"] == {
        "distributedInfo.rank not an integer: ignored": 1,
        "args.correlation not an integer: kept without it": 1,
        "args not an object: kept without its ids": 1,
    }
    said = "\n".join(t.warnings)
    assert "t.json: 1 event(s) with args.correlation not an integer: kept without it (event #4 (1.5))" in said
    assert "t.json: 1 event(s) with args not an object: kept without its ids (event #5 ('[1, 2]'))" in said


def test_bad_id_args_show_in_the_runs_issues(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    _bad_args_trace(d / "rank0.json")
    s = Store(tmp_path / "t.duckdb")
    ingest(s, [d], on_bad_event="skip")
    assert s.runs()["issues"].to_list() == [
        "1 rejected: 'device' beyond int32; 1 repaired: distributedInfo.rank not an integer: ignored; "
        "1 repaired: args.correlation not an integer: kept without it; "
        "1 repaired: args not an object: kept without its ids"
    ]


def _device_args_trace(path: Path, text: bool = True) -> Path:
    """A one-rank trace: a launch (correlation 1) and five kernels on pid 0, stream 7, whose
    ``args.device`` is 0, -1, "0", 3.0 and 0 (the last with ``correlation: "0x2"``); without
    ``text``, the last three as plain integers."""
    kernel = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "dur": 10}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 200},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
        | {"args": {"correlation": 1}},
        {**kernel, "name": "k1", "ts": 20, "args": {"correlation": 1, "device": 0, "stream": 7}},
        {**kernel, "name": "k2", "ts": 40, "args": {"correlation": 1, "device": -1, "stream": 7}},
        {**kernel, "name": "k3", "ts": 60, "args": {"correlation": 1, "device": "0", "stream": 7}},
        {**kernel, "name": "k4", "ts": 80, "args": {"correlation": 1, "device": 3.0, "stream": 7}},
        {**kernel, "name": "k5", "ts": 100, "args": {"correlation": "0x2", "device": 0, "stream": 7}},
    ]
    if not text:
        for e, (corr, dev) in zip(events[4:], [(1, 0), (1, 3), (2, 0)], strict=True):
            e["args"] = {"correlation": corr, "device": dev, "stream": 7}
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}))
    return path


@pytest.mark.parametrize("fast", [True, False])
def test_negative_and_text_device_args_are_said_and_counted(
    fast: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # args.device = -1 was stored as device -1 (a lane of no device), "0" and 3.0 were read as 0 and
    # 3 without a word, as a correlation "0x2" as 2. A negative device is no device: the kernel is
    # kept without it (NULL), as one that is no integer; a number given as text or a float is read
    # as its integer; each counted (issues) and said with the first events.
    t = _parsed(_device_args_trace(tmp_path / "t.json"), fast, monkeypatch)
    ev = t.events.sort_by("ts_ns")  # type: ignore[attr-defined]
    assert ev.column("name").to_pylist()[2:] == ["k1", "k2", "k3", "k4", "k5"]
    assert ev.column("device").to_pylist()[2:] == [0, None, 0, 3, 0]
    assert ev.column("correlation").to_pylist()[2:] == [1, 1, 1, 1, 2]
    assert t.rejected == {}  # type: ignore[attr-defined]
    assert json.loads(t.trace["meta"])["repaired"] == {  # type: ignore[attr-defined]
        "args.device negative: kept without it": 1,
        "args.device a string: read as its integer": 1,
        "args.device a float: read as its integer": 1,
        "args.correlation a string: read as its integer": 1,
    }
    said = "\n".join(t.warnings)  # type: ignore[attr-defined]
    assert "t.json: 1 event(s) with args.device negative: kept without it (event #3 (-1))" in said
    assert "t.json: 1 event(s) with args.device a string: read as its integer (event #4 ('0'))" in said
    assert "t.json: 1 event(s) with args.device a float: read as its integer (event #5 (3.0))" in said
    assert "t.json: 1 event(s) with args.correlation a string: read as its integer (event #6 ('0x2'))" in said


@pytest.mark.parametrize("fast", [True, False])
def test_negative_device_alone(fast: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the same without text or float ids: the typed (fast) decode reads -1 as an integer; the rows
    # go the general way, which stores NULL and says so
    path = _device_args_trace(tmp_path / "t.json", text=False)
    t = _parsed(path, fast, monkeypatch)
    assert t.events.sort_by("ts_ns").column("device").to_pylist()[2:] == [0, None, 0, 3, 0]  # type: ignore[attr-defined]
    assert json.loads(t.trace["meta"])["repaired"] == {"args.device negative: kept without it": 1}  # type: ignore[attr-defined]


def test_text_ids_on_the_fast_path_are_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # without the negative device the columnar decode keeps the rows itself (the general loop's
    # id decode is not reached): "0", 3.0 and "0x2" are read as 0, 3 and 2 and counted as there
    path = _device_args_trace(tmp_path / "t.json")
    events = json.loads(path.read_text())
    events["traceEvents"][3]["args"]["device"] = 0
    path.write_text(json.dumps(events))

    def general(*a: object) -> None:
        raise AssertionError("the general loop ran")

    monkeypatch.setattr(_PARSE, "_decode_ids", general)
    t = _PARSE.parse(path)
    assert t.events.sort_by("ts_ns").column("device").to_pylist()[2:] == [0, 0, 0, 3, 0]
    assert t.events.sort_by("ts_ns").column("correlation").to_pylist()[2:] == [1, 1, 1, 1, 2]
    assert json.loads(t.trace["meta"])["repaired"] == {
        "args.device a string: read as its integer": 1,
        "args.device a float: read as its integer": 1,
        "args.correlation a string: read as its integer": 1,
    }
    assert "t.json: 1 event(s) with args.device a string: read as its integer (event #4 ('0'))" in t.warnings


def _parsed(path: Path, fast: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    if not fast:
        monkeypatch.setattr(_PARSE, "decode_columns", lambda data, **kw: None)
    try:
        return _PARSE.parse(path, ParseOptions(on_bad_event="skip"))
    finally:
        monkeypatch.undo()


def _plain(t: pa.Table) -> pa.Table:
    """``t`` with its dictionary columns as plain strings (the two paths may order a dictionary
    differently: the same values)."""
    return pa.table(
        {
            f.name: t.column(f.name).cast(pa.string()) if pa.types.is_dictionary(f.type) else t.column(f.name)
            for f in t.schema
        }
    )


@pytest.mark.parametrize("path", _traces()[:12] + [None], ids=lambda p: "edge" if p is None else p.name)
def test_parse_fast_path_equals_general(
    path: Path | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # parse() builds the same tables and counts through decode.rows() as through its per-event loop
    # (and falls back to the loop, e.g. for the float pid of the edge document).
    if path is None:
        path = tmp_path / "edge.json"
        path.write_bytes(EDGE)
    a, b = _parsed(path, False, monkeypatch), _parsed(path, True, monkeypatch)
    for t in ("events", "devices", "steps", "collectives"):
        assert _plain(getattr(a, t)).equals(_plain(getattr(b, t))), t
    keys = (
        "rank",
        "world_size",
        "trace",
        "events_read",
        "rejected",
        "skipped",
        "flagged",
        "warnings",
        "format",
    )
    assert [getattr(a, k) for k in keys] == [getattr(b, k) for k in keys]


_GOOD = [
    {
        "ph": "X",
        "cat": "kernel",
        "name": f"k{i}",
        "pid": 0,
        "tid": 7,
        "ts": 10 + i,
        "dur": 1.5,
        "args": {"correlation": i},
    }
    for i in range(6)
] + [{"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 1, "tid": 1, "ts": 3}]
_BAD_TIMES = {  # events with a malformed time among good ones: (the events, which ones go through the column path)
    "bad ts": [{"ph": "X", "cat": "kernel", "name": "bad", "pid": 0, "tid": 7, "ts": "abc", "dur": 1}],
    "missing ts": [{"ph": "X", "cat": "kernel", "name": "nots", "pid": 0, "tid": 7, "dur": 1}],
    "missing dur": [{"ph": "X", "cat": "cpu_op", "name": "nodur", "pid": 1, "tid": 1, "ts": 4}],
    "bad dur on an instant": [
        {"ph": "i", "cat": "cpu_instant_event", "name": "i", "pid": 1, "tid": 1, "ts": 5, "dur": "x"}
    ],
    "bad ts and dur": [
        {"ph": "X", "cat": "kernel", "name": "both", "pid": 0, "tid": 7, "ts": "t", "dur": "d"}
    ],
    "missing ts, bad dur": [{"ph": "X", "cat": "kernel", "name": "m", "pid": 0, "tid": 7, "dur": "d"}],
    "several": [
        {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": "1x", "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "b" * 90, "pid": 1, "tid": 1, "ts": 2},
    ],
    "metadata with a bad ts (not stored)": [
        {"ph": "M", "name": "process_name", "pid": 0, "ts": "z", "args": {"name": "gpu"}}
    ],
    "negative dur": [{"ph": "X", "cat": "kernel", "name": "neg", "pid": 0, "tid": 7, "ts": 1, "dur": -2.50}],
    "bad ts, negative dur": [
        {"ph": "X", "cat": "kernel", "name": "n", "pid": 0, "tid": 7, "ts": "q", "dur": -1}
    ],
    "missing ts, negative dur": [{"ph": "X", "cat": "kernel", "name": "n", "pid": 0, "tid": 7, "dur": -1}],
    "ts beyond int64 ns (general loop)": [
        {"ph": "X", "cat": "kernel", "name": "far", "pid": 0, "tid": 7, "ts": 1e30, "dur": 1}
    ],
}


@pytest.mark.parametrize("case", list(_BAD_TIMES))
@pytest.mark.parametrize("mode", ["skip", "raise"])
def test_malformed_times_take_the_column_path_with_the_general_loops_result(
    case: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One bad time used to send the whole file through the general loop (it holds the document:
    # 3.9 GB for one bad event in a 565 MB file). The column path rejects or names it the same way.
    from traceprof.core.errors import TraceFormatError

    events = _GOOD[:3] + _BAD_TIMES[case] + _GOOD[3:]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}))

    def parsed(fast: bool) -> object:
        if not fast:
            monkeypatch.setattr(_PARSE, "decode_columns", lambda data, **kw: None)
        try:
            return _PARSE.parse(path, ParseOptions(on_bad_event=mode))
        except TraceFormatError as e:
            return str(e)
        finally:
            monkeypatch.undo()

    general = parsed(False)
    loop_calls = []
    real_decode = _PARSE._decode
    monkeypatch.setattr(_PARSE, "_decode", lambda *a: loop_calls.append(1) or real_decode(*a))
    try:
        fast = _PARSE.parse(path, ParseOptions(on_bad_event=mode))
    except TraceFormatError as e:
        fast = str(e)
    monkeypatch.undo()
    stored = "metadata" not in case
    if mode == "raise" and stored:
        assert isinstance(general, str) and fast == general and ": event #3" in general
    else:
        for t in ("events", "devices", "steps", "collectives"):
            assert _plain(getattr(fast, t)).equals(_plain(getattr(general, t))), t
        keys = ("events_read", "rejected", "skipped", "flagged", "warnings")
        assert [getattr(fast, k) for k in keys] == [getattr(general, k) for k in keys]
        assert fast.events.num_rows == len(_GOOD)
        assert sum(fast.rejected.values()) == (0 if "metadata" in case else len(_BAD_TIMES[case]))
    assert bool(loop_calls) == ("general loop" in case)  # the whole-document decode only where needed


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        (b"1e30", 10**33),  # exact (worked out: 1e30 us = 1e33 ns); the caller reports it beyond int64
        (b"1.5e3", 1_500_000),
        (b"-1e2", -100_000),
        (b"12.3456", 12_346),  # half-to-even at the 4th decimal: 12345.6 ns -> 12346
        (b"0.0005", 0),  # 0.5 ns -> 0 (half to even)
        (b"1e-100", 0),  # tiny: rounds to 0 ns (not "out of range")
        (b"-1e-1000000000", 0),
        (b"123456789012345678901234567890", 123456789012345678901234567890 * 1000),
    ],
)
def test_us_text_to_ns_is_exact_for_large_exponents(text: bytes, ns: int) -> None:
    from traceprof.core.timeconv import us_text_to_ns

    assert us_text_to_ns(text) == ns


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"abc", "not a number: 'abc'"),
        (b'"12"', "not a number: '\"12\"'"),
        (b"NaN", "not a number: 'NaN'"),
        (b"1e400000000", "beyond int64 (1e400000000 us)"),
    ],
)
def test_us_text_to_ns_names_the_value_plainly(text: bytes, message: str) -> None:
    from traceprof.core.timeconv import us_text_to_ns

    with pytest.raises(ValueError) as e:
        us_text_to_ns(text)
    assert str(e.value) == message


# A pid/tid that is a float fails the batch's common types and is decoded again (decode._events):
# in the first batch, in a later one, after the int of equal value (1 then 1.0 hash alike), alone.
_LANES = [
    [1, 2, 3],
    [1, 1.0, 2],
    [1.5, 2, 3],
    [1, 2, "x"],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 2.0],
    [None, "7", 99999999999999999999],
]


@pytest.mark.parametrize("pids", _LANES, ids=str)
@pytest.mark.parametrize("batch_bytes", [1, 200, 1 << 20])
def test_float_lanes_are_found_in_any_batch(pids: list[object], batch_bytes: int) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": p, "tid": 1, "ts": i, "dur": 1}
        for i, p in enumerate(pids)
    ]
    data = json.dumps({"traceEvents": events}).encode()
    floats = any(isinstance(p, float) for p in pids)
    if not floats:  # with a float the lanes are not read (decode.rows leaves the file to the general path)
        _check(data, batch_bytes)
    d = decode(data, batch_bytes)
    assert d is not None and d.lanes_plain == (not floats)


@pytest.mark.parametrize("batch_bytes", [1, 1 << 20])
def test_absent_null_and_extreme_ids(batch_bytes: int) -> None:
    # absent and null ids are missing; int64's least value (the typed decode's mark of an absent
    # id, so refused there and taken by the loose decode) and its largest are ids like any other
    args = [
        {},
        {"correlation": None, "External id": 3},
        {"correlation": -(2**63), "device": 2**63 - 1},
        {"correlation": 5, "stream": None, "device": 0},
        {"correlation": -(2**63) + 1},
    ]
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i, "dur": 1, "args": a}
        for i, a in enumerate(args)
    ]
    data = json.dumps({"traceEvents": events}).encode()
    _check(data, batch_bytes)
    d = decode(data, batch_bytes)
    assert d is not None
    assert d.correlation.tolist() == [None, None, -(2**63), 5, -(2**63) + 1]
    assert d.external_id.tolist() == [None, 3, None, None, None]
    assert d.device.tolist() == [None, None, 2**63 - 1, 0, None]


def _times_by_split(raw: list[msgspec.Raw], base: int, bad: dict[int, str]) -> tuple[np.ndarray, np.ndarray]:
    """The reference for ``decode._times``: its former implementation, which joined the texts with
    newlines and split them again in Arrow (a text holding a newline is not a number: not sent
    here), and nulled the absent ones with ``if_else``."""
    import pyarrow.compute as pc

    from traceprof.collectors.kineto import decode as dec

    n = len(raw)
    text = pc.list_flatten(pc.split_pattern(pa.array([b"\n".join(raw)], pa.binary()).cast(pa.string()), "\n"))
    present = pc.not_equal(text, "")
    ok = present.to_numpy(zero_copy_only=False)
    try:
        d = pc.cast(pc.if_else(present, text, pa.scalar(None, pa.string())), pa.decimal128(38, 3))
        words = np.frombuffer(d.buffers()[1], np.int64)[2 * d.offset : 2 * (d.offset + n)]
        lo, hi = words[0::2], words[1::2]
        beyond = ok & (hi != (lo >> 63))
        for i in np.flatnonzero(beyond).tolist():
            bad.setdefault(base + i, dec._BEYOND)
        return np.where(ok & ~beyond, lo, 0), ok
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # unchanged: one at a time
        return dec._times_one_by_one(raw, base, bad), ok


def test_times_match_the_split_reference() -> None:
    # 3,000 random batches of 1-6 time texts (never empty: decode skips an empty batch): exact decimals, half-to-even past 3 decimals, exponents,
    # int64's edges in ns, strings, null, absent (""), other JSON values
    import random

    from traceprof.collectors.kineto.decode import _times

    texts = [
        b"1.5", b"", b"-2", b"3.0005", b"3.0015", b"1e3", b"1.5e3", b'"12"', b"null", b"99999999999999999999",
        b"9223372036854775.807", b"9223372036854775.808", b"-9223372036854775.808", b"-0.0004", b"0.0005",
        b"1E-3", b"true", b"{}", b"1669783687464252", b"0",
    ]  # fmt: skip
    rng = random.Random(34)
    for _ in range(3000):
        raw = [msgspec.Raw(rng.choice(texts)) for _ in range(rng.randint(1, 6))]
        want_bad: dict[int, str] = {}
        got_bad: dict[int, str] = {}
        want, got = _times_by_split(raw, 10, want_bad), _times(raw, 10, got_bad)
        assert want[0].tolist() == got[0].tolist() and want[1].tolist() == got[1].tolist(), raw
        assert want_bad == got_bad, raw


@pytest.mark.parametrize(
    "path",
    [p for p in _traces() if p.stat().st_size > 100_000][:6],
    ids=lambda p: p.parent.name + "/" + p.name,
)
def test_classes_read_the_hint_of_the_rows_they_need(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # classes() runs the comm-hint regex only on the rows whose hint it reads (columns._hint_read);
    # the reference runs it on every row, as before: the same class on every row
    from traceprof.collectors.kineto import columns

    got = _PARSE.parse(path).events.column("class").to_pylist()
    monkeypatch.setattr(columns, "_hint_read", lambda f, *_: np.ones(f.n, bool))
    assert _PARSE.parse(path).events.column("class").to_pylist() == got


def test_a_kernel_launched_by_a_comm_op_is_comm_with_the_hint_read_on_cpu_rows(tmp_path: Path) -> None:
    # A kernel whose name is no known collective is communication when the CPU op that launched it
    # (External id 7) carries collective args; that op's hint must be read (columns._hint_read). The
    # gemm launched by aten::mm (External id 8, no such args) is compute.
    from tests.builders import kineto

    ops = [
        ("record_param_comms", 7, {"Collective name": "all_reduce", "Process Group Name": "0"}),
        ("aten::mm", 8, {}),
    ]
    events: list[dict] = []
    for i, (op, ext, extra) in enumerate(ops):
        t = 100 * i
        events += [
            {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": t, "dur": 50, "args": {"External id": ext, **extra}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1, "dur": 5, "args": {"External id": ext, "correlation": 50 + i}},
            {"ph": "X", "cat": "kernel", "name": ["custom_ring_kernel", "gemm_kernel"][i], "pid": 0, "tid": 7, "ts": t + 10, "dur": 20, "args": {"correlation": 50 + i, "device": 0, "stream": 7}},
        ]  # fmt: skip
    pt = _PARSE.parse(kineto(tmp_path / "rank0.json", events))
    classes = dict(
        zip(pt.events.column("name").to_pylist(), pt.events.column("class").to_pylist(), strict=True)
    )
    assert (classes["custom_ring_kernel"], classes["gemm_kernel"]) == ("comm", "compute")


def _first_seen_codes(texts: list[str]) -> tuple[list[int], list[str]]:
    """The reference coding of a string column: each distinct value's code is its rank by first occurrence."""
    values = list(dict.fromkeys(texts))
    at = {v: i for i, v in enumerate(values)}
    return [at[t] for t in texts], values


#: Events whose (ph, cat, name, pid, tid) combinations repeat and interleave, with values of each
#: field first met in a new combination, int and string lanes of the same text, and absent fields.
_COMBOS = [
    {"ph": ph, "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": i, "dur": 1}
    for i, (ph, cat, name, pid, tid) in enumerate(
        [
            ("X", "cpu_op", "a", 1, 1),
            ("X", "kernel", "k", 0, 7),
            ("X", "cpu_op", "a", 1, 1),
            ("i", "cpu_op", "a", "1", 2),
            ("X", "cpu_op", "b", 1, "1"),
            ("X", "kernel", "k", 0, 8),
            ("X", "cpu_op", "a", 1, 1),
            ("C", "counter", "c", 2, 1),
            ("X", "kernel", "k2", 0, 7),
        ]
        * 3
    )
] + [{"ph": "X", "ts": 99, "dur": 1}, {"ph": "X", "cat": "cpu_op", "name": "z", "ts": 100, "dur": 1}]


@pytest.mark.parametrize(("max_combos", "few"), [(0, 0), (3, 3), (None, 1), (None, None)])
@pytest.mark.parametrize("batch_bytes", [1, 300, 1 << 20])
def test_string_codes_through_combinations_are_each_fields_own(
    max_combos: int | None, few: int | None, batch_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The five string fields are coded through one lookup of their combination (a few hundred per
    # trace); past the cap, or once the combinations do not repeat (more than a quarter of the
    # events read), the later batches field by field: the codes are those of coding each field on
    # its own (first occurrence order), whichever way each batch went.
    from traceprof.collectors.kineto import decode as dec

    if max_combos is not None:
        monkeypatch.setattr(dec, "_MAX_COMBOS", max_combos)
    if few is not None:
        monkeypatch.setattr(dec, "_FEW_COMBOS", few)
    events = _COMBOS
    d = decode(json.dumps({"traceEvents": events}).encode(), batch_bytes)
    assert d is not None
    for f in ("ph", "cat", "name", "pid", "tid"):
        texts = ["" if e.get(f) is None else str(e[f]) for e in events]
        codes, values = _first_seen_codes(texts)
        col = getattr(d, f)
        assert (col.codes.tolist(), col.values) == (codes, values), f


def _with_flows_and_metadata(n: int) -> bytes:
    """A trace with flows, metadata (process and thread names, a sort index) and a malformed time
    among stored events, in any order."""
    events: list[dict[str, object]] = []
    for i in range(n):
        events += [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"op{i % 3}",
                "pid": 1,
                "tid": 2,
                "ts": i,
                "dur": 1,
                "args": {"External id": i},
            },
            {
                "ph": "s",
                "id": i,
                "pid": 1,
                "tid": 2,
                "ts": i,
                "cat": "ac2g",
                "name": "ac2g",
                "args": {"x": i},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "k",
                "pid": 0,
                "tid": 7,
                "ts": i,
                "dur": 1,
                "args": {"correlation": i, "External id": i},
            },
            {"ph": "f", "id": i, "pid": 0, "tid": 7, "ts": i, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        ]
        if i % 4 == 1:
            events += [
                {"ph": "M", "name": "process_name", "pid": i, "tid": 0, "args": {"name": f"p{i}"}},
                {"ph": "M", "name": "thread_name", "pid": i, "tid": 3, "args": {"name": f"t{i}"}},
                {"ph": "M", "name": "process_sort_index", "pid": i, "args": {"sort_index": i}},
            ]
        if i == 5:
            events.append(
                {"ph": "X", "cat": "cpu_op", "name": "bad", "pid": 1, "tid": 2, "ts": "x", "dur": 1}
            )
    return json.dumps({"baseTimeNanoseconds": 1000, "traceEvents": events}).encode()


@pytest.mark.parametrize("batch_bytes", [1, 700, 1 << 20])
@pytest.mark.parametrize("n", [1, 12])
def test_args_of_phases_never_stored_are_left_out_with_the_same_rows(batch_bytes: int, n: int) -> None:
    # decode(stored=...) keeps the args texts of the events whose phase may be stored only (flows'
    # and metadata's were copied to be dropped again), and the names of the process and thread
    # metadata aside: decode.rows() builds the same rows, names and counts as from every text.
    from traceprof.collectors.kineto import decode as dec
    from traceprof.collectors.kineto._values import args_dict

    data = _with_flows_and_metadata(n)
    events = json.loads(data)["traceEvents"]
    every = decode(data, batch_bytes)
    some = decode(data, batch_bytes, stored=_PARSE._stored_phase)
    assert every is not None and some is not None and every.args_rows is None
    kept = [e["ph"] not in ("s", "f", "M") for e in events]
    assert some.args_rows is not None and some.args_rows.tolist() == kept
    texts = every.args.to_pylist()
    assert some.args.to_pylist() == [t for t, k in zip(texts, kept, strict=True) if k]
    named = {
        i for i, e in enumerate(events) if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
    }
    assert some.meta_args == {i: texts[i] for i in sorted(named)}
    rows = [dec.rows(d, 1000, _PARSE._kind_of_text, _PARSE._GPU_KINDS, args_dict) for d in (every, some)]
    assert rows[0] is not None and rows[1] is not None
    a, b = rows
    assert (a.skipped, a.rejected, a.process_names, a.thread_names) == (
        b.skipped,
        b.rejected,
        b.process_names,
        b.thread_names,
    )
    assert a.rejected == ({"bad time: not a number: '\"x\"'": 1} if n > 5 else {})  # the one bad ts
    assert list(a.src_index) == list(b.src_index)
    assert a.cols.keys() == b.cols.keys()
    for k in a.cols:
        x, y = a.cols[k], b.cols[k]
        if k == "args":
            assert x.to_pylist() == y.to_pylist()
        else:
            assert list(x) == list(y), k


@pytest.mark.parametrize("batch_bytes", [1, 1 << 20])
def test_times_and_ids_of_phases_never_stored_are_not_read(tmp_path, monkeypatch, batch_bytes):
    # decode(stored=...) reads the times and id args of the events whose phase may be stored only:
    # a flow's (never stored) unreadable ts, negative dur or id arg that is no integer is not read,
    # so it neither sent the whole file to the general path (an id arg of 1.5: decode returned None)
    # nor left entries for rows() to filter. The rows are the general path's, which skips flows.
    from traceprof.collectors.kineto import decode as dec
    from traceprof.collectors.kineto._values import args_dict

    cpu = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1}
    events = [
        {**cpu, "name": "a", "ts": 1, "dur": 2, "args": {"External id": 7}},
        {
            "ph": "s",
            "id": 1,
            "pid": 1,
            "tid": 1,
            "ts": "x",
            "cat": "ac2g",
            "name": "f1",
            "args": {"correlation": 1.5},
        },
        {**cpu, "name": "b", "ts": 4, "dur": 1, "args": {"External id": 8}},
        {"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 5, "dur": -3, "cat": "ac2g", "name": "f2", "bp": "e"},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python", "stream": "0x0"}},
    ]
    data = json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}).encode()
    d = decode(data, batch_bytes, stored=_PARSE._stored_phase)
    assert d is not None  # was None: the flow's correlation 1.5
    assert d.args_rows.tolist() == [True, False, True, False, False]
    # events 0 and 2 read (ts 1 us and 4 us, dur 2 us and 1 us); 1, 3 and 4 not: 0 and absent
    assert d.ts_ns.tolist() == [1000, 0, 4000, 0, 0] and d.ts_ok.tolist() == [True, False, True, False, False]
    assert d.dur_ns.tolist() == [2000, 0, 1000, 0, 0] and d.dur_ok.tolist() == [
        True,
        False,
        True,
        False,
        False,
    ]
    assert list(d.external_id) == [7, None, 8, None, None] and list(d.correlation) == [None] * 5
    assert (d.bad_time, d.negative_dur, d.loose_ids) == ({}, {}, [])
    r = dec.rows(d, 0, _PARSE._kind_of_text, _PARSE._GPU_KINDS, args_dict)
    assert r is not None and list(r.src_index) == [0, 2] and r.skipped == {"flow": 2, "metadata": 1}
    assert r.process_names == {"1": "python"}
    path = tmp_path / "t.json"
    path.write_bytes(data)
    fast = _PARSE.parse(path)
    monkeypatch.setattr(_PARSE, "decode_columns", lambda data, **kw: None)
    general = _PARSE.parse(path)
    for name in ("events", "steps", "collectives"):  # as values: the dictionaries' order may differ
        assert getattr(fast, name).to_pylist() == getattr(general, name).to_pylist(), name
    assert (fast.skipped, fast.rejected, fast.warnings) == (
        general.skipped,
        general.rejected,
        general.warnings,
    )
    assert fast.events.column("ts_ns").to_pylist() == [1000, 4000]


def test_a_bad_token_inside_a_batch_is_cut_before_at_once(monkeypatch):
    # A NaN token (not JSON) in the middle of a batch: each cut after it fails to decode. The cut
    # went back one event at a time, decoding the whole prefix each time (df_index_resolver with one
    # NaN: 149,583 joins, 59 s before the error); it now goes before the byte msgspec names.
    from traceprof.collectors.kineto import decode as dec

    events = [
        json.dumps({"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}) for i in range(1000)
    ]
    events[500] = events[500].replace('"dur": 1', '"dur": NaN')
    buf = ",".join(events).encode()
    tries = []
    real = dec._events
    monkeypatch.setattr(dec, "_events", lambda text, *a: tries.append(len(text)) or real(text, *a))
    cut, evs = dec._cut(buf, len(buf))
    assert [e.name for e in evs] == [f"op{i}" for i in range(500)]  # the events before the NaN's
    assert buf[:cut].endswith(events[499].encode()) and len(tries) == 2  # the whole batch, then before it


def _doc(times: list[tuple[str, str | None]]) -> bytes:
    """A document of one ``X`` event per (ts text, dur text or None: absent)."""
    evs = [
        '{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": '
        + ts
        + ("" if dur is None else f', "dur": {dur}')
        + "}"
        for ts, dur in times
    ]
    return b'{"traceEvents": [' + ",\n".join(evs).encode() + b"]}"


def test_times_read_as_numbers_where_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    # ts/dur decoded by msgspec as JSON integers (old-style epoch us) or binary floats (new-style:
    # 3 decimals after the base) and converted to ns without their texts, where that is exact; the
    # text path (decode._times) only for the rest. Hand values (ns = us * 1000, exact):
    from traceprof.collectors.kineto import decode as dec

    texts: list[int] = []
    real = dec._times
    monkeypatch.setattr(dec, "_times", lambda raw, *a: texts.append(len(raw)) or real(raw, *a))
    # old style: 1669783687464249 us -> 1,669,783,687,464,249,000 ns (beyond a float's 2**53 in ns);
    # "dur": -1 (an op still open) is quoted as written
    d = decode(_doc([("1669783687464249", "229253"), ("1669783687464252", "-1")]))
    assert d.ts_ns.tolist() == [1_669_783_687_464_249_000, 1_669_783_687_464_252_000]
    assert d.dur_ns.tolist() == [229_253_000, -1000] and d.negative_dur == {1: "-1"}
    # new style: 10.5 -> 10,500; 2.125 -> 2,125; 68719476735.999 (just under 2**36 us) -> 68,719,476,735,999;
    # 12.3451 -> 12,345.1 ns, rounded to the nearest: 12,345 (timeconv's half-to-even gives the same)
    d = decode(_doc([("10.5", "2.125"), ("68719476735.999", "0.001"), ("12.3451", None)]))
    assert d.ts_ns.tolist() == [10_500, 68_719_476_735_999, 12_345]
    assert d.dur_ns.tolist() == [2_125, 1, 0] and d.dur_ok.tolist() == [True, True, False]
    assert texts == []  # no batch went through the texts
    # a tie at the 4th decimal (3.0005 us = 3,000.5 ns -> 3,000, half-to-even), 2**36 us and more
    # with decimals (68719476736.001 -> 68,719,476,736,001), a negative float dur (quoted as
    # written: "-1.50"), epoch us with decimals: each read from its text, exactly
    for times, ts, dur, negative in [
        ([("3.0005", "1")], [3_000], [1_000], {}),
        ([("68719476736.001", "1")], [68_719_476_736_001], [1_000], {}),
        ([("1.5", "-1.50")], [1_500], [-1_500], {0: "-1.50"}),
        ([("1712195495519689.047", "63.813")], [1_712_195_495_519_689_047], [63_813], {}),
    ]:
        texts.clear()
        d = decode(_doc(times))
        assert (d.ts_ns.tolist(), d.dur_ns.tolist(), d.negative_dur) == (ts, dur, negative), times
        assert texts, times


def test_times_as_numbers_match_the_reference_in_any_batch() -> None:
    # Random documents mixing every kind of time text (integers, 3 decimals, ties and other values
    # past 3 decimals, 2**36 us and epoch us with decimals, exponents, absent, negative durs) in
    # batches of every size: each time equals the exact Decimal reference (_check).
    import random

    ts_texts = ["1669783687464249", "10.5", "0.001", "3.0005", "3.0015", "12.3456", "68719476735.999",
                "68719476736.001", "1712195495519689.047", "1.5e3", "1E-3", "0", "-2", "7"]  # fmt: skip
    dur_texts = [None, "1", "2.125", "-1", "-1.5", "0.0005", "229253", "1e2"]
    rng = random.Random(34)
    for _ in range(60):
        times = [(rng.choice(ts_texts), rng.choice(dur_texts)) for _ in range(rng.randint(1, 30))]
        data = _doc(times)
        _check(data, rng.choice([1, 100, 400, 1 << 20]))


def test_large_times_with_decimals_stop_trying_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Real new-style traces write "ts": 5177552537952.524 (us after the base): too large for a float
    # to hold each ns, and no integer. The first batch finds that (integers fail, floats too large);
    # the later ones go straight to their texts (tried as numbers, a batch would be decoded again).
    # Hand values: 5177552537952.524 us = 5,177,552,537,952,524 ns; + k us for event k.
    from traceprof.collectors.kineto import decode as dec

    class Counted:
        def __init__(self, decoder: msgspec.json.Decoder) -> None:
            self.decoder, self.calls = decoder, 0

        def decode(self, text: bytes) -> object:
            self.calls += 1
            return self.decoder.decode(text)

    ints, floats = Counted(dec._INT_TIME_EVENTS), Counted(dec._FLOAT_TIME_EVENTS)
    monkeypatch.setattr(dec, "_INT_TIME_EVENTS", ints)
    monkeypatch.setattr(dec, "_FLOAT_TIME_EVENTS", floats)
    d = decode(_doc([(f"{5177552537952 + k}.524", "1.5") for k in range(40)]), batch_bytes=400)
    assert d.ts_ns.tolist() == [5_177_552_537_952_524 + 1000 * k for k in range(40)]
    assert d.dur_ns.tolist() == [1_500] * 40
    assert (ints.calls, floats.calls) == (1, 1)  # the first batch only (40 events: several batches)
