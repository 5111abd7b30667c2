"""Lenient by design, strict on request: bad bytes and numbers are repaired or rejected per record,
with the file and the place; --partial; run identity (issue 11)."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from tests._cli_inproc import run
from tests.builders import collective_args, micro_trace
from tests.conftest import CORPUS
from traceprof.core.errors import StoreError, TraceFormatError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

FR = {
    "version": "2.10",
    "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
    "entries": [
        {
            "record_id": 0,
            "pg_id": 0,
            "process_group": ["0", "default_pg"],
            "collective_seq_id": 1,
            "p2p_seq_id": 0,
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": 1_000_000,
            "time_discovered_started_ns": 1_000_100,
            "time_discovered_completed_ns": 1_000_600,
            "input_sizes": [[1024]],
            "input_dtypes": ["Float"],
            "output_sizes": [[1024]],
            "output_dtypes": ["Float"],
            "state": "completed",
            "is_p2p": False,
            "frames": [],
        }
    ],
}


def _write(d: Path, name: str, data: bytes | dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return p


def _ingest(tmp_path: Path, path: Path, **kw) -> tuple[Store, object]:
    store = Store(tmp_path / "s.duckdb")
    return store, ingest(store, [path], jobs=1, **kw)


def test_invalid_utf8_is_repaired_counted_and_shown(tmp_path):
    raw = json.dumps(micro_trace(["NAME"])).encode().replace(b"NAME", b"x\xff\xfey")
    path = _write(tmp_path / "u", "rank0.json", raw)
    offset = raw.index(b"\xff")
    store, res = _ingest(tmp_path, path)
    assert f"{path}: byte {offset}: 2 invalid UTF-8 sequence(s) replaced by U+FFFD" in res.warnings
    assert store.sql("SELECT name FROM events WHERE kind = 'cpu_op'")["name"].to_list() == ["x\ufffd\ufffdy"]
    assert store.runs()["issues"].to_list() == ["2 repaired: invalid UTF-8 replaced by U+FFFD"]
    store.close()


def test_invalid_utf8_in_gzip_names_decompressed_offset(tmp_path):
    raw = json.dumps(micro_trace(["NAME"])).encode().replace(b"NAME", b"\xc3")
    path = _write(tmp_path / "g", "rank0.json.gz", gzip.compress(raw))
    store, res = _ingest(tmp_path, path)
    offset = raw.index(b"\xc3")
    assert (
        f"{path}: byte {offset} of the decompressed data: 1 invalid UTF-8 sequence(s) replaced by U+FFFD"
        in res.warnings
    )
    store.close()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # base + ts * 1000 ns: the trace's field and its value as written, in us, after the base
        ("ts", 2**70, f"'ts' beyond int64 ({2**70} us after baseTimeNanoseconds {2**62})"),
        ("ts", 1e30, f"'ts' beyond int64 (1e+30 us after baseTimeNanoseconds {2**62})"),
        ("dur", 2**70, f"'dur' beyond int64 ({2**70} us)"),
        # each fits, the end does not: micro_trace's "b" starts at 2 us
        ("dur", 2**62 // 1000, f"'ts' + 'dur' beyond int64 (2 us + {2**62 // 1000} us after "),
    ],
)
def test_kineto_times_beyond_int64_rejected_per_event(tmp_path, field, value, message):
    # the event named as every other bad-event message names it (ph, name), not "event #2:" alone
    # with the store's column ('ts_ns') and the epoch ns (a float artifact for 1e30 to the eye)
    doc = micro_trace(["a", "b"], base_ns=2**62)
    doc["traceEvents"][2][field] = value  # event #2: "b"
    path = _write(tmp_path / "k", "rank0.json", doc)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1)
        assert f"{path}: event #2 (ph='X', name='b'): {message}" in str(e.value)
        res = ingest(store, [path], jobs=1, on_bad_event="skip")
        assert store.sql("SELECT name FROM events WHERE kind = 'cpu_op'")["name"].to_list() == ["a"]
        reason = message.split(" (")[0]
        assert store.runs()["issues"].to_list() == [f"1 rejected: {reason}"]
        # the skipped event named too, as every other skipped kind's first is (it was counted only)
        assert res.warnings[0] == (
            f"rank0.json: 1 record(s) not stored: 1 {reason} (first: event #2 (ph='X', name='b'))"
        )


@pytest.mark.parametrize(
    ("base_ns", "ts", "shown"),
    [
        (None, -20, "-20 us"),  # old style: epoch us
        (10_000, -20, "-20 us after baseTimeNanoseconds 10000"),  # 10,000 - 20,000 ns
    ],
)
def test_kineto_time_before_the_epoch_is_a_bad_event(tmp_path, base_ns, ts, shown):
    # A time before 1970 was stored as a negative ts_ns, silently, while a negative time is a bad
    # record in every other source (Flight Recorder, NCCL plugin, NDTimeline): named as the other
    # bad events, skipped and counted with --skip-bad-events, the first named. A ts below 0 whose
    # epoch time is not (base + ts >= 0) is an ordinary event: after base 10 us, "a" at ts -5 us
    # is at 10,000 - 5,000 = 5,000 ns; without a base "a" stays at ts 1 us (1,000 ns).
    doc = micro_trace(["a", "b"], base_ns=base_ns or 0)
    if base_ns is None:
        del doc["baseTimeNanoseconds"]
    else:
        doc["traceEvents"][1]["ts"] = -5  # event #1: "a"
    doc["traceEvents"][2]["ts"] = ts  # event #2: "b"
    path = _write(tmp_path / "k", "rank0.json", doc)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1)
        assert str(e.value) == (
            f"{path}: event #2 (ph='X', name='b'): 'ts' before the epoch ({shown}); pass "
            "--skip-bad-events to skip such events"
        )
        res = ingest(store, [path], jobs=1, on_bad_event="skip")
        rows = store.sql("SELECT name, ts_ns FROM events WHERE kind = 'cpu_op'").rows()
        assert rows == [("a", 5_000 if base_ns else 1_000)]
        assert store.runs()["issues"].to_list() == ["1 rejected: 'ts' before the epoch"]
        assert res.warnings[0] == (
            "rank0.json: 1 record(s) not stored: 1 'ts' before the epoch (first: event #2 (ph='X', name='b'))"
        )


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("name", 12345, "a number"),
        ("name", None, "null"),
        ("cat", 7.5, "a number"),
        ("cat", ["cpu_op"], "an array"),
        ("ph", True, "a boolean"),
    ],
)
def test_kineto_string_field_of_another_type_is_that_events_problem(tmp_path, field, value, kind):
    doc = micro_trace(["a", "b", "c"])
    doc["traceEvents"][2][field] = value  # event #2: "b" (ph X), the others as written
    path = _write(tmp_path / "k", "rank0.json", doc)
    reason = f"{field!r} is {kind}, not a string"  # e.g. 'name' is a number, not a string
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1)
        # the event's ph and name as the message quotes them: a value that is not a string as JSON
        shown = json.dumps(value) if field == "name" else "b"  # 12345, null
        ph = json.dumps(value) if field == "ph" else "X"  # true
        assert str(e.value) == (
            f"{path}: event #2 (ph={ph!r}, name={shown!r}): {reason}; pass --skip-bad-events to skip such events"
        )
        res = ingest(store, [path], jobs=1, on_bad_event="skip")
        # the step and the two other ops are stored; event #2 rejected and counted
        assert store.sql("SELECT name FROM events WHERE kind = 'cpu_op' ORDER BY ts_ns")[
            "name"
        ].to_list() == [
            "a",
            "c",
        ]
        assert store.runs()["issues"].to_list() == [f"1 rejected: {reason}"]
        # the warning names the event skipped, as the error did
        assert res.warnings[0] == (
            f"rank0.json: 1 record(s) not stored: 1 {reason} (first: event #2 (ph={ph!r}, name={shown!r}))"
        )


@pytest.mark.parametrize(
    ("value", "kind"), [(1, "a number"), ("x", "a string"), (None, "null"), ([], "an array")]
)
def test_kineto_entry_that_is_not_an_object_is_that_entrys_problem(tmp_path, value, kind):
    doc = micro_trace(["a", "b"])
    doc["traceEvents"].insert(1, value)  # entry #1: not an event
    path = _write(tmp_path / "k", "rank0.json", doc)
    reason = f"entry is {kind}, not an object"
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1)
        assert str(e.value) == f"{path}: event #1: {reason}; pass --skip-bad-events to skip such events"
        res = ingest(store, [path], jobs=1, on_bad_event="skip")
        names = store.sql("SELECT name FROM events WHERE kind = 'cpu_op' ORDER BY ts_ns")["name"].to_list()
        assert names == ["a", "b"]  # both events stored, the entry between them counted
        assert store.runs()["issues"].to_list() == [f"1 rejected: {reason}"]
        assert res.warnings[0] == f"rank0.json: 1 record(s) not stored: 1 {reason} (first: event #1)"


def test_kineto_nan_and_infinity_are_named_and_read_as_null_when_skipping(tmp_path):
    doc = micro_trace(["a", "b", "c"])
    doc["traceEvents"][1]["dur"] = float("nan")  # "a": json.dumps writes NaN (not JSON)
    doc["traceEvents"][3]["args"] = {"x": float("-inf"), "note": "NaN, Infinity"}  # "c": kept
    text = json.dumps(doc).encode()  # allow_nan: NaN and -Infinity tokens
    path = _write(tmp_path / "k", "rank0.json", text)
    at = text.index(b"NaN")
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1)
        assert str(e.value).startswith(f"{path}: byte {at}: NaN is not a JSON number")
        res = ingest(store, [path], jobs=1, on_bad_event="skip")
        rows = store.sql("SELECT name, args FROM events WHERE kind = 'cpu_op' ORDER BY ts_ns").rows()
        # "a" rejected; "c"'s -Infinity read as null, the same text inside a string left as it is
        assert [r[0] for r in rows] == ["b", "c"]
        assert json.loads(rows[1][1]) == {"x": None, "note": "NaN, Infinity"}
        # each word counted in the store (the issues column) and located in the warning: the NaN is
        # event #1's dur, the -Infinity event #3's args (the ProfilerStep is event #0)
        inf = text.index(b"-Infinity")
        assert store.runs()["issues"].to_list() == [
            "1 rejected: 'dur' is null; 1 repaired: NaN read as null; 1 repaired: -Infinity read as null"
        ]
        assert res.warnings[:2] == [
            "rank0.json: 2 NaN/Infinity value(s) (not JSON) read as null: 1 NaN, 1 -Infinity "
            f"(first: event #1 at byte {at}, event #3 at byte {inf})",
            "rank0.json: 1 record(s) not stored: 1 'dur' is null (first: event #1 (ph='X', name='a'))",
        ]


#: Where a float is not finite, the words writers put for it (nonfinite's module doc): Python's json
#: (NaN, -Infinity), JSON5 (+Infinity, -NaN), C's printf / C++ / {fmt} (nan, -nan, inf, -inf; with %F,
#: %E, %G: INF, -INF, NAN, -NAN), Go (+Inf).
WRITERS_WORDS = ["NaN", "-NaN", "+Infinity", "-Infinity", "nan", "-nan", "inf", "-inf", "+Inf"]
WRITERS_WORDS += ["INF", "-INF", "NAN", "-NAN"]  # were refused: "'INF' is not a JSON value"


def _with_word(tmp_path: Path, word: str, *, begin_end: bool = False) -> tuple[Path, bytes]:
    """micro_trace(["a", "b"]) with b's args {"x": WORD, "note": "WORD"} (the one in the string kept);
    with ``begin_end`` an extra B/E pair, which only the general path reads."""
    doc = micro_trace(["a", "b"])
    doc["traceEvents"][2]["args"] = {"x": "@", "note": word}
    if begin_end:
        doc["traceEvents"] += [
            {"ph": "B", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 10},
            {"ph": "E", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 11},
        ]
    text = json.dumps(doc).replace('"@"', word).encode()
    return _write(tmp_path / "k", "rank0.json", text), text


@pytest.mark.parametrize("begin_end", [False, True], ids=["fast", "general"])
@pytest.mark.parametrize("word", WRITERS_WORDS)
def test_kineto_number_words_writers_emit_are_read_as_null_when_skipping(tmp_path, word, begin_end):
    # -NaN, +Infinity, nan, -nan, inf, +Inf got the skip hint, and --skip-bad-events then failed with
    # "invalid JSON" (only NaN, Infinity and -Infinity were read as null)
    path, text = _with_word(tmp_path, word, begin_end=begin_end)
    at = text.index(b'x": ') + len(b'x": ')  # the word's first byte (its sign's, if any)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1)
        assert str(e.value).startswith(f"{path}: byte {at}: {word} is not a JSON number")
        assert "pass --skip-bad-events to read each as null" in str(e.value)
        res = ingest(store, [path], jobs=1, on_bad_event="skip")
        args = store.sql("SELECT args FROM events WHERE name = 'b'").rows()[0][0]
        assert json.loads(args) == {"x": None, "note": word}
        assert store.runs()["issues"].to_list() == [f"1 repaired: {word} read as null"]
        # the streaming decode located it before the B/E pair sent the file to the general path
        assert res.warnings[0] == (
            f"rank0.json: 1 NaN/Infinity value(s) (not JSON) read as null: 1 {word} (first: event #2 at byte {at})"
        )


@pytest.mark.parametrize("begin_end", [False, True], ids=["fast", "general"])
@pytest.mark.parametrize("word", ["NaNx", "nanny", "-nan(ind)", "Infinite", "1.#QNAN", "-1.#IND", "1.#INF00"])
def test_kineto_other_words_are_refused_naming_the_byte(tmp_path, word, begin_end):
    # NaNx got the skip hint (NaN matched its start) and then "invalid JSON"; no writer emits these
    # for a number: refused in both modes, naming the byte and the word, the store left as it was.
    # MSVC's 1.#QNAN (its digits vary with the format: 1.#INF00 with %f) got "invalid JSON (JSON is
    # malformed: invalid number (byte N))", N its "#"
    path, text = _with_word(tmp_path, word, begin_end=begin_end)
    at = text.index(b'x": ') + len(b'x": ')
    with Store(tmp_path / "s.duckdb") as store:
        for mode in ("raise", "skip"):
            with pytest.raises(TraceFormatError) as e:
                ingest(store, [path], jobs=1, on_bad_event=mode)
            assert str(e.value).startswith(f"{path}: byte {at}: {word!r} is not a JSON value (")
            assert "pass --skip-bad-events" not in str(e.value)
        assert store.runs().height == 0


def test_kineto_number_words_on_the_fast_path_and_located_across_batches(tmp_path, monkeypatch):
    # --skip-bad-events on a file with a NaN read the whole text as Python objects through the general
    # path (df_index_resolver with one NaN: 11.6 s, 1.1 GB); the words are now read as null by the
    # streaming decode, whose batches (here of 4 KiB) each locate theirs
    import importlib

    from traceprof.collectors.kineto import decode as dec

    kineto_parse = importlib.import_module(
        "traceprof.collectors.kineto.parse"
    )  # the package's parse() hides it

    doc = micro_trace([f"op{i}" for i in range(400)])
    words = {5: "NaN", 150: "-inf", 399: "Infinity"}  # event index (ProfilerStep is #0) -> word
    for i, ev in enumerate(doc["traceEvents"]):
        ev["args"] = {"External id": f"@{i}" if i in words else i}
    text = json.dumps(doc, indent=1)
    for i, w in words.items():
        text = text.replace(f'"@{i}"', w)
    path = _write(tmp_path / "k", "rank0.json", text.encode())
    monkeypatch.setattr(dec, "BATCH_BYTES", 4096)
    monkeypatch.setattr(dec.decode, "__defaults__", (4096, None, None, None))
    monkeypatch.setattr(
        kineto_parse._Source, "data", lambda self: pytest.fail("read whole: the general path")
    )
    with Store(tmp_path / "s.duckdb") as store:
        res = ingest(store, [path], jobs=1, on_bad_event="skip")
        assert store.sql(
            "SELECT count(*) FROM events WHERE external_id IS NULL AND kind = 'cpu_op'"
        ).rows() == [(3,)]
    offsets = [
        text.encode().index(f'External id": {w}'.encode()) + len(b'External id": ') for w in words.values()
    ]
    located = ", ".join(f"event #{i} at byte {o}" for i, o in zip(words, offsets, strict=True))
    assert res.warnings[0] == (
        f"rank0.json: 3 NaN/Infinity value(s) (not JSON) read as null: 1 NaN, 1 -inf, 1 Infinity (first: {located})"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # was stored as a run with no events (with a warning)
        (b'{"traceEvents": []}', "empty: traceEvents holds no event (an empty capture?); nothing stored"),
        (b'{"baseTimeNanoseconds": 5, "traceEvents": [ ]}', "empty: traceEvents holds no event"),
        # only metadata (a process name): was stored as a run with no events, silently
        (
            b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "py"}}]}',
            "empty: no event to store (of 1 read: 1 metadata); nothing stored",
        ),
        # was "valid JSON but not a Kineto trace (...): a bare array of events"
        (b"[]", "empty: a JSON array with no events in it ([])"),
        (b" [\n] ", "empty: a JSON array with no events in it ([])"),
    ],
)
def test_kineto_an_empty_trace_is_refused_saying_so(tmp_path, text, said):
    path = _write(tmp_path / "k", "rank0.json", text)
    with Store(tmp_path / "s.duckdb") as store:
        ingest(
            store, [_write(tmp_path / "ok", "rank0.json", json.dumps(micro_trace(["a"])).encode())], jobs=1
        )
        before = store.sql("SELECT count(*) FROM events").rows()
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1)
        assert str(e.value).startswith(f"{path}: {said}")
        assert "bare array" not in str(e.value)
        assert store.runs().height == 1 and store.sql("SELECT count(*) FROM events").rows() == before
    code, _, err = run("ingest", str(path), "--db", str(tmp_path / "t.duckdb"))
    assert code == 1 and f"{path}: {said}" in err


def test_kineto_a_trace_whose_every_event_is_rejected_is_refused_as_empty(tmp_path):
    # --skip-bad-events rejected its one event (dur null) and stored a run with no events, silently
    doc = micro_trace([])
    doc["traceEvents"][0]["dur"] = None
    doc["traceEvents"].append({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}})
    path = _write(tmp_path / "k", "rank0.json", doc)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1, on_bad_event="skip")
        assert str(e.value) == (
            f"{path}: empty: no event to store (of 2 read: 1 metadata, 1 rejected ('dur' is null)); nothing stored"
        )
        assert store.runs().height == 0


def test_kineto_bare_array_of_events_is_refused_saying_so(tmp_path):
    path = _write(tmp_path / "k", "timeline.json", micro_trace(["a"])["traceEvents"])
    with Store(tmp_path / "s.duckdb") as store, pytest.raises(TraceFormatError) as e:
        ingest(store, [path], jobs=1)
    assert "no top-level traceEvents): a bare array of events" in str(e.value)


def test_kineto_device_and_step_beyond_int32(tmp_path):
    doc = micro_trace(["a"])
    doc["traceEvents"].append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 2,
            "dur": 1,
            "args": {"device": 2**40, "stream": 7},
        }
    )
    path = _write(tmp_path / "d", "rank0.json", doc)
    with pytest.raises(
        TraceFormatError, match=r"event #2 \(ph='X', name='k'\): 'device' beyond int32 \(1099511627776\)"
    ):
        _ingest(tmp_path, path)[0].close()
    doc = micro_trace(["a"])
    doc["traceEvents"][0]["name"] = "ProfilerStep#99999999999"
    path = _write(tmp_path / "s", "rank0.json", doc)
    with (
        Store(tmp_path / "t.duckdb") as store,
        pytest.raises(
            TraceFormatError,
            match=r"event #0 \(ph='X', name='ProfilerStep#99999999999'\): 'step' beyond int32 \(99999999999\)",
        ),
    ):
        ingest(store, [path], jobs=1)


def test_collective_bytes_beyond_int64_drop_the_collective_only(tmp_path):
    # 2**62 float32 elements are 2**64 bytes: the kernel is kept, its collective row is not.
    doc = micro_trace([])
    doc["traceEvents"].append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "pid": 0,
            "tid": 7,
            "ts": 2,
            "dur": 1,
            "args": {
                "device": 0,
                "stream": 7,
                **collective_args(pg=None, nelems=2**62, out_nelems=2**62),
            },
        }
    )
    path = _write(tmp_path / "c", "rank0.json", doc)
    store, res = _ingest(tmp_path, path)
    assert store.sql("SELECT count(*) AS n FROM events WHERE kind = 'kernel'")["n"].to_list() == [1]
    assert store.sql("SELECT count(*) AS n FROM collectives")["n"].to_list() == [0]
    assert store.runs()["issues"].to_list() == ["1 rejected: collective: 'bytes_in' beyond int64"]
    store.close()


def _comm_kernel(**args) -> dict:
    """A micro trace (event #0 the ProfilerStep) whose event #1 is an all-reduce kernel with these args."""
    doc = micro_trace([])
    doc["traceEvents"].append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "pid": 0,
            "tid": 7,
            "ts": 2,
            "dur": 1,
            "args": {
                "device": 0,
                "stream": 7,
                **collective_args(seq=3, pg=None, nelems=4, **args),
            },
        }
    )
    return doc


