"""What ingest says after a failure or when there is nothing to store: the truth about the store."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests._cli_inproc import run
from tests.builders import micro_trace
from tests.conftest import corpus
from traceprof.core.locking import StoreLock


def _runs(db) -> list[str]:
    code, out, _ = run("runs", "--db", str(db), "-f", "json")
    assert code == 0
    return sorted(r["name"] for r in json.loads(out))


def test_a_refused_run_stores_no_other_run_of_the_ingest(tmp_path):
    """Folder x/ gains a second rank-1 file (trace_compare's) beside the one stored in run 'x'
    (trace_diff's): 'x' is refused, and run 'y' of the same ingest used to be stored while the error
    said nothing of it."""
    import shutil

    db, top = tmp_path / "s.duckdb", tmp_path / "top"
    (top / "x").mkdir(parents=True)
    shutil.copy(corpus("hta/trace_diff/test/test.json.gz"), top / "x" / "a.json.gz")
    assert run("ingest", str(top / "x"), "--db", str(db))[0] == 0
    shutil.copy(corpus("hta/trace_compare/test/test.json.gz"), top / "x" / "b.json.gz")
    (top / "y").mkdir()
    shutil.copy(corpus("hta/trace_diff/control/control.json.gz"), top / "y" / "control.json.gz")
    code, _, err = run("ingest", str(top), "--db", str(db))
    lines = [ln for ln in err.splitlines() if not ln.startswith("already stored")]
    assert code == 1 and len(lines) == 1 and "run 'x' already has rank 1" in lines[0], err
    assert lines[0].startswith(f"error: {top.resolve()}/x/b.json.gz: ")  # paths resolved
    assert _runs(db) == ["x"]  # 'y' was not stored either


def test_folders_of_one_leaf_name_and_other_jobs_are_told_apart(tmp_path):
    """trace_compare stores run 'test' (rank 1 of 2); trace_diff's folder 'test' holds rank 1 of
    another job: it is run 'trace_diff/test' (with a note saying why), never a failed ingest."""
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(corpus("hta/trace_compare")), "--db", str(db))[0] == 0
    code, _, err = run("ingest", str(corpus("hta/trace_diff")), "--db", str(db))
    assert code == 0, err
    assert "run 'test' in the store is another job (rank 1 is in " in err
    assert "these files are run 'trace_diff/test'" in err
    assert _runs(db) == ["base", "control", "test", "trace_diff/test"]


def test_a_folder_of_non_traces_is_an_error_naming_what_was_skipped(tmp_path):
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "config.json").write_text('{"lr": 0.1}')
    (d / "a.txt").write_text("hello")
    (d / "blob.bin").write_bytes(bytes(range(256)))
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(d), "--db", str(db))
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {d}: no trace files found") and "config.json" in lines[0], err
    assert not db.exists()  # a failed first ingest leaves no store


def test_a_folder_already_stored_is_success(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm"])))
    (d / "config.json").write_text('{"lr": 0.1}')
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(d), "--db", str(db))[0] == 0
    code, _, err = run("ingest", str(d), "--db", str(db))
    assert code == 0 and "0 file(s) ingested, 1 already stored" in err, err


def test_the_header_of_several_failures_names_no_single_file(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "empty.json").write_text("")
    (d / "rank1.json").write_bytes(b"\x00garbage")
    (d / "rank2.json").write_text(json.dumps(micro_trace(["aten::mm"], rank=2, world=3)))
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    lines = err.splitlines()
    assert code == 1 and len(lines) == 3, err
    assert lines[0] == "error: 2 of 3 files cannot be read, nothing stored (--partial stores the others):"
    assert sorted(ln.split(":")[0].strip() for ln in lines[1:]) == [
        str(d / "empty.json"),
        str(d / "rank1.json"),
    ]
    (d / "rank2.json").unlink()  # every file fails: no others for --partial to store
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and err.splitlines()[0] == "error: 2 of 2 files cannot be read, nothing stored:", err


def test_ctrl_c_while_opening_the_store_says_it_is_as_it_was(tmp_path, monkeypatch):
    """A Ctrl-C before the store is open (waiting for its lock, say) reached cli.main's fallback,
    'interrupted; nothing was changed', not the ingest's own wording."""
    from traceprof import cli

    db = tmp_path / "s.duckdb"
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm"])))

    def interrupt(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "Store", interrupt)
    monkeypatch.setattr(cli, "_exit", __import__("sys").exit)  # cli exits 130 with os._exit
    code, _, err = run("ingest", str(job), "--db", str(db))
    assert (code, err) == (130, f"interrupted; nothing stored, no store created ({db})\n")


def test_waiting_for_the_lock_says_so_once(tmp_path, capfd):
    db = tmp_path / "s.duckdb"
    lock_file = tmp_path / "s.duckdb.lock"
    import fcntl
    import os

    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process's lock: flock locks per open file
    threading.Timer(1.6, lambda: os.close(fd)).start()
    t0 = time.monotonic()
    lock = StoreLock(db, exclusive=True, timeout_s=10)
    waited = time.monotonic() - t0
    lock.release()
    err = capfd.readouterr().err
    assert 1.5 < waited < 5
    assert err.count("\n") == 1 and err.startswith(f"waiting for {db}: another traceprof process"), err


def test_a_free_lock_says_nothing(tmp_path, capfd):
    StoreLock(tmp_path / "s.duckdb", exclusive=True).release()
    assert capfd.readouterr().err == ""


def test_a_run_failing_after_another_was_stored_says_which_was(tmp_path, monkeypatch):
    """A failure the up-front checks cannot see (here: matching the second run's collectives) comes
    after the first run's commit: the error says that run was stored (it used to say only the error)."""
    from traceprof.core.errors import StoreError
    from traceprof.ingest import ingest as ingest_mod

    for name in ("a", "b"):  # two contents: one ingest reads a file of another's content once
        (tmp_path / "in" / name).mkdir(parents=True)
        (tmp_path / "in" / name / "rank0.json").write_text(json.dumps(micro_trace([f"aten::mm_{name}"])))
    real = ingest_mod._settle_run

    def settle(store, run_id, align):
        if run_id == 2:
            raise StoreError("matching failed")
        return real(store, run_id, align)

    monkeypatch.setattr(ingest_mod, "_settle_run", settle)
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(tmp_path / "in"), "--db", str(db))
    assert (code, err) == (1, "error: stored run 'a' (id 1); run 'b' not stored: matching failed\n")
    monkeypatch.undo()
    assert _runs(db) == ["a"]


def test_ranks_traced_counts_the_whole_run_not_this_ingest(tmp_path):
    """Appending the last ranks of a run must not warn that ranks are missing: the count is of the
    run's ranks in the store (2 of 4 after the first ingest, none missing after the second), not of
    the files of this command."""
    from tests.conftest import SAMPLES

    db = tmp_path / "s.duckdb"
    files = sorted((SAMPLES / "normal").glob("rank*.trace.json.gz"))
    assert len(files) == 4
    code, _, err = run("ingest", *map(str, files[:2]), "--run", "normal", "--db", str(db))
    assert code == 0 and "run 'normal': 2 of 4 ranks traced" in err, err
    code, _, err = run("ingest", *map(str, files[2:3]), "--run", "normal", "--db", str(db))
    assert code == 0 and "run 'normal': 3 of 4 ranks traced" in err, err
    code, _, err = run("ingest", str(SAMPLES / "normal"), "--run", "normal", "--db", str(db))
    assert code == 0 and "ranks traced" not in err and "1 file(s) ingested, 3 already stored" in err, err


def test_a_rank_that_is_not_an_integer_says_so(tmp_path):
    """distributedInfo.rank "abc" warned "no distributedInfo.rank in the trace" (1.5 was read as rank 1,
    silently); the warning names the file and the value. With a second file the error says why."""
    from traceprof.core.errors import TraceFormatError
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    for k, value in enumerate(("abc", 1.5, True, [0])):
        d = tmp_path / f"one{k}"
        d.mkdir()
        doc = micro_trace(["x"])
        doc["distributedInfo"]["rank"] = value
        (d / "rank0.json").write_text(json.dumps(doc))
        with Store(d / "s.duckdb") as store:
            res = ingest(store, [d / "rank0.json"], jobs=1)
            assert res.warnings[:2] == [
                f"rank0.json: distributedInfo.rank is {value!r}, not an integer: ignored",
                "rank0.json: rank unknown, stored as rank 0 of run 'rank0'",  # a lone file: its name
            ]
    d = tmp_path / "two"
    d.mkdir()
    doc = micro_trace(["x"], world=2)
    doc["distributedInfo"]["rank"] = 1.5
    (d / "r0.json").write_text(json.dumps(doc))
    (d / "r1.json").write_text(json.dumps(micro_trace(["x"], rank=0, world=2)))
    with Store(tmp_path / "two.duckdb") as store, pytest.raises(TraceFormatError) as e:
        ingest(store, [d], jobs=1)
    assert str(e.value) == (
        f"{(d / 'r0.json').resolve()}: distributedInfo.rank: no rank in the trace "
        "(distributedInfo.rank is 1.5, not an integer: ignored) and 2 files in run 'two'; add a "
        '<name>.meta.json sidecar with "rank", or ingest the file alone with --run'
    )


def test_a_world_size_below_one_is_ignored_with_a_warning(tmp_path):
    # distributedInfo.world_size -3 was stored (traces.world_size = -3) without a word; now ignored
    # as a rank that is not an integer is: warned, counted in the issues, NULL. The sidecar's too,
    # and 0; a run's world size then comes from its ranks. nsys: WORLD_SIZE=0 in the environment.
    from traceprof.collectors.nsys.ranks import Env, world_size
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    for k, (where, value) in enumerate((("trace", -3), ("trace", 0), ("sidecar", -1))):
        d = tmp_path / f"w{k}"
        d.mkdir()
        doc = micro_trace(["x"])
        field = "distributedInfo.world_size" if where == "trace" else "world_size"
        if where == "trace":
            doc["distributedInfo"]["world_size"] = value
        else:
            del doc["distributedInfo"]["world_size"]
            (d / "rank0.meta.json").write_text(json.dumps({"rank": 0, "world_size": value}))
        (d / "rank0.json").write_text(json.dumps(doc))
        with Store(d / "s.duckdb") as store:
            res = ingest(store, [d], jobs=1)
            name = "rank0.json" if where == "trace" else "rank0.meta.json"
            assert f"{name}: {field} is {value}, not a positive integer: ignored" in res.warnings
            assert store.sql("SELECT world_size FROM traces").rows() == [(None,)]
            assert store.runs()["issues"].to_list() == [
                f"1 repaired: {field} not a positive integer: ignored"
            ]
    assert world_size(Env("PATH=/bin\nWORLD_SIZE=0"), False) is None
    assert world_size(Env("PATH=/bin\nWORLD_SIZE=4"), False) == 4


def test_a_backend_that_is_not_a_string_is_ignored_with_a_warning(tmp_path):
    # distributedInfo.backend {"x": 1} was stored as Python's text of it, "{'x': 1}".
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    doc = micro_trace(["x"])
    doc["distributedInfo"]["backend"] = {"x": 1}
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    with Store(tmp_path / "s.duckdb") as store:
        res = ingest(store, [tmp_path / "rank0.json"], jobs=1)
        assert "rank0.json: distributedInfo.backend is {'x': 1}, not a string: ignored" in res.warnings
        assert store.sql("SELECT backend FROM traces").rows() == [(None,)]


_META = {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}


@pytest.mark.parametrize(
    ("events", "said"),
    [
        # {"traceEvents": []} (a capture that recorded nothing) was stored as a run with no word of it
        ([], "no events in the trace (an empty capture?)"),
        # a rank whose trace holds only a process_name event was stored with no word of it
        ([_META], "no event to store (of 1 read: 1 metadata)"),
    ],
)
def test_a_rank_with_nothing_to_store_is_stored_with_a_warning_beside_others(tmp_path, events, said):
    """One rank of a run that stores no event (none in its trace, or metadata only) is stored with a
    warning naming it; the run's other rank is not named."""
    d = tmp_path / "job"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(micro_trace(["a"], rank=0, world=2)))
    (d / "rank1.json").write_text(json.dumps(micro_trace([], rank=1, world=2) | {"traceEvents": events}))
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    assert code == 0, err
    assert f"warning: rank1.json: {said}; its run has no activity from it\n" in err
    assert "rank0.json: no event" not in err


