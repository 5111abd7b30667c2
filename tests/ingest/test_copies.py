"""Copies at ingest (traceprof.ingest.copies): one rule for files of one content within and across
ingests, and one process's trace under two ranks refused."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.builders import micro_trace
from tests.conftest import SAMPLES, corpus
from traceprof.core.errors import TraceFormatError
from traceprof.core.parsed import DEFAULT_OPTIONS, ParsedTrace
from traceprof.ingest import sketch
from traceprof.ingest.ingest import _parse_one, ingest

T0 = 1_700_000_000_000_000_000  # ns


def _runs(store) -> dict[str, tuple[int, int]]:
    """Run name -> (traces, distinct ranks)."""
    rows = store.con.execute(
        "SELECT r.name, count(*), count(DISTINCT t.rank) FROM runs r JOIN traces t USING (run_id) GROUP BY r.name"
    ).fetchall()
    return {n: (t, k) for n, t, k in rows}


def _rank_file(
    path: Path, rank: int, base_ns: int, pid: int, host: str | None = "vm", world: int = 4
) -> Path:
    """A one-step Kineto rank file (ProfilerStep of 100 us at base_ns, one 1-us op) of host and pid."""
    doc = micro_trace(["aten::mm"], rank=rank, world=world, base_ns=base_ns)
    if host is not None:
        doc["host_name"] = host
    for e in doc["traceEvents"]:
        e["pid"] = pid
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _sample_copy(dest: Path, edit_rank: int | None = None) -> Path:
    """A copy of sample run normal (4 ranks); with ``edit_rank``, that rank's ProfilerStep#5 removed."""
    shutil.copytree(SAMPLES / "normal", dest)
    if edit_rank is not None:
        path = dest / f"rank{edit_rank}.trace.json.gz"
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "ProfilerStep#5"]
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dest


# --- rule 1: one content as the same rank of one run is one trace ---------------------------------


def test_a_folder_holding_one_rank_file_twice_stores_it_once_with_a_warning(store, tmp_path):
    """rank1_copy.json is rank1.json's bytes: both read as rank 1 of run 'job'. Before: the run was
    refused ('the same trace (same sha256): leave one out'); now 2 traces (ranks 0, 1), the copy
    named in a warning."""
    d = tmp_path / "job"
    _rank_file(d / "rank0.json", 0, T0, pid=100, world=2)
    one = _rank_file(d / "rank1.json", 1, T0, pid=101, world=2)
    (d / "rank1_copy.json").write_bytes(one.read_bytes())
    res = ingest(store, [d], jobs=1)
    assert _runs(store) == {"job": (2, 2)}
    assert (
        f"{d / 'rank1_copy.json'}: the same bytes (sha256) as {one}, read as rank 1 both: one trace, "
        "rank1_copy.json not stored (leave the copy out)"
    ) in res.warnings


# --- rule 2: between runs a copy is a file of each run; a whole copy later only when asked ---------


def test_a_run_and_its_edited_copy_ingested_later_is_stored_whole(store, tmp_path):
    """'lost' is normal with rank 1 edited: 3 of its 4 files are copies of normal's. Ingested in one
    go both runs hold 4 ranks (as tests/engine/test_diff.py needs); ingested later, 'lost' was refused
    ('already stored in run normal, so run lost would miss that rank'); now it holds its 4 ranks
    too, the 3 copies said."""
    lost = _sample_copy(tmp_path / "lost", edit_rank=1)
    ingest(store, [SAMPLES / "normal"])
    res = ingest(store, [lost])
    assert _runs(store) == {"normal": (4, 4), "lost": (4, 4)}
    assert (
        f"{lost}: 3 file(s) are copies (same sha256) of files stored in run 'normal', stored in run 'lost' too"
        in (res.warnings)
    )


def test_a_whole_copy_ingested_later_is_a_second_run_only_when_asked(store, tmp_path):
    """A byte-for-byte copy of normal in another folder: skipped as already stored, with a message
    saying --run stores it; with --run copy2 it is run copy2 of 4 ranks. The same path again is a
    no-op either way (DESIGN.md section 3)."""
    copy = _sample_copy(tmp_path / "copy")
    ingest(store, [SAMPLES / "normal"])
    res = ingest(store, [copy])
    assert _runs(store) == {"normal": (4, 4)} and len(res.skipped) == 4 and not res.added
    assert (
        f"{copy}: every file is a copy (same sha256) of one stored in run 'normal': not stored again; to store "
        "it as a run of its own, ingest it with --run NAME"
    ) in res.warnings
    res = ingest(store, [copy], run="copy2")
    assert _runs(store) == {"normal": (4, 4), "copy2": (4, 4)} and len(res.added) == 4
    again = ingest(store, [SAMPLES / "normal"], run="other")
    assert not again.added and _runs(store) == {"normal": (4, 4), "copy2": (4, 4)}


