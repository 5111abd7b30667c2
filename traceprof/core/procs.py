"""Process hygiene: parser workers that die with their parent, and Ctrl-C held off at a commit.

Parser workers are forked by ingest. Each one (see :func:`worker_init`) ignores Ctrl-C (the parent
handles it and stops them; a worker is forked with it blocked, so none reaches it before that),
asks the kernel to kill it when its parent dies (Linux ``PR_SET_PDEATHSIG``; elsewhere a watchdog
thread polls the parent), and closes the store lock it inherited, so a ``kill -9`` of ingest leaves
no worker behind holding the store.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

from traceprof.core import locking

__all__ = [
    "worker_init",
    "counted_sigint",
    "deferred_sigint",
    "ignored_sigint",
    "map_in_workers",
    "call_in_fresh_process",
]

T = TypeVar("T")
R = TypeVar("R")

_PR_SET_PDEATHSIG = 1


def worker_init(parent_pid: int) -> None:
    """Initializer of a parser worker process (the parse options travel with each task).

    Args:
        parent_pid: The ingest process's pid (the worker exits at once if it is already gone).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(
        signal, "pthread_sigmask"
    ):  # forked with Ctrl-C blocked (see map_in_workers): a pending one is dropped
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    locking.close_inherited()
    if not _pdeathsig():
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


