"""Flight Recorder dump variants that current and older torch versions write (issue 28, kind 2):
a rank whose ring buffer was empty when it dumped, version 1.x dumps (``seq_id``), and coalesced
groups (torch 2.7+ records each member under one ``collective_seq_id``). Each dump is written
here, in JSON and as torch pickles it (read through ``safe_pickle``), in the shape torch's
``FlightRecorder::dump_json`` / ``dump`` give it; expected answers are worked in the tests."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import analyze
from traceprof.collectors.flight_recorder.parse import parse
from traceprof.core.errors import AnalysisError, NotATraceError, TraceFormatError
from traceprof.core.parsed import ParseOptions
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

T0 = 1_767_225_601_000_000_000  # epoch ns of seq 1's enqueue; each seq 1 ms later


def _entry(
    seq: int,
    rank: int,
    *,
    name: str = "nccl:all_reduce",
    size: int = 1024,
    dtype: str = "Float",
    state: str = "completed",
    p2p: bool = False,
    record: int = 0,
    offset: int = 0,
) -> dict[str, Any]:
    """One 2.x entry of group "0": created T0 + seq ms (+ rank us + offset ns), started 10 us later,
    completed 600 us after creation when ``state`` is completed."""
    created = T0 + seq * 1_000_000 + rank * 1_000 + offset
    done = state == "completed"
    return {
        "record_id": record,
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "op_id": record + 1,
        "profiling_name": name,
        "time_created_ns": created,
        "time_discovered_started_ns": created + 10_000 if state != "scheduled" else 0,
        "time_discovered_completed_ns": created + 600_000 if done else 0,
        "input_sizes": [[size]] if size else [],
        "input_dtypes": [dtype] if size else [],
        "output_sizes": [[size]] if size else [],
        "output_dtypes": [dtype] if size else [],
        "state": state,
        "retired": done,
        "is_p2p": p2p,
        "timeout_ms": 600000,
        "thread_id": "140000000000000",
        "thread_name": "python",
    }


def _dump(entries: list[dict[str, Any]] | None, ranks: int, last: int) -> dict[str, Any]:
    """A 2.10 dump of group "0" (members 0..ranks-1); pg_status says seq ``last`` enqueued,
    started and completed (JSON writes these numbers as strings). ``entries`` None: no key."""
    doc: dict[str, Any] = {
        "version": "2.10",
        "comm_lib_version": "2.27.7",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(ranks)))}},
        "pg_status": {"0": {f"last_{k}_collective": str(last) for k in ("enqueued", "started", "completed")}},
        "nccl_comm_state": {},
    }
    if entries is not None:
        doc["entries"] = entries
    return doc


def _write(folder: Path, rank: int, doc: dict[str, Any], fmt: str) -> None:
    """JSON (``rank<R>.fr.json``) or torch's pickle (``nccl_trace_rank_<R>``, tuples where torch has them)."""
    folder.mkdir(exist_ok=True)
    if fmt == "json":
        (folder / f"rank{rank}.fr.json").write_text(json.dumps(doc))
        return
    d = dict(doc)
    if "entries" in d:
        d["entries"] = [
            {**e, "process_group": tuple(e["process_group"])} if "process_group" in e else e
            for e in d["entries"]
        ]
    for st in d.get("pg_status", {}).values():  # the pickle dump holds integers
        st.update({k: int(v) for k, v in st.items()})
    (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(d, protocol=2))


def _desync(store, folder: Path):
    res = ingest(store, [folder], run="run", jobs=1)
    d = analyze(store, "desync", "run", all=True)
    return res, d, d.verdict.row(0, named=True)


