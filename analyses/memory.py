"""memory: where each rank's accelerator memory goes, step by step, and how close it comes to the limit.

Reads the run's memory records (the ``memory_events`` view, ``traceprof.core.schema``): Kineto
``[memory]`` events (``profile_memory=True``: ``Addr``, ``Bytes``, ``Total Allocated``, ``Total
Reserved``, ``Device Type``, ``Device Id``) and ``[OutOfMemory]`` events, Nsight Systems CUDA
allocations and frees (``CUDA_GPU_MEMORY_USAGE_EVENTS``: no totals) and torch's
``export_memory_timeline`` entries (bytes by category). Host memory (``Device Type`` 0) is left out.
Nothing is read from the trace files: ingest stored the records as ``instant`` events.

Algorithm (one *series* per (rank, device, source); records in (ts_ns, seq) order):
  1. Allocated after each record: Kineto's ``Total Allocated``. A record without a usable one takes
     the previous record's value plus its ``Bytes`` (or the next one's minus the bytes between);
     when neither is known its value is unknown and the series' peak only a lower bound
     (``peak_exact`` false, with a note), never a guess. A series without totals (Nsight, or Kineto
     without them) is the running sum of ``Bytes`` from the first record, plus the bytes freed in
     the trace before any allocation of theirs (memory held before the capture: a lower bound,
     noted). ``export_memory_timeline``: the running sum of its entries, taken after all entries of
     one timestamp (torch's own plot coalesces them so: an entry's two halves never make a peak).
     Reserved: Kineto's ``Total Reserved`` (unknown elsewhere: on Nsight the cudaMalloc'd bytes
     are what PyTorch's caching allocator reserves).
  2. The step of a record: ``events.step``, else the rank's ProfilerStep whose CPU span holds it;
     the CPU op at a record: the innermost ``cpu_op`` on the allocating (pid, tid) that encloses it,
     and the outermost one (``top_op``), from the op tree (``traceprof.engine.optree``): one as-of join and
     a walk up the parents, linear in records and ops.
  3. Per step and per series: the peak allocated (largest value; the first record that reaches
     it), its time and ops, the peak reserved, reserved - allocated at the allocated peak (cache
     and fragmentation), and headroom = capacity - max(peak reserved, peak allocated), as bytes
     and % of the capacity; capacity from the trace (``devices.memory_bytes``: Kineto
     ``deviceProperties.totalGlobalMem``, nsys ``TARGET_INFO_GPU.totalMemory``) or ``-p
     capacity_gib=`` / ``capacity_bytes=``, which win.
  4. At each series' peak (``ops``): every allocation is paired with the next free of its address
     on its device; the ones live at the peak are summed by the op that made them; the rest of the
     peak value is memory allocated before the trace (or by records without an address).
  5. Across ranks (``groups``): each rank's peak (largest over its devices; Kineto before nsys
     before export_memory_timeline) per process group of 2+ ranks (``collectives.pg`` and
     ``pg_ranks``), else over the whole run; ``spread_pct`` = 100 (max / min - 1).
  6. export_memory_timeline (``categories``): the bytes of each category at the peak of their total.
  7. ``timeline``: each series cut into ``points`` time buckets, each with its largest allocated and
     reserved value, the peak's bucket marked; ``category_timeline`` likewise per category.

Source fields read: ``memory_events`` (``events.args`` as above, ``ts_ns``, ``step``, ``pid``,
``tid``), ``events`` (``cpu_op`` name, ts_ns, dur_ns, pid, tid), ``steps``, ``devices.memory_bytes``,
``collectives.pg`` / ``pg_ranks``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from traceprof.analyses import _common
from traceprof.core import schema
from traceprof.core.columns import frame as result_frame
from traceprof.core.errors import AnalysisError, UsageError
from traceprof.core.schema import Column
from traceprof.core.vocab import MemoryCategory
from traceprof.engine.analysis import (
    Analysis,
    Chart,
    Finding,
    FindingsInput,
    FrameResult,
    Note,
    Report,
    RunParams,
    Topic,
    Verdict,
    register,
)
from traceprof.engine.optree import with_parents
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store

__all__ = ["Params", "Result", "TABLES", "run", "GIB", "NEAR_LIMIT_PCT", "IMBALANCE_PCT"]

GIB = 1024**3
#: A rank's peak within this share of its capacity is near the limit (a finding).
NEAR_LIMIT_PCT = 5.0
#: Peaks within a group differing by more than this (max / min - 1, %) are imbalanced (a finding).
IMBALANCE_PCT = 10.0
#: Which source stands for a rank where several record it (the allocator's own totals first).
SOURCE_ORDER = ("kineto", "nsys", "memory_timeline")
BASIS = {
    "kineto": "allocator totals",
    "nsys": "sum of CUDA allocations in the capture",
    "memory_timeline": "sum of tensor bytes by category",
}
#: The memory_timeline categories, in torch's order (a ``<category>_bytes`` column each).
CATEGORIES = MemoryCategory.values()
_SERIES = ["rank", "device", "source"]


def _b(name: str, doc: str, type_: str = "BIGINT") -> Column:
    return Column(name, type_, doc, "bytes")


_ID = (
    Column("rank", "INTEGER", "Global rank"),
    Column("device", "INTEGER", "Device index (NULL: not recorded)"),
    Column("source", "VARCHAR", "kineto, nsys or memory_timeline"),
)
_PEAK = (
    _b("peak_allocated_bytes", "Largest allocated value (NULL: no record with a known value)"),
    Column("peak_ts_ns", "BIGINT", "When it was first reached (epoch)", "ns"),
    Column("peak_op", "VARCHAR", "Innermost CPU op on the allocating thread enclosing that record (Kineto)"),
    Column("peak_top_op", "VARCHAR", "Outermost CPU op enclosing it"),
    _b("peak_reserved_bytes", "Largest reserved value (Kineto Total Reserved; NULL elsewhere)"),
    _b(
        "cached_at_peak_bytes", "Reserved minus allocated at the allocated peak: cached and fragmented memory"
    ),
    _b("capacity_bytes", "Device memory: the trace's (devices.memory_bytes) or -p capacity_*"),
    _b("headroom_bytes", "capacity - max(peak reserved, peak allocated)"),
    Column("headroom_pct", "DOUBLE", "headroom_bytes as % of capacity_bytes", "%"),
)
#: The result's tables: name -> columns (type, doc, unit), in order (``Result`` documents them).
TABLES: dict[str, tuple[Column, ...]] = {
    "frame": (
        *_ID,
        Column("basis", "VARCHAR", "What the allocated series is (see the module doc)"),
        Column(
            "primary",
            "BOOLEAN",
            "The series stands for its rank: its source comes first of kineto, nsys, "
            "memory_timeline among the rank's (groups, findings and the diff gate read these)",
        ),
        Column("records", "BIGINT", "Memory records of the series (export_memory_timeline: its timestamps)"),
        Column("steps", "BIGINT", "Steps it spans"),
        *_PEAK[:4],
        Column("peak_step", "INTEGER", "Step of the peak (NULL: outside steps)"),
        *_PEAK[4:],
        Column("capacity_source", "VARCHAR", "trace, user or NULL (unknown)"),
        Column(
            "peak_exact",
            "BOOLEAN",
            "False when some record's value is unknown or memory from before the "
            "capture had to be assumed: the peak is then a lower bound",
        ),
        Column("near_limit", "BOOLEAN", f"headroom_pct below {NEAR_LIMIT_PCT:g}"),
        Column("ooms", "BIGINT", "[OutOfMemory] records of the rank and device"),
    ),
    "steps": (
        *_ID,
        Column("step", "INTEGER", "ProfilerStep (NULL: records outside steps)"),
        Column("start_ns", "BIGINT", "First record of the step", "ns"),
        Column("end_ns", "BIGINT", "Last record of the step", "ns"),
        Column("records", "BIGINT", "Memory records in the step"),
        *_PEAK,
        Column("peak_exact", "BOOLEAN", "False when a record's value in the step is unknown"),
    ),
    "ops": (
        *_ID,
        Column(
            "op",
            "VARCHAR",
            "Innermost CPU op that made the allocations, '(before the trace)' for "
            "memory allocated before it or by records without an address, NULL when unknown",
        ),
        Column("top_op", "VARCHAR", "Outermost CPU op enclosing them"),
        _b("live_bytes", "Bytes of its allocations live at the series' peak"),
        Column("allocations", "BIGINT", "How many of its allocations are live there"),
        Column("pct_of_peak", "DOUBLE", "live_bytes as % of the peak allocated", "%"),
    ),
    "groups": (
        Column("group", "VARCHAR", "Process group name (collectives.pg), or 'all' (the whole run)"),
        Column("ranks", "VARCHAR", "Member ranks with memory records, JSON list"),
        _b("min_peak_bytes", "Smallest rank peak in the group"),
        Column("min_rank", "INTEGER", "Its rank"),
        _b("max_peak_bytes", "Largest rank peak in the group"),
        Column("max_rank", "INTEGER", "Its rank"),
        Column("spread_pct", "DOUBLE", "100 (max / min - 1)", "%"),
        Column("imbalanced", "BOOLEAN", f"spread_pct above {IMBALANCE_PCT:g}"),
    ),
    "categories": (
        Column("rank", "INTEGER", "Global rank"),
        Column("device", "INTEGER", "Device (NULL: not recorded)"),
        Column("peak_ts_ns", "BIGINT", "Time of the peak of the categories' total", "ns"),
        Column("step", "INTEGER", "Its step (NULL: outside steps or unknown)"),
        _b("total_bytes", "Sum of the categories there"),
        *(_b(f"{c}_bytes", f"Bytes of category {c} there") for c in CATEGORIES),
    ),
    "timeline": (
        *_ID,
        Column("series", "VARCHAR", "Label of the series (rank, device, source)"),
        Column("ts_ns", "BIGINT", "Start of the time bucket (its first record)", "ns"),
        _b("allocated_bytes", "Largest allocated value in the bucket"),
        _b("reserved_bytes", "Largest reserved value in the bucket"),
        Column("peak", "BOOLEAN", "The bucket holds the series' peak"),
    ),
    "category_timeline": (
        Column("rank", "INTEGER", "Global rank"),
        Column("device", "INTEGER", "Device"),
        Column("series", "VARCHAR", "Label: rank and category"),
        Column("category", "VARCHAR", "export_memory_timeline category"),
        Column("ts_ns", "BIGINT", "Start of the time bucket", "ns"),
        _b("bytes", "The category's bytes at the bucket's largest total"),
    ),
}


def _table_doc() -> str:
    lines = ["Tables (every ``_bytes`` column in bytes, ``_ns`` in ns, ``_pct`` in %):"]
    for name, cols in TABLES.items():
        lines.append(
            f"``{name}``: " + "; ".join(f"{c.name} ({c.doc}{', ' + c.unit if c.unit else ''})" for c in cols)
        )
    return "\n\n".join(lines)


@dataclass(frozen=True)
class Params(RunParams):
    """``capacity_gib`` (GiB, 2**30 bytes) or ``capacity_bytes``: each device's memory, when the trace does not
    state it or to override it (e.g. the share a job may use). ``points``: time buckets per series in
    ``timeline`` (0: every record).

    Raises:
        UsageError: A capacity that is not a number > 0, both capacities, or ``points`` < 0.
    """

    capacity_gib: float | None = None
    capacity_bytes: int | None = None
    points: int = 400

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity_gib", _common.positive_or_none("capacity_gib", self.capacity_gib))
        if self.capacity_bytes is not None:
            try:
                value = int(str(self.capacity_bytes))
            except ValueError:
                raise UsageError(
                    f"capacity_bytes={self.capacity_bytes!r}: expected a whole number of bytes"
                ) from None
            if value <= 0:
                raise UsageError(f"capacity_bytes={self.capacity_bytes!r}: must be > 0")
            object.__setattr__(self, "capacity_bytes", value)
        if self.capacity_gib is not None and self.capacity_bytes is not None:
            raise UsageError("give capacity_gib or capacity_bytes, not both")
        _common.at_least("points", self.points, 0, "0: every record")

    def capacity(self) -> int | None:
        """The user's capacity in bytes, or None."""
        return self.capacity_bytes if self.capacity_gib is None else round(self.capacity_gib * GIB)


