"""Validate ``critical_path`` against real runs (not a timed test; the figures go in the closing note).

Usage: python benchmarks/validate_critical_path.py [--calib /work/calib] [--corpus ../shared/corpus]
       [--db benchmarks/out/validate.duckdb] [--json benchmarks/out/validate_critical_path.json]

1. Injected delays (``--calib``: real 4-rank gloo runs of the sample job recorded by
   ``scripts/record_samples.py``: ``healthy_NN`` unchanged, ``slow_r<R>_<MS>ms`` where rank R sleeps
   MS ms every step after its forward pass, ``slowstep_r<R>_<MS>ms`` where it sleeps at the start of
   every step). For each slowed run and step, the sleep is the longest host-bound piece of rank R
   on the step's critical path (``critical_path`` table ``path``); the prediction of the step
   without the delay is the job's step time minus that piece, up to MS (the piece also holds the
   Python around the sleep), or the longest chain left on one rank if that is longer
   (:func:`_removed`). The real run without it is the healthy runs: their mean job step time
   (``critical_path`` table ``steps``). The error is (predicted - healthy) / healthy. With
   ``--alt DIR``, runs slowed on every other step only (``--slow-every 2``): the unslowed steps
   of the same run are the real run without the delay (:func:`alternating`).
2. What-if agreement (``--corpus``: the OSDI'25 artifact's NDTimeline traces AR, SE, ST): per
   rank, the exposed waits the path's blame credits to it (``blame.rank_waited_ns``) against the
   what-if replay's blocking blame of that rank alone (``whatif`` ``blame``: slowdown with only its
   op times recorded); Spearman's rank correlation over the ranks, whether both name the same rank
   first, and the same per pipeline stage (ranks grouped by their ``stage``).

Writes the figures as JSON and prints them as Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from traceprof.engine import analysis  # noqa: E402
from traceprof.ingest.ingest import ingest  # noqa: E402
from traceprof.storage.store import Store  # noqa: E402

#: Runs whose unslowed steps vary less than this (coefficient of variation, %) were recorded with the
#: shared machine quiet enough to resolve a 5 % error; the others are reported, not judged.
QUIET_CV_PCT = 10.0
_SLOW = re.compile(r"^slow(step)?_r(\d+)_(\d+)ms$")
_ALT = re.compile(r"^alt(step)?_r(\d+)_(\d+)ms(_\w+)?$")


def _run(store: Store, name: str, analysis_name: str, **params: object):
    an = analysis.get(analysis_name)
    return an.run(store, an.params(run=name, **params))


def _ingest(store: Store, folders: list[Path]) -> None:
    known = set(store.sql("SELECT name FROM runs")["name"].to_list())
    todo = [f for f in folders if f.name not in known]
    if todo:
        ingest(store, todo)


def injected(store: Store, calib: Path) -> dict:
    """Section 1 of the module doc."""
    healthy = sorted(d for d in calib.glob("healthy_*") if (d / "rank3.trace.json.gz").exists())
    slowed = sorted(
        d
        for d in calib.iterdir()
        if d.is_dir() and _SLOW.match(d.name) and (d / "rank3.trace.json.gz").exists()
    )
    _ingest(store, healthy + slowed)
    per_healthy = {
        d.name: [int(x) for x in _run(store, d.name, "critical_path").steps["step_ns"]] for d in healthy
    }
    pooled = [x for v in per_healthy.values() for x in v]
    base = statistics.fmean(pooled)
    rows = []
    for d in slowed:
        m = _SLOW.match(d.name)
        assert m is not None
        rank, ms = int(m.group(2)), int(m.group(3))
        res = _run(store, d.name, "critical_path")
        steps = _removed(res, rank, ms)
        actual, removed = float(steps["step_ns"].mean()), float(steps["removed_ns"].mean())
        predicted = float(steps["predicted_ns"].mean())
        on_path = int(steps["sleep_ns"].is_not_null().sum())
        rows.append(
            {
                "run": d.name,
                "rank": rank,
                "sleep_ms": ms,
                "at": "step start" if m.group(1) else "before backward",
                "steps": steps.height,
                "steps_with_sleep_on_path": on_path,
                "actual_ms": actual / 1e6,
                "removed_ms": removed / 1e6,
                "predicted_ms": predicted / 1e6,
                "healthy_ms": base / 1e6,
                "error_pct": 100.0 * (predicted - base) / base,
                "blame_first_rank": int(res.blame["rank"][0]) if res.blame.height else None,
            }
        )
    spread = [statistics.fmean(v) / 1e6 for v in per_healthy.values()]
    return {
        "healthy_runs": len(healthy),
        "healthy_steps": len(pooled),
        "healthy_mean_ms": base / 1e6,
        "healthy_run_means_ms": [min(spread), max(spread)],
        "healthy_stdev_ms": statistics.stdev(pooled) / 1e6,
        "slowed": rows,
    }


def _removed(res, rank: int, ms: int) -> pl.DataFrame:
    """Per job step: step_ns, the sleep found on its path (the longest host-bound piece of ``rank``
    on it, null when rank has none there), removed_ns (that, up to ``ms``) and two predictions of
    the step without it: ``simple_ns`` = step - removed, and ``predicted_ns`` = the larger of that
    and the longest remaining chain of one rank, its own time in the step (its step_ns less its
    waits, and for ``rank`` less the sleep): once the delay is off the path, the path runs through
    the rank whose own work is longest, which may be another one; at most the step itself."""
    path = res.path.filter((pl.col("rank") == rank) & (pl.col("kind") == "host_bound"))
    sleep = path.group_by("step").agg(pl.col("duration_ns").max().alias("sleep_ns"))
    steps = res.steps.join(sleep, on="step", how="left").with_columns(
        pl.min_horizontal(pl.col("sleep_ns").fill_null(0), ms * 1_000_000).alias("removed_ns")
    )
    own = res.frame.join(steps.select("step", "removed_ns"), on="step").select(
        "step",
        (
            pl.col("step_ns")
            - pl.col("wait_ns")
            - pl.when(pl.col("rank") == rank).then(pl.col("removed_ns")).otherwise(0)
        ).alias("own_ns"),
    )
    longest = own.group_by("step").agg(pl.col("own_ns").max())
    steps = steps.join(longest, on="step", how="left").with_columns(
        (pl.col("step_ns") - pl.col("removed_ns")).alias("simple_ns")
    )
    # never above the step itself (a rank's window can start before the job's step)
    return steps.with_columns(
        pl.min_horizontal("step_ns", pl.max_horizontal("simple_ns", pl.col("own_ns").fill_null(0))).alias(
            "predicted_ns"
        )
    )


def alternating(store: Store, folder: Path) -> list[dict]:
    """Runs where rank R sleeps MS ms on every other step only (``record_samples.py --slow-every 2``,
    folders ``alt_r<R>_<MS>ms_*`` / ``altstep_r<R>_<MS>ms_*``): the steps without the sleep are the
    real run without the delay, under the same machine load. Prediction for each slowed step (even
    ProfilerStep number): its job step minus the sleep on its path; the median over the slowed
    steps is compared with the median of the unslowed steps of the same run (the first profiled
    step left out), and each slowed step with the mean of its two neighbours."""
    runs = sorted(
        d
        for d in folder.iterdir()
        if d.is_dir() and _ALT.match(d.name) and (d / "rank0.trace.json.gz").exists()
    )
    _ingest(store, runs)
    rows = []
    for d in runs:
        m = _ALT.match(d.name)
        assert m is not None
        rank, ms = int(m.group(2)), int(m.group(3))
        steps = _removed(_run(store, d.name, "critical_path"), rank, ms).sort("step")
        # each slowed step against its clean neighbours (the load drifts over a run on a shared machine)
        steps = steps.with_columns(
            ((pl.col("step_ns").shift(1) + pl.col("step_ns").shift(-1)) / 2).alias("_near")
        )
        steps = steps.slice(1)  # the first profiled step holds the profiler's start-up
        slowed, clean = steps.filter(pl.col("step") % 2 == 0), steps.filter(pl.col("step") % 2 == 1)
        # medians: a step stalled by another process on the shared cores moves a mean by 10-30%
        base, pred = float(clean["step_ns"].median()), float(slowed["predicted_ns"].median())
        simple = float(slowed["simple_ns"].median())
        paired = slowed.filter(pl.col("_near").is_not_null()).select(
            100.0 * (pl.col("predicted_ns") - pl.col("_near")) / pl.col("_near")
        )
        world = store.sql("SELECT world_size FROM runs WHERE name = ?", [d.name]).item()
        rows.append(
            {
                "run": d.name,
                "ranks": int(world),
                "rank": rank,
                "sleep_ms": ms,
                "at": "step start" if m.group(1) else "before backward",
                "slowed_steps": slowed.height,
                "clean_steps": clean.height,
                "slowed_ms": float(slowed["step_ns"].median()) / 1e6,
                "removed_ms": float(slowed["removed_ns"].median()) / 1e6,
                "predicted_ms": pred / 1e6,
                "clean_ms": base / 1e6,
                "clean_stdev_ms": float(clean["step_ns"].std()) / 1e6,
                "clean_cv_pct": 100.0 * float(clean["step_ns"].std()) / float(clean["step_ns"].mean()),
                "error_pct": 100.0 * (pred - base) / base,
                "simple_ms": simple / 1e6,
                "simple_error_pct": 100.0 * (simple - base) / base,
                "paired_median_error_pct": float(paired.to_series().median()) if paired.height else None,
            }
        )
    return rows


def _spearman(a: list[float], b: list[float]) -> float:
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / (va * vb) ** 0.5 if va and vb else float("nan")


def whatif_agreement(store: Store, corpus: Path) -> list[dict]:
    """Section 2 of the module doc."""
    files = sorted(corpus.glob("kineto_misc/bytedance_straggler_whatif/trace-*.parquet"))
    _ingest(store, files)
    out = []
    for f in files:
        name = f.name.removesuffix(".parquet")
        cp = _run(store, name, "critical_path")
        wi = _run(store, name, "whatif")
        waited = cp.blame.filter(pl.col("rank").is_not_null()).group_by("rank").agg(pl.col("waited_ns").sum())
        wb = wi.blame.filter((pl.col("by") == "rank") & (pl.col("kind") == "blocking")).select(
            pl.col("group").cast(pl.Int32).alias("rank"), "slowdown"
        )
        stage = store.sql(
            "SELECT DISTINCT rank, try_cast(json_extract(meta, '$.stage') AS INTEGER) AS stage FROM "
            "traces WHERE run_id = (SELECT run_id FROM runs WHERE name = ?)",
            [name],
        )
        both = (
            wb.join(waited, on="rank", how="left")
            .with_columns(pl.col("waited_ns").fill_null(0))
            .join(stage.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left")
        )
        rho = _spearman(both["waited_ns"].cast(pl.Float64).to_list(), both["slowdown"].to_list())
        top_cp = int(both.sort("waited_ns", "rank", descending=[True, False])["rank"][0])
        top_wi = int(both.sort("slowdown", "rank", descending=[True, False])["rank"][0])
        st = both.group_by("stage").agg(pl.col("waited_ns").sum(), pl.col("slowdown").max())
        st_cp = st.sort("waited_ns", "stage", descending=[True, False])["stage"][0]
        wst = wi.blame.filter((pl.col("by") == "stage") & (pl.col("kind") == "blocking"))
        st_wi = wst.sort("slowdown", "group", descending=[True, False])["group"][0] if wst.height else None
        total_wait = int(cp.frame["wait_ns"].sum())
        top_share = (
            float(waited.sort("waited_ns", descending=True)["waited_ns"][0]) / total_wait
            if total_wait
            else 0.0
        )
        out.append(
            {
                "trace": name,
                "ranks": both.height,
                "spearman_rank": rho,
                "first_rank_path": top_cp,
                "first_rank_whatif": top_wi,
                "first_stage_path": st_cp,
                "first_stage_whatif": st_wi,
                "first_rank_share_of_waits": top_share,
                "whatif_slowdown": float(wi.summary["slowdown"][0]),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calib", type=Path, default=Path("/work/calib"))
    ap.add_argument("--alt", type=Path, default=None, help="folder of alternating-delay runs (module doc)")
    ap.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    ap.add_argument("--db", type=Path, default=ROOT / "benchmarks" / "out" / "validate.duckdb")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "out" / "validate_critical_path.json")
    a = ap.parse_args()
    a.db.parent.mkdir(parents=True, exist_ok=True)
    store = Store(a.db)
    result: dict = {}
    if a.calib.exists():
        inj = result["injected"] = injected(store, a.calib)
        print(
            f"healthy: {inj['healthy_runs']} runs, {inj['healthy_steps']} steps, mean job step "
            f"{inj['healthy_mean_ms']:.1f} ms (run means {inj['healthy_run_means_ms'][0]:.1f}-"
            f"{inj['healthy_run_means_ms'][1]:.1f} ms, step stdev {inj['healthy_stdev_ms']:.1f} ms)\n"
        )
        print(
            "| run | sleep | steps (sleep on path) | actual ms | removed ms | predicted ms | healthy ms | error | blame first |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in inj["slowed"]:
            print(
                f"| {r['run']} | rank {r['rank']} {r['sleep_ms']} ms, {r['at']} | {r['steps']} "
                f"({r['steps_with_sleep_on_path']}) | {r['actual_ms']:.1f} | {r['removed_ms']:.1f} | "
                f"{r['predicted_ms']:.1f} | {r['healthy_ms']:.1f} | {r['error_pct']:+.1f}% | "
                f"rank {r['blame_first_rank']} |"
            )
        errs = [abs(r["error_pct"]) for r in inj["slowed"]]
        print(
            f"\n|error| mean {statistics.fmean(errs):.1f}%, max {max(errs):.1f}%, within 5%: "
            f"{sum(e <= 5 for e in errs)} of {len(errs)}\n"
        )
    if a.alt is not None and a.alt.exists():
        alt = result["alternating"] = alternating(store, a.alt)
        print(
            "| run | ranks | sleep (every other step) | slowed / clean steps | slowed ms | removed ms | step - removed "
            "(error) | predicted ms | clean ms (CV) | error | error vs neighbours (median) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in alt:
            near = "" if r["paired_median_error_pct"] is None else f"{r['paired_median_error_pct']:+.1f}%"
            print(
                f"| {r['run']} | {r['ranks']} | rank {r['rank']} {r['sleep_ms']} ms, {r['at']} | {r['slowed_steps']} / "
                f"{r['clean_steps']} | {r['slowed_ms']:.1f} | {r['removed_ms']:.1f} | {r['simple_ms']:.1f} "
                f"({r['simple_error_pct']:+.1f}%) | {r['predicted_ms']:.1f} | "
                f"{r['clean_ms']:.1f} ({r['clean_cv_pct']:.0f}%) | {r['error_pct']:+.1f}% | {near} |"
            )
        for what, sel in (
            ("all runs", alt),
            (
                f"quiet runs (clean steps' CV <= {QUIET_CV_PCT}%)",
                [r for r in alt if r["clean_cv_pct"] <= QUIET_CV_PCT],
            ),
        ):
            for col, name in (("error_pct", "predicted"), ("simple_error_pct", "step - removed")):
                errs = [abs(r[col]) for r in sel]
                if errs:
                    print(
                        f"\n{what}, {name}: |error| mean {statistics.fmean(errs):.1f}%, max {max(errs):.1f}%, "
                        f"within 5%: {sum(e <= 5 for e in errs)} of {len(errs)}"
                    )
        print()
    if (a.corpus / "kineto_misc").exists():
        agr = result["whatif"] = whatif_agreement(store, a.corpus)
        print(
            "| trace | ranks | Spearman (waits credited vs what-if alone S) | first rank path / what-if | "
            "first stage path / what-if | first rank's share of waits | what-if S |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in agr:
            print(
                f"| {r['trace']} | {r['ranks']} | {r['spearman_rank']:.2f} | {r['first_rank_path']} / "
                f"{r['first_rank_whatif']} | {r['first_stage_path']} / {r['first_stage_whatif']} | "
                f"{100 * r['first_rank_share_of_waits']:.0f}% | {r['whatif_slowdown']:.3f} |"
            )
    store.close()
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