# --- 1. a rank whose ring buffer was empty when it dumped -------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "pickle"])
def test_empty_ring_buffer_rank_recorded_nothing(store, tmp_path, fmt):
    """Ranks 0 and 1 completed seq 1..3; rank 2 dumped with an empty ring buffer: its JSON dump
    has no ``entries`` key (torch leaves it out), its pickle an empty list, and every pg_status
    value is -1. It is stored (0 collectives, ``recorded_nothing``), and desync names it: status
    recorded_nothing, behind [2], each of seq 1..3 missing on rank 2 only."""
    run = tmp_path / "run"
    for r in (0, 1):
        _write(run, r, _dump([_entry(s, r, record=s - 1) for s in (1, 2, 3)], 3, 3), fmt)
    empty = _dump(None if fmt == "json" else [], 3, -1)
    _write(run, 2, empty, fmt)
    res, d, v = _desync(store, run)
    name = "rank2.fr.json" if fmt == "json" else "nccl_trace_rank_2"
    how = "no 'entries' in the dump" if fmt == "json" else "empty 'entries'"
    assert (
        f"{name}: rank 2 recorded no collective ({how}, every pg_status -1: dumped before any ran on this "
        "rank, or TORCH_NCCL_TRACE_BUFFER_SIZE=0); stored with 0 collectives" in res.warnings
    )
    assert store.sql(
        "SELECT rank, json_extract(meta, '$.recorded_nothing')::BOOLEAN FROM traces ORDER BY rank"
    ).rows() == [(0, False), (1, False), (2, True)]
    assert (v["status"], v["behind"]) == ("recorded_nothing", [2])
    assert v["text"] == (
        f"rank(s) 2 ({name}) recorded nothing while the others enqueued up to seq 3: a rank that "
        "hung or crashed before its first collective (or ran with TORCH_NCCL_TRACE_BUFFER_SIZE=0) "
        "is the one to look at"
    )
    assert d.frame.select("seq", "status", "ranks_missing").rows() == [(s, "missing", [2]) for s in (1, 2, 3)]


@pytest.mark.parametrize(("last", "said"), [(-1, "recorded no collective"), (17, "dump holds no entries")])
def test_an_empty_dump_gets_one_warning(store, tmp_path, last, said):
    """4 ranks, every dump with an empty ``entries`` list, pg_status -1 (nothing ran) or 17 (a dump
    of active entries only; t10's fr_empty). Each file's warning is the parser's, which says why it
    holds nothing: 4 warnings, one per file. Ingest's own "no events in the trace (an empty
    capture?)" was a second one per file for the same cause (8 in all)."""
    run = tmp_path / "run"
    for r in range(4):
        _write(run, r, _dump([], 4, last), "json")
    res = ingest(store, [run], run="run", jobs=1)
    per_file = [[w for w in res.warnings if w.startswith(f"rank{r}.fr.json:")] for r in range(4)]
    assert [len(ws) for ws in per_file] == [1, 1, 1, 1]
    assert all(said in ws[0] for ws in per_file)
    assert not [w for w in res.warnings if "no events in the trace" in w]


@pytest.mark.parametrize("last,status,behind", [(3, "clean", []), (2, "missing", [2])])
def test_dump_without_entries_but_with_progress_is_read_by_its_progress(
    store, tmp_path, last, status, behind
):
    """Rank 2's dump holds no entries but its pg_status says it enqueued (and completed) up to
    ``last`` (a dump of active entries only): it did not record nothing. desync takes it into
    group "0" (pg_id 0, as the others' entries say) by that progress: at last = 3 every seq 1..3
    is enqueued and completed everywhere (clean); at last = 2, seq 3 was never enqueued on rank 2."""
    run = tmp_path / "run"
    for r in (0, 1):
        _write(run, r, _dump([_entry(s, r, record=s - 1) for s in (1, 2, 3)], 3, 3), "json")
    _write(run, 2, _dump(None, 3, last), "json")
    res, d, v = _desync(store, run)
    assert (
        f"rank2.fr.json: rank 2's dump holds no entries (no 'entries' in the dump) although its pg_status "
        f"says it enqueued up to seq {last} in pg_id 0 (a dump of active entries only, or without collectives); "
        "stored with 0 collectives, its progress kept for desync"
    ) in res.warnings
    assert (v["status"], v["behind"]) == (status, behind)
    r2 = d.ranks.filter(rank=2).row(0, named=True)
    assert (r2["last_enqueued"], r2["last_completed"]) == (last, last)
    assert d.frame.filter(pl.col("ranks_missing").list.len() > 0)["seq"].to_list() == (
        [] if last == 3 else [3]
    )


