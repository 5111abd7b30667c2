"""Collective rows of a Kineto trace (``collectives`` table), derived from the parsed event columns.

One row per communication kernel on GPU traces; one per ``gloo:<op>`` annotation on CPU-only traces.

The op of a GPU row comes from, in order: the kernel's own ``Collective name``; its launching CPU
op (the innermost ``record_param_comms`` with a ``Collective name``, else ``nccl:<op>`` annotation,
else ``c10d::<op>_`` op enclosing the runtime call with the kernel's correlation id, on the same
thread: old-style traces carry no metadata on the kernel, and NCCL's ``SendRecv`` kernel runs
all-to-alls too); the kernel name's family. Process group, sequence number, member ranks and
``Comms Id`` come from the kernel's args, else from the launching ``record_param_comms``. The
elements (``nelems_in``, so ``bytes_in``) come from ``In msg nelems``, else, for an all-reduce,
broadcast or reduce (in place: the first input is the op's buffer), from the naming op's first
input: prod(``Input Dims[0]``) elements of ``Input type[0]`` (an ``nccl:all_reduce`` annotation
with ``[[19618307]]`` and ``["float"]``: 78,473,228 bytes); unknown (null) otherwise.

Source fields read (from the event's ``args`` JSON): ``Collective name``, ``Process Group Name``,
``Process Group Ranks``, ``Seq``, ``Comms Id``, ``In msg nelems``, ``Out msg nelems``, ``dtype``,
``Group size``, ``In split size``, ``Out split size`` (all-to-alls), ``Dst Rank`` (a send's peer, global
rank: ``peer``), ``Src Rank`` (a recv's), ``Rank`` (a send's / recv's peer in its group:
``peer_group_rank``), ``Input Dims``, ``Input type``; events ``pid``, ``tid``, ``ts_ns``, ``dur_ns``,
``correlation`` of runtime calls and CPU ops.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from traceprof.collectors.kineto._values import meta_dict
from traceprof.collectors.kineto.columns import Frame
from traceprof.core import spill
from traceprof.core.classify import EXCLUDED_FLAGS, Classifier
from traceprof.core.limits import INT64, fits
from traceprof.core.ops import dtype_bytes, kernel_op
from traceprof.core.ops import normalize_op as _normalize_op
from traceprof.core.schema import LAUNCH_KINDS
from traceprof.core.text import first_few
from traceprof.core.values import record_int
from traceprof.core.vocab import CollectiveSource
from traceprof.ingest.matching import P2P_OPS, canonical_ranks

__all__ = ["collectives", "BadValues", "split_sizes"]

_LAUNCH_KINDS = frozenset(LAUNCH_KINDS)


def _nelems(dims: Any) -> int | None:
    """Elements of the first input of ``Input Dims`` ([[d0, d1, ...], ...]), or None: also where a
    dim is no integer (``null``, a ``NaN`` read as null, a float): unknown, not taken as 1."""
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        first = dims[0]
        if all(isinstance(d, int) and not isinstance(d, bool) for d in first):
            return math.prod(first)
    return None


#: Ops whose launching op's first input is the op's buffer (in place: input = output), so its size is
#: ``bytes_in``; others (``_all_gather_base(output, input)``, ``all_to_all_single(output, input)``)
#: list the output first, and are left unknown without ``In msg nelems``.
_ONE_BUFFER_OPS = frozenset({"all_reduce", "broadcast", "reduce"})


def _from_dims(a: dict[str, Any], n_in: int | None, dtype: str | None) -> tuple[int | None, str | None]:
    """(elements, dtype) of a launching op's first input where the kernel's metadata lacks ``In msg
    nelems``: prod(``Input Dims[0]``) and ``Input type[0]`` (``[[19618307]]``, ``["float"]``: 19,618,307
    x 4 = 78,473,228 bytes), taken only when both are known and the count is not negative, for
    :data:`_ONE_BUFFER_OPS`; else (``n_in``, ``dtype``) as they were."""
    types = a.get("Input type")
    kind = types[0] if isinstance(types, list) and types and isinstance(types[0], str) else None
    n = _nelems(a.get("Input Dims"))
    if n is None or n < 0 or dtype_bytes(dtype or kind) is None:
        return n_in, dtype
    return n, dtype or kind


#: Launching-op names by precedence (lower first): metadata, the ProcessGroupNCCL annotation, the c10d op.
_RPC = "record_param_comms"
_NAMING_KINDS = frozenset({"cpu_op", "user_annotation"})
_MAX_NESTING = 64  # enclosing candidates looked at per launch (CPU op stacks are shallower)


def _naming_rank(name: str, collective_name: Any) -> int | None:
    """Precedence of a CPU event as the namer of a collective (0 best), None if it names none
    (``collective_name``: a ``record_param_comms``'s ``Collective name`` arg)."""
    if name == _RPC:
        return 0 if collective_name and isinstance(collective_name, str) else None
    if name.startswith("nccl:"):
        return 1
    if name.startswith("c10d::") and "wait" not in name and "barrier" not in name:
        return 2
    return None


def _launchers(
    cols: dict[str, Any], f: Frame, wanted: np.ndarray, bad: BadValues
) -> dict[int, tuple[int, str | None, int, int]]:
    """Per correlation id (of ``wanted``) of a runtime launch: (launch ts ns, the ``op`` the enclosing
    CPU ops name or None, the row of the naming ``record_param_comms`` or -1, the row of the op that
    named it or -1), from the innermost naming op of best precedence.

    1. The naming ops (``record_param_comms``, ``nccl:*``, ``c10d::*``) get their precedence and op
       once each: a ``record_param_comms`` names one only with a ``Collective name`` (a string:
       another JSON type is ignored, in ``bad``), read from its args a batch at a time
       (:func:`_collective_names`; the args are not kept).
    2. Per lane (pid, tid) the naming ops are sorted by (start, -end, row) and the launches of
       ``wanted`` ids on the lane by time; one sweep over both keeps the stack of ops open at the
       launch (pushed as they start, each in start order, so of ops that start together the shortest,
       innermost, is on top). At a launch the stack is walked from the top, innermost first: ops
       that ended before the launch are dropped from it for good (later launches are later), and of
       the ops that enclose the launch at most :data:`_MAX_NESTING` are looked at, until one of the
       best precedence (``record_param_comms``) is met. Only enclosing ops count towards that
       bound: short siblings that ended before the launch (70 ``nccl:all_reduce`` user
       annotations between a ``record_param_comms`` and its launch) never hide the op around it.
       Each op is pushed and dropped once, so a lane costs O(ops + launches x the bound) after
       the sorts.
    """
    naming_name = np.array([n == _RPC or n.startswith(("nccl:", "c10d::")) for n in f.names], bool)
    naming = np.flatnonzero(f.kind_in(_NAMING_KINDS) & naming_name[f.name_code] if f.n else np.zeros(0, bool))
    names = [f.names[c] for c in f.name_code[naming].tolist()]
    rpc_at = [k for k, n in enumerate(names) if n == _RPC]
    cnames: list[Any] = [None] * len(names)
    for k, cname in zip(rpc_at, _collective_names(f, naming[rpc_at]), strict=True):
        cnames[k] = _text(cname, "Collective name", int(naming[k]), bad)
    rank_all = [_naming_rank(n, c) for n, c in zip(names, cnames, strict=True)]
    names_op = [
        k for k, r in enumerate(rank_all) if r is not None
    ]  # a c10d wait, a bare record_param_comms: no
    rank: list[int] = [rank_all[k] for k in names_op]  # type: ignore[misc]
    op_of = [normalize_op(cnames[k] if rank_all[k] == 0 else names[k]) for k in names_op]
    naming = naming[np.array(names_op, np.int64)]
    del names, rpc_at, cnames, rank_all, names_op
    pid, tid = cols["pid"].codes, cols["tid"].codes  # a lane: (pid code, tid code)
    n_ts = f.ts[naming]
    n_end = n_ts + f.dur[naming]
    launches = np.flatnonzero(f.kind_in(_LAUNCH_KINDS) & f.corr_ok & np.isin(f.corr, wanted))
    found_at: list[tuple[int, str | None, int, int]] = [(0, None, -1, -1)] * len(launches)
    for lane_ops, lane_launches in _by_lane(pid, tid, naming, launches):
        lane_ops = lane_ops[np.lexsort((naming[lane_ops], -n_end[lane_ops], n_ts[lane_ops]))]
        starts, ends, ops = n_ts[lane_ops].tolist(), n_end[lane_ops].tolist(), lane_ops.tolist()
        t_launch = f.ts[launches[lane_launches]]
        by_time = np.argsort(t_launch, kind="stable")
        lane_launches, t_launch = lane_launches[by_time], t_launch[by_time]
        found = np.searchsorted(n_ts[lane_ops], t_launch, "right").tolist()  # ops starting at or before each
        stack: list[int] = []  # positions in ops: the ops that may enclose this launch or a later one
        pushed = 0
        for k, t, j in zip(lane_launches.tolist(), t_launch.tolist(), found, strict=True):
            for m in range(pushed, j):
                while stack and ends[stack[-1]] < starts[m]:  # ended before this op, so before the launch
                    stack.pop()
                stack.append(m)
            pushed = max(pushed, j)
            best, op, rpc, named = 99, None, -1, -1
            at, looked = len(stack) - 1, 0
            while at >= 0 and looked < _MAX_NESTING:
                m = stack[at]
                if ends[m] < t:  # ended before this launch (so before every later one)
                    del stack[at]  # costs the entries above it: at most the bound, each looked at
                    at -= 1
                    continue
                looked += 1
                at -= 1
                r = rank[ops[m]]
                if r >= best:
                    continue
                best, op, named = r, op_of[ops[m]], int(naming[ops[m]])  # innermost first: ties keep it
                if r == 0:
                    rpc = int(naming[ops[m]])
                    break
            found_at[k] = (t, op, rpc, named)
    # a repeated id: its earliest launch (traceprof.collectors.kineto.columns.PAIRING)
    first = np.lexsort((f.ts[launches], f.corr[launches]))[::-1].tolist()  # the earliest last, so it stays
    corr = f.corr[launches].tolist()
    return {corr[k]: found_at[k] for k in first}


def _by_lane(
    pid: np.ndarray, tid: np.ndarray, naming: np.ndarray, launches: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per (pid, tid) lane holding launches: (positions in ``naming`` of its ops, positions in
    ``launches`` of its launches); lanes are grouped by one sort, not a Python loop over rows."""
    lane = np.concatenate(
        [
            pid[naming].astype(np.int64) << 32 | tid[naming].astype(np.int64) & 0xFFFFFFFF,
            pid[launches].astype(np.int64) << 32 | tid[launches].astype(np.int64) & 0xFFFFFFFF,
        ]
    )
    is_launch = np.arange(len(lane)) >= len(naming)
    order = np.argsort(lane, kind="stable")
    bounds = np.flatnonzero(np.diff(lane[order])) + 1
    for group in np.split(order, bounds) if len(order) else []:
        at = is_launch[group]
        if at.any():
            yield group[~at], group[at] - len(naming)


def _collective_names(f: Frame, rows: np.ndarray) -> list[Any]:
    """The ``Collective name`` arg (or None) of each ``record_param_comms`` row, decoded a batch
    at a time (``Frame.args_of``; the args are not kept)."""
    return [a.get("Collective name") for a in f.args_of(rows)]


def _rpc_args(f: Frame, row: int) -> dict[str, Any]:
    """The args of a ``record_param_comms`` row, decoded for the metadata keys (``meta_dict``)."""
    spill.note_read(4096)  # spilled args: drop the pages read now and then
    return meta_dict(f.args[row].as_py())


@functools.lru_cache(maxsize=4096)
def normalize_op(name: str) -> str:
    """``traceprof.core.ops.normalize_op``, once per distinct name (a trace repeats a few names)."""
    return _normalize_op(name)


def _canonical_ranks(value: Any, seen: dict[str, str | None]) -> str | None:
    """``traceprof.ingest.matching.canonical_ranks``, once per distinct value (keyed by its ``repr``: a
    list of ints and of bools differ there)."""
    key = repr(value)
    if key not in seen:
        seen[key] = canonical_ranks(value)
    return seen[key]


#: The metadata keys read (a kernel's launching record_param_comms is decoded only when one is missing).
_RPC_KEYS = (
    "dtype",
    "In msg nelems",
    "Out msg nelems",
    "Process Group Name",
    "Comms Id",
    "Process Group Ranks",
    "Seq",
    "Group size",
)

#: Point-to-point metadata (torch's profiler, ``saveNcclMeta``): a send's ``Dst Rank`` and a recv's
#: ``Src Rank`` are the peer's global rank; ``Rank`` of a send / recv is the peer's rank in the group.
_PEER_KEYS = {"send": "Dst Rank", "recv": "Src Rank"}


def _rank_value(value: Any) -> int | None:
    """A rank written as a JSON integer or its decimal text (torch writes these metadata values
    unquoted, a recorder may quote them), >= 0; else None."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None


class BadValues:
    """Metadata values the rows refuse, with the event rows (of the :class:`Frame`) that held them.

    A value of the wrong type (a ``Seq``, element count or group size that is not a JSON integer:
    ``"7"`` and ``7.0`` are none, as for every source's record numbers,
    ``traceprof.core.values.record_int``; a ``Collective name``,
    ``Process Group Name`` or ``dtype`` that is not a string; a ``Comms Id`` that is neither) is
    *ignored*: read as absent (the op then comes from the launching op or the kernel's name), the
    collective is kept. A number that cannot be stored (beyond its column's type, a negative
    element count, a byte count beyond int64) *drops* the collective row, counted in ``rejected``
    as ``collective: <reason>`` like :func:`traceprof.core.limits.to_table` does; the kernel (or gloo
    annotation) itself stays in ``events``. Either way the warning names the events.
    """

    def __init__(self) -> None:
        self.dropped: dict[str, list[tuple[int, Any]]] = {}  # reason -> (frame row, value) per record
        self.ignored: dict[str, list[tuple[int, Any]]] = {}

    def drop(self, reason: str, row: int, value: Any) -> None:
        self.dropped.setdefault(reason, []).append((row, value))

    def ignore(self, reason: str, row: int, value: Any) -> None:
        self.ignored.setdefault(reason, []).append((row, value))

    def count(self, rejected: dict[str, int]) -> None:
        """Add the dropped rows to ``rejected`` (``"collective: 'seq' beyond int64"``: n)."""
        for reason, at in self.dropped.items():
            key = f"collective: {reason}"
            rejected[key] = rejected.get(key, 0) + len(at)

    def warnings(self, name: str, src_index: list[int]) -> list[str]:
        """One warning per reason, naming the file, an example value and the events (``#12, #40, ...``)."""

        def events(at: list[tuple[int, Any]]) -> str:
            rows = sorted({r for r, _ in at})
            return first_few(rows, shown=lambda r: f"#{src_index[r]}")

        out = [
            f"{name}: {len(at)} collective row(s) not stored (their events are): {reason}, e.g. "
            f"{_shown(at[0][1])} (events {events(at)})"
            for reason, at in self.dropped.items()
        ]
        out += [
            f"{name}: {len(at)} value(s) ignored, read as absent: {reason}, e.g. {_shown(at[0][1])} "
            f"(events {events(at)})"
            for reason, at in self.ignored.items()
        ]
        return out


def _shown(value: Any) -> str:
    """A trace value for a message: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: Any, key: str, row: int, bad: BadValues, *, integer: bool = False) -> str | None:
    """A string metadata value (``integer``: an integer too, as its decimal text), else None: an
    absent value, or another JSON type (a number, a list, an object), ignored in ``bad``: stored,
    it would be Python's text of the value (``"{'a': 1}"``)."""
    if value is None or isinstance(value, str):
        return value
    if integer and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    bad.ignore(f"{key!r} not a string{' or an integer' if integer else ''}", row, value)
    return None


#: Integer metadata: (args key, column, bits of the column, a count: negative refused).
_INT_KEYS = (
    ("Seq", "seq", 64, False),
    ("In msg nelems", "nelems_in", 64, True),
    ("Out msg nelems", "nelems_out", 64, True),
    ("Group size", "group_size", 32, True),
)


def _metadata_ints(
    m: dict[str, Any], holder: Any, bad: BadValues, keys: tuple[tuple[str, str, int, bool], ...] = _INT_KEYS
) -> dict[str, int | None] | None:
    """The integer columns (of ``keys``) of a row from its metadata ``m``, or None when the row
    must be dropped (:class:`BadValues`); ``holder(key)`` is the event row the value of ``key``
    came from."""
    out: dict[str, int | None] = {}
    for key, column, bits, count in keys:
        v = m.get(key)
        n, problem = record_int(v, bits)  # a record's number: a JSON integer (core.values)
        if problem == "not an integer":
            bad.ignore(f"{key!r} not an integer", holder(key), v)
        elif problem is not None:
            bad.drop(f"{column!r} {problem}", holder(key), v)
            return None
        elif count and n is not None and n < 0:
            bad.drop(f"negative {column!r}", holder(key), v)
            return None
        out[column] = n
    return out


#: What a gloo annotation's args give (its elements come from ``Input Dims``).
_GLOO_INT_KEYS = tuple(k for k in _INT_KEYS if k[0] in ("Seq", "Group size"))


def _sizes(
    n_in: int | None, n_out: int | None, size: int | None, holder: Any, bad: BadValues
) -> tuple[int | None, int | None] | None:
    """(bytes_in, bytes_out) of element counts of ``size`` bytes, or None when one is beyond int64
    (the row is dropped: :class:`BadValues`)."""
    out = []
    for n, column, key in ((n_in, "bytes_in", "In msg nelems"), (n_out, "bytes_out", "Out msg nelems")):
        b = n * size if n is not None and size else None
        if b is not None and not fits(b, INT64):
            bad.drop(f"{column!r} beyond int64", holder(key), b)
            return None
        out.append(b)
    return out[0], out[1]


def collectives(
    cols: dict[str, Any], f: Frame, gpu_present: bool, classifier: Classifier
) -> tuple[dict[str, list[Any]], BadValues]:
    """Collective rows (module doc), in start order, with per-(pg, op) ordinals.

    Args:
        cols: The parsed event columns (kind, name, ts_ns, dur_ns, pid, tid, correlation, class,
            flag, stream, step, ...), ns times.
        f: The same rows as arrays (``traceprof.collectors.kineto.columns``), ``args`` included.
        gpu_present: The trace has GPU lanes (rows from comm kernels) or not (rows from gloo).
        classifier: The parse's classifier: a kernel whose name alone says its op (DeepEP
            dispatch/combine: all_to_all) is named by its family.

    Returns:
        (the ``collectives`` columns a collector fills: name -> one value per row, times ns; the
        metadata values refused, for the parser's warnings and ``rejected`` counts).
    """
    bad = BadValues()
    if gpu_present:
        cand = np.flatnonzero(
            f.kind_in({"kernel"}) & cols["class"].isin({"comm"}) & ~cols["flag"].isin(EXCLUDED_FLAGS)
        )
        wanted = np.unique(f.corr[cand][f.corr_ok[cand]])
    else:
        gloo = np.array([n.startswith("gloo:") for n in f.names], bool)
        cand = np.flatnonzero(
            f.kind_in({"user_annotation"}) & gloo[f.name_code] if f.n else np.zeros(0, bool)
        )
        wanted = np.zeros(0, np.int64)
    launchers = _launchers(cols, f, wanted, bad) if gpu_present else {}
    ranks_text: dict[str, str | None] = {}
    rows: list[tuple[Any, ...]] = []
    per_row = zip(
        cand.tolist(),
        f.args_of(cand),
        cols["name"].take(cand).tolist(),
        cols["correlation"].take(cand).tolist(),
        cols["tid"].take(cand).tolist(),
        f.ts[cand].tolist(),
        (f.ts[cand] + f.dur[cand]).tolist(),
        cols["stream"].take(cand).tolist(),
        cols["step"].take(cand).tolist(),
        strict=True,
    )
    for row, a, name, corr, lane_tid, start_ns, end_ns, stream, step in per_row:
        m = a  # the metadata: the kernel's args, a key missing or null there taken from its record_param_comms
        holder = functools.partial(_holder, a, row, -1)  # the event row a key's value came from
        if gpu_present:
            source = CollectiveSource.nccl_kernel
            enter, launch_op, rpc_row, op_row = launchers.get(corr, (None, None, -1, -1))
            if rpc_row >= 0 and None in map(a.get, _RPC_KEYS):  # read only where the kernel's args lack a key
                rpc = _rpc_args(f, rpc_row)
                if rpc:
                    m = rpc | {k: v for k, v in a.items() if v is not None}
                    holder = functools.partial(_holder, a, row, rpc_row)
            own = _text(a.get("Collective name"), "Collective name", row, bad)
            op = normalize_op(own) if own else launch_op or kernel_op(name)
            if op == "unknown" and (fam := classifier.family(name)) is not None and fam.op:
                op = fam.op  # e.g. DeepEP dispatch/combine: all_to_all
            dtype = _text(m.get("dtype"), "dtype", holder("dtype"), bad)
            ints = _metadata_ints(m, holder, bad)
            if ints is None:
                continue
            seq, n_in, n_out, group_size = (
                ints["seq"],
                ints["nelems_in"],
                ints["nelems_out"],
                ints["group_size"],
            )
            if n_in is None and op_row >= 0 and op in _ONE_BUFFER_OPS:  # nccl:all_reduce record_function
                n_in, dtype = _from_dims(_rpc_args(f, op_row), n_in, dtype)
            tid = None
        else:
            source = CollectiveSource.gloo
            op = normalize_op(name)
            types = a.get("Input type")
            dtype = _text(types[0], "Input type", row, bad) if isinstance(types, list) and types else None
            ints = _metadata_ints(m, holder, bad, _GLOO_INT_KEYS)
            n_in = _nelems(a.get("Input Dims"))
            problem = (
                None
                if n_in is None
                else "'nelems_in' beyond int64"
                if not fits(n_in, INT64)
                else "negative 'nelems_in'"
                if n_in < 0
                else None
            )
            if problem is not None:
                bad.drop(problem, row, a.get("Input Dims"))
            if ints is None or problem is not None:
                continue
            seq, group_size, n_out = ints["seq"], ints["group_size"], None
            enter = None
            tid = lane_tid
        sizes = _sizes(n_in, n_out, dtype_bytes(dtype), holder, bad)
        if sizes is None:
            continue
        pg = _text(m.get("Process Group Name"), "Process Group Name", holder("Process Group Name"), bad)
        cid = _text(m.get("Comms Id"), "Comms Id", holder("Comms Id"), bad, integer=True)
        a2a = op.startswith("all_to_all")  # splits only matter (and are only kept) for all-to-alls
        peer_key = _PEER_KEYS.get(op)
        if peer_key is not None and gpu_present and rpc_row >= 0 and m.get(peer_key) is None:
            m = _rpc_args(f, rpc_row) | {k: v for k, v in a.items() if v is not None}
        rows.append(
            (
                source,
                pg,
                _canonical_ranks(m.get("Process Group Ranks"), ranks_text),
                seq,
                op in P2P_OPS,
                cid,
                op,
                dtype,
                n_in,
                n_out,
                sizes[0],
                sizes[1],
                group_size,
                enter,
                start_ns,
                end_ns,
                stream,
                tid,
                step,
                split_sizes(m.get("In split size")) if a2a else None,
                split_sizes(m.get("Out split size")) if a2a else None,
                _rank_value(m.get(peer_key)) if peer_key else None,
                _rank_value(m.get("Rank")) if peer_key else None,
            )
        )
    start, pg_at, op_at = _FIELDS.index("start_ns"), _FIELDS.index("pg"), _FIELDS.index("op")
    rows.sort(key=lambda r: r[start])
    counter: dict[tuple[Any, str], int] = {}
    ordinals = []
    for r in rows:
        key = (r[pg_at], r[op_at])
        ordinals.append(counter.get(key, 0))
        counter[key] = ordinals[-1] + 1
    out = (
        {name: list(col) for name, col in zip(_FIELDS, zip(*rows, strict=True), strict=True)}
        if rows
        else {name: [] for name in _FIELDS}
    )
    out["ordinal"] = ordinals
    return out, bad


def split_sizes(value: Any) -> str | None:
    """An all-to-all's split sizes (first-dimension sizes per peer, in group-rank order) as the
    canonical JSON text ``"[3, 3, 2]"`` (``"[]"``: an even split), from a list of integers or its
    text (Kineto ``In split size`` / ``Out split size``: ``"[]"``, ``"[3, 3]"``; gloo's
    ``c10d::alltoall_base_`` concrete inputs); None when absent or not a list of integers >= 0."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return None
    return "[" + ", ".join(str(v) for v in value) + "]"


def _holder(a: dict[str, Any], row: int, rpc_row: int, key: str) -> int:
    """The event row whose args gave ``key``: the kernel's (``row``) where it has the key, else its
    record_param_comms (``rpc_row``, -1: none)."""
    return row if a.get(key) is not None or rpc_row < 0 else rpc_row


#: The ``collectives`` columns a Kineto trace fills (besides ``ordinal``), in the order of the row tuples.
_FIELDS = (
    "source",
    "pg",
    "pg_ranks",
    "seq",
    "p2p",
    "comms_id",
    "op",
    "dtype",
    "nelems_in",
    "nelems_out",
    "bytes_in",
    "bytes_out",
    "group_size",
    "enter_ns",
    "start_ns",
    "end_ns",
    "stream",
    "tid",
    "step",
    "split_in",
    "split_out",
    "peer",
    "peer_group_rank",
)