@dataclass(frozen=True)
class Result(FrameResult):
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)
    ops: pl.DataFrame = field(default_factory=pl.DataFrame)
    groups: pl.DataFrame = field(default_factory=pl.DataFrame)
    categories: pl.DataFrame = field(default_factory=pl.DataFrame)
    timeline: pl.DataFrame = field(default_factory=pl.DataFrame)
    category_timeline: pl.DataFrame = field(default_factory=pl.DataFrame)
    title: ClassVar[str] = "Accelerator memory"

    def charts(self) -> list[Chart]:
        return [
            Chart(
                "Allocated (solid) and reserved (dashed) memory over time, peak marked",
                "ts_ns",
                ("allocated_bytes", "reserved_bytes"),
                kind="lines",
                group="series",
                mark="peak",
                frame="timeline",
            ),
            Chart(
                "Memory by category (export_memory_timeline) over time",
                "ts_ns",
                ("bytes",),
                kind="lines",
                group="series",
                frame="category_timeline",
            ),
        ]


Result.__doc__ = (
    "Peak memory per (rank, device, source) (``frame``), per step (``steps``), by op at the peak "
    "(``ops``), across ranks (``groups``), by category (``categories``), over time.\n\n" + _table_doc()
)


_RECORDS = f"""
SELECT rank, device, source, device_type, ts_ns, seq, step, pid, tid, addr, bytes, total_allocated, total_reserved,
       category, action
FROM ({schema.table("memory_events").view_sql.strip()}) m
WHERE run_id = ? AND (source = 'memory_timeline' OR device_type IS NULL OR device_type <> 0)
  AND (device IS NULL OR device >= 0)  -- Device Id -1: host memory
"""
_OPS = """
SELECT e.rank, e.pid, e.tid, e.name, e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns
FROM events e JOIN (SELECT DISTINCT rank, pid, tid FROM events WHERE run_id = $run AND kind = 'instant'
                    AND name = '[memory]' AND cat <> 'cuda_memory') l USING (rank, pid, tid)
WHERE e.run_id = $run AND e.kind = 'cpu_op' AND e.dur_ns >= 0
"""


