"""_waits: wall-clock waits at collectives that run at the same time, worked by hand."""

from __future__ import annotations

import polars as pl

from traceprof.analyses import _waits


def _copies(rows: list[tuple[int, int, int, int, int | None, int | None, int | None]]) -> pl.DataFrame:
    """Copies (instance_id, rank, arrival_ns, last_ns, last_rank, start_ns, end_ns)."""
    return pl.DataFrame(
        rows,
        schema={
            "instance_id": pl.Int64,
            "rank": pl.Int32,
            "arrival_ns": pl.Int64,
            "last_ns": pl.Int64,
            "last_rank": pl.Int32,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
        orient="row",
    )


# Two DDP buckets (instances 1 and 2) in flight at once on ranks 0 and 1, rank 2 last at both; then
# instance 3, where rank 0 is last, and instance 4, a tie of ranks 1 and 2 (credits nobody).
# (times in ns; arrival = kernel start on GPU ranks, so start_ns = arrival_ns)
COPIES = _copies(
    [
        # inst, rank, arrival, last, last_rank, start, end
        (1, 0, 0, 50, 2, 0, 80),  # waits [0, 50), transfers [50, 80)
        (1, 1, 20, 50, 2, 20, 80),  # waits [20, 50)
        (1, 2, 50, 50, 2, 50, 80),  # the last: no wait
        (2, 0, 10, 90, 2, 10, 100),  # waits [10, 90), transfers [90, 100)
        (2, 1, 30, 90, 2, 30, 100),  # waits [30, 90)
        (2, 2, 90, 90, 2, 90, 100),
        (3, 0, 200, 200, 0, 200, 210),
        (3, 1, 150, 200, 0, 150, 210),  # waits [150, 200)
        (3, 2, 170, 200, 0, 170, 210),  # waits [170, 200)
        (4, 0, 300, 330, None, 300, 340),  # waits [300, 330) for a tie
        (4, 1, 330, 330, None, 330, 340),
        (4, 2, 330, 330, None, 330, 340),
        # a copy that ends before its last arrival (a wrong match or clock): its wait ends at its end
        (5, 0, 400, 450, 1, 400, 420),  # waits [400, 420), not [400, 450)
        (5, 1, 450, 450, 1, 450, 460),
    ]
)


def test_wall_waits_count_concurrent_waits_once():
    # Rank 0: [0, 50) u [10, 90) = [0, 90): 90 ns (a per-instance sum says 50 + 80 = 130), + [300,
    # 330) 30 + [400, 420) 20 = 140 ns. Rank 1: [20, 50) u [30, 90) = [20, 90) 70 + [150, 200) 50 =
    # 120 ns (sum 30 + 60 + 50 = 140). Rank 2: [170, 200) = 30 ns. Rank 1 never waited at 5.
    got = dict(_waits.wall_waits(COPIES).sort("rank").iter_rows())
    assert got == {0: 140, 1: 120, 2: 30}


def test_wall_caused_is_each_waiting_ranks_union_summed():
    # Rank 2 was last at 1 and 2: rank 0's union [0, 90) 90 + rank 1's [20, 90) 70 = 160 ns (a sum
    # of every copy's wait: 50 + 30 + 80 + 60 = 220). Rank 0 was last at 3: 50 + 30 = 80 ns. Rank 1
    # at 5: rank 0's [400, 420) = 20 ns. The tie (instance 4) credits nobody.
    got = dict(_waits.wall_caused(COPIES).sort("rank").iter_rows())
    assert got == {0: 80, 1: 20, 2: 160}


def test_beyond_waits_keeps_the_transfer_under_another_collectives_wait():
    # Rank 0 communicates [0, 100) with no compute: exposed [0, 100). Its waits for rank 2 (instances
    # 1, 2): [0, 90); instance 1 transfers [50, 80) meanwhile, which critical_path counts as transfer
    # (transfer > wait): the wait is [0, 50) u [80, 90). Left: [50, 80) u [90, 100) = 40 ns (the
    # per-instance sum, 130, took it all: 0). Rank 1 exposed [20, 100): waits [20, 90) less
    # transfer [50, 80): left [50, 80) u [90, 100) = 40. Rank 2 waited for nobody named: its
    # exposed [50, 100) stays 50. Rank 0's exposed [300, 340) with its wait for the tie stays 40 too.
    exposed = pl.DataFrame(
        {"rank": [0, 1, 2, 0], "start_ns": [0, 20, 50, 300], "end_ns": [100, 100, 100, 340]},
        schema={"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64},
    )
    got = dict(_waits.beyond_waits(exposed, COPIES, [2]).sort("rank").iter_rows())
    assert got == {0: 40 + 40, 1: 40, 2: 50}
    # waited for rank 0 instead: rank 1's [150, 200) and rank 2's lie outside their exposed time
    got = dict(_waits.beyond_waits(exposed, COPIES, [0]).sort("rank").iter_rows())
    assert got == {0: 140, 1: 80, 2: 50}
