"""The report's heavy analyses in a fresh process on a large run (``TRACEPROF_FRESH_EVENTS``): they
run there, a group at a time, with the results and errors they give here; below the threshold,
on a writable store or under a Dask runner they run here as before."""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import corpus
from tests.engine import test_report_threads
from traceprof.core import procs
from traceprof.core.errors import AnalysisError, StoreError, UsageError
from traceprof.engine import analysis as registry
from traceprof.engine import findings, session
from traceprof.engine.analysis import FrameResult
from traceprof.engine.session import Session
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

HEAVY = {"whatif", "stragglers", "critical_path", "mfu"}
db = test_report_threads.db  # the fixture: straggler_rank2 ingested once per module
_frames = test_report_threads._frames
PARAMS = {"mfu": {"model_flops_per_step": "1e12"}}


def _equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = _frames(a[name]), _frames(b[name])
        assert type(a[name]) is type(b[name]) and x.keys() == y.keys(), name
        for k in x:
            if isinstance(x[k], pl.DataFrame):
                assert x[k].equals(y[k]), (name, k)
            else:
                assert x[k] == y[k], (name, k)


def _pid_and_groups(task: Any) -> tuple[int, Any]:
    """In the fresh process: its pid beside what :func:`findings._fresh_groups` returns."""
    return os.getpid(), findings._fresh_groups(task)


def _report(
    db: Path, threads: int, monkeypatch: pytest.MonkeyPatch, least: str | None
) -> tuple[dict[str, Any], list[tuple[int, list[list[str]]]], list[str]]:
    """The report's analyses (``TRACEPROF_FRESH_EVENTS=least``, None: unset), the fresh processes
    (pid, the groups of analyses sent there) and the analyses computed in this process."""
    if least is None:
        monkeypatch.delenv("TRACEPROF_FRESH_EVENTS", raising=False)
    else:
        monkeypatch.setenv("TRACEPROF_FRESH_EVENTS", least)
    sent: list[tuple[int, list[list[str]]]] = []
    real_call = procs.call_in_fresh_process

    def calling(fn, task, poll=None, env=None, killed=None):
        assert fn is findings._fresh_groups
        pid, got = real_call(_pid_and_groups, task, poll, env, killed)
        sent.append((pid, [[name for name, _ in group] for group in task[1]]))
        return got

    here: list[str] = []
    real = Session._compute

    def computing(self, name, fn, store, p):
        here.append(name)
        return real(self, name, fn, store, p)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(procs, "call_in_fresh_process", calling)
        mp.setattr(Session, "_compute", computing)
        with Store(db, read_only=True) as s, Session(s, threads=threads):
            out = findings.run_analyses(s, s.resolve_run(None), PARAMS)
    return out, sent, here


