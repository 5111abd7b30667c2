"""Export a run as one merged, clock-aligned Chrome/Perfetto trace of all ranks, with traceprof's findings.

Layout in the viewer (Chrome JSON trace format: ``ph`` ``X`` slices, ``i`` instants, ``s``/``f``
flows, ``M`` metadata; ``ts``/``dur`` in microseconds; ``pid``/``tid`` integers):

- Each rank is three processes: ``rank R`` (its CPU threads, named as the source named them, e.g.
  ``thread 2910249 (pt_main_thread)``), ``rank R GPU`` (a track per (device, stream)) and
  ``rank R findings`` (traceprof's findings, below).
- Flows: an arrow from each CPU runtime call (``cudaLaunchKernel``...) to the GPU kernel, copy or
  set it launched (Kineto ``ac2g``: the store keeps the link as the shared ``correlation`` id of
  the runtime row and the GPU row, not the source's flow records), and from each forward op to
  its backward op (Kineto ``fwdbwd``: the ops' shared ``args."Sequence number"``; the backward
  op is the first whose name holds ``Backward``).
- Findings tracks (each when its analysis applies to the run): ``exposed communication``
  (``gaps``: each interval where communication runs with no compute, named by its collective),
  ``idle (cause), dev D stream S`` (``idle``'s rule: each gap of 1 us or more of that GPU stream,
  named host wait / kernel wait / other), ``straggler wait`` (``stragglers``: from a rank's arrival at a collective to the last
  rank's, naming that rank; where its waits at collectives in flight at once overlap, each shows
  its part past the earlier ones, so the track is the rank's wall-clock wait) and ``critical path`` (``critical_path``'s pieces on the rank they ran
  on).

Timestamps are the store's aligned ns (clock offsets applied at ingest), written as microseconds
relative to the run's first event with 3 decimals, so no precision is lost and ranks line up.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceprof.core.classify import VALID_SQL, valid_sql
from traceprof.core.errors import TraceprofError
from traceprof.core.fileio import write_output
from traceprof.storage.store import Store

__all__ = ["export_perfetto", "FINDING_TRACKS"]

_GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_user_annotation", "sync")
#: The findings tracks, in their order on each rank.
FINDING_TRACKS = ("exposed communication", "idle (cause)", "straggler wait", "critical path")
#: Idle gaps shorter than this (ns) are left off the ``idle (cause)`` track (back-to-back kernels).
MIN_IDLE_NS = 1_000


def _track(kind: str, device: int | None, stream: int | None, tid: str) -> str:
    """Track of a GPU row: kernels, memcpys and memsets on their lane ``dev D stream S`` (a lane is
    (device, stream): two GPUs of one process both have a stream 1); Kineto's virtual rows (stream
    syncs, GPU annotations) on a track of their own, so they never overlap a real stream's kernels."""
    lane = f"dev {'?' if device is None else device} stream {stream}"
    if kind in ("kernel", "memcpy", "memset"):
        return lane
    return (
        f"{lane} {kind} {tid}" if kind == "sync" else f"dev {'?' if device is None else device} {kind} {tid}"
    )


def _us(ns: int) -> float:
    """ns as microseconds with 3 decimals (exact: every ns is a whole thousandth of a us)."""
    return round(ns / 1000, 3)


class _Tracks:
    """Integer pids and tids of the viewer's processes and tracks, with their names."""

    def __init__(self) -> None:
        self.tids: dict[tuple[int, str], int] = {}
        self.names: dict[tuple[int, int], str] = {}

    def tid(self, pid: int, key: str, name: str) -> int:
        t = self.tids.get((pid, key))
        if t is None:
            t = self.tids[(pid, key)] = len(self.tids) + 1
            self.names[(pid, t)] = name
        return t

    def meta(self, ranks: list[int]) -> Iterator[dict[str, Any]]:
        for r in ranks:
            for k, what in enumerate(("", " GPU", " findings")):
                pid = r * 3 + k
                yield {
                    "ph": "M",
                    "name": "process_name",
                    "pid": pid,
                    "tid": 0,
                    "args": {"name": f"rank {r}{what}"},
                }
                yield {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": pid,
                    "tid": 0,
                    "args": {"sort_index": pid},
                }
        for (pid, tid), name in sorted(self.names.items()):
            yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            yield {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }


