"""Findings: what a run's analyses say, ranked by what they cost, one line each.

The report opens with these and ``traceprof summary`` prints them. Nothing here renders: a
:class:`Findings` holds plain strings and numbers; the report and the CLI format them.

Algorithm:
  1. Run the report's analyses on the run (:func:`run_analyses`); an analysis that does not apply
     (a :class:`~traceprof.errors.TraceprofError`, e.g. no GPU kernels in a Flight Recorder-only
     run) becomes a :class:`Missing` entry with what the run lacks and how to record it.
  2. Per topic, read the results into findings with a cost in % of step time (``parallelism``:
     exposed communication per mesh axis and the pipeline bubble, informational; its slow stages
     and replicas reach the straggler verdict through ``traceprof.verdict``):
     stragglers (``stragglers`` verdict + ``whatif``: cost 100·(S − 1) of the named rank alone, the
     straggler analysis' ``cost_pct``; the combined verdict of ``traceprof.verdict`` where it exists),
     exposed communication (``overlap`` exposed_comm_pct, the worst rank, with the top cause from
     ``gaps``), idle (``temporal`` idle_pct), MFU (``mfu`` job: informational, no cost), and the
     regression against baselines (``traceprof.diff``: its verdict; cost: the step-time change of a
     regression), and on runs with
     Flight Recorder or NCCL-plugin data a hang ``desync`` finds (its verdict: no cost, a problem
     unless clean), and on runs that recorded memory the ``memory`` findings (a rank near its
     capacity, imbalanced groups, out-of-memory records: no cost, a problem).
  3. Give each finding the time it could recover by the step account (``critical_path``,
     :func:`_recoverable`: % of all ranks' step time), rank them by it, largest first (by their cost
     where the account has no figure; those without either last), and give one combined verdict
     per topic (``problem``, ``ok`` or ``n/a``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import queue
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl

from traceprof import analysis as registry
from traceprof import cancel
from traceprof.activity import GRAPH_LEVEL_NOTE
from traceprof.analysis import FrameResult
from traceprof.errors import TraceprofError, UsageError
from traceprof.names import shorten
from traceprof.runs import run_name
from traceprof.store import Store

__all__ = ["Finding", "Verdict", "Missing", "Findings", "REPORT_ANALYSES", "run_analyses", "build", "summarize"]

#: Analyses the report and the summary run, in report order (those not registered are skipped).
#: ``nccl_sum``: collective efficiency (time split into wait / launch / transfer, busbw against the link).
REPORT_ANALYSES = ("temporal", "overlap", "gaps", "idle", "kernels", "launch", "stragglers", "whatif", "parallelism",
                   "nccl_sum", "mfu", "critical_path")

#: What each analysis needs and how to get it, shown when it does not apply to a run.
NEEDS = {
    "temporal": "GPU kernels or CPU training-thread ops (a Kineto trace)",
    "overlap": "GPU kernels or CPU training-thread ops (a Kineto trace)",
    "gaps": "GPU kernels or CPU training-thread ops (a Kineto trace)",
    "idle": "GPU kernels (a Kineto trace with CUDA activity) to say why each GPU stream is idle (an idle "
            "verdict without them is temporal's)",
    "kernels": "GPU kernels (a Kineto trace with CUDA activity)",
    "launch": "GPU kernels and their CPU launches (a Kineto trace with CUDA activity)",
    "stragglers": "collectives matched across 2+ ranks (Kineto or Flight Recorder traces of every rank)",
    "whatif": "per-step ops and collectives on 2+ ranks (Kineto traces of every rank, or NDTimeline)",
    "desync": "collectives with process group and sequence number (Flight Recorder or NCCL-plugin dumps)",
    "nccl_sum": "collectives or communication kernels (any source)",
    "memory": "memory records (torch.profiler profile_memory=True, nsys --cuda-memory-usage=true, or "
              "export_memory_timeline)",
    "parallelism": "collectives or compute and communication activity (any trace with process groups)",
    "mfu": "ProfilerSteps and a FLOPs source (record_shapes=True, the traceprof collector, or -p mfu.model_flops_per_step=)",
    "critical_path": "GPU kernels, CPU training-thread ops or op-level ranges (Kineto, Nsight or NDTimeline traces)",
}
HOW = ("record every rank with torch.profiler (collectors/kineto/capture.py: profile_ranks, or "
       "`traceprof collect`), with CUDA activity on GPUs and record_shapes=True")

#: Kernel and op names longer than this are shortened to their family in a finding's text.
NAME_WIDTH = 60

#: A straggler costs the job when the what-if slowdown of its rank alone exceeds this (OSDI'25: S > 1.1).
STRAGGLING_S = 1.1


@dataclass(frozen=True)
class Finding:
    """One line of the findings list.

    ``topic``: stragglers, communication, idle, mfu, memory, desync or regression; ``text``: the
    finding with its evidence, long kernel and op names shortened (``traceprof.names.shorten``);
    ``cost_pct``: % of step time it costs (None: no cost measured); ``problem``: whether it is
    something to fix; ``section``: the report section with the detail; ``full``: the text with full
    names where ``text`` shortened one (the report shows it on hover), else empty; ``status``: its
    topic's verdict (``problem``, ``ok``, ``n/a``; ``info`` for a topic without one), set by
    :func:`build`, which also sets ``problem`` to ``status == "problem"``: one verdict per topic,
    so the findings list, the verdicts table, ``summary -f json`` and the report never disagree;
    ``rank``: the rank a straggler finding names; ``recoverable_pct``: the time fixing it could
    recover by the step account (``critical_path``), % of all ranks' step time (None: no figure).
    """

    topic: str
    text: str
    cost_pct: float | None
    problem: bool
    section: str
    full: str = ""
    status: str = ""
    rank: int | None = None
    recoverable_pct: float | None = None

    @property
    def rank_by(self) -> float | None:
        """What findings are ranked by: ``recoverable_pct`` where the account gives one, else ``cost_pct``."""
        return self.recoverable_pct if self.recoverable_pct is not None else self.cost_pct


@dataclass(frozen=True)
class Verdict:
    """The combined verdict of one topic: ``status`` problem, ok, n/a or (the regression gate)
    inconclusive, and one line of ``text``."""

    topic: str
    status: str
    text: str


@dataclass(frozen=True)
class Missing:
    """An analysis that does not apply to the run: why (the analysis' message) and what it needs."""

    analysis: str
    reason: str
    needs: str


@dataclass(frozen=True)
class Findings:
    """Ranked findings, verdicts per topic and the analyses that did not apply, for one run."""

    run: str
    findings: tuple[Finding, ...]
    verdicts: tuple[Verdict, ...]
    missing: tuple[Missing, ...]
    results: dict[str, FrameResult] = field(default_factory=dict)
    hta: bool = False

    @property
    def empty_text(self) -> str:
        """What the findings list says when it is empty (the summary and the report say the same)."""
        if self.verdicts:
            return "nothing found that costs step time; the verdict per topic follows"
        return "no findings: no analysis applied to this run"

    @property
    def ranking(self) -> str:
        """How the findings are ranked, in words (the summary and the report say it)."""
        if any(f.recoverable_pct is not None for f in self.findings):
            return ("Ranked by the time each could recover by the step account (critical_path), in % of all ranks' "
                    "step time; the others by what they cost, in % of step time")
        return "Ranked by what they cost, in % of step time"

    def to_frame(self) -> pl.DataFrame:
        """Findings as a frame: position, topic, cost_pct (% of step time, null if none),
        recoverable_pct (% of all ranks' step time by the step account, null if none), problem,
        status (the topic's verdict), finding."""
        return pl.DataFrame(
            {"position": list(range(1, len(self.findings) + 1)), "topic": [f.topic for f in self.findings],
             "cost_pct": [f.cost_pct for f in self.findings],
             "recoverable_pct": [f.recoverable_pct for f in self.findings], "problem": [f.problem for f in self.findings],
             "status": [f.status for f in self.findings], "finding": [f.text for f in self.findings]},
            schema={"position": pl.Int64, "topic": pl.Utf8, "cost_pct": pl.Float64, "recoverable_pct": pl.Float64,
                    "problem": pl.Boolean, "status": pl.Utf8, "finding": pl.Utf8})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: run, findings, verdicts, missing."""
        return {"run": self.run, "findings": self.to_frame().to_dicts(),
                "verdicts": [v.__dict__ for v in self.verdicts], "missing": [m.__dict__ for m in self.missing]}


def run_analyses(store: Store, run_id: int, params: dict[str, dict[str, str]] | None = None,
                 names: tuple[str, ...] = REPORT_ANALYSES) -> dict[str, FrameResult | TraceprofError]:
    """Run ``names`` on a run; an analysis that does not apply gives its error instead of a result.

    On a read-only store with two or more CPUs the analyses run on :data:`THREADS` threads, each
    with its own connection (``Store.for_thread``), sharing results inside the caller's
    :func:`~traceprof.analysis.reuse_results` (see :func:`_run_all`). The results do not depend
    on the threads: each analysis reads the store alone.

    Args:
        store: An open store.
        run_id: The run.
        params: Parameters per analysis as strings, e.g. ``{"mfu": {"peak_tflops": "989"}}``.
        names: Analyses to run (those not registered are skipped).

    Returns:
        Name -> result or error, in ``names`` order (``desync`` last, when it applies).

    Raises:
        UsageError: A parameter names no such analysis or has a bad value.
        KeyboardInterrupt: Ctrl-C, once the threads have stopped (their queries interrupted, their
            Python at its next ``traceprof.cancel`` checkpoint).
    """
    params = params or {}
    known = set(registry.names())
    desync = names == REPORT_ANALYSES and "desync" in known  # hang triage, on the runs whose sources record it
    allowed = (*names, "memory", "desync") if desync else (*names, "memory")  # memory: on runs that recorded it
    unknown = set(params) - set(allowed)
    if unknown:
        raise UsageError(f"no report analysis {sorted(unknown)[0]!r}; choose from: {', '.join(allowed)}")
    if desync and "desync" in params:
        _params("desync", run_id, params["desync"])  # a bad value is refused on every run, not only where it runs
    if desync and store.sql(
            "SELECT count(*) FROM traces WHERE run_id = ? AND source IN ('flight_recorder', 'nccl_profiler')",
            [run_id]).item():
        names = (*names, "desync")
    if names == REPORT_ANALYSES and "memory" in known and _has_memory(store, run_id):
        names = (*names, "memory")
    todo = [(name, registry.get(name), _params(name, run_id, params.get(name, {}))) for name in names if name in known]
    return _run_all(store, todo)


def _params(name: str, run_id: int, options: dict[str, str]) -> Any:
    """Analysis ``name``'s parameters from ``-p name.key=value`` options.

    Raises:
        UsageError: A bad value, named as given (``mfu.peak_tflops='abc': expected a number``).
    """
    try:
        return registry.make_params(registry.get(name), str(run_id), options)
    except UsageError as e:
        given = tuple(f"{k.replace('-', '_')}=" for k in options)
        if given and str(e).startswith(given):
            raise UsageError(f"{name}.{e}") from None
        raise


#: Threads :func:`run_analyses` uses at most (``TRACEPROF_THREADS`` sets it: 1 for the least
#: memory). DuckDB, polars and numpy release the GIL in their loops, so a second thread keeps the
#: second core busy while the first runs Python (the what-if graph): the cold report of 8 ranks x
#: 1 M events took 26-29 s on one thread and 1.5 cores. More threads hold more analyses' frames at once.
THREADS = 2

#: Analyses started first: the longest (what-if, whose result stragglers reads) on one thread
#: while the other works through the rest.
_FIRST = ("whatif",)


def _threads() -> int:
    """Threads for the analyses: ``TRACEPROF_THREADS`` or :data:`THREADS`, at most the CPUs this
    process may run on.

    Raises:
        UsageError: ``TRACEPROF_THREADS`` is not a whole number of 1 or more.
    """
    raw = os.environ.get("TRACEPROF_THREADS", "").strip()
    want = THREADS
    if raw:
        try:
            want = int(raw)
        except ValueError:
            want = 0
        if want < 1:
            raise UsageError(f"TRACEPROF_THREADS={raw!r}: expected a whole number of threads, 1 or more")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(want, cpus))


def _one(an: registry.Analysis, store: Store, p: Any) -> FrameResult | TraceprofError:
    try:
        return an.run(store, p)
    except UsageError:
        raise
    except TraceprofError as e:
        return e


def _run_all(store: Store, todo: list[tuple[str, registry.Analysis, Any]]) -> dict[str, FrameResult | TraceprofError]:
    """Each (name, analysis, params) of ``todo`` run on ``store``, on threads when it can (see
    :func:`run_analyses`): each thread takes the next analysis, :data:`_FIRST` first, on a
    connection of its own; an analysis another thread is computing (whatif for stragglers, the
    activity frame) is waited for, not computed twice (``traceprof.analysis`` memo)."""
    threads = min(_threads(), len(todo))
    if threads < 2 or not store.read_only:
        return {name: _one(an, store, p) for name, an, p in todo}
    order = sorted(todo, key=lambda t: t[0] not in _FIRST)  # stable: the rest in report order
    with contextlib.ExitStack() as stack:
        views = [stack.enter_context(store.for_thread()) for _ in range(threads)]
        free: queue.SimpleQueue[Store] = queue.SimpleQueue()
        for v in views:
            free.put(v)

        def task(an: registry.Analysis, p: Any) -> FrameResult | TraceprofError:
            view = free.get()
            try:
                return _one(an, view, p)
            finally:
                free.put(view)

        pool = ThreadPoolExecutor(threads, thread_name_prefix="traceprof-analysis")
        with cancel.scope() as stop:
            futures = {name: pool.submit(contextvars.copy_context().run, task, an, p) for name, an, p in order}
        try:
            pending = set(futures.values())
            while pending:  # a timed wait, so that Ctrl-C reaches this thread
                _, pending = wait(pending, timeout=0.1)
        except KeyboardInterrupt:
            # Drop the queued analyses; stop the running ones at their next checkpoint (a query, a
            # level of a what-if replay: traceprof.cancel) and interrupt their queries, until they
            # have stopped: the connections close after them.
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            running = {f for f in futures.values() if not f.done()}
            while running:
                for v in views:
                    with contextlib.suppress(duckdb.Error):
                        v.con.interrupt()
                _, running = wait(running, timeout=0.05)
            raise
        pool.shutdown()
        return {name: futures[name].result() for name, _, _ in todo}


def _num(v: object) -> float:
    """A polars scalar (sum, mean, median) as float; null as 0."""
    return float(v) if isinstance(v, int | float) else 0.0


def _ms(ns: float) -> str:
    from traceprof.display import duration

    return duration(ns)


def _alone_slowdown(row: dict[str, Any], blame: pl.DataFrame | None) -> float | None:
    """The job's what-if slowdown from one rank's recorded times alone: the straggler analysis'
    ``cost_pct`` (slowdown - 1, in %) where it has one, else the largest ``whatif`` blame slowdown
    of that rank."""
    if row.get("cost_pct") is not None:
        return 1.0 + float(row["cost_pct"]) / 100.0
    if blame is None or blame.is_empty() or not {"by", "group", "slowdown"} <= set(blame.columns):
        return None
    mine = blame.filter((pl.col("by") == "rank") & (pl.col("group") == str(row["rank"])))["slowdown"]
    return float(mine.max()) if mine.len() else None  # type: ignore[arg-type]


def _combined(store: Store, run_id: int, findings: list[Finding],
              params: dict[str, dict[str, str]] | None = None) -> tuple[list[Finding], Verdict | None]:
    """The straggler verdict of ``traceprof.verdict`` (stragglers and whatif read together) where
    that module exists; None otherwise or when it does not apply."""
    try:
        from traceprof import verdict
    except ImportError:
        return findings, None
    try:
        v = verdict.combined_verdict(store, str(run_id), params)
    except TraceprofError:
        return findings, None
    absorbed = set(v.figures.get("mesh_absorbed", ()))  # named as their slow stage or replica instead
    findings = [f for f in findings if not any(f.text.startswith(_RANK_FINDING.format(r)) for r in absorbed)]
    s_max = max((x for x in (v.slowdown, v.host_slowdown) if x is not None), default=None)
    if v.status == "problem" and not v.stragglers:
        # A group or stage to blame, no single rank: costed as a named straggler is, by the what-if
        # slowdown (S - 1, in %), the larger of blocking and host.
        cost = 100.0 * (s_max - 1) if s_max is not None else None
        findings = [*findings, Finding("stragglers", v.text, cost, True, "whatif")]
    elif v.status == "ok" and s_max is not None and s_max > verdict.STRAGGLING_S:
        # slower than ideal with nothing to blame: the run's variability, said (no cost: not a problem)
        findings = [*findings, Finding("stragglers", v.text, None, False, "whatif")]
    return findings, Verdict("stragglers", v.status, v.text)


def _stragglers(res: dict[str, FrameResult], store: Store, run_id: int,
                params: dict[str, dict[str, str]] | None = None) -> tuple[list[Finding], Verdict | None]:
    st, wi = res.get("stragglers"), res.get("whatif")
    if st is None and wi is None:
        return [], None
    findings, verdict = _straggler_findings(st, wi)
    if st is not None:  # the combined verdict, where traceprof.verdict exists, replaces this module's
        named = [f for f in findings if f.problem]
        found, combined = _combined(store, run_id, named, params)
        if combined is not None:
            findings, verdict = found, combined
    caveat = _early_end_caveat(st)
    if not caveat:
        return findings, verdict
    # every straggler problem rests on the arrivals (the what-if replay too): say what is off with them
    findings = [dataclasses.replace(f, text=f.text + caveat, full=f.full and f.full + caveat)
                if f.topic == "stragglers" and f.problem else f for f in findings]
    if verdict is not None and verdict.status == "problem":
        verdict = dataclasses.replace(verdict, text=verdict.text + caveat)
    return findings, verdict


#: Share of rank copies ending before their collective's last arrival past which a straggler finding
#: says its waits are not to be trusted (a few are clock noise; most mean the match or the clocks are off).
EARLY_END_SHARE = 0.01


def _early_end_caveat(st: FrameResult | None) -> str:
    """"; caution: ..." when over :data:`EARLY_END_SHARE` of the rank copies (``stragglers``'
    ``waits`` rows) ended before their instance's last arrival (``end_before_last_arrival``), which
    no collective can: the waits and lateness measured from those arrivals are overstated; else ""."""
    waits = st.frames().get("waits") if st is not None else None
    if waits is None or "end_before_last_arrival" not in waits.columns or not waits.height:
        return ""
    early = int(waits["end_before_last_arrival"].sum())  # false where a source records no end
    if early / waits.height <= EARLY_END_SHARE:
        return ""
    return (f"; caution: {early:,} of {waits.height:,} rank copies ended before their collective's last arrival, "
            "which no collective can: the match, the clock alignment or the timestamps are off, so these waits "
            "are overstated")


#: How a straggler rank's finding begins (``_combined`` drops those of ranks the verdict names as a group).
_RANK_FINDING = "rank {} is a straggler"


def _parallelism(res: dict[str, FrameResult]) -> tuple[list[Finding], Verdict | None]:
    """Informational findings of ``parallelism``: exposed communication per mesh axis, and the
    pipeline's bubble split of the stage with the largest bubble beyond the schedule's own (no
    cost: the exposed time is the communication finding's, a slow stage the straggler verdict's).
    Where ``stragglers`` does not apply (nothing matched across ranks), its slow stages and
    replicas are the stragglers topic's findings, with their cost."""
    p = res.get("parallelism")
    if p is None:
        return [], None
    out, verdict = [], None
    slow = p.frames()["slow"].filter(pl.col("slow")) if "slow" in p.frames() and p.frames()["slow"].height else None
    if slow is not None and slow.height and res.get("stragglers") is None:
        # no straggler verdict (no collective matched across ranks): the slow stages speak here
        out += [Finding("stragglers", r["text"], r["cost_pct"], True, "parallelism") for r in slow.iter_rows(named=True)]
        verdict = Verdict("stragglers", "problem", "; ".join(slow["text"].to_list()))
    axes = p.frame.filter(pl.col("exposed_comm_ns") > 0)
    total = _num(axes["exposed_comm_ns"].sum()) if axes.height else 0.0
    mesh = next((n for n in p.notes if n.startswith("mesh ")), "").split(" (")[0]
    if total and axes.height >= 2:  # one axis (a DDP run): the communication finding says it all
        parts = ", ".join(f"{r['axis']} {r['exposed_pct']:.0f}% ({_ms(r['exposed_comm_ns'])})"
                          for r in axes.iter_rows(named=True))
        out.append(Finding("parallelism", f"exposed communication by mesh axis ({mesh}): {parts}", None, False,
                           "parallelism"))
    stages = p.frames().get("stages")
    if stages is not None and stages.height:
        top = stages.with_columns((pl.col("bubble_ns") - pl.col("schedule_bubble_ns")).alias("_x")).sort(
            "_x", "stage", descending=[True, False]).row(0, named=True)
        step = top["step_ns"] or 1
        out.append(Finding("parallelism", (
            f"pipeline bubble: stage {top['stage']} idle {top['bubble_pct']:.0f}% of its {_ms(step)} step: schedule "
            f"{100 * top['schedule_bubble_ns'] / step:.0f}% ({top['schedule_from']}), imbalance "
            f"{100 * top['imbalance_ns'] / step:.0f}%, p2p wait {100 * top['p2p_wait_ns'] / step:.0f}%, other "
            f"{100 * top['other_ns'] / step:.0f}%"), None, False, "parallelism"))
    return out, verdict


def _straggler_findings(st: FrameResult | None, wi: FrameResult | None) -> tuple[list[Finding], Verdict | None]:
    """Findings and verdict from the ``stragglers`` and ``whatif`` results alone."""
    s_job = alone = None
    if wi is not None and "summary" in wi.frames() and wi.frames()["summary"].height:
        s_job = wi.frames()["summary"]["slowdown"][0]
    blame = wi.frames().get("blame") if wi is not None else None
    findings: list[Finding] = []
    named = st.frames()["verdict"].filter(pl.col("named")) if st is not None and "verdict" in st.frames() else None
    if named is not None and named.height:
        per = st.frame if st is not None else pl.DataFrame()
        for v in named.iter_rows(named=True):
            r = per.filter(pl.col("rank") == v["rank"]).row(0, named=True)
            alone = _alone_slowdown(r, blame)
            # the straggler analysis' own cost (S alone - 1, in %) where it has one, so the two agree
            cost = (float(r["cost_pct"]) if r.get("cost_pct") is not None
                    else 100.0 * (alone - 1) if alone and alone > 1 else None)
            waited = f"the others waited {_ms(r['wait_caused_ns'])} in total"
            late = f"median {_ms(r['median_lateness_ns'])} late" + (
                f" ({r['late_step_pct']:.0f}% of a step)" if r.get("late_step_pct") is not None else "")
            faster = f"; without its delays steps would be {alone:.2f}x faster (what-if)" if alone and alone > 1 else ""
            text = (_RANK_FINDING.format(v["rank"]) + f": last at {r['last_count']}/{r['instances']} collectives, "
                    f"{late}, {waited}; late because of {v['cause']}{faster}")
            findings.append(Finding("stragglers", text, cost, True, "stragglers", rank=int(v["rank"])))
        verdict = Verdict("stragglers", "problem", findings[0].text if len(findings) == 1 else
                          f"ranks {', '.join(str(r) for r in named['rank'])} are stragglers")
        return findings, verdict
    why = st.frames()["verdict"]["evidence"][0] if st is not None and "verdict" in st.frames() and \
        st.frames()["verdict"].height else "no straggler analysis"
    text = "no straggler: " + why.removeprefix("no single straggler: ").removeprefix("no straggler: ")
    if s_job is not None and s_job > STRAGGLING_S:
        text += (f"; steps are {s_job:.2f}x the what-if ideal, from op-time variation spread over the ranks "
                 "(no single rank explains it)")
        findings.append(Finding("stragglers", text, None, False, "whatif"))
    elif s_job is not None:
        text += f"; what-if slowdown S = {s_job:.2f} (straggling above {STRAGGLING_S})"
    return findings, Verdict("stragglers", "ok", text)


def _communication(res: dict[str, FrameResult]) -> tuple[list[Finding], Verdict | None]:
    ov = res.get("overlap")
    if ov is None or ov.frame.is_empty() or "exposed_comm_pct" not in ov.frame.columns:
        return [], None
    df = ov.frame.filter(pl.col("exposed_comm_pct").is_not_null())
    if df.is_empty() or (df["comm_ns"] == 0).all():
        if _graph_level(ov):  # communication inside a graph traced per graph is not seen
            return [], Verdict("communication", "n/a", "no communication kernels in the trace, but CUDA graphs were "
                               "traced per graph and may hold some: record them with nsys profile "
                               "--cuda-graph-trace=node")
        return [], Verdict("communication", "ok", "no communication in the trace")
    worst = df.sort(["exposed_comm_pct", "rank"], descending=[True, False]).row(0, named=True)
    median = _num(df["exposed_comm_pct"].median())
    cause = full_cause = ""
    gaps = res.get("gaps")
    if gaps is not None and gaps.frame.height and "cause" in gaps.frame.columns:
        top = gaps.frame.row(0, named=True)
        cause = f"; largest cause: {top['cause']} ({top['pct']:.0f}% of exposed time)"
        before = top.get("before") or ""
        if len(before) > NAME_WIDTH:  # a 1,000-character kernel name: its family, the full name on hover
            full_cause, cause = cause, cause.replace(before, shorten(before, NAME_WIDTH))
    overlap = f"{worst['overlap_pct']:.0f}% of its communication hidden" if worst.get("overlap_pct") is not None else ""
    text = (f"exposed communication: {worst['exposed_comm_pct']:.0f}% of the window on rank {worst['rank']} "
            f"({_ms(worst['exposed_comm_ns'])}; {overlap}; median over ranks {median:.0f}%){cause}")
    cost = median
    st = res.get("stragglers")
    if st is not None and _named_ranks(res) and "wait_ns" in st.frame.columns:
        # Waiting at a collective for a late peer shows as exposed communication: it is the
        # straggler's cost (counted there), so only the exposed time beyond it costs here.
        own = df.join(st.frame.select("rank", "wait_ns"), on="rank", how="left").select(
            (100.0 * (pl.col("exposed_comm_ns") - pl.col("wait_ns").fill_null(0)).clip(0) / pl.col("window_ns"))
            .median())
        cost = float(own.item() or 0.0)
        named = ", ".join(map(str, _named_ranks(res)))
        text = (f"exposed communication beyond waiting for the straggler (rank {named}): {cost:.0f}% of the window "
                f"(median over ranks); with the wait, {text.removeprefix('exposed communication: ')}")
    problem = cost >= 5.0
    full = text.replace(cause, full_cause) if full_cause else ""
    f = Finding("communication", text, cost, problem, "gaps" if cause else "overlap", full)
    return [f], Verdict("communication", "problem" if problem else "ok", text)


def _graph_level(res: FrameResult) -> bool:
    """Whether an analysis noted GPU records that stand for whole CUDA graphs (``traceprof.activity``)."""
    return GRAPH_LEVEL_NOTE in res.notes


def _named_ranks(res: dict[str, FrameResult]) -> list[int]:
    """The ranks the ``stragglers`` analysis names, and those it reports as part of a slow stage or
    replica (``slow_group``): their lateness is the straggler finding's either way."""
    st = res.get("stragglers")
    if st is None or "verdict" not in st.frames() or st.frames()["verdict"].is_empty():
        return []
    v = st.frames()["verdict"]
    late = pl.col("named") | pl.col("slow_group").is_not_null() if "slow_group" in v.columns else pl.col("named")
    return [int(r) for r in v.filter(late)["rank"]]


def _idle(res: dict[str, FrameResult]) -> tuple[list[Finding], Verdict | None]:
    te = res.get("temporal")
    if te is None or te.frame.is_empty():
        return [], None
    cpu = res.get("idle") is None
    what = "the training thread" if cpu else "the GPU"
    named = _named_ranks(res)
    others = te.frame.filter(~pl.col("rank").is_in(named))
    if named and others.height:
        # A straggler's own idle time (its sleep, its stall) is why it is late: the straggler
        # finding counts it, so idle costs what the other ranks are idle.
        mean = _num(others["idle_pct"].mean())
        own = te.frame.filter(pl.col("rank").is_in(named)).sort("rank")
        theirs = ", ".join(f"rank {r['rank']} {r['idle_pct']:.0f}%" for r in own.iter_rows(named=True))
        worst = others.sort(["idle_pct", "rank"], descending=[True, False]).row(0, named=True)
        text = (f"{what} is idle {mean:.0f}% of the window (mean over the ranks that are not stragglers; rank "
                f"{worst['rank']} {worst['idle_pct']:.0f}%); the straggler's own idle time ({theirs}) is "
                "counted in its finding")
    else:
        mean = _num(te.frame["idle_pct"].mean())
        worst = te.frame.sort(["idle_pct", "rank"], descending=[True, False]).row(0, named=True)
        text = (f"{what} is idle {mean:.0f}% of the window (mean over ranks; rank {worst['rank']} "
                f"{worst['idle_pct']:.0f}%)")
    idle = res.get("idle")
    if idle is not None and "ranks" in idle.frames():
        r = idle.frames()["ranks"]
        host = _num(r["host_wait_ns"].sum())
        total = _num(r["stream_idle_sum_ns"].sum()) if "stream_idle_sum_ns" in r.columns else 0.0
        if total:
            text += f"; host wait (kernels launched late) is {100.0 * host / total:.0f}% of stream idle time"
    if _graph_level(te):
        text += ("; CUDA graphs were traced per graph: each execution counts as busy compute time (nsys profile "
                 "--cuda-graph-trace=node records their kernels)")
    problem = mean >= 10.0
    return [Finding("idle", text, mean, problem, "temporal")], Verdict("idle", "problem" if problem else "ok", text)


def _mfu(res: dict[str, FrameResult], errors: dict[str, TraceprofError]) -> tuple[list[Finding], Verdict | None]:
    m = res.get("mfu")
    if m is None:
        why = str(errors["mfu"]) if "mfu" in errors else "not run"
        return [], Verdict("utilization", "n/a", f"MFU unknown: {why}")
    job = m.frames()["job"].row(0, named=True)
    dtype, src, dev = job.get("dtype"), job.get("dtype_source"), job.get("peak_device")
    if job["mfu_pct"] is None:
        note = next((n for n in m.notes if "MFU left empty" in n), "no device peak")
        text = f"{job['tflops']:.3g} TFLOP/s per device; MFU unknown: {note}"
        return [Finding("mfu", text, None, False, "mfu")], Verdict("utilization", "n/a", text)
    peak = f"{dtype} peak {job['peak_tflops']:g} TFLOP/s" + (f", {dev}" if dev else "")
    text = (f"MFU {job['mfu_pct']:.1f}% ({peak}; precision from {src}; FLOPs from {job['flops_source']}); "
            f"{job['tflops']:.3g} TFLOP/s per device")
    over = next((n for n in m.notes if n.startswith("MFU above 100%")), None)
    if over is not None or job["mfu_pct"] > 100.0:  # never "ok": the inputs are wrong, so is the number
        why = over or "MFU above 100%: impossible, so the FLOPs per step or the peak is wrong (check model_flops_per_step, dtype, peak_tflops)"
        text = f"MFU unknown: {why}; computed: {text}"
        return [Finding("mfu", text, None, True, "mfu")], Verdict("utilization", "n/a", text)
    problem = job["mfu_pct"] < 30.0
    return [Finding("mfu", text, None, problem, "mfu")], Verdict("utilization", "problem" if problem else "ok", text)


def _desync(res: dict[str, FrameResult]) -> tuple[list[Finding], Verdict | None]:
    """The ``desync`` verdict (a hang: ranks out of step, or one that recorded nothing)."""
    d = res.get("desync")
    verdict = getattr(d, "verdict", None)
    if verdict is None or verdict.is_empty():
        return [], None
    v = verdict.row(0, named=True)
    if v["status"] == "clean":
        return [], Verdict("desync", "ok", v["text"])
    return [Finding("desync", v["text"], None, True, "desync")], Verdict("desync", "problem", v["text"])


# --- memory (issue 35): the one place findings read the ``memory`` analysis ---------------------------
# The report and the summary run ``memory`` only on runs that recorded memory (:func:`_has_memory`), and
# :func:`_memory` speaks only of what matters: a rank near its device's capacity, peaks imbalanced within
# a process group, an out-of-memory record. No time cost (memory costs no step time until it runs out).


def _has_memory(store: Store, run_id: int) -> bool:
    """Whether the run holds accelerator memory records (``memory_events``: Kineto ``[memory]`` of a
    device other than the CPU, nsys CUDA memory, export_memory_timeline)."""
    return bool(store.sql("SELECT EXISTS (SELECT 1 FROM events WHERE run_id = ? AND kind = 'instant' AND "
                          "(name IN ('[memory]', '[OutOfMemory]') OR cat = 'memory_timeline') AND "
                          "coalesce(json_extract_string(args, '$.\"Device Type\"'), '') <> '0')", [run_id]).item())


def _memory(res: dict[str, FrameResult]) -> tuple[list[Finding], Verdict | None]:
    """Findings from the ``memory`` result: near the limit (``near_limit``), imbalanced groups, OOMs."""
    m = res.get("memory")
    if m is None or m.frame.is_empty():
        return [], None
    from traceprof.display import size

    frame, groups = m.frame.filter(pl.col("primary")), m.frames().get("groups", pl.DataFrame())
    findings = []
    for r in frame.filter(pl.col("near_limit")).sort("headroom_pct").iter_rows(named=True):
        use = max(x for x in (r["peak_reserved_bytes"], r["peak_allocated_bytes"]) if x is not None)
        at = f" at {r['peak_op']}" + (f" in {r['peak_top_op']}" if r["peak_top_op"] else "") if r["peak_op"] else ""
        findings.append(f"rank {r['rank']} device {r['device']} peaks at {size(use)} of its "
                        f"{size(r['capacity_bytes'])} ({r['headroom_pct']:.1f}% headroom): allocated "
                        f"{size(r['peak_allocated_bytes'])} in step {r['peak_step']}{at}")
    for g in groups.filter(pl.col("imbalanced")).iter_rows(named=True) if groups.height else ():
        findings.append(f"peak memory differs by {g['spread_pct']:.0f}% within group {g['group']} (ranks "
                        f"{g['ranks']}): rank {g['max_rank']} {size(g['max_peak_bytes'])}, rank "
                        f"{g['min_rank']} {size(g['min_peak_bytes'])}")
    oom = next((n for n in m.notes if "out-of-memory record" in n), None)
    if oom:
        findings.insert(0, oom)
    if findings:
        text = "memory: " + findings[0]
        return ([Finding("memory", "memory: " + f, None, True, "memory") for f in findings],
                Verdict("memory", "problem", text if len(findings) == 1 else f"{text} (and {len(findings) - 1} more)"))
    top = frame.sort("peak_allocated_bytes", descending=True, nulls_last=True).row(0, named=True)
    if top["peak_allocated_bytes"] is None:
        return [], Verdict("memory", "n/a", "memory records without a known allocated value (see the memory notes)")
    room = f", {top['headroom_pct']:.0f}% headroom" if top["headroom_pct"] is not None else ""
    return [], Verdict("memory", "ok", f"peak allocated {size(top['peak_allocated_bytes'])} on rank "
                       f"{top['rank']}{room}; no rank near its capacity, no group imbalanced")


def _regression(diff: FrameResult | TraceprofError | None) -> tuple[list[Finding], Verdict | None]:
    """The regression gate's verdict (``traceprof.diff``): ``problem`` on a structural or timing
    regression, ``inconclusive`` when the noise allows no verdict, ``ok``; cost: the step-time change."""
    if diff is None:
        return [], None
    if isinstance(diff, TraceprofError):
        return [], Verdict("regression", "n/a", f"not compared with the baseline: {diff}")
    summary = getattr(diff, "summary", "")
    verdict = getattr(diff, "verdict", "ok")
    cost = None
    step = diff.frame.filter(pl.col("metric") == "step_time_ns")
    if verdict == "regression" and step.height and step["delta_pct"][0] is not None:
        cost = max(float(step["delta_pct"][0]), 0.0)
    status, lead = {"regression": ("problem", "regression vs baseline: "),
                    "inconclusive": ("inconclusive", "inconclusive vs baseline: ")}.get(verdict, ("ok", "vs baseline: "))
    text = lead + summary
    return [Finding("regression", text, cost, status == "problem", "diff")], Verdict("regression", status, text)


# --- the time each finding could recover, by the step account (critical_path): one function, to dissolve
# with the central lists when analyses declare their findings (issue 30)
def _recoverable(res: dict[str, FrameResult], findings: list[Finding]) -> list[Finding]:
    """``findings`` with ``recoverable_pct`` from the ``critical_path`` result, as % of all ranks'
    step time: a named straggler, the others' exposed waits credited to it (blame); a straggling
    run with no single rank to blame, all exposed waits; communication, the exposed transfer time;
    idle, the host-bound and idle time of the ranks that are not named stragglers (a straggler's
    own is why it is late, counted in its finding). Other findings keep None."""
    cp = res.get("critical_path")
    if cp is None:
        return findings
    frame, blame = cp.frame, cp.frames()["blame"]
    total = int(frame["step_ns"].sum()) if "step_ns" in frame.columns else 0
    if not total:
        return findings
    named = _named_ranks(res)
    others = frame.filter(~pl.col("rank").is_in(named))
    ns: dict[str, tuple[float, str]] = {
        "communication": (float(frame["transfer_ns"].sum()), "exposed transfer"),
        "idle": (float((others["host_bound_ns"] + others["idle_ns"]).sum()),
                 "host-bound and idle time" + (" of the other ranks" if named else "")),
    }
    out = []
    for f in findings:
        x = ns.get(f.topic)
        if f.topic == "stragglers" and f.rank is not None:
            x = (float(blame.filter(pl.col("rank") == f.rank)["waited_ns"].sum()), "the others' waits for it")
        elif f.topic == "stragglers" and f.problem:
            x = (float(frame["wait_ns"].sum()), "all waits at collectives")
        if x is None:
            out.append(f)
            continue
        pct = 100.0 * x[0] / total
        said = f"; step account: {x[1]} {pct:.1f}% of all ranks' step time"
        out.append(dataclasses.replace(f, recoverable_pct=pct, text=f.text + said, full=f.full + said if f.full else ""))
    return out


def build(store: Store, run_id: int, results: dict[str, FrameResult | TraceprofError],
          diff: FrameResult | TraceprofError | None = None, hta: bool = False,
          params: dict[str, dict[str, str]] | None = None) -> Findings:
    """Findings from the results of :func:`run_analyses` (and a diff against a baseline, if any).

    Args:
        store: The store (for the run's name and median step time).
        run_id: The run the results are of.
        results: Analysis name -> result or the error it raised.
        diff: ``traceprof.diff.diff_runs`` of a baseline against this run, or why it could not be made.
        hta: Whether the analyses ran in HTA-compatible mode (``hta=true``).
        params: The analyses' parameters as strings (``run_analyses``'), so that the straggler
            verdict reads the same results the findings and sections show.
    """
    name = run_name(store, run_id)
    ok = {k: v for k, v in results.items() if isinstance(v, FrameResult)}
    errors = {k: v for k, v in results.items() if isinstance(v, TraceprofError)}
    findings: list[Finding] = []
    verdicts: list[Verdict] = []
    for part in (_stragglers(ok, store, run_id, params), _communication(ok), _idle(ok),
                 _mfu(ok, errors), _desync(ok), _memory(ok), _regression(diff), _parallelism(ok)):
        findings += part[0]
        if part[1] is not None:
            verdicts.append(part[1])
    findings = _agree(_recoverable(ok, findings), verdicts)
    findings.sort(key=lambda f: (f.rank_by is None, -(f.rank_by or 0.0), not f.problem))
    missing = tuple(Missing(k, str(e), NEEDS.get(k, "")) for k, e in errors.items())
    return Findings(name, tuple(findings), tuple(verdicts), missing, ok, hta)


#: The verdict topic of a finding topic, where they differ.
_VERDICT_TOPIC = {"mfu": "utilization"}


def _agree(findings: list[Finding], verdicts: list[Verdict]) -> list[Finding]:
    """Each finding with its topic's verdict as ``status`` (``problem`` exactly when that is
    ``problem``); a topic without a verdict: ``problem`` or ``info`` as the finding says."""
    status = {v.topic: v.status for v in verdicts}
    out = []
    for f in findings:
        st = status.get(_VERDICT_TOPIC.get(f.topic, f.topic)) or ("problem" if f.problem else "info")
        out.append(dataclasses.replace(f, status=st, problem=st == "problem"))
    return out


def summarize(store: Store, run: str | None, params: dict[str, dict[str, str]] | None = None,
              baseline: str | None = None, force: bool = False) -> Findings:
    """Run the analyses on ``run`` (name or id, default latest) and return its findings.

    With ``baseline`` the run is also diffed against it; runs that are not comparable give a
    regression verdict saying why instead of failing (with ``force``, per-rank medians are compared).

    Raises:
        StoreError: No such run.
        UsageError: A bad parameter.
    """
    run_id = store.resolve_run(run)
    with registry.reuse_results():  # each analysis once: the verdict reuses stragglers and whatif
        results = run_analyses(store, run_id, params)
        diff = None
        if baseline is not None:
            diff = compare(store, baseline, run_id, (params or {}).get("mfu", {}), force)
        hta = any(str(v.get("hta", "")).lower() in ("1", "true", "yes", "on") for v in (params or {}).values())
        return build(store, run_id, results, diff, hta, params)


def compare(store: Store, baseline: str, run_id: int, mfu_options: dict[str, str],
            force: bool = False) -> FrameResult | TraceprofError:
    """``diff_runs(baseline, run)`` (``baseline``: a run, runs separated by commas or a baseline
    set; ``force``: runs that are not comparable by per-rank medians), or the error that says why
    the runs cannot be compared.

    Raises:
        StoreError: No such baseline run or set.
    """
    from traceprof.baselines import resolve
    from traceprof.diff import diff_runs

    resolve(store, baseline)  # a missing baseline is an error, not a finding
    try:
        return diff_runs(store, baseline, str(run_id), mfu_options=mfu_options, force=force)
    except TraceprofError as e:
        return e