@pytest.mark.parametrize(
    ("key", "value", "reason", "shown"),
    [
        # a JSON integer beyond int64 was stored as a NULL seq, silently (a float such as 1e300 is
        # no integer: ignored, test_kineto_seq_that_is_not_an_integer_is_ignored_with_a_warning)
        ("Seq", 12 * 10**28, "'seq' beyond int64", "120000000000000000000000000000"),
        ("In msg nelems", 2**63, "'nelems_in' beyond int64", str(2**63)),
        ("In msg nelems", -4, "negative 'nelems_in'", "-4"),  # was stored as -16 bytes
        ("Group size", 2**31, "'group_size' beyond int32", str(2**31)),
    ],
)
def test_kineto_collective_number_that_cannot_be_stored_names_the_event(tmp_path, key, value, reason, shown):
    # The kernel (event #1) is kept; its collective row is not, and the warning says which event held what.
    path = tmp_path / "c" / "rank0.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_comm_kernel(**{key: value})))  # 1e300 is written as the JSON number 1e+300
    for mode in ("raise", "skip"):
        with Store(tmp_path / f"{mode}.duckdb") as store:
            res = ingest(store, [path], jobs=1, on_bad_event=mode)
            assert store.sql("SELECT count(*) AS n FROM events WHERE kind = 'kernel'")["n"].to_list() == [1]
            assert store.sql("SELECT count(*) AS n FROM collectives")["n"].to_list() == [0]
            assert store.runs()["issues"].to_list() == [f"1 rejected: collective: {reason}"]
            assert (
                f"rank0.json: 1 collective row(s) not stored (their events are): {reason}, e.g. {shown} "
                "(events #1)"
            ) in res.warnings


