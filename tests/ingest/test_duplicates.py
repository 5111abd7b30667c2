"""Exact duplicate records are kept once at ingest, said and counted (``traceprof.collectors._duplicates``):
a trial's rank 0 held every kernel record twice, and kernel_sum showed 3,200,000 ns and 8 instances
for a GEMM that ran 4 times for 1,600,000 ns, with no warning."""

from __future__ import annotations

from tests.builders import EPOCH, Export, kernel, kineto, launch, op, step
from tests.conftest import analyze
from traceprof.collectors.kineto.parse import parse
from traceprof.collectors.nsys.parse import parse as parse_nsys
from traceprof.ingest.ingest import ingest


def _events(copies: int, shift_us: float = 0.0) -> list[dict]:
    """Four steps of 1 ms, each with one op, its launch and one 400 us GEMM; the GEMMs and ops
    written ``copies`` times (a copy later by ``shift_us``), after every original record."""
    first: list[dict] = []
    again: list[dict] = []
    for i in range(4):
        t0 = 1000.0 + 1000 * i
        first += [step(i, t0, 1000), launch(t0 + 12, corr=i + 1)]
        pair = [op("aten::mm", t0 + 10, 20), kernel("volta_sgemm_128x64_nn", 7, t0 + 20, 400, corr=i + 1)]
        first += pair
        for _ in range(copies - 1):
            again += [{**e, "ts": e["ts"] + shift_us} for e in pair]
    return first + again


def test_exact_duplicates_are_kept_once_said_and_counted(store, tmp_path):
    path = kineto(tmp_path / "rank0.json.gz", _events(copies=2))
    t = parse(path)
    # 4 steps + 4 launches + 4 ops + 4 kernels: the 8 copies (events #16..#23) are not stored
    assert len(t.events) == 16
    assert t.warnings[0] == (
        "rank0.json.gz: 8 duplicate records dropped (first: event #16 (ph='X', name='aten::mm', ts=1010.0))"
    )
    ingest(store, [path], run="dup")
    (tmp_path / "once").mkdir()
    ingest(store, [kineto(tmp_path / "once" / "rank0.json.gz", _events(copies=1))], run="once")
    for run in ("dup", "once"):
        got = analyze(store, "kernel_sum", run).frame.to_dicts()
        # 4 x 400 us
        assert [(r["name"], r["instances"], r["total_ns"]) for r in got] == [
            ("volta_sgemm_128x64_nn", 4, 1_600_000)
        ]
    issues = dict(zip(store.runs()["name"].to_list(), store.runs()["issues"].to_list(), strict=True))
    assert issues["dup"] == "8 repaired: exact duplicate record dropped"
    assert not issues["once"]


def test_a_copy_1_ns_later_is_not_a_duplicate(tmp_path):
    # every GEMM and op again 0.001 us (1 ns) later: real (overlapping) records, all stored
    t = parse(kineto(tmp_path / "rank0.json.gz", _events(copies=2, shift_us=0.001)))
    assert len(t.events) == 24
    assert not [w for w in t.warnings if "duplicate" in w]
    kernels = sorted(
        r["ts_ns"] - t.trace["base_time_ns"] for r in t.events.to_pylist() if r["kind"] == "kernel"
    )
    assert kernels[:2] == [1_020_000, 1_020_001]


def _nsys(path, twice: bool):
    e = Export()
    e.gpu(0)
    e.process(100)
    for k in range(3):
        s = 1_000_000 + k * 2_000_000
        e.launch(100, k + 1, s, s + 5_000)
        e.kernel(100, 0, k + 1, s + 20_000, s + 1_020_000)
        if twice and k == 1:
            e.kernel(100, 0, k + 1, s + 20_000, s + 1_020_000)
    return e.write(path)


def test_nsys_exact_duplicate_kernel_is_kept_once(tmp_path):
    t = parse_nsys(_nsys(tmp_path / "rank0.sqlite", twice=True))
    kernels = [r for r in t.events.to_pylist() if r["kind"] == "kernel"]
    assert [r["dur_ns"] for r in kernels] == [1_000_000] * 3
    assert [w for w in t.warnings if "duplicate" in w] == [
        # the second kernel: 1 ms + 2 ms + 20 us after the export's epoch
        f"rank0.sqlite: 1 duplicate record dropped (first: kernel 'void gemm_kernel<float>()' at {EPOCH + 3_020_000} ns)"
    ]
