"""The store's vocabularies, declared once: the values a ``source``, ``kind``, ``class`` or ``flag``
column may hold.

Each is a :class:`Vocab` (a ``str`` enum: a member *is* its value, in Python, SQL parameters, Arrow
columns and JSON alike). The schema's column docs list them from here (``traceprof.core.schema``), the
parsers write them from here, and a test ingests every kind of input and checks that every value
written is declared.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Vocab", "TraceSource", "CollectiveSource", "EventKind", "EventClass", "Flag", "MemoryCategory"]


class Vocab(str, Enum):
    """A value set; members print and format as their value (``f"{EventKind.kernel}"`` is ``kernel``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """Every value, in declaration order."""
        return tuple(str(m.value) for m in cls)

    @classmethod
    def sql(cls, *members: str) -> str:
        """``('a', 'b')``: an SQL list of ``members`` (default: all of them) for ``IN``."""
        return "(" + ", ".join(f"'{m}'" for m in (members or tuple(cls))) + ")"


class TraceSource(Vocab):
    """``traces.source``: the collector that read the file (``traceprof.ingest.sources``)."""

    kineto = "kineto"
    flight_recorder = "flight_recorder"
    nccl_profiler = "nccl_profiler"
    nccl_inspector = "nccl_inspector"
    nsys = "nsys"
    ndtimeline = "ndtimeline"
    memory_timeline = "memory_timeline"


#: The sources that hold a rank's timeline of ops (``traces.source``): what overlap, stragglers and
#: whatif read of every rank. A Flight Recorder or NCCL dump of a rank holds its collectives only.
PROFILER_SOURCES = (TraceSource.kineto.value, TraceSource.nsys.value)


class CollectiveSource(Vocab):
    """``collectives.source``: where a collective row came from."""

    nccl_kernel = "nccl_kernel"  # a GPU communication kernel (Kineto, nsys)
    gloo = "gloo"  # gloo work on a CPU rank (Kineto)
    record_param_comms = "record_param_comms"  # the CPU op that enqueues a collective (Kineto)
    fr = "fr"  # a Flight Recorder entry
    nccl_profiler = "nccl_profiler"  # an NCCL profiler-plugin COLL / P2P event
    nccl_inspector = "nccl_inspector"  # an NCCL Inspector record
    ndtimeline = "ndtimeline"  # an NDTimeline communication op


class EventKind(Vocab):
    """``events.kind``: the normalized event kinds (README.md "What traceprof handles")."""

    cpu_op = "cpu_op"
    user_annotation = "user_annotation"
    gpu_user_annotation = "gpu_user_annotation"
    python_function = "python_function"
    cuda_runtime = "cuda_runtime"
    cuda_driver = "cuda_driver"
    kernel = "kernel"
    memcpy = "memcpy"
    memset = "memset"
    sync = "sync"
    collective = "collective"
    step = "step"
    instant = "instant"
    counter = "counter"
    other = "other"  # unknown categories


class EventClass(Vocab):
    """``events.class`` of GPU rows (``traceprof.core.classify``)."""

    comm = "comm"
    memory = "memory"
    compute = "compute"


class Flag(Vocab):
    """``events.flag``: why a record is suspect (NULL for a normal one)."""

    # left out of windows, idle, latency and collectives: the time cannot be right
    before_launch = "before_launch"
    far_outside = "far_outside"
    zero_ts = "zero_ts"
    unmatched_begin = "unmatched_begin"
    # kept in every analysis
    overrun = "overrun"
    launch_skew = "launch_skew"
    unclosed = "unclosed"


class MemoryCategory(Vocab):
    """``memory_events.category`` of a ``memory_timeline`` trace: torch's categories, in the order of
    its category indexes (``_CATEGORY_TO_INDEX``), which the collector reads them by and the memory
    analysis' per-category columns follow."""

    parameter = "parameter"
    optimizer_state = "optimizer_state"
    input = "input"
    temporary = "temporary"
    activation = "activation"
    gradient = "gradient"
    autograd_detail = "autograd_detail"
    unknown = "unknown"
