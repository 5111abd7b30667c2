"""ingest --executor dask (traceprof.ingest.executor): the same store as a local ingest, on a LocalCluster."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import polars as pl
import pytest

from tests._cli_inproc import run as cli
from tests.conftest import REPO, SAMPLES, corpus
from traceprof.core.errors import TraceFormatError, TraceprofError, UsageError
from traceprof.core.parsed import ParseOptions
from traceprof.engine import analysis as registry
from traceprof.ingest import executor
from traceprof.ingest.ingest import _park_one, ingest
from traceprof.storage import layout
from traceprof.storage.store import Store

distributed = pytest.importorskip("distributed")

#: Tables that must hold the same rows (matched collectives, clock offsets and all).
TABLES = ("traces", "devices", "events", "steps", "collectives", "collective_instances", "kernels")
#: Differ by design between two stores: ingest time.
VOLATILE = ("ingested_at",)


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A small in-process Dask cluster (threads: fast to start, nothing to install)."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


def _rows(store: Store, table: str) -> pl.DataFrame:
    df = store.sql(f"SELECT * FROM {table}")
    return df.sort(df.columns, nulls_last=True)


def _analysis(store: Store, name: str, run: str) -> dict[str, pl.DataFrame] | str:
    """The analysis's frames, or its error message (e.g. overlap of a Flight-Recorder-only run)."""
    registry.load_all()
    an = registry.get(name)
    try:
        return an.run(store, an.params(run=run)).frames()
    except TraceprofError as e:
        return str(e)


def assert_same_stores(a: Store, b: Store, run: str, analyses: Iterable[str]) -> None:
    """``b`` (a Dask ingest: the Parquet layout) holds the rows of ``a`` (a local ingest) in every
    table of :data:`TABLES` and ``runs`` (but :data:`VOLATILE`), and each of ``analyses`` gives the
    same frames (or the same error) on both."""
    assert b.layout == "parquet"
    for t in TABLES:
        assert _rows(a, t).equals(_rows(b, t)), t
    assert _rows(a, "runs").drop(VOLATILE).equals(_rows(b, "runs").drop(VOLATILE))
    for name in analyses:
        fa, fb = _analysis(a, name, run), _analysis(b, name, run)
        if isinstance(fa, str) or isinstance(fb, str):
            assert fa == fb, name
            continue
        assert fa.keys() == fb.keys(), name
        for k in fa:
            assert fa[k].equals(fb[k]), (name, k)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(lambda: SAMPLES / "straggler_rank2", id="sample_straggler_rank2"),
        pytest.param(lambda: SAMPLES / "normal", id="sample_normal"),
        pytest.param(lambda: corpus("hta/trace_filter"), id="corpus_hta_trace_filter"),
        pytest.param(lambda: corpus("flight_recorder/gloo_cpu_4rank"), id="corpus_fr_gloo_4rank"),
    ],
)
def test_dask_ingest_equals_local(source, scheduler: str, tmp_path: Path) -> None:
    src = source()
    with Store(tmp_path / "local.duckdb") as s:
        local = ingest(s, [src], jobs=1)
    with Store(tmp_path / "dask.duckdb", layout="parquet") as s:
        remote = ingest(s, [src], executor="dask", scheduler=scheduler)
    assert remote.runs == local.runs and remote.added == local.added and remote.warnings == local.warnings
    with (
        Store(tmp_path / "local.duckdb", read_only=True) as a,
        Store(tmp_path / "dask.duckdb", read_only=True) as b,
    ):
        assert_same_stores(a, b, next(iter(local.runs)), ("overlap", "stragglers"))
    root = layout.dataset_dir(tmp_path / "dask.duckdb")
    assert not (root / "_staging").exists()  # nothing left staged


