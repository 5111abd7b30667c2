"""Names shared by every source: collective op names and dtype sizes (kernel classes: ``traceprof.classify``)."""

from __future__ import annotations

import re

__all__ = ["normalize_op", "kernel_op", "dtype_bytes"]

# Checked in order: the first fragment found in the squashed name wins (reducescatter before reduce).
_OPS = (
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("sendrecv", "send_recv"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send"),
    ("recv", "recv"),
)
_NON_ALPHA = re.compile(r"[^a-z]")


def normalize_op(name: str) -> str:
    """Normalize a collective name from any source to one vocabulary.

    ``allreduce``, ``nccl:all_reduce``, ``gloo:all_reduce``, ``AllReduce`` -> ``all_reduce``;
    ``_allgather_base`` -> ``all_gather``; coalesced variants get a ``_coalesced`` suffix.
    Unknown names are returned lower-cased, unchanged otherwise.
    """
    base = name.split(":", 1)[-1]
    return _match(base) or base.lower()


def _match(name: str) -> str | None:
    key = _NON_ALPHA.sub("", name.lower())
    for frag, op in _OPS:
        if frag in key:
            return op + "_coalesced" if "coalesced" in key else op
    return None


def kernel_op(kernel_name: str) -> str:
    """The collective op of an NCCL/RCCL kernel name.

    ``ncclKernel_AllReduce_RING_LL_Sum_float``, ``ncclDevKernel_AllGather_RING_LL(...)`` and
    ``ncclSymkDevKernel_AllReduce_...`` give ``all_reduce`` / ``all_gather``; names without an op
    token give ``unknown``.
    """
    head = kernel_name.split("(", 1)[0]
    parts = head.split("_")
    if len(parts) < 2:
        return "unknown"
    return _match(parts[1]) or "unknown"


_DTYPE_BYTES = {
    "double": 8, "float64": 8, "long": 8, "int64": 8, "int64_t": 8, "uint64": 8, "complexfloat": 8,
    "float": 4, "float32": 4, "int": 4, "int32": 4, "int32_t": 4, "uint32": 4,
    "half": 2, "float16": 2, "bfloat16": 2, "short": 2, "int16": 2,
    "byte": 1, "char": 1, "bool": 1, "int8": 1, "int8_t": 1, "uint8": 1, "uint8_t": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def dtype_bytes(dtype: object) -> int | None:
    """Bytes per element of a dtype name as traces write it (``Float``, ``c10::BFloat16``, ``float``),
    or ``None`` when unknown (also for a value that is not a string: trace contents are untrusted)."""
    if not dtype or not isinstance(dtype, str):
        return None
    return _DTYPE_BYTES.get(dtype.rsplit("::", 1)[-1].lower())
