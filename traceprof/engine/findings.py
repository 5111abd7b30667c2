"""Findings: what a run's analyses say, ranked by what they cost, one line each.

The report opens with these and ``traceprof summary`` prints them. Nothing here renders: a
:class:`Findings` holds plain strings and numbers; the report and the CLI format them. Nothing here
names an analysis either: each declares in its spec (``traceprof.engine.analysis``) whether the report
runs it (``Report``: its order, what the run must hold, on which runs) and how its results become
findings (``Topic``: its findings hook).

Algorithm:
  1. Run the report's analyses on the run (:func:`run_analyses`, in their declared order; one whose
     ``Report.when`` leaves the run out is not run); an analysis that does not apply (a
     :class:`~traceprof.core.errors.TraceprofError`, e.g. no GPU kernels in a Flight Recorder-only run)
     becomes an :class:`Unavailable` entry with what the run lacks (``Report.needs``) and how to record it.
  2. Per topic, in the topics' declared order, the analysis' findings hook reads the results into
     findings with a cost in % of step time and one verdict (stragglers, communication, idle,
     utilization, desync, memory, parallelism); the regression against baselines
     (``traceprof.engine.diff``: its verdict; cost: a significant step-time change, or the grown time of the
     structurally changed ops; none for a change the gate calls inconclusive) at its place
     among them (:data:`REGRESSION_ORDER`).
     A topic whose own analysis does not apply may take its verdict from another analysis'
     findings hook (``parallelism``'s slow pipeline stages speak for ``stragglers`` when no
     collective matched across ranks): the verdict then says which analysis gave it and what the
     topic's own one needs, and that analysis is not listed among those that do not apply.
  3. Let the analyses that measure what a finding could recover refine them (their spec's
     ``refine``: ``critical_path`` gives each the time it could recover by the step account, % of
     all ranks' step time), rank them by it, largest first (by their cost where there is no such
     figure; those without either last), and give one combined verdict per topic (``problem``,
     ``ok`` or ``n/a``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
import pickle
import queue
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from traceprof.core import cancel, procs, term
from traceprof.core.errors import AnalysisError, TraceprofError, UsageError
from traceprof.core.trim import trim
from traceprof.core.values import parse_bool
from traceprof.engine import analysis as registry
from traceprof.engine import session
from traceprof.engine.analysis import Finding, FindingsInput, FrameResult, Verdict
from traceprof.engine.timing import analysis_mfu_options
from traceprof.ingest.matching import run_missing_step_notes, step_shift_notes, stepless_notes
from traceprof.storage.runs import coverage_text, run_name
from traceprof.storage.store import Store

__all__ = [
    "Finding",
    "Verdict",
    "Unavailable",
    "Findings",
    "report_analyses",
    "run_analyses",
    "build",
    "summarize",
    "compare",
    "hta_mode",
    "REGRESSION_ORDER",
]

#: The regression gate's place among the topics' verdicts (``Topic.order``).
REGRESSION_ORDER = 60

HOW = (
    "record every rank with torch.profiler (collectors/kineto/capture.py: profile_ranks, or "
    "`traceprof collect`), with CUDA activity on GPUs and record_shapes=True"
)


@dataclass(frozen=True)
class Unavailable:
    """An analysis that does not apply to the run (not a missing rank: those are ``coverage``): why
    (the analysis' message) and what it needs."""

    analysis: str
    reason: str
    needs: str


@dataclass(frozen=True)
class Findings:
    """Ranked findings, verdicts per topic and the analyses that did not apply, for one run."""

    run: str
    findings: tuple[Finding, ...]
    verdicts: tuple[Verdict, ...]
    #: The analyses that do not apply to the run (``summary -f json``: ``unavailable_analyses``).
    unavailable: tuple[Unavailable, ...]
    results: dict[str, FrameResult] = field(default_factory=dict)
    hta: bool = False
    baseline: str = ""
    #: The store's path, as the evidence commands name it (``--db``); empty: the default store.
    db: str = ""
    #: Finding topic -> the topic of the verdict it takes its status from, where they differ
    #: (``Topic.aliases``: ``mfu`` findings -> ``utilization``).
    aliases: dict[str, str] = field(default_factory=dict)
    #: What the findings rest on, said before them: the job's ranks that no trace holds
    #: (``traceprof.storage.runs.coverage_text``); empty when every rank was traced.
    coverage: str = ""
    #: Whether the run has no step on any rank (no ``steps`` row: no ProfilerStep, no NDTimeline step;
    #: the ranking's account is then of the ranks' windows, not of step time).
    stepless: bool = False

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
            if self.stepless:
                return (
                    "Ranked by the time each could recover by the time account (critical_path; the run has no "
                    "steps: each rank's window is its first to last activity), in % of all ranks' windows; the "
                    "others by what they cost, in % of the window"
                )
            return (
                "Ranked by the time each could recover by the step account (critical_path), in % of all ranks' "
                "step time; the others by what they cost, in % of step time"
            )
        return "Ranked by what they cost, in % of step time"

    def to_frame(self) -> pl.DataFrame:
        """Findings as a frame: position, topic, cost_pct (% of step time, null if none),
        recoverable_pct (% of all ranks' step time by the step account, null if none), problem,
        status (the topic's verdict), finding."""
        return pl.DataFrame(
            {
                "position": list(range(1, len(self.findings) + 1)),
                "topic": [f.topic for f in self.findings],
                "cost_pct": [f.cost_pct for f in self.findings],
                "recoverable_pct": [f.recoverable_pct for f in self.findings],
                "problem": [f.problem for f in self.findings],
                "status": [f.status for f in self.findings],
                "finding": [f.text for f in self.findings],
            },
            schema={
                "position": pl.Int64,
                "topic": pl.Utf8,
                "cost_pct": pl.Float64,
                "recoverable_pct": pl.Float64,
                "problem": pl.Boolean,
                "status": pl.Utf8,
                "finding": pl.Utf8,
            },
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: run, baseline (None: not compared), coverage (the untraced ranks in words; None:
        every rank traced), findings (:meth:`finding_dict` each), verdicts, and
        unavailable_analyses (the analyses that do not apply to the run's sources: analysis, reason,
        needs; named ``missing`` before, which read as missing ranks)."""
        return {
            "run": self.run,
            "baseline": self.baseline or None,
            "coverage": self.coverage or None,
            "findings": [self.finding_dict(i, f) for i, f in enumerate(self.findings, 1)],
            "verdicts": [v.__dict__ for v in self.verdicts],
            "unavailable_analyses": [m.__dict__ for m in self.unavailable],
        }

    def finding_dict(self, position: int, f: Finding) -> dict[str, Any]:
        """One finding for CI and agents: the :meth:`to_frame` row's fields, then ``ranks`` (list of
        ints), ``metric``, ``value`` (in ``unit``: ``ns``, ``%``, ``x`` (a factor) or ``""``),
        ``recoverable_ns`` (int ns over all ranks' steps, or None), ``cause`` (None: none named),
        ``evidence`` ({analysis, table, command}: the table that shows it and the command that
        prints it), ``full`` (the text with full names, or None) and ``verdict_topic`` (the topic
        of the verdict in ``verdicts`` whose status it carries)."""
        ranks = f.ranks or ((f.rank,) if f.rank is not None else ())
        unit = metric_unit(f.metric)
        return {
            "position": position,
            "topic": f.topic,
            "cost_pct": f.cost_pct,
            "recoverable_pct": f.recoverable_pct,
            "problem": f.problem,
            "status": f.status,
            "verdict_topic": self.aliases.get(f.topic, f.topic),  # joins the finding to its verdict
            "finding": f.text,
            "ranks": [int(r) for r in ranks],
            "metric": f.metric or None,
            "value": int(f.value) if unit == "ns" and f.value is not None else f.value,
            "unit": unit,
            "recoverable_ns": f.recoverable_ns,
            "cause": f.cause or None,
            "evidence": self.evidence(f),
            "full": f.full or None,
        }

    def evidence(self, f: Finding) -> dict[str, str]:
        """Where a finding's figures come from: {analysis, table, command} (``diff``: the regression
        gate, its command ``traceprof diff BASELINE RUN``); the command names the store (``--db``),
        so that it runs as printed from any folder."""
        analysis, _, table = (f.evidence or f.section).partition(":")
        table = table or "frame"
        db = ("--db", self.db) if self.db else ()  # a command one can paste as it is
        if analysis == "diff":
            command = term.command("traceprof", "diff", self.baseline or "BASELINE", self.run, *db)
        else:
            tab = ("--table", table) if table != "frame" else ()
            command = term.command("traceprof", "analyze", analysis, "--run", self.run, *tab, *db)
        return {"analysis": analysis, "table": table, "command": command}


def metric_unit(metric: str) -> str:
    """The unit of a finding's ``value`` by its metric's suffix: ``_ns`` ns, ``_pct`` %, ``slowdown``
    x (a factor), else ``""`` (a count or none)."""
    if metric.endswith("_ns"):
        return "ns"
    if metric.endswith("_pct"):
        return "%"
    if metric.endswith("slowdown"):
        return "x"
    return ""


def report_analyses() -> list[registry.Analysis]:
    """The analyses the report and the summary run (their spec's ``report``), in report order."""
    return sorted(
        (a for a in registry.specs() if a.report is not None),
        key=lambda a: (a.report.order, a.name),  # type: ignore[union-attr]
    )


def hta_mode(params: dict[str, dict[str, str]] | None) -> bool:
    """Whether ``-p ANALYSIS.hta=...`` options turn HTA-compatible mode on for some analysis."""

    def on(v: object) -> bool:
        try:
            return parse_bool(str(v))
        except ValueError:
            return False

    return any(on(v["hta"]) for v in (params or {}).values() if "hta" in v)


def run_analyses(
    store: Store,
    run_id: int,
    params: dict[str, dict[str, str]] | None = None,
    names: tuple[str, ...] | None = None,
) -> dict[str, FrameResult | TraceprofError]:
    """Run ``names`` (default: the report's analyses) on a run; an analysis that does not apply
    gives its error instead of a result.

    On a read-only store with two or more CPUs the analyses run on the session's threads
    (``Session.threads``), each with its own connection (``Store.for_thread``), sharing results in
    the store's session; the heavy ones alone, after the light ones (see :func:`_run_all`). The
    results do not depend on the threads: each analysis reads the store alone.

    Args:
        store: An open store.
        run_id: The run.
        params: Parameters per analysis as strings, e.g. ``{"mfu": {"peak_tflops": "989"}}``.
        names: Analyses to run (those not registered are skipped); default: those of
            :func:`report_analyses`, each on the runs its ``Report.when`` admits.

    Returns:
        Name -> result or error, in report order.

    Raises:
        UsageError: A parameter names no such analysis or has a bad value.
        KeyboardInterrupt: Ctrl-C, once the threads have stopped (their queries interrupted, their
            Python at its next ``traceprof.core.cancel`` checkpoint).
    """
    params = params or {}
    known = set(registry.names())
    if names is None:
        specs = report_analyses()
        allowed = tuple(a.name for a in specs)
        names = tuple(a.name for a in specs if a.report is not None and a.report.when is None)
        conditional = [a for a in specs if a.report is not None and a.report.when is not None]
    else:
        allowed, conditional = names, []
    unknown = set(params) - set(allowed)
    if unknown:
        raise UsageError(f"no report analysis {sorted(unknown)[0]!r}; choose from: {', '.join(allowed)}")
    for a in conditional:
        if a.name in params:
            _params(
                a.name, run_id, params[a.name]
            )  # a bad value is refused on every run, not only where it runs

    def todo_of(names: tuple[str, ...]) -> list[tuple[str, registry.Analysis, Any]]:
        return [
            (name, registry.get(name), _params(name, run_id, params.get(name, {})))
            for name in names
            if name in known
        ]

    with session.of(store) as s:
        # on a large run the heavy ones first, in a fresh process, while this one is at its smallest:
        # before the conditional ones' checks read the store
        todo = todo_of(names)
        _Phases(store, _phases(todo, _heavy(todo)), todo).in_fresh_process()
        names = (*names, *(a.name for a in conditional if a.report.when(store, run_id)))  # type: ignore[union-attr, misc]
        return _run_all(store, todo_of(names), s.threads)


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


def _one(an: registry.Analysis, store: Store, p: Any) -> FrameResult | TraceprofError:
    try:
        return an.run(store, p)
    except UsageError:
        raise
    except TraceprofError as e:
        return e


def _run_all(
    store: Store, todo: list[tuple[str, registry.Analysis, Any]], threads: int
) -> dict[str, FrameResult | TraceprofError]:
    """Each (name, analysis, params) of ``todo`` run on ``store``, on up to ``threads`` threads
    when it can (see :func:`run_analyses`), each thread on a connection of its own; an analysis
    another thread is computing (the activity frame) is waited for, not computed twice (the
    session's memo).

    The heavy ones (:func:`_heavy`: each builds a graph of every event) run alone, after the light
    ones that read the activity frame: beside another analysis their peaks would add (on 8 ranks x
    1 M events ``whatif`` beside ``critical_path`` made the report's peak 1.99 GiB, beside ``gaps``
    1.88 GiB, against 1.66 GiB for ``whatif`` alone). They run as ``traceprof analyze`` runs them
    (:class:`_Phases`): the light ones' shared activity frame is let go of once the first heavy one
    has taken its columns from it, each other heavy one reads only its own columns, and the
    helpers' values of one group of heavy ones (those joined by ``requires``) are let go of before
    the next group. The light ones that never read the frame (their spec's ``reads_activity``
    False: ``launch``, the ``*_sum`` tables) run last, two at a time again, once everything shared
    is let go of: beside the frame (about 410 MiB on 8 x 1M) ``launch``'s own 220 MiB made the
    report's peak. A free thread takes the next of ``todo`` in that order once it may run now
    (:func:`_next`). On a run of ``TRACEPROF_FRESH_EVENTS`` events or more (2,000,000 unless set)
    the groups of heavy ones run first, one after another in one fresh process, while this one waits
    at its smallest (:func:`_fresh`, :meth:`_Phases.in_fresh_process`): the memory this one frees
    but its allocators keep is not under their peak (8 ranks x 1 M events: 972-1,338 MiB in one
    process), and the two processes together stay under either's peak plus about 120 MiB (a fresh
    process per group, started after the light ones: the parent waited at 230-270 MiB beside it,
    together 1,044-1,223 MiB). There the light ones beside the frame
    run one at a time, the heap trimmed after each (:attr:`_Phases.alone`): two at a time, beside
    the frame, their peaks and what the allocator kept of them added up (the parent's peak
    on 8 ranks x 1 M events 897-997 -> 845-903 MiB in 5 interleaved pairs under load)."""
    threads = min(threads, len(todo))
    phases = _phases(todo, _heavy(todo))
    pending = _order(todo, phases)
    results: dict[str, FrameResult | TraceprofError] = {}
    with _Phases(store, phases, todo) as on:
        if threads < 2 or not store.read_only:
            for name, an, p in pending:
                on.start(name)
                results[name] = _one(an, store, p)
                on.done(name)
            return {name: results[name] for name, _, _ in todo}
        _run_threads(store, pending, phases, threads, on, results)
        return {name: results[name] for name, _, _ in todo}


def _run_threads(
    store: Store,
    pending: list[tuple[str, registry.Analysis, Any]],
    phases: dict[str, tuple[int, int]],
    threads: int,
    on: _Phases,
    results: dict[str, FrameResult | TraceprofError],
) -> None:
    """Run ``pending`` (:func:`_order`) on ``threads`` threads into ``results`` (:func:`_run_all`)."""
    pending = list(pending)
    ready = threading.Condition()
    running: set[str] = set()
    with contextlib.ExitStack() as stack:
        views = [stack.enter_context(store.for_thread()) for _ in range(threads)]
        free: queue.SimpleQueue[Store] = queue.SimpleQueue()
        for v in views:
            free.put(v)

        def task() -> None:
            with ready:
                while (t := _next(pending, running, phases, on.alone)) is None:
                    ready.wait(0.1)
                    cancel.checkpoint()
                pending.remove(t)
                running.add(t[0])
                try:
                    on.start(t[0])  # the first of a phase starts alone: nothing else runs meanwhile
                except BaseException:
                    running.discard(t[0])  # the others go on (Ctrl-C stops them at a checkpoint)
                    ready.notify_all()
                    raise
            view = free.get()
            try:
                results[t[0]] = _one(t[1], view, t[2])
            finally:
                free.put(view)
                on.done(t[0])
                with ready:
                    running.discard(t[0])
                    ready.notify_all()

        n = len(pending)
        pool = ThreadPoolExecutor(threads, thread_name_prefix="traceprof-analysis")
        with cancel.scope() as stop:
            futures = [pool.submit(contextvars.copy_context().run, task) for _ in range(n)]
        try:
            waiting = set(futures)
            while waiting:  # a timed wait, so that Ctrl-C reaches this thread
                _, waiting = wait(waiting, timeout=0.1)
        except KeyboardInterrupt:
            # Drop the queued analyses; stop the running ones at their next checkpoint (a query, a
            # level of a what-if replay: traceprof.core.cancel) and interrupt their queries, until they
            # have stopped: the connections close after them.
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            unfinished = {f for f in futures if not f.done()}
            while unfinished:
                for v in views:
                    with contextlib.suppress(duckdb.Error):
                        v.con.interrupt()
                _, unfinished = wait(unfinished, timeout=0.05)
            raise
        pool.shutdown()
        for f in futures:
            f.result()  # a thread's own failure (not an analysis' TraceprofError) raised here


def _heavy(todo: list[tuple[str, registry.Analysis, Any]]) -> set[str]:
    """The analyses of ``todo`` that run another or that another runs (``requires``): the what-if
    replay (``whatif``, ``stragglers``) and the step account (``critical_path``, ``mfu``), each
    building a graph of every event of the run (1.3-1.5 GiB alone on 8 ranks x 1 M events)."""
    required = {r for _, an, _ in todo for r in an.requires}
    return {name for name, an, _ in todo if an.requires or name in required}


def _groups(todo: list[tuple[str, registry.Analysis, Any]], heavy: set[str]) -> dict[str, int]:
    """Each heavy analysis of ``todo`` -> its group: those joined by ``requires`` (``stragglers``
    runs ``whatif``: both read the replay's compute items) are one group, numbered in the order of
    their first member in ``todo``."""
    group = {name: name for name in heavy}

    def root(name: str) -> str:
        while group[name] != name:
            name = group[name]
        return name

    for name, an, _ in todo:
        for r in an.requires:
            if name in group and r in group:
                group[root(r)] = root(name)
    number: dict[str, int] = {}
    for name, _, _ in todo:
        if name in heavy:
            number.setdefault(root(name), len(number))
    return {name: number[root(name)] for name in heavy}


def _phases(todo: list[tuple[str, registry.Analysis, Any]], heavy: set[str]) -> dict[str, tuple[int, int]]:
    """Each analysis of ``todo`` -> its phase, in the order they run (:func:`_run_all`): ``(0, 0)``
    the light ones that read the activity frame (their spec's ``reads_activity``), ``(1, g)`` the
    heavy ones of group ``g`` (:func:`_groups`), ``(2, 0)`` the light ones that do not."""
    groups = _groups(todo, heavy)
    return {
        name: (1, groups[name]) if name in heavy else (0 if an.reads_activity else 2, 0)
        for name, an, _ in todo
    }


def _order(
    todo: list[tuple[str, registry.Analysis, Any]], phases: dict[str, tuple[int, int]]
) -> list[tuple[str, registry.Analysis, Any]]:
    """``todo`` in the order the analyses start: phase by phase (:func:`_phases`), in a group of
    heavy ones those another requires first (``whatif``, which ``stragglers`` runs); stable: else
    in report order."""
    required = {r for _, an, _ in todo for r in an.requires}
    return sorted(todo, key=lambda t: (phases[t[0]], t[0] not in required))


class _Phases:
    """What the session keeps as the report's analyses start, phase by phase (:func:`_phases`,
    :func:`_run_all`); the first analysis of each phase starts alone.

    The light ones that read the activity frame share one (the session's ``many``). At the first
    heavy one the session empties DuckDB's buffer pool and runs the heavy ones one at a time
    (``Session.one_at_a_time``), as ``traceprof analyze`` does: the first heavy one to read the
    activity takes its columns from the light ones' frame (no second read) and lets go of the
    frame (about 410 MiB on 8 ranks x 1 M events) before its own work; the others read only
    their own columns and let go of them. At the start of each further group of heavy ones, of
    the light ones that do not read the frame (``many`` on again) and at the end, the session
    lets go of every shared helper's value (the replay's compute items, 236 MiB; the frame, had
    nothing taken it) and of DuckDB's cached blocks. Results stay. Without a session that keeps
    results, or with only frame readers, nothing changes.

    On a large run (:func:`_fresh`) every group of heavy ones is computed first, in one fresh
    process (:meth:`in_fresh_process`): their results wait on disk (:class:`_Spilled`) for the
    session's memo, where the analyses then find them once the light ones are done.
    """

    def __init__(
        self,
        store: Store,
        phases: dict[str, tuple[int, int]],
        todo: list[tuple[str, registry.Analysis, Any]] | None = None,
    ) -> None:
        s = getattr(registry.memo_store(store), "session", None)
        self.session = s if s is not None and s.memo is not None else None
        self.phases = phases
        self.phase = (0, 0)
        self._stack = contextlib.ExitStack()
        self.todo = todo or []
        #: Whether the groups of heavy ones run in a fresh process (:func:`_fresh`).
        self.fresh = self.session is not None and _fresh(self.session, self.todo, phases)
        #: The phases whose light analyses run one at a time (:func:`_next`), the heap trimmed
        #: after each (:meth:`done`): on a large run (:attr:`fresh`) those beside the activity frame.
        self.alone: frozenset[tuple[int, int]] = frozenset({(0, 0)} if self.fresh else ())

    def __enter__(self) -> _Phases:
        self.in_fresh_process()  # before the light ones: this process is at its smallest meanwhile
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.phase != (0, 0) and self.session is not None:
                self.session.let_go()
        finally:
            self._stack.close()

    def start(self, name: str) -> None:
        """Analysis ``name`` starts (the first of its phase: nothing else runs)."""
        phase = self.phases[name]
        if self.session is None or phase == self.phase:
            return
        if phase[0] == 1 and self.phase[0] == 0:  # the first heavy one: it takes its columns from the frame
            self._stack.enter_context(self.session.one_at_a_time())
            if self.fresh:  # ... here; in a fresh process it reads its own
                self.session.let_go()
            else:
                self.session.empty_buffer_pool()
        else:
            if phase[0] == 2:  # the light ones again: many on
                self._stack.close()
            self.session.let_go()
        self.phase = phase

    def done(self, name: str) -> None:
        """Analysis ``name`` has finished: in a phase of :attr:`alone` the heap's free memory goes
        back to the system before the next one starts (what it freed, not kept under the next one's
        peak beside the frame)."""
        if self.phases[name] in self.alone:
            trim()

    def in_fresh_process(self) -> None:
        """On a large run (:attr:`fresh`; else nothing), compute every group of heavy ones in one
        fresh process (:func:`_fresh_groups`) and keep their results (and errors) in the session,
        read from disk when first asked for (:class:`_Spilled`), where the analyses then find them;
        the other analyses' results that process computed on the way (``parallelism``, which
        ``stragglers`` reads) are kept at once: the light ones here do not compute them again.
        Those kept already (in the session, or beside the store when caching) are not computed
        again. A process that dies leaves each of its analyses an AnalysisError saying so. When
        caching, the results folders the process keeps its results in are made here first: this
        command's own, removed on Ctrl-C (:func:`traceprof.engine.resultcache.make_for_another`;
        the process itself is killed then, and what it left half-written in a folder there before
        removed)."""
        from traceprof.engine import resultcache

        s = self.session
        if s is None or not self.fresh:
            return
        groups: dict[tuple[int, int], list[tuple[str, Any]]] = {}
        for name, _, p in self.todo:
            if self.phases[name][0] != 1 or s.holds(name, p):
                continue
            kept = resultcache.lookup(s.store, name, p) if s.cache else None
            if kept is not None:
                s.put(name, p, kept)
            else:
                groups.setdefault(self.phases[name], []).append((name, p))
        todo = [groups[g] for g in sorted(groups)]
        if not todo:
            return
        folder = resultcache.make_for_another(s.store)  # the process's folders this one's: gone on Ctrl-C
        trim()  # this process waits meanwhile: glibc's free heap back to the system
        spill = _Spilled(Path(s.enter(tempfile.TemporaryDirectory(prefix="traceprof-"))) / "heavy.pickle")
        task = (str(s.store.path), todo, s.threads, s.cache, str(spill.path))
        try:
            more = procs.call_in_fresh_process(
                _fresh_groups,
                task,
                poll=cancel.checkpoint,
                env=_fresh_env(),
                killed=functools.partial(resultcache.remove_partial, folder),
            )
        except ChildProcessError as e:  # killed (for want of memory?): each analysis says so
            error = AnalysisError(f"the process that computed it ended before it finished ({e})")
            for name, p in (t for group in todo for t in group):
                s.put(name, p, error)
            return
        for i, (name, p) in enumerate(t for group in todo for t in group):
            s.put_later(name, p, functools.partial(spill.take, i))
        for name, p, result in more:
            s.put(name, p, result)


class _Spilled:
    """The heavy analyses' results (and errors) the fresh process wrote to ``path``, read back when
    the first of them is asked for (the light ones done, their activity frame let go of) and the
    file removed then: on 8 ranks x 1 M events about 29 MiB (critical_path's 23) not held beside
    the frame."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._results: list[FrameResult | TraceprofError] | None = None

    def take(self, i: int) -> FrameResult | TraceprofError:
        """The ``i``-th result (in the order the process was given them)."""
        with self._lock:
            if self._results is None:
                self._results = pickle.loads(self.path.read_bytes())
                self.path.unlink()
            return self._results[i]


def _fresh(
    s: session.Session, todo: list[tuple[str, registry.Analysis, Any]], phases: dict[str, tuple[int, int]]
) -> bool:
    """Whether the report's heavy analyses run in a fresh process, a group after another: there are
    some, the session runs them here (no Dask runner), its store is a file opened read-only (the
    process opens it beside this one) and the run has at least ``TRACEPROF_FRESH_EVENTS`` events
    (:func:`traceprof.engine.session.fresh_events_from_env`: 2,000,000 unless set).

    Raises:
        UsageError: A bad ``TRACEPROF_FRESH_EVENTS``.
    """
    heavy = [p for name, _, p in todo if phases[name][0] == 1]
    if not heavy or s.runner is not None or not s.store.read_only or not Path(s.store.path).is_file():
        return False
    run = getattr(heavy[0], "run", None)
    try:
        run_id = s.store.resolve_run(None if run is None else str(run))
    except TraceprofError:
        return False
    least = session.fresh_events_from_env()
    # plain DuckDB rows: asked before the fresh process starts, it imports no pyarrow here (25 MiB
    # more under that process's peak)
    n = s.store.con.execute(
        "SELECT coalesce(sum(events_kept), 0) FROM traces WHERE run_id = ?", [run_id]
    ).fetchall()
    return int(n[0][0]) >= least


#: How long polars' allocator (jemalloc) keeps the pages freed in the fresh process before it hands
#: them back to the system (``dirty_decay_ms``; jemalloc's default is 10 s): what one heavy analysis
#: freed is not under the next one's peak (8 ranks x 1 M events: the process's peak 873-881 ->
#: 838-840 MiB at the same CPU; 0 ms gave 779-783 MiB for 2.3 s more CPU). A setting of the user's
#: own (``_RJEM_MALLOC_CONF``) is kept.
FRESH_DECAY_MS = 1000


#: polars' threads in the fresh process (``POLARS_MAX_THREADS``; else one a core): its sorts, joins
#: and window groups then hold one thread's temporaries at a time, under the heavy analyses' peaks
#: (8 ranks x 1 M events, on 2 cores). A setting of the user's own is kept.
FRESH_POLARS_THREADS = 1


def _fresh_env() -> dict[str, str]:
    """The environment variables the fresh process gets beside this one's (:data:`FRESH_DECAY_MS`,
    :data:`FRESH_POLARS_THREADS`), but those the user set."""
    env = {
        "_RJEM_MALLOC_CONF": f"dirty_decay_ms:{FRESH_DECAY_MS}",
        "POLARS_MAX_THREADS": str(FRESH_POLARS_THREADS),
    }
    return {k: v for k, v in env.items() if k not in os.environ}


def _fresh_groups(
    task: tuple[str, list[list[tuple[str, Any]]], int, bool, str],
) -> list[tuple[str, Any, FrameResult | TraceprofError]]:
    """In a fresh process (:meth:`_Phases.in_fresh_process`): the groups of heavy analyses
    ``(name, params)`` on the store ``db``, opened read-only in a session of their own
    (``threads``, ``cache``), one group after another, each as ``traceprof analyze`` runs them: those
    another requires last (``stragglers`` runs ``whatif`` as ``analyze stragglers`` does: its windows
    split before the replay, whose result ``whatif`` then finds kept). Between groups the session
    lets go of what its helpers keep (but their small ``lasting`` values) and the heap is trimmed.

    Each analysis's result or the error it gave is written, pickled, to the file ``spill``: a list
    in the order given.

    Returns:
        The results (errors) of the other analyses the session computed meanwhile
        (``parallelism``, which ``stragglers`` reads), each ``(name, params, result)``.

    Raises:
        UsageError: As the analyses raise it here.
    """
    db, groups, threads, cache, spill = task
    asked = {(name, p) for group in groups for name, p in group}
    results = {}
    with session.open_session(db, read_only=True, cache=cache, threads=threads) as s, s.one_at_a_time():
        for i, names in enumerate(groups):
            if i:
                s.let_go()
                trim()  # the last group's freed arrays handed back before the next one's peak
            required = {r for name, _ in names for r in registry.get(name).requires}
            for name, p in sorted(names, key=lambda t: t[0] in required):
                results[name, p] = _one(registry.get(name), s.store, p)
        assert s.memo is not None
        more = [
            (key[1], key[2], slot.value)
            for key, slot in s.memo.items()
            if session._is_result(key) and slot.done and (key[1], key[2]) not in asked
        ]
        Path(spill).write_bytes(pickle.dumps([results[t] for group in groups for t in group]))
    return more


def _next(
    pending: list[tuple[str, registry.Analysis, Any]],
    running: set[str],
    phases: dict[str, tuple[int, int]],
    alone: frozenset[tuple[int, int]] = frozenset(),
) -> tuple[str, registry.Analysis, Any] | None:
    """The next of ``pending`` (:func:`_order`) if it may start now (None: wait for one that runs
    to finish): while nothing runs; else a light one beside those of its phase (two light ones
    at a time, a heavy one alone, a light one of a phase in ``alone`` alone too, a phase after the
    one before has finished)."""
    t = pending[0]
    if not running:
        return t
    phase = phases[t[0]]
    return t if phase[0] != 1 and phase not in alone and all(phases[n] == phase for n in running) else None


def _regression_cost(diff: FrameResult) -> float | None:
    """What a regression costs, in % of the baseline's step time, from significant figures only:
    the step-time change where the gate called ``step_time_ns`` itself a regression (beyond its
    threshold and noise, ``verdict`` regression); else, for a structural regression, the time per
    step of the changed ops and kernels whose own growth passed the noise test (the diff's
    ``items`` rows with ``grew``, by kind and name of a ``structure`` row), their
    ``share_of_step_pct`` summed; else None: a change the gate called inconclusive (noise above
    the threshold) or ok is no measured cost.

    Source: the diff's ``frame`` (metric, verdict, delta_pct), ``structure`` (kind, name) and
    ``items`` (kind, name, grew, share_of_step_pct).
    """
    step = diff.frame.filter((pl.col("metric") == "step_time_ns") & (pl.col("verdict") == "regression"))
    if step.height and step["delta_pct"][0] is not None:
        return max(float(step["delta_pct"][0]), 0.0)
    struct, items = getattr(diff, "structure", None), getattr(diff, "items", None)
    if not isinstance(struct, pl.DataFrame) or not isinstance(items, pl.DataFrame) or not struct.height:
        return None
    if not {"grew", "share_of_step_pct"} <= set(items.columns):
        return None
    changed = struct.select("kind", "name").unique()
    own = items.filter(pl.col("grew")).join(changed, on=["kind", "name"], how="semi")
    return max(float(own["share_of_step_pct"].sum()), 0.0) if own.height else None


def _regression(diff: FrameResult | TraceprofError | None) -> tuple[list[Finding], Verdict | None]:
    """The regression gate's verdict (``traceprof.engine.diff``): ``problem`` on a structural or timing
    regression, ``inconclusive`` when the noise allows no verdict, ``ok``; cost: a significant
    figure only (:func:`_regression_cost`), else None (ranked after the measured findings)."""
    if diff is None:
        return [], None
    if isinstance(diff, TraceprofError):
        return [], Verdict("regression", "n/a", f"not compared with the baseline: {diff}")
    summary = getattr(diff, "summary", "")
    verdict = getattr(diff, "verdict", "ok")
    cost = _regression_cost(diff) if verdict == "regression" else None
    status, lead = {
        "regression": ("problem", "regression vs baseline: "),
        "inconclusive": ("inconclusive", "inconclusive vs baseline: "),
    }.get(verdict, ("ok", "vs baseline: "))
    text = lead + summary
    # the metric the gate speaks of: the first that regressed, else the first beyond its threshold
    flagged = diff.frame.filter(pl.col("verdict") != "ok")
    head = flagged.row(0, named=True) if flagged.height else None
    cause = ""
    ranks: tuple[int, ...] = ()
    struct, items = getattr(diff, "structure", None), getattr(diff, "items", None)
    if (
        head is not None
        and head["layer"] == "structural"
        and isinstance(struct, pl.DataFrame)
        and struct.height
    ):
        top = struct.row(0, named=True)  # largest FLOPs change first
        cause = f"{top['kind']} {top['name']} {top.get('shape') or ''}".strip()
        ranks = tuple(int(r) for r in top.get("ranks") or ())
    elif isinstance(items, pl.DataFrame) and items.height and "grew" in items.columns:
        grew = items.filter(pl.col("grew"))
        cause = f"{grew['kind'][0]} {grew['name'][0]}" if grew.height else ""
    found = Finding(
        "regression",
        text,
        cost,
        status == "problem",
        "diff",
        metric=f"{head['metric']}_change_pct".replace("_ns_change", "_change") if head else "",
        value=head["delta_pct"] if head else None,
        cause=cause or (f"{head['layer']} change" if head else ""),
        ranks=ranks,
    )
    return [found], Verdict("regression", status, text)


def build(
    store: Store,
    run_id: int,
    results: dict[str, FrameResult | TraceprofError],
    diff: FrameResult | TraceprofError | None = None,
    hta: bool = False,
    params: dict[str, dict[str, str]] | None = None,
    baseline: str | None = None,
) -> Findings:
    """Findings from the results of :func:`run_analyses` (and a diff against a baseline, if any).

    Args:
        store: The store (for the run's name and median step time).
        run_id: The run the results are of.
        results: Analysis name -> result or the error it raised.
        diff: ``traceprof.engine.diff.diff_runs`` of a baseline against this run, or why it could not be made.
        hta: Whether the analyses ran in HTA-compatible mode (``hta=true``).
        params: The analyses' parameters as strings (``run_analyses``'), so that the straggler
            verdict reads the same results the findings and sections show.
        baseline: The baseline ``diff`` compared with, as given (for the regression finding's evidence).
    """
    name = run_name(store, run_id)
    ok = {k: v for k, v in results.items() if isinstance(v, FrameResult)}
    errors = {k: v for k, v in results.items() if isinstance(v, TraceprofError)}
    inp = FindingsInput(ok, dict(errors), store, run_id, params or {})
    findings: list[Finding] = []
    verdicts: list[Verdict] = []
    specs = registry.specs()
    topics = sorted((a.findings for a in specs if a.findings is not None), key=lambda t: (t.order, t.name))
    by_topic = {a.findings.name: a.name for a in specs if a.findings is not None}  # topic -> its analysis
    parts = [(t.order, by_topic[t.name], lambda t=t: t.build(inp)) for t in topics] + [
        (REGRESSION_ORDER, "diff", lambda: _regression(diff))
    ]
    needs = {a.name: a.report.needs for a in specs if a.report is not None}
    stood_in: set[str] = set()  # analyses that do not apply, whose topic's verdict another gave
    for _, source, part in sorted(parts, key=lambda p: p[0]):  # stable: topics of one order in name order
        found, verdict = part()
        findings += found
        if verdict is None:
            continue
        own = by_topic.get(verdict.topic)
        if own is not None and own != source and own in errors:
            # e.g. parallelism's slow pipeline stage as the stragglers verdict, where stragglers has no
            # collective matched across ranks: say whose verdict it is, not "stragglers not available"
            stood_in.add(own)
            why = needs.get(own) or str(errors[own])
            verdict = dataclasses.replace(
                verdict, text=f"{verdict.text} (from {source}: {own} does not apply, it needs {why})"
            )
        verdicts.append(verdict)
    for a in specs:
        if a.refine is not None:
            findings = a.refine(inp, findings)
    aliases = {alias: t.name for t in topics for alias in t.aliases}
    findings = _agree(findings, verdicts, aliases)
    findings.sort(key=lambda f: (f.rank_by is None, -(f.rank_by or 0.0), not f.problem))
    unavailable = tuple(
        Unavailable(k, str(e), needs.get(k, "")) for k, e in errors.items() if k not in stood_in
    )
    return Findings(
        name,
        tuple(findings),
        tuple(verdicts),
        unavailable,
        ok,
        hta,
        baseline or "",
        str(store.path),
        aliases,
        _coverage(store, run_id, verdicts),
        # the steps table, as critical_path's windows read it: NDTimeline's steps have no step events
        store.sql("SELECT 1 FROM steps WHERE run_id = ? AND step IS NOT NULL LIMIT 1", [run_id]).is_empty(),
    )


def _coverage(store: Store, run_id: int, verdicts: list[Verdict]) -> str:
    """What the summary says first about the ranks (:func:`traceprof.storage.runs.coverage_text`, naming
    the verdicts that need every rank as they came out: inconclusive, or none given) and
    the steps some rank lacks that others have (:func:`traceprof.ingest.matching.missing_step_notes`:
    ``rank 0 has no step 4 ...``), the ranks whose steps were lined up off their numbers
    (:func:`traceprof.ingest.matching.step_shift_notes`) and those without steps whose collectives were
    matched by order over the run (:func:`traceprof.ingest.matching.stepless_notes`), joined; empty when
    every rank and step is there."""
    lost = run_missing_step_notes(store, run_id)
    shifted = step_shift_notes(store, run_id)
    stepless = stepless_notes(store, run_id)
    ranks = coverage_text(store, run_id, {v.topic: v.status for v in verdicts})
    return "; ".join(t for t in (ranks, *shifted, *stepless, *lost) if t)


def _agree(findings: list[Finding], verdicts: list[Verdict], aliases: dict[str, str]) -> list[Finding]:
    """Each finding with its topic's verdict as ``status`` (``problem`` exactly when that is
    ``problem``; ``aliases``: the verdict topic of a finding topic where they differ, ``Topic.aliases``);
    a topic without a verdict: ``problem`` or ``info`` as the finding says."""
    status = {v.topic: v.status for v in verdicts}
    out = []
    for f in findings:
        st = status.get(aliases.get(f.topic, f.topic)) or ("problem" if f.problem else "info")
        out.append(dataclasses.replace(f, status=st, problem=st == "problem"))
    return out


def summarize(
    store: Store,
    run: str | None,
    params: dict[str, dict[str, str]] | None = None,
    baseline: str | None = None,
    force: bool = False,
) -> Findings:
    """Run the analyses on ``run`` (name or id, default latest) and return its findings.

    With ``baseline`` the run is also diffed against it; runs that are not comparable give a
    regression verdict saying why instead of failing (with ``force``, per-rank medians are compared).
    Each analysis runs once (the store's session, or one for the call): the verdict reuses
    stragglers and whatif.

    Raises:
        StoreError: No such run.
        UsageError: A bad parameter.
    """
    run_id = store.resolve_run(run)
    with session.of(store):
        results = run_analyses(store, run_id, params)
        diff = None
        if baseline is not None:
            diff = compare(store, baseline, run_id, analysis_mfu_options(params), force)
        return build(store, run_id, results, diff, hta_mode(params), params, baseline)


def compare(
    store: Store, baseline: str, run_id: int, mfu_options: dict[str, str], force: bool = False
) -> FrameResult | TraceprofError:
    """``diff_runs(baseline, run)`` (``baseline``: a run, runs separated by commas or a baseline
    set; ``force``: runs that are not comparable by per-rank medians), or the error that says why
    the runs cannot be compared.

    Raises:
        StoreError: No such baseline run or set.
    """
    from traceprof.engine.diff import diff_runs
    from traceprof.storage.baselines import resolve

    resolve(store, baseline)  # a missing baseline is an error, not a finding
    try:
        return diff_runs(store, baseline, str(run_id), mfu_options=mfu_options, force=force)
    except TraceprofError as e:
        return e
