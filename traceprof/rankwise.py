"""Per-rank analyses on a Dask cluster: one task per rank, the results put together in rank order.

``analyze NAME --executor dask --scheduler ADDR`` (and ``report``) run each analysis of
:data:`MERGES` (those whose rows are computed independently per rank) as one Dask task per rank
of the run. A task opens the store read-only on the worker (the store and its Parquet files on a
filesystem every worker mounts at the same path), restricts it to its rank (:func:`restrict`),
runs the unchanged analysis code and returns its result. Here the per-rank frames are
concatenated in rank order and the few cross-rank parts recomputed from them (:class:`Merge`), so
the result equals a local run's. Every other analysis (stragglers, whatif, desync, mfu, the
``*_sum`` tables: cross-rank by definition, or light) runs here, on the client, as before.

Classification of the per-rank candidates (every row depends on one rank's events only):

- ``temporal``, ``overlap``, ``idle``, ``kernels``, ``launch``: every frame is per rank (or per
  rank and step / stream / device); notes listing ranks or counting rows are merged.
- ``gaps``: ``gaps``, ``steps`` and ``ranks`` are per rank; the causes (``frame``) sum over ranks
  and are recomputed from all ranks' gaps, as are the notes.
- ``mfu`` stays local: the precision (and so the peak) is chosen from the whole run's matrix
  kernels, declared FLOPs are split over the run's ranks, and ``job`` / ``ops`` span ranks.

``hta=true`` counts the ProfilerSteps of the whole run (``traceprof.activity``: fewer than two
changes the event selection); when one rank's count is on the other side of two than the run's,
the analysis runs here instead. So does a run with a trace of unknown rank, and (without
``hta=true``) a run with a profiler-start transient: it is found across ranks
(``traceprof.arrivals``) and left out of every rank's activity, which one rank alone cannot do.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from traceprof import analysis as registry
from traceprof import schema
from traceprof.analysis import FrameResult
from traceprof.arrivals import run_transient
from traceprof.errors import AnalysisError, StoreError, TraceprofError, UsageError
from traceprof.layout import Dataset
from traceprof.store import Store

__all__ = ["MERGES", "Merge", "restrict", "dask_runner", "executing"]


@dataclass(frozen=True)
class Merge:
    """How the per-rank results of one analysis become the run's result.

    Attributes:
        resort: Frames sorted across ranks (not by rank first): frame name -> (columns,
            descending flags) of the analysis's own sort; the rest keep rank order.
        rank_notes: Notes with a rank list (``rank(s) 1, 3 ...`` or ``[1, 3]``): (regex whose
            group 1 is the list and group 2 the rest, format with ``{ranks}`` and ``{rest}``);
            notes with the same rest are merged, their ranks listed in order.
        count_notes: Note patterns starting with a count (group 1) summed over ranks (group 2:
            the rest).
        finish: Recomputes cross-rank frames and notes: ``finish(merged, per_rank)`` -> result.
    """

    resort: dict[str, tuple[list[str], list[bool]]] = field(default_factory=dict)
    rank_notes: tuple[tuple[str, str], ...] = ()
    count_notes: tuple[str, ...] = ()
    finish: Callable[[FrameResult, list[FrameResult]], FrameResult] | None = None


_SEVERAL_GPUS = (r"rank\(s\) (\d+(?:, \d+)*) (drive several GPUs: .*)", "rank(s) {ranks} {rest}")


def _finish_gaps(merged: FrameResult, per_rank: list[FrameResult]) -> FrameResult:
    """gaps' causes and notes from every rank's gaps (``analyses.gaps`` steps 5-6, same order of
    rows as there: by rank, step, start)."""
    from analyses import gaps as mod

    g = merged.frames()["gaps"]
    src = g.sort(pl.col("rank"), pl.col("step").fill_null(mod._NO_STEP), pl.col("start_ns"), maintain_order=True)
    src = src.with_columns(pl.coalesce("top_op", "launch_op", "last_compute").alias("before"))
    causes = mod._causes(src)
    if causes.is_empty():  # every rank says why: hidden wins over "no communication" (any rank had some)
        said = [n for r in per_rank for n in r.notes if n.startswith("no exposed communication")]
        first = sorted(said, key=lambda n: "hidden" not in n)[:1]
    else:
        first = [mod.top_cause_note(causes)]
    rest = [n for n in merged.notes if not n.startswith(("top cause: ", "no exposed communication"))]
    return dataclasses.replace(merged, frame=causes, notes=(*first, *rest))


#: The per-rank analyses and how their per-rank results merge (module doc).
MERGES: dict[str, Merge] = {
    "temporal": Merge(rank_notes=(_SEVERAL_GPUS,)),
    "overlap": Merge(rank_notes=(_SEVERAL_GPUS, (r"ranks without communication \(overlap undefined\): \[([\d, ]*)\]()",
                                               "ranks without communication (overlap undefined): [{ranks}]"))),
    "idle": Merge(),
    "kernels": Merge(count_notes=(r"(\d+) (GPU records flagged at ingest .*)",)),
    "launch": Merge(count_notes=(r"(\d+) (kernels started by a graph launch .*)", r"(\d+) (kernels have no launch call .*)")),
    "gaps": Merge(resort={"gaps": (["dur_ns", "rank", "start_ns"], [True, False, False])}, finish=_finish_gaps),
}


def _require_parquet(store: Store) -> Dataset:
    """The store's Parquet dataset; a UsageError for a duckdb-layout store."""
    if store.dataset is None:
        raise UsageError(f"--executor dask runs per-rank analyses on the store's Parquet files, but {store.path} "
                         "has the duckdb layout; drop --executor dask, or ingest into a new store with --layout parquet")
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
    con = store.con
    ((db_name,),) = con.execute("SELECT current_database()").fetchall()
    cat = '"' + str(db_name).replace('"', '""') + '"'
    for t in schema.TABLES:
        if not t.view_sql and t.name not in schema.PARQUET_TABLES and any(c.name == "rank" for c in t.columns):
            con.execute(f"CREATE OR REPLACE TEMP VIEW {t.name} AS SELECT * FROM {cat}.main.{t.name} "
                        f"WHERE rank = {int(rank)}")
    dataset.refresh()  # its file list comes from parts: now the rank's


