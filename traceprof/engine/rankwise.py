"""Per-rank analyses on a Dask cluster: one task per rank, the results put together in rank order.

``analyze NAME --executor dask --scheduler ADDR`` (and ``report``) run each analysis whose spec
declares a per-rank merge (``per_rank=PerRank(...)``: its rows are computed independently per rank)
as one Dask task per rank of the run. A task opens the store read-only on the worker (the store and its Parquet files on a
filesystem every worker mounts at the same path), restricts it to its rank (:func:`restrict`),
runs the unchanged analysis code and returns its result. Here the per-rank frames are
concatenated in rank order, their notes merged by structure (the ranks they list, the rows they
count) and the few cross-rank parts recomputed from them (the spec's ``PerRank.finish``), so the
result equals a local run's. Every other analysis (stragglers, whatif, desync, mfu, the
``*_sum`` tables: cross-rank by definition, or light) runs here, on the client, as before.

Classification of the per-rank candidates (every row depends on one rank's events only):

- ``temporal``, ``overlap``, ``idle``, ``kernels``, ``launch``: every frame is per rank (or per
  rank and step / stream / device); notes listing ranks or counting rows are merged.
- ``gaps``: ``gaps``, ``steps`` and ``ranks`` are per rank; the causes (``frame``) sum over ranks
  and are recomputed from all ranks' gaps, as are the notes.
- ``mfu`` stays local: the precision (and so the peak) is chosen from the whole run's matrix
  kernels, declared FLOPs are split over the run's ranks, and ``job`` / ``ops`` span ranks.

``hta=true`` counts the ProfilerSteps of the whole run (``traceprof.engine.activity``: fewer than two
changes the event selection); when one rank's count is on the other side of two than the run's,
the analysis runs here instead. So does a run with a trace of unknown rank, and (without
``hta=true``) a run with a profiler-start transient: it is found across ranks
(``traceprof.engine.arrivals``) and left out of every rank's activity, which one rank alone cannot do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from traceprof.core import schema
from traceprof.core.errors import AnalysisError, StoreError, TraceprofError, UsageError
from traceprof.engine import analysis as registry
from traceprof.engine.analysis import FrameResult, merge_notes
from traceprof.engine.arrivals import run_transient
from traceprof.engine.session import Runner, Session
from traceprof.storage.layout import Dataset
from traceprof.storage.store import Store

__all__ = ["restrict", "dask_runner", "attach_executor", "merge"]


def _require_parquet(store: Store) -> Dataset:
    """The store's Parquet dataset; a UsageError for a duckdb-layout store."""
    if store.dataset is None:
        raise UsageError(
            f"--executor dask runs per-rank analyses on the store's Parquet files, but {store.path} "
            "has the duckdb layout; drop --executor dask, or ingest into a new store with --layout parquet"
        )
    return store.dataset


def restrict(store: Store, rank: int) -> None:
    """Make ``store``'s connection see one rank: every table with a ``rank`` column is shadowed by
    a temporary view of the same name over that rank's rows (DuckDB looks in ``temp`` first, also
    for the views of the store, e.g. ``kernels``), and ``events`` reads only that rank's files.

    Raises:
        UsageError: The store does not have the Parquet layout.
        StoreError: A file of the rank is missing or damaged.
    """
    dataset = _require_parquet(store)
    for t in schema.TABLES:
        if (
            not t.view_sql
            and t.name not in schema.PARQUET_TABLES
            and any(c.name == "rank" for c in t.columns)
        ):
            store.con.execute(
                f"CREATE OR REPLACE TEMP VIEW {t.name} AS SELECT * FROM {store.own_table(t.name)} "
                f"WHERE rank = {int(rank)}"
            )
    dataset.refresh()  # its file list comes from parts: now the rank's


def _rank_task(task: tuple[str, int, str, Any, int]) -> FrameResult | TraceprofError:
    """On a worker: analysis ``name`` with ``params`` on one rank of run ``run_id`` of store ``db``."""
    db, run_id, name, params, rank = task
    try:
        with Store(db, read_only=True) as store:
            restrict(store, rank)
            if store.resolve_run(params.run) != run_id:
                raise StoreError(
                    f"{db}: the store changed while the analysis ran (run {params.run!r}); run it again"
                )
            return registry.get(name).run(store, params)  # a bare store: computed here
    except TraceprofError as e:
        return e