def export_perfetto(store: Store, run: str | None, output: str | Path, findings: bool = True) -> int:
    """Write run ``run`` as Chrome trace JSON (gzipped when ``output`` ends in ``.gz``).

    Reads events (kind, name, cat, ts_ns, dur_ns, pid, tid, device, stream, correlation, args) of
    every rank, the thread names the source gave (``traces.meta``: Kineto ``thread_name``
    metadata), and with ``findings`` the results of ``gaps``, ``idle``'s gap rule, ``stragglers``
    and ``critical_path`` (module doc). Records flagged at ingest as suspect (``events.flag``) are
    left out, as in the analyses; clipped overruns are written clipped.

    Returns:
        The number of trace events written, every one in the file: slices, instants, both ends of
        each flow, the findings' slices and the metadata (process and thread names and order).

    Raises:
        StoreError: No such run.
        UsageError: ``output`` cannot be written.
    """
    run_id = store.resolve_run(run)
    t0 = int(
        store.sql(f"SELECT min(ts_ns) AS t0 FROM events e WHERE run_id = ? AND {VALID_SQL}", [run_id])["t0"][
            0
        ]
        or 0
    )
    tracks = _Tracks()
    thread_names = _thread_names(store, run_id)
    out: list[bytes] = []
    ranks: set[int] = set()
    rel = store.con.sql(
        f"""
        SELECT rank, kind, name, cat, ts_ns - {t0} AS ts, dur_ns, pid, tid, device, stream, args
        FROM events e WHERE run_id = {int(run_id)} AND kind NOT IN ('counter') AND {VALID_SQL}
        ORDER BY rank, ts_ns
        """
    )
    for batch in rel.to_arrow_reader(200_000):
        cols = batch.to_pydict()
        for rank, kind, name, cat, ts, dur, pid, tid, device, stream, args in zip(
            *(
                cols[c]
                for c in (
                    "rank",
                    "kind",
                    "name",
                    "cat",
                    "ts",
                    "dur_ns",
                    "pid",
                    "tid",
                    "device",
                    "stream",
                    "args",
                )
            ),
            strict=True,
        ):
            ranks.add(rank)
            if kind in _GPU_KINDS:
                lane = _track(kind, device, stream, tid)
                p, t = rank * 3 + 1, tracks.tid(rank * 3 + 1, lane, lane)
            else:
                p = rank * 3
                key = f"{pid}/{tid}"
                t = tracks.tid(
                    p,
                    key,
                    thread_names.get((rank, key))
                    or f"thread {tid or '?'}" + (f" (pid {pid})" if pid else ""),
                )
            ev: dict[str, Any] = {
                "ph": "X",
                "cat": cat or kind,
                "name": name,
                "pid": p,
                "tid": t,
                "ts": _us(ts),
            }
            if kind == "instant":
                ev["ph"], ev["s"] = "i", "t"
            else:
                ev["dur"] = _us(dur)
            out.append(orjson.dumps(ev)[:-1] + b',"args":' + (args or "{}").encode() + b"}")
    flows = _flows(store, run_id, t0, tracks, thread_names)
    marks = _findings(store, run_id, t0, tracks) if findings else []
    meta = [orjson.dumps(m) for m in tracks.meta(sorted(ranks))]
    body = b",\n".join(meta + out + flows + marks)
    data = b'{"displayTimeUnit": "ns", "traceEvents": [\n' + body + b"\n]}\n"
    write_output(output, gzip.compress(data, 6) if str(output).endswith(".gz") else data)
    return len(meta) + len(out) + len(flows) + len(marks)


def _thread_names(store: Store, run_id: int) -> dict[tuple[int, str], str]:
    """(rank, ``pid/tid``) -> the thread's name in the source (Kineto ``thread_name`` metadata)."""
    rows = store.sql(
        "SELECT rank, json_extract(meta, '$.thread_names') AS t FROM traces WHERE run_id = ? AND meta IS NOT NULL",
        [run_id],
    )
    out: dict[tuple[int, str], str] = {}
    for rank, t in rows.iter_rows():
        for key, name in (orjson.loads(t) if t else {}).items():
            if name:
                out[(rank, key)] = str(name)
    return out