def _rank_task(task: tuple[str, int, str, Any, int]) -> FrameResult | TraceprofError:
    """On a worker: analysis ``name`` with ``params`` on one rank of run ``run_id`` of store ``db``."""
    db, run_id, name, params, rank = task
    try:
        with Store(db, read_only=True) as store:
            restrict(store, rank)
            if store.resolve_run(params.run) != run_id:
                raise StoreError(f"{db}: the store changed while the analysis ran (run {params.run!r}); run it again")
            with registry.executing(None):
                return registry.get(name).run(store, params)
    except TraceprofError as e:
        return e


def _needs_local(store: Store, run_id: int, params: Any) -> bool:
    """Whether one rank alone would not see what it sees in the whole run (module doc)."""
    if store.sql("SELECT count(*) AS n FROM traces WHERE run_id = ? AND rank IS NULL", [run_id])["n"][0]:
        return True
    if not getattr(params, "hta", False):
        # the profiler-start transient is found across ranks (traceprof.arrivals): one rank alone
        # cannot see it, so a run that has one is analyzed on the client
        return bool(run_transient(store, run_id).steps)
    n = store.sql("SELECT rank, count(DISTINCT name) AS n FROM events WHERE run_id = ? AND kind = 'step' "
                  "GROUP BY ALL", [run_id])
    ranks = store.sql("SELECT count(DISTINCT rank) AS n FROM traces WHERE run_id = ?", [run_id])["n"][0]
    total = store.sql("SELECT count(DISTINCT name) AS n FROM events WHERE run_id = ? AND kind = 'step'",
                      [run_id])["n"][0]
    few = [k < 2 for k in n["n"].to_list()] + [True] * (ranks - n.height)  # ranks without steps: 0
    return any(f != (total < 2) for f in few)


def _concat(parts: list[pl.DataFrame]) -> pl.DataFrame:
    rows = [f for f in parts if f.width and f.height]
    if rows:
        return pl.concat(rows, how="vertical")
    return next((f for f in parts if f.width), parts[0])