@pytest.mark.parametrize("extra", [False, True])
def test_a_folder_of_copies_says_and_stores_the_same_in_one_ingest_as_in_two(tmp_path, extra):
    """t12 D5 (t10/dup3): folder b holds a copy of a's rank2.json (ranks 0-3 in a). Ingested later,
    b was skipped ("every file is a copy ... of one stored in run 'a'"); in one ingest with a, b was
    stored as run 'b' of 1 of 4 ranks, nothing said. Now both: run 'a' (4 traces, 4 ranks) only,
    the same warning, b/rank2.json skipped as run 'a''s copy. With a new rank3.json in b too
    (``extra``): both ways run 'b' holds 2 traces (the copy and rank 3), said in one warning."""
    from traceprof.storage.store import Store

    a, b = tmp_path / "a", tmp_path / "b"
    for r in range(4):
        _rank_file(a / f"rank{r}.json", r, T0, pid=100 + r, world=4)
    b.mkdir()
    (b / "rank2.json").write_bytes((a / "rank2.json").read_bytes())
    if extra:
        _rank_file(b / "rank3.json", 3, T0 + 10**9, pid=203, world=4)
    one = Store(tmp_path / "one.duckdb")
    said_one = ingest(one, [a, b], jobs=1)
    two = Store(tmp_path / "two.duckdb")
    ingest(two, [a], jobs=1)
    said_two = ingest(two, [b], jobs=1)
    if extra:
        text = f"{b}: 1 file(s) are copies (same sha256) of files stored in run 'a', stored in run 'b' too"
        runs = {"a": (4, 4), "b": (2, 2)}
    else:
        text = (
            f"{b}: every file is a copy (same sha256) of one stored in run 'a': not stored again; to store it "
            "as a run of its own, ingest it with --run NAME"
        )
        runs = {"a": (4, 4)}
        assert said_one.skipped == said_two.skipped == {str(b / "rank2.json"): "run 'a', as a copy"}
    assert text in said_one.warnings and text in said_two.warnings, (said_one.warnings, said_two.warnings)
    assert _runs(one) == _runs(two) == runs


def test_identical_folders_of_one_ingest_are_two_runs_said(store, tmp_path):
    """Each folder named is a run: a baseline and its copy (tests/engine/test_history.py's job_0 and
    job_3) are two runs of 1 trace each, and a warning says they hold the same files."""
    a = _rank_file(tmp_path / "x" / "rank0.json", 0, T0, pid=100, world=1)
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "rank0.json").write_bytes(a.read_bytes())
    res = ingest(store, [tmp_path / "x", tmp_path / "y"], jobs=1)
    assert _runs(store) == {"x": (1, 1), "y": (1, 1)}
    assert "run 'y' holds the same files (sha256) as run 'x': stored as two runs, as named" in res.warnings


# --- rule 3: one process's trace under two ranks --------------------------------------------------


@pytest.mark.parametrize(
    ("host", "where"), [(None, "host 'vm', pid 101 both"), ("vm2", "host 'vm', pid 101; host 'vm2', pid 101")]
)
def test_a_rank_file_copied_with_its_rank_edited_is_refused(store, tmp_path, host, where):
    """t10: rank 1's file rewritten with distributedInfo.rank 3 (json.dump: its args spacing changes
    too) was rank 3 of the run, no warning. Same host 'vm', pid 101, identical events (times, names,
    lanes): refused, naming both files; nothing stored. t12 F5: with its host edited to 'vm2' too it
    was stored as rank 3 (the check grouped by host and pid first); its events are rank 1's, row for
    row: refused alike, naming each file's host and pid. Ranks 0 and 2 on host 'vm2' (pids 100, 102:
    other events) are a job of their own: stored, 2 ranks."""
    d = tmp_path / "job"
    _rank_file(d / "rank0.json", 0, T0, pid=100, world=4)
    one = _rank_file(d / "rank1.json", 1, T0, pid=101, world=4)
    _rank_file(d / "rank2.json", 2, T0, pid=102, world=4)
    doc = json.loads(one.read_text())
    doc["distributedInfo"]["rank"] = 3
    if host is not None:
        doc["host_name"] = host
    (d / "rank3.json").write_text(json.dumps(doc, indent=1))
    with pytest.raises(TraceFormatError) as e:
        ingest(store, [d], jobs=1)
    assert str(e.value).endswith(
        f"rank 3, but its 2 events are, row for row, those of rank 1 in {one} ({where}): one process's trace "
        "under two ranks, a copy of one rank's file with its rank edited; run 'job' not stored: leave the copy out"
    )
    assert store.runs().height == 0
    real = tmp_path / "real"
    _rank_file(real / "rank0.json", 0, T0, pid=100, host="vm2", world=2)
    _rank_file(real / "rank1.json", 1, T0, pid=102, host="vm2", world=2)
    ingest(store, [real], jobs=1)
    assert _runs(store) == {"real": (2, 2)}