def _recorded(store: Store, run_id: int) -> bool:
    """Whether the run holds accelerator memory records (``memory_events``: Kineto ``[memory]`` of a
    device other than the CPU, nsys CUDA memory, export_memory_timeline)."""
    return bool(
        store.sql(
            "SELECT EXISTS (SELECT 1 FROM events WHERE run_id = ? AND kind = 'instant' AND "
            "(name IN ('[memory]', '[OutOfMemory]') OR cat = 'memory_timeline') AND "
            "coalesce(json_extract_string(args, '$.\"Device Type\"'), '') <> '0')",
            [run_id],
        ).item()
    )


def _found(
    text: str, ranks: tuple[object, ...], metric: str, value: object, cause: str, evidence: str
) -> Finding:
    """A memory finding (a problem, no time cost) with its machine-readable fields."""
    return Finding(
        "memory",
        "memory: " + text,
        None,
        True,
        "memory",
        ranks=tuple(int(r) for r in ranks if r is not None),  # type: ignore[call-overload]
        metric=metric,
        value=float(value) if value is not None else None,  # type: ignore[arg-type]
        cause=cause,
        evidence=evidence,
    )


def _memory_topic(inp: FindingsInput) -> tuple[list[Finding], Verdict | None]:
    """The memory topic: a rank near its capacity (``near_limit``), peaks imbalanced within a
    process group, out-of-memory records (no time cost: memory costs no step time until it runs
    out); else the largest peak, ok."""
    m = inp.results.get("memory")
    if m is None or m.frame.is_empty():
        return [], None
    from traceprof.core.display import size

    frame, groups = m.frame.filter(pl.col("primary")), m.frames().get("groups", pl.DataFrame())
    findings: list[Finding] = []
    for r in frame.filter(pl.col("near_limit")).sort("headroom_pct").iter_rows(named=True):
        use = max(x for x in (r["peak_reserved_bytes"], r["peak_allocated_bytes"]) if x is not None)
        at = (
            f" at {r['peak_op']}" + (f" in {r['peak_top_op']}" if r["peak_top_op"] else "")
            if r["peak_op"]
            else ""
        )
        text = (
            f"rank {r['rank']} device {r['device']} peaks at {size(use)} of its "
            f"{size(r['capacity_bytes'])} ({r['headroom_pct']:.1f}% headroom): allocated "
            f"{size(r['peak_allocated_bytes'])} in step {r['peak_step']}{at}"
        )
        findings.append(
            _found(text, (r["rank"],), "headroom_pct", r["headroom_pct"], "near capacity", "memory")
        )
    for g in groups.filter(pl.col("imbalanced")).iter_rows(named=True) if groups.height else ():
        text = (
            f"peak memory differs by {g['spread_pct']:.0f}% within group {g['group']} (ranks "
            f"{g['ranks']}): rank {g['max_rank']} {size(g['max_peak_bytes'])}, rank "
            f"{g['min_rank']} {size(g['min_peak_bytes'])}"
        )
        findings.append(
            _found(
                text,
                (g["max_rank"], g["min_rank"]),
                "spread_pct",
                g["spread_pct"],
                "peaks imbalanced",
                "memory:groups",
            )
        )
    oom = m.note("oom")
    if oom:
        findings.insert(0, _found(str(oom), (), "", None, "out of memory", "memory"))
    if findings:
        text = findings[0].text
        return (
            findings,
            Verdict(
                "memory", "problem", text if len(findings) == 1 else f"{text} (and {len(findings) - 1} more)"
            ),
        )
    top = frame.sort("peak_allocated_bytes", descending=True, nulls_last=True).row(0, named=True)
    if top["peak_allocated_bytes"] is None:
        return [], Verdict(
            "memory", "n/a", "memory records without a known allocated value (see the memory notes)"
        )
    # headroom is measured above the larger of reserved and allocated: name the reserved when it is that
    reserved = top["peak_reserved_bytes"]
    held = (
        f" (reserved {size(reserved)})"
        if reserved is not None and reserved > top["peak_allocated_bytes"]
        else ""
    )
    room = (
        f", {top['headroom_pct']:.0f}% headroom" + (" above the reserved" if held else "")
        if top["headroom_pct"] is not None
        else ""
    )
    return [], Verdict(
        "memory",
        "ok",
        f"peak allocated {size(top['peak_allocated_bytes'])} on rank "
        f"{top['rank']}{held}{room}; no rank near its capacity, no group imbalanced",
    )


