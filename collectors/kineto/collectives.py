"""Collective rows of a Kineto trace (``collectives`` table), derived from the parsed event columns.

One row per communication kernel on GPU traces; one per ``gloo:<op>`` annotation on CPU-only traces.
Source fields read (from the event's ``args`` JSON): ``Collective name``, ``Process Group Name``,
``Seq``, ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``, ``Input Dims``, ``Input type``.
"""

from __future__ import annotations

import math
from typing import Any

from collectors.kineto._values import args_dict as _args_dict
from collectors.kineto._values import int_or_none as _int_or_none
from traceprof.ops import dtype_bytes, is_comm_kernel, kernel_op, normalize_op

__all__ = ["collectives"]

_LAUNCH_KINDS = frozenset({"cuda_runtime", "cuda_driver"})


def _nelems(dims: Any) -> int | None:
    """Elements of the first input of ``Input Dims`` ([[d0, d1, ...], ...]), or None."""
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        return math.prod(int(d) for d in dims[0] if isinstance(d, int))
    return None


def collectives(cols: dict[str, list[Any]], gpu_present: bool) -> list[dict[str, Any]]:
    """Collective rows (module doc, step 4), in start order, with per-(pg, op) ordinals."""
    launch_ts = {
        cols["correlation"][i]: cols["ts_ns"][i]
        for i, k in enumerate(cols["kind"])
        if k in _LAUNCH_KINDS and cols["correlation"][i] is not None
    }
    rows = []
    for i, kind in enumerate(cols["kind"]):
        name = cols["name"][i]
        if gpu_present:
            if kind != "kernel" or not is_comm_kernel(name):
                continue
            a = _args_dict(cols["args"][i])
            source = "nccl_kernel"
            op = normalize_op(a["Collective name"]) if a.get("Collective name") else kernel_op(name)
            dtype = a.get("dtype")
            n_in, n_out = _int_or_none(a.get("In msg nelems")), _int_or_none(a.get("Out msg nelems"))
            enter = launch_ts.get(cols["correlation"][i])
            tid = None
        else:
            if kind != "user_annotation" or not name.startswith("gloo:"):
                continue
            a = _args_dict(cols["args"][i])
            source = "gloo"
            op = normalize_op(name)
            types = a.get("Input type")
            dtype = types[0] if isinstance(types, list) and types else None
            n_in = _nelems(a.get("Input Dims"))
            n_out = None
            enter = None
            tid = cols["tid"][i]
        size = dtype_bytes(dtype)
        pg = a.get("Process Group Name")
        rows.append(
            {
                "source": source,
                "pg": None if pg is None else str(pg),
                "seq": _int_or_none(a.get("Seq")),
                "op": op,
                "dtype": dtype,
                "nelems_in": n_in,
                "nelems_out": n_out,
                "bytes_in": n_in * size if n_in is not None and size else None,
                "bytes_out": n_out * size if n_out is not None and size else None,
                "group_size": _int_or_none(a.get("Group size")),
                "enter_ns": enter,
                "start_ns": cols["ts_ns"][i],
                "end_ns": cols["ts_ns"][i] + cols["dur_ns"][i],
                "stream": cols["stream"][i],
                "tid": tid,
                "step": cols["step"][i],
            }
        )
    rows.sort(key=lambda r: r["start_ns"])
    counter: dict[tuple[Any, str], int] = {}
    for r in rows:
        key = (r["pg"], r["op"])
        r["ordinal"] = counter.get(key, 0)
        counter[key] = r["ordinal"] + 1
    return rows