def test_a_rank_file_copied_with_an_event_removed_and_its_rank_edited_is_refused(store, tmp_path):
    """t15 F5b: sample normal with rank 3's file replaced by rank 1's less its first ``aten::mm``,
    rank edited to 3 (F5b edited its host too; the exact-copy test covers that): the digest differs, so it was stored as rank 3 (4 ranks),
    no warning. Its 2912 events are 2912 of rank 1's 2913 at the very same (name, ts, dur), a share
    of 2912 / 2913 = 99.97 %: of the 128 smallest hashes of both together at most one (the removed
    event's) is missing from the copy, so 127 or 128 of 128 are shared, over NEAR (0.9), and the
    copy keeps rank 1's pid: refused, naming both files, their host and pid; nothing stored. (Ranks
    of other pids at the same times, hand-built as /work/shared/cases/deepep_comm_kernels: no copy.)"""
    d = _sample_copy(tmp_path / "job")
    one = d / "rank1.trace.json.gz"
    _near_copy(one, d / "rank3.trace.json.gz")
    with pytest.raises(TraceFormatError) as e:
        ingest(store, [d], jobs=1)
    _assert_near_copy_refused(str(e.value), one)
    assert store.runs().height == 0


def _near_copy(one: Path, dest: Path) -> None:
    """Write ``one`` (a sample rank 1 file) less its first ``aten::mm``, its rank edited to 3, at ``dest``."""
    doc = json.loads(gzip.decompress(one.read_bytes()))
    first_mm = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("name") == "aten::mm")
    del doc["traceEvents"][first_mm]
    doc["distributedInfo"]["rank"] = 3
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(gzip.compress(json.dumps(doc).encode()))


def _assert_near_copy_refused(msg: str, one: Path) -> None:
    """Rule 3's near-copy refusal of rank 3 as a copy of rank 1 (``one``), run 'job'."""
    assert re.search(
        r"rank3\.trace\.json\.gz: distributedInfo\.rank: rank 3, but 12[78] of 128 of its events sampled \(by a hash "
        r"of name, start and duration in ns\) are at the very times of events of rank 1 in "
        + re.escape(f"{one} (host 'vm', pid {_pid(one)} both): one process's trace under two ")
        + r"ranks, a near-copy of one rank's file with its rank edited; run 'job' not stored: leave the copy out$",
        msg,
    ), msg