#: One line of doc per table of :data:`TABLES`.
_TABLE_DOCS = {
    "frame": "Peak memory per (rank, device, source) series",
    "steps": "The same per step",
    "ops": "Live bytes at each series' peak, by the op that allocated them",
    "groups": "Rank peaks per process group (and the whole run): their spread",
    "categories": "Bytes per export_memory_timeline category at the peak of their total",
    "timeline": "Allocated and reserved over time, in buckets (for the plot)",
    "category_timeline": "Bytes per category over time, in buckets (for the plot)",
}

SPEC = Analysis(
    name="memory",
    reads_activity=False,  # queries the store's views only
    params=Params,
    result=Result,
    frames=tuple(
        result_frame(name, _TABLE_DOCS[name], *cols, worst="peak_allocated_bytes" if name == "steps" else "")
        for name, cols in TABLES.items()
    ),
    report=Report(
        120,
        "memory records (torch.profiler profile_memory=True, nsys --cuda-memory-usage=true, or "
        "export_memory_timeline)",
        when=_recorded,
    ),
    findings=Topic("memory", 55, _memory_topic),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Accelerator memory per rank, device and step of one run (module doc).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no accelerator memory records (record with
            ``torch.profiler.profile(profile_memory=True)``, ``nsys profile --cuda-memory-usage=true`` or
            ``export_memory_timeline``).
    """
    run_id = store.resolve_run(params.run)
    raw = store.sql(_RECORDS, [run_id])
    notes: list[str] = []
    raw = _usable(raw, notes)
    if raw.is_empty():
        raise AnalysisError(
            f"{run_label(store, run_id)}: no accelerator memory records; record them with "
            "torch.profiler.profile(profile_memory=True), nsys profile --cuda-memory-usage=true, "
            "or export_memory_timeline"
        )
    ooms = raw.filter(pl.col("action") == "oom")
    # (ts, seq) orders the records; the rest only makes the order of records without seq the same every time
    rec = (
        raw.filter(pl.col("action").ne_missing("oom"))
        .sort([*_SERIES, "ts_ns", "seq", "total_allocated", "addr", "bytes"], nulls_last=True)
        .with_row_index("ord")
    )
    rec = _steps(store, run_id, _ops(store, run_id, rec))
    pairs = _pairs(rec)
    points = _allocated(rec, pairs, notes)
    caps = _capacities(store, run_id, params.capacity())
    frame, steps = _peaks(points, caps, ooms)
    ops = _live_ops(rec, pairs, frame)
    groups = _groups(store, run_id, frame)
    categories, cat_tl = _categories(rec, params.points)
    notes += _summary_notes(frame, ooms)
    return Result(
        frame=frame.select([c.name for c in TABLES["frame"]]),
        steps=steps,
        ops=ops,
        groups=groups,
        categories=categories,
        timeline=_timeline(points, frame, params.points),
        category_timeline=cat_tl,
        notes=tuple(notes),
    )


def _usable(raw: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    """The records with a device (and, but for export_memory_timeline, a known one); a note for the rest."""
    no_dev = raw.filter((pl.col("source") != "memory_timeline") & pl.col("device").is_null())
    if no_dev.height:
        notes.append(
            f"{no_dev.height:,} memory record(s) without a usable 'Device Id' left out (rank(s) "
            f"{', '.join(map(str, sorted(set(no_dev['rank'].to_list()))))})"
        )
    return raw.filter((pl.col("source") == "memory_timeline") | pl.col("device").is_not_null())


def _ops(store: Store, run_id: int, rec: pl.DataFrame) -> pl.DataFrame:
    """``rec`` with ``op`` and ``top_op``: the innermost and outermost CPU op enclosing each record on
    its thread (module doc, step 2)."""
    ops = store.sql(_OPS.replace("$run", str(int(run_id))))
    none = rec.with_columns(pl.lit(None, pl.Utf8).alias("op"), pl.lit(None, pl.Utf8).alias("top_op"))
    if ops.is_empty():
        return none
    lane = ["rank", "pid", "tid"]
    tree = with_parents(ops.filter(pl.col("end_ns") >= pl.col("start_ns")), lane)
    parent = tree["parent"].cast(pl.Int64).fill_null(-1).to_numpy()
    ends, names = tree["end_ns"].to_numpy(), tree["name"]
    root = np.where(parent < 0, np.arange(tree.height), parent)
    while True:  # pointer jumping: the outermost ancestor in log(depth) passes
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    kin = rec.filter(pl.col("source") == "kineto").select("ord", *lane, "ts_ns").sort("ts_ns")
    cand = kin.join_asof(
        tree.select(*lane, "start_ns", "id").sort("start_ns"),
        left_on="ts_ns",
        right_on="start_ns",
        by=lane,
        strategy="backward",
        check_sortedness=False,
    )
    ids = cand["id"].fill_null(-1).to_numpy().astype(np.int64)
    ts = cand["ts_ns"].to_numpy()
    while True:  # walk up from the latest op started before the record to the first that encloses it
        open_ = ids >= 0
        up = open_ & (ends[np.maximum(ids, 0)] < ts)
        if not up.any():
            break
        ids = np.where(up, parent[np.maximum(ids, 0)], ids)
    named = pl.DataFrame({"_i": np.arange(tree.height, dtype=np.int64), "_n": names})
    got = pl.DataFrame({"ord": cand["ord"], "_i": ids, "_r": root[np.maximum(ids, 0)]}).filter(
        pl.col("_i") >= 0
    )
    got = (
        got.join(named.rename({"_n": "op"}), on="_i", how="left")
        .join(named.rename({"_i": "_r", "_n": "top_op"}), on="_r", how="left")
        .select("ord", "op", "top_op")
    )
    return rec.join(got, on="ord", how="left")


def _steps(store: Store, run_id: int, rec: pl.DataFrame) -> pl.DataFrame:
    """``rec`` with ``step`` filled where ingest left it NULL: the rank's step whose CPU span holds the record."""
    if rec["step"].null_count() == 0:
        return rec
    spans = store.sql(
        "SELECT rank, step AS _s, cpu_start_ns, cpu_end_ns FROM steps WHERE run_id = ?", [run_id]
    )
    if spans.is_empty():
        return rec
    got = (
        rec.select("ord", "rank", "ts_ns")
        .sort("ts_ns")
        .join_asof(
            spans.sort("cpu_start_ns"),
            left_on="ts_ns",
            right_on="cpu_start_ns",
            by="rank",
            strategy="backward",
            check_sortedness=False,
        )
        .select("ord", pl.when(pl.col("ts_ns") < pl.col("cpu_end_ns")).then(pl.col("_s")).alias("_s"))
    )
    return (
        rec.join(got, on="ord", how="left").with_columns(pl.coalesce("step", "_s").alias("step")).drop("_s")
    )


def _pairs(rec: pl.DataFrame) -> pl.DataFrame:
    """Allocations and frees with an address, each allocation with the ``ord`` of the next free of
    its address on its series (``free_ord``), each free whether an allocation precedes it (``matched``)."""
    key = [*_SERIES, "addr"]
    b = pl.col("bytes")
    # sorted by address then time: a row's neighbour is of its address when every key column agrees
    same_next = pl.all_horizontal(*(pl.col(k).shift(-1).eq_missing(pl.col(k)) for k in key))
    same_prev = pl.all_horizontal(*(pl.col(k).shift(1).eq_missing(pl.col(k)) for k in key))
    return (
        rec.filter(
            (pl.col("source") != "memory_timeline")
            & pl.col("addr").is_not_null()
            & b.is_not_null()
            & (b != 0)
        )
        .select(*key, "ord", "bytes", "op", "top_op")
        .sort([*key, "ord"])
        .with_columns(
            pl.when(same_next & (b.shift(-1) < 0)).then(pl.col("ord").shift(-1)).alias("free_ord"),
            (same_prev & (b.shift(1) > 0)).fill_null(False).alias("matched"),
        )
    )


def _allocated(rec: pl.DataFrame, pairs: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    """The value of every record (module doc, step 1): rank, device, source, ord, ts_ns, step, op,
    top_op, allocated (NULL: unknown), reserved, exact (its value is known); export_memory_timeline
    series keep the last record of each timestamp only."""
    b, tot = pl.col("bytes"), pl.col("total_allocated")
    known = tot.is_not_null()
    cb = b.fill_null(0).cum_sum().over(_SERIES)
    nb = b.is_null().cast(pl.Int64).cum_sum().over(_SERIES)

    def anchor(e: pl.Expr, fill: str) -> pl.Expr:
        x = pl.when(known).then(e)
        return (x.forward_fill() if fill == "f" else x.backward_fill()).over(_SERIES)

    fwd = pl.when(anchor(nb, "f") == nb).then(anchor(tot, "f") + cb - anchor(cb, "f"))
    bwd = pl.when(anchor(nb, "b") == nb).then(anchor(tot, "b") - (anchor(cb, "b") - cb))
    early = pl.concat(
        [
            pairs.filter((pl.col("bytes") < 0) & ~pl.col("matched"))
            .group_by(_SERIES)
            .agg((-pl.col("bytes")).sum().alias("_before")),
            _held(rec)
            .group_by("rank", "device")
            .agg(pl.col("held").sum().alias("_before"), pl.lit("memory_timeline").alias("source"))
            .select(*_SERIES, "_before"),
        ],
        how="vertical_relaxed",
    )
    v = rec.join(early, on=_SERIES, how="left", nulls_equal=True).with_columns(
        known.any().over(_SERIES).alias("_totals")
    )
    v = v.with_columns(
        pl.when(pl.col("_totals"))
        .then(pl.coalesce(tot, fwd, bwd))
        .otherwise(cb + pl.col("_before").fill_null(0))
        .alias("allocated"),
        pl.col("total_reserved").alias("reserved"),
    )
    _value_notes(v, notes)
    v = v.with_columns(pl.col("allocated").is_not_null().alias("exact"))
    last = (
        (pl.col("source") != "memory_timeline")
        | (pl.col("ts_ns") != pl.col("ts_ns").shift(-1).over(_SERIES))
        | pl.col("ts_ns").shift(-1).over(_SERIES).is_null()
    )
    return v.filter(last).select(
        *_SERIES,
        "ord",
        "ts_ns",
        "step",
        "op",
        "top_op",
        "allocated",
        "reserved",
        "exact",
        "_before",
        "_totals",
    )


def _held(rec: pl.DataFrame) -> pl.DataFrame:
    """rank, device, category, held: bytes of each export_memory_timeline category destroyed before
    they were created in the file (held from the start: the deepest its running sum goes below 0)."""
    mt = rec.filter(pl.col("source") == "memory_timeline")
    return mt.group_by("rank", "device", "category", maintain_order=True).agg(
        (-pl.col("bytes").fill_null(0).cum_sum().min()).clip(0).alias("held")
    )


def _value_notes(v: pl.DataFrame, notes: list[str]) -> None:
    """Notes on records whose values were derived or are unknown, and on series without totals."""
    acc = v.filter(pl.col("source") != "memory_timeline")
    kin = acc.filter(pl.col("source") == "kineto")
    missing = kin.filter(pl.col("total_allocated").is_null())
    unknown = missing.filter(pl.col("allocated").is_null())
    if missing.height:
        notes.append(
            f"{missing.height:,} Kineto memory record(s) without a usable 'Total Allocated' (missing or not an "
            f"integer): {missing.height - unknown.height:,} derived from the neighbouring totals and their "
            f"'Bytes'"
            + (
                f"; {unknown.height:,} unknown (no 'Bytes' either), so the peaks of rank(s) "
                f"{_ranks(unknown)} are lower bounds (peak_exact false)"
                if unknown.height
                else ""
            )
        )
    no_res = kin.filter(pl.col("total_reserved").is_null())
    if no_res.height:
        notes.append(
            f"{no_res.height:,} Kineto memory record(s) without a usable 'Total Reserved': reserved left "
            "unknown there"
        )
    no_bytes = acc.filter(pl.col("bytes").is_null() & ~pl.col("_totals"))
    if no_bytes.height:
        notes.append(
            f"{no_bytes.height:,} memory record(s) without a usable 'Bytes' in series without totals: counted as "
            f"0, so the peaks of rank(s) {_ranks(no_bytes)} may be off (peak_exact false)"
        )
    held = (
        v.filter((pl.col("source") == "memory_timeline") & (pl.col("_before").fill_null(0) > 0))
        .select(*_SERIES, "_before")
        .unique()
    )
    if held.height:
        notes.append(
            f"export_memory_timeline: {held['_before'].sum():,} bytes destroyed before they were created in "
            f"the file count as held from the start (rank(s) {_ranks(held)}; the peak is a lower bound)"
        )
    sums = acc.filter(~pl.col("_totals")).select(*_SERIES, "_before").unique()
    if sums.height:
        kinds = sorted(set(sums["source"].to_list()))
        before = sums.filter(pl.col("_before").fill_null(0) > 0)
        notes.append(
            f"{', '.join(kinds)} series without allocator totals: allocated is the running sum of the "
            "allocations and frees in the trace (memory allocated before the capture and never freed in "
            "it is not seen)"
            + (
                f"; {before['_before'].sum():,} bytes freed before any allocation of "
                "theirs count as held from the start (a lower bound)"
                if before.height
                else ""
            )
        )


def _ranks(df: pl.DataFrame) -> str:
    return ", ".join(map(str, sorted(set(df["rank"].to_list()))))


def _capacities(store: Store, run_id: int, user: int | None) -> pl.DataFrame:
    """rank, device, capacity_bytes, capacity_source: the user's for every device, else the trace's."""
    dev = store.sql(
        "SELECT DISTINCT rank, device, max(memory_bytes) AS capacity_bytes FROM devices WHERE run_id = ? "
        "AND memory_bytes > 0 GROUP BY ALL",
        [run_id],
    )
    return (
        dev.with_columns(pl.lit(user, pl.Int64).alias("_user"))
        .with_columns(
            pl.coalesce("_user", "capacity_bytes").cast(pl.Int64).alias("capacity_bytes"),
            pl.when(pl.col("_user").is_not_null())
            .then(pl.lit("user"))
            .otherwise(pl.lit("trace"))
            .alias("capacity_source"),
            pl.col("device").cast(pl.Int32),
        )
        .drop("_user")
        if user is None or dev.height
        else pl.DataFrame(
            {"rank": [None], "device": [None], "capacity_bytes": [user], "capacity_source": ["user"]},
            schema={
                "rank": pl.Int32,
                "device": pl.Int32,
                "capacity_bytes": pl.Int64,
                "capacity_source": pl.Utf8,
            },
        )
    )


def _peak_aggs() -> list[pl.Expr]:
    at = pl.col("allocated").fill_null(-1).arg_max()
    return [
        pl.col("allocated").max().alias("peak_allocated_bytes"),
        pl.col("ts_ns").get(at).alias("peak_ts_ns"),
        pl.col("op").get(at).alias("peak_op"),
        pl.col("top_op").get(at).alias("peak_top_op"),
        pl.col("step").get(at).alias("peak_step"),
        pl.col("reserved").max().alias("peak_reserved_bytes"),
        (pl.col("reserved") - pl.col("allocated")).get(at).alias("cached_at_peak_bytes"),
        pl.col("exact").all().alias("peak_exact"),
    ]


def _with_capacity(df: pl.DataFrame, caps: pl.DataFrame) -> pl.DataFrame:
    if caps.height == 1 and caps["rank"][0] is None:  # a user capacity without device facts: every device
        df = df.with_columns(
            pl.lit(caps["capacity_bytes"][0], pl.Int64).alias("capacity_bytes"),
            pl.lit("user").alias("capacity_source"),
        )
    else:
        df = df.join(caps, on=["rank", "device"], how="left")
    use = pl.max_horizontal("peak_reserved_bytes", "peak_allocated_bytes")
    df = df.with_columns((pl.col("capacity_bytes") - use).alias("headroom_bytes"))
    # numpy's division, correctly rounded: polars' gave a last bit that changed from run to run on
    # the same frame (62.50442164839052 or ...526 on hta/df_index_resolver)
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = (
            100.0
            * df["headroom_bytes"].cast(pl.Float64).to_numpy()
            / df["capacity_bytes"].cast(pl.Float64).to_numpy()
        )
    unknown = pl.col("capacity_bytes").is_null() | pl.col("headroom_bytes").is_null()
    return df.with_columns(pl.when(unknown).then(None).otherwise(pl.Series(pct)).alias("headroom_pct"))


def _peaks(points: pl.DataFrame, caps: pl.DataFrame, ooms: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(frame, steps): the peaks per series and per (series, step) (module doc, step 3)."""
    p = points.sort("ord")
    steps = _with_capacity(
        p.group_by([*_SERIES, "step"], maintain_order=True).agg(
            pl.col("ts_ns").min().alias("start_ns"),
            pl.col("ts_ns").max().alias("end_ns"),
            pl.len().cast(pl.Int64).alias("records"),
            *_peak_aggs(),
        ),
        caps,
    )
    frame = _with_capacity(
        p.group_by(_SERIES, maintain_order=True).agg(
            pl.len().cast(pl.Int64).alias("records"),
            pl.col("step").drop_nulls().n_unique().cast(pl.Int64).alias("steps"),
            *_peak_aggs(),
            ((pl.col("_before").first().fill_null(0) == 0) | pl.col("_totals").first()).alias("_clean"),
        ),
        caps,
    )
    oom = (
        ooms.group_by("rank", "device").agg(pl.len().cast(pl.Int64).alias("ooms"))
        if ooms.height
        else pl.DataFrame(schema={"rank": pl.Int32, "device": pl.Int32, "ooms": pl.Int64})
    )
    frame = (
        frame.with_columns(
            (pl.col("peak_exact") & pl.col("_clean")).alias("peak_exact"),
            pl.col("source").replace_strict(BASIS, default=None).alias("basis"),
        )
        .join(oom, on=["rank", "device"], how="left")
        .with_columns(pl.col("ooms").fill_null(0))
    )
    order = pl.col("source").replace_strict(
        {s: i for i, s in enumerate(SOURCE_ORDER)}, default=len(SOURCE_ORDER)
    )
    frame = frame.with_columns(
        (order == order.min().over("rank")).alias("primary"),
        (pl.col("headroom_pct") < NEAR_LIMIT_PCT).fill_null(False).alias("near_limit"),
    )
    frame = frame.sort(*_SERIES, nulls_last=True)
    steps = steps.select([c.name for c in TABLES["steps"]]).sort([*_SERIES, "step"], nulls_last=True)
    return frame, steps


def _live_ops(rec: pl.DataFrame, pairs: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """Bytes live at each series' peak by the op that allocated them (module doc, step 4)."""
    peak = (
        rec.join(frame.select(*_SERIES, "peak_ts_ns", "peak_allocated_bytes"), on=_SERIES)
        .filter(pl.col("ts_ns") == pl.col("peak_ts_ns"))
        .group_by(_SERIES)
        .agg(pl.col("ord").max().alias("_peak"), pl.col("peak_allocated_bytes").first())
    )
    live = (
        pairs.filter(pl.col("bytes") > 0)
        .join(peak, on=_SERIES)
        .filter(
            (pl.col("ord") <= pl.col("_peak"))
            & (pl.col("free_ord").is_null() | (pl.col("free_ord") > pl.col("_peak")))
        )
    )
    by_op = live.group_by(*_SERIES, "op", "top_op").agg(
        pl.col("bytes").sum().alias("live_bytes"), pl.len().cast(pl.Int64).alias("allocations")
    )
    rest = (
        peak.join(
            by_op.group_by(_SERIES).agg(pl.col("live_bytes").sum().alias("_in")), on=_SERIES, how="left"
        )
        .select(
            *_SERIES,
            pl.lit("(before the trace)").alias("op"),
            pl.lit(None, pl.Utf8).alias("top_op"),
            (pl.col("peak_allocated_bytes") - pl.col("_in").fill_null(0)).alias("live_bytes"),
            pl.lit(None, pl.Int64).alias("allocations"),
        )
        .filter(pl.col("live_bytes") != 0)
    )
    out = (
        pl.concat([by_op.select(rest.columns), rest], how="vertical_relaxed")
        .join(peak.select(*_SERIES, "peak_allocated_bytes"), on=_SERIES)
        .with_columns((100.0 * pl.col("live_bytes") / pl.col("peak_allocated_bytes")).alias("pct_of_peak"))
    )
    cols = [c.name for c in TABLES["ops"]]
    # op and top_op break ties of live bytes: the group_by's order is not the same run to run
    return out.select(cols).sort(
        [*_SERIES, "live_bytes", "op", "top_op"],
        descending=[False, False, False, True, False, False],
        nulls_last=True,
    )


def rank_peaks(frame: pl.DataFrame) -> pl.DataFrame:
    """rank, peak_allocated_bytes, device, source: each rank's peak, from its primary series (the
    largest over their devices)."""
    f = frame.filter(pl.col("primary") & pl.col("peak_allocated_bytes").is_not_null())
    return (
        f.sort("rank", "peak_allocated_bytes", descending=[False, True])
        .group_by("rank", maintain_order=True)
        .first()
        .select("rank", "peak_allocated_bytes", "device", "source")
    )


def _groups(store: Store, run_id: int, frame: pl.DataFrame) -> pl.DataFrame:
    """Each process group's spread of rank peaks, else the whole run's (module doc, step 5)."""
    per = dict(rank_peaks(frame).select("rank", "peak_allocated_bytes").iter_rows())
    pgs = store.sql(
        "SELECT DISTINCT pg, pg_ranks FROM collectives WHERE run_id = ? AND pg_ranks IS NOT NULL", [run_id]
    )
    groups: dict[tuple[int, ...], str] = {}
    for pg, members in pgs.sort("pg", nulls_last=True).iter_rows():
        try:
            ranks = tuple(sorted({int(r) for r in json.loads(members)}))
        except (TypeError, ValueError):
            continue
        if len(ranks) >= 2:
            groups.setdefault(ranks, pg or members)
    if not groups:
        groups = {tuple(sorted(per)): "all"}
    rows = []
    for members, name in groups.items():
        have = [(per[r], r) for r in members if r in per]
        if len(have) < 2:
            continue
        (lo, lo_r), (hi, hi_r) = min(have), max(have, key=lambda x: (x[0], -x[1]))
        spread = 100.0 * (hi / lo - 1) if lo else None
        rows.append(
            (
                name,
                json.dumps([r for _, r in sorted(have, key=lambda x: x[1])]),
                lo,
                lo_r,
                hi,
                hi_r,
                spread,
                spread is None or spread > IMBALANCE_PCT,
            )
        )
    schema_ = {c.name: _POLARS[c.type] for c in TABLES["groups"]}
    return pl.DataFrame(rows, schema=schema_, orient="row")


_POLARS = {
    "VARCHAR": pl.Utf8,
    "BIGINT": pl.Int64,
    "INTEGER": pl.Int32,
    "DOUBLE": pl.Float64,
    "BOOLEAN": pl.Boolean,
}


def _categories(rec: pl.DataFrame, points: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(categories, category_timeline) from export_memory_timeline records (module doc, steps 6-7)."""
    mt = rec.filter(pl.col("source") == "memory_timeline")
    if mt.is_empty():
        empty = {
            n: pl.DataFrame(schema={c.name: _POLARS[c.type] for c in TABLES[n]})
            for n in ("categories", "category_timeline")
        }
        return empty["categories"], empty["category_timeline"]
    key = ["rank", "device"]
    held = (
        _held(rec)
        .group_by(key)
        .agg(*(pl.col("held").filter(pl.col("category") == c).sum().alias(f"_h_{c}") for c in CATEGORIES))
    )
    mt = mt.join(held, on=key, how="left", nulls_equal=True, maintain_order="left")
    wide = mt.with_columns(
        *(
            pl.when(pl.col("category") == c)
            .then(pl.col("bytes"))
            .otherwise(0)
            .fill_null(0)
            .cum_sum()
            .over(key)
            .add(pl.col(f"_h_{c}").fill_null(0))
            .alias(f"{c}_bytes")
            for c in CATEGORIES
        )
    )
    wide = wide.with_columns(pl.sum_horizontal(*(f"{c}_bytes" for c in CATEGORIES)).alias("total_bytes"))
    last = wide.filter(
        (pl.col("ts_ns") != pl.col("ts_ns").shift(-1).over(key))
        | pl.col("ts_ns").shift(-1).over(key).is_null()
    )
    at = pl.col("total_bytes").arg_max()
    cats = (
        last.sort("ord")
        .group_by(key, maintain_order=True)
        .agg(
            pl.col("ts_ns").get(at).alias("peak_ts_ns"),
            pl.col("step").get(at).alias("step"),
            *(pl.col(f"{c}_bytes").get(at) for c in ("total", *CATEGORIES)),
        )
    )
    cats = cats.select([c.name for c in TABLES["categories"]]).sort(key, nulls_last=True)
    b = _bucket(last, key, points)
    tl = b.group_by(*key, "_bk", maintain_order=True).agg(
        pl.col("ts_ns").first(),
        *(pl.col(f"{c}_bytes").get(pl.col("total_bytes").arg_max()) for c in CATEGORIES),
    )
    tl = tl.unpivot(
        index=[*key, "ts_ns"],
        on=[f"{c}_bytes" for c in CATEGORIES],
        variable_name="category",
        value_name="bytes",
    ).with_columns(pl.col("category").str.strip_suffix("_bytes"))
    tl = tl.with_columns(pl.format("rank {} {}", "rank", "category").alias("series"))
    return cats, tl.select([c.name for c in TABLES["category_timeline"]]).sort(
        *key, "category", "ts_ns", nulls_last=True
    )


def _bucket(df: pl.DataFrame, key: list[str], points: int) -> pl.DataFrame:
    """``df`` with ``_bk``: its time bucket within its series (``points`` per series; 0: one per row)."""
    if points == 0:
        return df.with_row_index("_bk")
    t0, t1 = pl.col("ts_ns").min().over(key), pl.col("ts_ns").max().over(key)
    span = (t1 - t0 + 1).cast(pl.Float64)
    return df.with_columns(
        ((pl.col("ts_ns") - t0).cast(pl.Float64) * points / span).floor().cast(pl.Int64).alias("_bk")
    )


def _label(rank: pl.Expr, device: pl.Expr, source: pl.Expr) -> pl.Expr:
    dev = pl.when(device.is_null()).then(pl.lit("device ?")).otherwise(pl.format("device {}", device))
    src = pl.when(source == "kineto").then(pl.lit("")).otherwise(pl.format(" ({})", source))
    return pl.format("rank {} {}{}", rank, dev, src)


def _timeline(points: pl.DataFrame, frame: pl.DataFrame, n: int) -> pl.DataFrame:
    """Each series in at most ``n`` time buckets (module doc, step 7), the peak's bucket marked."""
    b = _bucket(points.sort("ord"), _SERIES, n).join(
        frame.select(*_SERIES, "peak_ts_ns"), on=_SERIES, how="left", nulls_equal=True
    )
    tl = b.group_by(*_SERIES, "_bk", maintain_order=True).agg(
        pl.col("ts_ns").first(),
        pl.col("allocated").max().alias("allocated_bytes"),
        pl.col("reserved").max().alias("reserved_bytes"),
        (pl.col("ts_ns") == pl.col("peak_ts_ns")).any().alias("peak"),
    )
    tl = tl.with_columns(_label(pl.col("rank"), pl.col("device"), pl.col("source")).alias("series"))
    return tl.select([c.name for c in TABLES["timeline"]]).sort(*_SERIES, "ts_ns", nulls_last=True)


def _summary_notes(frame: pl.DataFrame, ooms: pl.DataFrame) -> list[str]:
    """Notes on what the tables alone do not say: capacities unknown, out-of-memory records."""
    out: list[str] = []
    unknown = frame.filter(pl.col("capacity_bytes").is_null())
    if unknown.height:
        out.append(
            f"capacity unknown for {unknown.height} series (the trace states no device memory): give "
            "-p capacity_gib=N (or capacity_bytes=N) for headroom"
        )
    if ooms.height:
        first = ooms.sort("ts_ns").row(0, named=True)
        out.append(
            Note(
                f"{ooms.height} out-of-memory record(s) ([OutOfMemory]); the first on rank {first['rank']} "
                f"device {first['device']} in step {first['step']}",
                kind="oom",
            )
        )
    return out
