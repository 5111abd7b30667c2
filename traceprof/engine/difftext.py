"""The regression gate's words: the one-line summary and the reasons (``traceprof.engine.diff`` computes).

Nothing here decides anything: it phrases what :func:`traceprof.engine.diff.compare_profiles` found, with
long kernel and op names shortened to their family (``traceprof.core.names.shorten``).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from traceprof.core.names import shorten
from traceprof.core.term import label as quoted_label
from traceprof.engine import dropped, noise

__all__ = ["UNEVEN", "structural_reason", "summary_line", "causes"]

#: The reason's words for a structural total whose counts differ between the steps of a run (noise-tested).
UNEVEN = "counts differ between the steps of a run"


def structural_reason(r: dict[str, object]) -> str:
    """The ``reason`` of a structural metric's row: ``+17.8% > threshold 1% (exact)``, ``unchanged``,
    with what it was compared with when the baseline runs differ (``against``,
    :func:`traceprof.engine.structure.against_text`): the nearest run and its value, or the range."""
    th, ch = r["threshold_pct"], float(r["change_pct"])  # type: ignore[arg-type]
    against = str(r.get("against") or "")
    if r.get("base") is None and against:  # inside the range of baselines that differ: no one base
        return against
    varies = f" ({against})" if against else ""
    if not ch:
        return "unchanged" + varies
    return f"{ch:+.1f}% {'>' if ch > float(th) else '<='} threshold {th:g}% (exact){varies}"  # type: ignore[arg-type]


def _count(x: float) -> str:
    return f"{x:+,.0f}" if float(x).is_integer() else f"{x:+,.2f}"


def _structural_text(m: dict[str, object], changed: pl.DataFrame, world: int) -> str:
    """``flops +17.8% per step (> 1%): +2 aten::mm (512,128)@(128,512) per step on every rank, ...``"""
    name = str(m["metric"])
    if name == dropped.METRIC:  # a count of desyncs: its words name the ranks, instances, op and bytes
        return f"desync: {m['text']}"
    head = f"{name} {float(m['change_pct']):+.1f}% per step (> {m['threshold_pct']:g}%)"  # type: ignore[arg-type]
    by = {
        "flops": ("delta_flops", None),
        "comm_bytes": ("delta_bytes", ("collective",)),
        "collectives": ("delta_calls", ("collective",)),
        "launches": ("delta_calls", ("kernel", "op")),
    }
    if name not in by:  # a metric that words its own cause (peak_mem_bytes: the op whose memory grew)
        return head + (f": {m['text']}" if m.get("text") else "")
    col, kinds = by[name]
    rows = changed.filter(pl.col(col) > 0)
    if kinds:
        rows = rows.filter(pl.col("kind").is_in(kinds))
    if name == "flops":  # FLOPs come from ops: name them with their calls
        rows = rows.sort("delta_flops", descending=True)
        parts = [_key_text(r, world) for r in rows.head(3).iter_rows(named=True)]
    elif name == "launches":
        what = "kernels" if "kernel" in set(rows["kind"]) else "CPU ops"
        parts = [_rank_text(m, what, world)]
    else:
        parts = [_key_text(r, world) for r in rows.sort(col, descending=True).head(3).iter_rows(named=True)]
    return head + (": " + ", ".join(parts) if parts else "")


#: The structural totals of communication.
_COMM = ("collectives", "comm_bytes")


def _fewer_collectives(moved: pl.DataFrame, changed: pl.DataFrame, world: int) -> str:
    """Fewer collectives or bytes per step, named first in the summary (not gated: fusing buckets is
    an optimisation, but a dropped all-reduce is a bug, so it must not read as "within thresholds"):
    ``FEWER COLLECTIVES (not gated; check it is intended): collectives -25.0%, comm_bytes -26.2%
    per step: -1 all_reduce per step on every rank (-2.12 MiB)``; "" when neither decreased."""
    from traceprof.core.display import size

    down = moved.filter(pl.col("metric").is_in(_COMM) & (pl.col("change_pct") < 0))
    if down.is_empty():
        return ""
    head = ", ".join(f"{m['metric']} {m['change_pct']:+.1f}%" for m in down.iter_rows(named=True))
    rows = changed.filter((pl.col("kind") == "collective") & (pl.col("delta_calls") < 0))
    keys = [
        _key_text(r, world) + (f" ({size(r['delta_bytes'])} per step in all)" if r["delta_bytes"] else "")
        for r in rows.sort("delta_calls").head(3).iter_rows(named=True)
    ]
    return (
        "FEWER COLLECTIVES (not gated: fusing them is an optimisation; check none was dropped): "
        f"{head} per step" + (": " + ", ".join(keys) if keys else "")
    )


def _where(ranks: list[int], world: int) -> str:
    if len(ranks) >= world > 1:
        return "on every rank"
    return f"on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _rank_text(m: dict[str, object], what: str, world: int) -> str:
    """``+56 CPU ops per step on every rank`` from a structural metric's row."""
    ranks = list(m["ranks"])  # type: ignore[call-overload]
    if m["per_rank"] is not None:
        return f"{_count(float(m['per_rank']))} {what} per step {_where(ranks, world)}"  # type: ignore[arg-type]
    return f"{_count(float(m['delta']))} {what} per step in all ({_where(ranks, world)})"  # type: ignore[arg-type]


