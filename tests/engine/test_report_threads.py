"""The report's analyses on two threads: the same results as one thread, each analysis computed
once (whatif for stragglers too), a connection per thread, and Ctrl-C still stops it promptly."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SAMPLES, corpus
from traceprof.core import cancel
from traceprof.core.errors import StoreError
from traceprof.engine import analysis, findings, session
from traceprof.engine.analysis import FrameResult
from traceprof.engine.session import Session
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("threads") / "s.duckdb"
    with Store(path) as s:
        ingest(s, [SAMPLES / "straggler_rank2"], jobs=1)
    return path


def _frames(res: FrameResult | Exception) -> dict[str, object]:
    if not isinstance(res, FrameResult):
        return {"error": str(res)}
    return {k: v for k, v in vars(res).items() if isinstance(v, pl.DataFrame)} | {"notes": res.notes}


def _run(db: Path, threads: int, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list[tuple[str, str]]]:
    """The report's analyses with ``threads`` threads, and (analysis, thread name) per computation."""
    computed: list[tuple[str, str]] = []
    real = Session._compute

    def counting(self, name, fn, store, p):
        computed.append((name, threading.current_thread().name))
        return real(self, name, fn, store, p)

    monkeypatch.setattr(Session, "_compute", counting)
    # the threads as given, whatever this machine's CPU count
    with Store(db, read_only=True) as s, Session(s, threads=threads):
        out = findings.run_analyses(s, s.resolve_run(None), {"mfu": {"model_flops_per_step": "1e12"}})
    monkeypatch.undo()
    return {k: _frames(v) for k, v in out.items()}, computed


