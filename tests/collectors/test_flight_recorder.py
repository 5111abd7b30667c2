"""Flight Recorder JSON dumps: parsing, pickle refusal, ingest with pg+seq matching."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, analyze, corpus
from traceprof.collectors.flight_recorder.parse import is_fr_file, parse
from traceprof.core.errors import TraceFormatError
from traceprof.core.parsed import ParseOptions
from traceprof.ingest.ingest import ingest


def test_parse_corpus_dump_field_by_field():
    path = corpus("flight_recorder/gloo_cpu_4rank/fr_rank1.json")
    doc = json.loads(path.read_text())
    pt = parse(path)
    rows = pt.collectives.to_pylist()
    assert pt.rank == 1 and pt.world_size == 4 and pt.source == "flight_recorder"
    assert len(rows) == len(doc["entries"]) == 17
    for e, r in zip(doc["entries"], rows, strict=True):
        assert r["seq"] == e["collective_seq_id"] and r["pg"] == e["process_group"][0]
        assert r["enter_ns"] == e["time_created_ns"]
        assert r["start_ns"] is None and r["end_ns"] is None  # gloo records 0: unknown
        assert r["op"] == e["profiling_name"].split(":")[1]  # gloo:all_reduce -> all_reduce, ...
    # First entry: all_gather of 1 Long (8 bytes) into [4, 1].
    assert (rows[0]["nelems_in"], rows[0]["bytes_in"], rows[0]["nelems_out"], rows[0]["group_size"]) == (
        1,
        8,
        4,
        4,
    )


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_pickle_dump_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    bad = tmp_path / "nccl_trace_rank_0"  # torch's default dump name
    bad.write_bytes(pickle.dumps({"entries": [_Evil(str(marker))]}))
    assert is_fr_file(bad)
    with pytest.raises(TraceFormatError, match="pickle"):
        parse(bad)
    assert not marker.exists()


def test_missing_creation_time(tmp_path):
    doc = {
        "version": "2.10",
        "pg_config": {},
        "entries": [
            {
                "collective_seq_id": 1,
                "process_group": ["0", "default_pg"],
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": 10,
                "time_discovered_started_ns": 20,
                "time_discovered_completed_ns": 50,
            },
            {
                "collective_seq_id": 2,
                "process_group": ["0", "default_pg"],
                "profiling_name": "nccl:all_reduce",
            },
        ],
    }
    path = tmp_path / "rank3.fr.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match=r"entry #1 \('nccl:all_reduce'\): missing 'time_created_ns'"):
        parse(path)
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    (row,) = pt.collectives.to_pylist()
    assert (pt.rank, row["enter_ns"], row["start_ns"], row["end_ns"]) == (3, 10, 20, 50)
    assert pt.rejected == {"missing 'time_created_ns'": 1}


@pytest.mark.parametrize("dtypes", [5, "Float", {"a": 1}])
def test_dtypes_that_are_not_a_list_leave_the_dtype_unknown(tmp_path, dtypes):
    # input_dtypes 5 was a traceback ('int' object is not subscriptable); a string would have
    # been read as its first letter ("F"). Only a list names the dtype; the sizes stay.
    entry = {
        "collective_seq_id": 1,
        "process_group": ["0", "default_pg"],
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 10,
        "input_sizes": [[4, 8]],
        "input_dtypes": dtypes,
        "output_dtypes": dtypes,
    }
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({"version": "2.4", "rank": 0, "entries": [entry]}))
    (row,) = parse(path).collectives.to_pylist()
    assert (row["dtype"], row["nelems_in"], row["bytes_in"]) == (None, 32, None)


def test_state_wins_over_duration(tmp_path):
    """Seq 1 "started" with a duration (torch fills duration_ms from CUDA events that may be
    recorded while the kernel still runs): not completed, end NULL. Seq 2 "completed" with only
    duration_ms = 0.03: end = started 20 + 30_000 ns."""

    def entry(seq, state):
        return {
            "collective_seq_id": seq,
            "process_group": ["0", "default_pg"],
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": 10,
            "time_discovered_started_ns": 20,
            "time_discovered_completed_ns": 0,
            "duration_ms": 0.03,
            "state": state,
        }

    path = tmp_path / "rank0.fr.json"
    path.write_text(
        json.dumps({"version": "2.4", "rank": 0, "entries": [entry(1, "started"), entry(2, "completed")]})
    )
    rows = parse(path).collectives.to_pylist()
    assert [(r["seq"], r["start_ns"], r["end_ns"]) for r in rows] == [(1, 20, None), (2, 20, 30_020)]


def test_non_integer_creation_time_and_empty_dump(tmp_path):
    # Present but not an integer: said so, not "missing".
    doc = {
        "version": "2.10",
        "pg_config": {},
        "entries": [
            {
                "collective_seq_id": 1,
                "process_group": ["0", "default_pg"],
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": 10,
            },
            {
                "collective_seq_id": 2,
                "process_group": ["0", "default_pg"],
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": "abc",
            },
        ],
    }
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        TraceFormatError,
        match=r"entry #1 \('nccl:all_reduce'\): 'time_created_ns' is not an "
        r"integer \('abc'\)",
    ):
        parse(path)
    assert parse(path, ParseOptions(on_bad_event="skip")).rejected == {
        "'time_created_ns' is not an integer": 1
    }
    # An empty ring buffer: a trace with 0 collectives and a warning (for hang triage the rank that
    # recorded nothing is the culprit: desync says so); every entry skipped is still an error.
    path.write_text(json.dumps({**doc, "entries": []}))
    empty = parse(path)
    assert (empty.rank, empty.collectives.num_rows, empty.events.num_rows) == (0, 0, 0)
    assert empty.warnings == [
        "rank0.fr.json: rank 0 recorded no collective (empty 'entries': dumped before any "
        "ran on this rank, or TORCH_NCCL_TRACE_BUFFER_SIZE=0); stored with 0 collectives"
    ]
    path.write_text(json.dumps({**doc, "entries": doc["entries"][1:]}))
    with pytest.raises(TraceFormatError, match="no valid entries"):
        parse(path, ParseOptions(on_bad_event="skip"))


@pytest.mark.parametrize(
    ("field", "value", "reason", "shown"),
    [
        # a string is no integer: it was stored as the time, without a word (1796034872484434120 is
        # the trial's value); a float (string) was read as a float64, 256 ns off at this magnitude
        (
            "time_created_ns",
            "1796034872484434120",
            "'time_created_ns' is not an integer",
            "'1796034872484434120'",
        ),
        (
            "time_created_ns",
            "1796034872484434120.5",
            "'time_created_ns' is not an integer",
            "'1796034872484434120.5'",
        ),
        (
            "time_created_ns",
            1796034872484434120.5,
            "'time_created_ns' is not an integer",
            "1.7960348724844342e+18",
        ),
        ("time_discovered_started_ns", "5", "'time_discovered_started_ns' is not an integer", "'5'"),
        ("collective_seq_id", "4", "'collective_seq_id' not an integer", "'4'"),
        ("collective_seq_id", 4.0, "'collective_seq_id' not an integer", "4.0"),
        ("input_sizes", [["667136"]], "'input_sizes' holds a dimension that is not an integer", "'667136'"),
        ("output_sizes", [[667136.0]], "'output_sizes' holds a dimension that is not an integer", "667136.0"),
        ("record_id", "3", "'record_id' is not an integer", "'3'"),
        # no tensor has a negative dimension: it was stored as bytes_in -12 (-3 x 4-byte floats)
        ("input_sizes", [[-3]], "'input_sizes' holds a negative dimension", "-3"),
        ("output_sizes", [[2, -1]], "'output_sizes' holds a negative dimension", "-1"),
    ],
)
def test_integer_fields_written_otherwise_are_bad_entries(tmp_path, field, value, reason, shown):
    # One rule for every Flight Recorder integer field: a JSON integer, else the entry is bad (an
    # error naming the file, the entry and the value; --skip-bad-events skips and counts it), as
    # 123.5 and true were for the times already.
    run = tmp_path / "fr"
    shutil.copytree(corpus("flight_recorder/gloo_cpu_4rank"), run)
    path = run / "fr_rank2.json"
    doc = json.loads(path.read_text())
    doc["entries"][3][field] = value  # entry #3: gloo:all_reduce, seq 4 (17 entries)
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError) as e:
        parse(path)
    assert str(e.value) == (
        f"{path}: entry #3 ('gloo:all_reduce'): {reason} ({shown}); pass --skip-bad-events to skip such entries"
    )
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert pt.rejected == {reason: 1}
    seqs = [r["seq"] for r in pt.collectives.to_pylist()]
    assert seqs == [k for k in range(1, 18) if k != 4]


def test_corpus_dumps_ingest_and_match_by_seq(store):
    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")])
    got = store.sql(
        "SELECT match_method, count(*), min(n_ranks) FROM collective_instances GROUP BY ALL"
    ).rows()
    assert got == [("pg_seq", 17, 4)]
    # Independent check: instance k's first and last arrival are the min / max time_created_ns of
    # the four dumps' entries with collective_seq_id k.
    created: dict[int, list[int]] = {}
    for f in sorted(corpus("flight_recorder/gloo_cpu_4rank").glob("fr_rank*.json")):
        for e in json.loads(f.read_text())["entries"]:
            created.setdefault(e["collective_seq_id"], []).append(e["time_created_ns"])
    rows = store.sql(
        "SELECT seq, first_arrival_ns, last_arrival_ns FROM collective_instances ORDER BY seq"
    ).rows()
    assert rows == [(k, min(v), max(v)) for k, v in sorted(created.items())]
    # No end times on gloo: clocks cannot be aligned, and the run says so.
    assert store.sql("SELECT clock_aligned FROM runs").item() is False
    res = analyze(store, "stragglers")
    assert res.verdict["named"].to_list() == [False]


def test_sample_dumps_beside_kineto_traces(store, tmp_path):
    run = SAMPLES / "straggler_rank2"
    if not (run / "rank0.fr.json").exists():
        pytest.skip("sample_traces/straggler_rank2 has no Flight Recorder dumps")
    ingest(store, [run])
    sources = store.sql("SELECT source, count(*) FROM traces GROUP BY ALL ORDER BY source").rows()
    assert sources == [("flight_recorder", 4), ("kineto", 4)]
    # Kineto rows have end times, so they are the analysed source; FR rows match on (pg, seq).
    assert (
        store.sql("SELECT DISTINCT match_method FROM collective_instances WHERE source = 'fr'").item()
        == "pg_seq"
    )
    res = analyze(store, "stragglers", source="fr")
    assert res.verdict["rank"].to_list() == [2]
    # A lone dump is rank <R> by its file name.
    shutil.copy(run / "rank3.fr.json", tmp_path / "rank3.fr.json")
    assert parse(tmp_path / "rank3.fr.json").rank == 3


def test_rank_field_conflicting_with_the_file_name_warns(tmp_path):
    doc = {
        "version": "2.4",
        "rank": 5,
        "entries": [
            {
                "collective_seq_id": 1,
                "process_group": ["0", "default_pg"],
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": 10,
            }
        ],
    }
    path = tmp_path / "fr_rank2.json"
    path.write_text(json.dumps(doc))
    pt = parse(path)
    assert pt.rank == 5
    assert pt.warnings == [
        "fr_rank2.json: the dump's 'rank' 5 differs from rank 2 in the file name; stored as "
        "rank 5 (the dump's own field)"
    ]
    path.write_text(json.dumps({**doc, "rank": 2}))
    assert (parse(path).rank, parse(path).warnings) == (2, [])


def _fr_entry(seq: int, created: object, **times: object) -> dict:
    return {
        "collective_seq_id": seq,
        "process_group": ["0", "default_pg"],
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": created,
        **times,
    }


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("time_created_ns", -5, "negative 'time_created_ns'"),
        ("time_discovered_started_ns", -1, "negative 'time_discovered_started_ns'"),
        ("time_discovered_completed_ns", -2, "negative 'time_discovered_completed_ns'"),
        ("time_discovered_started_ns", "soon", "'time_discovered_started_ns' is not an integer"),
        ("duration_ms", -0.5, "'duration_ms' negative or not finite"),
    ],
)
def test_negative_or_malformed_times_are_bad_entries(tmp_path, field, value, reason):
    # An epoch time is never below 0: a negative one was stored (enter_ns = -5), and a started time
    # of "soon" was read as unknown, both without a word. Entry #1 holds the bad value; entry #0 is
    # sound (created 10, started 20, completed 50 ns) and is what is left with --skip-bad-events.
    bad = _fr_entry(2, 30, time_discovered_started_ns=40, time_discovered_completed_ns=0)
    bad[field] = value
    doc = {
        "version": "2.4",
        "rank": 0,
        "entries": [
            _fr_entry(1, 10, time_discovered_started_ns=20, time_discovered_completed_ns=50),
            bad,
        ],
    }
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match=rf"rank0.fr.json: entry #1 \('nccl:all_reduce'\): {reason}"):
        parse(path)
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert [(r["seq"], r["enter_ns"], r["start_ns"], r["end_ns"]) for r in pt.collectives.to_pylist()] == [
        (1, 10, 20, 50)
    ]
    assert pt.rejected == {reason: 1}


def test_negative_creation_time_in_a_corpus_dump_is_refused_by_ingest(store, tmp_path):
    # The trial: rank 2's entries[8] (collective 9) created at -5 ns was stored, and stragglers then
    # called it "the first collective" waiting 1.8e12 ms. Now the ingest names the file and entry and
    # stores nothing; --skip-bad-events leaves that entry out and counts it in the run's issues.
    for f in corpus("flight_recorder/gloo_cpu_4rank").glob("fr_rank*.json"):
        doc = json.loads(f.read_text())
        if f.name == "fr_rank2.json":
            assert doc["entries"][8]["collective_seq_id"] == 9
            doc["entries"][8]["time_created_ns"] = -5
        (tmp_path / f.name).write_text(json.dumps(doc))
    with pytest.raises(
        TraceFormatError,
        match=r"fr_rank2.json: entry #8 \('gloo:all_reduce'\): negative 'time_created_ns' \(-5\)",
    ):
        ingest(store, [tmp_path], run="fr")
    assert store.sql("SELECT count(*) FROM runs").item() == 0
    ingest(store, [tmp_path], run="fr", on_bad_event="skip")
    assert store.sql("SELECT count(*), min(enter_ns) > 0 FROM collectives").row(0) == (4 * 17 - 1, True)
    assert store.runs()["issues"].to_list() == ["1 rejected: negative 'time_created_ns'"]


def test_transient_names_the_collective_that_arrived_first(store, tmp_path):
    # Two ranks, four all_reduces of pg 0 (seq 1-4). Rank 1 starts 3 s late: seq 1 is entered at 0
    # and 3000 ms (skew 3000 ms); seqs 2-4 at 3010/3020/3030 ms on rank 0 and 0.1 ms later on rank 1
    # (skew 0.1 ms). Threshold max(20 x median skew 0.1 ms, no steps) = 2 ms: seq 1 alone is over it,
    # and the ranks' first events are 3000 ms apart (>= half its skew): the transient is seq 1.
    ms = 1_000_000
    t0 = 1_700_000_000 * 10**9
    for r, late in ((0, 0), (1, 100_000)):
        first = t0 + (3000 * ms if r else 0)
        entries = [_fr_entry(1, first)] + [
            _fr_entry(k, t0 + (3000 + 10 * (k - 1)) * ms + late) for k in (2, 3, 4)
        ]
        (tmp_path / f"rank{r}.fr.json").write_text(
            json.dumps({"version": "2.4", "rank": r, "entries": entries})
        )
    ingest(store, [tmp_path], run="t")
    res = analyze(store, "stragglers", "t")
    (note,) = [n for n in res.notes if n.startswith("profiler-start transient")]
    assert note.startswith(
        "profiler-start transient: the first collective to arrive (all_reduce pg 0 seq 1) waited up to 3,000.0 ms"
    )


@pytest.mark.parametrize(
    ("value", "rank", "said"),
    [
        ("2", 2, "a string: read as its integer"),  # was read as 2 without a word
        (2.0, 2, "a float: read as its integer"),
        (1.5, 5, "not an integer: ignored"),  # was the file name's rank 5 without a word
        ("abc", 5, "not an integer: ignored"),
    ],
)
def test_dump_rank_written_as_text_is_said_and_counted(store, tmp_path, value, rank, said):
    # The same rule as Kineto's distributedInfo.rank (traceprof.core.values.identity_int). The file
    # is named rank5: a rank that is ignored falls back to it; one that is read as 2 differs from it.
    path = tmp_path / "rank5.fr.json"
    path.write_text(json.dumps({"version": "2.4", "rank": value, "entries": [_fr_entry(1, 10)]}))
    pt = parse(path)
    assert pt.rank == rank
    assert pt.warnings[0] == f"rank5.fr.json: the dump's 'rank' is {value!r}, {said}"
    ingest(store, [path], run="r")
    assert store.runs()["issues"].to_list() == [f"1 repaired: rank {said}"]


def test_an_entry_written_twice_is_kept_once_and_counted(store, tmp_path):
    # Entries record_id 0, 1, 1 again (every field equal: a copy), 2; and record_id 3, equal to 2
    # but for its record_id (the ring buffer numbers each record: not a copy). Kept: 4 entries, one
    # copy counted in traces.meta.repaired and shown by `runs`. Before: 5 collectives, seq 2 twice.
    entries = [
        {**_fr_entry(1, 10, time_discovered_started_ns=20, time_discovered_completed_ns=50), "record_id": 0},
        {**_fr_entry(2, 60, time_discovered_started_ns=70, time_discovered_completed_ns=90), "record_id": 1},
    ]
    entries.append(dict(entries[1]))
    entries.append(
        {
            **_fr_entry(3, 100, time_discovered_started_ns=110, time_discovered_completed_ns=120),
            "record_id": 2,
        }
    )
    entries.append({**entries[3], "record_id": 3})
    path = tmp_path / "rank0.fr.json"
    path.write_text(json.dumps({"version": "2.4", "rank": 0, "entries": entries}))
    pt = parse(path)
    assert [(r["seq"], r["enter_ns"]) for r in pt.collectives.to_pylist()] == [
        (1, 10),
        (2, 60),
        (3, 100),
        (3, 100),
    ]
    assert json.loads(pt.trace["meta"])["repaired"] == {"exact duplicate record dropped": 1}
    assert (
        "rank0.fr.json: 1 duplicate record dropped (first: entry #2 ('nccl:all_reduce', record_id 1))"
        in pt.warnings
    )
    ingest(store, [path], run="fr")
    assert store.runs()["issues"].to_list() == ["1 repaired: exact duplicate record dropped"]
