"""Ranks of an Nsight Systems export: which process is which rank, and where the number comes from.

A report usually holds one rank (``nsys profile -o name_%q{RANK}`` around each rank). One
``nsys profile`` around a whole ``torchrun`` (or a multi-process capture) holds every local rank as
a process of its own; their CUDA correlation ids count independently per process, so they collide.

Algorithm:
  1. The process of a row is its ``globalPid`` (GPU rows) or ``globalTid`` (CUDA API calls, NVTX)
     without the 24 thread bits (``>> 24``; the bits above the pid name the host / VM).
  2. Processes with CUDA work: those with a GPU row or a CUDA runtime / driver call. None or one:
     the export is one rank, every row kept (:func:`file_rank`). Several: one trace per such
     process (:func:`split`); rows of other processes (the launcher, data-loader workers) are not
     stored and are counted in ``skipped``; a GPU row without a process (an export without
     ``globalPid``) goes to the one process whose launch call has its correlation id, else it is
     rejected (counted). Launches link to their GPU work within a process only.
  3. The rank of each process (:func:`process_ranks`), by the first rule that gives every process
     one distinct rank: ``RANK`` (or another global rank variable) in the environment nsys recorded
     for that process (``META_DATA_CAPTURE`` ``PROCESS_<n>:*`` entries, matched by
     ``PROCESS_<n>:PID``); nsys's MPI thread name ``MPI Rank N`` (NVTX) on one of its threads;
     node x local world size + ``LOCAL_RANK`` (or ``OMPI_COMM_WORLD_LOCAL_RANK``, ``SLURM_LOCALID``)
     in its recorded environment; node x local world size + the position of its device among the
     processes' devices (``LOCAL_RANK`` when rank i drives the i-th visible GPU, as torchrun jobs
     do); else the order of the pids, with a warning. Node from ``GROUP_RANK`` / ``NODE_RANK`` /
     ``SLURM_NODEID`` and local world size from ``LOCAL_WORLD_SIZE`` in the recorded environment,
     else node 0 and the number of processes. The rule used is recorded in ``traces.meta``
     (``rank_source``).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceprof.core.errors import TraceFormatError
from traceprof.core.values import world_size_int

__all__ = ["Env", "read_env", "env_int", "file_rank", "process_ranks", "split", "RANK_ENV", "WORLD_ENV"]

#: Variables holding a process's global rank, in order of preference.
RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK")
#: Variables holding the world size, in order of preference.
WORLD_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MV2_COMM_WORLD_SIZE")
_LOCAL_RANK_ENV = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID")
_NODE_ENV = ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID")
_LOCAL_WORLD_ENV = ("LOCAL_WORLD_SIZE",)
_RANK_IN_NAME = re.compile(r"rank[_.-]?(\d+)", re.IGNORECASE)
_TRAILING_NUMBER = re.compile(r"[_.-](\d+)$")
_PROCESS_KEY = re.compile(r"^PROCESS_(\d+):(.*)$")
_GPU = frozenset({"kernel", "memcpy", "memset", "sync"})
_CUDA = _GPU | {"cuda_runtime", "cuda_driver"}
_PID_BITS = 0xFFFFFF


@dataclass
class Env:
    """The environment text an export recorded (values with their names, non-UTF-8 bytes replaced).

    Attributes:
        text: Everything: capture metadata and system environment (the one-rank rules read this).
        per_pid: pid -> the ``META_DATA_CAPTURE`` ``PROCESS_<n>:*`` entries of the process nsys
            launched with that pid (``PROCESS_<n>:PID``).
        shared: The rest (system environment, capture entries of no known process).
    """

    text: str = ""
    per_pid: dict[int, str] = field(default_factory=dict)
    shared: str = ""


def _text(con: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    q = f"SELECT CAST(name AS BLOB), CAST(value AS BLOB) FROM {table}"
    return [
        (bytes(n).decode("utf-8", "replace"), bytes(v).decode("utf-8", "replace"))
        for n, v in con.execute(q)
        if n is not None and v
    ]


def read_env(con: sqlite3.Connection, tables: dict[str, set[str]]) -> Env:
    """The recorded environment (``META_DATA_CAPTURE``, ``TARGET_INFO_SYSTEM_ENV`` name / value rows)."""
    env = Env()
    shared: list[str] = []
    by_process: dict[str, list[str]] = {}
    pids: dict[str, int] = {}
    for table in ("META_DATA_CAPTURE", "TARGET_INFO_SYSTEM_ENV"):
        if table not in tables or not {"name", "value"} <= tables[table]:
            continue
        for name, value in _text(con, table):
            m = _PROCESS_KEY.match(name) if table == "META_DATA_CAPTURE" else None
            if m is None:
                shared.append(f"{name}\n{value}")
                continue
            by_process.setdefault(m.group(1), []).append(f"{name}\n{value}")
            if m.group(2) == "PID" and value.strip().isdigit():
                pids[m.group(1)] = int(value.strip())
    for n, parts in by_process.items():
        if pids.get(n):  # PID 0: nsys did not record it; the entries cannot be told apart from the rest
            env.per_pid[pids[n]] = "\n".join(parts)
        else:
            shared += parts
    env.shared = "\n".join(shared)
    env.text = "\n".join([env.shared, *env.per_pid.values()])
    return env


def env_int(env: str, names: tuple[str, ...]) -> tuple[str, set[int]] | None:
    """(variable, its distinct values) of the first variable in ``names`` found in ``env`` as
    ``NAME=123`` (or ``NAME: 123``, quoted), else None."""
    for var in names:
        found = {int(v) for v in re.findall(rf"(?:^|[\s;,\x00\"'{{]){var}\"?\s*[=:]\s*\"?(\d+)", env)}
        if found:
            return var, found
    return None


def world_size(env: Env, several: bool) -> int | None:
    """The recorded world size; with several processes in the export only ``WORLD_SIZE`` itself
    counts (a launcher's ``SLURM_NTASKS`` counts nodes, not ranks)."""
    hit = env_int(env.text, ("WORLD_SIZE",) if several else WORLD_ENV)
    # WORLD_SIZE=0 is none (traceprof.core.values.world_size_int, every reader's rule)
    return world_size_int(next(iter(hit[1])))[0] if hit and len(hit[1]) == 1 else None


def file_rank(path: Path, env: str, thread_ranks: set[int]) -> tuple[int | None, str, list[str]]:
    """Rank of a one-rank export: recorded environment, else nsys's ``MPI Rank N`` thread name, else
    the file name as ``nsys profile -o name_%q{RANK}`` writes it (``rank3``, ``..._3``, ``....3``).

    Returns:
        (rank or None, where it came from, warnings).

    Raises:
        TraceFormatError: Several ranks in the environment, or a rank that conflicts with the one
            in the file name.
    """
    hit = env_int(env, RANK_ENV) or (
        ("NVTX thread name 'MPI Rank N'", thread_ranks) if thread_ranks else None
    )
    stem = path.name.split(".sqlite")[0].split(".nsys-rep")[0]
    m = _RANK_IN_NAME.search(stem) or _TRAILING_NUMBER.search(stem)
    by_name = int(m.group(1)) if m else None
    if hit:
        var, values = hit
        if len(values) > 1:
            raise TraceFormatError(
                path,
                f"environment {var}",
                f"several ranks recorded ({sorted(values)}) but one "
                "process with CUDA work: profile each rank to its own file "
                "(nsys profile -o name_%q{RANK})",
            )
        rank = next(iter(values))
        if by_name is not None and by_name != rank and _RANK_IN_NAME.search(stem):
            raise TraceFormatError(
                path, f"environment {var}", f"rank {rank} conflicts with rank {by_name} in the file name"
            )
        return rank, (var if var.startswith("NVTX") else f"environment {var}"), []
    if by_name is not None:
        return (
            by_name,
            "file name",
            [f"{path.name}: rank {by_name} taken from the file name (no RANK in the recorded environment)"],
        )
    return None, "none", []


def _distinct(found: dict[int, int | None]) -> bool:
    vals = list(found.values())
    return None not in vals and len(set(vals)) == len(vals)


def process_ranks(
    path: Path,
    procs: list[int],
    env: Env,
    thread_ranks: dict[int | None, set[int]],
    devices: dict[int, set[int]],
) -> tuple[dict[int, int], str, list[str]]:
    """The rank of each process with CUDA work (module doc, step 3).

    Args:
        path: The export, for messages.
        procs: Process keys (``globalPid >> 24``), ascending.
        env: The recorded environment.
        thread_ranks: Process -> ranks named by its ``MPI Rank N`` NVTX thread names.
        devices: Process -> devices of its GPU rows.

    Returns:
        (process -> rank, the rule used, warnings).
    """

    def one(values: set[int] | None) -> int | None:
        return next(iter(values)) if values and len(values) == 1 else None

    def by_env(names: tuple[str, ...]) -> tuple[dict[int, int | None], str]:
        hits = {p: env_int(env.per_pid.get(p & _PID_BITS, ""), names) for p in procs}
        return {p: one(h[1]) if h else None for p, h in hits.items()}, next(
            (h[0] for h in hits.values() if h), ""
        )

    node = env_int(env.shared, _NODE_ENV)
    local = env_int(env.shared, _LOCAL_WORLD_ENV)
    n_node, n_local = one(node[1] if node else None) or 0, one(local[1] if local else None) or len(procs)
    on_node = f"; node {n_node} ({node[0]}) x {n_local} local ranks" if n_node and node else ""
    found, var = by_env(RANK_ENV)
    if _distinct(found):
        return {p: r for p, r in found.items() if r is not None}, f"environment {var} of each process", []
    found = {p: one(thread_ranks.get(p)) for p in procs}
    if _distinct(found):
        return {p: r for p, r in found.items() if r is not None}, "NVTX thread name 'MPI Rank N'", []
    found, var = by_env(_LOCAL_RANK_ENV)
    if _distinct(found):
        return (
            {p: n_node * n_local + r for p, r in found.items() if r is not None},
            f"environment {var} of each process{on_node}",
            [],
        )
    found = {p: one(devices.get(p)) for p in procs}
    if _distinct(found):
        order = sorted(d for d in found.values() if d is not None)
        how = f"device (LOCAL_RANK = the position of its GPU among the processes' GPUs{on_node})"
        return {p: n_node * n_local + order.index(d) for p, d in found.items() if d is not None}, how, []
    ranks = {p: i for i, p in enumerate(procs)}
    warn = (
        f"{path.name}: {len(procs)} processes with CUDA work and no RANK, 'MPI Rank N' thread name or "
        "one GPU per process to tell their ranks: numbered by pid order (a guess; profile each rank to its "
        "own file with nsys profile -o name_%q{RANK} to record them)"
    )
    return ranks, "process order (pid)", [warn]


@dataclass
class Split:
    """The rows of an export per process with CUDA work (:func:`split`).

    Attributes:
        rows: Process key -> indices of its rows (ascending); key None: the whole export is one rank.
        rejected / skipped: Rows not stored, counted by reason.
        others: pids of processes whose rows were not stored (no CUDA work).
    """

    rows: dict[int | None, list[int]]
    rejected: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    others: list[int] = field(default_factory=list)


def split(cols: dict[str, list[Any]], procs: list[int | None]) -> Split:
    """Rows per process with CUDA work (module doc, step 2).

    Args:
        cols: Event columns (kind, correlation) of the whole export.
        procs: The process key of each row (None when the table has no process column).

    Returns:
        A :class:`Split`.
    """
    kinds = cols["kind"]
    cuda = sorted({p for k, p in zip(kinds, procs, strict=True) if k in _CUDA and p is not None})
    n = len(kinds)
    if len(cuda) <= 1:
        return Split({None: list(range(n))})
    out = Split({p: [] for p in cuda})
    launched: dict[int, set[int]] = {}  # correlation id -> processes whose launch call has it
    for i in range(n):
        proc = procs[i]
        if (
            kinds[i] in ("cuda_runtime", "cuda_driver")
            and cols["correlation"][i] is not None
            and proc is not None
        ):
            launched.setdefault(cols["correlation"][i], set()).add(proc)
    others: set[int] = set()
    for i in range(n):
        p = procs[i]
        if p is None and kinds[i] in _GPU:
            owners = launched.get(cols["correlation"][i], set())
            p = next(iter(owners)) if len(owners) == 1 else None
            if p is None:
                why = "GPU row without globalPid whose correlationId no single process launched"
                out.rejected[why] = out.rejected.get(why, 0) + 1
                continue
        if p is None:
            why = "row without globalTid in a multi-process export"
            out.rejected[why] = out.rejected.get(why, 0) + 1
        elif p in out.rows:
            out.rows[p].append(i)
        else:
            others.add(p)
            out.skipped["rows of processes without CUDA work"] = (
                out.skipped.get("rows of processes without CUDA work", 0) + 1
            )
    out.others = sorted(p & _PID_BITS for p in others)
    return out
