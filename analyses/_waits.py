"""Waits at collectives as wall-clock time (for ``stragglers``, ``critical_path`` and ``overlap``).

Not an analysis. A rank's copy of a matched collective instance waits from its own arrival to the
instance's last arrival (``stragglers.per_rank_instance``). Collectives run at the same time (the
buckets of DDP's gradient all-reduce, a tensor- and a data-parallel group): their waits overlap,
and adding them up counts the same wall-clock time once per collective (a rank of the
``straggler_rank2`` sample "waited" 387 ms in a 224 ms window). So:

  1. Wait interval of a copy (:func:`wait_spans`): [own arrival, last arrival), ended at its own
     end when that comes first (an end before the last arrival means a wrong match or clock:
     ``stragglers``' ``end_before_last_arrival``); transfer interval (:func:`transfer_spans`):
     [max(start of its work, last arrival), end). ``critical_path``'s step account splits
     exposed communication with these two.
  2. A rank's wall-clock wait (:func:`wall_waits`): the length of the union of its wait intervals,
     never longer than the time it ran.
  3. The wait a rank caused (:func:`wall_caused`): for each other rank, the union of its wait
     intervals at the instances where this rank arrived last (strictly; a tie credits nobody),
     summed over those waiting ranks: each waiting rank's wall-clock time counted once.
  4. Exposed communication beyond the waits for given ranks (:func:`beyond_waits`): each rank's
     exposed-communication intervals (communication not under compute) minus the part of its
     wait intervals at those ranks' instances that is not transfer of another collective, as
     ``critical_path``'s precedence has it (compute > transfer > memory > wait): with every
     rank's waits given, what is left is the step account's transfer.

Each is one sort and a sweep per rank (``traceprof.engine.intervals``): n log n in the copies.
"""

from __future__ import annotations

import polars as pl

from traceprof.engine import intervals
from traceprof.engine.arrivals import p2p_items
from traceprof.storage.store import Store

__all__ = [
    "last_arrivals",
    "p2p_copies",
    "wait_spans",
    "transfer_spans",
    "wall_waits",
    "wall_caused",
    "wait_only",
    "beyond_waits",
]


def last_arrivals(items: pl.DataFrame) -> pl.DataFrame:
    """Each copy's instance's last arrival and last rank.

    Args:
        items: Copies: instance_id, rank, arrival_ns (not null).

    Returns:
        ``items`` with last_ns (the instance's last arrival) and last_rank (the rank that arrived
        last, null on a tie).
    """
    at_last = pl.col("arrival_ns") == pl.col("last_ns")
    return items.with_columns(pl.col("arrival_ns").max().over("instance_id").alias("last_ns")).with_columns(
        pl.when(at_last.sum().over("instance_id") == 1)
        .then(pl.col("rank").filter(at_last).first().over("instance_id"))
        .alias("last_rank")
    )


def p2p_copies(store: Store, run_id: int, source: str | None = None) -> pl.DataFrame:
    """The copies of the point-to-point pairs (``traceprof.engine.arrivals.p2p_items``: sends and
    recvs matching left unmatched, paired by (group, sender, receiver) and order in the step), with
    last_ns and last_rank: the one
    definition of a point-to-point wait, [own arrival, the peer's arrival) (:func:`wait_spans`),
    read by ``critical_path``'s account, the communication verdict and ``parallelism``'s p2p wait.
    Empty (no columns) when there is no pair."""
    items = p2p_items(store, run_id, source)
    return last_arrivals(items) if items.height else items


def wait_spans(w: pl.DataFrame) -> pl.DataFrame:
    """Each copy's wait interval (module doc, step 1), the copies that waited at all.

    Args:
        w: Copies (``stragglers.per_rank_instance`` rows, or ``stragglers``' ``waits`` with
            last_ns): arrival_ns, last_ns (the instance's last arrival), end_ns (may be null), ns.

    Returns:
        ``w`` with start_ns (= arrival_ns) and end_ns (= min(last_ns, end_ns), last_ns where the
        end is null) replacing its own, rows with end_ns > start_ns only.
    """
    return w.with_columns(
        pl.col("arrival_ns").alias("start_ns"),
        pl.min_horizontal("last_ns", pl.coalesce("end_ns", "last_ns")).alias("end_ns"),
    ).filter(pl.col("end_ns") > pl.col("start_ns"))