def test_all_dumps_without_entries_is_an_error_with_the_progress(store, tmp_path):
    run = tmp_path / "run"
    for r, last in ((0, 3), (1, 2)):
        _write(run, r, _dump(None, 2, last), "json")
    ingest(store, [run], run="run", jobs=1)
    with pytest.raises(
        AnalysisError,
        match=r"dumps hold no entries, only progress \(rank 0: pg_id 0 enqueued 3 "
        r"completed 3; rank 1: pg_id 0 enqueued 2 completed 2\)",
    ):
        analyze(store, "desync", "run")


def test_a_document_that_is_no_dump_is_still_not_a_trace(tmp_path):
    from traceprof.core.errors import NotATraceError

    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({"version": "2.10"}))  # neither entries nor pg_config / pg_status
    with pytest.raises(NotATraceError, match="not a Flight Recorder dump"):
        parse(path)


# --- 2. older dumps: version 1.x numbers every op with seq_id ------------------------------------------


def _v1_entry(seq: int, rank: int, name: str = "nccl:all_reduce", size: int = 1024) -> dict[str, Any]:
    """A version 1.x entry: ``seq_id`` and ``pg_id``, no collective_seq_id / p2p_seq_id / is_p2p."""
    created = T0 + seq * 1_000_000 + rank * 1_000
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "seq_id": seq,
        "profiling_name": name,
        "time_created_ns": created,
        "duration_ms": 0.5,
        "input_sizes": [[size]],
        "output_sizes": [[size]],
        "state": "completed",
        "retired": True,
    }


@pytest.mark.parametrize("fmt", ["json", "pickle"])
def test_version_1_dumps_are_numbered_by_seq_id(store, tmp_path, fmt):
    """Two ranks, version "1.5", no pg_status, no process_group (pg = pg_id "0"). Seq 1..3 are read
    from ``seq_id`` (never NULL): 3 instances of ranks [0, 1] matched on (pg, seq). Rank 1's seq 2
    is a broadcast where rank 0 all-reduces: with two ranks that is a tie (both named); rank 0's
    all_reduce arrives at T0 + 2 ms, rank 1 1 us later."""
    run = tmp_path / "run"
    for r in (0, 1):
        entries = [
            _v1_entry(s, r, "nccl:broadcast" if (r, s) == (1, 2) else "nccl:all_reduce") for s in (1, 2, 3)
        ]
        _write(
            run,
            r,
            {
                "version": "1.5",
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                "entries": entries,
            },
            fmt,
        )
    res, d, v = _desync(store, run)
    assert not any("version" in w for w in res.warnings)
    assert store.sql("SELECT rank, pg, seq, op FROM collectives ORDER BY rank, seq").rows() == [
        (r, "0", s, "broadcast" if (r, s) == (1, 2) else "all_reduce") for r in (0, 1) for s in (1, 2, 3)
    ]
    assert store.sql(
        "SELECT seq, ranks_present, match_method, arrival_skew_ns FROM collective_instances ORDER BY seq"
    ).rows() == [(s, [0, 1], "pg_seq", 1_000) for s in (1, 2, 3)]
    assert (v["status"], v["seq"], v["behind"]) == ("mismatch", 2, [0, 1])
    assert "ranks 0 and 1 disagree on op with no majority (rank 0 all_reduce, rank 1 broadcast)" in v["text"]


def test_unreadable_version_is_named_and_why(tmp_path):
    """Entries numbered by no field this parser knows: refused naming the version (never stored
    with NULL sequence numbers)."""
    path = tmp_path / "rank0.fr.json"
    entry = {k: v for k, v in _v1_entry(1, 0).items() if k != "seq_id"} | {"sequence": 1}
    path.write_text(json.dumps({"version": "0.9", "entries": [entry]}))
    with pytest.raises(TraceFormatError) as e:
        parse(path)
    assert str(e.value) == (
        f"{path}: entries: Flight Recorder dump version '0.9': its entries carry neither "
        "'collective_seq_id' / 'p2p_seq_id' nor 'seq_id', so its collectives cannot be numbered; "
        "traceprof reads versions 1.x (seq_id) and 2.x (collective_seq_id / p2p_seq_id; up to "
        "2.10)"
    )