def _pdeathsig() -> bool:
    """Arm SIGKILL-on-parent-death (Linux); False where unavailable."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


@contextlib.contextmanager
def counted_sigint() -> Iterator[Callable[[], bool]]:
    """Note each Ctrl-C that arrives inside the block, and handle it as before (the previous
    handler runs: by default, KeyboardInterrupt is raised).

    DuckDB checks for Ctrl-C while a statement runs and reports it its own ways (an
    ``InterruptException``, a RuntimeError "Query interrupted", Python's KeyboardInterrupt quoted in
    its message). Where that report is lost (e.g. swallowed by a clean-up that ignores DuckDB's
    errors), the transaction is left aborted and the next statement fails with "Current transaction
    is aborted": the caller asks whether a Ctrl-C arrived to report that error as the interrupt it
    is; or Python drops the KeyboardInterrupt (raised inside a weakref callback or ``__del__``, it is
    printed as "Exception ignored" and lost), and the caller stops when it sees that one arrived. The
    previous handler is restored at the end unless the block set another. Outside the main thread,
    or where Ctrl-C is ignored, the block runs as is.

    Yields:
        A function that tells whether a Ctrl-C arrived inside the block so far.
    """
    previous = (
        signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    )
    if not callable(previous):  # another thread, SIG_IGN, SIG_DFL or a handler set outside Python
        yield lambda: False
        return
    got: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        got.append(signum)
        previous(signum, frame)

    hook = sys.unraisablehook

    def dropped(
        unraisable: Any,
    ) -> None:  # the KeyboardInterrupt noted above: no "Exception ignored" traceback
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            hook(unraisable)

    signal.signal(signal.SIGINT, note)
    sys.unraisablehook = dropped
    try:
        yield lambda: bool(got)
    finally:
        sys.unraisablehook = hook
        if (
            signal.getsignal(signal.SIGINT) is note
        ):  # not when the block set another (SIG_IGN for its clean-up)
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def ignored_sigint() -> Iterator[None]:
    """Ignore Ctrl-C inside the block (e.g. printing what a finished command did), then restore
    the previous handler; a Ctrl-C that arrived before the block is raised on entry. Outside the
    main thread, signals cannot be set and the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT in this thread inside the block: processes forked (and threads started) there
    start with it blocked, so that a Ctrl-C cannot interrupt a worker before :func:`worker_init`
    ignores it (a traceback on the terminal, or a panic in an extension module being imported).
    A Ctrl-C that arrives inside is delivered here when the block ends."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def deferred_sigint() -> Iterator[Callable[[], bool]]:
    """Hold off Ctrl-C inside the block (e.g. COMMIT and recording that it happened).

    A Ctrl-C that arrives inside is raised as KeyboardInterrupt right after the block, so the
    caller knows whether the commit happened. Outside the main thread, signals cannot be set and
    the block runs as is.

    Yields:
        A function that tells whether a Ctrl-C arrived so far.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield lambda: bool(got)
    finally:
        signal.signal(signal.SIGINT, previous)
    if got:
        raise KeyboardInterrupt


def map_in_workers(
    fn: Callable[[T], R],
    tasks: list[T],
    workers: int,
    done: Callable[[int], None] | None = None,
) -> list[R]:
    """``[fn(t) for t in tasks]`` in ``workers`` forked processes (in this one when ``workers`` <= 1).

    Workers are set up by :func:`worker_init`. On Ctrl-C or any error the workers are killed at
    once (not waited for) and the exception propagates.

    Args:
        fn: A picklable function of one task.
        tasks: The tasks; results come back in the same order.
        workers: Processes to use.
        done: Called with the number of results so far after each one.
    """
    out: list[R] = []
    if workers <= 1:
        for t in tasks:
            out.append(fn(t))
            if done:
                done(len(out))
        return out
    # imported here: multiprocessing and concurrent.futures are 10-15 ms of every command's start-up
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=workers, initializer=worker_init, initargs=(os.getpid(),))
    try:
        with _sigint_blocked():  # Executor.map submits every task, which forks the workers
            results = pool.map(fn, tasks)
        for r in results:
            out.append(r)
            if done:
                done(len(out))
    except BaseException:
        for p in list(getattr(pool, "_processes", {}).values()):  # no public way to stop a worker
            with contextlib.suppress(Exception):
                p.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return out


def call_in_fresh_process(
    fn: Callable[[T], R],
    task: T,
    poll: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    killed: Callable[[int], None] | None = None,
) -> R:
    """``fn(task)`` in a fresh Python process (a new interpreter, ``sys.executable`` with this
    process's ``sys.path``, that imports what ``fn`` needs: none of this process's heap, open files
    or store lock), set up by :func:`worker_init` as a parser worker is; its result (or what it
    raised) comes back pickled through a pipe.

    Not multiprocessing's ``spawn``: that runs the caller's main script again in the child (a
    script calling ``traceprof.open(...).report(...)`` without a ``__main__`` guard would fail
    there) and leaves a resource-tracker process and its warnings behind on Ctrl-C.

    The report's heavy analyses run so on a large run (``traceprof.engine.findings``): memory this
    process has freed but its allocators keep (hundreds of MiB after the light analyses) is not
    under their peak.

    Args:
        fn: A picklable (module-level) function of one task.
        task: Its picklable argument.
        poll: Called about every 0.1 s while ``fn`` runs (e.g. ``traceprof.core.cancel.checkpoint``);
            what it raises stops the process as Ctrl-C does.
        env: Environment variables set in the process beside this one's (e.g. an allocator's
            settings, read as the process starts).
        killed: Called with the process's pid once it is killed and reaped (Ctrl-C, ``poll``):
            e.g. to remove what it left half-written.

    Raises:
        What ``fn`` raises (pickled back); on Ctrl-C or what ``poll`` raises the process is killed
        at once and that propagates.
        ChildProcessError: The process ended without a result (e.g. killed for want of memory).
    """
    import pickle
    import subprocess
    import sys

    payload = pickle.dumps((sys.path, pickle.dumps((fn, task))))
    proc: subprocess.Popen[bytes] | None = None
    try:
        # the process starts with Ctrl-C blocked until worker_init ignores it; one that came
        # meanwhile (to this thread or another) is raised once Popen has given the process: it
        # is killed below too, not left running on its own
        with deferred_sigint(), _sigint_blocked():
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"from traceprof.core.procs import _fresh_main; _fresh_main({os.getpid()})",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=None if env is None else {**os.environ, **env},
            )
        out: bytes | None = None
        data: bytes | None = payload
        while out is None:
            try:
                out, _ = proc.communicate(data, timeout=0.1)
            except subprocess.TimeoutExpired:
                data = None  # sent already: communicate keeps what it has read
                if poll is not None:
                    poll()
    except BaseException:
        if proc is not None:
            proc.kill()
            proc.communicate()
            if killed is not None:
                killed(proc.pid)
        raise
    if proc.returncode != 0 or not out:
        raise ChildProcessError(f"the process ended with status {proc.returncode} and no result")
    ok, value = pickle.loads(out)
    if not ok:
        raise value
    return value


def _fresh_main(parent_pid: int) -> None:
    """The fresh process of :func:`call_in_fresh_process`: the task from stdin, its pickled
    ``(True, result)`` or ``(False, exception)`` to stdout (nothing else is written there: the
    process's own stdout goes to stderr)."""
    import pickle
    import sys

    worker_init(parent_pid)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever else prints, at C level too, goes to stderr
    sys.stdout = sys.stderr
    path, payload = pickle.loads(sys.stdin.buffer.read())
    sys.path[:] = path
    try:
        fn, task = pickle.loads(payload)
        result = (True, fn(task))
    except Exception as e:  # noqa: BLE001 - raised again in the caller
        result = (False, e)
    try:
        data = pickle.dumps(result)
    except Exception as e:  # noqa: BLE001 - a result or error that cannot travel: say what it was
        data = pickle.dumps((False, RuntimeError(f"{type(result[1]).__name__} cannot be pickled: {e}")))
    out.write(data)
    out.close()
