"""memory: peaks per rank, device and step from Kineto [memory] events, Nsight CUDA allocations and
torch's export_memory_timeline; checked against plain SQL and plain Python on the corpus, and on
micro-traces whose allocations and frees are worked by hand in the comments."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from tests.builders import (
    EPOCH,
    Export,
    collective_args,
    kernel,
    launch,
    mem,
    memory_gate_run,
    memory_op,
    memory_trace,
    step,
)
from tests.conftest import analyze, corpus
from traceprof.core.errors import AnalysisError, TraceFormatError, UsageError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

BASE_NS = 1_700_000_000_000_000_000  # tests.builders.kineto's baseTimeNanoseconds
US = 1_000


# Rank 0 drives two devices. Steps: #1 [0, 100) us, #2 [100, 200) us; ops on thread 1:
# aten::linear [10, 40) holding aten::empty [12, 14).
# Device 0 (1,000 bytes at 0xA allocated before the trace; capacity 8,500):
#   t=13  +512  @0x10  -> allocated 1,512  reserved 4,096   (in aten::empty, inside aten::linear)
#   t=20  +2048 @0x20  -> 3,560            4,096   (in aten::linear)            step 1 peak 3,560
#   t=50  -1000 @0xA   -> 2,560            4,096   (a free before its allocation: made before the trace)
#   t=60  -2048 @0x20  ->   512            4,096
#   t=110 +4096 @0x30  -> 4,608            8,192   (no op)                       step 2 and run peak 4,608
#   t=120 -4096 @0x30  ->   512            8,192
#   Peak 4,608 in step 2 at t=110; reserved peak 8,192; cached at the peak 8,192 - 4,608 = 3,584;
#   headroom 8,500 - 8,192 = 308 bytes = 3.62 % (< 5 %: near the limit).
#   Live at the peak: 0x10 (512, aten::empty in aten::linear) and 0x30 (4,096, no op): 4,608, so
#   nothing of the peak was allocated before the trace (0xA's 1,000 were freed at t=50).
# Device 1 (capacity 4,000): t=15 +100 @0x99 -> 100 (reserved 2,048), t=115 +300 @0x98 -> 400 (2,048):
#   peak 400 in step 2; headroom 4,000 - 2,048 = 1,952 = 48.8 %.
# A CPU record (Device Type 0, Device Id -1) is host memory: left out.
EVENTS = [
    step(1, 0, 100),
    step(2, 100, 100),
    memory_op("aten::linear", 10, 30),
    memory_op("aten::empty", 12, 2),
    mem(13, 0, 0x10, 512, 1512, 4096),
    mem(20, 0, 0x20, 2048, 3560, 4096),
    mem(50, 0, 0xA, -1000, 2560, 4096),
    mem(60, 0, 0x20, -2048, 512, 4096),
    mem(110, 0, 0x30, 4096, 4608, 8192),
    mem(120, 0, 0x30, -4096, 512, 8192),
    mem(15, 1, 0x99, 100, 100, 2048),
    mem(115, 1, 0x98, 300, 400, 2048),
    mem(30, -1, 0x5, 10**9, 10**9, 0, dtype=0),
]
CAPS = {0: 8500, 1: 4000}


def _one(df: pl.DataFrame, **eq: object) -> dict:
    for k, v in eq.items():
        df = df.filter(pl.col(k) == v)
    assert df.height == 1, df
    return df.row(0, named=True)


def test_two_devices_peaks_steps_ops_by_hand(store, tmp_path):
    ingest(store, [memory_trace(tmp_path / "r0.json.gz", EVENTS, CAPS)], run="r")
    res = analyze(store, "memory", "r")
    assert res.frame.height == 2  # one series per device; host memory left out
    d0 = _one(res.frame, device=0)
    assert (d0["peak_allocated_bytes"], d0["peak_step"], d0["peak_ts_ns"]) == (4608, 2, BASE_NS + 110 * US)
    assert (d0["peak_reserved_bytes"], d0["cached_at_peak_bytes"]) == (8192, 3584)
    assert (d0["capacity_bytes"], d0["capacity_source"], d0["headroom_bytes"]) == (8500, "trace", 308)
    assert d0["headroom_pct"] == pytest.approx(100 * 308 / 8500) and d0["near_limit"]
    assert d0["peak_exact"] and d0["primary"] and d0["steps"] == 2 and d0["records"] == 6
    d1 = _one(res.frame, device=1)
    assert (d1["peak_allocated_bytes"], d1["peak_step"], d1["headroom_bytes"]) == (400, 2, 1952)
    assert not d1["near_limit"]
    s1 = _one(res.steps, device=0, step=1)
    assert (s1["peak_allocated_bytes"], s1["peak_op"], s1["peak_top_op"]) == (
        3560,
        "aten::linear",
        "aten::linear",
    )
    assert s1["peak_ts_ns"] == BASE_NS + 20 * US and s1["records"] == 4
    s2 = _one(res.steps, device=0, step=2)
    assert (s2["peak_allocated_bytes"], s2["peak_op"], s2["peak_reserved_bytes"]) == (4608, None, 8192)
    live = {
        (r["op"], r["top_op"]): r["live_bytes"]
        for r in res.ops.filter(pl.col("device") == 0).iter_rows(named=True)
    }
    assert live == {
        ("aten::empty", "aten::linear"): 512,
        (None, None): 4096,
    }  # sums to the peak: none from before
    assert res.groups.is_empty()  # one rank
    # a user capacity wins over the trace's: 10 GiB for every device
    big = analyze(store, "memory", "r", capacity_gib=10)
    assert set(big.frame["capacity_source"]) == {"user"}
    assert _one(big.frame, device=0)["headroom_bytes"] == 10 * 2**30 - 8192


def test_missing_totals_are_derived_or_make_the_peak_a_lower_bound(store, tmp_path):
    # Device 0 of EVENTS with t=20 lacking 'Total Allocated': 1,512 + 2,048 = 3,560 (derived, exact).
    ev = [e for e in EVENTS if not (e["name"] == "[memory]" and e["ts"] == 20)]
    derived = [*ev, mem(20, 0, 0x20, 2048, None, 4096)]
    (tmp_path / "a").mkdir()
    ingest(store, [memory_trace(tmp_path / "a" / "r0.json.gz", derived, CAPS)], run="a")
    res = analyze(store, "memory", "a")
    assert _one(res.steps, device=0, step=1)["peak_allocated_bytes"] == 3560
    assert _one(res.frame, device=0)["peak_exact"]
    assert any("1 derived" in n for n in res.notes)
    # The run's peak record (t=110) without 'Total Allocated' nor 'Bytes': the next record's total minus
    # its Bytes gives it back exactly: 512 - (-4,096) = 4,608.
    ev2 = [e for e in EVENTS if not (e["name"] == "[memory]" and e["ts"] in (110, 120))]
    back = [*ev2, mem(110, 0, 0x30, None, None, 8192), mem(120, 0, 0x30, -4096, 512, 8192)]
    (tmp_path / "b").mkdir()
    ingest(store, [memory_trace(tmp_path / "b" / "r0.json.gz", back, CAPS)], run="b")
    d0 = _one(analyze(store, "memory", "b").frame, device=0)
    assert (d0["peak_allocated_bytes"], d0["peak_step"], d0["peak_exact"]) == (4608, 2, True)
    # Without the next total either, t=110 and t=120 are unknown: the peak is a lower bound, 3,560
    # (step 1), flagged with a note, never 4,608 guessed nor 512 + 0.
    unknown = [*ev2, mem(110, 0, 0x30, None, None, 8192), mem(120, 0, 0x30, -4096, None, 8192)]
    (tmp_path / "c").mkdir()
    ingest(store, [memory_trace(tmp_path / "c" / "r0.json.gz", unknown, CAPS)], run="c")
    res = analyze(store, "memory", "c")
    d0 = _one(res.frame, device=0)
    assert (d0["peak_allocated_bytes"], d0["peak_step"], d0["peak_exact"]) == (3560, 1, False)
    assert (
        not _one(res.steps, device=0, step=2)["peak_exact"]
        and _one(res.steps, device=0, step=1)["peak_exact"]
    )
    assert _one(res.steps, device=0, step=2)["peak_allocated_bytes"] is None
    assert any("lower bounds" in n and "2 unknown" in n for n in res.notes)


def test_bad_values_are_notes_not_numbers(store, tmp_path):
    # 'Total Allocated' as text and as a float are not integers: treated as missing and derived from the
    # previous total and Bytes (1,512 + 2,048 = 3,560, 3,560 - 1,000 = 2,560), never read as 3561 or 2.56e3.
    ev = [e for e in EVENTS if not (e["name"] == "[memory]" and e["ts"] in (20, 50))]
    bad = [
        *ev,
        mem(20, 0, 0x20, 2048, "3561", 4096),
        mem(50, 0, 0xA, -1000, 2560.5, 4096),
        mem(70, None, 0x1, 5, 5, 5),
    ]  # no Device Id: left out with a note
    ingest(store, [memory_trace(tmp_path / "r0.json.gz", bad, CAPS)], run="r")
    res = analyze(store, "memory", "r")
    assert _one(res.steps, device=0, step=1)["peak_allocated_bytes"] == 3560
    assert any("2 Kineto memory record(s) without a usable 'Total Allocated'" in n for n in res.notes)
    assert any("without a usable 'Device Id'" in n for n in res.notes)


def test_no_memory_records_is_an_error(store, tmp_path):
    ingest(
        store, [memory_trace(tmp_path / "r0.json.gz", [step(1, 0, 10), memory_op("aten::mm", 1, 2)])], run="r"
    )
    with pytest.raises(AnalysisError, match="profile_memory=True"):
        analyze(store, "memory", "r")


@pytest.mark.parametrize(
    "given, match",
    [
        ({"capacity_gib": 0}, "capacity_gib"),
        ({"capacity_gib": "abc"}, "capacity_gib"),
        ({"capacity_bytes": "1.5"}, "capacity_bytes"),
        ({"capacity_bytes": -4}, "capacity_bytes"),
        ({"capacity_gib": 1, "capacity_bytes": 5}, "not both"),
        ({"points": -1}, "points"),
    ],
)
def test_bad_params(given, match):
    from traceprof.analyses.memory import Params

    with pytest.raises(UsageError, match=match):
        Params(**given)


# --- corpus ---------------------------------------------------------------------------------------


def test_df_index_resolver_peak_equals_plain_sql(store):
    ingest(store, [corpus("hta/df_index_resolver/df_index_resolver.json.gz")], run="dfi")
    # Plain SQL over the stored [memory] events: the largest Total Allocated of the accelerator's records
    # and the step of the first record that reaches it.
    sql = """
        WITH m AS (SELECT rank, ts_ns, step, json_extract(args, '$."Device Id"')::INT AS device,
                          json_extract(args, '$."Total Allocated"')::BIGINT AS a,
                          json_extract(args, '$."Total Reserved"')::BIGINT AS r
                   FROM events WHERE name = '[memory]' AND json_extract(args, '$."Device Type"')::INT <> 0)
        SELECT rank, device, max(a), arg_min(step, ts_ns) FILTER (WHERE a = (SELECT max(a) FROM m)), max(r), count(*)
        FROM m GROUP BY ALL"""
    ((rank, device, peak, peak_step, reserved, records),) = store.sql(sql).rows()
    assert (peak, peak_step, reserved, records) == (
        6_629_508_096,
        2,
        12_782_141_440,
        26_770,
    )  # read once, by hand
    res = analyze(store, "memory", "dfi")
    r = _one(res.frame, rank=rank, device=device)
    assert (r["peak_allocated_bytes"], r["peak_step"], r["peak_reserved_bytes"], r["records"]) == (
        peak,
        peak_step,
        reserved,
        records,
    )
    per_step = store.sql("""SELECT step, max(json_extract(args, '$."Total Allocated"')::BIGINT) FROM events
                            WHERE name = '[memory]' AND json_extract(args, '$."Device Type"')::INT = 1
                            GROUP BY step ORDER BY step""").rows()
    assert res.steps.select("step", "peak_allocated_bytes").rows() == per_step
    cap = store.sql("SELECT memory_bytes FROM devices WHERE device = ?", [device]).item()
    assert r["capacity_bytes"] == cap == 34_089_730_048
    assert r["headroom_bytes"] == cap - reserved
    # the ops table sums to the peak
    assert res.ops.filter(pl.col("device") == device)["live_bytes"].sum() == peak
    # headroom_pct is the correctly rounded 100 * headroom / capacity (Python's float division) in
    # every row: polars' division gave 62.504421648390526 (one bit over) in some runs, not others
    for frame in (res.frame, res.steps):
        got = frame.select("headroom_bytes", "capacity_bytes", "headroom_pct").rows()
        assert [p for _, _, p in got] == [100.0 * h / c for h, c, _ in got]
    # ops of equal live bytes come in op order (they came in the group_by's order, not the same each run)
    ops = res.ops.rows(named=True)
    tied = [
        (a["op"], b["op"])
        for a, b in zip(ops, ops[1:], strict=False)
        if all(a[k] == b[k] for k in ("rank", "device", "source", "live_bytes"))
    ]
    assert tied and all(x <= y for x, y in tied)


def test_memory_analysis_categories_equal_plain_python(store):
    path = corpus("hta/memory_analysis/memory_timeline.raw.gz")
    ingest(store, [path], run="mt")
    # Plain Python: apply the entries in file order, keep the state after the last entry of each
    # timestamp (preexisting entries at t = -1 first), take the first largest total.
    entries = json.loads(gzip.decompress(path.read_bytes()))
    names = [
        "parameter",
        "optimizer_state",
        "input",
        "temporary",
        "activation",
        "gradient",
        "autograd_detail",
        "unknown",
    ]
    totals, best, at = [0] * 8, None, None
    for i, (t, _action, nbytes, cat) in enumerate(entries):
        totals[cat] += nbytes
        if (i + 1 == len(entries) or entries[i + 1][0] != t) and (best is None or sum(totals) > sum(best)):
            best, at = list(totals), t
    res = analyze(store, "memory", "mt")
    row = res.categories.row(0, named=True)
    assert {n: row[f"{n}_bytes"] for n in names} == dict(zip(names, best, strict=True))
    assert (row["total_bytes"], row["peak_ts_ns"]) == (sum(best), at)
    assert row["activation_bytes"] == 2_592_465_920  # read once: most of the peak is activations
    assert _one(res.frame, source="memory_timeline")["peak_allocated_bytes"] == sum(best) == 3_082_832_104


# --- export_memory_timeline micro files ------------------------------------------------------------


def test_memory_timeline_raw_and_coalesced_by_hand(store, tmp_path):
    # raw entries [t, action, bytes, category] (t in ns):
    #   preexisting parameter 100 (t=-1, stored at the first time, 1,000)
    #   1,000 create activation +50; 1,000 create unknown +8     -> totals: param 100, act 50, unk 8 = 158
    #   2,000 increment_version: activation -50 / gradient +50  -> 158 (never 208: one timestamp)
    #   3,000 create temporary +40                                -> 198 (peak: param 100, grad 50, tmp 40, unk 8)
    #   4,000 destroy temporary -40                               -> 158
    raw = [
        [-1, 1, 100, 0],
        [1000, 2, 50, 4],
        [1000, 2, 8, 7],
        [2000, 3, -50, 4],
        [2000, 3, 50, 5],
        [3000, 2, 40, 3],
        [4000, 4, -40, 3],
    ]
    d = tmp_path / "raw"
    d.mkdir()
    (d / "rank2_cuda1.raw.json.gz").write_bytes(gzip.compress(json.dumps(raw).encode()))
    ingest(store, [d], run="raw")
    row = analyze(store, "memory", "raw").categories.row(0, named=True)
    assert (row["rank"], row["device"], row["peak_ts_ns"], row["total_bytes"]) == (2, 1, 3000, 198)
    assert (
        row["parameter_bytes"],
        row["gradient_bytes"],
        row["temporary_bytes"],
        row["unknown_bytes"],
        row["activation_bytes"],
    ) == (100, 50, 40, 8, 0)
    # The coalesced form of the same timeline: times in us, sizes [0, parameter, ..., unknown] after each time.
    sizes = [
        [0, 100, 0, 0, 0, 50, 0, 0, 8],
        [0, 100, 0, 0, 0, 0, 50, 0, 8],
        [0, 100, 0, 0, 40, 0, 50, 0, 8],
        [0, 100, 0, 0, 0, 0, 50, 0, 8],
    ]
    c = tmp_path / "co"
    c.mkdir()
    (c / "rank2_cuda1.json").write_text(json.dumps([[1, 2, 3, 4], sizes]))
    ingest(store, [c], run="co")
    row2 = analyze(store, "memory", "co").categories.row(0, named=True)
    assert {k: v for k, v in row2.items()} == {**row, "peak_ts_ns": 3000}


@pytest.mark.parametrize(
    "entry, why",
    [
        ([5, 9, 1, 0], "action 9"),
        ([5, 2, 1, 8], "category 8"),
        ([5, 2, 1.5, 0], "not an integer"),
        ([5, 2, 1], "four values"),
        ([-7, 2, 1, 0], "negative time"),
        ([5, 4, 10, 0], "wrong sign"),
    ],
)
def test_memory_timeline_bad_entry_names_it(store, tmp_path, entry, why):
    f = tmp_path / "rank0.raw.json.gz"
    f.write_bytes(gzip.compress(json.dumps([[1, 2, 3, 0], entry]).encode()))
    with pytest.raises(TraceFormatError, match=rf"entry #1 .*{why}"):
        ingest(store, [f], run="r")
    assert store.sql("SELECT count(*) FROM traces").item() == 0
    ingest(store, [f], run="r", on_bad_event="skip")
    assert store.sql("SELECT events_kept, events_rejected FROM traces").rows() == [(1, 1)]


def test_memory_timeline_device_beyond_int32_is_refused(store, tmp_path):
    # The device comes from the file name; the view reads it as INTEGER, so cuda2147483648 would be
    # a silent NULL device: refused in one line naming the file (2**31 - 1 is the largest int32).
    for dev, ok in ((2**31 - 1, True), (2**31, False), (10**20, False)):
        f = tmp_path / f"rank0_cuda{dev}.raw.json"
        f.write_text(json.dumps([[1000, 2, dev % 97 + 1, 0]]))  # other bytes: another file
        if ok:
            ingest(store, [f], run=f"d{dev}")
            continue
        with pytest.raises(
            TraceFormatError, match=rf"{f.name}: device {dev} in the file name \(cuda:N\) is beyond int32"
        ):
            ingest(store, [f], run=f"d{dev}")
    assert store.sql("SELECT DISTINCT device FROM memory_events").rows() == [(2**31 - 1,)]


@pytest.mark.parametrize(
    "doc, total",
    [
        # 2**62 + 2**62 would wrap to -2**63 in the analysis' int64 running total: a wrong peak
        ([[1000, 2, 2**62, 0], [2000, 2, 2**62, 0]], 2**63),
        # the coalesced form's change from -2**63 to 2**63 - 1 is 2**64 - 1 bytes in one entry
        (
            [[1, 2], [[0, -(2**63), 0, 0, 0, 0, 0, 0, 0], [0, 2**63 - 1, 0, 0, 0, 0, 0, 0, 0]]],
            2**63 + 2**64 - 1,
        ),
    ],
)
def test_memory_timeline_bytes_beyond_int64_are_refused(store, tmp_path, doc, total):
    f = tmp_path / "rank0_cuda0.raw.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(
        TraceFormatError,
        match=rf"the entries' bytes add up to {total} \(allocated and freed\), "
        "beyond int64",
    ):
        ingest(store, [f], run="big")
    assert store.sql("SELECT count(*) FROM traces").item() == 0


# --- Nsight Systems ---------------------------------------------------------------------------------


def _nsys_with_memory(
    path: Path, rows: list[tuple[int, int, int, int, int, int]], name_type: str = "TEXT"
) -> Path:
    """An nsys export of one process (pid 7) on device 0 with CUDA_GPU_MEMORY_USAGE_EVENTS rows
    (start, deviceId, address, bytes, memKind, memoryOperationType), ns after the capture start;
    ``name_type``: the type of its ``name`` column (``INTEGER``: a string id, as some exports hold)."""
    e = Export()
    e.gpu(0)
    e.process(7)
    e.nvtx(7, 0, 1000, "ProfilerStep#1")
    e.nvtx(7, 1000, 2000, "ProfilerStep#2")
    e.launch(7, 1, 10, 20)
    e.kernel(7, 0, 1, 30, 40)
    e.write(path)
    con = sqlite3.connect(path)
    con.execute(f"""CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL, globalPid INTEGER NOT NULL,
        deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL,
        bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL,
        name {name_type}, correlationId INTEGER)""")
    con.executemany(
        "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?, ?, ?, 1, ?, 0, ?, ?, ?, NULL, NULL)",
        [(s, 7 << 24, d, a, b, k, o) for s, d, a, b, k, o in rows],
    )
    con.commit()
    con.close()
    return path


def test_nsys_allocations_and_frees_by_hand(store, tmp_path):
    # ns after the capture start; device memory (memKind 2) unless said:
    #   100  free  0x1 300  (allocated before the capture: held from the start, 300)
    #   200  alloc 0x2 1000 -> sum -300 + 1000 = 700, + 300 held = 1,000
    #   300  alloc 0x3 500  -> 1,500 (step 1 peak)
    #   400  pinned host alloc 0x9 10**6 (memKind 1: host memory, left out)
    #   1100 free  0x2 1000 -> 500
    #   1200 alloc 0x4 1200 -> 1,700 (step 2 and run peak)
    #   1300 free  0x4 1200 -> 500
    rows = [
        (100, 0, 1, 300, 2, 1),
        (200, 0, 2, 1000, 2, 0),
        (300, 0, 3, 500, 2, 0),
        (400, 0, 9, 10**6, 1, 0),
        (1100, 0, 2, 1000, 2, 1),
        (1200, 0, 4, 1200, 2, 0),
        (1300, 0, 4, 1200, 2, 1),
    ]
    ingest(store, [_nsys_with_memory(tmp_path / "rank0.sqlite", rows)], run="n")
    res = analyze(store, "memory", "n")
    r = _one(res.frame, source="nsys")
    assert (r["peak_allocated_bytes"], r["peak_step"], r["peak_ts_ns"]) == (1700, 2, EPOCH + 1200)
    assert r["peak_reserved_bytes"] is None and not r["peak_exact"]  # 300 bytes assumed held from the start
    assert r["capacity_bytes"] == 85 << 30 and r["records"] == 6
    assert res.steps.filter(pl.col("source") == "nsys").select("step", "peak_allocated_bytes").rows() == [
        (1, 1500),
        (2, 1700),
    ]
    assert any("300 bytes freed before any allocation" in n for n in res.notes)
    # live at the peak (t=1200): 0x3 500 and 0x4 1,200 from the capture, 0 from before (0x1 freed at 100)
    assert res.ops["live_bytes"].sum() == 1700


def test_nsys_bad_memory_row_is_named(store, tmp_path):
    f = _nsys_with_memory(tmp_path / "rank0.sqlite", [(100, 0, 1, 300, 2, 0), (200, 0, 1, 300, 2, 5)])
    # the error names the table, the row and the value as recorded (5)
    with pytest.raises(
        TraceFormatError,
        match=r"CUDA_GPU_MEMORY_USAGE_EVENTS row id 2: memoryOperationType not 0 \(allocation\) or 1 "
        r"\(deallocation\) \(memoryOperationType=5\)",
    ):
        ingest(store, [f], run="n")
    ingest(store, [f], run="n", on_bad_event="skip")
    assert _one(analyze(store, "memory", "n").frame, source="nsys")["peak_allocated_bytes"] == 300


def test_nsys_memory_row_with_a_lost_string_id_names_the_id(store, tmp_path):
    # the second row's name is string id 77, which StringIds lacks (a damaged export): the error names
    # the table, the row and the id, as the other tables' errors do
    rows = [(100, 0, 1, 300, 2, 0), (200, 0, 2, 300, 2, 0)]
    f = _nsys_with_memory(tmp_path / "rank0.sqlite", rows, name_type="INTEGER")
    con = sqlite3.connect(f)
    con.execute("UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET name = 77 WHERE rowid = 2")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError) as err:
        ingest(store, [f], run="n")
    assert (
        "CUDA_GPU_MEMORY_USAGE_EVENTS row id 2: name string id 77 not in StringIds (1 row(s) of "
        "CUDA_GPU_MEMORY_USAGE_EVENTS with a string id that StringIds lacks" in str(err.value)
    )
    assert "--skip-bad-events" in str(err.value)


# --- across ranks -------------------------------------------------------------------------------------


def _rank_trace(path: Path, rank: int, peak: int) -> Path:
    """A rank of a 3-rank job whose device 0 (capacity 100,000) peaks at ``peak`` bytes in step 1, with
    one all-reduce kernel on group '0' = [0, 1] (ranks 0 and 1) or '5' = [2] (rank 2 alone)."""
    pg, ranks = ("0", [0, 1]) if rank < 2 else ("5", [2])
    args = collective_args(seq=1, pg=pg, ranks=ranks, nelems=4, out_nelems=4, group_size=len(ranks))
    nccl = kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 40, 5, 1, **args)
    ev = [
        step(1, 0, 100),
        mem(10, 0, 0x1, peak, peak, peak),
        mem(20, 0, 0x1, -peak, 0, peak),
        nccl,
        launch(30, 1),
    ]
    return memory_trace(path, ev, {0: 100_000}, rank=rank, world_size=3)


def test_imbalance_within_process_groups(store, tmp_path):
    # Group '0' = ranks [0, 1]: peaks 60,000 and 50,000 -> spread 100 (60,000 / 50,000 - 1) = 20 % > 10 %.
    # Rank 2 is in a group of its own (no spread to measure). Headroom: rank 0 40 %, not near the limit.
    d = tmp_path / "job"
    d.mkdir()
    paths = [_rank_trace(d / f"rank{r}.json.gz", r, p) for r, p in ((0, 60_000), (1, 50_000), (2, 99_000))]
    ingest(store, paths, run="job")
    res = analyze(store, "memory", "job")
    g = _one(res.groups, group="0")
    assert (g["ranks"], g["min_rank"], g["max_rank"], g["min_peak_bytes"], g["max_peak_bytes"]) == (
        "[0, 1]",
        1,
        0,
        50_000,
        60_000,
    )
    assert g["spread_pct"] == pytest.approx(20.0) and g["imbalanced"]
    assert res.groups.height == 1
    near = _one(res.frame, rank=2)
    assert near["headroom_pct"] == pytest.approx(1.0) and near["near_limit"]


def test_without_groups_the_whole_run_is_one_group(store, tmp_path):
    # No collectives: ranks 0 and 1 of a 2-rank job, peaks 1,000 and 1,050 -> spread 5 %: balanced.
    d = tmp_path / "job"
    d.mkdir()
    paths = [
        memory_trace(
            d / f"rank{r}.json.gz", [step(1, 0, 100), mem(10, 0, 0x1, p, p, p)], rank=r, world_size=2
        )
        for r, p in ((0, 1000), (1, 1050))
    ]
    ingest(store, paths, run="job")
    g = analyze(store, "memory", "job").groups.row(0, named=True)
    assert (g["group"], g["ranks"], g["spread_pct"], g["imbalanced"]) == (
        "all",
        "[0, 1]",
        pytest.approx(5.0),
        False,
    )


def test_result_tables_match_their_declarations(store, tmp_path):
    from traceprof.analyses.memory import TABLES, Result

    ingest(store, [memory_trace(tmp_path / "r0.json.gz", EVENTS, CAPS)], run="r")
    res = analyze(store, "memory", "r")
    frames = res.frames()
    assert list(frames) == list(TABLES)
    for name, cols in TABLES.items():
        assert frames[name].columns == [c.name for c in cols], name
        for c in cols:
            assert c.doc and (c.unit or not c.name.endswith(("_bytes", "_ns", "_pct"))), c
            assert c.name in (Result.__doc__ or "")


def test_linear_in_records(tmp_path):
    # Doubling the records doubles the work, not quadruples it: 20,000 vs 40,000 records (plus their ops)
    # must stay well under 4x the time (measured 1.6-2.2x here).
    import time

    def build(n: int, d: Path) -> float:
        d.mkdir()
        ev = [step(1, 0, n * 3 + 10)]
        total = 0
        for i in range(n // 2):
            ev.append(memory_op("aten::empty", 3 * i + 1, 1))
            total += 512
            ev.append(mem(3 * i + 1.5, 0, 0x1000 + i, 512, total, 1 << 30))
        for i in range(n // 2):
            total -= 512
            ev.append(mem(3 * n + 5 + i * 1e-3, 0, 0x1000 + i, -512, total, 1 << 30))
        s = Store(d / "s.duckdb")
        ingest(s, [memory_trace(d / "r0.json.gz", ev)], run="r")
        t0 = time.perf_counter()
        res = analyze(s, "memory", "r")
        took = time.perf_counter() - t0
        assert res.frame["peak_allocated_bytes"][0] == 512 * (n // 2)
        s.close()
        return took

    build(2_000, tmp_path / "warm")
    small, large = build(20_000, tmp_path / "a"), build(40_000, tmp_path / "b")
    assert large < 4 * small + 0.5


# --- the diff gate ---------------------------------------------------------------------------------------


def test_diff_gates_peak_memory_structurally_when_deterministic(store, tmp_path):
    from traceprof.engine.diff import diff_runs

    # base1 = base2: every step peaks at 512 + 4,096 = 4,608 (deterministic). cand: + 1,024 in aten::cat
    # inside aten::linear -> 5,632 = +22.2 % > 1 %: a structural regression naming aten::cat.
    for name, extra in (("b1", 0), ("b2", 0), ("same", 0), ("cand", 1024)):
        ingest(store, [memory_gate_run(tmp_path / name, extra)], run=name)
    res = diff_runs(store, "b1,b2", "cand")
    m = _one(res.frame, metric="peak_mem_bytes")
    assert (m["layer"], m["base"], m["cand"], m["regressed"]) == ("structural", 4608, 5632, True)
    assert m["change_pct"] == pytest.approx(100 * 1024 / 4608)
    assert (
        "deterministic" in m["reason"]
        and "aten::cat in aten::linear holds +1 KiB more at the peak" in m["reason"]
    )
    assert res.verdict == "regression" and "structural" in res.layers
    assert "peak_mem_bytes +22.2% per step (> 1%): aten::cat in aten::linear" in res.summary
    ok = _one(diff_runs(store, "b1,b2", "same").frame, metric="peak_mem_bytes")
    assert (ok["layer"], ok["change_pct"], ok["verdict"]) == ("structural", 0.0, "ok")
    # -t peak_mem_bytes=0.25 lets +22 % pass
    assert not _one(
        diff_runs(store, "b1,b2", "cand", {"peak_mem_bytes": 0.25}).frame, metric="peak_mem_bytes"
    )["regressed"]


def test_diff_noise_tests_peak_memory_when_allocations_vary(store, tmp_path):
    from traceprof.engine.diff import diff_runs

    # The baselines' step-2 allocations differ (jitter 0 / 200 bytes): peaks 4,608 and 4,808, not
    # deterministic, so the metric goes through the noise test: k = 2 baselines, their mean 4,708; the
    # candidate's 4,808 is +2.1 % but within the spread between the baselines: not a regression.
    for name, jitter in (("b1", 0), ("b2", 200), ("cand", 200)):
        ingest(store, [memory_gate_run(tmp_path / name, jitter=jitter)], run=name)
    m = _one(diff_runs(store, "b1,b2", "cand").frame, metric="peak_mem_bytes")
    assert (m["layer"], m["base"], m["cand"], m["regressed"]) == ("timing", 4708, 4808, False)
    assert "noise-tested" in m["reason"]


def test_diff_without_memory_has_no_memory_metric(store, tmp_path):
    from traceprof.engine.diff import diff_runs

    for name in ("b1", "cand"):
        (tmp_path / name).mkdir()
        ingest(
            store,
            [
                memory_trace(
                    tmp_path / name / "rank0.json.gz", [step(1, 0, 100), memory_op("aten::mm", 10, 5)]
                )
            ],
            run=name,
        )
    assert "peak_mem_bytes" not in diff_runs(store, "b1", "cand").frame["metric"].to_list()


# --- summary, findings, report ------------------------------------------------------------------------


def test_summary_mentions_memory_only_when_it_matters(store, tmp_path):
    from traceprof.engine.findings import summarize

    # No memory recorded: no memory verdict, finding or "not available" line.
    (tmp_path / "plain").mkdir()
    ingest(
        store,
        [memory_trace(tmp_path / "plain" / "rank0.json.gz", [step(1, 0, 100), memory_op("aten::mm", 10, 5)])],
        run="plain",
    )
    f = summarize(store, "plain")
    assert not [x for x in f.findings if x.topic == "memory"] and not [
        v for v in f.verdicts if v.topic == "memory"
    ]
    assert not [m for m in f.unavailable if m.analysis == "memory"]
    # Memory recorded, nothing wrong (device 1 alone: 48.8 % headroom above its 2,048 reserved bytes,
    # which the text names: the headroom is not measured from the 400 allocated): an ok verdict, no finding.
    (tmp_path / "fine").mkdir()
    fine = [e for e in EVENTS if e["name"] != "[memory]" or e["args"]["Device Id"] != 0]
    ingest(store, [memory_trace(tmp_path / "fine" / "rank0.json.gz", fine, CAPS)], run="fine")
    f = summarize(store, "fine")
    assert not [x for x in f.findings if x.topic == "memory"]
    assert [(v.status, v.text) for v in f.verdicts if v.topic == "memory"] == [
        (
            "ok",
            "peak allocated 400 B on rank 0 (reserved 2 KiB), 49% headroom above the reserved; "
            "no rank near its capacity, no group imbalanced",
        )
    ]
    # Near the limit (rank 2: 99,000 of 100,000 bytes) and imbalanced (group '0': +20 %): two problems.
    d = tmp_path / "job"
    d.mkdir()
    ingest(
        store,
        [_rank_trace(d / f"rank{r}.json.gz", r, p) for r, p in ((0, 60_000), (1, 50_000), (2, 99_000))],
        run="job",
    )
    f = summarize(store, "job")
    mem_f = [x.text for x in f.findings if x.topic == "memory" and x.problem and x.cost_pct is None]
    assert mem_f == [
        "memory: rank 2 device 0 peaks at 96.7 KiB of its 97.7 KiB (1.0% headroom): allocated 96.7 KiB "
        "in step 1",
        "memory: peak memory differs by 20% within group 0 (ranks [0, 1]): rank 0 58.6 KiB, rank 1 48.8 KiB",
    ]
    assert [v.status for v in f.verdicts if v.topic == "memory"] == ["problem"]


def test_out_of_memory_record_is_a_finding(store, tmp_path):
    from traceprof.engine.findings import summarize

    oom = {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[OutOfMemory]",
        "pid": 1,
        "tid": 1,
        "ts": 150,
        "args": {
            "Device Type": 1,
            "Device Id": 0,
            "Bytes": 10**9,
            "Total Allocated": 512,
            "Total Reserved": 8192,
        },
    }
    ingest(store, [memory_trace(tmp_path / "r0.json.gz", [*EVENTS, oom], CAPS)], run="r")
    res = analyze(store, "memory", "r")
    assert _one(res.frame, device=0)["ooms"] == 1 and _one(res.frame, device=1)["ooms"] == 0
    assert (
        _one(res.frame, device=0)["peak_allocated_bytes"] == 4608
    )  # the failed request is not an allocation
    texts = [x.text for x in summarize(store, "r").findings if x.topic == "memory"]
    assert (
        texts[0]
        == "memory: 1 out-of-memory record(s) ([OutOfMemory]); the first on rank 0 device 0 in step 2"
    )


def test_report_memory_section(store, tmp_path):
    from traceprof.render.report import render_html

    ingest(store, [memory_trace(tmp_path / "r0.json.gz", EVENTS, CAPS)], run="r")
    page = render_html(store, "r")
    assert '<h2 id="memory">Accelerator memory</h2>' in page
    assert "peak_allocated_bytes" in page and "<!--PLOT" not in page
    res = analyze(store, "memory", "r")
    tl = res.timeline.filter(pl.col("peak"))
    assert tl.select("series", "allocated_bytes").rows() == [
        ("rank 0 device 0", 4608),
        ("rank 0 device 1", 400),
    ]


def test_parquet_layout_gives_the_same_tables(tmp_path):
    # The memory_events view reads the events view of a Parquet-layout store the same way.
    f = memory_trace(tmp_path / "r0.json.gz", EVENTS, CAPS)
    out = {}
    for lay in ("duckdb", "parquet"):
        with Store(tmp_path / f"{lay}.duckdb", layout=lay) as s:
            ingest(s, [f], run="r")
            res = analyze(s, "memory", "r")
            out[lay] = {name: df.sort(df.columns, nulls_last=True) for name, df in res.frames().items()}
    for name, df in out["duckdb"].items():
        assert df.equals(out["parquet"][name]), name


def test_memory_timeline_destroy_before_create_is_held_from_the_start(store, tmp_path):
    # A hand-made raw file whose first entry destroys 30 bytes of activation never created in it:
    #   1,000 destroy activation -30 -> activation -30: so 30 were held from the start (lower bound)
    #   2,000 create gradient +100   -> activation 0, gradient 100: total 100 (the peak, a lower bound)
    raw = [[1000, 4, -30, 4], [2000, 2, 100, 5]]
    f = tmp_path / "rank0_cuda0.raw.json.gz"
    f.write_bytes(gzip.compress(json.dumps(raw).encode()))
    ingest(store, [f], run="r")
    res = analyze(store, "memory", "r")
    row = res.categories.row(0, named=True)
    assert (row["total_bytes"], row["activation_bytes"], row["gradient_bytes"]) == (100, 0, 100)
    r = _one(res.frame, source="memory_timeline")
    assert (r["peak_allocated_bytes"], r["peak_exact"]) == (100, False)
    assert any("30 bytes destroyed before they were created" in n for n in res.notes)


def test_a_list_of_integer_lists_that_is_no_timeline_is_skipped_beside_traces(store, tmp_path):
    # A folder with a trace and a JSON matrix (a config, say): the matrix is claimed by its first bytes,
    # found not to be a timeline (its first entry has three values) and skipped with a warning.
    d = tmp_path / "run"
    d.mkdir()
    memory_trace(d / "rank0.json.gz", EVENTS, CAPS)
    (d / "matrix.json").write_text("[[1, 2, 3], [4, 5, 6]]")
    res = ingest(store, [d], run="r")
    assert any("matrix.json" in w for w in res.warnings)
    assert store.sql("SELECT source FROM traces").rows() == [("kineto",)]
    with pytest.raises(TraceFormatError, match="not an export_memory_timeline file"):
        ingest(store, [d / "matrix.json"], run="m")


def test_both_forms_torch_writes_give_the_same_categories(store, tmp_path):
    # torch itself writes both forms of one profile (on CPU here): the categories at the peak agree,
    # the coalesced form's times being whole us (torch's int(t / 1000) of a float: within 1 us of the raw time).
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    opt = torch.optim.Adam(m.parameters())
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        for _ in range(2):
            m(torch.randn(32, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
    rows = {}
    for form, name in (("raw", "rank0_cpu.raw.json.gz"), ("coalesced", "rank0_cpu.json")):
        (tmp_path / form).mkdir()
        prof.export_memory_timeline(str(tmp_path / form / name), device="cpu")
        ingest(store, [tmp_path / form / name], run=form)
        rows[form] = analyze(store, "memory", form).categories.row(0, named=True)
    raw, co = rows["raw"], rows["coalesced"]
    assert abs(co["peak_ts_ns"] - raw["peak_ts_ns"] // 1000 * 1000) <= 1000
    assert {k: v for k, v in co.items() if k != "peak_ts_ns"} == {
        k: v for k, v in raw.items() if k != "peak_ts_ns"
    }
    assert raw["parameter_bytes"] > 0 and raw["optimizer_state_bytes"] > 0


def test_lines_plot_draws_the_largest_series_and_marks_peaks():
    from bokeh.models import GlyphRenderer

    from traceprof.render import plots

    # 20 series of two points each (series i peaks at i GiB at its second point): the 16 largest are
    # drawn (4..19), one allocated line each plus one peak marker each.
    rows = [(f"rank {i}", t, i * 2**30 if t else 0, t == 1) for i in range(20) for t in (0, 1)]
    df = pl.DataFrame(rows, schema=["series", "ts_ns", "allocated_bytes", "peak"], orient="row")
    fig = plots.render(
        plots.lines(df, "ts_ns", ["allocated_bytes", "reserved_bytes"], "series", "peak", "memory")
    )
    glyphs = [r.glyph.__class__.__name__ for r in fig.renderers if isinstance(r, GlyphRenderer)]
    assert glyphs.count("Line") == 16 and glyphs.count("Scatter") == 16
    assert fig.title.text == "memory (the 16 largest of 20; the table has all)"
    assert fig.yaxis[0].axis_label == "GiB"


def test_host_memory_alone_is_not_memory_to_speak_of(store, tmp_path):
    from traceprof.engine.findings import summarize

    # A CPU run with profile_memory=True records host memory only (Device Type 0): the analysis has no
    # accelerator memory, and the summary neither runs it nor lists it as missing.
    ingest(
        store,
        [
            memory_trace(
                tmp_path / "r0.json.gz",
                [step(1, 0, 100), memory_op("aten::mm", 10, 5), mem(12, -1, 0x1, 64, 64, 0, dtype=0)],
            )
        ],
        run="cpu",
    )
    with pytest.raises(AnalysisError, match="no accelerator memory"):
        analyze(store, "memory", "cpu")
    f = summarize(store, "cpu")
    assert not [m for m in f.unavailable if m.analysis == "memory"] and not [
        v for v in f.verdicts if v.topic == "memory"
    ]


def test_one_baseline_is_deterministic_when_its_later_steps_agree(store, tmp_path):
    from traceprof.engine.diff import diff_runs

    # One baseline whose two steps peak at 4,608 and 4,608 (repeated to the byte): structural. One whose
    # step 2 differs (jitter 200: 4,608 then 4,808): no repetition to rely on, so the noise test decides
    # (with one baseline run a change can only be ok or inconclusive there).
    for name, jitter in (("steady", 0), ("jumpy", 200), ("cand", 0)):
        ingest(store, [memory_gate_run(tmp_path / name, jitter=jitter)], run=name)
    assert _one(diff_runs(store, "steady", "cand").frame, metric="peak_mem_bytes")["layer"] == "structural"
    m = _one(diff_runs(store, "jumpy", "cand").frame, metric="peak_mem_bytes")
    assert m["layer"] == "timing" and m["verdict"] in ("ok", "inconclusive") and not m["regressed"]