def _version_notes(pt: Any) -> list[str]:
    """The dump's version notes (``traces.meta.version_notes``: said once per run at ingest)."""
    return json.loads(pt.trace["meta"]).get("version_notes", [])


def test_version_notes_are_said_once_per_run(store, tmp_path):
    """Four ranks' dumps of version 2.99: one warning for the run, counting the files and naming the
    first 3 (it was one identical warning per file, 4)."""
    folder = tmp_path / "job"
    for r in range(4):
        _write(folder, r, {**_dump([_entry(1, r)], 4, 1), "version": "2.99"}, "json")
    res = ingest(store, [folder], jobs=1)
    assert [w for w in res.warnings if "version" in w] == [
        "run 'job': Flight Recorder dump version 2.99 is newer than the versions traceprof knows (1.x (seq_id) "
        "and 2.x (collective_seq_id / p2p_seq_id; up to 2.10)); read by its fields as version 2.x "
        "(4 file(s): rank0.fr.json, rank1.fr.json, rank2.fr.json and 1 more)"
    ]


@pytest.mark.parametrize("version", ["2.99", "2.11"])
def test_newer_version_with_known_fields_is_read_with_a_warning(tmp_path, version):
    # a 2.x minor past 2.10 (the newest known: "2.99" was read without a word); minors add fields
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({**_dump([_entry(1, 0)], 1, 1), "version": version}))
    pt = parse(path)
    assert _version_notes(pt) == [
        f"Flight Recorder dump version {version} is newer than the versions traceprof "
        "knows (1.x (seq_id) and 2.x (collective_seq_id / p2p_seq_id; up to 2.10)); read by its "
        "fields as version 2.x"
    ]
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1]


@pytest.mark.parametrize("version", ["3.0", 3])
def test_unknown_major_version_says_what_was_assumed(tmp_path, version):
    """A major version changes what fields mean (torch's convention): version 3.0 was "newer ...
    read by its fields as version 2.x", as a 2.11 is; now the warning names the file and the
    version and says plainly which reading was assumed. The integer 3 is read as "3"."""
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({**_dump([_entry(1, 0)], 1, 1), "version": version}))
    pt = parse(path)
    assert _version_notes(pt)[-1] == (
        f"Flight Recorder dump version {version}: major version 3 is unknown to traceprof "
        "(1.x (seq_id) and 2.x (collective_seq_id / p2p_seq_id; up to 2.10)); assumed its entries mean "
        "what version 2.x's do, as their fields (collective_seq_id / p2p_seq_id) suggest: a major "
        "version changes fields, so check its collectives (sequence numbers, sizes) against torch's "
        "own reader (torch.distributed.flight_recorder)"
    )
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1]


@pytest.mark.parametrize("number, text", [(2.1, "2.1"), (2.11, "2.11"), (2, "2")])
def test_numeric_version_is_read_as_its_text(tmp_path, number, text):
    """``version`` written as a JSON number (torch writes a string): read as the string of the same
    digits (its format, traces.meta.version and warnings as for that string), and said, since a
    number cannot keep a minor's trailing zero (2.10 is 2.1). It was read without a word and
    stored as a number. 2.11 as a number warns as "2.11" does (newer minor)."""
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({**_dump([_entry(1, 0)], 1, 1), "version": number}))
    as_text = tmp_path / "t" / "rank0.fr.json"
    as_text.parent.mkdir()
    as_text.write_text(json.dumps({**_dump([_entry(1, 0)], 1, 1), "version": text}))
    pt, ref = parse(path), parse(as_text)
    assert _version_notes(pt) == [
        f"Flight Recorder dump version is the JSON number {text}, not the string torch "
        f"writes; read as version '{text}' (a number loses a minor's trailing zero: 2.10 would read as 2.1)",
        *_version_notes(ref),
    ]
    assert (pt.format, json.loads(pt.trace["meta"])["version"]) == (f"fr-json-{text}", text)
    assert pt.format == ref.format and pt.collectives.equals(ref.collectives)


