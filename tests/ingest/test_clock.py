"""Clock alignment: offsets from collective end times, applied only when robustly non-zero."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import SAMPLES, analyze
from traceprof.ingest.clock import estimate_offsets
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

SHIFT_NS = 5_000_000  # +5 ms on rank 1's clock


def test_estimate_recovers_offsets_despite_one_sided_delays():
    # 3 ranks, 20 collectives completing at t_k = 1 ms * k on a true clock. Rank 1's clock reads
    # +2 ms, rank 2's -0.7 ms. Recorded end = t_k + clock offset + delay, where the delay is >= 0
    # (descheduled process): rank 0 records 300 us late on every 4th instance, rank 2 on every
    # 3rd, rank 1 on every 5th by 1 ms. The 10th percentile of (end - earliest end) ignores these,
    # so the estimates are exactly -(clock offset) relative to rank 0: 0, -2 ms, +0.7 ms.
    clock = {0: 0, 1: 2_000_000, 2: -700_000}
    rows = []
    for k in range(20):
        t = 1_000_000 * k + 10**18
        rows.append((k, 0, t + clock[0] + (300_000 if k % 4 == 0 else 0)))
        rows.append((k, 1, t + clock[1] + (1_000_000 if k % 5 == 0 else 0)))
        rows.append((k, 2, t + clock[2] + (300_000 if k % 3 == 0 else 0)))
    ends = pl.DataFrame(rows, schema=["instance_id", "rank", "end_ns"], orient="row")
    est = estimate_offsets(ends)
    assert est["estimate_ns"].to_list() == [0, -2_000_000, 700_000]
    # Both offsets are far above the noise, so both are applied.
    assert est["offset_ns"].to_list() == [0, -2_000_000, 700_000]


def test_offsets_decades_apart_are_exact():
    # Rank 1 records on a clock that starts at its capture (an Nsight export without a session start
    # time): its ends read t_k - 10**18 + 7001 for ends t_k on rank 0's epoch clock, so its offset
    # is 10**18 - 7001 exactly. Rank 2 shares rank 0's clock plus 3 ms and ends 1 us late on every
    # 2nd instance. float64 holds epoch ns only to 256 ns: the estimate must never see them as floats.
    rows = []
    for k in range(9):
        t = 10**18 + 1_000_000 * k + 123
        rows += [(k, 0, t), (k, 1, t - 10**18 + 7_001), (k, 2, t + 3_000_000 + (1_000 if k % 2 else 0))]
    est = estimate_offsets(pl.DataFrame(rows, schema=["instance_id", "rank", "end_ns"], orient="row"))
    assert est["estimate_ns"].to_list() == [0, 10**18 - 7_001, -3_000_000]
    assert est["offset_ns"].to_list() == [0, 10**18 - 7_001, -3_000_000]


def test_small_estimate_is_not_applied():
    # Two ranks on one clock whose ends differ by 0..60 us at random: the estimate is tiny and
    # below the 50 us floor, so nothing moves.
    rng = np.random.default_rng(0)
    rows = []
    for k in range(12):
        t = 10**18 + 10_000_000 * k
        rows += [(k, 0, t + int(rng.integers(0, 60_000))), (k, 1, t + int(rng.integers(0, 60_000)))]
    est = estimate_offsets(pl.DataFrame(rows, schema=["instance_id", "rank", "end_ns"], orient="row"))
    assert est["offset_ns"].to_list() == [0, 0]
    assert abs(est["estimate_ns"][1]) < 60_000


def test_even_count_median_is_the_floor_of_the_mean_of_the_two_middle_values():
    # Two instances, ending at t and t + 1 ms on rank 0's clock; rank 1's clock reads about 2 ms
    # less: its ends are 2,000,004 and 2,000,001 ns earlier. Differences end_1 - end_0 = -2,000,004
    # and -2,000,001; the shortest window holding a third of 2 values holds both (an even count):
    # its integer median is the floor of their mean, floor(-2,000,002.5) = -2,000,003, so the offset
    # is +2,000,003 (the upper middle would give 2,000,001, the lower 2,000,004).
    # Residuals after that correction: rank 1 ends 1 ns before rank 0 at the first instance (spreads:
    # rank 0 1, rank 1 0) and 2 ns after at the second (rank 0 0, rank 1 2): medians floor(1 / 2) = 0
    # and floor(2 / 2) = 1. 2,000,003 >= 50 us (and > 2 x the residuals): applied.
    t = 10**18
    rows = [(1, 0, t), (1, 1, t - 2_000_004), (2, 0, t + 1_000_000), (2, 1, t + 1_000_000 - 2_000_001)]
    est = estimate_offsets(pl.DataFrame(rows, schema=["instance_id", "rank", "end_ns"], orient="row"))
    assert est["estimate_ns"].to_list() == [0, 2_000_003]
    assert est["offset_ns"].to_list() == [0, 2_000_003]
    assert est["residual_ns"].to_list() == [0, 1]


@pytest.mark.parametrize(
    ("gains", "estimate"),
    [
        # g3 variant clock_offset_3ms/drift_five_steps: rank 1 is 3 ms ahead and gains 1 us per
        # 100 ms step over 5 steps: end_1 - end_0 = 3,000,000 + 1000 k. Every window of
        # ceil(5 / 3) = 2 values is 1000 ns wide; the median (= midrange) of all is 3,002,000 (the
        # first window alone would give 3,000,500).
        ([0, 1000, 2000, 3000, 4000], -3_002_000),
        # three instances drifting 50 ns each: median 3,000,050 (the first window: 3,000,025)
        ([0, 50, 100], -3_000_050),
        # four: the floor of the mean of the two middle values, 3,000,015
        ([0, 10, 20, 30], -3_000_015),
        # two separate exact clusters (ties that do not overlap): the first, not their middle
        ([0, 0, 0, 100, 100, 100], -3_000_000),
    ],
)
def test_steady_drift_takes_the_median_of_the_tied_windows(gains, estimate):
    t = 10**18
    rows = []
    for k, g in enumerate(gains):
        end = t + 100_000_000 * k
        rows += [(k, 0, end), (k, 1, end + 3_000_000 + g)]
    est = estimate_offsets(pl.DataFrame(rows, schema=["instance_id", "rank", "end_ns"], orient="row"))
    assert est["estimate_ns"].to_list() == [0, estimate]
    assert est["offset_ns"].to_list() == [0, estimate]


def _copy_run(src: Path, dst: Path, shift_rank: int | None = None) -> Path:
    """Copy the Kineto traces and sidecars of a sample run; shift one rank's clock by moving its
    baseTimeNanoseconds (every event of a new-style trace is base + ts, so all move exactly)."""
    dst.mkdir(parents=True)
    for f in sorted(src.glob("rank*.meta.json")):
        shutil.copy(f, dst / f.name)
    for f in sorted(src.glob("rank*.trace.json.gz")):
        # each copy's own content (its folder's name in traceName): one ingest reads a file of the
        # same content as another once (copies of one run in two folders would be one run's files)
        doc = json.loads(gzip.decompress(f.read_bytes())) | {"traceName": str(dst / f.name)}
        if f.name == f"rank{shift_rank}.trace.json.gz":
            doc["baseTimeNanoseconds"] += SHIFT_NS
        (dst / f.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


def _offsets(store, run: str) -> dict[int, int]:
    df = store.sql(
        "SELECT t.rank, t.clock_offset_ns FROM traces t JOIN runs r USING (run_id) WHERE r.name = ?", [run]
    )
    return dict(df.iter_rows())


def test_shifted_rank_is_realigned_and_verdict_unchanged(store, tmp_path):
    src = SAMPLES / "straggler_rank2"
    if not (src / "rank1.trace.json.gz").exists():
        pytest.skip("sample_traces/straggler_rank2 not recorded")
    _copy_run(src, tmp_path / "orig")
    _copy_run(src, tmp_path / "shifted", shift_rank=1)
    _copy_run(src, tmp_path / "raw", shift_rank=1)
    ingest(store, [tmp_path / "orig", tmp_path / "shifted"])
    raw = Store(tmp_path / "raw.duckdb")  # the same files: a second store, not a re-ingest
    ingest(raw, [tmp_path / "raw"], align=False)
    # One host, one clock: nothing is applied to the recorded run.
    assert _offsets(store, "orig") == {0: 0, 1: 0, 2: 0, 3: 0}
    # The shifted rank is moved back by 5 ms (within 50 us), the others stay.
    off = _offsets(store, "shifted")
    assert abs(off[1] + SHIFT_NS) <= 50_000, off
    assert off[0] == off[2] == off[3] == 0
    # Its steps are back where the recorded run has them (plain SQL on both runs).
    d = store.sql(
        """SELECT max(abs(s.cpu_start_ns - o.cpu_start_ns)) AS d FROM steps s
           JOIN runs rs ON rs.run_id = s.run_id AND rs.name = 'shifted'
           JOIN steps o ON o.rank = s.rank AND o.step = s.step
           JOIN runs ro ON ro.run_id = o.run_id AND ro.name = 'orig'"""
    )["d"][0]
    assert d <= 50_000
    aligned = store.sql("SELECT name, clock_aligned FROM runs ORDER BY name")
    assert dict(aligned.iter_rows()) == {"orig": True, "shifted": True}
    # --no-align keeps the recorded (shifted) clock: rank 1's steps are 5 ms later than rank 0's
    # by more than in the recorded run.
    assert _offsets(raw, "raw") == {0: 0, 1: 0, 2: 0, 3: 0}
    assert raw.sql("SELECT clock_aligned FROM runs")["clock_aligned"].to_list() == [False]
    raw_starts = dict(
        raw.sql("SELECT rank, min(cpu_start_ns) FROM steps WHERE rank IN (0, 1) GROUP BY rank").iter_rows()
    )
    orig_starts = dict(
        store.sql(
            "SELECT s.rank, min(s.cpu_start_ns) FROM steps s JOIN runs r USING (run_id) WHERE r.name = 'orig' "
            "AND s.rank IN (0, 1) GROUP BY s.rank"
        ).iter_rows()
    )
    assert (raw_starts[1] - raw_starts[0]) - (orig_starts[1] - orig_starts[0]) == SHIFT_NS
    raw.close()
    # The verdict does not depend on the shift once aligned.
    verdicts = {
        run: analyze(store, "stragglers", run).verdict["rank"].to_list() for run in ("orig", "shifted")
    }
    assert verdicts["orig"] == verdicts["shifted"] == [2]
