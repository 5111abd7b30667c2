"""A new store created in a helper thread while the ingest parses (``Store(background=True)``)."""

from __future__ import annotations

import threading

import pytest

import traceprof.storage.store as store_mod
from tests.builders import micro_trace
from traceprof.core.errors import StoreError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


def _job(tmp_path):
    import json

    d = tmp_path / "job"
    d.mkdir(exist_ok=True)
    for r in range(2):
        (d / f"rank{r}.json").write_text(json.dumps(micro_trace(["a", "b"], rank=r, world=2)))
    return d


def test_a_store_created_in_the_background_is_the_store_created_at_once(tmp_path, monkeypatch):
    gate = threading.Event()
    real = store_mod._create_file

    def held(path, *layout):  # the thread waits until the caller has gone on
        assert gate.wait(10)
        real(path, *layout)

    monkeypatch.setattr(store_mod, "_create_file", held)
    s = Store(tmp_path / "b.duckdb", background=True)
    # the lock is held and the path checked at once; the file comes later
    assert s.opening and not (tmp_path / "b.duckdb").exists()
    assert s.stored_sizes() == set()  # a store being created holds no file: no wait for it
    gate.set()
    with s:
        ingest(s, [_job(tmp_path)], jobs=1)  # its first query waits for the thread
        assert not s.opening and s.created
        got = s.con.execute("SELECT count(*), sum(dur_ns) FROM events").fetchall()
    with Store(tmp_path / "a.duckdb") as a:
        ingest(a, [_job(tmp_path)], jobs=1)
        assert a.con.execute("SELECT count(*), sum(dur_ns) FROM events").fetchall() == got
    assert got[0][0] > 0


def test_a_failed_background_creation_is_raised_at_first_use_and_leaves_nothing(tmp_path, monkeypatch):
    def refused(path, *layout):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(store_mod, "_create_file", refused)
    db = tmp_path / "b.duckdb"
    s = Store(db, background=True)
    with pytest.raises(StoreError, match=r"b\.duckdb: cannot create the store: .*Permission denied"):
        s.ready()
    with pytest.raises(StoreError, match="cannot create the store"):
        s.con  # noqa: B018 - every use raises it
    assert s.discard_if_new() is False
    s.close()
    assert not db.exists() and not (tmp_path / "b.duckdb.lock").exists()  # unlocked, nothing left
    monkeypatch.undo()
    with Store(db) as again:  # the path is free
        assert again.created


def test_a_new_empty_store_made_in_the_background_is_discarded(tmp_path):
    db = tmp_path / "b.duckdb"
    s = Store(db, background=True)
    assert s.discard_if_new() is True  # waits for it, then deletes it: it holds no run
    assert not db.exists()


def test_an_existing_store_opens_at_once(tmp_path):
    db = tmp_path / "b.duckdb"
    Store(db).close()
    with Store(db, background=True) as s:
        assert not s.opening and not s.created