def _flows(
    store: Store, run_id: int, t0: int, tracks: _Tracks, thread_names: dict[tuple[int, str], str]
) -> list[bytes]:
    """Flow events (``s`` at the source, ``f`` with ``bp: "e"`` at the target, one id per arrow):
    launch -> GPU row by correlation id, forward op -> backward op by sequence number."""
    launches = store.sql(
        f"""
        WITH r AS (
          SELECT trace_id, correlation, arg_min(ts_ns, ts_ns) AS ts_ns, arg_min(pid, ts_ns) AS pid,
                 arg_min(tid, ts_ns) AS tid
          FROM events e WHERE run_id = {int(run_id)} AND kind IN ('cuda_runtime', 'cuda_driver')
            AND correlation IS NOT NULL AND {VALID_SQL}
          GROUP BY trace_id, correlation)
        SELECT 'ac2g' AS cat, g.rank, r.pid AS src_pid, r.tid AS src_tid, r.ts_ns - {int(t0)} AS src_ts,
               g.kind, g.device, g.stream, g.tid, g.ts_ns - {int(t0)} AS dst_ts
        FROM events g JOIN r ON r.trace_id = g.trace_id AND r.correlation = g.correlation
        WHERE g.run_id = {int(run_id)} AND g.kind IN ('kernel', 'memcpy', 'memset') AND {valid_sql("g")}
        ORDER BY g.rank, g.ts_ns
        """
    )
    backward = store.sql(
        f"""
        WITH ops AS (
          SELECT rank, trace_id, pid, tid, name, ts_ns,
                 TRY_CAST(json_extract_string(args, '$."Sequence number"') AS BIGINT) AS seq
          FROM events e WHERE run_id = {int(run_id)} AND kind = 'cpu_op' AND {VALID_SQL}
            AND json_exists(args, '$."Sequence number"')),
        fwd AS (SELECT trace_id, seq, arg_min(pid, ts_ns) AS pid, arg_min(tid, ts_ns) AS tid,
                       min(ts_ns) AS ts_ns FROM ops WHERE name NOT LIKE '%Backward%' GROUP BY ALL),
        bwd AS (SELECT rank, trace_id, seq, arg_min(pid, ts_ns) AS pid, arg_min(tid, ts_ns) AS tid,
                       min(ts_ns) AS ts_ns FROM ops WHERE name LIKE '%Backward%' GROUP BY ALL)
        SELECT 'fwdbwd' AS cat, b.rank, f.pid AS src_pid, f.tid AS src_tid, f.ts_ns - {int(t0)} AS src_ts,
               'cpu_op' AS kind, NULL::INTEGER AS device, NULL::BIGINT AS stream, b.pid AS dst_pid,
               b.tid, b.ts_ns - {int(t0)} AS dst_ts
        FROM fwd f JOIN bwd b USING (trace_id, seq) WHERE b.ts_ns >= f.ts_ns
        ORDER BY b.rank, b.ts_ns
        """
    )
    out: list[bytes] = []
    n = 0
    for frame in (launches, backward):
        for row in frame.iter_rows(named=True):
            n += 1
            rank = row["rank"]
            src_key = f"{row['src_pid']}/{row['src_tid']}"
            src = tracks.tid(
                rank * 3, src_key, thread_names.get((rank, src_key)) or f"thread {row['src_tid']}"
            )
            if row["kind"] == "cpu_op":
                dst_pid, key = rank * 3, f"{row['dst_pid']}/{row['tid']}"
                dst = tracks.tid(dst_pid, key, thread_names.get((rank, key)) or f"thread {row['tid']}")
            else:
                lane = _track(row["kind"], row["device"], row["stream"], row["tid"])
                dst_pid, dst = rank * 3 + 1, tracks.tid(rank * 3 + 1, lane, lane)
            cat = row["cat"]
            out.append(
                orjson.dumps(
                    {
                        "ph": "s",
                        "id": n,
                        "cat": cat,
                        "name": cat,
                        "pid": rank * 3,
                        "tid": src,
                        "ts": _us(row["src_ts"]),
                    }
                )
            )
            out.append(
                orjson.dumps(
                    {
                        "ph": "f",
                        "bp": "e",
                        "id": n,
                        "cat": cat,
                        "name": cat,
                        "pid": dst_pid,
                        "tid": dst,
                        "ts": _us(row["dst_ts"]),
                    }
                )
            )
    return out