def test_entries_that_are_no_list_refuse_the_dump(store, tmp_path):
    """A dump (version, pg_config, pg_status) whose ``entries`` is an object, not a list: refused
    naming the file and the field, as an entry that is no object is (it was skipped as "not a
    Flight Recorder dump", its rank silently missing from the run); --partial stores the others."""
    folder = tmp_path / "job"
    _write(folder, 0, _dump([_entry(1, 0)], 2, 1), "json")
    _write(folder, 1, _dump({"0": _entry(1, 1)}, 2, 1), "json")  # type: ignore[arg-type]
    bad = folder / "rank1.fr.json"
    with pytest.raises(TraceFormatError, match=r"rank1\.fr\.json: entries: not a list \(dict: \{'0': "):
        parse(bad)
    with pytest.raises(TraceFormatError, match="rank1.fr.json: entries: not a list"):
        ingest(store, [folder], jobs=1)
    res = ingest(store, [folder], jobs=1, partial=True)
    assert list(res.failed) == [str(bad)]
    assert store.sql("SELECT rank FROM traces").rows() == [(0,)]


def test_entries_key_of_a_document_that_is_no_dump_is_not_a_dump(tmp_path):
    # no version / pg_config / pg_status: another tool's JSON with an "entries" object stays not a dump
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({"entries": {"a": 1}}))
    with pytest.raises(NotATraceError):
        parse(path)


def test_unknown_dtype_is_said_once_per_run(store, tmp_path):
    """Two ranks, each 2 entries of dtype "Foo8" (no size known) and 1 of "Float": the bytes of the
    4 Foo8 entries are NULL (no bandwidth), said once for the run, naming the dtype and counting
    them; the Float entries have bytes 4 x 1024 (it was silent)."""
    folder = tmp_path / "job"
    for r in (0, 1):
        ents = [_entry(1, r, dtype="Foo8"), _entry(2, r, record=1, dtype="Foo8"), _entry(3, r, record=2)]
        _write(folder, r, _dump(ents, 2, 3), "json")
    res = ingest(store, [folder], jobs=1)
    said = [w for w in res.warnings if "dtype" in w]
    assert said == [
        "run 'job': Flight Recorder: 4 collective(s) of a dtype traceprof does not know the size of "
        "('Foo8' x 4): their bytes are unknown (NULL; no bandwidth for them)"
    ]
    rows = store.sql("SELECT dtype, bytes_in FROM collectives ORDER BY rank, seq").rows()
    assert rows == [("Foo8", None), ("Foo8", None), ("Float", 4096)] * 2


@pytest.mark.parametrize("version", ["2.10", "2.4", "2"])
def test_known_versions_read_without_a_warning(tmp_path, version):
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({**_dump([_entry(1, 0)], 1, 1), "version": version}))
    assert parse(path).warnings == []


@pytest.mark.parametrize(
    "name, why",
    [
        ("rank0.fr.json", "not a JSON object"),
        ("nccl_trace_rank_0", "not a dict (a pickle dump's entries are)"),  # torch's pickle dump
    ],
)
def test_entry_that_is_no_object_is_a_bad_entry(tmp_path, name, why):
    # Entry #1 is null (None in a pickle): an error naming it, saying what the file holds (a pickle
    # has no JSON objects); --skip-bad-events skips and counts it (it was refused regardless).
    path = tmp_path / name
    doc = _dump([_entry(1, 0), None, _entry(2, 0)], 1, 2)
    path.write_bytes(json.dumps(doc).encode() if name.endswith(".json") else pickle.dumps(doc))
    with pytest.raises(TraceFormatError) as e:
        parse(path)
    assert str(e.value) == f"{path}: entry #1: {why} (None); pass --skip-bad-events to skip such entries"
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert pt.rejected == {why: 1}
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1, 2]


