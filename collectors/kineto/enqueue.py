"""Pair gloo work with its CPU enqueue, so that CPU-only collectives get an arrival time.

On gloo (CPU) traces Kineto records two things per collective: the ``c10d::<op>_`` cpu_op on the
training thread (the enqueue: the moment the rank *arrives* at the collective) and the
``gloo:<op>`` annotation on a ``pt_gloo_runloop`` thread (the work, which may start much later
when the runloop is busy with an earlier collective). The parser makes one collectives row per
``gloo:<op>``; this module fills its ``enter_ns`` (and ``step``) from the matching enqueue.

Algorithm, per rank and op: gloo runs a process group's work in enqueue order, so the k-th
enqueue of an op feeds the k-th work item of that op. Walk the work items in start order and give
each the first not-yet-used enqueue that (1) started no later than the work and (2) has the same
element count (``Input Dims`` of its first tensor) when both sides know it; enqueues skipped over
are dropped (their work lies outside the trace). A work item without such an enqueue keeps
``enter_ns`` NULL, and arrival falls back to the work start. An all-to-all also takes its
enqueue's split sizes.

Source fields read: events ``kind``, ``name``, ``ts_ns``, ``step``, ``args."Input Dims"`` of
``c10d::*`` cpu_ops, and ``args."Concrete Inputs"`` of ``c10d::alltoall_base_`` (its output and input
split sizes, copied to the row's ``split_out`` / ``split_in``), ``args."Concrete Inputs"[2]`` of
``c10d::send`` / ``c10d::recv_`` (dstRank / srcRank: the peer's rank in the op's process group, which
the gloo trace does not name; copied to ``peer_group_rank``); collectives ``source``, ``op``,
``nelems_in``, ``start_ns``.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from traceprof.collectors.kineto.collectives import split_sizes
from traceprof.core.ops import normalize_op
from traceprof.core.parsed import ParsedTrace

__all__ = ["fill_gloo_enter"]


def _first_tensor_nelems(dims: Any) -> int | None:
    """Elements of the first tensor in ``Input Dims``: ``[[[131200]], ...]`` (TensorList) or
    ``[[4, 8], ...]`` (Tensor) give 131200 and 32; None when absent."""
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    while isinstance(first, list) and first and isinstance(first[0], list):
        first = first[0]
    if isinstance(first, list) and first and all(isinstance(d, int) for d in first):
        return math.prod(first)
    return None


def _alltoall_splits(name: str, args: Any) -> tuple[str | None, str | None] | None:
    """(received, sent) split sizes of a ``c10d::alltoall_base_`` enqueue, from its ``Concrete
    Inputs`` (output, input, group, output_split_sizes, input_split_sizes, ...: ``"[3, 3, 3, 3]"``,
    ``"[]"`` for an even split); None for another op or when the inputs were not recorded."""
    if "alltoall_base" not in name or not isinstance(args, dict):
        return None
    concrete = args.get("Concrete Inputs")
    if not isinstance(concrete, list) or len(concrete) < 5:
        return None
    out, sent = split_sizes(concrete[3]), split_sizes(concrete[4])
    return None if out is None and sent is None else (out, sent)


def _p2p_peer(name: str, args: Any) -> int | None:
    """The peer's rank in its process group of a ``c10d::send`` / ``c10d::recv_`` enqueue (its
    ``Concrete Inputs``: tensors, group, dstRank / srcRank, tag: ``["", "", "1", "0"]``); None for
    another op or when the inputs were not recorded."""
    if not name.startswith(("c10d::send", "c10d::recv")) or not isinstance(args, dict):
        return None
    concrete = args.get("Concrete Inputs")
    if not isinstance(concrete, list) or len(concrete) < 3 or not isinstance(concrete[2], str):
        return None
    peer = concrete[2]
    return int(peer) if peer.isdigit() and len(peer) < 10 else None


def _starts_with(col: pa.ChunkedArray, prefix: str) -> pa.ChunkedArray:
    """Rows of a string column (plain or dictionary-encoded) that start with ``prefix`` (False for null)."""
    out = []
    for c in col.chunks:
        if pa.types.is_dictionary(c.type):  # test each distinct value once
            c = pc.take(pc.starts_with(c.dictionary, prefix), c.indices)
        else:
            c = pc.starts_with(c, prefix)
        out.append(pc.fill_null(c, False))
    return pa.chunked_array(out, pa.bool_())


def fill_gloo_enter(pt: ParsedTrace) -> ParsedTrace:
    """Fill ``enter_ns`` and ``step`` of the trace's gloo collectives from their c10d enqueues.

    Args:
        pt: A parsed Kineto trace (unchanged when it has no gloo rows).

    Returns:
        The same object, its ``collectives`` table replaced.
    """
    coll = pt.collectives
    if coll is None or coll.num_rows == 0 or pt.events is None:
        return pt
    rows = coll.to_pylist()
    gloo = [r for r in rows if r["source"] == "gloo" and r["enter_ns"] is None]
    if not gloo:
        return pt
    ev = pt.events.select(["kind", "name", "ts_ns", "step", "args"])
    # only the c10d ops become Python objects (not every event of the trace)
    ev = ev.filter(
        pc.and_(pc.fill_null(pc.equal(ev["kind"], "cpu_op"), False), _starts_with(ev["name"], "c10d::"))
    )
    enqueues: dict[str, list[dict[str, Any]]] = {}
    for e in ev.to_pylist():  # the c10d cpu ops (filtered above)
        try:
            args = msgspec.json.decode(e["args"] or "{}")
        except msgspec.DecodeError:
            args = {}
        dims = args.get("Input Dims") if isinstance(args, dict) else None
        e["nelems"] = _first_tensor_nelems(dims)
        e["splits"] = _alltoall_splits(e["name"], args)
        e["peer"] = _p2p_peer(e["name"], args)
        enqueues.setdefault(normalize_op(e["name"]), []).append(e)
    for lst in enqueues.values():
        lst.sort(key=lambda e: e["ts_ns"])
    by_op: dict[str, list[dict[str, Any]]] = {}
    for r in gloo:
        by_op.setdefault(r["op"], []).append(r)
    for op, work in by_op.items():
        cands = enqueues.get(op, [])
        i = 0
        for r in sorted(work, key=lambda r: r["start_ns"]):
            for j in range(i, len(cands)):
                e = cands[j]
                if e["ts_ns"] > r["start_ns"]:
                    break
                if r["nelems_in"] is None or e["nelems"] is None or e["nelems"] == r["nelems_in"]:
                    r["enter_ns"] = e["ts_ns"]
                    if e["step"] is not None:
                        r["step"] = e["step"]
                    if e["splits"] is not None:
                        r["split_out"], r["split_in"] = e["splits"]
                    if e["peer"] is not None:
                        r["peer_group_rank"] = e["peer"]
                    i = j + 1
                    break
    pt.collectives = pa.Table.from_pylist(rows, schema=coll.schema)
    return pt