def _pid(path: Path) -> str:
    """The pid of a sample rank file's main thread (its ProfilerStep events')."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return str(
        next(e["pid"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep"))
    )


@pytest.mark.parametrize(
    "folder",
    [
        *(f"sample_traces/{d.name}" for d in sorted(SAMPLES.iterdir()) if d.is_dir()),
        "corpus/flight_recorder/gloo_cpu_4rank",
        "corpus/kineto_misc/bytedance_straggler_whatif",
        "corpus/hta/trace_filter",
        "corpus/nsys",
    ],
)
def test_no_two_ranks_of_a_real_run_share_sampled_events(folder):
    """Every multi-rank folder of sample_traces and the corpus: no two traces of one source share
    any of their sketches' hashes (0 of 128: independent processes start no event at the same ns),
    so none is near another (the near-copy rule has no false alarm there)."""
    root = SAMPLES.parent / folder if folder.startswith("sample") else corpus(folder.removeprefix("corpus/"))
    by_source: dict[str, list[tuple[int, ...]]] = {}
    for f in sorted(root.iterdir()):
        got = _parse_one((f, DEFAULT_OPTIONS))
        for pt in got if isinstance(got, list) else []:
            if pt.events_sketch is not None:
                by_source.setdefault(pt.source, []).append(pt.events_sketch)
    assert by_source
    for sketches in by_source.values():
        assert [sketch.shared(a, b)[0] for i, a in enumerate(sketches) for b in sketches[:i]] == [0] * (
            len(sketches) * (len(sketches) - 1) // 2
        )


def test_rule_3_names_the_pid_as_process_id_reads_it() -> None:
    """Rule 3's error names each file's process through ``traceprof.storage.identity.process_id``
    (the one reading of the pid): a trace whose pid is unstated (Kineto: no ProfilerStep and no
    cpu_op to take it from) reads ``pid unknown``; it read ``pid `` (an empty word), its own
    ``str(pid or "")``. Pids "101" / "0" are named as they are."""
    from types import SimpleNamespace

    from traceprof.ingest.copies import _where

    def pt(host: str, pid: object) -> ParsedTrace:
        return SimpleNamespace(trace={"host": host, "pid": pid})  # type: ignore[return-value]

    assert _where(pt("vm", None), pt("vm", None)) == "host 'vm', pid unknown both"
    assert _where(pt("vm", "101"), pt("vm2", "")) == "host 'vm', pid 101; host 'vm2', pid unknown"
    assert _where(pt("vm", "0"), pt("vm", "0")) == "host 'vm', pid 0 both"


def test_two_ranks_of_one_host_and_pid_at_one_time_are_warned(store, tmp_path):
    """Ranks 0 and 1 on host 'vm', both pid 100, spans [T0, T0 + 100 us] and [T0 + 50 us, ...]
    overlap, events differ (an op more): stored, with a warning (containers sharing a host name)."""
    d = tmp_path / "job"
    _rank_file(d / "rank0.json", 0, T0, pid=100, world=2)
    doc = micro_trace(["aten::mm", "aten::add"], rank=1, world=2, base_ns=T0 + 50_000) | {"host_name": "vm"}
    for ev in doc["traceEvents"]:
        ev["pid"] = 100
    (d / "rank1.json").write_text(json.dumps(doc))
    res = ingest(store, [d], jobs=1)
    assert _runs(store) == {"job": (2, 2)}
    assert any(
        "rank 0 (rank0.json) and rank 1 (rank1.json) were recorded at the same time by one process (host 'vm', pid 100)"
        in w
        for w in res.warnings
    )


def test_already_stored_names_the_run_that_stored_this_path(store, tmp_path):
    """t12 F3: folder b is a byte copy of folder a (ranks 0-1), stored as run 'a' then as run
    'again' (--run); ingesting b again skips both files. Before, the skip named the first stored
    copy, "run 'a' (id 1), rank 0", though b's files are run 'again''s; now by hand the row stored
    from b/rank0.json: "run 'again' (id 2), rank 0" (and rank 1)."""
    for r in (0, 1):
        _rank_file(tmp_path / "a" / f"rank{r}.json", r, T0, pid=100 + r, world=2)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ingest(store, [tmp_path / "a"], jobs=1)
    ingest(store, [tmp_path / "b"], run="again", jobs=1)
    res = ingest(store, [tmp_path / "b"], jobs=1)
    assert res.skipped == {
        str(tmp_path / "b" / "rank0.json"): "run 'again' (id 2), rank 0",
        str(tmp_path / "b" / "rank1.json"): "run 'again' (id 2), rank 1",
    }


def test_a_near_copy_of_the_second_of_two_ranks_at_one_time_is_refused(store, tmp_path):
    """r0 (pid 3001) and r1 (pid 3002) are hand-built ranks of one 40-op step at the very same
    times (as /work/shared/cases/deepep_comm_kernels: no copy, other pids); r2 is r1's file with its
    first op removed and its rank edited to 2, keeping pid 3002: 40 of r1's 41 events (ProfilerStep
    and 40 ops) at the same (name, ts, dur), 40 / 41 = 97.6 % >= NEAR. Before: r2's sample was
    compared only with r0's (the first trace of every bucket it falls in), of another pid, so the
    copy was stored as rank 2 (a warning of pid 3002 twice). After: candidates are bucketed per pid,
    r2 meets r1 and the run is refused naming both files."""
    d = tmp_path / "job"
    d.mkdir()
    names = [f"op{i}" for i in range(40)]
    for rank, pid, drop in ((0, 3001, False), (1, 3002, False), (2, 3002, True)):
        doc = micro_trace(names, rank=rank, world=3) | {"host_name": "vm"}
        if drop:
            del doc["traceEvents"][1]
        for e in doc["traceEvents"]:
            e["pid"] = pid
        (d / f"r{rank}.json").write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError) as e:
        ingest(store, [d], jobs=1)
    msg = str(e.value)
    assert msg.startswith(f"{d / 'r2.json'}: "), msg
    assert f"are at the very times of events of rank 1 in {d / 'r1.json'} (" in msg, msg
    assert "a near-copy of one rank's file with its rank edited" in msg, msg
    assert store.runs().height == 0


def test_two_hand_built_ranks_of_other_pids_at_one_time_are_stored(store, tmp_path):
    """The same r0 (pid 3001) and r1 (pid 3002), without the copy: no copy (other pids), both stored."""
    d = tmp_path / "job"
    d.mkdir()
    for rank, pid in ((0, 3001), (1, 3002)):
        doc = micro_trace([f"op{i}" for i in range(40)], rank=rank, world=2) | {"host_name": "vm"}
        for e in doc["traceEvents"]:
            e["pid"] = pid
        (d / f"r{rank}.json").write_text(json.dumps(doc))
    ingest(store, [d], jobs=1)
    assert _runs(store) == {"job": (2, 2)}


def test_a_copy_of_a_stored_rank_appended_to_its_run_is_refused(store, tmp_path):
    """t17 nc_exact: ranks 0-2 of a run ingested, then rank 1's file with its rank edited to 3 ingested
    into the same run (--run): it was stored as the run's 4th rank (exit 0, silent), though the same
    four files in one ingest are refused. Hand values: rank 3's 2 events (ProfilerStep at T0, 100 us;
    aten::mm, 1 us) are rank 1's row for row, host 'vm', pid 101 both: refused with rule 3's text,
    naming rank 1's stored file; the run keeps its 3 traces, 3 ranks."""
    d = tmp_path / "job"
    _rank_file(d / "rank0.json", 0, T0, pid=100, world=4)
    one = _rank_file(d / "rank1.json", 1, T0, pid=101, world=4)
    _rank_file(d / "rank2.json", 2, T0, pid=102, world=4)
    ingest(store, [d / f"rank{r}.json" for r in range(3)], run="job", jobs=1)
    doc = json.loads(one.read_text())
    doc["distributedInfo"]["rank"] = 3
    later = tmp_path / "later" / "rank3.json"
    later.parent.mkdir()
    later.write_text(json.dumps(doc, indent=1))
    with pytest.raises(TraceFormatError) as e:
        ingest(store, [later], run="job", jobs=1)
    assert str(e.value).endswith(
        f"rank 3, but its 2 events are, row for row, those of rank 1 in {one} (host 'vm', pid 101 both): one "
        "process's trace under two ranks, a copy of one rank's file with its rank edited; run 'job' not stored: "
        "leave the copy out"
    ), str(e.value)
    assert _runs(store) == {"job": (3, 3)}


