"""A new store copied from the empty store built once (:mod:`traceprof.storage.template`)."""

from __future__ import annotations

import hashlib

import duckdb
import pytest

from traceprof.storage import template
from traceprof.storage.store import Store

#: Everything a store's schema holds, less the database's name (the file's stem).
_SCHEMA = [
    "SELECT table_name, comment, sql FROM duckdb_tables() ORDER BY ALL",
    "SELECT view_name, comment, sql FROM duckdb_views() WHERE NOT internal ORDER BY ALL",
    """SELECT table_name, column_name, column_index, data_type, comment, is_nullable, column_default
       FROM duckdb_columns() ORDER BY ALL""",
    "SELECT constraint_type, table_name, constraint_column_names FROM duckdb_constraints() ORDER BY ALL",
    "SELECT key, value FROM meta ORDER BY rowid",
]


def _schema(path):
    con = duckdb.connect(str(path), read_only=True)
    try:
        return [con.execute(q).fetchall() for q in _SCHEMA]
    finally:
        con.close()


def _templates(cache):
    return sorted(p.name for p in (cache / "traceprof").glob("store-*.duckdb"))


def test_a_store_copied_from_the_template_holds_the_schema_made_by_statements(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    Store(tmp_path / "first.duckdb").close()  # builds the template, then copies it
    (name,) = _templates(cache)
    made = []
    real = template.create_schema
    monkeypatch.setattr(template, "create_schema", lambda con: made.append(1) or real(con))
    with Store(tmp_path / "copied.duckdb") as s:
        assert s.created and s.layout == "duckdb"
    assert made == [] and _templates(cache) == [name]  # copied, not built again
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "missing" / "file"))
    (tmp_path / "missing").write_text("a file where the cache folder would be")
    Store(tmp_path / "made.duckdb").close()  # no cache folder: the schema made statement by statement
    assert made == [1]
    copied = _schema(tmp_path / "copied.duckdb")
    assert copied == _schema(tmp_path / "made.duckdb") == _schema(tmp_path / "first.duckdb")
    # 226 statements made it (schema 9): 13 tables and views, 213 comments (the tables' and their columns')
    tables, views, columns = copied[0], copied[1], copied[2]
    assert len(tables) + len(views) == 13
    assert sum(c is not None for _, c, _ in tables + views) + sum(r[4] is not None for r in columns) == 213
    assert [k for k, _ in copied[4]] == ["schema_version", "layout", "views"]


def test_a_template_whose_bytes_changed_is_replaced(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    Store(tmp_path / "a.duckdb").close()
    (name,) = _templates(cache)
    path = cache / "traceprof" / name
    path.write_bytes(path.read_bytes()[:4096])  # cut short
    with Store(tmp_path / "b.duckdb") as s:  # built again, and the store opens
        assert s.con.execute("SELECT count(*) FROM runs").fetchall() == [(0,)]
    (again,) = _templates(cache)  # the cut one deleted (its bytes did not match its name), one built
    data = (cache / "traceprof" / again).read_bytes()
    assert len(data) > 4096 and again.endswith(f"-{hashlib.sha256(data).hexdigest()[:16]}.duckdb")
    assert not list((cache / "traceprof").glob(".*.tmp*"))  # the build left nothing beside it


@pytest.mark.parametrize("kind", ["fifo", "symlink to /dev/zero", "too large"])
def test_a_template_name_that_is_no_regular_file_is_not_read(tmp_path, monkeypatch, kind):
    # A FIFO of the template's name blocked the read (ingest hung); a link to /dev/zero would never end
    # it. Such a name is not read: replaced by a template built again, and the store opens.
    import os

    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    Store(tmp_path / "a.duckdb").close()
    (name,) = _templates(cache)
    path = cache / "traceprof" / name
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "too large":
        with open(path, "wb") as f:
            f.truncate(template.MAX_TEMPLATE_BYTES + 1)
    else:
        path.symlink_to("/dev/zero")
    with Store(tmp_path / "b.duckdb") as s:
        assert s.con.execute("SELECT count(*) FROM runs").fetchall() == [(0,)]
    (again,) = _templates(cache)  # the odd entry removed, a whole template in its place
    assert (cache / "traceprof" / again).is_file() and not (cache / "traceprof" / again).is_symlink()


def test_a_parquet_store_is_not_copied(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with Store(tmp_path / "p.duckdb", layout="parquet") as s:
        assert s.layout == "parquet"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("refusal", [OSError(28, "No space left on device"), duckdb.IOException("disk")])
def test_a_template_that_cannot_be_built_leaves_the_store_made_by_statements(tmp_path, monkeypatch, refusal):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def refused(folder, key):
        raise refusal

    monkeypatch.setattr(template, "_build", refused)
    with Store(tmp_path / "a.duckdb") as s:
        assert s.created and s.con.execute("SELECT value FROM meta WHERE key = 'layout'").fetchall() == [
            ("duckdb",)
        ]
    assert not (tmp_path / "cache" / "traceprof").exists() or not _templates(tmp_path / "cache")


def test_stores_created_at_once_with_no_template_each_get_a_whole_one(tmp_path, monkeypatch):
    # two first ingests at once (here two threads): each builds a template under a name of its own
    # and renames it into place whole; every store copied opens with the schema
    import threading

    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    errors: list[BaseException] = []

    def create(i: int) -> None:
        try:
            Store(tmp_path / f"s{i}.duckdb").close()
        except BaseException as e:  # noqa: BLE001 - raised by the test below
            errors.append(e)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    names = _templates(cache)
    assert 1 <= len(names) <= 3 and not list((cache / "traceprof").glob(".*.tmp*"))
    for name in names:  # each whole: its bytes match its name
        data = (cache / "traceprof" / name).read_bytes()
        assert name.endswith(f"-{hashlib.sha256(data).hexdigest()[:16]}.duckdb")
    made = _schema(tmp_path / "s0.duckdb")
    assert _schema(tmp_path / "s1.duckdb") == made == _schema(tmp_path / "s2.duckdb")
