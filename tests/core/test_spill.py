"""Spilled string columns (traceprof.core.spill, issue 10): the args text of a large trace is kept in an
unlinked file and mapped, not held in memory; the values, the parsed tables and the stored rows
are the same as with the column in memory.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import SAMPLES, corpus
from traceprof.core import spill
from traceprof.storage.store import Store

_PARSE = importlib.import_module("traceprof.collectors.kineto.parse")


@pytest.fixture
def spill_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every string column goes to disk, however small."""
    monkeypatch.setattr(spill, "SPILL_BYTES", 0)


def _mapped(col: pa.ChunkedArray) -> int:
    """Chunks of ``col`` whose data buffer lies in a spill map (not in Python or Arrow memory)."""
    maps = [pa.py_buffer(m) for m in spill._MAPS]
    n = 0
    for c in col.chunks:
        data = c.buffers()[2]
        if (
            data is not None
            and data.size
            and any(m.address <= data.address < m.address + m.size for m in maps)
        ):
            n += 1
    return n


def test_round_trip_of_every_chunk_shape(spill_all: None) -> None:
    s = spill.TextSpill()
    parts = [
        pa.array(["a", "bc", ""]),
        pa.array(['{"x": 1}'] * 5),
        pa.array(["n", None]),  # nulls: kept in memory as they are
        pa.array(["s0", "s1", "s2", "s3"]).slice(1, 2),  # offsets not from 0: kept as they are
        pa.array([], pa.string()),
        pa.array(["é", "\u2603" * 100]),
    ]
    for p in parts:
        s.add(p)
    col = s.finish()
    want = [v for p in parts for v in p.to_pylist()]
    assert col.to_pylist() == want
    assert _mapped(col) == 3  # the plain chunks with text (the 1st, 2nd and last): on disk
    spill.release()
    assert col.to_pylist() == want  # pages dropped are read again from the file
    got = pa.RecordBatchReader.from_batches(
        *_schema_and(spill.batches(pa.table({"a": col}), rows=3))
    ).read_all()
    assert got.column("a").to_pylist() == want


def _schema_and(batches):  # type: ignore[no-untyped-def]
    first = list(batches)
    return first[0].schema, first


def test_small_columns_stay_in_memory() -> None:
    s = spill.TextSpill()
    s.add(pa.array(["x"] * 10))
    col = s.finish()
    assert _mapped(col) == 0 and col.to_pylist() == ["x"] * 10


def test_unwritable_folder_keeps_the_column_in_memory(spill_all: None, tmp_path: Path) -> None:
    s = spill.TextSpill(tmp_path / "missing")  # ParseOptions.spill_dir of a folder that is not there
    s.add(pa.array(["a", "b"]))
    s.add(pa.array(["c"]))
    col = s.finish()
    assert col.to_pylist() == ["a", "b", "c"] and _mapped(col) == 0