@pytest.mark.parametrize("threads", [1, 2])
def test_heavy_analyses_run_in_fresh_processes_with_the_results_of_a_run_here(
    db: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    here_out, sent, here = _report(db, threads, monkeypatch, None)  # 11,792 events: below 2,000,000
    assert sent == [] and HEAVY <= set(here)
    fresh_out, sent, here = _report(db, threads, monkeypatch, "0")
    # one fresh process for every group joined by `requires`, in report order; none of them
    # computed here, nor parallelism, which stragglers computed there
    assert len(sent) == 1 and sent[0][0] != os.getpid()
    assert [sorted(names) for names in sent[0][1]] == [["stragglers", "whatif"], ["critical_path", "mfu"]]
    assert not HEAVY & set(here) and set(here) == set(fresh_out) - HEAVY - {"parallelism"}
    assert "error" not in _frames(fresh_out["stragglers"]) and "error" not in _frames(fresh_out["mfu"])
    _equal(fresh_out, here_out)


def test_the_threshold_counts_the_runs_events(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(db, read_only=True) as s:
        n = s.sql("SELECT sum(events_kept) AS n FROM traces WHERE run_id = ?", [s.resolve_run(None)])["n"][0]
    assert n == 11_792  # the README's `traceprof runs` of the samples
    assert _report(db, 1, monkeypatch, str(n))[1]  # at least the threshold: a fresh process
    assert not _report(db, 1, monkeypatch, str(n + 1))[1]
    monkeypatch.delenv("TRACEPROF_FRESH_EVENTS")
    assert session.fresh_events_from_env() == session.FRESH_EVENTS == 2_000_000
    for bad in ("-1", "many", "1.5"):
        monkeypatch.setenv("TRACEPROF_FRESH_EVENTS", bad)
        with pytest.raises(
            UsageError, match=rf"^TRACEPROF_FRESH_EVENTS='{re.escape(bad)}': expected a whole"
        ):
            session.fresh_events_from_env()


def test_a_writable_store_keeps_the_heavy_analyses_here(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEPROF_FRESH_EVENTS", "0")
    called: list[object] = []
    monkeypatch.setattr(procs, "call_in_fresh_process", lambda *a, **k: called.append(a))
    with Store(db, read_only=False) as s, Session(s, threads=2):
        out = findings.run_analyses(s, s.resolve_run(None), names=("whatif", "stragglers"))
    assert called == [] and all(isinstance(r, FrameResult) for r in out.values())


@pytest.mark.parametrize("threads", [1, 2])
def test_an_analysis_that_does_not_apply_gives_the_same_error_from_the_fresh_process(
    tmp_path: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank of 300 traced: whatif and stragglers each give their one-line AnalysisError, the
    same type and text as here."""
    path = tmp_path / "cpu.duckdb"
    with Store(path) as s:
        ingest(s, [corpus("hta/cpu_only")], jobs=1)
    here_out, sent, _ = _report(path, threads, monkeypatch, None)
    fresh_out, sent, _ = _report(path, threads, monkeypatch, "0")
    assert len(sent) == 1 and len(sent[0][1]) == 2
    for name in ("whatif", "stragglers"):
        assert isinstance(fresh_out[name], AnalysisError) and "\n" not in str(fresh_out[name]), name
    assert "no collective matched across two or more ranks" in str(fresh_out["whatif"])
    _equal(fresh_out, here_out)


def _raises_store_error(task: Any) -> Any:
    raise StoreError(f"{task[0]}: gone while the report ran")


def _dies(task: Any) -> Any:
    os._exit(3)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("task", [_raises_store_error, _dies])
def test_an_error_raised_in_the_fresh_process_is_raised_here_and_one_that_kills_it_is_each_analysis_error(
    db: Path, threads: int, task: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TraceprofError the process raises is raised here as it is (the CLI's one line); a process
    that dies (killed for memory) leaves each analysis of its group an AnalysisError saying so, and
    the report goes on (threads: nothing waits forever for the group)."""
    monkeypatch.setenv("TRACEPROF_FRESH_EVENTS", "0")
    monkeypatch.setattr(findings, "_fresh_groups", task)
    with Store(db, read_only=True) as s, Session(s, threads=threads):
        if task is _raises_store_error:
            with pytest.raises(StoreError, match=r"s\.duckdb: gone while the report ran$"):
                findings.run_analyses(s, s.resolve_run(None), PARAMS)
            return
        out = findings.run_analyses(s, s.resolve_run(None), PARAMS)
    for name in HEAVY:
        assert isinstance(out[name], AnalysisError), name
        assert str(out[name]).startswith("the process that computed it ended before it finished"), name
    assert isinstance(out["temporal"], FrameResult)  # the light ones as before


def test_a_fresh_process_is_killed_when_the_poll_raises() -> None:
    """Ctrl-C (the report's cancel checkpoint) stops the wait at once and kills the process."""
    before = set(_children())  # in the whole suite, processes of other tests may be children here too
    start = time.monotonic()

    def poll() -> None:
        if time.monotonic() - start > 0.5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        procs.call_in_fresh_process(time.sleep, 60, poll=poll)
    assert time.monotonic() - start < 30
    assert set(_children()) <= before  # killed and reaped
    assert procs.call_in_fresh_process(abs, -3) == 3  # and the next one runs


def _children() -> list[int]:
    pid = os.getpid()
    return [
        int(c)
        for t in os.listdir(f"/proc/{pid}/task")
        for c in open(f"/proc/{pid}/task/{t}/children").read().split()
    ]


def test_what_the_fresh_process_raises_or_a_death_comes_back_here() -> None:
    with pytest.raises(ValueError, match="invalid literal for int"):
        procs.call_in_fresh_process(int, "x")
    with pytest.raises(ChildProcessError, match="ended with status 3 and no result"):
        procs.call_in_fresh_process(_dies, None)


def test_a_script_without_a_main_guard_runs_the_heavy_analyses_in_a_fresh_process(
    db: Path, tmp_path: Path
) -> None:
    """The fresh process does not run the caller's script again (multiprocessing's spawn would, and
    fail on a script without ``if __name__ == "__main__"``): the script's report has every heavy
    result, computed elsewhere."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import os\n"
        "from traceprof.engine import findings\n"
        "from traceprof.engine.session import Session\n"
        "from traceprof.storage.store import Store\n"
        "here = []\n"
        "real = Session._compute\n"
        "Session._compute = lambda self, n, fn, st, p: (here.append(n), real(self, n, fn, st, p))[1]\n"
        f"with Store({str(db)!r}, read_only=True) as s, Session(s) as x:\n"
        "    out = findings.run_analyses(s, s.resolve_run(None), {'mfu': {'model_flops_per_step': '1e12'}})\n"
        "print(sorted(n for n in ('whatif', 'stragglers', 'critical_path', 'mfu') if type(out[n]).__name__ == 'Result'))\n"
        "print(sorted(set(here) & {'whatif', 'stragglers', 'critical_path', 'mfu'}))\n"
    )
    env = dict(os.environ, TRACEPROF_FRESH_EVENTS="0")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['critical_path', 'mfu', 'stragglers', 'whatif']", "[]"]


@pytest.mark.parametrize("least", [None, "0"])
def test_on_a_large_run_the_analyses_beside_the_activity_frame_run_one_at_a_time_the_heap_trimmed_after_each(
    db: Path, least: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside the frame (about 410 MiB on 8 ranks x 1 M events) two light analyses at a time made
    the parent's peak on a large run (907-1,039 MiB): there each of those that read the frame runs
    alone, the heap trimmed after it; those that do not read it still run two at a time, and a
    smaller run keeps them all two at a time. The results are those of one thread."""
    lock, running, beside, trimmed = threading.Lock(), set(), {}, []
    real_one = findings._one

    def one(an: Any, store: Any, p: Any) -> Any:
        with lock:
            beside[an.name] = frozenset(running)  # who runs as this one starts
            running.add(an.name)
        try:
            time.sleep(0.05)  # long enough that a second thread, were it let, starts meanwhile
            return real_one(an, store, p)
        finally:
            with lock:
                running.discard(an.name)

    monkeypatch.setattr(findings, "_one", one)
    monkeypatch.setattr(findings, "trim", lambda: trimmed.append(set(running)))
    out, _, _ = _report(db, 2, monkeypatch, least)
    readers = {n for n in out if n not in HEAVY and registry.get(n).reads_activity}
    others = set(out) - HEAVY - readers
    assert readers == {"temporal", "overlap", "gaps", "idle", "kernels", "parallelism"}
    assert others == {"launch", "nccl_sum", "kernel_sum", "nvtx_sum", "memcpy_sum", "desync"}
    assert any(beside[n] for n in others)  # still two at a time
    if least is None:  # 11,792 events: two at a time beside the frame too, nothing trimmed here
        assert any(beside[n] for n in readers)
        assert trimmed == []
    else:
        assert all(beside[n] == frozenset() for n in readers)
        # after each reader, nothing else running; and once before the fresh process
        assert all(t == set() for t in trimmed) and len(trimmed) == len(readers) + 1
    monkeypatch.setattr(findings, "_one", real_one)
    _equal(out, _report(db, 1, monkeypatch, None)[0])


def test_the_fresh_processs_results_wait_on_disk_until_the_light_analyses_beside_the_frame_are_done(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heavy results come back through a file read when the first heavy analysis is asked for,
    after every light analysis that reads the activity frame (not held beside it), and the file is
    gone then; the process's other results (parallelism, which stragglers reads) come back at once."""
    log: list[str] = []
    files: list[Path] = []
    real_one, real_take = findings._one, findings._Spilled.take

    def one(an: Any, store: Any, p: Any) -> Any:
        log.append(an.name)
        return real_one(an, store, p)

    def take(self: Any, i: int) -> Any:
        log.append("take")
        files.append(self.path)
        got = real_take(self, i)
        assert not self.path.exists()
        return got

    monkeypatch.setattr(findings, "_one", one)
    monkeypatch.setattr(findings._Spilled, "take", take)
    out, sent, here = _report(db, 2, monkeypatch, "0")
    readers = [n for n in out if n not in HEAVY and registry.get(n).reads_activity]
    assert len(sent) == 1 and "parallelism" in readers and "parallelism" not in here
    first = log.index("take")
    assert all(log.index(n) < first for n in readers)
    assert log.count("take") == len(HEAVY) and len(set(files)) == 1 and not files[0].exists()
    assert all(isinstance(out[n], FrameResult) for n in HEAVY)


def _interrupt_at(moment: str, monkeypatch: pytest.MonkeyPatch, results: Path) -> list[bool]:
    """Make `report` stop with Ctrl-C at ``moment`` of its fresh process; the list it gives says (at
    the end) that the results folder held the process's kept results by then, where it can."""
    import signal
    import subprocess

    from traceprof.engine import resultcache

    seen: list[bool] = []

    def entries() -> bool:  # an entry folder the fresh process kept (the light ones run after it)
        return any(e.is_dir() for e in results.glob("*/*-*"))

    if moment in ("before", "starting", "starting, to another thread"):
        real_popen = subprocess.Popen
        # a Ctrl-C goes to any thread of the process that does not block it: one of DuckDB's,
        # polars'; Python raises it in the main thread at its next line, inside Popen say
        other = threading.Thread(target=time.sleep, args=(5,), daemon=True)
        other.start()

        def popen(args: Any, *a: Any, **k: Any) -> Any:
            if "_fresh_main" not in " ".join(map(str, args)):
                return real_popen(args, *a, **k)
            if moment == "before":
                raise KeyboardInterrupt
            proc = real_popen(args, *a, **k)
            if moment == "starting":  # blocked in this thread while the process starts
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            else:  # Python raises it here, before Popen has given the process
                signal.pthread_kill(other.ident or 0, signal.SIGINT)
                time.sleep(0.05)
            return proc

        monkeypatch.setattr(subprocess, "Popen", popen)
    elif moment == "running":
        real_call = procs.call_in_fresh_process

        def calling(fn: Any, task: Any, poll: Any = None, env: Any = None, killed: Any = None) -> Any:
            start = time.monotonic()

            def ctrl_c_once_it_kept_one() -> None:
                if entries() or time.monotonic() - start > 60:
                    seen.append(entries())
                    raise KeyboardInterrupt

            return real_call(fn, task, ctrl_c_once_it_kept_one, env, killed)

        monkeypatch.setattr(procs, "call_in_fresh_process", calling)
    elif moment == "reading":

        def take(self: Any, i: int) -> Any:
            seen.append(entries())
            raise KeyboardInterrupt

        monkeypatch.setattr(findings._Spilled, "take", take)
    else:  # the light analyses, after the fresh process: keeping one of theirs
        real_keep = resultcache.keep

        def keep(*args: Any, **kwargs: Any) -> None:
            seen.append(entries())
            real_keep(*args, **kwargs)
            raise KeyboardInterrupt

        monkeypatch.setattr(resultcache, "keep", keep)
    return seen


@pytest.mark.parametrize(
    "moment", ["before", "starting", "starting, to another thread", "running", "reading", "light"]
)
def test_ctrl_c_in_a_report_with_a_fresh_process_leaves_no_results_folder_nor_process(
    db: Path, tmp_path: Path, moment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report` on a large run stopped by Ctrl-C said "nothing was changed", and the results folder
    the fresh process had made (`STORE.results/<state>/_activity-.../`) stayed; stopped while that
    process started, the process went on. At each moment: exit 130, no results folder, no process."""
    import shutil

    from tests._cli_inproc import run
    from traceprof.engine import resultcache

    store = tmp_path / "s.duckdb"
    shutil.copy(db, store)
    results = resultcache.results_dir(store)
    monkeypatch.setenv("TRACEPROF_FRESH_EVENTS", "0")
    monkeypatch.delenv("TRACEPROF_NO_CACHE", raising=False)
    monkeypatch.setattr("traceprof.cli._exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    before = set(_children())
    seen = _interrupt_at(moment, monkeypatch, results)
    out = tmp_path / "r.html"
    assert run("report", "--db", str(store), "-o", str(out)) == (
        130,
        "",
        "interrupted; nothing was changed\n",
    )
    left = set(_children()) - before
    assert not left, [open(f"/proc/{c}/cmdline").read() for c in left]  # killed and reaped
    assert not results.exists() and not out.exists()
    if moment.startswith(("before", "starting")):
        assert seen == []
    else:  # the process had kept some by then
        assert seen and all(seen)


def _write_an_entry_slowly(entry: str) -> None:
    """In a fresh process: keep a result at ``entry`` as the result cache does, the process stuck
    while it writes the frame (its temporary folder made, the entry not renamed into place)."""
    import polars as pl

    from traceprof.engine import resultcache

    real = pl.DataFrame.write_ipc

    def write_then_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        real(self, *args, **kwargs)
        time.sleep(60)

    pl.DataFrame.write_ipc = write_then_wait  # type: ignore[method-assign]
    resultcache._write(Path(entry), {"frame": pl.DataFrame({"a": [1]})}, {})


def test_a_fresh_process_killed_while_it_writes_a_result_leaves_no_half_written_entry(tmp_path: Path) -> None:
    """Killed (Ctrl-C) while it wrote an entry into a state folder that was there before, the
    process left `.tmp-PID-...` there; what it left is removed, another process's stays."""
    from traceprof.engine import resultcache

    folder = tmp_path / "r.results" / ("0" * 24)
    folder.mkdir(parents=True)
    other = folder / ".tmp-1-abc"  # pid 1 (init) never writes here: another process's, left alone
    other.mkdir()
    start = time.monotonic()

    def ctrl_c_once_half_written() -> None:
        half = [p for p in folder.glob(".tmp-*") if p != other]
        if half or time.monotonic() - start > 60:
            assert half
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        procs.call_in_fresh_process(
            _write_an_entry_slowly,
            str(folder / "x-1"),
            poll=ctrl_c_once_half_written,
            killed=functools.partial(resultcache.remove_partial, folder),
        )
    assert list(folder.iterdir()) == [other]


def _polars_threads(_: object) -> int:
    """In the fresh process: the threads polars runs on there."""
    return pl.thread_pool_size()


def test_the_fresh_process_runs_polars_on_one_thread_unless_the_user_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # one thread's temporaries at a time under the heavy analyses' peaks; a user's own setting kept
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    assert procs.call_in_fresh_process(_polars_threads, None, env=findings._fresh_env()) == 1
    monkeypatch.setenv("POLARS_MAX_THREADS", "3")
    assert "POLARS_MAX_THREADS" not in findings._fresh_env()
    assert procs.call_in_fresh_process(_polars_threads, None, env=findings._fresh_env()) == 3
