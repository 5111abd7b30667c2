"""How ingest and the analyses grow with the number of ranks: 64 / 256 / 1,024 generated ranks.

Usage: python benchmarks/scale.py [--ranks 64 256 1024] [--events 2000] [--steps 10] [--group 8]
                                  [--dask] [--out benchmarks/out/scale]

Each rank of the generated job (``benchmarks/gen_trace.py``, plain JSON) has about ``--events``
events over ``--steps`` steps, an all-reduce over every rank and an all-gather in its sub-group of
``--group`` ranks each step. For each rank count, in this process (the Python API; imports
excluded, so the figures are the work itself):

- ingest into a fresh store (the default parser processes), split into parse (every file, in
  worker processes), matching (``traceprof.ingest.matching.match_run``), clock alignment
  (``traceprof.ingest.clock.align_run``) and the rest (inserts, checks);
- every analysis in a fresh session (``cache=False``: computed, not read back), its time and
  whether it applies; ``critical_path`` is the per-step breakdown (every ns of every step of every
  rank);
- with ``--dask``: the same ingest with ``executor="dask"`` on a ``LocalCluster`` of 2 worker
  processes (reached by its TCP address, as a remote scheduler), and whether its tables equal the
  local ingest's.

Near-linear means: time per rank roughly constant as ranks grow 4x (the ``per rank`` columns; the
last column divides the time per rank at the most ranks by that at the fewest: 1.0 is linear, and
the fixed cost of a fresh session makes small figures fall below it).
Results are printed and written to ``OUT/scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def _timed(mod: Any, name: str, into: dict[str, float], key: str) -> None:
    """Wrap ``mod.name`` so that its wall time adds up in ``into[key]``."""
    f = getattr(mod, name)

    def g(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            into[key] = into.get(key, 0.0) + time.perf_counter() - t

    setattr(mod, name, g)


def _ingest(folder: Path, db: Path, **kw: Any) -> dict[str, float]:
    from traceprof.ingest import clock, matching
    from traceprof.ingest import ingest as ing
    from traceprof.storage.store import Store

    phases: dict[str, float] = {}
    saved = (ing._parse_all, matching.match_run, clock.align_run)
    _timed(ing, "_parse_all", phases, "parse")
    _timed(matching, "match_run", phases, "match")
    _timed(clock, "align_run", phases, "align")
    try:
        t = time.perf_counter()
        with Store(db, **({"layout": "parquet"} if kw else {})) as s:
            ing.ingest(s, [folder], **kw)
        phases["total"] = time.perf_counter() - t
    finally:
        ing._parse_all, matching.match_run, clock.align_run = saved
    phases["rest"] = (
        phases["total"] - phases.get("parse", 0) - phases.get("match", 0) - phases.get("align", 0)
    )
    return phases


def _analyses(db: Path) -> dict[str, float | str]:
    import traceprof
    from traceprof.core.errors import TraceprofError
    from traceprof.engine import analysis as registry

    registry.load_all()
    # the generated traces record no shapes: declare the FLOPs so that mfu computes (1 PFLOP a step)
    params: dict[str, dict[str, Any]] = {"mfu": {"model_flops_per_step": 1e15}}
    out: dict[str, float | str] = {}
    for spec in registry.specs():
        with traceprof.open(db, cache=False) as s:
            t = time.perf_counter()
            try:
                s.analyze(spec.name, **params.get(spec.name, {}))
                out[spec.name] = time.perf_counter() - t
            except TraceprofError as e:
                out[spec.name] = f"n/a ({str(e).splitlines()[0][:60]})"
    return out


def _same_tables(a: Path, b: Path) -> bool:
    from traceprof.storage.store import Store

    with Store(a, read_only=True) as x, Store(b, read_only=True) as y:
        for t in ("traces", "events", "steps", "collectives", "collective_instances"):
            fa, fb = x.sql(f"SELECT * FROM {t}"), y.sql(f"SELECT * FROM {t}")
            if not fa.sort(fa.columns, nulls_last=True).equals(fb.sort(fb.columns, nulls_last=True)):
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--events", type=int, default=2000, help="events per rank (about)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--dask", action="store_true", help="also ingest on a 2-process LocalCluster")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "scale")
    a = ap.parse_args()
    from gen_trace import generate

    a.out.mkdir(parents=True, exist_ok=True)
    results: dict[int, dict[str, Any]] = {}
    for n in a.ranks:
        folder = a.out / f"job{n}x{a.events}"
        if not folder.exists():
            generate(folder, n, a.events, a.steps, False, a.group)
        db = a.out / f"job{n}.duckdb"
        for p in (db, Path(f"{db}.wal"), Path(f"{db}.results"), a.out / f"job{n}.duckdb.parquet"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        row: dict[str, Any] = {"ingest": _ingest(folder, db), "analyses": _analyses(db)}
        if a.dask:
            from distributed import LocalCluster

            ddb = a.out / f"job{n}_dask.duckdb"
            for p in a.out.glob(f"job{n}_dask.duckdb*"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
                row["dask_ingest"] = _ingest(folder, ddb, executor="dask", scheduler=c.scheduler_address)
            row["dask_same_tables"] = _same_tables(db, ddb)
        row["load"] = os.getloadavg()[0]
        results[n] = row
        _print(results, a.ranks)
    (a.out / "scale.json").write_text(json.dumps(results, indent=1))


def _print(results: dict[int, dict[str, Any]], ranks: list[int]) -> None:
    done = [n for n in ranks if n in results]
    print(f"\nranks: {done}; seconds (and ms per rank); load avg 1 min: {[results[n]['load'] for n in done]}")

    if len(done) > 1:
        print(
            f"  {'':24} {'':{19 * len(done)}}growth: time per rank at {done[-1]} / at {done[0]} ranks "
            "(1.0 = linear in ranks)"
        )

    def line(label: str, vals: list[Any]) -> None:
        cells = [
            f"{v:8.2f} ({1000 * v / n:6.1f})" if isinstance(v, float) else f"{str(v)[:17]:>17}"
            for v, n in zip(vals, done, strict=True)
        ]
        a, b = vals[0], vals[-1]
        if len(done) > 1 and isinstance(a, float) and isinstance(b, float) and a > 0:
            cells.append(f"{(b / done[-1]) / (a / done[0]):5.2f}x")
        print(f"  {label:24} " + "  ".join(cells))

    for k in ("total", "parse", "match", "align", "rest"):
        line(f"ingest {k}", [results[n]["ingest"].get(k, 0.0) for n in done])
    if "dask_ingest" in results[done[0]]:
        line("ingest --executor dask", [results[n]["dask_ingest"]["total"] for n in done])
        line("  same tables as local", [str(results[n]["dask_same_tables"]) for n in done])
    for name in results[done[0]]["analyses"]:
        line(f"analyze {name}", [results[n]["analyses"][name] for n in done])


if __name__ == "__main__":
    main()
