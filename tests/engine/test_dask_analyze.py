"""analyze / report --executor dask (traceprof.engine.rankwise): per-rank analyses on a LocalCluster return
exactly what a local run returns, every frame and note."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests._cli_inproc import run as cli
from tests.conftest import SAMPLES, corpus
from traceprof.core.errors import TraceprofError
from traceprof.engine import analysis as registry
from traceprof.engine import rankwise
from traceprof.engine.session import Session
from traceprof.ingest import executor
from traceprof.ingest.executor import DaskCluster
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

distributed = pytest.importorskip("distributed")

#: Multi-rank runs: GPU (sample traces, HTA's trace_filter) and CPU-only gloo (Flight Recorder + Kineto).
SOURCES = {
    "straggler_rank2": lambda: SAMPLES / "straggler_rank2",
    "normal": lambda: SAMPLES / "normal",
    "trace_filter": lambda: corpus("hta/trace_filter"),
    "gloo_cpu_4rank": lambda: corpus("flight_recorder/gloo_cpu_4rank"),
}


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A small in-process Dask cluster (threads: fast to start; the machine is shared)."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Parquet-layout store holding every run of :data:`SOURCES`."""
    path = tmp_path_factory.mktemp("dask_analyze") / "s.duckdb"
    with Store(path, layout="parquet") as s:
        for name, src in SOURCES.items():
            ingest(s, [src()], run=name, jobs=1)
    return path


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    """Rows in a fixed order (ties of the analyses' own sorts may come in any order)."""
    cols = [c for c, t in df.schema.items() if not t.is_nested()]
    return df.sort(cols, nulls_last=True) if cols and df.height else df


def _result(store: Store, name: str, params: object) -> tuple[dict[str, pl.DataFrame], tuple[str, ...]] | str:
    try:
        r = registry.get(name).run(store, params)
    except TraceprofError as e:
        return f"{type(e).__name__}: {e}"
    return {k: _sorted(v) for k, v in r.frames().items()}, r.notes


def _cases() -> list[tuple[str, str, dict[str, object]]]:
    """Every per-rank analysis on every source, by default and with ``hta=true`` where it has it."""
    registry.load_all()
    out = []
    for run in SOURCES:
        for name in (a.name for a in registry.specs() if a.per_rank is not None):
            out.append((run, name, {}))
            if "hta" in {f.name for f in dataclasses.fields(registry.get(name).params)}:
                out.append((run, name, {"hta": True}))
    return out


@pytest.mark.parametrize(
    ("run", "name", "extra"),
    _cases(),
    ids=lambda v: (
        str(v) if not isinstance(v, dict) else ",".join(f"{k}={x}" for k, x in v.items()) or "default"
    ),
)
def test_same_result_as_local(
    run: str, name: str, extra: dict[str, object], db: Path, scheduler: str
) -> None:
    an = registry.get(name)
    params = an.params(run=run, **extra)
    with Store(db, read_only=True) as store:
        local = _result(store, name, params)
        with Session(store, executor="dask", scheduler=scheduler, memo=False):
            remote = _result(store, name, params)
    if isinstance(local, str) or isinstance(remote, str):
        assert remote == local
        return
    assert remote[1] == local[1]  # notes
    assert remote[0].keys() == local[0].keys()
    for k in local[0]:
        # Integers (every ns column) and strings exactly; floats (ratios) to 1e-12 relative: polars
        # rounds 100.0 * a / b differently from one call to the next (seen locally vs locally too).
        assert_frame_equal(remote[0][k], local[0][k], check_exact=False, rel_tol=1e-12, abs_tol=1e-12)


def test_tasks_run_one_per_rank_on_the_cluster(
    db: Path, scheduler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-rank analyses go to the cluster, one task per rank; cross-rank ones stay here."""
    seen: list[tuple[str, int]] = []
    real = DaskCluster.map

    def spy(self: DaskCluster, fn, tasks, *a, **k):  # type: ignore[no-untyped-def]
        seen.extend((t[2], t[4]) for t in tasks)
        return real(self, fn, tasks, *a, **k)

    monkeypatch.setattr(DaskCluster, "map", spy)
    with Store(db, read_only=True) as store, Session(store, executor="dask", scheduler=scheduler, memo=False):
        for name in ("overlap", "stragglers"):
            an = registry.get(name)
            an.run(store, an.params(run="straggler_rank2"))
    assert seen == [("overlap", r) for r in range(4)]


def test_restrict_shadows_every_rank_table(db: Path) -> None:
    with Store(db, read_only=True) as store:
        rankwise.restrict(store, 1)
        for t in ("events", "kernels", "steps", "traces", "collectives", "devices", "parts"):
            ranks = store.sql(f"SELECT DISTINCT rank FROM {t}")["rank"].to_list()
            assert ranks == [1] or (t == "devices" and not ranks), t  # the sample traces name no device


def test_cli_analyze_and_report(db: Path, scheduler: str, tmp_path: Path) -> None:
    args = ("--db", str(db), "--run", "straggler_rank2", "--format", "csv")
    code, local, err = cli("analyze", "overlap", *args)
    assert code == 0, err
    code, remote, err = cli("analyze", "overlap", *args, "--executor", "dask", "--scheduler", scheduler)
    assert code == 0, err
    assert remote == local
    out = tmp_path / "r.html"
    code, _, err = cli(
        "report",
        "--db",
        str(db),
        "--run",
        "normal",
        "-o",
        str(out),
        "--executor",
        "dask",
        "--scheduler",
        scheduler,
    )
    assert code == 0, err
    assert out.stat().st_size > 0


def test_cli_analyze_save_with_dask(scheduler: str, tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store(path, layout="parquet") as s:
        ingest(s, [SAMPLES / "normal"], jobs=1)
    code, _, err = cli(
        "analyze", "temporal", "--db", str(path), "--save", "--executor", "dask", "--scheduler", scheduler
    )
    assert code == 0, err
    with Store(path, read_only=True) as s:
        assert s.sql("SELECT count(*) AS n FROM result_temporal_frame")["n"][0] == 4


def test_cli_refusals(scheduler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "duck.duckdb"
    with Store(path) as s:  # duckdb layout
        ingest(s, [SAMPLES / "normal"], jobs=1)
    code, _, err = cli(
        "analyze", "overlap", "--db", str(path), "--executor", "dask", "--scheduler", scheduler
    )
    assert code == 1 and "duckdb layout" in err and "--layout parquet" in err
    code, _, err = cli("analyze", "overlap", "--db", str(path), "--executor", "dask")
    assert code == 1 and "--scheduler" in err
    code, _, err = cli("analyze", "overlap", "--db", str(path), "--scheduler", scheduler)
    assert code == 1 and "--executor dask" in err
    code, _, err = cli("report", "--db", str(path), "--executor", "spark", "-o", str(tmp_path / "r.html"))
    assert code == 1 and "--executor 'spark'" in err
    pq = tmp_path / "pq.duckdb"
    with Store(pq, layout="parquet") as s:
        ingest(s, [SAMPLES / "normal"], jobs=1)
    monkeypatch.setattr(executor, "CONNECT_TIMEOUT_S", 1)
    code, _, err = cli(
        "report",
        "--db",
        str(pq),
        "--executor",
        "dask",
        "--scheduler",
        "tcp://127.0.0.1:9",
        "-o",
        str(tmp_path / "r.html"),
    )
    assert code == 1 and "cannot reach a Dask scheduler" in err
    assert len(err.strip().splitlines()) == 1
