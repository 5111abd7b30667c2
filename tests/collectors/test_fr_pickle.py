"""Flight Recorder pickle dumps: restricted unpickling, real dump names, same store as JSON."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from tests.conftest import corpus
from traceprof.collectors.flight_recorder.parse import is_fr_file, parse
from traceprof.core.errors import TraceFormatError
from traceprof.ingest import sources
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

FR = "flight_recorder/gloo_cpu_4rank"


class _Evil:
    """Unpickling this with plain ``pickle`` calls ``Path.touch(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _as_torch_pickle(doc: dict) -> bytes:
    """The dump as torch pickles it: process_group and sizes as tuples (JSON has lists)."""
    d = dict(doc)
    d["entries"] = [
        {
            **e,
            "process_group": tuple(e["process_group"]),
            "input_sizes": [tuple(s) for s in e["input_sizes"]],
            "frames": [{"name": "train", "line": 1}],
        }
        for e in doc["entries"]
    ]
    return pickle.dumps(d, protocol=2)


def test_malicious_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "created_by_unpickling"
    for i, payload in enumerate(
        [
            {"entries": [_Evil(marker)]},  # nested in the dump
            _Evil(marker),  # the whole file
        ]
    ):
        bad = tmp_path / f"nccl_trace_rank_node7_{i}"
        bad.write_bytes(pickle.dumps(payload, protocol=4))
        with pytest.raises(TraceFormatError, match="refers to pathlib.*refused"):
            parse(bad)
    assert not marker.exists()
    # The same payload with plain pickle does create the file: the test payload is live.
    pickle.loads(bad.read_bytes())
    assert marker.exists()


def test_non_plain_types_refused(tmp_path):
    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps({"entries": [{"x": {1, 2}}]}, protocol=4))  # a set: no global needed
    with pytest.raises(TraceFormatError, match="set, not plain data"):
        parse(bad)


@pytest.mark.parametrize(
    "name,rank",
    [
        ("nccl_trace_rank_3", 3),
        ("nccl_trace_rank_node-a01_2", 2),
        ("fr_trace_rank_gpu12.cluster_1", 1),
    ],
)
def test_real_dump_names_and_rank(tmp_path, name, rank):
    doc = json.loads(corpus(f"{FR}/fr_rank0.json").read_text())
    path = tmp_path / name
    path.write_bytes(_as_torch_pickle(doc))
    assert is_fr_file(path) and sources.claim(path).name == "flight_recorder"
    pt = parse(path)
    assert pt.rank == rank and pt.format == "fr-pickle-2.10"
    doc["rank"] = 5  # the dump's own field wins over the name
    path.write_bytes(_as_torch_pickle(doc))
    assert parse(path).rank == 5


def _tables(db: Path) -> dict[str, list[tuple]]:
    with Store(db, read_only=True) as s:
        return {
            t: sorted(s.con.execute(f"SELECT * EXCLUDE (run_id{x}) FROM {t}").fetchall(), key=repr)
            for t, x in (
                ("events", ", trace_id"),
                ("collectives", ", trace_id"),
                ("collective_instances", ""),
                ("steps", ", trace_id"),
                ("devices", ", trace_id"),
            )
        } | {
            "traces": s.con.execute(
                "SELECT rank, world_size, source, events_read, events_kept, clock_offset_ns FROM traces ORDER BY rank"
            ).fetchall()
        }


def test_pickles_give_the_same_store_as_json(tmp_path):
    src = corpus(FR)
    pk = tmp_path / "run"
    pk.mkdir()
    for r in range(4):
        doc = json.loads((src / f"fr_rank{r}.json").read_text())
        (pk / f"nccl_trace_rank_host{r % 2}_{r}").write_bytes(_as_torch_pickle(doc))
    for db, folder in (("json.duckdb", src), ("pickle.duckdb", pk)):
        with Store(tmp_path / db) as s:
            ingest(s, [folder], run="run", jobs=1)
    a, b = _tables(tmp_path / "json.duckdb"), _tables(tmp_path / "pickle.duckdb")
    assert len(a["collectives"]) == 4 * 17
    for t in a:
        assert a[t] == b[t], t


def _tiny_dump(rank: int) -> dict:
    """One completed all_reduce: created 10, started 20, completed 50 (ns)."""
    return {
        "version": "2.4",
        "rank": rank,
        "entries": [
            {
                "collective_seq_id": 1,
                "process_group": ["0", "default_pg"],
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": 10,
                "time_discovered_started_ns": 20,
                "time_discovered_completed_ns": 50,
                "input_sizes": [[4]],
                "input_dtypes": ["Float"],
                "state": "completed",
            }
        ],
    }


@pytest.mark.parametrize("protocol", [0, 1])
def test_protocol_0_and_1_pickles_are_read_by_their_name(tmp_path, protocol):
    """Protocols 0/1 have no 0x80 marker: a file named like a dump that is not JSON is unpickled
    (safely: a protocol-0 pickle naming a function is refused and runs nothing)."""
    path = tmp_path / "nccl_trace_rank_3"
    path.write_bytes(pickle.dumps(_tiny_dump(3), protocol=protocol))
    pt = parse(path)
    (row,) = pt.collectives.to_pylist()
    assert (pt.rank, pt.format, row["seq"], row["enter_ns"], row["end_ns"]) == (3, "fr-pickle-2.4", 1, 10, 50)
    marker = tmp_path / "created_by_unpickling"
    path.write_bytes(pickle.dumps({"entries": [_Evil(marker)]}, protocol=protocol))
    # Protocols < 2 reach Path.touch through getattr (no STACK_GLOBAL): refused at the first global.
    with pytest.raises(TraceFormatError, match="refers to __builtin__.getattr, not plain data; refused"):
        parse(path)
    assert not marker.exists()


def test_broken_pickle_messages(tmp_path):
    whole = pickle.dumps(_tiny_dump(1), protocol=4)
    cut = tmp_path / "nccl_trace_rank_1"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceFormatError) as e:
        parse(cut)
    assert str(e.value) == (
        f"{cut}: broken pickle: cut short (pickle data was truncated): copy the whole file, or dump it again"
    )
    other = tmp_path / "nccl_trace_rank_2"
    other.write_bytes(b"garbage not a pickle")
    with pytest.raises(TraceFormatError) as e:
        parse(other)
    assert str(e.value) == (
        f"{other}: neither JSON nor a readable pickle (starts b'garbage not '): not a Flight Recorder dump"
    )