@pytest.mark.parametrize(
    ("key", "value", "stored", "said"),
    [
        # one rule for a rank or world size (traceprof.core.values.identity_int), as for Kineto's id
        # args: a string or float that writes an integer is read as it, said and counted ("7" was
        # read silently); anything else is ignored, said and counted. hta's trace_compare/base has
        # distributedInfo {"rank": 1} and no world_size: without one the run's world is 2 (rank 1).
        ("world_size", "7", ("runs", 7), "a string: read as its integer"),
        ("world_size", 7.0, ("runs", 7), "a float: read as its integer"),
        ("world_size", "4.0", ("runs", 2), "not an integer: ignored"),
        ("world_size", "1e1", ("runs", 2), "not an integer: ignored"),
        ("world_size", 7.9, ("runs", 2), "not an integer: ignored"),
        ("world_size", True, ("runs", 2), "not an integer: ignored"),
        ("rank", "3", ("traces", 3), "a string: read as its integer"),
    ],
)
def test_rank_or_world_size_written_as_text_is_one_rule(tmp_path, key, value, stored, said):
    import gzip

    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    doc = json.loads(gzip.decompress(corpus("hta/trace_compare/base/base.json.gz").read_bytes()))
    assert doc["distributedInfo"] == {"rank": 1}
    doc["distributedInfo"][key] = value
    (tmp_path / "base.json").write_text(json.dumps(doc))
    with Store(tmp_path / "s.duckdb") as store:
        res = ingest(store, [tmp_path / "base.json"], jobs=1)
        assert f"base.json: distributedInfo.{key} is {value!r}, {said}" in res.warnings
        table, want = stored
        column = "world_size" if table == "runs" else "rank"
        assert store.sql(f"SELECT {column} FROM {table}").item() == want
        assert store.runs()["issues"].to_list() == [f"1 repaired: distributedInfo.{key} {said}"]


