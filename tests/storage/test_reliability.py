"""The store is never lost or half-written: locks, output paths, --db, Ctrl-C, kill -9, gzip bombs (issue 11).

Subprocess tests run the real console entry point (``traceprof.entry``) as a user or a CI job would.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests._cli_inproc import run
from tests.builders import micro_trace
from tests.conftest import SAMPLES
from traceprof.core import fileio
from traceprof.core.errors import StoreError, TraceFormatError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

CLI = [sys.executable, "-c", "from traceprof.entry import main; main()"]


def _job(tmp_path: Path, ranks: int = 2, name: str = "job") -> Path:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    for r in range(ranks):
        (d / f"rank{r}.json").write_text(
            json.dumps(micro_trace([f"op{i}" for i in range(50)], rank=r, world=ranks))
        )
    return d


def _state(db: Path) -> tuple | None:
    """(run name, traces, events) per run, or None when there is no run (no store, a store file
    without the schema yet, or a store without runs: the old state of a first ingest)."""
    if not db.exists():
        return None
    try:
        with Store(db, read_only=True) as s:
            return (
                tuple(
                    s.sql(
                        "SELECT r.name, count(t.trace_id), sum(t.events_kept) FROM runs r "
                        "LEFT JOIN traces t USING (run_id) GROUP BY ALL ORDER BY r.name"
                    ).rows()
                )
                or None
            )
    except StoreError as e:
        assert "empty store" in str(e)  # killed after creating the file, before the schema committed
        return None


def _session_alive(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``."""
    alive = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            alive.append(int(p.name))
    return alive


