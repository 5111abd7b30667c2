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
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from traceprof.core import locking

__all__ = ["worker_init", "deferred_sigint", "ignored_sigint", "map_in_workers", "call_in_fresh_process"]

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
    pool = _pool(workers)
    try:
        with _sigint_blocked():  # Executor.map submits every task, which forks the workers
            results = pool.map(fn, tasks)
        for r in results:
            out.append(r)
            if done:
                done(len(out))
    except BaseException:
        _kill(pool)
        raise
    pool.shutdown()
    return out


def call_in_fresh_process(fn: Callable[[T], R], task: T, poll: Callable[[], None] | None = None) -> R:
    """``fn(task)`` in a fresh Python process (multiprocessing's ``spawn``: a new interpreter that
    imports what ``fn`` needs, none of this process's heap, open files or store lock), set up by
    :func:`worker_init` as a parser worker is; its result comes back pickled.

    The report's heavy analyses run so on a large run (``traceprof.engine.findings``): memory this
    process has freed but its allocators keep (hundreds of MiB after the light analyses) is not
    under their peak.

    Args:
        fn: A picklable (module-level) function of one task.
        task: Its picklable argument.
        poll: Called about every 0.1 s while ``fn`` runs (e.g. ``traceprof.core.cancel.checkpoint``);
            what it raises stops the process as Ctrl-C does.

    Raises:
        What ``fn`` raises (pickled back); on Ctrl-C or what ``poll`` raises the process is killed
        at once (not waited for) and that propagates.
        concurrent.futures.process.BrokenProcessPool: The process died (e.g. killed for memory).
    """
    from concurrent.futures import wait

    pool = _pool(1, "spawn")
    try:
        with _sigint_blocked():  # the process starts with Ctrl-C blocked until worker_init ignores it
            future = pool.submit(fn, task)
        while not wait([future], timeout=0.1).done:
            if poll is not None:
                poll()
        out = future.result()
    except BaseException:
        _kill(pool)
        raise
    pool.shutdown()
    return out


def _pool(workers: int, start: str | None = None) -> Any:
    """A process pool of ``workers`` set up by :func:`worker_init`; ``start``: multiprocessing's
    start method (None: the platform's default, a fork on Linux)."""
    # imported here: multiprocessing and concurrent.futures are 10-15 ms of every command's start-up
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context(start) if start else None
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=worker_init, initargs=(os.getpid(),)
    )


def _kill(pool: Any) -> None:
    """Kill ``pool``'s processes at once (no public way to stop a worker) and shut it down."""
    for p in list(getattr(pool, "_processes", {}).values()):
        with contextlib.suppress(Exception):
            p.kill()
    pool.shutdown(wait=False, cancel_futures=True)