def _notes(per_rank: list[tuple[str, ...]], m: Merge) -> tuple[str, ...]:
    """Every rank's notes once, in the analysis's order; rank lists joined, counts summed."""
    order: list[str] = []
    ranks: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    texts: dict[str, str] = {}
    for notes in per_rank:
        at = 0
        for n in notes:
            key = n
            for pat, fmt in m.rank_notes:
                if hit := re.fullmatch(pat, n):
                    key = "ranks:" + pat + hit.group(2)
                    ranks.setdefault(key, []).extend(x for x in hit.group(1).split(", ") if x)
                    texts[key] = fmt.replace("{rest}", hit.group(2))
            for pat in m.count_notes:
                if hit := re.fullmatch(pat, n):
                    key = "count:" + hit.group(2)
                    counts[key] = counts.get(key, 0) + int(hit.group(1))
                    texts[key] = hit.group(2)
            if key in order:
                at = order.index(key) + 1
            else:
                order.insert(at, key)
                at += 1
    out = []
    for key in order:
        if key in counts:
            out.append(f"{counts[key]} {texts[key]}")
        elif key in ranks:
            listed = ", ".join(str(r) for r in sorted(int(x) for x in ranks[key]))
            out.append(texts[key].replace("{ranks}", listed))
        else:
            out.append(key)
    return tuple(out)


def merge(name: str, per_rank: list[FrameResult]) -> FrameResult:
    """The run's result of per-rank analysis ``name`` from its per-rank results, in rank order.

    Args:
        name: A key of :data:`MERGES`.
        per_rank: Each rank's result (ranks without rows left out), in rank order.

    Returns:
        The result a local run returns: frames concatenated (and re-sorted per
        :attr:`Merge.resort`), notes merged, cross-rank parts recomputed.
    """
    m = MERGES[name]
    names = list(per_rank[0].frames())
    frames = {k: _concat([r.frames()[k] for r in per_rank]) for k in names}
    for k, (by, desc) in m.resort.items():
        frames[k] = frames[k].sort(by, descending=desc, maintain_order=True)
    out = dataclasses.replace(per_rank[0], **frames, notes=_notes([r.notes for r in per_rank], m))
    return m.finish(out, per_rank) if m.finish else out


def dask_runner(cluster: Any) -> registry.Runner:
    """A :data:`traceprof.analysis.Runner` that runs the analyses of :data:`MERGES` on ``cluster``
    (a :class:`traceprof.executor.DaskCluster`), one task per rank, and every other one here.

    The runner raises:
        UsageError: The store has the duckdb layout; Dask missing; the scheduler unreachable.
        TraceprofError: What the analysis raises (on a worker: the first rank's error when every
            rank fails alike; any other error of a rank at once).
    """

    def run(name: str, store: Store, params: Any, fn: Callable[[Any, Any], FrameResult]) -> FrameResult:
        if name not in MERGES:
            return fn(store, params)
        _require_parquet(store)
        run_id = store.resolve_run(params.run)
        if _needs_local(store, run_id, params):
            return fn(store, params)
        ranks = store.sql("SELECT DISTINCT rank FROM traces WHERE run_id = ? ORDER BY rank", [run_id])["rank"].to_list()
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


@contextmanager
def executing(executor: str, scheduler: str | None, store: Store) -> Iterator[None]:
    """Run the registered analyses of ``store`` inside the block with ``executor`` (``local``:
    here; ``dask``: per-rank analyses on the cluster at ``scheduler``, :func:`dask_runner`).

    With ``dask`` the store's layout and the scheduler are checked on entry, so that an analysis
    that callers treat as unavailable on error (the report's sections) does not hide them.

    Raises:
        UsageError: An unknown executor, ``--scheduler`` without ``--executor dask``, dask without
            a scheduler, a duckdb-layout store, Dask not installed, the scheduler unreachable.
    """
    from traceprof.executor import DaskCluster, check_options

    if not check_options(executor, scheduler) or scheduler is None:
        yield
        return
    _require_parquet(store)
    with DaskCluster(scheduler) as cluster, registry.executing(dask_runner(cluster)):
        cluster.connect()
        yield