def _findings(store: Store, run_id: int, t0: int, tracks: _Tracks) -> list[bytes]:
    """Slices on each rank's ``findings`` process, one track per :data:`FINDING_TRACKS` entry."""
    from traceprof.analyses import _waits
    from traceprof.engine import findings as fnd
    from traceprof.engine import intervals, session
    from traceprof.engine.analysis import FrameResult

    with session.of(store):
        res = fnd.run_analyses(store, run_id, None, names=("gaps", "stragglers", "critical_path"))
    spans: list[pl.DataFrame] = []  # rank, track, name, start_ns, end_ns
    gaps = res.get("gaps")
    if isinstance(gaps, FrameResult):
        label = pl.concat_str(pl.lit("exposed: "), pl.col("collective").fill_null("communication"))
        spans.append(_spans(gaps.frames()["gaps"], 0, label, pl.col("start_ns"), pl.col("end_ns")))
    spans.append(_idle_gaps(store, run_id))
    st = res.get("stragglers")
    if isinstance(st, FrameResult):
        w = st.frames()["waits"].join(
            st.frames()["instances"].select("instance_id", "op", "last_rank"), on="instance_id"
        )
        waited = pl.concat_str(
            pl.lit("wait for rank "),
            pl.col("last_rank").cast(pl.String).fill_null("?"),
            pl.lit(" at "),
            pl.col("op"),
        )
        # a rank's waits at collectives in flight at once overlap: tiled (each keeps its part past
        # the earlier ones), the track shows the rank's wall-clock wait with no slice overlapping another
        w = _waits.wait_spans(w.with_columns((pl.col("arrival_ns") + pl.col("wait_ns")).alias("last_ns")))
        w = intervals.tile(w.select("rank", "start_ns", "end_ns", "instance_id", "op", "last_rank"), ["rank"])
        spans.append(_spans(w, 2, waited, pl.col("start_ns"), pl.col("end_ns")))
    cp = res.get("critical_path")
    if isinstance(cp, FrameResult):
        piece = pl.concat_str(pl.col("kind"), pl.lit(": "), pl.col("name").fill_null(""))
        start = pl.col("start_ns")
        spans.append(_spans(cp.frames()["path"], 3, piece, start, start + pl.col("duration_ns")))
    out: list[bytes] = []
    frames = [x for x in spans if x.height]
    if not frames:
        return out
    for rank, track, name, start, end in (
        pl.concat(frames).drop_nulls(["rank", "start_ns", "end_ns"]).iter_rows()
    ):
        pid = rank * 3 + 2
        tid = tracks.tid(pid, track, track)
        out.append(
            orjson.dumps(
                {
                    "ph": "X",
                    "cat": "traceprof",
                    "name": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(start - t0),
                    "dur": _us(max(end - start, 0)),
                }
            )
        )
    return out


def _spans(
    df: pl.DataFrame, track: int, name: pl.Expr, start: pl.Expr, end: pl.Expr, lane: pl.Expr | None = None
) -> pl.DataFrame:
    """The findings slices of ``df``: rank, track (:data:`FINDING_TRACKS` [``track``], followed by
    ``lane`` where given: one track per stream, so that slices on a track never overlap), name,
    start_ns, end_ns (epoch ns, Int64)."""
    head = pl.lit(FINDING_TRACKS[track])
    return df.select(
        pl.col("rank").cast(pl.Int64),
        (head if lane is None else pl.concat_str(head, pl.lit(", "), lane)).alias("track"),
        name.alias("name"),
        start.cast(pl.Int64).alias("start_ns"),
        end.cast(pl.Int64).alias("end_ns"),
    )


def _idle_gaps(store: Store, run_id: int) -> pl.DataFrame:
    """Each GPU stream's idle gaps of :data:`MIN_IDLE_NS` or more, named by cause (``idle``'s rule:
    ``traceprof.analyses.idle.classify_gaps``, default threshold)."""
    from traceprof.analyses import idle
    from traceprof.engine.activity import activity

    empty = _spans(
        pl.DataFrame(schema={"rank": pl.Int64, "n": pl.String, "t": pl.Int64}),
        1,
        pl.col("n"),
        pl.col("t"),
        pl.col("t"),
    )
    try:
        act = activity(store, run_id, detail=True).filter(
            pl.col("kind").is_in(["kernel", "memcpy", "memset"])
        )
    except TraceprofError:
        return empty
    if act.is_empty():
        return empty
    g = idle.classify_gaps(act, idle.Params().kernel_wait_ns, hta=False)
    g = g.filter(pl.col("category").is_not_null() & (pl.col("gap_ns") >= MIN_IDLE_NS))
    cause = pl.concat_str(pl.lit("idle: "), pl.col("category").str.replace("_", " "))
    lane = pl.concat_str(
        pl.lit("dev "),
        pl.col("device").cast(pl.String).fill_null("?"),
        pl.lit(" stream "),
        pl.col("stream").cast(pl.String),
    )
    return _spans(g, 1, cause, pl.col("start_ns") - pl.col("gap_ns"), pl.col("start_ns"), lane)
