"""Where ingest parses files: in this process and its workers (``local``), or on a Dask cluster.

``--executor dask --scheduler tcp://HOST:8786`` sends one task per trace file to a running Dask
distributed scheduler. Each task parses its file and writes the file's ``events`` rows as Parquet
into the store's staging folder (:mod:`traceprof.layout`), returning only the small rest of the
trace (its ``traces`` row, devices, steps, collectives, counts and warnings) to this process, which
stores them in one transaction and runs the cross-rank stages (collective matching, clock
alignment) on the collectives table as a local ingest does. So:

- the store must have the Parquet layout (``--executor dask`` chooses it for a new store);
- the trace files and the store's folder must be on a filesystem that every worker mounts at the
  same path (NFS, Lustre, GPFS, ...), and the workers need traceprof installed (same version).

Dask is imported only here and only when this executor is used (``pip install 'traceprof[dask]'``).
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from traceprof import fileio
from traceprof.errors import TraceFormatError, TraceprofError, UsageError

__all__ = ["EXECUTORS", "map_on_dask"]

#: The ingest executors.
EXECUTORS = ("local", "dask")
#: Seconds to wait for the scheduler to answer.
CONNECT_TIMEOUT_S = 30

T = TypeVar("T")
R = TypeVar("R")


def _on_worker(fn: Callable[[Any], R], max_inflate_ratio: float, task: Any) -> R | TraceprofError:
    """Run ``fn(task)`` on a worker; a file the worker cannot read is an error naming it and the host."""
    fileio.set_max_inflate_ratio(max_inflate_ratio)
    try:
        return fn(task)
    except OSError as e:
        path = Path(task[0]) if isinstance(task, tuple) and task else Path("?")
        return TraceFormatError(
            path, "", f"cannot read on Dask worker {socket.gethostname()}: {e.strerror or e}; --executor dask "
            "needs the trace files and the store's folder on a filesystem every worker mounts at the same path")


def map_on_dask(
    fn: Callable[[T], R], tasks: list[T], scheduler: str, max_inflate_ratio: float,
    done: Callable[[int], None] | None = None,
) -> list[R | TraceprofError]:
    """``[fn(t) for t in tasks]`` on the Dask cluster at ``scheduler``, one task each.

    Args:
        fn: A function importable on the workers (module-level in traceprof) of one task; a task
            is a tuple whose first item is the file path (for messages).
        tasks: The tasks; results come back in the same order.
        scheduler: Scheduler address, e.g. ``tcp://10.0.0.5:8786``.
        max_inflate_ratio: Gzip inflate cap for the workers (:mod:`traceprof.fileio`).
        done: Called with the number of results so far after each one.

    Returns:
        The results; a task whose file a worker cannot read returns a ``TraceFormatError``.

    Raises:
        UsageError: Dask is not installed, or the scheduler cannot be reached.
        KeyboardInterrupt: Ctrl-C (the tasks are cancelled).
    """
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--executor dask needs Dask: pip install 'traceprof[dask]'") from None
    try:
        client = Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise UsageError(f"--scheduler {scheduler}: cannot reach a Dask scheduler there: {e}") from None
    try:
        futures = client.map(functools.partial(_on_worker, fn, max_inflate_ratio), tasks, pure=False)
        out: list[R | TraceprofError] = []
        try:
            for fut in futures:  # in task order: results come back in it, progress follows
                out.append(fut.result())
                if done:
                    done(len(out))
            return out
        except BaseException:
            client.cancel(futures)
            raise
    finally:
        client.close()
