"""Names shared by every source: collective op names and dtype sizes (kernel classes: ``traceprof.core.classify``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "normalize_op",
    "kernel_op",
    "nccl_comms_id",
    "dtype_bytes",
    "BusRule",
    "BUS_RULES",
    "bus_rule",
    "size_bytes_sql",
    "bus_factor_sql",
]

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


def nccl_comms_id(comm: object, op: str, seq: int | None) -> str | None:
    """The key that matches one NCCL collective across ranks: ``<communicator>:<op>:<seq>``.

    NCCL numbers the collectives of a communicator per op type (``comm->seqNumber[func]``): the
    first AllReduce and the first AllGather of a communicator both have sequence number 0, so
    (communicator, seq) alone would merge different ops of a run that mixes them. Both NCCL
    sources key their instances with this (``collectives.comms_id``): the profiler plugin
    (``CommHash``, ``SeqNum``) and NCCL Inspector (``header.id``, ``coll_sn``).

    Args:
        comm: The communicator's id or hash as the source writes it.
        op: The normalized op (:func:`normalize_op`).
        seq: The per-op sequence number.

    Returns:
        The key, or None when the communicator or the sequence number is unknown.
    """
    return None if comm is None or seq is None else f"{comm}:{op}:{seq}"


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
    "double": 8,
    "float64": 8,
    "long": 8,
    "int64": 8,
    "int64_t": 8,
    "uint64": 8,
    "complexfloat": 8,
    "float": 4,
    "float32": 4,
    "int": 4,
    "int32": 4,
    "int32_t": 4,
    "uint32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "short": 2,
    "int16": 2,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "int8": 1,
    "int8_t": 1,
    "uint8": 1,
    "uint8_t": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float8e4m3": 1,  # NCCL's ncclFloat8e4m3 / ncclFloat8e5m2 (the plugin's Datatype, "nccl" dropped)
    "float8e5m2": 1,
    "float4_e2m1fn_x2": 1,  # two 4-bit values packed in each byte: one element per byte
    "uint16": 2,
    "complexhalf": 4,
    "complexdouble": 16,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
}


def dtype_bytes(dtype: object) -> int | None:
    """Bytes per element of a dtype name as traces write it (``Float``, ``c10::BFloat16``, ``float``),
    or ``None`` when unknown (also for a value that is not a string: trace contents are untrusted)."""
    if not dtype or not isinstance(dtype, str):
        return None
    return _DTYPE_BYTES.get(dtype.rsplit("::", 1)[-1].lower())


@dataclass(frozen=True)
class BusRule:
    """nccl-tests' bandwidth convention of one collective op (its ``doc/PERFORMANCE.md``).

    ``size``: which bytes are the message size S in algbw = S / time: ``buffer`` (the op's own
    buffer, ``bytes_in``, else ``bytes_out``), ``n_out`` (the output of all ranks: ``bytes_out``,
    which holds n x the per-rank input, else n x ``bytes_in``), ``n_in`` (the input of all ranks:
    ``bytes_in``, which holds n x the per-rank output, else n x ``bytes_out``). ``factor``: busbw =
    algbw x factor, ``2(n-1)/n``, ``(n-1)/n`` or ``1``, n the ranks in the process group.
    """

    size: str
    factor: str


#: Per normalized op (:func:`normalize_op`); a ``*_coalesced`` op follows its base op, and ops not
#: listed (barrier, unknown) have no bandwidth. Data: extend it here.
BUS_RULES: dict[str, BusRule] = {
    "all_reduce": BusRule("buffer", "2(n-1)/n"),
    "all_gather": BusRule("n_out", "(n-1)/n"),
    "reduce_scatter": BusRule("n_in", "(n-1)/n"),
    "all_to_all": BusRule("buffer", "(n-1)/n"),
    "gather": BusRule("n_out", "(n-1)/n"),
    "scatter": BusRule("n_in", "(n-1)/n"),
    "broadcast": BusRule("buffer", "1"),
    "reduce": BusRule("buffer", "1"),
    "send": BusRule("buffer", "1"),
    "recv": BusRule("buffer", "1"),
    "send_recv": BusRule("buffer", "1"),
}


def bus_rule(op: str | None) -> BusRule | None:
    """The :data:`BUS_RULES` entry of a normalized op (``all_reduce_coalesced`` -> ``all_reduce``'s), or None."""
    if not op:
        return None
    return BUS_RULES.get(op.removesuffix("_coalesced"))


_SIZE_SQL = {
    "buffer": "coalesce({c}bytes_in, {c}bytes_out)",
    # a 0 in the whole-array column (a gather's non-root output) says nothing: the per-rank part x n
    "n_out": "coalesce(nullif({c}bytes_out, 0), try_cast({n}::HUGEINT * {c}bytes_in AS BIGINT))",
    "n_in": "coalesce(nullif({c}bytes_in, 0), try_cast({n}::HUGEINT * {c}bytes_out AS BIGINT))",
}
_FACTOR_SQL = {"2(n-1)/n": "2.0 * ({n} - 1) / {n}", "(n-1)/n": "1.0 * ({n} - 1) / {n}", "1": "1.0"}


def _case(op: str, exprs: dict[str, str]) -> str:
    """A SQL ``CASE`` on the base op (``_coalesced`` removed) of column ``op``, with
    ``exprs[rule]`` for the ops of each rule (keys of :data:`BUS_RULES`' ``size`` or ``factor``);
    other ops give NULL."""
    base = f"regexp_replace({op}, '_coalesced$', '')"
    field = "size" if set(exprs) == set(_SIZE_SQL) else "factor"
    whens = []
    for rule, expr in exprs.items():
        ops = [o for o, r in BUS_RULES.items() if getattr(r, field) == rule]
        if ops:
            whens.append(f"WHEN {base} IN ({', '.join(repr(o) for o in ops)}) THEN {expr}")
    return f"CASE {' '.join(whens)} END"


def size_bytes_sql(n: str, table: str = "") -> str:
    """SQL for the message size S (bytes) of a ``collectives`` row by :data:`BUS_RULES`: ``n`` is
    the SQL of the ranks in the process group, ``table`` an alias prefix (``"c."``). NULL when
    the op has no rule, or the sizes (or n, where S needs it) are unknown; a product beyond
    BIGINT is NULL too."""
    return _case(f"{table}op", {k: v.format(c=table, n=n) for k, v in _SIZE_SQL.items()})


def bus_factor_sql(n: str, op: str = "op") -> str:
    """SQL for the bus factor of column ``op`` by :data:`BUS_RULES` (DOUBLE; NULL when the op has
    no rule, or n is unknown where the factor needs it). ``n``: SQL of the ranks in the process
    group, NULL or at least 1."""
    return _case(op, {k: v.format(n=n) for k, v in _FACTOR_SQL.items()})
