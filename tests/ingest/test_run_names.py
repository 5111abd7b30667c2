"""Run names without --run: a lone file after itself, folders of one leaf name told apart, files
that cannot be one job one run each (traceprof.ingest.naming), each renaming or split said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.builders import micro_trace
from tests.conftest import SAMPLES, corpus
from traceprof.core.errors import StoreError, UsageError
from traceprof.core.parsed import ParsedTrace
from traceprof.ingest.ingest import ingest
from traceprof.ingest.naming import _pid_names, stem
from traceprof.storage.store import Store


def _runs(store) -> dict[str, tuple[int, int]]:
    """Run name -> (traces, distinct ranks)."""
    rows = store.con.execute(
        "SELECT r.name, count(*), count(DISTINCT t.rank) FROM runs r JOIN traces t USING (run_id) GROUP BY r.name"
    ).fetchall()
    return {n: (t, k) for n, t, k in rows}


def test_stem_drops_trace_suffixes():
    assert stem(Path("x.sqlite")) == "x"
    assert stem(Path("worker0.1700.pt.trace.json.gz")) == "worker0.1700"
    assert stem(Path("rank3.JSON")) == "rank3" and stem(Path(".json")) == ".json"


def test_a_lone_file_is_named_after_itself_not_its_folder(store):
    f = corpus("nsys/pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    res = ingest(store, [f], jobs=1)
    assert list(res.runs) == ["pipit_saxpy-mpi-cuda_nsys_perlmutter0"]  # was 'nsys'


def test_a_folder_of_one_file_keeps_the_folders_name(store):
    res = ingest(store, [corpus("hta/trace_diff/test")], jobs=1)
    assert list(res.runs) == ["test"]


def test_unrelated_nsys_exports_in_one_folder_are_one_run_each(store):
    # cloverleaf records no rank, saxpy records MPI rank 0: two jobs (this failed before: "no rank
    # in the trace and 2 files in run 'nsys'")
    res = ingest(store, [corpus("nsys")], jobs=1)
    assert sorted(res.runs) == ["pipit_perlmutter-cloverleaf-cuda", "pipit_saxpy-mpi-cuda_nsys_perlmutter0"]
    note = next(w for w in res.warnings if "cannot be one job" in w)
    assert "(1 of its 2 files record no rank), so they are 2 runs" in note
    assert {n: t for n, (t, _) in _runs(store).items()} == dict.fromkeys(res.runs, 1)


def test_folders_with_one_leaf_name_get_their_parent_in_the_name(store):
    # hta/trace_diff/test and hta/trace_compare/test are both rank 1 of a 2-rank job (this failed
    # after parsing both: "rank 1 also in ... (same run 'test')")
    res = ingest(store, [corpus("hta/trace_diff"), corpus("hta/trace_compare")], jobs=1)
    assert sorted(res.runs) == ["base", "control", "trace_compare/test", "trace_diff/test"]
    note = next(w for w in res.warnings if "would be run 'test'" in w)
    assert "2 inputs would be run 'test' but cannot be one job (rank 1 is in " in note
    assert note.endswith("runs 'trace_diff/test', 'trace_compare/test'")


def test_files_of_other_world_sizes_in_one_folder_are_one_run_each(store, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(micro_trace(["x"], rank=0, world=2)))
    (d / "b.json").write_text(json.dumps(micro_trace(["x"], rank=1, world=128)))
    res = ingest(store, [d], jobs=1)
    assert sorted(res.runs) == ["a", "b"]
    assert any(
        "(its files state world sizes 2, 128), so they are 2 runs: 'a', 'b'" in w for w in res.warnings
    )


def test_one_jobs_ranks_in_folders_of_one_name_stay_one_run(store, tmp_path):
    # ranks 0-1 under host1/prof, ranks 2-3 under host2/prof, world size 4: one job, one run 'prof'
    for host, ranks in (("host1", (0, 1)), ("host2", (2, 3))):
        d = tmp_path / host / "prof"
        d.mkdir(parents=True)
        for r in ranks:
            (d / f"rank{r}.json").write_text(json.dumps(micro_trace(["x"], rank=r, world=4)))
    res = ingest(store, [tmp_path / "host1" / "prof", tmp_path / "host2" / "prof"], jobs=1)
    assert list(res.runs) == ["prof"] and _runs(store) == {"prof": (4, 4)}
    assert not any("cannot be one job" in w for w in res.warnings)


def test_a_symlinked_file_joins_the_run_of_the_folder_it_is_named_in(store, tmp_path):
    # sl2 holds rank 1 of sample run 'clean' and a link to its rank 0: the link took its target's
    # folder name, so two runs, 'clean' (rank 0) and 'sl2' (rank 1). One run 'sl2' of both ranks.
    sl2 = tmp_path / "sl2"
    sl2.mkdir()
    (sl2 / "rank0.trace.json.gz").symlink_to((SAMPLES / "clean") / "rank0.trace.json.gz")
    for f in (SAMPLES / "clean").glob("rank1.*"):
        (sl2 / f.name).write_bytes(f.read_bytes())
    res = ingest(store, [sl2], jobs=1)
    assert list(res.runs) == ["sl2"]
    assert _runs(store) == {"sl2": (2, 2)}


def test_a_symlinked_file_named_alone_is_named_after_the_link(store, tmp_path):
    link = tmp_path / "mine.trace.json.gz"
    link.symlink_to((SAMPLES / "clean") / "rank0.trace.json.gz")
    # the link and its target named together are one file, read once, named after the link
    res = ingest(store, [link, (SAMPLES / "clean") / "rank0.trace.json.gz"], jobs=1)
    assert list(res.runs) == ["mine"]
    assert _runs(store) == {"mine": (1, 1)}


def test_a_symlinked_folder_is_followed_and_a_link_loop_read_once(store, tmp_path):
    # sl/linkrun -> sample run 'clean' (4 ranks) was skipped by rglob: "sl: no trace files found".
    # sl/up -> .. (holds sl) and sl/self -> ../sl are loops: not walked, nothing read twice.
    sl = tmp_path / "sl"
    sl.mkdir()
    (sl / "linkrun").symlink_to((SAMPLES / "clean"), target_is_directory=True)
    (sl / "up").symlink_to("..", target_is_directory=True)
    (sl / "self").symlink_to("../sl", target_is_directory=True)
    res = ingest(store, [sl], jobs=1)
    assert list(res.runs) == ["linkrun"]
    assert _runs(store) == {"linkrun": (4, 4)}


def test_a_folder_whose_symlinked_subfolder_holds_no_trace_is_refused_as_a_plain_one(store, tmp_path):
    # e3/link -> junk (a JSON that is not a trace): named beside a run folder, e3 was passed over
    # with a warning (its files lie outside e3 once resolved), where junk itself is refused.
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "x.json").write_text('{"a": 1}')
    e3 = tmp_path / "e3"
    e3.mkdir()
    (e3 / "link").symlink_to(junk, target_is_directory=True)
    for folder in (junk, e3):
        with pytest.raises(UsageError, match=rf"^{folder}: no trace files found \(skipped 1 file"):
            ingest(store, [folder, SAMPLES / "clean"], jobs=1)
    assert _runs(store) == {}


def test_every_link_passed_over_is_said(store, tmp_path):
    # links/runA -> clean, runB -> normal, runC -> clean (the same files as runA), gone -> nowhere:
    # runC and gone were left out without a word; now each gets a line
    links = tmp_path / "links"
    links.mkdir()
    for name, target in (("runA", "clean"), ("runB", "normal"), ("runC", "clean")):
        (links / name).symlink_to(SAMPLES / target, target_is_directory=True)
    (links / "gone").symlink_to(tmp_path / "nowhere")
    res = ingest(store, [links], jobs=1)
    assert _runs(store) == {"runA": (4, 4), "runB": (4, 4)}
    assert f"{links / 'runC'}: the same files as {links / 'runA'}, read once" in res.warnings
    assert (
        f"{links / 'gone'}: a link to {tmp_path / 'nowhere'}, which does not exist; skipped" in res.warnings
    )


def test_a_path_read_already_under_another_name_is_said(store, tmp_path):
    # `ingest clean linkedclean` (linkedclean -> clean) stored clean and nothing else, silently
    linked = tmp_path / "linkedclean"
    linked.symlink_to(SAMPLES / "clean", target_is_directory=True)
    res = ingest(store, [SAMPLES / "clean", linked], jobs=1)
    assert _runs(store) == {"clean": (4, 4)}
    assert f"{linked}: the same files as {SAMPLES / 'clean'}, read once" in res.warnings


def test_a_link_to_itself_is_named_a_loop(store, tmp_path):
    loop = tmp_path / "selfloop"
    loop.symlink_to("selfloop")  # was "selfloop: no such file or directory"
    with pytest.raises(UsageError, match=r"selfloop: a link that leads back to itself \(a loop of links\)$"):
        ingest(store, [loop], jobs=1)
    beside = tmp_path / "run1"
    beside.mkdir()
    (beside / "rank0.json").write_text(json.dumps(micro_trace(["a"])))
    (beside / "self").symlink_to("self")
    res = ingest(store, [beside], jobs=1)
    assert f"{beside / 'self'}: a link that leads back to itself (a loop of links); skipped" in res.warnings


def test_a_folder_holding_only_loops_or_dangling_links_names_them(store, tmp_path):
    # loop/self -> ../loop, the folder's only entry: the refusal said "no trace files found" with no
    # word of the loop (a folder that also held a trace had it in its warnings); a dangling link
    # alone was as silent. Nothing is stored.
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "self").symlink_to("../loop", target_is_directory=True)
    with pytest.raises(UsageError) as e:
        ingest(store, [loop], jobs=1)
    assert str(e.value).startswith(
        f"{loop}: no trace files found (passed over: {loop / 'self'}: a link back to {loop}, "
        f"which holds {loop} (a loop); not followed); traceprof reads: "
    )
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "x").symlink_to(tmp_path / "nowhere")
    with pytest.raises(
        UsageError, match=rf"^{gone}: no trace files found \(passed over: {gone / 'x'}: a link to "
    ):
        ingest(store, [gone], jobs=1)
    assert _runs(store) == {}


def test_the_working_folder_is_named_as_the_shell_spells_it(store, tmp_path, monkeypatch):
    # `cd linkedclean && traceprof ingest .` named the run 'clean' (the link resolved by getcwd)
    linked = tmp_path / "linkedclean"
    linked.symlink_to(SAMPLES / "clean", target_is_directory=True)
    monkeypatch.chdir(linked)
    monkeypatch.setenv("PWD", str(linked))  # what the shell sets after `cd linkedclean`
    ingest(store, [Path(".")], jobs=1)
    assert _runs(store) == {"linkedclean": (4, 4)}
    from traceprof.ingest.ingest import logical_path

    assert logical_path(Path("rank0.json")) == linked / "rank0.json"
    monkeypatch.setenv("PWD", str(tmp_path))  # a stale $PWD (another folder) is not believed
    assert logical_path(Path("rank0.json")) == (SAMPLES / "clean").resolve() / "rank0.json"


T0 = 1_700_000_000_000_000_000  # ns


def _job_file(path: Path, rank: int, base_ns: int, pid: int, host: str = "vm", world: int = 4) -> Path:
    """A one-step Kineto rank file (ProfilerStep of 100 us at base_ns) of ``host`` and ``pid``."""
    doc = micro_trace(["aten::mm"], rank=rank, world=world, base_ns=base_ns) | {"host_name": host}
    for e in doc["traceEvents"]:
        e["pid"] = pid
    path.write_text(json.dumps(doc))
    return path


def test_two_jobs_of_one_host_in_one_folder_are_two_runs_not_clock_skew(store, tmp_path):
    """t9 D1: ranks 0-1 of one job and ranks 2-3 of another (host 'vm', recorded 431 s apart) were one
    run, ranks 2-3 shifted by -431 s "to align clocks". Ranks of one host share a clock, so one job's
    traces overlap: by hand, gap = 431 s - 100 us (rank 0's span) = 430.9999 s > max(1 s, 100 us),
    = 7.2 min; two runs named after each job's lowest pid, no offset."""
    d = tmp_path / "mixed"
    d.mkdir()
    for r in (0, 1):
        _job_file(d / f"rank{r}.json", r, T0, pid=100 + r)
    for r in (2, 3):
        _job_file(d / f"rank{r}.json", r, T0 + 431 * 10**9, pid=200 + r)
    res = ingest(store, [d], jobs=1)
    assert sorted(res.runs) == ["mixed-pid100", "mixed-pid202"]
    assert {n: k for n, (_, k) in _runs(store).items()} == dict.fromkeys(res.runs, 2)
    note = next(w for w in res.warnings if "cannot be one job" in w)
    assert (
        "was recorded 7.2 min after rank" in note and "both on host 'vm', whose ranks share a clock" in note
    )
    assert store.sql("SELECT count(*) FROM traces WHERE clock_offset_ns <> 0").rows() == [(0,)]


def test_the_two_jobs_hint_gives_a_command_that_works(store, tmp_path):
    """t10: the split note said "or name one run with --run", which is then refused (the same-host
    gap) unless --force-run is given too. The hint now names both options, and they work: 4 files,
    ranks 0-3 of host 'vm', ranks 2-3 431 s later -> one run 'one' of 4 ranks. Where a rank is twice
    (rank 0 in a.json and b.json), no option makes one run: the hint offers none."""
    d = tmp_path / "mixed"
    d.mkdir()
    for r in range(4):
        _job_file(d / f"rank{r}.json", r, T0 + (431 * 10**9 if r >= 2 else 0), pid=100 + r)
    note = next(w for w in ingest(store, [d], jobs=1).warnings if "cannot be one job" in w)
    assert note.endswith(
        "(put each job's files in a folder of its own; to store them as one run anyway: --run NAME --force-run)"
    )
    other = Store(tmp_path / "other.duckdb")  # the files are in ``store`` already (a no-op there)
    try:
        with pytest.raises(StoreError, match="pass --force-run"):
            ingest(other, [d], jobs=1, run="one")
        assert list(ingest(other, [d], jobs=1, run="one", force_run=True).runs) == ["one"]
        assert _runs(other) == {"one": (4, 4)}
    finally:
        other.close()
    dup = tmp_path / "dupranks"
    dup.mkdir()
    _job_file(dup / "a.json", 0, T0, pid=300)
    _job_file(dup / "b.json", 0, T0 + 446 * 10**9, pid=400)
    note = next(w for w in ingest(store, [dup], jobs=1).warnings if "cannot be one job" in w)
    assert note.endswith("(put each job's files in a folder of its own)")


def test_two_jobs_of_one_host_named_one_run_are_refused(store, tmp_path):
    """--run puts every file in one run: the same-host gap is refused naming both files."""
    d = tmp_path / "mixed"
    d.mkdir()
    _job_file(d / "rank0.json", 0, T0, pid=100)
    _job_file(d / "rank2.json", 2, T0 + 431 * 10**9, pid=200)
    with pytest.raises(
        StoreError, match=r"rank2.json: recorded 7.2 min after rank0.json ended, on the same host 'vm'"
    ):
        ingest(store, [d], jobs=1, run="one")
    assert store.runs().height == 0


def test_one_hosts_ranks_within_a_second_are_one_run_two_seconds_apart_two(store, tmp_path):
    """The tolerance, by hand: spans of 100 us, so the bound is max(1 s, 100 us) = 1 s. Rank 1 starting
    0.5 s after rank 0 ends is one job (a late profiler start); 2 s after, two."""
    near = tmp_path / "near"
    near.mkdir()
    _job_file(near / "rank0.json", 0, T0, pid=100, world=2)
    _job_file(near / "rank1.json", 1, T0 + 100_000 + 500_000_000, pid=101, world=2)
    assert list(ingest(store, [near], jobs=1).runs) == ["near"]
    far = tmp_path / "far"
    far.mkdir()
    _job_file(far / "rank0.json", 0, T0, pid=300, world=2)
    _job_file(far / "rank1.json", 1, T0 + 100_000 + 2 * 10**9, pid=301, world=2)
    assert sorted(ingest(store, [far], jobs=1).runs) == ["rank0", "rank1"]


def test_one_rank_twice_recorded_apart_is_one_run_per_file_as_the_readme_says(store, tmp_path):
    """t9 D4: a.json and b.json, both rank 0 of 4 on host 'vm', 446 s apart, were refused ("rank 0
    also in"), while README "Run names" says such files are one run each, named after the file."""
    d = tmp_path / "dupranks"
    d.mkdir()
    _job_file(d / "a.json", 0, T0, pid=100)
    _job_file(d / "b.json", 0, T0 + 446 * 10**9, pid=200)
    res = ingest(store, [d], jobs=1)
    assert sorted(res.runs) == ["a", "b"]
    note = next(w for w in res.warnings if "cannot be one job" in w)
    assert "(rank 0 is in a.json and b.json), so they are 2 runs: 'a', 'b'" in note


def test_a_job_whose_files_state_no_pid_is_named_after_its_first_file():
    """Rule 2's name ``<folder>-pid<lowest pid>`` for a set of files none of which states a pid (an
    nsys export without CPU rows, a plugin dump without pids) read ``<folder>-pidNone``. By hand:
    pids None and None -> ``mix-`` + the stem of the first path (a/rank0.sqlite -> rank0); pids
    None and '42' -> ``mix-pid42`` (the unstated one left out)."""

    def pt(path: str, pid: str | None) -> ParsedTrace:
        return ParsedTrace(path, "0" * 64, 1, "nsys", "nsys", 0, 2, trace={"pid": pid})

    jobs = [
        [pt("a/rank1.sqlite", None), pt("a/rank0.sqlite", None)],
        [pt("b/x.sqlite", None), pt("b/y.sqlite", "42")],
    ]
    assert _pid_names("mix", jobs) == ["mix-rank0", "mix-pid42"]
