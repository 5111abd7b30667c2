"""What an ingest imports and how it ends: the start-up floor of ``traceprof ingest`` (issue 34).

The figures are in benchmarks/ and the README; these tests check the behaviour that gives them:
files are claimed without importing the parsers of other sources, and an ingest run as a command
ends without Python's teardown, its store whole and unlocked and its exit code (0 or 1) kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests._cli_inproc import run
from tests.builders import micro_trace

#: The parser modules of the sources other than Kineto, which claiming a Kineto file must not import.
_OTHER_PARSERS = (
    "traceprof.collectors.flight_recorder.parse",
    "traceprof.collectors.nccl_inspector.parse",
    "traceprof.collectors.nccl_profiler.parse",
    "traceprof.collectors.nsys.parse",
)


def _trace(folder: Path) -> Path:
    folder.mkdir()
    (folder / "rank0.json").write_text(json.dumps(micro_trace(["a", "b"])))
    return folder


def test_claiming_and_ingesting_a_kineto_trace_imports_no_other_sources_parser(tmp_path):
    trace = _trace(tmp_path / "job")
    code = (
        "import sys\n"
        "from traceprof.cli import main\n"
        f"sys.argv = ['traceprof', 'ingest', {str(trace)!r}, '--db', {str(tmp_path / 's.duckdb')!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(sorted(m for m in {_OTHER_PARSERS!r} if m in sys.modules))\n"
        "from traceprof.ingest import sources\n"
        "print(sorted(c.name for c in sources.collectors()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded, names = out.strip().splitlines()[-2:]
    assert loaded == "[]"
    # every source is still registered (claims and formats), its parser imported only to read a file
    assert eval(names) == [  # noqa: S307 (our own printed list)
        "flight_recorder",
        "kineto",
        "memory_timeline",
        "nccl_inspector",
        "nccl_profiler",
        "ndtimeline",
        "nsys",
    ]


def _ingest_command(
    tmp_path: Path, *args: str, profiled: bool = False
) -> tuple[subprocess.CompletedProcess, bool]:
    """``python -m traceprof.cli ARGS`` with an atexit hook: (the process, whether the hook ran,
    i.e. whether Python's teardown ran); ``profiled``: under a profile function, as cProfile's."""
    mark = tmp_path / "teardown-ran"
    mark.unlink(missing_ok=True)
    code = (
        "import atexit, pathlib, runpy, sys\n"
        f"atexit.register(lambda: pathlib.Path({str(mark)!r}).write_text('x'))\n"
        + ("sys.setprofile(lambda *a: None)\n" if profiled else "")
        + f"sys.argv = ['traceprof', *{list(args)!r}]\n"
        "runpy.run_module('traceprof.cli', run_name='__main__')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return p, mark.exists()


def test_a_successful_ingest_command_ends_without_teardown_its_store_whole(tmp_path):
    trace = _trace(tmp_path / "job")
    db = tmp_path / "s.duckdb"
    p, teardown = _ingest_command(tmp_path, "ingest", str(trace), "--db", str(db))
    assert p.returncode == 0, p.stderr
    assert not teardown  # ended by leave(): os._exit after the output was flushed
    assert "run 'job' (id 1): stored in" in p.stderr  # the report is printed whole
    # the store is closed, checkpointed and unlocked: another process reads it, and an ingest in
    # this one (the tests' own) stores the same rows
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT count(*), sum(dur_ns) FROM events").fetchall()
    db2 = tmp_path / "t.duckdb"
    assert run("ingest", str(trace), "--db", str(db2))[0] == 0
    with duckdb.connect(str(db2), read_only=True) as con:
        assert con.execute("SELECT count(*), sum(dur_ns) FROM events").fetchall() == rows
    assert rows[0][0] > 0
    # the same path again: already stored, a second successful ingest that takes the lock
    p, _ = _ingest_command(tmp_path, "ingest", str(trace), "--db", str(db))
    assert p.returncode == 0 and "1 already stored" in p.stderr, p.stderr


def test_a_failed_ingest_ends_without_teardown_its_code_kept_and_other_commands_as_usual(tmp_path):
    # A failed ingest (exit 1) ends as a successful one does, by os._exit once its message is out:
    # the teardown, which did nothing for it, aborted about 1 in 15 with pyarrow and polars loaded
    # (exit 134 for an ingest that said exit 1; test_failed_ndtimeline_ingest_exits_1_every_time).
    trace = _trace(tmp_path / "job")
    db = tmp_path / "s.duckdb"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rank0.json").write_text('{"traceEvents": [')  # truncated
    p, teardown = _ingest_command(tmp_path, "ingest", str(tmp_path / "bad"), "--db", str(db))
    assert p.returncode == 1 and not teardown
    assert p.stderr.startswith("error: ") and str(tmp_path / "bad" / "rank0.json") in p.stderr
    assert not db.exists()  # a failed first ingest leaves no store, as before
    assert _ingest_command(tmp_path, "ingest", str(trace), "--db", str(db))[0].returncode == 0
    # a failure on a store that exists: exit 1 at once, the store closed and unlocked, unchanged
    p, teardown = _ingest_command(tmp_path, "ingest", str(tmp_path / "bad"), "--db", str(db))
    assert p.returncode == 1 and not teardown
    # --partial with a file that fails: the others stored, exit 1, no teardown either
    (tmp_path / "job2").mkdir()
    (tmp_path / "job2" / "rank0.json").write_text(json.dumps(micro_trace(["c"])))
    p, teardown = _ingest_command(
        tmp_path, "ingest", str(tmp_path / "job2"), str(tmp_path / "bad"), "--db", str(db), "--partial"
    )
    assert p.returncode == 1 and not teardown, p.stderr
    p, teardown = _ingest_command(tmp_path, "runs", "--db", str(db))
    assert p.returncode == 0 and teardown and "job" in p.stdout
    # a profiler (cProfile, a debugger, coverage) writes its results at exit: the teardown runs
    p, teardown = _ingest_command(
        tmp_path, "ingest", str(trace), "--db", str(tmp_path / "p.duckdb"), profiled=True
    )
    assert p.returncode == 0 and teardown, p.stderr


def test_an_ingest_collects_cycles_less_often_and_restores_the_settings(tmp_path, monkeypatch):
    # The ingest command runs with the collector's thresholds of cli.INGEST_GC_THRESHOLD (the
    # default ones traversed the imported modules and the parse's columns 127 times), and leaves
    # Python's own for whatever runs next in the process; another command keeps Python's.
    import gc
    import importlib

    from traceprof import cli

    kineto = importlib.import_module("traceprof.collectors.kineto")  # its parse(), called by the collector

    seen: list[tuple[int, int, int]] = []
    real = kineto.parse
    monkeypatch.setattr(kineto, "parse", lambda *a, **k: seen.append(gc.get_threshold()) or real(*a, **k))
    before = gc.get_threshold()
    assert before != cli.INGEST_GC_THRESHOLD
    trace, db = _trace(tmp_path / "job"), tmp_path / "s.duckdb"
    for argv in (["ingest", str(trace), "--db", str(db)], ["runs", "--db", str(db)]):
        monkeypatch.setattr(sys, "argv", ["traceprof", *argv])
        try:
            cli.main()
        except SystemExit as e:
            assert not e.code, e.code
        assert gc.get_threshold() == before
    assert seen == [cli.INGEST_GC_THRESHOLD]
    assert [
        r[0] for r in duckdb.connect(str(db), read_only=True).execute("SELECT name FROM runs").fetchall()
    ] == ["job"]


@pytest.mark.slow
def test_failed_ndtimeline_ingest_exits_1_every_time(tmp_path):
    # A failed ingest that read a Parquet file (pyarrow and polars loaded) ended with exit 134
    # ("terminate called without an active exception", at interpreter teardown) about 1 time in
    # 15; it now leaves by os._exit(1) once its message is out. 30 runs, through both ways the
    # command is started (the console script, python -m traceprof.cli): exit 1 and the one
    # message, each time. Rows 0..9 of the real ST trace, row 3's duration negative.
    from collections import Counter

    import polars as pl

    from tests.conftest import corpus

    df = pl.read_parquet(corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")).head(10)
    durations = df["duration"].to_list()
    durations[3] = -0.5
    bad = tmp_path / "trace-bad.parquet"
    df.with_columns(pl.Series("duration", durations, df.schema["duration"])).write_parquet(bad)
    codes: list[int] = []
    errors: set[str] = set()
    for i in range(30):
        db = tmp_path / f"s{i}.duckdb"
        start = (
            "from traceprof.entry import main; main()"
            if i % 2
            else "import runpy; runpy.run_module('traceprof.cli', run_name='__main__')"
        )
        code = f"import sys\nsys.argv = ['traceprof', 'ingest', {str(bad)!r}, '--db', {str(db)!r}]\n{start}\n"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        codes.append(p.returncode)
        errors.add(p.stderr)
    assert codes == [1] * 30, f"exit codes {sorted(Counter(codes).items())}: {errors}"
    assert errors == {
        f"error: {bad}: row #3 (optype='backward-compute'): negative 'duration' (-0.5); pass "
        "--skip-bad-events to skip such rows\n"
    }