@pytest.mark.parametrize("value", ["abc", 1.5, True, [3], "7", 7.0, 1e300])
def test_kineto_seq_that_is_not_an_integer_is_ignored_with_a_warning(tmp_path, value):
    # A Seq of 1.5 was stored as 1, "abc" as NULL, both silently: now NULL, and the warning names event #1.
    # A record's number is a JSON integer (traceprof.core.values.record_int, as in the Flight
    # Recorder and NCCL readers): "7" and 7.0 were read as 7 silently, 1e300 refused the row.
    path = _write(tmp_path / "c", "rank0.json", _comm_kernel(Seq=value))
    store, res = _ingest(tmp_path, path)
    assert store.sql("SELECT seq, op, nelems_in, bytes_in FROM collectives").rows() == [
        (None, "all_reduce", 4, 16)
    ]
    assert (
        f"rank0.json: 1 value(s) ignored, read as absent: 'Seq' not an integer, e.g. {value!r} (events #1)"
        in res.warnings
    )
    store.close()


@pytest.mark.parametrize(
    ("key", "value", "column"),
    [
        # named as the dump spells the field (it was the store column: enter_ns, seq)
        ("time_created_ns", 2**70, "time_created_ns"),
        ("collective_seq_id", 2**70, "collective_seq_id"),
        ("input_sizes", [[2**70]], "nelems_in"),  # a product of the sizes: no field holds it
    ],
)
def test_flight_recorder_integers_beyond_int64(tmp_path, key, value, column):
    doc = copy.deepcopy(FR)
    doc["entries"].append({**doc["entries"][0], "record_id": 1, "collective_seq_id": 2, key: value})
    path = _write(tmp_path / "fr", "rank0.fr.json", doc)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError) as e:
            ingest(store, [path], jobs=1)
        assert str(e.value).startswith(f"{path}: entry #1 ('nccl:all_reduce'): '{column}' beyond int64 (")
        ingest(store, [path], jobs=1, on_bad_event="skip")
        assert store.sql("SELECT count(*) AS n FROM collectives")["n"].to_list() == [1]
        assert store.runs()["issues"].to_list() == [f"1 rejected: '{column}' beyond int64"]