def test_a_near_copy_of_a_stored_rank_appended_to_its_run_is_refused(store, tmp_path):
    """t17 nc_basic: sample normal ranks 0-2 stored as run 'job', then rank 3 = rank 1 less its first
    ``aten::mm``, rank edited, ingested into 'job': stored as a 4th rank before. Its 2912 events are
    2912 of rank 1's 2913 (99.97 %): 127 or 128 of the 128 sampled hashes shared, over NEAR, same pid:
    refused as in one ingest, naming rank 1's stored file; the run keeps 3 ranks. Rank 3's real file
    appended after that is stored (4 ranks), and the sample folder ingested again is already stored."""
    d = _sample_copy(tmp_path / "job")
    one = d / "rank1.trace.json.gz"
    ingest(store, [d / f"rank{r}.trace.json.gz" for r in range(3)], run="job", jobs=1)
    copy = tmp_path / "copy" / "rank3.trace.json.gz"
    _near_copy(one, copy)
    with pytest.raises(TraceFormatError) as e:
        ingest(store, [copy], run="job", jobs=1)
    _assert_near_copy_refused(str(e.value), one)
    assert _runs(store) == {"job": (3, 3)}
    ingest(store, [d / "rank3.trace.json.gz"], run="job", jobs=1)
    assert _runs(store) == {"job": (4, 4)}
    again = ingest(store, [d], jobs=1)
    assert not again.added and len(again.skipped) == 4