def test_odd_field_values_are_read_said_and_counted(tmp_path):
    # Values torch never writes, in entries that can still be read: each entry is stored as before,
    # with a warning per kind (count, first entry, value) and a count in traces.meta.repaired (the
    # issues column); they were accepted without a word.
    path = tmp_path / "rank0.fr.json"
    es = [_entry(k, 0, record=k) for k in range(1, 7)]
    es[0]["state"] = "weird_state"
    es[1]["retired"] = "yes"
    es[2]["pg_id"] = "0"
    es[3]["process_group"] = ["0", "default_pg", "extra"]
    es[4]["record_id"] = es[5]["record_id"] = 5  # two entries (seq 5 and 6) under one record_id
    path.write_text(json.dumps(_dump(es, 1, 6)))
    pt = parse(path)
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1, 2, 3, 4, 5, 6]
    assert pt.rejected == {}
    assert pt.warnings == [
        "rank0.fr.json: 1 entry with unknown 'state' (read by its times), first entry #0 "
        "('nccl:all_reduce'): 'weird_state'",
        "rank0.fr.json: 1 entry with 'retired' is not true / false, first entry #1 ('nccl:all_reduce'): 'yes'",
        "rank0.fr.json: 1 entry with 'pg_id' is not an integer, first entry #2 ('nccl:all_reduce'): '0'",
        "rank0.fr.json: 1 entry with 'process_group' is not a [name, description] pair, first entry #3 "
        "('nccl:all_reduce'): ['0', 'default_pg', 'extra']",
        "rank0.fr.json: 1 entry with 'record_id' repeated, first entry #5 ('nccl:all_reduce'): 5",
    ]
    assert json.loads(pt.trace["meta"])["repaired"] == {
        "unknown 'state' (read by its times)": 1,
        "'retired' is not true / false": 1,
        "'pg_id' is not an integer": 1,
        "'process_group' is not a [name, description] pair": 1,
        "'record_id' repeated": 1,
    }
    ok = tmp_path / "ok" / "rank0.fr.json"  # torch's own values: nothing said
    ok.parent.mkdir()
    ok.write_text(json.dumps(_dump([_entry(1, 0, record=0), _entry(2, 0, record=1)], 1, 2)))
    assert parse(ok).warnings == []


def test_entry_without_its_sequence_number(tmp_path):
    """Entry #1 of a 2.x dump lacks collective_seq_id: an error naming it; --skip-bad-events
    skips and counts it (the other entry keeps seq 1)."""
    path = tmp_path / "rank0.fr.json"
    bad = {k: v for k, v in _entry(2, 0).items() if k != "collective_seq_id"}
    path.write_text(json.dumps(_dump([_entry(1, 0), bad], 1, 2)))
    with pytest.raises(
        TraceFormatError,
        match=r"entry #1 \('nccl:all_reduce'\): missing 'collective_seq_id' "
        r"\(version 2.x numbers its entries there\); pass --skip-bad-events",
    ):
        parse(path)
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1]
    assert pt.rejected == {"missing 'collective_seq_id'": 1}
    bad["collective_seq_id"] = "x"
    path.write_text(json.dumps(_dump([_entry(1, 0), bad], 1, 2)))
    with pytest.raises(TraceFormatError, match=r"'collective_seq_id' not an integer \('x'\)"):
        parse(path)


# --- 3. coalesced groups ----------------------------------------------------------------------------