def test_ndtimeline_step_beyond_int32(tmp_path):
    src = CORPUS / "kineto_misc/bytedance_straggler_whatif/trace-ST.parquet"
    if not src.exists():
        pytest.skip("corpus not available")
    df = pl.read_parquet(src).head(40)
    df = df.with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(2**40).otherwise(pl.col("step")).alias("step")
    )
    path = tmp_path / "trace-big.parquet"
    df.write_parquet(path)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(TraceFormatError, match=r"row #3 .*: 'step' beyond int32 \(1099511627776\)"):
            ingest(store, [path], jobs=1)
        ingest(store, [path], jobs=1, on_bad_event="skip")
        assert store.sql("SELECT sum(events_read)::INT AS n FROM traces")["n"].to_list() == [39]


def test_rank_beyond_int32_is_an_error(tmp_path):
    doc = micro_trace(["a"], rank=2**40)
    del doc["distributedInfo"]["world_size"]  # else the parser's rank < world_size check answers first
    path = _write(tmp_path / "r", "rank0.json", doc)
    with pytest.raises(StoreError, match=r"rank0.json: rank 1099511627776 is beyond int32"):
        _ingest(tmp_path, path)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "rank0.json",
            b'{"traceEvents": [{"ph": "X", "args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
            "nested too deeply",
        ),
        ("rank0.fr.json", b'{"entries": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", "nested too deeply"),
    ],
)
def test_deep_nesting_is_an_error_not_a_crash(tmp_path, name, text, message):
    path = _write(tmp_path / "n", name, text)
    with pytest.raises(TraceFormatError, match=message) as e:
        _ingest(tmp_path, path)
    assert str(e.value).startswith(str(path))


