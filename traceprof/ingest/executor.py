"""Where ingest parses files and per-rank analyses run: here (``local``), or on a Dask cluster.

``--executor dask --scheduler tcp://HOST:8786`` sends one task per trace file to a running Dask
distributed scheduler. Each task parses its file and writes the file's ``events`` rows as Parquet
into the store's staging folder (:mod:`traceprof.storage.layout`), returning only the small rest of the
trace (its ``traces`` row, devices, steps, collectives, counts and warnings) to this process, which
stores them in one transaction and runs the cross-rank stages (collective matching, clock
alignment) on the collectives table as a local ingest does. So:

- the store must have the Parquet layout (``--executor dask`` chooses it for a new store);
- the trace files and the store's folder must be on a filesystem that every worker mounts at the
  same path (NFS, Lustre, GPFS, ...), and the workers need traceprof installed (same version).

``analyze`` / ``report --executor dask`` run each per-rank analysis as one task per rank on the
same cluster (:mod:`traceprof.engine.rankwise`).

Dask is imported only here and only when this executor is used (``pip install 'traceprof[dask]'``).
"""

from __future__ import annotations

import contextlib
import functools
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from traceprof.core.errors import TraceFormatError, TraceprofError, UsageError

__all__ = ["EXECUTORS", "DaskCluster", "check_options", "map_on_dask"]

#: The ingest executors.
EXECUTORS = ("local", "dask")
#: Seconds to wait for the scheduler to answer.
CONNECT_TIMEOUT_S = 30
#: Seconds to wait for a TCP connection to the scheduler's port before Dask is asked to connect.
PROBE_TIMEOUT_S = 5
_ADDRESS = re.compile(
    r"^(?:(?P<scheme>[a-z]+)://)?(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\s\[\]]+):(?P<port>\d{1,5})/?$"
)

T = TypeVar("T")
R = TypeVar("R")


def _on_worker(fn: Callable[[Any], R], task: Any) -> R | TraceprofError:
    """Run ``fn(task)`` on a worker; a file the worker cannot read is an error naming it and the host."""
    try:
        return fn(task)
    except OSError as e:
        path = Path(task[0]) if isinstance(task, tuple) and task else Path("?")
        return TraceFormatError(
            path,
            "",
            f"cannot read on Dask worker {socket.gethostname()}: {e.strerror or e}; --executor dask "
            "needs the trace files and the store's folder on a filesystem every worker mounts at the same path",
        )


def check_options(executor: str, scheduler: str | None) -> bool:
    """Check ``--executor`` / ``--scheduler``; returns whether the executor is dask.

    Raises:
        UsageError: An unknown executor, a scheduler without dask, dask without a scheduler.
    """
    if executor not in EXECUTORS:
        raise UsageError(f"--executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
    if executor != "dask":
        if scheduler is not None:
            raise UsageError("--scheduler is for --executor dask")
        return False
    if not scheduler:
        raise UsageError("--executor dask needs --scheduler ADDRESS, e.g. tcp://HOST:8786")
    return True


class DaskCluster:
    """A connection to a running Dask distributed scheduler, opened on the first :meth:`map`.

    Use it as a context manager: the connection closes at the end of the block. Several maps
    (e.g. one per analysis of a report) share the one connection.

    Args:
        scheduler: Scheduler address, e.g. ``tcp://10.0.0.5:8786``.
    """

    def __init__(self, scheduler: str) -> None:
        self.scheduler = scheduler
        self._client: Any = None

    def __enter__(self) -> DaskCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (a second call does nothing)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def connect(self) -> Any:
        """The Dask client, connected on the first call.

        Raises:
            UsageError: Dask is not installed, or the scheduler cannot be reached.
        """
        if self._client is None:
            try:
                from distributed import Client
            except ImportError:
                raise UsageError("--executor dask needs Dask: pip install 'traceprof[dask]'") from None
            _probe(self.scheduler)
            try:
                self._client = Client(self.scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
            except (OSError, TimeoutError, ValueError) as e:
                raise UsageError(
                    f"--scheduler {self.scheduler}: cannot reach a Dask scheduler there: {e}"
                ) from None
        return self._client

    def map(
        self,
        fn: Callable[[T], R],
        tasks: list[T],
        done: Callable[[int], None] | None = None,
    ) -> list[R | TraceprofError]:
        """``[fn(t) for t in tasks]`` on the cluster, one Dask task each, results in task order.

        Args:
            fn: A function importable on the workers (module-level in traceprof) of one task; a task
                is a tuple whose first item is the file the task reads (for messages).
            tasks: The tasks (each with what it needs, e.g. the parse options).
            done: Called with the number of results so far after each one.

        Returns:
            The results; a task whose file a worker cannot read returns a ``TraceFormatError``.

        Raises:
            UsageError: Dask is not installed, or the scheduler cannot be reached.
            KeyboardInterrupt: Ctrl-C (the tasks are cancelled).
        """
        client = self.connect()
        futures = client.map(functools.partial(_on_worker, fn), tasks, pure=False)
        out: list[R | TraceprofError] = []
        try:
            for fut in futures:  # in task order: results come back in it, progress follows
                out.append(fut.result())
                if done:
                    done(len(out))
            return out
        except BaseException as e:
            with contextlib.suppress(Exception):
                client.cancel(futures)
            if _lost(e):
                raise TraceprofError(
                    f"--scheduler {self.scheduler}: lost the Dask cluster after {len(out)} of {len(tasks)} task(s) "
                    f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'})"
                ) from None
            raise


def _lost(e: BaseException) -> bool:
    """Whether ``e`` is Dask losing the scheduler or a worker (not an error of the task itself)."""
    import asyncio  # only on the Dask path (28 ms of import)

    return isinstance(e, asyncio.CancelledError | TimeoutError | ConnectionError) or type(e).__module__.split(
        "."
    )[0] in ("distributed", "tornado")


def _probe(scheduler: str) -> None:
    """Refuse an address that is not ``[scheme://]HOST:PORT``, and a TCP one whose port refuses or
    does not answer within :data:`PROBE_TIMEOUT_S` (Dask would wait :data:`CONNECT_TIMEOUT_S` and
    then hang at exit).

    Raises:
        UsageError: Naming the address and what is wrong with it.
    """
    scheme = scheduler.split("://", 1)[0] if "://" in scheduler else None
    if scheme in ("inproc", "ucx", "ws", "wss"):
        return  # Dask's other transports are left to Dask
    m = _ADDRESS.match(scheduler.strip())
    if m is None or m["scheme"] not in (None, "tcp", "tls"):
        raise UsageError(
            f"--scheduler {scheduler}: expected a Dask scheduler address [tcp://]HOST:PORT, "
            "e.g. tcp://10.0.0.5:8786"
        )
    host, port = m["host"].strip("[]"), int(m["port"])
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise UsageError(
            f"--scheduler {scheduler}: cannot reach a Dask scheduler there: "
            f"{e.strerror or type(e).__name__} (is `dask scheduler` running, and the port open?)"
        ) from None


def map_on_dask(
    fn: Callable[[T], R],
    tasks: list[T],
    scheduler: str,
    done: Callable[[int], None] | None = None,
) -> list[R | TraceprofError]:
    """:meth:`DaskCluster.map` on a connection of its own to the scheduler at ``scheduler``
    (arguments, results and errors as there)."""
    with DaskCluster(scheduler) as cluster:
        return cluster.map(fn, tasks, done)