def _no_process_left(sid: int, wait_s: float = 5.0) -> None:
    deadline = time.monotonic() + wait_s
    while _session_alive(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _session_alive(sid) == []


# -- the lock and what a failed open may delete -------------------------------------------------


@pytest.mark.slow
def test_concurrent_first_ingest_20_times(tmp_path):
    """Two processes ingest into the same new store: both succeed (the second finds the files stored)
    or one fails with one line; the store always holds the run, whole."""
    d = _job(tmp_path)
    want = (("job", 2, 2 * 51),)
    for i in range(20):
        db = tmp_path / f"race{i}.duckdb"
        procs = [
            subprocess.Popen(
                [*CLI, "ingest", str(d), "--db", str(db)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        results = [(p.wait(), p.communicate()[1]) for p in procs]
        for code, err in results:
            assert code == 0 or (code == 1 and len(err.strip().splitlines()) == 1), err
            assert "Traceback" not in err
        assert 0 in [c for c, _ in results]
        assert _state(db) == want, (i, results)


def test_open_waits_for_the_lock_and_never_deletes_what_it_did_not_create(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as s:
        ingest(s, [_job(tmp_path)], jobs=1)
    before = db.read_bytes()
    fd = os.open(str(db) + ".lock", os.O_RDWR)  # another process's hold on the store
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(StoreError, match=r"s.duckdb: in use by another traceprof process for over 0 s"):
            Store(db, lock_timeout_s=0.2)
        new = tmp_path / "new.duckdb"
        Store(new).close()
        os.close(fd)
        fd = os.open(str(new) + ".lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(StoreError, match="in use"):
            Store(new, lock_timeout_s=0.1)
        assert new.exists()
    finally:
        os.close(fd)
    assert db.read_bytes() == before


def test_failed_ingest_keeps_an_existing_store_and_leaves_no_new_one(tmp_path):
    db = tmp_path / "s.duckdb"
    bad = tmp_path / "bad" / "rank0.json"
    bad.parent.mkdir()
    bad.write_text("{")
    assert run("ingest", str(bad), "--db", str(db))[0] == 1
    assert not db.exists() and not Path(str(db) + ".wal").exists()
    assert run("ingest", str(_job(tmp_path)), "--db", str(db))[0] == 0
    assert run("ingest", str(bad), "--db", str(db))[0] == 1
    assert _state(db) == (("job", 2, 102),)


# -- output paths and --db ------------------------------------------------------------------------


def test_no_output_path_can_be_the_store(tmp_path):
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(_job(tmp_path)), "--db", str(db))[0] == 0
    before = db.read_bytes()
    (tmp_path / "link.html").symlink_to(db)
    os.link(db, tmp_path / "hard.json")
    for args in (
        ["report", "-o", str(db)],
        ["report", "-o", str(tmp_path / "link.html")],
        ["export", "perfetto", "-o", str(tmp_path / "hard.json")],
        ["export", "perfetto", "-o", str(db) + ".wal"],
        ["collect", "-o", str(db), "--no-ingest"],
    ):
        code, _, err = (
            run(*args, "--db", str(db), "--", "train.py")
            if args[0] == "collect"
            else run(*args, "--db", str(db))
        )
        target = args[args.index("-o") + 1]
        assert code == 1 and err.startswith(f"error: {target}: would overwrite the store {db}"), (args, err)
    assert db.read_bytes() == before


def test_db_must_be_a_duckdb_file_or_a_new_path(tmp_path):
    js = tmp_path / "some.json"
    js.write_text('{"a": 1}')
    code, _, err = run("ingest", str(_job(tmp_path)), "--db", str(js))
    assert code == 1
    assert err == (
        f"error: {js}: not a DuckDB file (it starts with b'{{\"a\": 1}}'); --db takes a traceprof "
        "store or a new path\n"
    )
    assert js.read_text() == '{"a": 1}'
    code, _, err = run("runs", "--db", str(tmp_path))
    assert (
        code == 1
        and err
        == f"error: {str(tmp_path)!r}: a folder, not a store file; --db takes a store file or a new path\n"
    )
    assert (
        run("ingest", str(_job(tmp_path)), "--db", str(tmp_path / "new.json"))[0] == 0
    )  # a new path: a store


@pytest.mark.parametrize("folder", ["qu?es", "back\\slash"])
def test_db_path_duckdb_cannot_open_is_refused_in_one_line(tmp_path, folder):
    db = tmp_path / folder / "s.duckdb"  # DuckDB cuts a path at '?' and reads '\\' as '/'
    db.parent.mkdir()
    code, _, err = run("ingest", str(_job(tmp_path)), "--db", str(db))
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert (
        err.startswith(f"error: {db}: DuckDB cannot keep a store at a path holding")
        and "use another --db path" in err
    )
    assert sorted(p.name for p in db.parent.iterdir()) == []  # not even a lock file


def test_store_folder_without_room_for_a_spool_keeps_the_events_in_memory(tmp_path, monkeypatch):
    # a store whose folder cannot take the spool folder (read-only, immutable, full of inodes):
    # the parsed events come back in memory, with the same rows
    from traceprof.storage import layout

    def refuse(db):
        raise PermissionError(1, "Operation not permitted", str(db))

    ref, db = tmp_path / "ref.duckdb", tmp_path / "s.duckdb"
    assert run("ingest", str(_job(tmp_path)), "--db", str(ref))[0] == 0
    monkeypatch.setattr(layout, "spool_dir", refuse)
    code, _, err = run("ingest", str(_job(tmp_path)), "--db", str(db))
    assert code == 0, err
    assert _state(db) == _state(ref) and _state(db)[0][1] == 2


# -- Ctrl-C and kill -9 ---------------------------------------------------------------------------


def _timed_ingest(tmp_path: Path, d: Path) -> float:
    t = time.monotonic()
    r = subprocess.run(
        [*CLI, "ingest", str(d), "--db", str(tmp_path / "ref.duckdb"), "-j", "2"], capture_output=True
    )
    assert r.returncode == 0, r.stderr
    return time.monotonic() - t


def _start(tmp_path: Path, k: int, d: Path, name: str) -> tuple[Path, tuple | None, subprocess.Popen]:
    """Start ``ingest d -j 2`` in its own session into store ``<name><k>``; odd ``k`` first get an
    existing run 'old'. Returns (store, old state, process)."""
    db = tmp_path / f"{name}{k}.duckdb"
    old = None
    if k % 2:
        with Store(db) as s:
            ingest(s, [_job(tmp_path, 1, "old")], jobs=1)
        old = _state(db)
    p = subprocess.Popen(
        [*CLI, "ingest", str(d), "--db", str(db), "-j", "2"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return db, old, p


@pytest.mark.slow
def test_ctrl_c_leaves_old_or_new_state_and_says_which(tmp_path):
    d = SAMPLES / "normal"
    total = _timed_ingest(tmp_path, d)
    new_run = _state(tmp_path / "ref.duckdb")[0]
    for k in range(8):
        db, old, p = _start(tmp_path, k, d, "int")
        time.sleep(total * (0.15 + 0.85 * k / 8))
        os.killpg(p.pid, signal.SIGINT)  # as a terminal does: the whole process group
        _, err = p.communicate()
        _no_process_left(p.pid)
        state = _state(db)
        if p.returncode == 0:  # finished first
            assert state == tuple(sorted((*(old or ()), new_run)))
            continue
        lines = err.strip().splitlines()
        assert p.returncode == 130 and len(lines) == 1 and "Traceback" not in err, err
        # The ingest's own wording; cli.main's store-less one only before the command starts.
        if lines[0] in (
            f"interrupted; nothing stored, {db} is as it was",
            f"interrupted; nothing stored, no store created ({db})",
            "interrupted; nothing was changed",
        ):
            assert state == old, (k, lines)
        else:
            assert (
                lines[0]
                == f"interrupted; stored run 'normal' (id {2 if old else 1}) in {db}; the rest of this ingest was not stored"
            )
            assert state == tuple(sorted((*(old or ()), new_run)))


@pytest.mark.slow
def test_sigkill_at_20_moments(tmp_path):
    """kill -9 of ingest at 20 moments: the store opens with the old or the new state, re-ingest
    works, and no parser worker outlives it."""
    d = SAMPLES / "normal"
    total = _timed_ingest(tmp_path, d)
    new_run = _state(tmp_path / "ref.duckdb")[0]
    for k in range(20):
        db, old, p = _start(tmp_path, k, d, "kill")
        time.sleep(total * (k + 0.5) / 20)
        p.kill()
        p.communicate()
        _no_process_left(p.pid)
        state = _state(db)
        assert state in (old, tuple(sorted((*(old or ()), new_run)))), (k, state)
        with Store(db) as s:  # re-ingest: stores the run, or finds it stored
            ingest(s, [d], jobs=1)
        assert _state(db) == tuple(sorted((*(old or ()), new_run))), k


def test_parser_workers_die_with_their_parent(tmp_path):
    """A worker started by procs.map_in_workers gets SIGKILL when its parent dies."""
    script = (
        "import os, sys, time\n"
        "from traceprof.core import procs\n"
        "def work(x):\n"
        "    os.write(1, b'%d\\n' % os.getpid()); time.sleep(60)\n"  # one write: lines never interleave
        "procs.map_in_workers(work, [1, 2], 2)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    workers = [int(p.stdout.readline()) for _ in range(2)]
    assert len(_session_alive(p.pid)) == 3
    p.kill()
    p.wait()
    _no_process_left(p.pid, 3.0)
    assert all(
        not Path(f"/proc/{w}").exists() or "\nState:\tZ" in Path(f"/proc/{w}/status").read_text()
        for w in workers
    )


def test_interrupt_while_committing_is_held_until_the_commit_is_done(tmp_path):
    """A Ctrl-C that arrives during COMMIT: the run is stored and recorded, then KeyboardInterrupt."""
    with Store(tmp_path / "s.duckdb") as s:
        real = s.con.execute

        class Con:  # DuckDB connections cannot be patched; wrap the one method
            def __getattr__(self, name):
                return getattr(s.con_real, name)

            def execute(self, q, *a):
                if q == "COMMIT":
                    os.kill(os.getpid(), signal.SIGINT)  # delivered while the commit runs
                return real(q, *a)

        s.con_real, s.con = s.con, Con()
        with pytest.raises(KeyboardInterrupt):
            ingest(s, [_job(tmp_path)], jobs=1)
        s.con = s.con_real
        assert s.commits == [("job", 1)]
    assert _state(tmp_path / "s.duckdb") == (("job", 2, 102),)


class _FailAt:
    """Stands in for a Store's DuckDB connection (which cannot be patched): ``execute(sql)`` raises
    ``exc`` when ``sql`` is ``at``, as DuckDB does when Ctrl-C stops that statement."""

    def __init__(self, con, at: str, exc: BaseException) -> None:
        self.real, self.at, self.exc = con, at, exc

    def __getattr__(self, name):
        return getattr(self.real, name)

    def execute(self, q, *a):
        if q == self.at:
            raise self.exc
        return self.real.execute(q, *a)


# What Ctrl-C during a DuckDB statement raises: Python's KeyboardInterrupt (between statements),
# DuckDB's RuntimeError (its check of Python's signals during a query), its InterruptException, and a
# KeyboardInterrupt raised while DuckDB read a Python Arrow stream, quoted in DuckDB's own error.
_CTRL_C = [
    KeyboardInterrupt(),
    RuntimeError("Query interrupted"),
    duckdb.InterruptException("INTERRUPT Error: Interrupted!"),
    duckdb.InvalidInputException("Invalid Input Error: arrow_scan failed: KeyboardInterrupt: "),
]


@pytest.mark.parametrize("exc", _CTRL_C, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("at", ["CHECKPOINT", "RESET memory_limit"])
def test_interrupt_after_the_commit_is_raised_and_the_run_is_recorded(tmp_path, at, exc):
    """Ctrl-C in the statements insert_run runs after its commit: KeyboardInterrupt (not swallowed
    with DuckDB's errors), and the run is stored and in commits."""
    db = tmp_path / "s.duckdb"
    with Store(db) as s:
        s.con = _FailAt(s.con, at, exc)
        with pytest.raises(KeyboardInterrupt):
            ingest(s, [_job(tmp_path)], jobs=1)
        s.con = s.con.real
        assert s.commits == [("job", 1)]
    assert _state(db) == (("job", 2, 102),)


def test_a_failed_checkpoint_after_the_commit_is_ignored(tmp_path):
    """Not Ctrl-C: the rows are committed and a later checkpoint will do, so ingest succeeds."""
    db = tmp_path / "s.duckdb"
    with Store(db) as s:
        s.con = _FailAt(s.con, "CHECKPOINT", duckdb.IOException("IO Error: disk full"))
        assert ingest(s, [_job(tmp_path)], jobs=1).runs == {"job": 1}
        s.con = s.con.real
    assert _state(db) == (("job", 2, 102),)


def _cli_ingest_through(monkeypatch, wrap, folder: Path, db: Path) -> tuple[int, str]:
    """``traceprof ingest FOLDER --db DB`` in this process, every Store's connection wrapped by
    ``wrap`` (a connection cannot be patched): (exit code, stderr)."""
    from traceprof import cli
    from traceprof.storage import store as store_mod

    real_init = store_mod.Store.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        self.con = wrap(self.con)

    monkeypatch.setattr(store_mod.Store, "__init__", init)
    monkeypatch.setattr(cli, "_exit", sys.exit)  # cli exits 130 with os._exit, which would end pytest
    handler = signal.getsignal(signal.SIGINT)
    try:
        code, _, err = run("ingest", str(folder), "--db", str(db))
    finally:
        signal.signal(signal.SIGINT, handler)  # the CLI ignores a second Ctrl-C while it cleans up
        monkeypatch.undo()
    return code, err


@pytest.mark.parametrize("exc", _CTRL_C, ids=lambda e: type(e).__name__)
def test_cli_ctrl_c_after_the_commit_says_stored_and_exits_130(tmp_path, monkeypatch, exc):
    """The CLI reports an interrupt after the commit from store.commits: stored, exit 130 (it used to
    say "nothing was changed" for DuckDB's RuntimeError, and exit 0 for the rest)."""
    db = tmp_path / "s.duckdb"
    code, err = _cli_ingest_through(
        monkeypatch, lambda con: _FailAt(con, "CHECKPOINT", exc), _job(tmp_path), db
    )
    assert (code, err) == (
        130,
        f"interrupted; stored run 'job' (id 1) in {db}; the rest of this ingest was not stored\n",
    )
    assert _state(db) == (("job", 2, 102),)


class _LostInterrupt(_FailAt):
    """A Ctrl-C whose report DuckDB lost (a clean-up swallowed it) during ``at``: the signal arrives
    and its KeyboardInterrupt goes nowhere, then the statement fails as the aborted transaction makes
    the next one fail. The flaky CI run of f557c99 ended this way: rc 1 with "TransactionContext
    Error: Current transaction is aborted" instead of the interrupt."""

    def execute(self, q, *a):
        if isinstance(q, str) and q.lstrip().startswith(self.at):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs here, at the latest
            except KeyboardInterrupt:
                pass
            raise duckdb.TransactionException(
                "TransactionContext Error: Current transaction is aborted (please ROLLBACK)"
            )
        return self.real.execute(q, *a)


def test_an_error_after_a_lost_ctrl_c_is_the_interrupt_and_nothing_is_stored(tmp_path, monkeypatch):
    """Any error in an ingest's transaction once Ctrl-C has arrived is that Ctrl-C: the API raises
    KeyboardInterrupt, the CLI says nothing was stored and exits 130; the store is as it was."""
    db = tmp_path / "s.duckdb"
    with Store(db) as s:
        ingest(s, [_job(tmp_path, name="first")], jobs=1)
        s.con = _LostInterrupt(s.con, "UPDATE runs", KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            ingest(s, [_job(tmp_path, ranks=3, name="second")], jobs=1)
        s.con = s.con.real
        assert s.commits == [("first", 1)]
    assert _state(db) == (("first", 2, 102),)

    code, err = _cli_ingest_through(
        monkeypatch,
        lambda con: _LostInterrupt(con, "UPDATE runs", KeyboardInterrupt()),
        _job(tmp_path, ranks=4, name="third"),
        db,
    )
    assert (code, err) == (130, f"interrupted; nothing stored, {db} is as it was\n")
    assert _state(db) == (("first", 2, 102),)


class _Dropped:
    """Ctrl-C inside ``__del__``: Python prints "Exception ignored" and drops its KeyboardInterrupt
    (the trial saw it dropped in a WeakSet callback, and the ingest went on to store with exit 0)."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs here, at the latest; its KeyboardInterrupt goes nowhere


class _DropInterrupt(_FailAt):
    """Before ``at``: a Ctrl-C whose KeyboardInterrupt Python drops; the statement then runs."""

    def execute(self, q, *a):
        if isinstance(q, str) and q.lstrip().startswith(self.at):
            _Dropped()
        return self.real.execute(q, *a)


def test_a_ctrl_c_python_dropped_still_stops_the_ingest(tmp_path, monkeypatch, capfd):
    """The run the transaction had under way is committed (nothing told it to stop), then the
    Ctrl-C is raised: the API raises KeyboardInterrupt with the run in commits, the CLI says what was
    stored and exits 130, and no "Exception ignored" traceback reaches the terminal."""
    db = tmp_path / "s.duckdb"
    with Store(db) as s:
        ingest(s, [_job(tmp_path, name="first")], jobs=1)
        s.con = _DropInterrupt(s.con, "UPDATE runs", KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            ingest(s, [_job(tmp_path, ranks=3, name="second")], jobs=1)
        s.con = s.con.real
        assert s.commits == [("first", 1), ("second", 2)]
    assert _state(db) == (("first", 2, 102), ("second", 3, 153))

    capfd.readouterr()
    code, err = _cli_ingest_through(
        monkeypatch,
        lambda con: _DropInterrupt(con, "UPDATE runs", KeyboardInterrupt()),
        _job(tmp_path, ranks=4, name="third"),
        db,
    )
    assert (code, err) == (
        130,
        f"interrupted; stored run 'third' (id 3) in {db}; the rest of this ingest was not stored\n",
    )
    assert "Exception ignored" not in capfd.readouterr().err
    assert _state(db) == (("first", 2, 102), ("second", 3, 153), ("third", 4, 204))


def test_cli_ctrl_c_while_reporting_is_ignored(tmp_path, monkeypatch):
    """Once every run is committed the report is printed whole (exit 0): a Ctrl-C then changes nothing."""
    from traceprof import cli

    real_say = cli.say

    def say(message, *a, **kw):
        os.kill(os.getpid(), signal.SIGINT)  # ignored: this process is past its last commit
        real_say(message, *a, **kw)

    monkeypatch.setattr(cli, "say", say)
    monkeypatch.setattr(cli, "_exit", sys.exit)  # were it taken as Ctrl-C: exit 130 without ending pytest
    handler = signal.getsignal(signal.SIGINT)
    db = tmp_path / "s.duckdb"
    try:
        code, _, err = run("ingest", str(_job(tmp_path)), "--db", str(db))
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert (code, err) == (0, f"run 'job' (id 1): stored in {db}\n2 file(s) ingested, 0 already stored\n")
    assert after is handler  # restored once the report was printed


def test_parser_workers_never_see_ctrl_c(tmp_path):
    """A Ctrl-C that reaches a worker before its initializer has set it to be ignored is dropped: no
    traceback, no broken pool (workers are forked with SIGINT blocked)."""
    script = (
        "import os, signal\n"
        "from traceprof.core import procs\n"
        "real = procs.worker_init\n"
        "def init(*a):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"  # as the terminal's Ctrl-C reaching a just-forked worker
        "    real(*a)\n"
        "procs.worker_init = init\n"
        "def work(x):\n"
        "    return x * 2, signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
        "print(procs.map_in_workers(work, [1, 2, 3], 2))\n"
        "print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "[(2, True), (4, True), (6, True)]\nFalse\n", "")


def test_ctrl_c_before_the_query_starts_still_stops_it(tmp_path):
    """A Ctrl-C that lands after the helper thread started but before DuckDB runs the query (a loaded
    machine), or while an earlier statement of the same work runs, is spent on that one: the query must
    still be stopped, not run for hours."""
    script = (
        "import _thread, sys, threading, time\n"
        "from traceprof.storage.store import Store\n"
        "store = Store(sys.argv[1])\n"
        "def fn():\n"
        "    time.sleep(0.2)\n"  # the main thread waits in interruptible() by now
        "    _thread.interrupt_main()\n"  # the Ctrl-C, while the query has not started yet
        "    time.sleep(0.3)\n"
        "    store.con.execute('SELECT 1').fetchall()\n"  # a first statement (as binding the query) takes the interrupt
        "    return store.con.execute('SELECT count(*) FROM range(100000000000) a WHERE a.range % 7 = 3').fetchall()\n"
        "try:\n"
        "    store.interruptible(fn)\n"
        "except KeyboardInterrupt:\n"
        "    time.sleep(0.5)\n"  # where the old code left the query running, started after its interrupt
        "    print('stopped', store.con.execute('SELECT 42').fetchone())\n"  # waits for a running query
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "s.duckdb")], capture_output=True, text=True, timeout=60
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "stopped (42,)\n", "")


@pytest.mark.slow
def test_ctrl_c_in_sql_is_one_line_and_130(tmp_path):
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(_job(tmp_path)), "--db", str(db))[0] == 0
    p = subprocess.Popen(
        [*CLI, "sql", "SELECT count(*) FROM range(100000000000) a WHERE a.range % 7 = 3", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(4)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert (p.returncode, err) == (
        130,
        f"interrupted; nothing stored, {db} is as it was (sql is read-only)\n",
    )


# -- bounded memory ------------------------------------------------------------------------------


def _bomb(path: Path) -> int:
    """A ~2 MB gzip that inflates to 2 GiB: 2048 gzip members of 1 MiB of spaces each."""
    member = gzip.compress(b" " * (1 << 20), 9)
    path.write_bytes(gzip.compress(b'{"traceEvents": [', 9) + member * 2048)
    return path.stat().st_size


# The CLI, reporting its own peak RSS (getrusage) on stderr's last line. A process forked from pytest
# starts with pytest's RSS in its high-water mark, which exec keeps; so the CLI is started by a
# small `sh` that forks it (not exec), and measures itself.
# The peak is written last whichever way the command leaves: an ingest ends with os._exit (its
# code kept, no teardown), which skips a ``finally``.
_MEASURED = (
    "import os, resource, sys\nfrom traceprof.entry import main\n"
    "def peak():\n"
    "    sys.stderr.write(f'peak_rss_kib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
    "    sys.stderr.flush()\n"
    "_exit = os._exit\n"
    "def leave(code):\n    peak()\n    _exit(code)\n"
    "os._exit = leave\n"
    "try:\n    main()\nfinally:\n    peak()\n"
)


@pytest.mark.slow
def test_gzip_bomb_refused_under_1gb_rss(tmp_path):
    path = tmp_path / "rank0.json.gz"
    size = _bomb(path)
    assert 1_900_000 < size < 2_300_000
    r = subprocess.run(
        [
            "sh",
            "-c",
            '"$@"; exit $?',
            "sh",
            sys.executable,
            "-c",
            _MEASURED,
            "ingest",
            str(path),
            "--db",
            str(tmp_path / "s.duckdb"),
            "-j",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    *lines, rss = r.stderr.splitlines()
    peak_mib = int(rss.removeprefix("peak_rss_kib ")) / 1024  # Linux: KiB
    limit = 64 * size
    assert r.returncode == 1 and len(lines) == 1
    assert lines[0].startswith(f"error: {path}: byte ") and lines[0].endswith(
        f": inflates to more than {limit:,} bytes (64x the {size:,}-byte file): a gzip bomb or an unusually "
        "compressible trace; raise the cap with --max-inflate RATIO"
    ), lines
    assert peak_mib < 1024, peak_mib


def test_inflate_cap_is_a_ratio_with_a_floor(tmp_path, monkeypatch):
    raw = json.dumps(micro_trace(["a" * 100_000])).encode()  # compresses about 500x
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(raw, 9))
    monkeypatch.setattr(fileio, "MIN_INFLATE_BYTES", 1000)
    with pytest.raises(TraceFormatError, match=r"inflates to more than .* \(10x the"):
        fileio.read_maybe_gzip(path, 10)
    assert fileio.read_maybe_gzip(path, 1000)[1] == raw
    # where the floor is the cap (1x the file is less than its 1,000 bytes), the message says so
    size = path.stat().st_size
    assert size < 1000 < len(raw)
    with pytest.raises(TraceFormatError) as e:
        fileio.read_maybe_gzip(path, 1)
    assert str(e.value).endswith(
        f"inflates to more than 1,000 bytes (the cap's floor; 1x the {size:,}-byte file is {size:,} bytes): a "
        "gzip bomb or an unusually compressible trace; raise the cap with --max-inflate RATIO"
    ), e.value
    code, _, err = run("ingest", str(path), "--db", str(tmp_path / "s.duckdb"), "--max-inflate", "0")
    assert (code, err) == (
        1,
        "error: --max-inflate 0: expected a ratio above 0 and at most 1,000,000, e.g. 64 "
        "(gzip inflates at most about 1032x)\n",
    )
    # inf was an OverflowError traceback, and so was 1e308 (finite, but 1e308 x the size is not)
    for ratio in ("inf", "1e400", "nan", "1e308", "-1", "1000001"):
        code, _, err = run("ingest", str(path), "--db", str(tmp_path / "s.duckdb"), "--max-inflate", ratio)
        assert code == 1 and err.startswith("error: --max-inflate ") and "at most 1,000,000" in err, err
    # the largest: the byte limit is an integer
    assert fileio.read_maybe_gzip(path, fileio.MAX_INFLATE_RATIO)[1] == raw


def test_multi_member_and_corrupt_gzip(tmp_path):
    raw = json.dumps(micro_trace(["a"])).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(raw[:50]) + gzip.compress(raw[50:]) + b"\x00" * 8)
    assert fileio.read_maybe_gzip(path)[1] == raw
    path.write_bytes(gzip.compress(raw) + b"junk")
    with pytest.raises(TraceFormatError, match=rf"^{path}: byte \d+: data after the end of the gzip stream"):
        fileio.read_maybe_gzip(path)


@pytest.mark.parametrize("made_by", ["duckdb", "template"])
def test_a_store_file_is_created_whole_or_not_at_all(tmp_path, monkeypatch, made_by):
    """DuckDB writing a new file's headers (or the copy of the empty store,
    ``traceprof.storage.template``) when the process dies: the store path gets no half-made file (a
    later open failed with "not a valid DuckDB database file"); the partial file beside it is
    replaced by the next creation."""
    import traceprof.storage.store as store_mod
    from traceprof.storage import template

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = tmp_path / "s.duckdb"

    def killed(path, *a, **k):  # a few bytes of a header, then the process is gone
        Path(path).write_bytes(b"\0" * 100)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        if made_by == "duckdb":
            m.setattr(template, "copy_to", lambda path: False)  # no template: DuckDB makes the file
            m.setattr(store_mod.duckdb, "connect", killed)
        else:
            m.setattr(template, "copy_to", killed)
        with pytest.raises(KeyboardInterrupt):
            Store(db)
        assert not db.exists() and (tmp_path / "s.duckdb.new").exists()
    with Store(db) as s:
        assert s.created and s.sql("SELECT count(*) FROM runs").row(0) == (0,)
    assert not (tmp_path / "s.duckdb.new").exists()
    with Store(db, read_only=True) as s:  # a whole store, reopened
        assert s.sql("SELECT count(*) FROM runs").row(0) == (0,)


def test_outputs_never_overwrite_the_stores_parquet_files_or_kept_results(tmp_path):
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(_job(tmp_path)), "--db", str(db), "--layout", "parquet")[0] == 0
    assert run("report", "--db", str(db), "-o", str(tmp_path / "r.html"))[0] == 0  # keeps results
    part = next((tmp_path / "s.duckdb.parquet").rglob("*.parquet"))
    kept = next(f for f in (tmp_path / "s.duckdb.results").rglob("*") if f.is_file())
    os.link(part, tmp_path / "hard.json")
    before = {f: f.read_bytes() for f in (part, kept)}
    for out in (part, kept, tmp_path / "hard.json", tmp_path / "s.duckdb.parquet" / "new.html"):
        for args in (["report", "-o", str(out)], ["export", "perfetto", "-o", str(out)]):
            code, _, err = run(*args, "--db", str(db))
            folder = "s.duckdb.results" if out == kept else "s.duckdb.parquet"
            assert (code, err) == (
                1,
                f"error: {out}: would overwrite a file of the store {db} (in {folder}/); "
                "write the output elsewhere\n",
            ), (args, err)
    assert {f: f.read_bytes() for f in (part, kept)} == before
    assert not (tmp_path / "s.duckdb.parquet" / "new.html").exists()


def test_db_paths_no_store_can_be_at_are_one_line_and_touch_nothing(tmp_path):
    """A dangling symlink (creating the store would replace the link, and a failed first ingest
    deleted it), a symlink loop, a name too long for the file system: one line for every command."""
    dangling, loop = tmp_path / "link.duckdb", tmp_path / "loop.duckdb"
    dangling.symlink_to("real.duckdb")
    loop.symlink_to("loop.duckdb")
    long_ = tmp_path / ("s" * 250 + ".duckdb")
    job = str(_job(tmp_path))
    want = {
        dangling: f"{dangling}: a symlink to real.duckdb, which does not exist; give the target as --db to "
        "create the store there, or remove the link",
        loop: f"{loop}: a symlink loop; --db takes a store file or a new path",
        long_: f"{long_}: a file name too long for the file system; use a shorter --db path",
    }
    for db, message in want.items():
        for args in (
            ["ingest", job],
            ["runs"],
            ["analyze", "overlap"],
            ["sql", "SELECT 1"],
            ["report", "-o", str(tmp_path / "r.html")],
            ["export", "perfetto", "-o", str(tmp_path / "p.json")],
        ):
            assert run(*args, "--db", str(db)) == (1, "", f"error: {message}\n"), (db.name[:20], args)
    assert dangling.is_symlink() and not (tmp_path / "real.duckdb").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job", "link.duckdb", "loop.duckdb"]


@pytest.mark.parametrize("db", ["", ".", "./", "/"])
def test_db_a_folder_named_without_a_name_is_one_line(tmp_path, monkeypatch, db):
    """--db "" or "." or "/" raised ValueError (PosixPath('.') has an empty name): a traceback.
    The path is named as typed."""
    monkeypatch.chdir(tmp_path)
    said = (  # an empty path is said to be empty (Path("") is ".")
        "--db: the path is empty (''); --db takes a store file or a new path"
        if not db
        else f"'{db}': a folder, not a store file; --db takes a store file or a new path"
    )
    for args in (["runs"], ["analyze", "overlap"], ["ingest", str(_job(tmp_path))]):
        assert run(*args, "--db", db) == (1, "", f"error: {said}\n"), (db, args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


def test_output_to_a_full_disk_is_one_line(tmp_path):
    """`traceprof runs > /dev/full` ended in a traceback (OSError: No space left on device)."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(_job(tmp_path)), "--db", str(db))[0] == 0
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "traceprof.cli", "runs", "--db", str(db), "-f", "csv"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert (r.returncode, r.stderr) == (1, "error: No space left on device\n")


def test_a_run_named_after_its_folder_follows_the_rules_of_run(tmp_path):
    """A folder named 5 made run '5', which `runs rm 5` and --run 5 then took for run id 5."""
    d = tmp_path / "5"
    d.mkdir()
    for f in _job(tmp_path).iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(d), "--db", str(db)) == (
        1,
        "",
        f"error: {d} (its run name; set another with --run NAME): '5' would read as a run id; choose a "
        "name with a letter in it\n",
    )
    assert not db.exists()
    assert run("ingest", str(d), "--db", str(db), "--run", "five")[0] == 0


@pytest.mark.parametrize("name", ["rank0.json.gz", "fr_rank0.json"])
@pytest.mark.parametrize("pack", ["bzip2", "xz", "gzip inside gzip"])
def test_compressed_formats_we_do_not_read_are_named(tmp_path, name, pack):
    """A bzip2 or xz file, or a gzip of a gzip, named like a trace was "invalid JSON (... byte 0)"."""
    import bz2
    import lzma

    raw = json.dumps(micro_trace(["a"])).encode()
    data = {
        "bzip2": bz2.compress(raw),
        "xz": lzma.compress(raw),
        "gzip inside gzip": gzip.compress(gzip.compress(raw)),
    }
    path = tmp_path / name
    path.write_bytes(data[pack])
    code, _, err = run("ingest", str(path), "--db", str(tmp_path / "s.duckdb"))
    why = (
        "a gzip inside the gzip: gunzip it once, then ingest the result (a .json.gz)"
        if pack == "gzip inside gzip"
        else f"{pack}-compressed, which traceprof does not read (it reads JSON, plain or gzip): decompress it first"
    )
    assert (code, err) == (1, f"error: {path}: {why}\n")
    assert not (tmp_path / "s.duckdb").exists()


def test_a_file_named_gz_that_is_not_gzip_says_so(tmp_path):
    """A .json.gz holding plain text that is no JSON was only "invalid JSON (... byte 4)", which
    points into text the user believes compressed; a valid plain-JSON trace named .gz still ingests."""
    bad = tmp_path / "bad" / "rank0.json.gz"
    bad.parent.mkdir()
    bad.write_bytes(b"not gzip")
    code, _, err = run("ingest", str(bad), "--db", str(tmp_path / "s.duckdb"))
    assert (code, err) == (
        1,
        f"error: {bad}: invalid JSON (JSON is malformed: invalid character (byte 4)); the file "
        "is named .gz but is not gzip (no gzip magic bytes): a wrong name or a damaged copy\n",
    )
    plain = tmp_path / "bad" / "rank0.json"
    plain.write_bytes(b"not json")
    assert "named .gz" not in run("ingest", str(plain), "--db", str(tmp_path / "s.duckdb"))[2]
    good = tmp_path / "good" / "rank0.json.gz"
    good.parent.mkdir()
    good.write_bytes(json.dumps(micro_trace(["a"])).encode())
    assert run("ingest", str(good), "--db", str(tmp_path / "s.duckdb"))[0] == 0


def test_ctrl_c_while_duckdb_loads_is_delivered_after_it(tmp_path):
    # DuckDB's bindings abort the process (SIGABRT) on a KeyboardInterrupt while their types are
    # created. The entry point loads them with SIGINT held: a module standing in for them signals
    # itself mid-import, finishes its import all the same, and the Ctrl-C arrives just after.
    mod = tmp_path / "slowlib.py"
    done = tmp_path / "loaded"
    mod.write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.3)\n"
        f"open({str(done)!r}, 'w').close()\n"
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from traceprof import entry; "
        "entry._HELD_IMPORTS = ('slowlib',); sys.argv = ['traceprof', 'runs', '--db', sys.argv[2]]; entry.main()"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), str(tmp_path / "s.duckdb")],
        capture_output=True,
        text=True,
    )
    assert (r.returncode, r.stderr) == (130, "interrupted; nothing was changed\n")
    assert done.exists()  # the import ran to its end: the signal waited for it


# -- the lock file: a missing folder named as such, none left behind by a failed first ingest ---------


def test_db_in_a_folder_that_does_not_exist_says_so(tmp_path):
    # it said "cannot create the lock file .../missing/parent/x.duckdb.lock: No such file or directory"
    db = tmp_path / "missing" / "parent" / "x.duckdb"
    code, _, err = run("ingest", str(_job(tmp_path)), "--db", str(db))
    folder = tmp_path / "missing" / "parent"
    assert (code, err) == (
        1,
        f"error: {db}: the folder {folder} does not exist; create it first (mkdir -p {folder}), or give "
        "--db a path in an existing folder\n",
    )
    assert not (tmp_path / "missing").exists()


def test_a_failed_first_ingest_leaves_no_lock_file(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0.json").write_text('{"traceEvents": [')  # cut short: a parse error after the store opened
    db = tmp_path / "s.duckdb"
    code, _, err = run("ingest", str(bad), "--db", str(db))
    assert code == 1 and "rank0.json" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no store, no s.duckdb.lock
    # the library the same way: a store opened and closed without being created is not kept either
    s = Store(db)
    assert s.discard_if_new() and sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def test_a_partial_ingest_that_stores_no_file_leaves_no_store_and_no_lock(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "cut.json").write_text('{"traceEvents": [')  # cut short: fails to parse
    (bad / "empty.json").write_text("")  # an empty file
    (tmp_path / "nothing").mkdir()  # a folder holding no file
    db = tmp_path / "z.duckdb"
    inputs = [
        [bad / "cut.json"],
        [bad / "cut.json", bad / "empty.json"],
        [tmp_path / "nothing", bad / "cut.json"],
    ]
    for paths in inputs:
        code, out, err = run("ingest", "--partial", *map(str, paths), "--db", str(db))
        # every path failed, each listed; exit 1; and the store this command created is gone, its lock too
        assert code == 1 and f"0 file(s) ingested, 0 already stored, {len(paths)} failed" in out + err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "nothing"], paths
    # a store that existed before is kept (with its lock file), though this ingest stored nothing
    with Store(db) as s:
        ingest(s, [_job(tmp_path)], jobs=1)
    code, _, _ = run("ingest", "--partial", str(bad / "cut.json"), "--db", str(db))
    assert code == 1 and db.exists() and (tmp_path / "z.duckdb.lock").exists()
    with Store(db, read_only=True) as s:
        assert s.con.execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_a_lock_file_this_process_did_not_create_is_never_removed(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0.json").write_text('{"traceEvents": [')
    db = tmp_path / "s.duckdb"
    lock = tmp_path / "s.duckdb.lock"
    lock.write_text("")  # another process's (or an earlier traceprof's) lock file
    inode = lock.stat().st_ino
    code, _, _ = run("ingest", str(bad), "--db", str(db))
    assert code == 1 and not db.exists() and lock.stat().st_ino == inode
    # and beside a store that exists (this process made both), it stays when the store is closed
    good = tmp_path / "good.duckdb"
    with Store(good) as s:
        ingest(s, [_job(tmp_path)], jobs=1)
    assert (tmp_path / "good.duckdb.lock").exists()


_WAITER = """
import os, sys, time
from pathlib import Path
from traceprof.core.locking import StoreLock, lock_path
db = Path(sys.argv[1])
print("waiting", flush=True)
lock = StoreLock(db, exclusive=True, timeout_s=20)
fd = next(iter(__import__("traceprof.core.locking", fromlist=["_HELD"])._HELD.values()))[0]
same = os.fstat(fd).st_ino == os.stat(lock_path(db)).st_ino
print("locked", same, flush=True)
time.sleep(30)
"""


def test_a_process_waiting_on_a_removed_lock_file_locks_the_path_afresh(tmp_path):
    # A created the lock file and removes it (no store made) while B waits on the old file: B must
    # end up holding the file now at the path, so that a third process C cannot lock it too
    from traceprof.core.locking import StoreLock

    db = tmp_path / "s.duckdb"
    a = StoreLock(db, exclusive=True)
    b = subprocess.Popen([sys.executable, "-c", _WAITER, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert b.stdout is not None and b.stdout.readline() == "waiting\n"
        time.sleep(0.5)  # B is in flock() on A's file now
        a.release(no_store=True)  # A made it and made no store: it goes
        assert b.stdout.readline() == "locked True\n"
        fd = os.open(tmp_path / "s.duckdb.lock", os.O_RDWR)  # C
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        b.kill()
        b.wait()


def _contents(db: Path) -> dict[str, list]:
    """Everything a store holds, as it reads: its tables, columns (types, comments), views and
    sequences, and every table's rows (sorted: row order is no content); the file's bytes are not."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {
            "tables": con.execute(
                "SELECT table_name, comment, sql FROM duckdb_tables() ORDER BY ALL"
            ).fetchall(),
            "columns": con.execute(
                "SELECT table_name, column_name, column_index, data_type, column_default, is_nullable, comment "
                "FROM duckdb_columns() ORDER BY ALL"
            ).fetchall(),
            "views": con.execute(
                "SELECT view_name, comment, sql FROM duckdb_views() WHERE NOT internal ORDER BY ALL"
            ).fetchall(),
            "sequences": con.execute(
                "SELECT sequence_name, last_value FROM duckdb_sequences() ORDER BY ALL"
            ).fetchall(),
        }
        for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall():
            out[t] = sorted(map(repr, con.execute(f'SELECT * FROM "{t}"').fetchall()))
    finally:
        con.close()
    return out


@pytest.mark.slow
def test_failed_ingest_leaves_the_stores_contents_as_they_were(tmp_path, monkeypatch):
    # After a failed ingest the store file is cut back to its size at open (Store._shrink_back), but
    # its bytes may differ: the transaction wrote its rows into blocks a removed run had freed, which
    # are free again after the rollback. What it holds must be the same: every table's rows, the
    # schema, the comments, the runs list; and the store takes the same files again afterwards.
    from traceprof.ingest import matching

    db = tmp_path / "s.duckdb"
    assert run("ingest", str(SAMPLES / "normal"), str(SAMPLES / "straggler_rank2"), "--db", str(db))[0] == 0
    assert run("runs", "rm", "straggler_rank2", "--db", str(db))[0] == 0  # its blocks are free now
    before, size = _contents(db), db.stat().st_size
    runs_before = run("runs", "--db", str(db))[1]
    # two ranks of 130,000 events: more than a 122,880-row group each, which DuckDB writes into the
    # file (the freed blocks first) before the commit
    big = tmp_path / "big"
    big.mkdir()
    for rank in (0, 1):
        doc = micro_trace([f"op{i % 7}" for i in range(130_000)], rank=rank, world=2)
        doc["traceEvents"][0]["dur"] = 200_000
        (big / f"rank{rank}.json").write_text(json.dumps(doc))

    def fail(store: Store, run_id: int) -> None:  # after the rows are in, inside the transaction
        raise StoreError("matching failed")

    for how in ("after the insert", "a bad file"):
        with monkeypatch.context() as m:
            if how == "after the insert":
                m.setattr(matching, "match_run", fail)
            else:
                (big / "rank2.json").write_text("{")
            code, _, err = run("ingest", str(big), str(SAMPLES / "straggler_rank2"), "--db", str(db))
        assert code == 1 and "Traceback" not in err, (how, err)
        assert _contents(db) == before and db.stat().st_size == size, how
        assert run("runs", "--db", str(db))[1] == runs_before
        (big / "rank2.json").unlink(missing_ok=True)
    code, _, err = run("ingest", str(big), str(SAMPLES / "straggler_rank2"), "--db", str(db))
    assert code == 0, err
    with Store(db, read_only=True) as s:
        got = s.sql(
            "SELECT r.name, sum(t.events_kept) FROM runs r JOIN traces t USING (run_id) GROUP BY 1 ORDER BY 1"
        )
    assert got.rows()[0] == ("big", 2 * 130_001)
