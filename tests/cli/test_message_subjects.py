"""A message names what it is about: the file a run name came from, the run by its name, and an
interrupted command's "nothing was changed" is true of the results folder too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests._cli_inproc import run
from traceprof.engine import resultcache

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("subjects") / "s.duckdb"
    assert run("ingest", str(SAMPLES / "normal"), "--db", str(path))[0] == 0
    return path


def test_a_file_named_alone_is_the_subject_of_its_run_name(tmp_path):
    """`ingest bad<ESC>[31m2.json.gz` said `error: /tmp/nl (its run name...)`: the folder it is in."""
    d = tmp_path / "nl"
    d.mkdir()
    f = d / "bad\x1b[31m2.json.gz"
    f.write_bytes((SAMPLES / "normal" / "rank0.trace.json.gz").read_bytes())
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(f), "--db", str(db)) == (
        1,
        "",
        f"error: {d}/bad\\x1b[31m2.json.gz (its run name; set another with --run NAME): the run name "
        "'bad\\x1b[31m2' holds control characters; choose one without them (e.g. of letters, digits and -_.)\n",
    )
    assert not db.exists()


@pytest.mark.parametrize(
    ("analysis", "why"),
    [
        ("kernel_sum", "no GPU kernels; kernel_sum needs a GPU trace (Kineto or nsys)"),
        ("kernels", "no GPU kernels; the kernel breakdown needs a GPU trace"),
        ("idle", "no GPU kernels; the idle breakdown needs GPU streams"),
        ("launch", "no GPU kernels; launch latency needs a GPU trace"),
        ("memcpy_sum", "no GPU memory copies or memsets; memcpy_sum needs a GPU trace (Kineto or nsys)"),
    ],
)
def test_the_run_taken_as_the_latest_is_named_not_numbered(db, analysis, why):
    """Without --run the message said `run 1: no GPU kernels`: an id the user never typed."""
    for run_args in ((), ("--run", "1"), ("--run", "normal")):
        assert run("analyze", analysis, *run_args, "--db", str(db), "--no-cache") == (
            1,
            "",
            f"error: run 'normal': {why}\n",
        )


def test_ctrl_c_after_a_result_was_kept_leaves_no_results_folder(db, monkeypatch):
    """`analyze` stopped by Ctrl-C said "nothing was changed", and `s.duckdb.results/` had been created."""
    real = resultcache.keep

    def keep_then_ctrl_c(*args, **kwargs):
        real(*args, **kwargs)
        assert resultcache.results_dir(db).is_dir()  # the entry is there: then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(resultcache, "keep", keep_then_ctrl_c)
    monkeypatch.setattr("traceprof.cli._exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    assert run("analyze", "stragglers", "--db", str(db)) == (130, "", "interrupted; nothing was changed\n")
    assert not resultcache.results_dir(db).exists()


def test_ctrl_c_while_a_result_is_written_leaves_no_results_folder(db, monkeypatch):
    import polars as pl

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pl.DataFrame, "write_ipc", ctrl_c)
    monkeypatch.setattr("traceprof.cli._exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    assert run("analyze", "stragglers", "--db", str(db)) == (130, "", "interrupted; nothing was changed\n")
    assert not resultcache.results_dir(db).exists()


def test_a_results_folder_there_before_stays(db, monkeypatch):
    """Only folders the interrupted command made are removed: an earlier command's results stay."""
    assert run("analyze", "stragglers", "--db", str(db))[0] == 0
    before = sorted(os.walk(resultcache.results_dir(db)))
    assert before
    monkeypatch.setattr(resultcache, "keep", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    monkeypatch.setattr("traceprof.cli._exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    assert run("analyze", "stragglers", "--db", str(db), "-p", "min_cost_pct=2")[0] == 130
    assert sorted(os.walk(resultcache.results_dir(db))) == before
