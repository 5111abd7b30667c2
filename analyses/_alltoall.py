"""All-to-all load per peer (expert parallelism): a helper of ``traceprof.analyses.parallelism``.

Algorithm:
  1. Rows: the all-to-all(-v) collectives (``op`` all_to_all...) of one source (the one with the
     most such rows that know their size), each in its matched instance (``instance_id``; a row no
     other rank matched is an instance of its own).
  2. Sent per peer: the row's ``bytes_in`` split over the members of its group (sorted ranks, the
     group-rank order) in proportion to its recorded ``split_in`` (Kineto ``In split size``, gloo
     ``input_split_sizes``: first-dimension sizes), integer bytes (floor); without recorded sizes
     (``[]`` or unknown) an even split, and the instance says ``even``. The chunk a rank keeps for
     itself counts: it is work for its own experts.
  3. Load per rank: sent = what it sends in all; received = what the present ranks send to it.
     Per instance: max, mean, max/mean and the Gini coefficient of each load, G = (2 Σ i·x_(i)) /
     (n Σ x) − (n + 1)/n over the loads sorted ascending (i = 1..n; 0 = even, (n−1)/n = one rank
     gets everything); n log n.
  4. Wait: Σ over ranks of (last arrival − own arrival) (``matching.ARRIVAL_SQL``); transfer =
     median over ranks of (end − last arrival); the imbalance costs transfer × (1 − mean/max) of
     the received load: the time beyond what the mean load would take if the transfer time
     follows the most loaded rank.
  5. Index: the k-th all-to-all instance of its step (by first arrival), i.e. the layer or call
     site it belongs to; the matrix sums the bytes per (rank, peer) over all instances.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceprof.analyses import _common
from traceprof.analyses._mesh import Mesh

__all__ = ["A2A", "alltoall", "matrix", "gini", "INSTANCE_COLUMNS", "PEER_COLUMNS", "MATRIX_COLUMNS"]

INSTANCE_COLUMNS = {
    "instance": "collective_instances.instance_id; negative: a row no other rank matched",
    "step": "run step",
    "index": "k-th all-to-all of the step (its layer or call site), from 0",
    "axis": "the group's axis label",
    "ranks": "ranks present",
    "bytes": "bytes sent in all",
    "splits": "recorded (split sizes) or even (none recorded: an even split assumed)",
    "send_max_bytes": "largest bytes sent by one rank",
    "send_mean_bytes": "mean bytes sent per rank",
    "send_max_mean": "send_max_bytes / send_mean_bytes",
    "send_gini": "Gini of the bytes sent per rank",
    "recv_max_bytes": "largest bytes received by one rank",
    "recv_mean_bytes": "mean bytes received per rank",
    "recv_max_mean": "recv_max_bytes / recv_mean_bytes",
    "recv_gini": "Gini of the bytes received per rank",
    "wait_ns": "sum over ranks of last arrival - own arrival",
    "transfer_ns": "median over ranks of end - last arrival",
    "imbalance_ns": "transfer_ns x (1 - recv mean / recv max)",
}
PEER_COLUMNS = {
    "instance": "instance",
    "rank": "sending rank",
    "peer": "receiving rank",
    "bytes": "bytes sent",
}
_TYPES: dict[str, Any] = {
    "axis": pl.Utf8,
    "ranks": pl.List(pl.Int64),
    "splits": pl.Utf8,
    "send_mean_bytes": pl.Float64,
    "send_max_mean": pl.Float64,
    "send_gini": pl.Float64,
    "recv_mean_bytes": pl.Float64,
    "recv_max_mean": pl.Float64,
    "recv_gini": pl.Float64,
}
MATRIX_COLUMNS = {
    "rank": "sending rank",
    "peer": "receiving rank",
    "bytes": "bytes over all instances",
    "mib": "the same in MiB",
}


@dataclass(frozen=True)
class A2A:
    """The all-to-all tables (empty without all-to-alls) and notes."""

    instances: pl.DataFrame = field(default_factory=pl.DataFrame)
    peers: pl.DataFrame = field(default_factory=pl.DataFrame)
    notes: tuple[str, ...] = ()


def gini(values: list[int] | list[float]) -> float:
    """Gini coefficient of non-negative ``values`` (module doc, step 3); 0.0 for an empty or all-zero list."""
    x = sorted(float(v) for v in values)
    n, total = len(x), sum(x)
    if n == 0 or total <= 0:
        return 0.0
    return 2.0 * sum((i + 1) * v for i, v in enumerate(x)) / (n * total) - (n + 1) / n


def _members(text: str | None, present: list[int]) -> list[int]:
    if text:
        try:
            v = json.loads(text)
            if isinstance(v, list) and v:
                return sorted(int(x) for x in v)
        except ValueError:
            pass
    return sorted(present)


def _sends(bytes_in: int | None, split: str | None, members: list[int]) -> tuple[list[int], bool]:
    """Bytes to each member (step 2) and whether split sizes were recorded."""
    n = len(members)
    if bytes_in is None or n == 0:
        return [0] * n, False
    sizes = json.loads(split) if split else []
    if isinstance(sizes, list) and len(sizes) == n and sum(sizes) > 0:
        total = sum(sizes)
        return [bytes_in * s // total for s in sizes], True
    return [bytes_in // n] * n, bool(split == "[]")


def alltoall(rows: pl.DataFrame, mesh: Mesh) -> A2A:
    """The all-to-all tables of a run's labelled collectives rows (module doc).

    Args:
        rows: ``parallelism``'s rows: rank, source, op, bytes_in, split_in, members (JSON list or
            null), axis, instance_id, step, arrival_ns, end_ns.
        mesh: The run's mesh (unused beyond the labels already on the rows).
    """
    a2a = rows.filter(pl.col("op").fill_null("").str.starts_with("all_to_all"))
    if a2a.is_empty():
        return A2A(
            pl.DataFrame(schema={k: _TYPES.get(k, pl.Int64) for k in INSTANCE_COLUMNS}),
            pl.DataFrame(schema={k: pl.Int64 for k in PEER_COLUMNS}),
        )
    src = (
        a2a.group_by("source")
        .agg(pl.col("bytes_in").is_not_null().sum().alias("n"))
        .sort("n", "source", descending=[True, False])["source"][0]
    )
    a2a = (
        a2a.filter(pl.col("source") == src)
        .with_row_index("_row")
        .with_columns(pl.coalesce("instance_id", -(pl.col("_row").cast(pl.Int64) + 1)).alias("instance"))
    )
    present = a2a.group_by("instance").agg(pl.col("rank").unique().sort().alias("_present"))
    a2a = a2a.join(present, on="instance")
    peer_rows: list[tuple[int, int, int, int]] = []
    recorded: dict[int, bool] = {}
    for r in a2a.iter_rows(named=True):
        members = _members(r["members"], [int(x) for x in r["_present"]])
        sends, rec = _sends(r["bytes_in"], r["split_in"], members)
        recorded[r["instance"]] = recorded.get(r["instance"], True) and rec
        peer_rows += [(r["instance"], int(r["rank"]), m, b) for m, b in zip(members, sends, strict=True)]
    peers = pl.DataFrame(
        peer_rows,
        schema={"instance": pl.Int64, "rank": pl.Int64, "peer": pl.Int64, "bytes": pl.Int64},
        orient="row",
    )
    sent = peers.group_by("instance", "rank").agg(pl.col("bytes").sum())
    got = (
        peers.join(
            a2a.select("instance", pl.col("rank").cast(pl.Int64).alias("peer")),
            on=["instance", "peer"],
            how="semi",
        )
        .group_by("instance", pl.col("peer").alias("rank"))
        .agg(pl.col("bytes").sum())
    )
    times = (
        a2a.with_columns(pl.col("arrival_ns").max().over("instance").alias("_last"))
        .group_by("instance")
        .agg(
            pl.col("step").drop_nulls().first(),
            pl.col("axis").first(),
            pl.col("rank").unique().sort().alias("ranks"),
            pl.col("arrival_ns").min().alias("_first"),
            (pl.col("_last") - pl.col("arrival_ns")).sum().alias("wait_ns"),
            _common.whole_ns((pl.col("end_ns") - pl.col("_last")).clip(0).median()).alias("transfer_ns"),
        )
    )
    loads = times.join(
        sent.group_by("instance").agg(pl.col("bytes").alias("_s")), on="instance", how="left"
    ).join(got.group_by("instance").agg(pl.col("bytes").alias("_g")), on="instance", how="left")
    out = []
    for inst in loads.sort("step", "_first", "instance", nulls_last=True).iter_rows(named=True):
        s, g = inst["_s"] or [], inst["_g"] or []
        smax, smean = max(s, default=0), (sum(s) / len(s) if s else 0.0)
        gmax, gmean = max(g, default=0), (sum(g) / len(g) if g else 0.0)
        transfer = inst["transfer_ns"]
        out.append(
            {
                "instance": inst["instance"],
                "step": inst["step"],
                "axis": inst["axis"],
                "ranks": inst["ranks"],
                "bytes": sum(s),
                "splits": "recorded" if recorded[inst["instance"]] else "even",
                "send_max_bytes": smax,
                "send_mean_bytes": smean,
                "send_max_mean": smax / smean if smean else None,
                "send_gini": gini(s),
                "recv_max_bytes": gmax,
                "recv_mean_bytes": gmean,
                "recv_max_mean": gmax / gmean if gmean else None,
                "recv_gini": gini(g),
                "wait_ns": inst["wait_ns"],
                "transfer_ns": transfer,
                "imbalance_ns": round(transfer * (1 - gmean / gmax))
                if transfer is not None and gmax
                else None,
            }
        )
    inst_df = pl.DataFrame(
        out,
        schema_overrides={
            "ranks": pl.List(pl.Int64),
            "step": pl.Int64,
            "imbalance_ns": pl.Int64,
            "transfer_ns": pl.Int64,
            "wait_ns": pl.Int64,
        },
    )
    inst_df = inst_df.with_columns(pl.int_range(pl.len()).over("step").cast(pl.Int64).alias("index"))
    notes = []
    even = inst_df.filter(pl.col("splits") == "even").height
    if even:
        notes.append(
            f"all-to-all: {even} of {inst_df.height} instances record no split sizes: their bytes per peer "
            "assume an even split (Kineto records 'In split size' with NCCL; gloo with the c10d "
            "alltoall_base_ op's concrete inputs)"
        )
    return A2A(inst_df.select(*INSTANCE_COLUMNS), peers.sort("instance", "rank", "peer"), tuple(notes))


def matrix(peers: pl.DataFrame) -> pl.DataFrame:
    """Bytes per (rank, peer) over all instances, with MiB for the heat map (module doc, step 5)."""
    if peers.is_empty():
        return pl.DataFrame(schema={"rank": pl.Int64, "peer": pl.Int64, "bytes": pl.Int64, "mib": pl.Float64})
    return (
        peers.group_by("rank", "peer")
        .agg(pl.col("bytes").sum())
        .with_columns((pl.col("bytes") / 2**20).alias("mib"))
        .sort("rank", "peer")
    )
