"""Helpers that now serve several callers give what each caller computed before on its own."""

from __future__ import annotations

import numpy as np
import polars as pl

from tests.conftest import SAMPLES
from traceprof.analyses._replay import _code
from traceprof.engine.intervals import class_measures, union_ns
from traceprof.ingest.ingest import ingest
from traceprof.storage.runs import run_name
from traceprof.storage.store import Store


def test_run_name_is_the_stored_name(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        ingest(store, [SAMPLES / "clean"], run="first", jobs=1)
        run_id = store.resolve_run("first")
        assert run_name(store, run_id) == "first"


def test_union_ns_and_class_measures_share_one_sweep():
    # 2,000 random intervals on 3 ranks x 4 steps: the union per group that union_ns gives is
    # class_measures' busy_ns, and its compute_ns is union_ns of the compute rows alone.
    rng = np.random.default_rng(7)
    n = 2000
    start = rng.integers(0, 1_000_000, n)
    act = pl.DataFrame(
        {
            "rank": rng.integers(0, 3, n),
            "step": rng.integers(0, 4, n),
            "class": rng.choice(["compute", "comm", "memory"], n),
            "start_ns": start,
            "end_ns": start + rng.integers(0, 5_000, n),
        }
    )
    cm = class_measures(act, ["rank", "step"])
    busy = union_ns(act, ["rank", "step"], "busy_ns").sort("rank", "step")
    assert (
        busy.join(cm.select("rank", "step", "busy_ns"), on=["rank", "step"], how="full")
        .filter(pl.col("busy_ns") != pl.col("busy_ns_right"))
        .is_empty()
    )
    comp = union_ns(act.filter(pl.col("class") == "compute"), ["rank", "step"], "compute_ns")
    assert (
        comp.sort("rank", "step")["compute_ns"].to_list() == cm.sort("rank", "step")["compute_ns"].to_list()
    )
    # no group columns: one total, the union over everything, measured by hand on a merge
    total = union_ns(act, [], "u")["u"].item()
    ivs = sorted(zip(act["start_ns"].to_list(), act["end_ns"].to_list(), strict=True))
    want, hi = 0, None
    for s, e in ivs:
        if e <= s:
            continue
        if hi is None or s > hi:
            want, hi = want + e - s, e
        elif e > hi:
            want, hi = want + e - hi, e
    assert total == want


def test_code_with_known_values_equals_code_computing_them():
    df = pl.DataFrame({"k": ["b", None, "a", "c", "a", "b"]})
    uniq = df["k"].drop_nulls().unique().sort()
    got = df.select(_code("k", uniq))["k"].to_list()
    assert got == df.select(_code("k"))["k"].to_list() == [1, None, 0, 2, 0, 1]


def test_the_pid_is_read_one_way(monkeypatch):
    # One accessor, traceprof.storage.identity.process_id, for the three rules that read the pid:
    # 4242 (a number) -> "4242"; "" and unstated -> None (empty is unstated); a name stays as text.
    # naming._int_pid: "4242" -> 4242, "" -> None, "w1" -> None (not a number); naming._pid_name:
    # the lowest pid as text ("12" < "9" as text: the rule sorts text); copies.check_processes reads
    # it through the same accessor (patched below: every pt's pid read as "7", so the two traces
    # with pids 1 and 2 on host h count as one process, and its overlap warning names pid 7).
    from traceprof.core.parsed import ParsedTrace
    from traceprof.ingest import copies, naming
    from traceprof.storage import identity

    def pt(pid: object, path: str = "/x/r0.json", rank: int = 0) -> ParsedTrace:
        t = ParsedTrace(path, "", 0, "kineto", "kineto-new", rank, 2)
        t.trace = {"host": "h", **({} if pid is None else {"pid": pid})}
        return t

    assert [identity.process_id(pt(p)) for p in (4242, "4242", "", None, "w1")] == [
        "4242",
        "4242",
        None,
        None,
        "w1",
    ]
    assert [naming._int_pid(pt(p)) for p in (4242, "", None, "w1")] == [4242, None, None, None]
    assert naming._pid_name("run", [pt("9"), pt(12)]) == "run-pid12"
    seen: list[object] = []
    monkeypatch.setattr(copies, "process_id", lambda t: seen.append(t.trace.get("pid")) or "7", raising=False)
    monkeypatch.setattr(
        copies, "_overlapping", lambda name, host, pid, pts, w: w.append(f"{host} {pid} {len(pts)}")
    )
    warnings: list[str] = []
    copies.check_processes("run", [pt(1, "/x/r0.json", 0), pt(2, "/x/r1.json", 1)], warnings, "rank")
    assert seen == [1, 2] and warnings == ["h 7 2"]


def test_every_collector_reads_a_file_through_one_reader(tmp_path):
    # traceprof.core.fileio.read_file: the one "cannot read file" rule that read_maybe_gzip, the NCCL
    # profiler plugin's and NDTimeline's parsers each wrote out, now Nsight Systems' too, which read
    # its export bare: an unreadable one (here a folder named like an export) raised IsADirectoryError
    # with a traceback; now a TraceFormatError naming the file and the system's reason.
    import pytest

    from traceprof.collectors.nsys.parse import parse_all
    from traceprof.core.errors import TraceFormatError
    from traceprof.core.fileio import read_file

    bad = tmp_path / "run.sqlite"
    bad.mkdir()
    for read in (read_file, parse_all):
        with pytest.raises(TraceFormatError, match=r"run\.sqlite.*cannot read file: Is a directory"):
            read(bad)
    (tmp_path / "ok.bin").write_bytes(b"\x1f\x8b12")
    assert read_file(tmp_path / "ok.bin") == b"\x1f\x8b12"  # as stored: not gunzipped