def _needs_local(store: Store, run_id: int, params: Any) -> bool:
    """Whether one rank alone would not see what it sees in the whole run (module doc)."""
    if store.sql("SELECT count(*) AS n FROM traces WHERE run_id = ? AND rank IS NULL", [run_id])["n"][0]:
        return True
    if not getattr(params, "hta", False):
        # the profiler-start transient is found across ranks (traceprof.engine.arrivals): one rank alone
        # cannot see it, so a run that has one is analyzed on the client
        return bool(run_transient(store, run_id).steps)
    n = store.sql(
        "SELECT rank, count(DISTINCT name) AS n FROM events WHERE run_id = ? AND kind = 'step' GROUP BY ALL",
        [run_id],
    )
    ranks = store.sql("SELECT count(DISTINCT rank) AS n FROM traces WHERE run_id = ?", [run_id])["n"][0]
    total = store.sql(
        "SELECT count(DISTINCT name) AS n FROM events WHERE run_id = ? AND kind = 'step'", [run_id]
    )["n"][0]
    few = [k < 2 for k in n["n"].to_list()] + [True] * (ranks - n.height)  # ranks without steps: 0
    return any(f != (total < 2) for f in few)


def _concat(parts: list[pl.DataFrame]) -> pl.DataFrame:
    rows = [f for f in parts if f.width and f.height]
    if rows:
        return pl.concat(rows, how="vertical")
    return next((f for f in parts if f.width), parts[0])


def merge(name: str, per_rank: list[FrameResult]) -> FrameResult:
    """The run's result of per-rank analysis ``name`` from its per-rank results, in rank order.

    Args:
        name: A registered analysis with a :class:`~traceprof.engine.analysis.PerRank` merge.
        per_rank: Each rank's result (ranks without rows left out), in rank order.

    Returns:
        The result a local run returns: frames concatenated (and re-sorted per
        :attr:`PerRank.resort`), notes merged by structure (:func:`traceprof.engine.analysis.merge_notes`),
        cross-rank parts recomputed (:attr:`PerRank.finish`).
    """
    m = registry.get(name).per_rank
    assert m is not None, name
    names = list(per_rank[0].frames())
    frames = {k: _concat([r.frames()[k] for r in per_rank]) for k in names}
    for k, (by, desc) in m.resort.items():
        frames[k] = frames[k].sort(by, descending=desc, maintain_order=True)
    out = dataclasses.replace(per_rank[0], **frames, notes=merge_notes([r.notes for r in per_rank]))
    return m.finish(out, per_rank) if m.finish else out


def dask_runner(cluster: Any) -> Runner:
    """A :data:`traceprof.engine.session.Runner` that runs the per-rank analyses (those whose spec has a
    :class:`~traceprof.engine.analysis.PerRank` merge) on ``cluster``
    (a :class:`traceprof.ingest.executor.DaskCluster`), one task per rank, and every other one here.

    The runner raises:
        UsageError: The store has the duckdb layout; Dask missing; the scheduler unreachable.
        TraceprofError: What the analysis raises (on a worker: the first rank's error when every
            rank fails alike; any other error of a rank at once).
    """

    def run(name: str, store: Store, params: Any, fn: Callable[[Any, Any], FrameResult]) -> FrameResult:
        if registry.get(name).per_rank is None:  # cross-rank: here
            return fn(store, params)
        _require_parquet(store)
        run_id = store.resolve_run(params.run)
        if _needs_local(store, run_id, params):
            return fn(store, params)
        ranks = store.sql("SELECT DISTINCT rank FROM traces WHERE run_id = ? ORDER BY rank", [run_id])[
            "rank"
        ].to_list()
        db = str(Path(store.path).absolute())
        results = cluster.map(_rank_task, [(db, run_id, name, params, int(r)) for r in ranks])
        ok = [r for r in results if not isinstance(r, TraceprofError)]
        errors = [r for r in results if isinstance(r, TraceprofError)]
        # A rank without the activity the analysis needs has no rows in a local run either.
        fatal = [e for e in errors if not isinstance(e, AnalysisError)]
        if fatal or not ok:
            raise (fatal or errors)[0]
        return merge(name, ok)

    return run


def attach_executor(session: Session, executor: str, scheduler: str | None) -> None:
    """Run ``session``'s registered analyses with ``executor`` (``local``: here; ``dask``: per-rank
    analyses on the cluster at ``scheduler``, :func:`dask_runner`, connected now and closed with
    the session).

    With ``dask`` the store's layout and the scheduler are checked now, so that an analysis that
    callers treat as unavailable on error (the report's sections) does not hide them.

    Raises:
        UsageError: An unknown executor, ``--scheduler`` without ``--executor dask``, dask without
            a scheduler, a duckdb-layout store, Dask not installed, the scheduler unreachable.
    """
    from traceprof.ingest.executor import DaskCluster, check_options

    if not check_options(executor, scheduler) or scheduler is None:
        return
    _require_parquet(session.store)
    cluster = session.enter(DaskCluster(scheduler))
    cluster.connect()
    session.runner = dask_runner(cluster)