def test_two_threads_give_the_results_of_one(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, computed1 = _run(db, 1, monkeypatch)
    two, computed2 = _run(db, 2, monkeypatch)
    # report order, whatever finished first (desync: the sample has Flight Recorder dumps)
    # report order; desync runs on this run (it has Flight Recorder dumps), memory does not (none recorded)
    assert list(two) == list(one) == [a.name for a in findings.report_analyses() if a.name != "memory"]
    assert list(one)[-1] == "desync"
    for name in one:
        a, b = one[name], two[name]
        assert a.keys() == b.keys(), name
        for k in a:
            if isinstance(a[k], pl.DataFrame):
                assert a[k].equals(b[k]), (name, k)
            else:
                assert a[k] == b[k], (name, k)
    assert "error" not in two["stragglers"] and "error" not in two["whatif"]  # the sample has both
    # every analysis computed once (stragglers reads whatif's result), on the worker threads
    assert sorted(n for n, _ in computed2) == sorted(n for n, _ in computed1) == sorted(one)
    threads = {t for _, t in computed2}
    assert len(threads) == 2 and all(t.startswith("traceprof-analysis") for t in threads)
    assert {t for _, t in computed1} == {threading.main_thread().name}


def test_a_thread_view_has_its_own_connection_and_leaves_the_store_open(db: Path) -> None:
    with Store(db, read_only=True) as s:
        with s.for_thread() as view:
            assert view.con is not s.con and analysis.memo_store(view) is s
            view.close()  # the creator closes it: nothing happens
            assert view.sql("SELECT count(*) AS n FROM events")["n"].item() > 0
        assert s.sql("SELECT count(*) AS n FROM events")["n"].item() > 0  # the store's connection is open


def test_a_writable_store_is_not_shared_with_threads(tmp_path: Path) -> None:
    with Store(tmp_path / "w.duckdb") as s, pytest.raises(StoreError, match="open for writing"):
        with s.for_thread():
            pass


def test_parquet_layout_views_exist_on_each_threads_connection(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with Store(path, layout="parquet") as s:
        ingest(s, [SAMPLES / "normal"], jobs=1)
    with Store(path, read_only=True) as s, s.for_thread() as view:
        want = s.sql("SELECT count(*) AS n, sum(ts_ns) AS t FROM events").row(0)
        assert view.sql("SELECT count(*) AS n, sum(ts_ns) AS t FROM events").row(0) == want


def test_ctrl_c_while_the_threads_run_is_raised_and_stops_them(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupted: list[object] = []
    real_view = Store.for_thread

    def view(self):
        cm = real_view(self)
        v = cm.__enter__()
        real_interrupt = v.con.interrupt
        v.con = _Spy(v.con, lambda: (interrupted.append(v), real_interrupt()))
        return _Entered(cm, v)

    real_wait, calls = findings.wait, []

    def ctrl_c(fs, timeout=None):
        calls.append(timeout)
        if len(calls) == 1:  # Ctrl-C at the first wait, with the threads busy
            raise KeyboardInterrupt
        return real_wait(fs, timeout=timeout)

    monkeypatch.setattr(Store, "for_thread", view)
    monkeypatch.setattr(findings, "wait", ctrl_c)
    with Store(db, read_only=True) as s, Session(s, threads=2), pytest.raises(KeyboardInterrupt):
        findings.run_analyses(s, s.resolve_run(None))
        # raised only once the running analyses stopped: their connections close after them
    assert len({id(v) for v in interrupted}) == 2  # each thread's connection
    assert len(calls) > 1


class _Spy:
    """A connection whose ``interrupt`` is recorded."""

    def __init__(self, con, on_interrupt) -> None:
        self._con, self.interrupt = con, on_interrupt

    def __getattr__(self, k):
        return getattr(self._con, k)


class _Entered:
    def __init__(self, cm, value) -> None:
        self.cm, self.value = cm, value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        self.value.con = self.value.con._con
        return self.cm.__exit__(*exc)


def test_ctrl_c_stops_a_running_analysis_at_its_next_checkpoint(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An analysis in Python (no query to interrupt: the what-if graph) stops at its next
    ``cancel.checkpoint`` once the main thread has had Ctrl-C, not when it is done."""
    ran_out: list[str] = []

    def spin(store, p):
        t = time.monotonic()
        while time.monotonic() - t < 30:  # 30 s unless cancelled
            cancel.checkpoint()
            time.sleep(0.01)
        ran_out.append("not cancelled")
        raise AssertionError("not cancelled")

    spinner = analysis.Analysis("spin", analysis.RunParams, FrameResult, (), spin)
    real_wait, calls = findings.wait, []

    def ctrl_c(fs, timeout=None):
        calls.append(timeout)
        if len(calls) == 3:  # both threads are spinning by now
            raise KeyboardInterrupt
        return real_wait(fs, timeout=timeout)

    monkeypatch.setattr(findings, "wait", ctrl_c)
    t = time.monotonic()
    with Store(db, read_only=True) as s, pytest.raises(KeyboardInterrupt):
        findings._run_all(s, [("a", spinner, analysis.RunParams()), ("b", spinner, analysis.RunParams())], 2)
    assert time.monotonic() - t < 5 and not ran_out


def test_checkpoint_raises_only_in_a_cancelled_scope() -> None:
    cancel.checkpoint()  # outside any scope: nothing
    with cancel.scope() as stop:
        cancel.checkpoint()
        stop.set()
        with pytest.raises(KeyboardInterrupt):
            cancel.checkpoint()
    cancel.checkpoint()  # the scope is over


def test_a_bad_report_parameter_is_named_with_its_analysis(db: Path) -> None:
    from traceprof.core.errors import UsageError

    with Store(db, read_only=True) as s:
        with pytest.raises(
            UsageError,
            match=r"^mfu\.peak_tflops='abc': expected a number \(or peak_tflops= for its default\)$",
        ):
            findings.run_analyses(s, 1, {"mfu": {"peak_tflops": "abc"}})
        with pytest.raises(UsageError, match=r"^analysis 'mfu' has no parameter 'nosuch'"):
            findings.run_analyses(s, 1, {"mfu": {"nosuch": "1"}})
        # desync runs in the report of a run with Flight Recorder dumps: its parameters are taken
        with Session(s):
            out = findings.run_analyses(s, 1, {"desync": {"all": "true"}})
        assert isinstance(out["desync"], FrameResult)
        with pytest.raises(
            UsageError, match="no report analysis 'nope'; choose from: .*mfu, critical_path, desync, memory$"
        ):
            findings.run_analyses(s, 1, {"nope": {"x": "1"}})


def test_traceprof_threads_sets_the_threads(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceprof.core.errors import UsageError

    monkeypatch.setattr(session.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv("TRACEPROF_THREADS", raising=False)
    assert session.threads_from_env() == session.THREADS == 2
    monkeypatch.setenv("TRACEPROF_THREADS", "1")
    assert session.threads_from_env() == 1
    monkeypatch.setenv("TRACEPROF_THREADS", "64")
    assert session.threads_from_env() == 4  # at most the CPUs
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("TRACEPROF_THREADS", bad)
        with pytest.raises(
            UsageError, match=rf"^TRACEPROF_THREADS='{re.escape(bad)}': expected a whole number"
        ):
            session.threads_from_env()
    monkeypatch.setenv("TRACEPROF_THREADS", "1")  # one thread: the analyses run on the caller's
    computed: list[str] = []
    real = Session._compute
    monkeypatch.setattr(
        Session,
        "_compute",
        lambda self, n, fn, s, p: (computed.append(threading.current_thread().name), real(self, n, fn, s, p))[
            1
        ],
    )
    with Store(db, read_only=True) as s, Session(s):  # threads from TRACEPROF_THREADS
        findings.run_analyses(s, 1)
    assert set(computed) == {threading.main_thread().name}


def test_integer_parameters_beyond_64_bits_are_refused(db: Path) -> None:
    """They went into the result cache's key (orjson: a TypeError traceback) or silently into the analysis."""
    from tests import _cli_inproc as cli

    for args in (
        ["report", "-o", str(db.parent / "x.html"), "-p", "mfu.layers=99999999999999999999999"],
        ["analyze", "idle", "-p", "kernel_wait_ns=99999999999999999999"],
    ):
        code, _, err = cli.run(*args, "--db", str(db))
        assert code != 0 and "beyond the 64-bit integer range" in err and "Traceback" not in err, err


def test_a_bad_desync_parameter_is_refused_on_a_run_without_its_sources(tmp_path: Path) -> None:
    from traceprof.core.errors import UsageError

    path = tmp_path / "k.duckdb"
    with Store(path) as s:
        ingest(s, [SAMPLES / "normal" / "rank0.trace.json.gz"], jobs=1)
    with Store(path, read_only=True) as s:
        with pytest.raises(
            UsageError, match=r"^desync\.all='maybe': expected true or false \(or all= for its default\)$"
        ):
            findings.run_analyses(s, 1, {"desync": {"all": "maybe"}})
        with Session(s):
            assert "desync" not in findings.run_analyses(
                s, 1, {"desync": {"all": "true"}}
            )  # valid: nothing to run


def test_the_heavy_analyses_run_alone_after_the_light_ones(db: Path) -> None:
    """Those that run another or that another runs (``requires``: the what-if replay, the step
    account) never run beside another analysis, whose peak would add to theirs; the light ones
    run two at a time before them, and the results come back in the order asked."""
    lock, running, log = threading.Lock(), set(), []

    def make(name: str, seconds: float):
        def run(store, p):
            with lock:
                log.append((name, frozenset(running)))  # who runs as this one starts
                running.add(name)
            time.sleep(seconds)
            with lock:
                running.discard(name)
            return FrameResult(pl.DataFrame({"x": [name]}))

        return run

    def spec(name: str, seconds: float, requires: tuple[str, ...] = ()) -> analysis.Analysis:
        return analysis.Analysis(
            name, analysis.RunParams, FrameResult, (), make(name, seconds), requires=requires
        )

    todo = [
        (n, spec(n, sec, req), analysis.RunParams())
        for n, sec, req in [
            ("light1", 0.2, ()),
            ("uses", 0.05, ("used",)),  # heavy: runs another
            ("light2", 0.2, ()),
            ("used", 0.05, ()),  # heavy: another runs it
            ("light3", 0.1, ()),
        ]
    ]
    with Store(db, read_only=True) as s:
        out = findings._run_all(s, todo, 2)
    assert list(out) == ["light1", "uses", "light2", "used", "light3"]
    assert all(r.frame["x"].item() == n for n, r in out.items())
    order = [n for n, _ in log]
    # the light ones first, in report order (the two started together may log in either order)
    assert {*order[:2]} == {"light1", "light2"} and order[2] == "light3"
    assert order[3:] == ["used", "uses"]  # then the heavy ones, the one another runs first
    beside = dict(log)
    assert beside["used"] == beside["uses"] == frozenset()  # alone
    assert beside[order[1]] == {order[0]}  # the light ones two at a time


_calls: list[str] = []


@analysis.shared
def _frame(store: Store, run: int) -> pl.DataFrame:
    """A stand-in for the activity frame the light analyses share (counted as it is computed)."""
    _calls.append(f"frame {run}")
    return pl.DataFrame({"x": [run]})


@analysis.shared
def _items(store: Store, run: int) -> pl.DataFrame:
    """A stand-in for the replay's compute items, read by one group of heavy analyses."""
    _calls.append(f"items {run}")
    return pl.DataFrame({"x": [run]})


@pytest.mark.parametrize("threads", [1, 2])
def test_the_heavy_analyses_start_without_what_the_light_ones_shared(db: Path, threads: int) -> None:
    """The light analyses share one frame (the session's ``many``); the heavy ones run as
    ``traceprof analyze`` runs them (``many`` off), the first group still finding the light ones'
    values (its first reader of the activity takes its columns from the frame and lets go of it);
    the values one group of heavy ones (joined by ``requires``) shares stay within the group and
    are let go of before the next; at the end only results are kept and ``many`` is back."""
    seen: dict[str, tuple[frozenset[str], bool]] = {}
    lock = threading.Lock()

    def held(s: Session) -> frozenset[str]:  # the shared helpers' values the memo holds
        assert s.memo is not None
        return frozenset(
            k[0].rsplit(".", 1)[-1] for k, slot in s.memo.items() if k[0] != "analysis" and slot.done
        )

    def make(name: str, reads) -> analysis.Analysis:
        def run(store, p):
            s = analysis.memo_store(store).session
            with lock:
                seen[name] = (held(s), s.many)
            for r in reads:
                r(store, 1)
            time.sleep(0.05)
            return FrameResult(pl.DataFrame({"x": [name]}))

        return run

    specs = {
        "light1": ((_frame,), ()),
        "uses": ((_items,), ("used",)),  # heavy, group 1: runs "used"
        "light2": ((_frame,), ()),
        "alone": ((), ()),  # heavy, group 2: another requires it
        "used": ((_items,), ()),  # heavy, group 1
        "needs_alone": ((), ("alone",)),  # heavy, group 2
        "light3": ((_frame,), ()),
    }
    todo = [
        (
            n,
            analysis.Analysis(n, analysis.RunParams, FrameResult, (), make(n, reads), requires=req),
            analysis.RunParams(),
        )
        for n, (reads, req) in specs.items()
    ]
    _calls.clear()
    with Store(db, read_only=True) as st, Session(st, threads=threads, many=True) as s:
        out = findings._run_all(st, todo, threads)
        assert held(s) == frozenset() and s.many  # nothing but results kept; many as it was
    assert list(out) == list(specs)
    assert _calls == ["frame 1", "items 1"]  # each computed once: by the first reader, shared after
    assert seen["light1"][1] and seen["light2"][1] and seen["light3"][1]  # many: one shared frame
    # the heavy ones, group by group in report order (the required one first), none beside the frame
    assert seen["used"] == (frozenset({"_frame"}), False)  # the frame, for it to take what it reads
    assert seen["uses"] == (frozenset({"_frame", "_items"}), False)  # its group's items, kept for it
    assert seen["alone"] == (frozenset(), False)  # the next group: the frame and items let go of
    assert seen["needs_alone"] == (frozenset(), False)


def test_a_report_lets_go_of_the_activity_frame_and_duckdbs_blocks_before_the_heavy_analyses(
    db: Path,
) -> None:
    """On a real run: the light analyses read the activity frame once; when whatif (the first
    heavy one) starts, DuckDB's buffer pool holds none of the store's blocks; whatif's compute
    items take their columns from the frame and let go of it (no heavy one after it finds it);
    stragglers reads the compute rows again and critical_path its own columns (the two other
    reads); DuckDB's memory limit is as it was
    at the end; the results are those of sessions that run each analysis alone."""
    from traceprof.engine import activity

    starts: dict[str, tuple[int, int]] = {}
    real = Session._compute
    reads: list[str] = []
    real_read = activity._by_rank

    def reading(store, run_id, sql, *args):
        reads.append("detail" if "launch_ts_ns" in sql else "plain")
        return real_read(store, run_id, sql, *args)

    def watching(self, name, fn, store, p):
        if name in ("whatif", "critical_path", "stragglers", "mfu"):
            assert self.memo is not None
            frames = sum(
                1
                for k, slot in self.memo.items()
                if k[0] == "traceprof.engine.activity._activity" and slot.done
            )
            blocks = self.store.con.execute(
                "SELECT memory_usage_bytes FROM duckdb_memory() WHERE tag = 'BASE_TABLE'"
            ).fetchall()[0][0]
            starts[name] = (frames, blocks)
        return real(self, name, fn, store, p)

    params = {"mfu": {"model_flops_per_step": "1e12"}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Session, "_compute", watching)
        mp.setattr(activity, "_by_rank", reading)
        with Store(db, read_only=True) as st, Session(st, threads=2) as s:
            limit = st.con.execute("SELECT current_setting('memory_limit')").fetchall()
            out = findings.run_analyses(st, st.resolve_run(None), params)
            assert st.con.execute("SELECT current_setting('memory_limit')").fetchall() == limit
            assert s.many  # many again: a baseline's diff after the analyses shares as before
    assert starts.keys() == {"whatif", "critical_path", "stragglers", "mfu"}
    # DuckDB's blocks let go of (but those under the floor it empties its pool to)
    assert starts["whatif"][1] <= session.POOL_FLOOR_MB << 20
    # the light ones' frame let go of once whatif has taken its columns; each heavy one its own
    assert starts["critical_path"][0] == starts["stragglers"][0] == starts["mfu"][0] == 0
    # the light ones' frame; stragglers' compute rows (whatif lets go of its items once its graph is
    # built, outside ``many``: their 236 MiB on 8 x 1M are not held through its replays, at the cost
    # of stragglers reading the compute rows' six columns again); critical_path's 9 columns
    assert reads == ["detail", "plain", "detail"]
    for name in starts:  # the same results as `traceprof analyze NAME` in a session of its own
        with Store(db, read_only=True) as st, Session(st, many=False):
            run = st.resolve_run(None)
            alone = findings.run_analyses(
                st, run, {name: params[name]} if name in params else {}, names=(name,)
            )[name]
        a, b = _frames(out[name]), _frames(alone)
        assert a.keys() == b.keys() and "error" not in a, name
        for k in a:
            assert a[k].equals(b[k]) if isinstance(a[k], pl.DataFrame) else a[k] == b[k], (name, k)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_analyses_that_read_no_activity_frame_run_last_without_it(db: Path, threads: int) -> None:
    """The light analyses whose spec says they never read the activity frame (``reads_activity``
    False: ``launch``, the ``*_sum`` tables) run after every other one, two at a time, once the
    session has let go of the frame the light ones shared (and of the heavy ones' values), with
    ``many`` on again; the frame readers still share one frame, the heavy ones still run alone."""
    lock, running, started, log = threading.Lock(), set(), set(), []
    pairs = {"light1": "light2", "light2": "light1", "sum1": "sum2", "sum2": "sum1"}

    def held(s: Session) -> frozenset[str]:
        assert s.memo is not None
        return frozenset(
            k[0].rsplit(".", 1)[-1] for k, slot in s.memo.items() if k[0] != "analysis" and slot.done
        )

    def make(name: str, reads: tuple) -> analysis.Analysis:
        def run(store, p):
            s = analysis.memo_store(store).session
            with lock:
                log.append((name, frozenset(running), held(s), s.many))
                running.add(name)
                started.add(name)
            # two threads: the first of a pair waits (at most 5 s) for its partner to start, so a
            # loaded machine cannot let it finish before the partner logs (one at a time times out)
            deadline = time.monotonic() + 5
            while (
                threads == 2 and name in pairs and pairs[name] not in started and time.monotonic() < deadline
            ):
                time.sleep(0.01)
            for r in reads:
                r(store, 1)
            time.sleep(0.1)
            with lock:
                running.discard(name)
            return FrameResult(pl.DataFrame({"x": [name]}))

        return run

    specs = {  # name: (what it reads, requires, reads_activity)
        "sum1": ((), (), False),
        "light1": ((_frame,), (), True),
        "uses": ((_items,), ("used",), True),  # heavy: runs "used"
        "sum2": ((), (), False),
        "light2": ((_frame,), (), True),
        "used": ((_items,), (), True),  # heavy
        "sum3": ((), (), False),
    }
    todo = [
        (
            n,
            analysis.Analysis(
                n, analysis.RunParams, FrameResult, (), make(n, reads), requires=req, reads_activity=act
            ),
            analysis.RunParams(),
        )
        for n, (reads, req, act) in specs.items()
    ]
    _calls.clear()
    with Store(db, read_only=True) as st, Session(st, threads=threads, many=True) as s:
        out = findings._run_all(st, todo, threads)
        assert held(s) == frozenset() and s.many
    assert list(out) == list(specs)  # report order, whatever ran first
    assert _calls == ["frame 1", "items 1"]
    order = [n for n, *_ in log]
    # a pair run two at a time may log in either order
    assert {*order[:2]} == {"light1", "light2"} and order[2:4] == ["used", "uses"]
    assert {*order[4:6]} == {"sum1", "sum2"} and order[6] == "sum3"
    if threads == 1:
        assert order == ["light1", "light2", "used", "uses", "sum1", "sum2", "sum3"]
    at = {n: (beside, kept, many) for n, beside, kept, many in log}
    assert at[order[1]][1] == {"_frame"} or at[order[1]][0] == {order[0]}  # the frame shared
    assert at["used"][0] == at["uses"][0] == frozenset()  # the heavy ones alone
    # the non-readers: after every frame reader and heavy one, with nothing shared held, many on
    assert all(at[n][1] == frozenset() and at[n][2] for n in ("sum1", "sum2", "sum3"))
    first, second = order[4:6]
    assert at[first][0] == frozenset()
    if threads == 2:  # two at a time: the second of each pair starts beside the first
        assert at[order[1]][0] == {order[0]}
        assert at[second][0] == {first}


@pytest.fixture(scope="module")
def gpu_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real GPU trace (kernels, their launches, NCCL collectives): launch and the sums apply."""
    path = tmp_path_factory.mktemp("gpu") / "s.duckdb"
    with Store(path) as s:
        ingest(s, [corpus("hta/nccl_parser_config")], jobs=1)
    return path


def _declared_non_readers() -> list[str]:
    analysis.load_all()
    return [a.name for a in findings.report_analyses() if not a.reads_activity]


def test_the_analyses_declared_not_to_read_the_activity_frame_never_read_it(
    gpu_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each report analysis whose spec says ``reads_activity=False`` runs in a report session
    (``many``: a reader would fetch the whole shared frame) without the activity frame ever being
    read or kept; ``kernels``, a reader, is caught by the same check (the check can fail)."""
    from traceprof.engine import activity

    reads: list[str] = []
    real = activity._activity

    def reading(*args, **kwargs):
        reads.append("read")
        return real(*args, **kwargs)

    monkeypatch.setattr(activity, "_activity", reading)
    non_readers = _declared_non_readers()
    # the ones this change declares (others may join); desync and memory run on some runs only
    assert {"launch", "nccl_sum", "kernel_sum", "nvtx_sum", "memcpy_sum"} <= set(non_readers)
    ran = []
    for name in [*non_readers, "kernels"]:
        reads.clear()
        with Store(gpu_db, read_only=True) as st, Session(st, threads=1, many=True) as s:
            res = findings.run_analyses(st, st.resolve_run(None), names=(name,))[name]
            assert s.memo is not None
            kept = [k for k in s.memo if k[0] == "traceprof.engine.activity._activity"]
        if isinstance(res, FrameResult):
            ran.append(name)
        if name == "kernels":
            assert reads, "the check sees a reader"
        else:
            assert reads == [] and kept == [], name
    # those that apply to the sample ran (a failed one would read nothing)
    assert {"launch", "nccl_sum", "kernel_sum", "kernels"} <= set(ran)


def test_a_report_runs_launch_and_the_sum_tables_after_the_activity_frame_is_let_go_of(
    gpu_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real run: every analysis declared not to read the activity frame starts after all the
    others have finished, with no activity frame held (on main ``launch`` ran beside the light
    frame readers, the frame's 410 MiB and its own 220 MiB at once on 8 x 1M)."""
    non_readers = set(_declared_non_readers())
    lock, running, starts = threading.Lock(), set(), {}
    real = Session._compute
    done: list[str] = []

    def watching(self, name, fn, store, p):
        assert self.memo is not None
        with lock:
            frames = sum(
                1
                for k, slot in self.memo.items()
                if k[0] == "traceprof.engine.activity._activity" and slot.done
            )
            starts[name] = (frames, frozenset(running), tuple(done))
            running.add(name)
        try:
            return real(self, name, fn, store, p)
        finally:
            with lock:
                running.discard(name)
                done.append(name)

    monkeypatch.setattr(Session, "_compute", watching)
    with Store(gpu_db, read_only=True) as st, Session(st, threads=2):
        out = findings.run_analyses(st, st.resolve_run(None), {"mfu": {"model_flops_per_step": "1e12"}})
    ran = non_readers & set(out)
    assert {"launch", "nccl_sum", "kernel_sum"} <= ran
    readers = set(out) - non_readers
    for name in ran:
        frames, beside, before = starts[name]
        assert frames == 0, name  # the frame let go of
        assert beside <= non_readers, (name, beside)  # only beside another non-reader
        assert readers <= set(before), (name, readers - set(before))  # after every other one
