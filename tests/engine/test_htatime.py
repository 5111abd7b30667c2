"""``hta=true`` rounds times as HTA 0.5.0 does: its float64 microseconds, then inward to whole us.

HTA reads ``ts``/``dur`` as float64; at epoch microseconds (~1.7e15, in [2^50, 2^51)) doubles are
0.25 us apart, so its start of ``1712195495519689.047`` is 1712195495519689.0 (not .047) before it
rounds up (``traceprof.engine.htatime``).
"""

from __future__ import annotations

import random

import duckdb
import pytest

from tests.conftest import analyze
from traceprof.engine.htatime import end_ns_sql, float_us_sql, start_ns_sql
from traceprof.ingest.ingest import ingest

#: Epoch microseconds of the corpus' ns_resolution_trace (Apr 2024): doubles 0.25 us apart there.
EPOCH_US = 1_712_195_495_519_000


def _texts() -> list[str]:
    """Decimal us texts with 3 decimals: epoch-sized (every ns value of a few us, and random ones),
    halfway points of doubles (.125, .375: ties to even), small and negative relative times, and
    values around 2^53 ns (where the SQL switches method)."""
    rnd = random.Random(6)
    ns = [EPOCH_US * 1000 + i for i in range(0, 4000, 7)]
    ns += [rnd.randrange(10**17, 9 * 10**18) for _ in range(3000)]
    ns += [EPOCH_US * 1000 + k * 125 for k in range(64)]
    ns += [rnd.randrange(-(10**12), 10**12) for _ in range(1000)]
    ns += [2**53 + d for d in range(-3000, 3000, 37)]
    return [f"{'-' if n < 0 else ''}{abs(n) // 1000}.{abs(n) % 1000:03d}" for n in ns]


def test_float_us_is_the_double_a_json_parser_reads():
    # float(text) is the correctly rounded double of the decimal text, as json.loads (HTA) reads it;
    # the SQL sees the same value as integer ns
    texts = _texts()
    ns = [int(t.replace(".", "")) for t in texts]
    got = duckdb.sql(
        f"SELECT {float_us_sql('x')} AS f FROM (SELECT unnest($ns::BIGINT[]) AS x)", params={"ns": ns}
    ).fetchall()
    want = [float(t) for t in texts]
    bad = [(t, g[0], w) for t, g, w in zip(texts, got, want, strict=True) if g[0] != w]
    assert not bad, bad[:5]


def test_start_and_end_round_the_float_inward():
    # shift 0 (an old-style trace: the file's us are epoch us).
    # ts 1712195495519689.047 us: float64 1712195495519689.0 (.047 is nearer .0 than .25), ceil
    #   ...689 (the exact decimal rounds up to ...690); dur 10.000: end float ...699.0, floor ...699.
    # ts ...700.880: float ...701.0 (.88 is 0.12 from 1.0, 0.13 from .75), ceil ...701; dur 5.100:
    #   float sum 706.1 -> nearest double ...706.0 (0.1 from .0, 0.15 from .25), floor ...706
    #   (exact: 705.98 -> 705).
    rows = [(EPOCH_US * 1000 + 689_047, 10_000), (EPOCH_US * 1000 + 700_880, 5_100)]
    got = duckdb.sql(
        f"SELECT {start_ns_sql('ts', '0')}, {end_ns_sql('ts', 'dur', '0')} "
        "FROM (SELECT unnest($ts::BIGINT[]) AS ts, unnest($dur::BIGINT[]) AS dur)",
        params={"ts": [r[0] for r in rows], "dur": [r[1] for r in rows]},
    ).fetchall()
    base = EPOCH_US * 1000
    assert got == [(base + 689_000, base + 699_000), (base + 701_000, base + 706_000)]


def _old_style(folder, kernels: list[tuple[str, str, int]]):
    """A one-rank old-style Kineto trace (epoch us, no baseTimeNanoseconds), written as text so the
    decimals are the file's: per kernel (ts text, dur text, correlation) a kernel on stream 7 and
    its launch 5 us before it (integer us)."""
    events = []
    for ts, dur, corr in kernels:
        events.append(
            f'{{"ph": "X", "cat": "kernel", "name": "k{corr}", "pid": 0, "tid": 7, "ts": {ts}, "dur": {dur}, '
            f'"args": {{"stream": 7, "device": 0, "correlation": {corr}}}}}'
        )
        launch = int(float(ts)) - 5
        events.append(
            f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
            f'"ts": {launch}, "dur": 1, "args": {{"correlation": {corr}}}}}'
        )
    folder.mkdir()
    (folder / "rank0.json").write_text(
        '{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [' + ", ".join(events) + "]}"
    )
    return folder


#: Two compute kernels (epoch us): A at ...689.047 for 10 us, B at ...700.880 for 5.1 us.
KERNELS = [(f"{EPOCH_US + 689}.047", "10.000", 1), (f"{EPOCH_US + 700}.880", "5.100", 2)]


def test_temporal_hta_uses_htas_float_times(store, tmp_path):
    # HTA (test above): A [689, 699), B [701, 706) us -> window 706 - 689 = 17 us, compute 10 + 5
    # = 15, idle 17 - 15 = 2. The exact decimals rounded inward gave A [690, 699), B [701, 705):
    # window 15, compute 13 (before the fix).
    ingest(store, [_old_style(tmp_path / "t", KERNELS)], run="r")
    row = analyze(store, "temporal", "r", hta=True).frame.row(0, named=True)
    assert (row["window_ns"], row["compute_ns"], row["idle_ns"]) == (17_000, 15_000, 2_000)
    # the default mode keeps the exact ns: [689.047, 705.980) us, busy 10 + 5.1
    row = analyze(store, "temporal", "r").frame.row(0, named=True)
    assert (row["window_ns"], row["compute_ns"], row["idle_ns"]) == (16_933, 15_100, 1_833)


def test_micro_trace_matches_hta_itself(store, tmp_path):
    # the same trace through HTA 0.5.0: its temporal breakdown in whole us equals ours in ns
    hta_trace = pytest.importorskip("hta.common.trace", reason="holistictraceanalysis not installed")
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis

    folder = _old_style(tmp_path / "t", KERNELS)
    ingest(store, [folder], run="r")
    t = hta_trace.Trace(trace_dir=str(folder))
    t.load_traces(include_last_profiler_step=False, use_multiprocessing=False)
    theirs = BreakdownAnalysis.get_temporal_breakdown(t, visualize=False).iloc[0]
    row = analyze(store, "temporal", "r", hta=True).frame.row(0, named=True)
    assert row["window_ns"] == theirs["kernel_time(us)"] * 1000 == 17_000
    assert row["idle_ns"] == theirs["idle_time(us)"] * 1000
    assert row["compute_ns"] == theirs["compute_time(us)"] * 1000