def transfer_spans(w: pl.DataFrame) -> pl.DataFrame:
    """Each copy's transfer interval (module doc, step 1), the copies with an end past the last
    arrival.

    Args:
        w: Copies: arrival_ns, last_ns, start_ns (start of its work, may be null), end_ns (may be
            null), ns.

    Returns:
        ``w`` with start_ns = max(start_ns or arrival_ns, last_ns), rows with end_ns > start_ns only.
    """
    return (
        w.filter(pl.col("end_ns").is_not_null())
        .with_columns(pl.max_horizontal(pl.coalesce("start_ns", "arrival_ns"), "last_ns").alias("start_ns"))
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )


def wall_waits(w: pl.DataFrame) -> pl.DataFrame:
    """Each rank's wall-clock wait (module doc, step 2).

    Args:
        w: Copies as for :func:`wait_spans`, with rank.

    Returns:
        Frame rank, wait_ns (int64 ns: the union of its wait intervals); ranks that never waited
        are absent.
    """
    spans = wait_spans(w).select("rank", "start_ns", "end_ns")
    return intervals.union_ns(spans, ["rank"], "wait_ns").with_columns(pl.col("wait_ns").cast(pl.Int64))


def wall_caused(w: pl.DataFrame) -> pl.DataFrame:
    """The wall-clock wait each rank caused the others (module doc, step 3).

    Args:
        w: Copies as for :func:`wait_spans`, with rank and last_rank (the instance's strictly
            last rank, null on a tie).

    Returns:
        Frame rank (the rank waited for), wait_caused_ns (int64 ns: per waiting rank the union of
        its waits at the instances this rank was last at, summed over the waiting ranks); ranks
        nobody waited for are absent.
    """
    spans = wait_spans(w.filter(pl.col("last_rank").is_not_null() & (pl.col("rank") != pl.col("last_rank"))))
    per_pair = intervals.union_ns(
        spans.select("last_rank", "rank", "start_ns", "end_ns"), ["last_rank", "rank"], "w"
    )
    return (
        per_pair.group_by("last_rank")
        .agg(pl.col("w").sum().cast(pl.Int64).alias("wait_caused_ns"))
        .rename({"last_rank": "rank"})
    )


def wait_only(w: pl.DataFrame, waited: pl.Expr, rank_t: pl.DataType) -> pl.DataFrame:
    """The wait intervals of the copies selected by ``waited`` less every copy's transfer
    interval (transfer wins over wait, ``critical_path``'s precedence), as maximal intervals.

    Args:
        w: Copies as for :func:`transfer_spans`, with rank and last_rank.
        waited: Selects the copies whose waits count.
        rank_t: The rank type of the result.

    Returns:
        Frame rank, start_ns, end_ns.
    """
    cols = ["rank", "start_ns", "end_ns"]
    waits = wait_spans(w.filter(waited)).select(cols)
    xfer = transfer_spans(w).select(cols)
    waits, xfer = (f.with_columns(pl.col("rank").cast(rank_t)) for f in (waits, xfer))
    return intervals.subtract(waits, xfer, ["rank"])


def beyond_waits(exposed: pl.DataFrame, w: pl.DataFrame, waited_for: list[int]) -> pl.DataFrame:
    """Each rank's exposed communication beyond its waits for ``waited_for`` (module doc, step 4).

    Args:
        exposed: Exposed-communication intervals (``traceprof.engine.activity.exposed_comm`` by
            ``["rank"]``): rank, start_ns, end_ns (ns).
        w: Copies as for :func:`transfer_spans`, with rank and last_rank; optionally p2p (true:
            a point-to-point pair's copy, :func:`p2p_copies`, whose wait is taken out whoever the
            peer).
        waited_for: The ranks whose instances' waits are taken out (the named stragglers).

    Returns:
        Frame rank, beyond_ns (int64 ns, > 0); ranks with nothing left are absent.
    """
    cols = ["rank", "start_ns", "end_ns"]
    waited = pl.col("last_rank").is_in(waited_for)
    if "p2p" in w.columns:  # a point-to-point wait is always for the peer, never communication's
        waited = waited | pl.col("p2p").fill_null(False)
    waits = wait_only(w, waited, exposed.schema["rank"])
    left = intervals.subtract(exposed.select(cols), waits, ["rank"])
    return left.group_by("rank").agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().cast(pl.Int64).alias("beyond_ns")
    )
