"""numpy's OpenBLAS on one thread in traceprof's own command-line processes.

Importing numpy starts OpenBLAS' thread pool, one thread per core, and those threads spin waiting for
work for a while after they start. traceprof does no linear algebra (no matrix product anywhere), so
they only burn CPU: 0.03 s in each process that imports numpy on an idle 2-core machine, 0.12 s
(median of 5 pairs, ``traceprof ingest`` of ``hta/df_index_resolver``) on a busy one. The CLI asks
for one thread (``OPENBLAS_NUM_THREADS=1``) before numpy is imported, unless the user set it; the
parse workers it starts inherit that. A program traceprof launches for the user (``traceprof
collect``'s training script) gets the environment as the user had it (:func:`user_environ`).
The library (``import traceprof``) leaves the host program's environment alone.
"""

from __future__ import annotations

import os

__all__ = ["one_blas_thread", "user_environ", "BLAS_THREADS"]

#: The variable OpenBLAS reads when it loads (numpy's ``scipy-openblas`` wheels too).
BLAS_THREADS = "OPENBLAS_NUM_THREADS"
_SET_HERE = "_TRACEPROF_SET_BLAS_THREADS"  # marks that :func:`one_blas_thread` set it, not the user


def one_blas_thread() -> None:
    """Ask OpenBLAS for one thread (``OPENBLAS_NUM_THREADS=1``) unless the variable is set already;
    effective only before numpy is first imported in this process (and in the processes it starts)."""
    if BLAS_THREADS not in os.environ:
        os.environ[BLAS_THREADS] = "1"
        os.environ[_SET_HERE] = "1"


def user_environ() -> dict[str, str]:
    """The environment for a program launched for the user: ``os.environ`` without the
    ``OPENBLAS_NUM_THREADS`` that :func:`one_blas_thread` set (one the user set is kept)."""
    env = dict(os.environ)
    if env.pop(_SET_HERE, None) is not None:
        env.pop(BLAS_THREADS, None)
    return env
