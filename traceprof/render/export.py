"""Export a run as one merged, clock-aligned Chrome/Perfetto trace of all ranks.

Each rank becomes two processes in the viewer: ``rank R`` (its CPU threads) and ``rank R GPU``
(its streams). Timestamps are the store's aligned ns, written as microseconds relative to the run's
first event (3 decimals, so no precision is lost), so ranks line up on one time axis.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from traceprof.core.classify import VALID_SQL
from traceprof.core.fileio import write_output
from traceprof.storage.store import Store

__all__ = ["export_perfetto"]

_GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_user_annotation", "sync")


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


def export_perfetto(store: Store, run: str | None, output: str | Path) -> int:
    """Write run ``run`` as Chrome trace JSON (gzipped when ``output`` ends in ``.gz``).

    Reads events (kind, name, cat, ts_ns, dur_ns, pid, tid, device, stream, args) of every rank. One
    process per rank for its CPU threads and one for its GPUs, with a track per (device, stream).
    Records flagged at ingest as suspect (``events.flag``: before their launch, unset or far-off
    times, unmatched ``B``) are left out, as in the analyses; clipped overruns are written clipped.

    Returns:
        The number of trace events written.

    Raises:
        StoreError: No such run.
        UsageError: ``output`` cannot be written.
    """
    run_id = store.resolve_run(run)
    t0 = (
        store.sql(f"SELECT min(ts_ns) AS t0 FROM events e WHERE run_id = ? AND {VALID_SQL}", [run_id])["t0"][
            0
        ]
        or 0
    )
    rel = store.con.sql(
        f"""
        SELECT rank, kind, name, cat, ts_ns - {int(t0)} AS ts, dur_ns, tid, device, stream, args
        FROM events e WHERE run_id = {int(run_id)} AND kind NOT IN ('counter') AND {VALID_SQL}
        ORDER BY rank, ts_ns
        """
    )
    out: list[bytes] = []
    ranks: set[int] = set()
    n = 0
    reader = rel.to_arrow_reader(200_000)
    for batch in reader:
        cols = batch.to_pydict()
        for rank, kind, name, cat, ts, dur, tid, device, stream, args in zip(
            cols["rank"],
            cols["kind"],
            cols["name"],
            cols["cat"],
            cols["ts"],
            cols["dur_ns"],
            cols["tid"],
            cols["device"],
            cols["stream"],
            cols["args"],
            strict=True,
        ):
            gpu = kind in _GPU_KINDS
            pid = rank * 2 + (1 if gpu else 0)
            lane = _track(kind, device, stream, tid) if gpu else str(tid)
            ranks.add(rank)
            ev = {
                "ph": "X" if kind != "instant" else "i",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": lane,
                "ts": round(ts / 1000, 3),
                "dur": round(dur / 1000, 3),
            }
            if kind == "instant":
                ev["s"] = "t"
                del ev["dur"]
            out.append(orjson.dumps(ev)[:-1] + b',"args":' + (args or "{}").encode() + b"}")
            n += 1
    meta = []
    for r in sorted(ranks):
        meta.append({"ph": "M", "name": "process_name", "pid": r * 2, "args": {"name": f"rank {r}"}})
        meta.append({"ph": "M", "name": "process_name", "pid": r * 2 + 1, "args": {"name": f"rank {r} GPU"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": r * 2, "args": {"sort_index": r * 2}})
        meta.append(
            {"ph": "M", "name": "process_sort_index", "pid": r * 2 + 1, "args": {"sort_index": r * 2 + 1}}
        )
    body = b",\n".join([orjson.dumps(m) for m in meta] + out)
    data = b'{"displayTimeUnit": "ns", "traceEvents": [\n' + body + b"\n]}\n"
    write_output(output, gzip.compress(data, 6) if str(output).endswith(".gz") else data)
    return n