def _coalesced(
    rank: int, sizes: tuple[int, ...], dtypes: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """Seq 1 an all_reduce; seq 2 a coalesced group: one all_reduce entry per member (each
    created 1 ns after the previous, ``scheduled``: members get no CUDA events) and the group's
    end entry ``nccl:coalesced`` (no sizes), which completes; seq 3 an all_reduce."""
    dtypes = dtypes or ("Float",) * len(sizes)
    group = [
        _entry(2, rank, size=n, dtype=t, state="scheduled", record=1 + k, offset=k)
        for k, (n, t) in enumerate(zip(sizes, dtypes, strict=True))
    ]
    end = _entry(2, rank, name="nccl:coalesced", size=0, record=1 + len(sizes), offset=len(sizes))
    return [_entry(1, rank), *group, end, _entry(3, rank, record=2 + len(sizes))]


@pytest.mark.parametrize("fmt", ["json", "pickle"])
def test_coalesced_groups_compare_member_by_member(store, tmp_path, fmt):
    """Three ranks; seq 2 is a coalesced group of 3 all_reduces (1024, 2048, 4096 floats) and its
    end entry. Rank 2's second member holds 1024 elements instead of 2048: the mismatch is that
    member's (the first member alone, all that was compared before, agrees), rank 2 behind. The
    members' ``scheduled`` state is no hang: the group completed (its end entry did)."""
    run = tmp_path / "run"
    for r in (0, 1, 2):
        _write(run, r, _dump(_coalesced(r, (1024, 1024 if r == 2 else 2048, 4096)), 3, 3), fmt)
    _, d, v = _desync(store, run)
    assert store.sql("SELECT count(*) FROM collectives WHERE seq = 2").item() == 3 * 4  # every member stored
    assert (v["status"], v["seq"], v["behind"]) == ("mismatch", 2, [2])
    assert v["text"] == (
        "first divergence at group '0' [0, 1, 2] seq 2 (all_reduce): member 2 of the coalesced "
        "group: size 2048 on most ranks, rank 2 1024 (ranks behind the mismatch: 2)"
    )
    row = d.frame.filter(seq=2).row(0, named=True)
    assert row["ranks_completed"] == [0, 1, 2]  # the end entry completed on every rank
    assert d.frame.filter(seq=3)["status"].item() == "ok"


def test_coalesced_member_count_and_dtype(tmp_path):
    """Rank 1's group has 2 members where ranks 0 and 2 have 3 (one member never enqueued): the
    members cannot be paired, the count is the mismatch ('entries 4 on most ranks, rank 1 3': 3
    members + the end entry), rank 1 behind. Then with equal counts, rank 0's third member is
    bfloat16 where the others' is float: that member's dtype, rank 0 behind."""
    cases = {
        "count": (
            {0: _coalesced(0, (8, 8, 8)), 1: _coalesced(1, (8, 8)), 2: _coalesced(2, (8, 8, 8))},
            [1],
            "coalesced group: entries 4 on most ranks, rank 1 3",
        ),
        "dtype": (
            {
                0: _coalesced(0, (8, 8, 8), ("Float", "Float", "BFloat16")),
                1: _coalesced(1, (8, 8, 8)),
                2: _coalesced(2, (8, 8, 8)),
            },
            [0],
            "member 3 of the coalesced group: dtype Float on most ranks, rank 0 BFloat16",
        ),
    }
    for what, (groups, behind, text) in cases.items():
        run = tmp_path / what
        for r, entries in groups.items():
            _write(run, r, _dump(entries, 3, 3), "json")
        with Store(tmp_path / f"{what}.duckdb") as store:
            _, _, v = _desync(store, run)
        assert (v["status"], v["seq"], v["behind"]) == ("mismatch", 2, behind), what
        assert v["text"] == (
            f"first divergence at group '0' [0, 1, 2] seq 2 (all_reduce): {text} (ranks behind the "
            f"mismatch: {behind[0]})"
        ), what


def test_batched_p2p_members_left_scheduled_are_no_hang(store, tmp_path):
    """A batch_isend_irecv on ranks 0 and 1 (p2p seq 1): each rank's send and recv entries stay
    ``scheduled`` (no CUDA events), the batch's end entry ``nccl:coalesced`` completes, 600 us
    after its creation. Not a hang: desync is clean and p2p seq 1 is completed on both ranks (the
    first member alone, all that was looked at before, said completed by none)."""

    def batch(rank: int) -> list[dict[str, Any]]:
        ops = ("nccl:send 0->1", "nccl:recv 1<-0") if rank == 0 else ("nccl:recv 0<-1", "nccl:send 1->0")
        members = [
            _entry(1, rank, name=n, p2p=True, state="scheduled", record=k, offset=k)
            for k, n in enumerate(ops)
        ]
        return [*members, _entry(1, rank, name="nccl:coalesced", size=0, p2p=True, record=2, offset=2)]

    run = tmp_path / "run"
    for r in (0, 1):
        _write(run, r, _dump(batch(r), 2, -1), "json")
    _, d, v = _desync(store, run)
    assert (v["status"], v["behind"]) == ("clean", [])
    row = d.frame.filter(pg="0:p2p", seq=1).row(0, named=True)
    assert (row["status"], row["ranks_enqueued"], row["ranks_completed"]) == ("ok", [0, 1], [0, 1])
    assert (
        store.sql("SELECT count(*) FROM collectives WHERE p2p AND end_ns IS NULL").item() == 4
    )  # the members