def test_non_trace_files_in_a_folder_are_named_in_one_warning(tmp_path):
    """t16 h/mixed and h/fifo: a blob.bin, a data.xyz and a FIFO beside a trace were skipped without a
    word. Hand value: 3 skipped and named in path order (blob.bin, data.xyz, then the FIFO); the
    README.md and notes.txt beside them are documents, expected in a run folder, skipped quietly
    (the sample runs each hold a README.md); the trace is stored."""
    import os

    d = tmp_path / "job"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm"])))
    (d / "README.md").write_text("run notes")
    (d / "blob.bin").write_bytes(bytes(range(256)))
    (d / "data.xyz").write_bytes(b"\x00\x01")
    (d / "notes.txt").write_text("lr 0.1")
    os.mkfifo(d / "z.json")  # never opened (opening it would block)
    code, _, err = run("ingest", str(d), "--db", str(tmp_path / "s.duckdb"))
    said = [ln for ln in err.splitlines() if "no collector reads" in ln]
    assert code == 0 and said == [
        f"warning: skipped 3 file(s) that no collector reads (not traces): {d}/blob.bin, {d}/data.xyz, "
        f"{d}/z.json: a FIFO (named pipe)"
    ], err
    assert _runs(tmp_path / "s.duckdb") == ["job"]
