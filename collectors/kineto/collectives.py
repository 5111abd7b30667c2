"""Collective rows of a Kineto trace (``collectives`` table), derived from the parsed event columns.

One row per communication kernel on GPU traces; one per ``gloo:<op>`` annotation on CPU-only traces.

The op of a GPU row comes from, in order: the kernel's own ``Collective name``; its launching CPU
op (the innermost ``record_param_comms`` with a ``Collective name``, else ``nccl:<op>`` annotation,
else ``c10d::<op>_`` op enclosing the runtime call with the kernel's correlation id, on the same
thread: old-style traces carry no metadata on the kernel, and NCCL's ``SendRecv`` kernel runs
all-to-alls too); the kernel name's family. Process group, sequence number, member ranks and
``Comms Id`` come from the kernel's args, else from the launching ``record_param_comms``.

Source fields read (from the event's ``args`` JSON): ``Collective name``, ``Process Group Name``,
``Process Group Ranks``, ``Seq``, ``Comms Id``, ``In msg nelems``, ``Out msg nelems``, ``dtype``,
``Group size``, ``Input Dims``, ``Input type``; events ``pid``, ``tid``, ``ts_ns``, ``dur_ns``,
``correlation`` of runtime calls and CPU ops.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from collectors.kineto._values import int_or_none as _int_or_none
from collectors.kineto._values import meta_dict
from collectors.kineto.columns import Frame
from traceprof import spill
from traceprof.classify import EXCLUDED_FLAGS, comm_family
from traceprof.matching import P2P_OPS, canonical_ranks
from traceprof.ops import dtype_bytes, kernel_op
from traceprof.ops import normalize_op as _normalize_op
from traceprof.schema import LAUNCH_KINDS

__all__ = ["collectives"]

_LAUNCH_KINDS = frozenset(LAUNCH_KINDS)


def _nelems(dims: Any) -> int | None:
    """Elements of the first input of ``Input Dims`` ([[d0, d1, ...], ...]), or None."""
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        return math.prod(int(d) for d in dims[0] if isinstance(d, int))
    return None


#: Launching-op names by precedence (lower first): metadata, the ProcessGroupNCCL annotation, the c10d op.
_RPC = "record_param_comms"
_NAMING_KINDS = frozenset({"cpu_op", "user_annotation"})
_MAX_NESTING = 64  # enclosing candidates looked at per launch (CPU op stacks are shallower)


def _naming_rank(name: str, args: dict[str, Any] | None) -> int | None:
    """Precedence of a CPU event as the namer of a collective (0 best), None if it names none."""
    if name == _RPC:
        return 0 if args and args.get("Collective name") else None
    if name.startswith("nccl:"):
        return 1
    if name.startswith("c10d::") and "wait" not in name and "barrier" not in name:
        return 2
    return None


def _launchers(cols: dict[str, Any], f: Frame, wanted: np.ndarray) -> dict[int, tuple[int, str | None, int]]:
    """Per correlation id (of ``wanted``) of a runtime launch: (launch ts ns, the ``op`` the enclosing
    CPU ops name or None, the row of the naming ``record_param_comms`` or -1), from the innermost
    naming op of best precedence. One pass over the naming ops and one over the launches of
    ``wanted`` ids; per lane the naming ops are numpy arrays (starts, ends, rows) in (start, end,
    row) order, and a ``record_param_comms``'s args are decoded when looked at, not kept."""
    naming_name = np.array([n == _RPC or n.startswith(("nccl:", "c10d::")) for n in f.names], bool)
    naming = np.flatnonzero(f.kind_in(_NAMING_KINDS) & naming_name[f.name_code] if f.n else np.zeros(0, bool))
    pid, tid = cols["pid"].codes, cols["tid"].codes  # a lane: (pid code, tid code)
    n_ts = f.ts[naming]
    n_end = n_ts + f.dur[naming]
    by_lane: dict[tuple[Any, Any], list[int]] = {}
    for k, i in enumerate(naming.tolist()):
        by_lane.setdefault((pid[i], tid[i]), []).append(k)
    lanes: dict[tuple[Any, Any], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for lane, ks in by_lane.items():
        at = np.array(ks, np.int64)
        order = at[np.lexsort((naming[at], n_end[at], n_ts[at]))]
        lanes[lane] = (n_ts[order], n_end[order], naming[order])
    del by_lane
    empty = np.zeros(0, np.int64)
    out: dict[int, tuple[int, str | None, int]] = {}
    launches = np.flatnonzero(f.kind_in(_LAUNCH_KINDS) & f.corr_ok & np.isin(f.corr, wanted))
    for i, corr, t in zip(launches.tolist(), f.corr[launches].tolist(), f.ts[launches].tolist(), strict=True):
        starts, ends, rows = lanes.get((pid[i], tid[i]), (empty, empty, empty))
        op: str | None = None
        rpc = -1
        best = 99
        j = int(np.searchsorted(starts, t, "right"))
        lo = max(0, j - _MAX_NESTING)
        for e, idx in zip(reversed(ends[lo:j].tolist()), reversed(rows[lo:j].tolist()), strict=True):
            if e < t:
                continue
            name = f.names[f.name_code[idx]]
            args = _rpc_args(f, idx) if name == _RPC else None
            r = _naming_rank(name, args)
            if r is not None and r < best:  # innermost first, so ties keep the innermost
                best = r
                op = normalize_op(str(args["Collective name"]) if args else name)
                rpc = idx if args else -1
        out[corr] = (t, op, rpc)
    return out


def _rpc_args(f: Frame, row: int) -> dict[str, Any]:
    """The args of a ``record_param_comms`` row, decoded for the metadata keys (``meta_dict``)."""
    spill.note_read(4096)  # spilled args: drop the pages read now and then
    return meta_dict(f.args[row].as_py())


@functools.lru_cache(maxsize=4096)
def normalize_op(name: str) -> str:
    """``traceprof.ops.normalize_op``, once per distinct name (a trace repeats a few names)."""
    return _normalize_op(name)


def _canonical_ranks(value: Any, seen: dict[str, str | None]) -> str | None:
    """``traceprof.matching.canonical_ranks``, once per distinct value (keyed by its ``repr``: a
    list of ints and of bools differ there)."""
    key = repr(value)
    if key not in seen:
        seen[key] = canonical_ranks(value)
    return seen[key]


#: The keys ``_meta`` reads (a kernel's launching record_param_comms is decoded only when one is missing).
_RPC_KEYS = ("dtype", "In msg nelems", "Out msg nelems", "Process Group Name", "Comms Id", "Process Group Ranks",
             "Seq", "Group size")


def _meta(a: dict[str, Any], rpc: dict[str, Any] | None, key: str) -> Any:
    """A metadata field of the kernel's args, else of its launching record_param_comms."""
    v = a.get(key)
    return rpc.get(key) if v is None and rpc else v


def collectives(cols: dict[str, Any], f: Frame, gpu_present: bool) -> dict[str, list[Any]]:
    """Collective rows (module doc), in start order, with per-(pg, op) ordinals.

    Args:
        cols: The parsed event columns (kind, name, ts_ns, dur_ns, pid, tid, correlation, class,
            flag, stream, step, ...), ns times.
        f: The same rows as arrays (``collectors.kineto.columns``), ``args`` included.
        gpu_present: The trace has GPU lanes (rows from comm kernels) or not (rows from gloo).

    Returns:
        The ``collectives`` columns a collector fills (name -> one value per row; times ns).
    """
    if gpu_present:
        cand = np.flatnonzero(f.kind_in({"kernel"}) & cols["class"].isin({"comm"})
                              & ~cols["flag"].isin(EXCLUDED_FLAGS))
        wanted = np.unique(f.corr[cand][f.corr_ok[cand]])
    else:
        gloo = np.array([n.startswith("gloo:") for n in f.names], bool)
        cand = np.flatnonzero(f.kind_in({"user_annotation"}) & gloo[f.name_code] if f.n else np.zeros(0, bool))
        wanted = np.zeros(0, np.int64)
    launchers = _launchers(cols, f, wanted) if gpu_present else {}
    ranks_text: dict[str, str | None] = {}
    rows: list[tuple[Any, ...]] = []
    for i, a in zip(cand.tolist(), f.args_of(cand), strict=True):
        name = cols["name"][i]
        if gpu_present:
            source = "nccl_kernel"
            enter, launch_op, rpc_row = launchers.get(cols["correlation"][i], (None, None, -1))
            rpc = (_rpc_args(f, rpc_row) if rpc_row >= 0 and any(a.get(k) is None for k in _RPC_KEYS)
                   else None)  # read only where the kernel's args lack a key (``_meta``)
            op = (normalize_op(str(a["Collective name"])) if a.get("Collective name") else
                  launch_op or kernel_op(name))
            if op == "unknown" and (fam := comm_family(name)) is not None and fam.op:
                op = fam.op  # e.g. DeepEP dispatch/combine: all_to_all
            dtype = _meta(a, rpc, "dtype")
            n_in = _int_or_none(_meta(a, rpc, "In msg nelems"))
            n_out = _int_or_none(_meta(a, rpc, "Out msg nelems"))
            tid = None
        else:
            rpc = None
            source = "gloo"
            op = normalize_op(name)
            types = a.get("Input type")
            dtype = types[0] if isinstance(types, list) and types else None
            n_in = _nelems(a.get("Input Dims"))
            n_out = None
            enter = None
            tid = cols["tid"][i]
        size = dtype_bytes(dtype)
        pg = _meta(a, rpc, "Process Group Name")
        cid = _meta(a, rpc, "Comms Id")
        rows.append((
            source, None if pg is None else str(pg),
            _canonical_ranks(_meta(a, rpc, "Process Group Ranks"), ranks_text), _int_or_none(_meta(a, rpc, "Seq")),
            op in P2P_OPS, None if cid is None or isinstance(cid, (dict, list)) else str(cid), op, dtype, n_in,
            n_out, n_in * size if n_in is not None and size else None,
            n_out * size if n_out is not None and size else None, _int_or_none(_meta(a, rpc, "Group size")),
            enter, int(f.ts[i]), int(f.ts[i] + f.dur[i]), cols["stream"][i], tid, cols["step"][i],
        ))
    start, pg_at, op_at = _FIELDS.index("start_ns"), _FIELDS.index("pg"), _FIELDS.index("op")
    rows.sort(key=lambda r: r[start])
    counter: dict[tuple[Any, str], int] = {}
    ordinals = []
    for r in rows:
        key = (r[pg_at], r[op_at])
        ordinals.append(counter.get(key, 0))
        counter[key] = ordinals[-1] + 1
    out = {name: list(col) for name, col in zip(_FIELDS, zip(*rows, strict=True), strict=True)} if rows else {
        name: [] for name in _FIELDS}
    out["ordinal"] = ordinals
    return out


#: The ``collectives`` columns a Kineto trace fills (besides ``ordinal``), in the order of the row tuples.
_FIELDS = ("source", "pg", "pg_ranks", "seq", "p2p", "comms_id", "op", "dtype", "nelems_in", "nelems_out",
           "bytes_in", "bytes_out", "group_size", "enter_ns", "start_ns", "end_ns", "stream", "tid", "step")