def _key_text(r: dict[str, object], world: int) -> str:
    ranks = list(r["ranks"])  # type: ignore[call-overload]
    per = float(r["delta_calls"]) / (len(ranks) if ranks else 1)  # type: ignore[arg-type]
    where = _where(ranks, world)
    shape = f" {r['shape']}" if r["shape"] else ""
    return f"{_count(per)} {shorten(str(r['name']), 60)}{shape} per step {where}"


def causes(metrics: pl.DataFrame, items: pl.DataFrame, ranks: pl.DataFrame) -> str:
    """What grew beyond its noise: compute items and ranks first; collectives only when compute did not grow."""
    bad = set(metrics.filter(pl.col("regressed") & (pl.col("layer") == "timing"))["metric"])
    grown_ranks = ranks.filter(pl.col("grew"))
    compute_grew = "compute_ns" in bad or grown_ranks.height > 0
    classes = (
        ["compute"]
        if compute_grew
        else ["comm", "memory", "compute"]
        if "exposed_comm_ns" in bad
        else ["compute", "memory", "comm"]
    )
    grew = (
        items.filter(pl.col("grew") & pl.col("class").is_in(classes))
        .sort(
            pl.col("class").replace_strict({c: i for i, c in enumerate(classes)}, default=9),
            -pl.col("delta_ns"),
        )
        .head(3)
    )
    parts = [
        f"{shorten(r['name'], 60)} +{r['delta_ns'] / 1e6:.2f} ms/step"
        + (f" ({r['delta_pct']:+.0f}%)" if r["delta_pct"] is not None else " (new)")
        for r in grew.iter_rows(named=True)
    ]
    text = ("grew: " + ", ".join(parts)) if parts else ""
    if grown_ranks.height:
        who = ", ".join(f"{r['rank']} ({r['change_pct']:+.0f}%)" for r in grown_ranks.iter_rows(named=True))
        text += ("; " if text else "") + f"compute grew on rank{'s' if grown_ranks.height > 1 else ''} {who}"
        if compute_grew:
            text += " (collective wait on the others is the symptom, not the cause)"
    return text


def _moved(m: dict[str, object]) -> str:
    """``step_time_ns +21.6%``: the metric's own change (its delta as % of its base value); for a
    metric gated as a share of the step (``exposed_comm_ns``, ``idle_ns``: ``diff.METRICS``) the
    change the gate tested, ``exposed_comm_ns +4.4% of the step``, in the unit of its noise and
    threshold (its own change, +66.9 % of a small base, would read as a large move next to ok)."""
    from traceprof.engine.diff import METRICS  # diff imports this module

    name = str(m["metric"])
    if METRICS.get(name, (True, False))[1] and m.get("change_pct") is not None:
        return f"{name} {float(m['change_pct']):+.1f}% of the step"  # type: ignore[arg-type]
    pct = m["delta_pct"]
    return f"{name} {float(pct):+.1f}%" if pct is not None else f"{name} {float(m['delta']):+g}"  # type: ignore[arg-type]