def test_truncated_files_name_the_byte_offset(tmp_path):
    raw = json.dumps(micro_trace(["a"])).encode()
    path = _write(tmp_path / "t", "rank0.json", raw[:100])
    with pytest.raises(TraceFormatError, match=rf"^{path}: byte 100: truncated JSON"):
        _ingest(tmp_path, path)
    gz = gzip.compress(raw)
    path = _write(tmp_path / "z", "rank0.json.gz", gz[:40])
    with pytest.raises(TraceFormatError, match=rf"^{path}: byte 40: broken gzip stream \(truncated"):
        _ingest(tmp_path, path)


def test_non_trace_json_array_in_a_directory_is_skipped(tmp_path):
    d = tmp_path / "run"
    _write(d, "rank0.json", micro_trace(["a"]))
    _write(d, "config.json", b"[1, 2, 3]")
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 0, err
    assert (
        f"warning: skipped {d / 'config.json'}: valid JSON but not a Kineto trace (no top-level traceEvents)"
        in err
    )


def _four(tmp_path: Path) -> Path:
    d = tmp_path / "run4"
    for r in range(4):
        _write(d, f"rank{r}.json", micro_trace(["a"], rank=r, world=4))
    (d / "rank2.json").write_bytes(b'{"traceEvents": [')
    return d