def _parsed(path: Path) -> list[object]:
    pt = _PARSE.parse(path)
    return [getattr(pt, t).to_pydict() for t in ("events", "devices", "steps", "collectives")] + [
        pt.rejected,
        pt.skipped,
        pt.flagged,
        pt.warnings,
    ]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(lambda: next(SAMPLES.rglob("*.trace.json.gz")), id="sample"),
        pytest.param(lambda: corpus("hta/trace_diff/test/test.json.gz"), id="hta-trace_diff"),
        pytest.param(lambda: corpus("hta/negative_queue_length_values_check/rank0.json.gz"), id="hta-queue"),
    ],
)
def test_parse_with_spilled_args_gives_the_same_tables(path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = path()
    in_memory = _parsed(p)
    monkeypatch.setattr(spill, "SPILL_BYTES", 0)
    pt = _PARSE.parse(p)
    assert _mapped(pt.events.column("args")) > 0  # the args really were on disk
    assert _parsed(p) == in_memory


def test_store_rows_are_the_same_with_spilled_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = next(SAMPLES.rglob("*.trace.json.gz"))
    dumps = []
    for i, limit in enumerate((spill.SPILL_BYTES, 0)):
        monkeypatch.setattr(spill, "SPILL_BYTES", limit)
        with Store(tmp_path / f"s{i}.duckdb") as s:
            from traceprof.ingest.ingest import ingest

            ingest(s, [src], jobs=1)
            dumps.append(
                s.con.execute("SELECT * EXCLUDE (trace_id) FROM events ORDER BY ts_ns, name, args").fetchall()
            )
    assert dumps[0] == dumps[1] and len(dumps[0]) > 100


def test_a_column_that_cannot_be_mapped_is_read_back(
    spill_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*a: object, **k: object) -> None:
        raise OSError("no maps here")

    s = spill.TextSpill()
    s.add(pa.array(["a", "bc"]))
    s.add(pa.array(["d", None]))
    s.add(pa.array(["ef"]))
    monkeypatch.setattr(spill.mmap, "mmap", refuse)
    col = s.finish()
    assert col.to_pylist() == ["a", "bc", "d", None, "ef"] and _mapped(col) == 0


class _Disk:
    """A statvfs result with ``free`` bytes available."""

    def __init__(self, free: int) -> None:
        self.f_bavail, self.f_frsize = free, 1


def test_a_spill_leaves_the_disk_to_the_store(spill_all: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # A disk with 14,500 bytes free, filled by what the spill writes, and a 10,000-byte reserve: with
    # k chunks written (1,024 bytes each on disk), the next (1,004 bytes) goes to disk while
    # 14,500 - 1,024 k - 1,004 >= max(10,000, 1,024 k + 1,004), i.e. for k = 0..3: 4 chunks go to
    # disk, the other 2 stay in memory.
    monkeypatch.setattr(spill, "RESERVE_BYTES", 10_000)
    chunk = pa.array(["x" * 96] * 10)  # 960 bytes of text + 44 of offsets: 1,024 written (64-aligned)
    s = spill.TextSpill()
    monkeypatch.setattr(spill.os, "statvfs", lambda path: _Disk(14_500 - s._at))
    for _ in range(6):
        s.add(chunk)
    col = s.finish()
    assert col.to_pylist() == ["x" * 96] * 60
    assert _mapped(col) == 4


def test_no_room_at_all_keeps_the_column_in_memory(spill_all: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill.os, "statvfs", lambda path: _Disk(100 << 20))  # under the 1 GiB reserve
    s = spill.TextSpill()
    s.add(pa.array(["a"] * 100))
    s.add(pa.array(["b"] * 100))
    col = s.finish()
    assert col.to_pylist() == ["a"] * 100 + ["b"] * 100 and _mapped(col) == 0


def test_the_events_insert_drops_the_pages_it_has_read_as_it_goes(
    spill_all: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The insert reads the spilled args once, a batch at a time: their pages are dropped every
    # store.INSERT_RELEASE_BYTES (here: after each batch), not only every 32 MiB (after the last
    # batch of a 54 MB trace: the whole column resident at the insert's peak); the heap is trimmed
    # at the 32 MiB cadence and at the end only.
    from traceprof.storage import store as store_mod

    pt = _PARSE.parse(next(SAMPLES.rglob("*.trace.json.gz")))
    pt.events = pa.Table.from_batches(pt.events.to_batches(max_chunksize=100))  # slices of the same map
    n_batches = pt.events.column("args").num_chunks
    assert _mapped(pt.events.column("args")) == n_batches > 3
    assert pt.events.nbytes < spill._RELEASE_BYTES
    monkeypatch.setattr(store_mod, "INSERT_RELEASE_BYTES", 1)
    calls: list[bool] = []
    inserting: list[bool] = []  # in Store._insert_events (not the inserts of steps, devices, ...)
    real_release, real_insert = spill.release, Store._insert_events

    def insert_events(self: Store, *a: object) -> None:
        inserting.append(True)
        try:
            real_insert(self, *a)  # type: ignore[arg-type]
        finally:
            inserting.clear()

    monkeypatch.setattr(
        spill, "release", lambda heap=True: inserting and calls.append(heap) or real_release(heap)
    )
    monkeypatch.setattr(Store, "_insert_events", insert_events)
    want = pt.events.column("args").to_pylist()
    with Store(tmp_path / "s.duckdb") as s:
        s.insert_run("r", [pt])
        stored = s.con.execute("SELECT args FROM events").fetchall()
    assert sorted(a for (a,) in stored) == sorted(want)
    # a drop after each batch, then the final release, with the trim
    assert calls == [False] * n_batches + [True]