def test_cli_dask_ingest_makes_a_parquet_store(scheduler: str, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    code, _, err = cli(
        "ingest", str(SAMPLES / "normal"), "--db", str(db), "--executor", "dask", "--scheduler", scheduler
    )
    assert code == 0, err
    with Store(db, read_only=True) as s:
        assert s.layout == "parquet" and s.sql("SELECT count(*) AS n FROM events")["n"][0] > 0


def test_cli_dask_refusals(scheduler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "s.duckdb"
    code, _, err = cli("ingest", str(SAMPLES / "normal"), "--db", str(db), "--executor", "dask")
    assert code == 1 and "--scheduler" in err
    code, _, err = cli("ingest", str(SAMPLES / "normal"), "--db", str(db), "--scheduler", scheduler)
    assert code == 1 and "--executor dask" in err
    code, _, err = cli("ingest", str(SAMPLES / "normal"), "--db", str(db), "--executor", "spark")
    assert code == 1 and "--executor 'spark'" in err
    assert not db.exists()  # a refused first ingest leaves no store
    code, _, err = cli("ingest", str(SAMPLES / "normal"), "--db", str(db))  # a duckdb-layout store
    assert code == 0, err
    code, _, err = cli(
        "ingest", str(SAMPLES / "clean"), "--db", str(db), "--executor", "dask", "--scheduler", scheduler
    )
    assert code == 1 and "duckdb layout" in err
    monkeypatch.setattr(executor, "CONNECT_TIMEOUT_S", 1)
    code, _, err = cli(
        "ingest",
        str(SAMPLES / "clean"),
        "--db",
        str(tmp_path / "n.duckdb"),
        "--executor",
        "dask",
        "--scheduler",
        "tcp://127.0.0.1:9",
    )
    assert code == 1 and "cannot reach a Dask scheduler" in err
    assert not (tmp_path / "n.duckdb").exists() and not layout.dataset_dir(tmp_path / "n.duckdb").exists()


@pytest.mark.parametrize(
    "address", ["notanaddress", "http://192.0.2.2", "tcp://host:port", "tcp://127.0.0.1:9"]
)
def test_bad_scheduler_addresses_fail_at_once(address: str, tmp_path: Path) -> None:
    """No 30 s connect timeout and no hang at exit: a malformed address or a closed port is one line."""
    t0 = time.monotonic()
    code, _, err = cli(
        "ingest",
        str(SAMPLES / "normal"),
        "--db",
        str(tmp_path / "s.duckdb"),
        "--executor",
        "dask",
        "--scheduler",
        address,
    )
    assert code == 1 and f"--scheduler {address}" in err and "Traceback" not in err, err
    assert ("expected a Dask scheduler address" in err) or ("cannot reach a Dask scheduler" in err)
    assert (
        time.monotonic() - t0 < executor.PROBE_TIMEOUT_S + 15
    )  # not the 30 s connect timeout; slack for a busy CI
    assert not (tmp_path / "s.duckdb").exists()


def test_dask_with_layout_duckdb_is_a_conflict(tmp_path: Path) -> None:
    code, _, err = cli(
        "ingest",
        str(SAMPLES / "normal"),
        "--db",
        str(tmp_path / "s.duckdb"),
        "--executor",
        "dask",
        "--scheduler",
        "tcp://127.0.0.1:9",
        "--layout",
        "duckdb",
    )
    assert code == 1 and "leave out --layout duckdb" in err


def _slow(task: tuple[int]) -> int:
    time.sleep(0.5)
    return task[0]


def test_losing_the_cluster_is_one_error() -> None:
    """The scheduler going away mid-map is a TraceprofError saying so, not Dask's traceback."""
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    )
    timer = threading.Timer(1.0, cluster.close)
    timer.start()
    try:
        with pytest.raises(TraceprofError, match="lost the Dask cluster after"):
            executor.map_on_dask(_slow, [(i,) for i in range(40)], cluster.scheduler_address)
    finally:
        timer.join()
        cluster.close()


def test_file_missing_on_a_worker_is_named(tmp_path: Path) -> None:
    """A worker that does not see the file (no shared filesystem) reports the file and the fix."""
    gone = tmp_path / "rank0.trace.json"
    got = executor._on_worker(_park_one, (gone, ParseOptions(), str(tmp_path), "stage"))
    assert isinstance(got, TraceFormatError) and str(gone) in str(got)


def test_without_dask_installed_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(UsageError, match=r"traceprof\[dask\]"):
        executor.map_on_dask(len, [(1,)], "tcp://127.0.0.1:9")


def test_importing_the_library_does_not_import_dask_or_torch() -> None:
    code = (
        "import sys, traceprof.cli, traceprof.ingest.ingest, traceprof.storage.store, traceprof.engine.analysis, traceprof.ingest.executor; "
        "bad = [m for m in ('dask', 'distributed', 'torch') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