def test_one_broken_file_refuses_all_and_says_partial(tmp_path):
    d = _four(tmp_path)
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1
    assert err.splitlines() == [
        f"error: {d / 'rank2.json'}: byte 17: truncated JSON (Input data was truncated); "
        "nothing stored (--partial stores the other files)"
    ]
    assert not (tmp_path / "s.duckdb").exists()  # a failed first ingest leaves no store


def test_partial_stores_the_good_files_and_lists_the_bad(tmp_path):
    d = _four(tmp_path)
    (d / "rank3.json").write_bytes(b"\x00garbage")
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(d), "--db", str(db))
    assert code == 1 and err.splitlines()[0] == (
        "error: 2 of 4 files cannot be read, nothing stored (--partial stores the others):"
    )
    assert len(err.splitlines()) == 3
    code, _, err = run("ingest", str(d), "--db", str(db), "--partial")
    assert code == 1
    failed = [ln for ln in err.splitlines() if ln.startswith("failed:")]
    assert failed == [
        f"failed: {d / 'rank2.json'}: byte 17: truncated JSON (Input data was truncated)",
        f"failed: {d / 'rank3.json'}: invalid JSON (JSON is malformed: invalid character (byte 0))",
    ]
    assert err.splitlines()[-1] == "2 file(s) ingested, 0 already stored, 2 failed"
    with Store(db, read_only=True) as store:
        assert store.sql("SELECT rank FROM traces ORDER BY rank")["rank"].to_list() == [0, 1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t["distributedInfo"].update(world_size=8), "world size 8, but run 'job' has 2"),
        (lambda t: t["distributedInfo"].update(backend="nccl"), "backend 'nccl', but run 'job' has 'gloo'"),
        (
            lambda t: t.update(baseTimeNanoseconds=t["baseTimeNanoseconds"] + 86_400 * 10**9),
            "recorded 24.0 h away from the traces of run 'job'",
        ),
        (
            lambda t: t.update(deviceProperties=[{"id": 0, "name": "NVIDIA H100"}]),
            "device 'nvidia h100', but run 'job' has 'cpu'",
        ),
    ],
)
def test_appending_another_jobs_trace_is_refused(tmp_path, change, message):
    db = str(tmp_path / "s.duckdb")
    _write(tmp_path / "a", "rank0.json", micro_trace(["a"], rank=0, world=2))
    other = micro_trace(["a"], rank=1, world=2)
    change(other)
    b = _write(tmp_path / "b", "rank1.json", other)
    assert run("ingest", str(tmp_path / "a"), "--run", "job", "--db", db)[0] == 0
    code, _, err = run("ingest", str(b), "--run", "job", "--db", db)
    assert code == 1 and err.startswith(f"error: {b}: {message}")
    assert err.rstrip().endswith(
        "a trace of another job; ingest it as another run (--run NAME); if it does "
        "belong to this run, pass --force-run"
    )
    code, _, err = run("ingest", str(b), "--run", "job", "--db", db, "--force-run")
    assert code == 0, err


def test_private_clock_sources_are_not_compared_in_time(tmp_path):
    # An NCCL profiler-plugin trace carries steady-clock times (ingest places them later): its
    # span, a day away from the run, is no sign of another job; a Kineto trace there is.
    import pyarrow as pa

    from traceprof.core.parsed import ParsedTrace
    from traceprof.storage.identity import check_append

    with Store(tmp_path / "s.duckdb") as store:
        ingest(store, [_write(tmp_path / "a", "rank0.json", micro_trace(["a"]))], run="job", jobs=1)
        far = pa.table({"ts_ns": [86_400 * 10**9], "dur_ns": [1]})
        for source, refused in (("nccl_profiler", False), ("kineto", True)):
            pt = ParsedTrace(
                path="x", sha256="", bytes=0, source=source, format="", rank=1, world_size=None, events=far
            )
            if refused:
                with pytest.raises(StoreError, match="away from the traces of run 'job'"):
                    check_append(store.con, 1, "job", [pt])
            else:
                check_append(store.con, 1, "job", [pt])