def summary_line(
    base: str,
    cand: str,
    verdict: str,
    layers: tuple[str, ...],
    metrics: pl.DataFrame,
    s_rows: list[dict[str, object]],
    changed: pl.DataFrame,
    items: pl.DataFrame,
    ranks: pl.DataFrame,
    k: int,
    uneven: Sequence[str] = (),
) -> str:
    """The gate's one-line CI summary: the verdict and its layers, then the structural changes past
    their thresholds (what was added, on which ranks), the timing regressions with their causes, and
    the figures of every inconclusive metric. ``uneven``: the structural totals whose counts differ
    between the steps of a run, each with those steps (``collectives ('drop1': step 5: 12 (the other
    steps 16))``): named instead of "no structural change"."""
    world = max(ranks.height, 1)
    head = f"{verdict.upper()}{' (' + ', '.join(layers) + ')' if layers else ''} {quoted_label(base)} -> {quoted_label(cand)}"
    struct = metrics.filter(pl.col("layer") == "structural")
    moved = struct.filter(pl.col("change_pct") != 0)
    tim = metrics.filter(pl.col("layer") == "timing")
    parts: list[str] = []
    if struct.filter(pl.col("regressed")).height:
        parts += [_structural_text(m, changed, world) for m in s_rows if m["regressed"]]
    elif moved.height:
        # growth is gated (within its threshold here); a decrease (less work, fewer collectives) is
        # not, and says so: "within thresholds" would hide a dropped all-reduce. Growth past its
        # threshold that was not gated (--force, another device kind) says that, as its row does.
        past = (pl.col("change_pct") > 0) & (pl.col("change_pct") > pl.col("threshold_pct"))
        for m in moved.filter(past).iter_rows(named=True):
            why = str(m["reason"]).removesuffix(structural_reason(m)).removesuffix(": ")
            parts.append(f"{why}: {m['metric']} {m['change_pct']:+.1f}% > {m['threshold_pct']:g}%")
        fewer = _fewer_collectives(moved, changed, world)
        if fewer:
            parts.append(fewer)
        for label, rows in (
            ("structure changed within thresholds", moved.filter((pl.col("change_pct") > 0) & ~past)),
            (
                "structure shrank (decreases are not gated)",
                moved.filter((pl.col("change_pct") < 0) & ~pl.col("metric").is_in(_COMM if fewer else ())),
            ),
        ):
            if rows.height:
                parts.append(
                    f"{label}: "
                    + ", ".join(f"{m['metric']} {m['change_pct']:+.1f}%" for m in rows.iter_rows(named=True))
                )
    else:  # a total that differs between steps is noise-tested: a change of counts, but not an exact one
        parts.append(
            f"step counts differ, so no exact structural comparison: {', '.join(uneven)}"
            if uneven
            else "no structural change"
        )
    if "timing" in layers:
        parts += [
            f"{_moved(m)} ({m['reason']})" for m in tim.filter(pl.col("regressed")).iter_rows(named=True)
        ]
        cause = causes(metrics, items, ranks)
        if cause:
            parts.append(cause)
    unsure = tim.filter(pl.col("verdict") == noise.INCONCLUSIVE)
    if unsure.height:
        parts.append(
            "inconclusive: " + ", ".join(f"{_moved(m)} ({m['reason']})" for m in unsure.iter_rows(named=True))
        )
    clear = pl.col("reason").str.starts_with(noise.NO_REGRESSION)
    parts += [f"{_moved(m)} ({m['reason']})" for m in tim.filter(clear).iter_rows(named=True)]
    within = tim.filter(~clear)
    if verdict == noise.OK and within.height:
        parts.append(
            "timing within thresholds ("
            + ", ".join(f"{_moved(m)}, noise {m['noise_pct']:.1f}%" for m in within.iter_rows(named=True))
            + ")"
        )
    runs = f" ({k} baseline runs)" if k > 1 and "," not in base else ""
    return f"{head}{runs}: " + "; ".join(parts)
