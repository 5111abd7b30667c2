"""Run management: remove and rename runs, from the library and the CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from traceprof.core.errors import StoreError, UsageError
from traceprof.ingest.ingest import ingest
from traceprof.storage.runs import remove, rename
from traceprof.storage.store import Store


def _counts(store: Store) -> dict[str, int]:
    return {
        t: int(store.sql(f'SELECT count(*) AS n FROM "{t}"')["n"][0])
        for t in ("runs", "traces", "events", "steps", "collectives", "collective_instances")
    }


def test_remove_deletes_every_row_and_frees_the_files(store):
    ingest(store, [SAMPLES / "normal"])
    before = _counts(store)
    ingest(store, [SAMPLES / "straggler_rank2"])
    store.save_frames(store.resolve_run("straggler_rank2"), "result_x", {"frame": store.sql("SELECT 1 AS a")})
    r = remove(store, "straggler_rank2")
    assert (r.name, r.traces) == ("straggler_rank2", 8) and r.rows > 0
    assert _counts(store) == before  # exactly the other run's rows are left
    assert store.sql("SELECT count(*) AS n FROM result_x_frame")["n"][0] == 0
    # The files are free again: ingesting them under another name works.
    ingest(store, [SAMPLES / "straggler_rank2"], run="slow")
    assert store.runs()["name"].to_list() == ["normal", "slow"]
    with pytest.raises(StoreError, match="no run"):
        remove(store, "straggler_rank2")


def test_rename(store):
    ingest(store, [SAMPLES / "normal", SAMPLES / "extra_matmul"])
    rid = rename(store, "normal", "baseline")
    assert store.resolve_run("baseline") == rid
    with pytest.raises(StoreError):
        store.resolve_run("normal")
    with pytest.raises(UsageError, match="exists already"):
        rename(store, "baseline", "extra_matmul")
    with pytest.raises(UsageError, match="run id"):
        rename(store, "baseline", "42")


@pytest.mark.parametrize(
    "name, why",
    [
        ("1", "would read as a run id"),
        ("", "empty"),
        ("a\x1b[31mb\nc", r"'a\\x1b\[31mb\\nc' holds control characters"),
    ],
)
def test_run_names_refused_at_ingest_and_rename(store, name, why):
    # "1" would shadow run id 1 (then `runs rm 1` removes the run with id 1, not this one); ESC and
    # newline would reach terminals raw. Nothing is stored when ingest refuses.
    with pytest.raises(UsageError, match=f"--run: .*{why}"):
        ingest(store, [SAMPLES / "normal"], run=name)
    assert store.runs().is_empty()
    ingest(store, [SAMPLES / "normal"])
    with pytest.raises(UsageError, match=f"runs mv: .*{why}"):
        rename(store, "normal", name)
    assert store.runs()["name"].to_list() == ["normal"]


@pytest.mark.parametrize(
    "name, why",
    [
        ("", "the set name is empty"),
        ("a\x1bb", r"the set name 'a\\x1bb' holds control characters"),
    ],
)
def test_baseline_set_names_refused_as_set_names(store, name, why):
    # `baseline add '' normal`: the empty name is the SET's (the run 'normal' is fine), so the
    # message says "set name", not "run name"; nothing is added.
    from traceprof.storage import baselines

    ingest(store, [SAMPLES / "normal"])
    with pytest.raises(UsageError, match=f"^baseline add: {why}") as e:
        baselines.add(store, name, ["normal"])
    assert "run name" not in str(e.value)
    assert baselines.sets(store).is_empty()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "traceprof.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def test_cli_runs_rm_mv_and_names_with_brackets(tmp_path):
    # A run folder named like rich markup: listed as it is, and found again by that name.
    odd = tmp_path / "run[red]x"
    shutil.copytree(SAMPLES / "normal", odd)
    db = str(tmp_path / "s.duckdb")
    assert _cli("ingest", str(odd), "--db", db, cwd=tmp_path).returncode == 0
    listing = _cli("runs", "--db", db, cwd=tmp_path)
    assert "run[red]x" in listing.stdout, listing.stdout
    r = _cli("runs", "mv", "run[red]x", "good", "--db", db, cwd=tmp_path)
    assert r.returncode == 0 and "is now 'good'" in r.stderr, r.stderr
    # The same files under another --run: ingest says where they already are.
    again = _cli("ingest", str(odd), "--run", "other", "--db", db, cwd=tmp_path)
    assert "run 'good'" in again.stderr and "not added to run 'other'" in again.stderr, again.stderr
    r = _cli("runs", "rm", "good", "--db", db, cwd=tmp_path)
    assert r.returncode == 0 and "removed run 'good'" in r.stderr, r.stderr
    assert "good" not in _cli("runs", "--db", db, cwd=tmp_path).stdout
    r = _cli("runs", "rm", "good", "--db", db, cwd=tmp_path)
    assert r.returncode == 1 and "no run" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unknown_run_message_says_ids_are_looked_up_too(store):
    ingest(store, [SAMPLES / "normal"])
    with pytest.raises(StoreError, match=r"^no run with name or id '999' in .*; runs: normal \(id 1\)$"):
        store.resolve_run(999)


def test_every_message_names_a_run_one_way(tmp_path):
    # messages said both run 'base': and run base: (and run 1: when --run gave the id); now always
    # run 'NAME' by the stored name, repr-quoted (markup shown as typed: the CLI prints no markup)
    from tests._cli_inproc import run

    db = str(tmp_path / "s.duckdb")
    name = "[bold]base"
    assert run("ingest", str(SAMPLES / "normal"), "--run", name, "--db", db)[0] == 0  # a CPU-only run
    said = f"error: run {name!r}: no GPU kernels"
    for args in (
        ["analyze", "kernels"],
        ["analyze", "kernels", "--run", "1"],
        ["analyze", "launch", "--run", name],
        ["analyze", "idle", "-p", "hta=true", "--run", "1"],
        ["analyze", "kernel_sum"],
    ):
        code, _, err = run(*args, "--db", db, "--no-cache")
        assert code == 1 and err.startswith(said) and err.count("\n") == 1, (args, err)


def test_no_message_names_a_run_without_quotes():
    # the kind, not the cases above: no f-string of the code writes `run {x}` but through repr
    # (run_label, or {name!r}); `--run {x}` is a command line, not a message; the Markdown comment's
    # heading escapes the name for Markdown (md_text), as a title, not a message
    import re

    root = Path(__file__).resolve().parents[2]
    bare = re.compile(r"(?<!-)\brun \{(?![^{}]*!r\})[^{}]*\}")
    found = [
        f"{p.relative_to(root)}:{i}: {line.strip()}"
        for top in ("traceprof", "analyses", "collectors")
        for p in sorted((root / top).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if bare.search(line) and ("f'" in line or 'f"' in line) and "{md_text(" not in line
    ]
    assert found == []
    assert bare.search('f"run {params.run or run_id}: no GPU kernels"')  # what it was
    assert not bare.search('f"run {name!r}: x"') and not bare.search('f"--run {run}"')


def test_suggested_commands_quote_names_for_the_shell(tmp_path):
    # `runs mv clean "my run; rm -rf x"` then `runs mv normal "my run; rm -rf x"`: the hint said
    # `traceprof runs rm my run; rm -rf x` (pasted, it ran rm -rf x); now each word is shell-quoted,
    # and the diff's summary names the run quoted (run 'x' as messages quote it)
    import shlex

    from tests._cli_inproc import run

    db = str(tmp_path / "s.duckdb")
    bad = "my run; rm -rf x"
    for name in ("clean", "normal"):
        assert run("ingest", str(SAMPLES / name), "--db", db)[0] == 0
    assert run("runs", "mv", "clean", bad, "--db", db)[0] == 0
    code, _, err = run("runs", "mv", "normal", bad, "--db", db)
    assert code == 1 and "remove it first with `traceprof runs rm 'my run; rm -rf x'`" in err, err
    hint = err.split("`")[1]
    assert shlex.split(hint) == ["traceprof", "runs", "rm", bad]  # one argument, as typed
    code, out, err = run("diff", bad, "normal", "--db", db)
    said = out + err
    assert "'my run; rm -rf x' -> normal" in said and "; rm -rf x -> normal" not in said, said


def _copy(src: str, dest: Path, keep) -> Path:
    """A copy of sample run ``src`` holding the files whose names ``keep`` accepts."""
    dest.mkdir()
    for f in (SAMPLES / src).iterdir():
        if keep(f.name):
            shutil.copy(f, dest / f.name)
    return dest


def test_runs_counts_a_flight_recorder_only_rank_apart_from_the_traced_ones(tmp_path):
    # straggler_rank2 (world size 4) with every Flight Recorder dump but rank 2's Kineto trace left
    # out: ranks 0, 1, 3 have a timeline, rank 2 a dump only. Before, `runs` said ranks 4 beside
    # summary's "no profiler (Kineto/nsys) trace of rank 2 (it has a Flight Recorder dump only)".
    from tests._cli_inproc import run as cli

    fr = _copy(
        "straggler_rank2",
        tmp_path / "fr",
        lambda n: n.endswith(".fr.json") or (n.endswith(".trace.json.gz") and not n.startswith("rank2.")),
    )
    dumps = _copy("straggler_rank2", tmp_path / "dumps", lambda n: n.endswith(".fr.json"))
    cols = ["name", "world_size", "ranks", "dump_only_ranks", "traces"]
    # (name, world_size, ranks, dump_only_ranks, traces): 3 Kineto + 4 FR files; a run of dumps only
    # is judged by its dumps (storage.runs.untraced_ranks), so its 4 ranks count. One store each:
    # a file belongs to one run.
    for folder, want in ((fr, ("fr", 4, 3, 1, 7)), (dumps, ("dumps", 4, 4, 0, 4))):
        db = str(tmp_path / f"{folder.name}.duckdb")
        assert cli("ingest", str(folder), "--db", db)[0] == 0
        with Store(db, read_only=True) as s:
            assert s.runs().select(cols).rows() == [want]
            columns, rows = s.run_rows()  # what the table prints, without polars
            assert [tuple(r[columns.index(c)] for c in cols) for r in rows] == [want]
        code, out, _ = cli("runs", "--db", db, "-f", "csv")
        header, line = out.splitlines()
        assert header.split(",")[:6] == ["run_id", "name", "world_size", "ranks", "dump_only_ranks", "traces"]
        assert line.split(",")[1:6] == [str(v) for v in want]
    # the summary's coverage line names the same rank
    code, out, _ = cli("summary", "--db", str(tmp_path / "fr.duckdb"))
    assert "no profiler (Kineto/nsys) trace of rank 2 (it has a Flight Recorder dump only)" in out


def test_the_report_header_names_a_rank_with_a_dump_only(tmp_path):
    # straggler_rank2 (world size 4) three ways: whole; rank 2's Kineto trace and meta left out (its
    # Flight Recorder dump kept); every file of rank 2 left out. The header said "4 ranks" for the
    # dump-only run (traces.rank counts rank 2's dump) while `runs` said ranks 3, dump_only_ranks 1;
    # now one text (storage.runs.ranks_text) says which rank has a dump only.
    from tests._cli_inproc import run as cli
    from traceprof.storage.runs import ranks_text

    whole = _copy("straggler_rank2", tmp_path / "whole", lambda n: n != "README.md")
    dump = _copy(
        "straggler_rank2", tmp_path / "dump", lambda n: not n.startswith("rank2.") or n.endswith(".fr.json")
    )
    gone = _copy("straggler_rank2", tmp_path / "gone", lambda n: not n.startswith("rank2."))
    want = {
        "whole": "4 ranks",
        "dump": "4 ranks, 3 traced (rank 2: a Flight Recorder dump only)",
        "gone": "4 ranks, 3 traced",
    }
    for folder in (whole, dump, gone):
        db = str(tmp_path / f"{folder.name}.duckdb")
        assert cli("ingest", str(folder), "--db", db)[0] == 0
        with Store(db, read_only=True) as s:
            assert ranks_text(s, s.resolve_run(None)) == want[folder.name]
    page = tmp_path / "dump.html"
    assert cli("report", "--db", str(tmp_path / "dump.duckdb"), "-o", str(page))[0] == 0
    assert f"(id 1) · {want['dump']} ·" in page.read_text()


def test_ndtimeline_workers_stand_for_their_collapsed_tp_group(store):
    # NDTimeline keeps one worker per tensor-parallel group. trace-AR: meta world_size 64, dp 4 x pp 4
    # = 16 workers (ranks 0, 4, ..., 60), each for 64 / 16 = 4 ranks (tp_size 4); trace-SE: 128 /
    # (dp 32 x pp 2) = 2 ranks per worker (tp 1 x dsp 2), 64 workers; trace-ST: 8 = 2 x 4, one each.
    # Before, `runs` said ranks 16 of 64 and 64 of 128 and the summary "Missing ranks: ... no trace of
    # ranks 1-3, 5-7, ...", making the desync and exposed communication verdicts inconclusive.
    from tests.conftest import corpus
    from traceprof.storage.runs import coverage_text, ranks_text, untraced_ranks

    s = store
    ingest(s, [corpus("kineto_misc/bytedance_straggler_whatif")], jobs=1)
    runs = s.runs().select("name", "world_size", "ranks", "dump_only_ranks", "traces").rows()
    assert runs == [("trace-AR", 64, 64, 0, 16), ("trace-SE", 128, 128, 0, 64), ("trace-ST", 8, 8, 0, 8)]
    ar, se, st = (s.resolve_run(n) for n in ("trace-AR", "trace-SE", "trace-ST"))
    assert [untraced_ranks(s, r) for r in (ar, se, st)] == [((), 64), ((), 128), ((), 8)]
    tp = "one per tensor-parallel group of 4 (NDTimeline collapses TP)"
    assert coverage_text(s, ar) == f"16 of 64 ranks traced: {tp}"
    assert ranks_text(s, ar) == f"64 ranks, 16 traced: {tp}"
    assert ranks_text(s, se) == (
        "128 ranks, 64 traced: one per group of 2 ranks (tp 1 x dsp 2 of meta world_size 128 / "
        "(dp 32 x pp 2): NDTimeline collapses them)"
    )
    assert (coverage_text(s, st), ranks_text(s, st)) == ("", "8 ranks")


def test_the_runs_table_shows_the_issues_cell_whole(tmp_path):
    # a trace with one event rejected and three repaired: its issues text is 207 characters; the
    # table cut it to 48 ("1 rejected: 'device' beyond int32; 1 repaired:…"), only the CSV had it
    # whole. Now the table wraps it in its column, every word of it there.
    from tests._cli_inproc import run as cli
    from tests.collectors.test_decode import _bad_args_trace

    d = tmp_path / "bad"
    d.mkdir()
    _bad_args_trace(d / "rank0.json")
    db = str(tmp_path / "i.duckdb")
    assert cli("ingest", str(d), "--db", db, "--skip-bad-events")[0] == 0
    whole = (
        "1 rejected: 'device' beyond int32; 1 repaired: distributedInfo.rank not an integer: ignored; "
        "1 repaired: args.correlation not an integer: kept without it; "
        "1 repaired: args not an object: kept without its ids"
    )
    code, out, _ = cli("runs", "--db", db, "-f", "csv")
    assert out.splitlines()[1].endswith("," + whole)
    code, out, _ = cli("runs", "--db", db)
    assert code == 0 and "…" not in out
    rows = [line.split("│") for line in out.splitlines() if line.startswith("│")]
    cells = [r[-2].strip() for r in rows]  # the last column: issues, one piece per line
    assert len(cells) > 1 and " ".join(cells) == whole
    assert max(map(len, cells)) <= 60  # wrapped at display.PROSE_WIDTH, not widening the table
