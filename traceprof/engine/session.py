"""A session: an open store and how analyses run on it, in one explicit object.

Every command that runs analyses opens one (``traceprof.open``); the library mirrors the CLI::

    import traceprof

    with traceprof.open("traceprof.duckdb") as s:
        gaps = s.analyze("gaps", run="normal", hta=True)    # traceprof analyze gaps --run normal -p hta=true
        findings = s.summary(run="normal")                   # traceprof summary --run normal
        s.report("report.html", run="normal")                # traceprof report --run normal -o report.html
        d = s.diff("normal", "extra_matmul")                 # traceprof diff normal extra_matmul

(``report`` is :class:`traceprof.api.Session`'s: the engine renders nothing.)

What a session holds, and nothing else decides it (no module switch, no context variable):

- ``store``: the :class:`~traceprof.storage.store.Store`; the session attaches itself to it
  (``store.session``), so that an analysis and the helpers it calls (``traceprof.engine.activity``)
  reach the session through the store they are given;
- ``cache``: whether results are read from and kept beside the store (``traceprof.engine.resultcache``);
- ``runner``: where registered analyses run (None: here; ``--executor dask``: the per-rank ones on
  a Dask cluster, ``traceprof.engine.rankwise``);
- ``threads``: how many threads the report's and the summary's analyses use;
- ``memo``: the results computed in this session, each analysis once per params (None: none kept,
  every call computes); ``many``: many analyses will run (the report), so shared helpers fetch
  once what all of them need.

Cancellation on Ctrl-C of the report's threads stays with :mod:`traceprof.core.cancel` (a scope the
threads are started in).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from traceprof.core.errors import TraceprofError, UsageError
from traceprof.core.values import parse_bool

if TYPE_CHECKING:
    from traceprof.engine.analysis import FrameResult
    from traceprof.engine.findings import Findings
    from traceprof.storage.store import Store

__all__ = [
    "Session",
    "open_session",
    "Runner",
    "THREADS",
    "FRESH_EVENTS",
    "threads_from_env",
    "fresh_events_from_env",
    "cache_from_env",
]

#: Runs a registered analysis in place of calling it here: ``runner(name, store, params, fn)``
#: returns what ``fn(store, params)`` would (``traceprof.engine.rankwise`` runs per-rank analyses on a
#: Dask cluster and calls ``fn`` for the rest).
Runner = Callable[[str, Any, Any, Callable[[Any, Any], "FrameResult"]], "FrameResult"]

#: Threads the report's analyses use at most (``TRACEPROF_THREADS`` sets it: 1 for the least
#: memory). DuckDB, polars and numpy release the GIL in their loops, so a second thread keeps the
#: second core busy while the first runs Python. More threads hold more analyses' frames at once:
#: the heavy ones (the what-if replay, the step account) therefore run alone, after the light ones
#: (``traceprof.engine.findings._run_all``).
THREADS = 2


def threads_from_env() -> int:
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


#: The fewest events (``traces.events_kept``) of a run whose heavy analyses (the what-if replay,
#: the step account) the report and the summary run in a fresh process (``TRACEPROF_FRESH_EVENTS``
#: sets it; ``traceprof.engine.findings``). On 8 ranks x 1 M events (7,984,000) that process peaks
#: at 827-955 MiB, where in this one the light analyses' freed memory (about 500 MiB the allocators
#: keep) lay under the heavy ones' own (972-1,338 MiB). The process (one for every group of heavy
#: ones) costs 0.5-1 s of CPU (its imports), which a smaller run, with little memory to free, would
#: pay alone.
FRESH_EVENTS = 2_000_000


def fresh_events_from_env() -> int:
    """``TRACEPROF_FRESH_EVENTS`` or :data:`FRESH_EVENTS` (0: every run's heavy analyses in a fresh
    process).

    Raises:
        UsageError: ``TRACEPROF_FRESH_EVENTS`` is not a whole number of 0 or more.
    """
    raw = os.environ.get("TRACEPROF_FRESH_EVENTS", "").strip()
    if not raw:
        return FRESH_EVENTS
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise UsageError(f"TRACEPROF_FRESH_EVENTS={raw!r}: expected a whole number of events, 0 or more")
    return n


def cache_from_env(enabled: bool = True) -> bool:
    """``enabled`` unless ``TRACEPROF_NO_CACHE`` says otherwise (1, true, yes, on: no cache)."""
    raw = os.environ.get("TRACEPROF_NO_CACHE", "").strip()
    try:
        off = bool(raw) and parse_bool(raw)
    except ValueError:
        off = True  # a value that is no boolean word: the user wants it off
    return enabled and not off


_S = TypeVar("_S", bound="Session")

#: The first item of an analysis result's memo key (``(_RESULT, name, params)``); the shared
#: helpers' keys start with the helper's qualified name (``traceprof.engine.analysis.shared``).
_RESULT = "analysis"


def _is_result(key: Any) -> bool:
    """Whether memo key ``key`` is an analysis result's (not a shared helper's value)."""
    return isinstance(key, tuple) and len(key) == 3 and key[0] == _RESULT


def _empty_buffer_pool(store: Store) -> None:
    """Make DuckDB drop the store's blocks it keeps in its buffer pool (read, then kept until memory
    runs short): its memory limit set to :data:`POOL_FLOOR_MB`, which evicts the unpinned blocks
    above it, and set back at once. Nothing else may query the store meanwhile (a query would find
    the limit that low). A limit that cannot be lowered (blocks pinned, a locked configuration) is
    left as it was."""
    import duckdb

    con = getattr(store, "con", None)
    if con is None:
        return
    try:
        limit = con.execute("SELECT current_setting('memory_limit')").fetchall()
        con.execute(f"SET memory_limit = '{POOL_FLOOR_MB}MB'")
    except duckdb.Error:
        return
    con.execute("RESET memory_limit")  # DuckDB's default; a limit set before: as it was, below
    if con.execute("SELECT current_setting('memory_limit')").fetchall() != limit:
        con.execute(f"SET memory_limit = '{limit[0][0]}'")


#: What DuckDB's memory limit is lowered to for a moment to empty its buffer pool
#: (:func:`_empty_buffer_pool`; MB). Not less: at a limit of a few KB the statement that sets it
#: back fails for want of memory.
POOL_FLOOR_MB = 8


class _Slot:
    """One memo entry: filled once, by the first thread that asks for it; another thread asking
    meanwhile waits for it (the report runs analyses on two threads, and both may need the run's
    activity frame)."""

    __slots__ = ("lock", "done", "value", "later")

    def __init__(self) -> None:
        self.lock = threading.RLock()  # re-entrant: a helper asking for itself fails, not hangs
        self.done = False
        self.value: Any = None
        #: Where the value comes from when first asked for, instead of computing it
        #: (:meth:`Session.put_later`).
        self.later: Callable[[], Any] | None = None


class Session:
    """An open store and how analyses run on it (module doc).

    Args:
        store: An open store; the session attaches itself to it (``store.session``) until
            :meth:`close`.
        cache: Read and keep results beside the store (read-only stores only).
        executor: ``local`` (here) or ``dask``: the per-rank analyses on the Dask cluster at
            ``scheduler`` (``traceprof.engine.rankwise``; connected now, closed with the session).
        scheduler: Dask scheduler address for ``executor="dask"``.
        threads: Threads for the report's analyses (None: :func:`threads_from_env`).
        memo: Keep the results computed in the session (each analysis once per params).
        many: Many analyses will run (the report, the summary): helpers fetch once what all need.
        owns_store: Close the store with the session.
    """

    def __init__(
        self,
        store: Store,
        *,
        cache: bool = False,
        executor: str = "local",
        scheduler: str | None = None,
        threads: int | None = None,
        memo: bool = True,
        many: bool = True,
        owns_store: bool = False,
    ) -> None:
        self.store = store
        self.cache = cache
        self.runner: Runner | None = None
        self._threads = threads
        self.memo: dict[Any, _Slot] | None = {} if memo else None
        self.many = many
        self._lock = threading.Lock()  # guards adding slots to the memo
        self._owns = owns_store
        self._stack = ExitStack()
        self._previous = getattr(store, "session", None)
        store.session = self
        if executor != "local" or scheduler is not None:
            try:
                from traceprof.engine.rankwise import attach_executor

                attach_executor(self, executor, scheduler)
            except BaseException:
                self.close()
                raise

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Detach from the store (closing it when the session opened it) and close the executor."""
        try:
            self._stack.close()
        finally:
            if getattr(self.store, "session", None) is self:
                self.store.session = self._previous
            if self._owns:
                self.store.close()

    @property
    def threads(self) -> int:
        """Threads for the report's analyses: as given, else :func:`threads_from_env` (read when
        first needed, so that a bad ``TRACEPROF_THREADS`` fails only the commands that use it)."""
        if self._threads is None:
            self._threads = threads_from_env()
        return self._threads

    def enter(self, cm: Any) -> Any:
        """Enter context manager ``cm`` for the session's lifetime (an executor's connection)."""
        return self._stack.enter_context(cm)

    # -- running analyses ------------------------------------------------------------------

    def once(self, key: Any, compute: Callable[[], Any], keep_errors: bool) -> Any:
        """The memo's value for ``key``, computing it with ``compute()`` once. An error
        ``compute`` raises is kept as the value when ``keep_errors`` (a TraceprofError, raised
        again to every caller), else raised and the entry left empty (the next caller tries again)."""
        slot = self._slot(key)
        with slot.lock:
            if not slot.done:
                try:
                    slot.value = compute() if slot.later is None else slot.later()
                except TraceprofError as e:
                    if not keep_errors:
                        raise
                    slot.value = e
                slot.done, slot.later = True, None
        if isinstance(slot.value, TraceprofError) and keep_errors:
            raise slot.value
        return slot.value

    def holds(self, name: str, params: Any) -> bool:
        """Whether the memo holds analysis ``name``'s result (or error) with ``params``."""
        slot = None if self.memo is None else self.memo.get((_RESULT, name, params))
        return slot is not None and (slot.done or slot.later is not None)

    def put(self, name: str, params: Any, result: FrameResult | TraceprofError) -> None:
        """Keep ``result`` (or the error it raised), computed elsewhere (the report's heavy analyses
        in a fresh process: ``traceprof.engine.findings``), as analysis ``name``'s with ``params``:
        a later call returns it (raises it) as if computed here. A value already kept stays."""
        slot = self._slot((_RESULT, name, params))
        with slot.lock:
            if not slot.done:
                slot.value, slot.done, slot.later = result, True, None

    def put_later(self, name: str, params: Any, load: Callable[[], FrameResult | TraceprofError]) -> None:
        """As :meth:`put`, the result (or error) to come from ``load()`` when first asked for: the
        report's heavy analyses, computed in a fresh process, wait on disk meanwhile, out of this
        process's memory while the light ones run (``traceprof.engine.findings``). A value already
        kept stays."""
        slot = self._slot((_RESULT, name, params))
        with slot.lock:
            if not slot.done:
                slot.later = load

    def _slot(self, key: Any) -> _Slot:
        """The memo's entry for ``key``, added (empty) if it has none."""
        assert self.memo is not None
        with self._lock:
            slot = self.memo.get(key)
            if slot is None:
                slot = self.memo[key] = _Slot()
            return slot

    def release(self, key: Any) -> None:
        """Let go of the memo's value for ``key`` (a large intermediate whose last reader in this
        command has taken what it needs, e.g. the activity frame once the replay's compute items
        are made from it); a later caller computes it again. A value not yet computed, or being
        computed by another thread, is left alone."""
        if self.memo is None:
            return
        with self._lock:
            slot = self.memo.get(key)
            if slot is not None and slot.done:
                del self.memo[key]

    def let_go(self) -> None:
        """Let go of what the session keeps beside the analyses' results: every value the shared
        helpers keep in the memo (``traceprof.engine.analysis.shared``: the activity frame, the
        replay's compute items, the collectives' arrivals) and the store's blocks DuckDB holds in
        its buffer pool (80-150 MiB on 8 ranks x 1 M events), so that what runs next starts as
        if alone. A later caller computes the values again and DuckDB reads the blocks again. The
        small values of the helpers marked ``lasting`` stay (``traceprof.engine.analysis.lasting``).

        Call it only while no other thread uses the session or the store (the report calls it
        before each group of its heavy analyses, which run alone: ``traceprof.engine.findings``):
        DuckDB's limit is lowered for a moment to empty its pool. Entries being computed are left
        alone."""
        from traceprof.engine.analysis import is_lasting

        if self.memo is not None:
            with self._lock:
                for key in [
                    k
                    for k, slot in self.memo.items()
                    if slot.done and not _is_result(k) and not is_lasting(k)
                ]:
                    del self.memo[key]
        self.empty_buffer_pool()

    def empty_buffer_pool(self) -> None:
        """Make DuckDB drop the store's blocks it keeps cached in its buffer pool (:meth:`let_go`'s
        second half; call it, too, only while no other thread uses the store)."""
        _empty_buffer_pool(self.store)

    @contextmanager
    def one_at_a_time(self) -> Iterator[None]:
        """Within the block, run analyses as ``traceprof analyze`` runs one (:attr:`many` off):
        shared helpers fetch only what their caller asks for, and the last reader of a large one
        lets go of it (``traceprof.engine.analysis.release_shared``). The report's heavy analyses
        run so, one after another, once the light ones have shared their one activity frame.
        :attr:`many` is restored at the end."""
        many = self.many
        self.many = False
        try:
            yield
        finally:
            self.many = many

    def compute(
        self, name: str, fn: Callable[[Any, Any], FrameResult], store: Any, params: Any
    ) -> FrameResult:
        """Analysis ``name`` (its unwrapped ``run`` is ``fn``) with ``params`` on ``store`` (this
        session's store, or a thread's view of it): from the memo, else from the results kept
        beside the store, else computed by the runner (or here) and kept."""
        if self.memo is None:
            return self._compute(name, fn, store, params)
        return self.once(
            (_RESULT, name, params), lambda: self._compute(name, fn, store, params), keep_errors=True
        )

    def _compute(
        self, name: str, fn: Callable[[Any, Any], FrameResult], store: Any, params: Any
    ) -> FrameResult:
        from traceprof.engine import resultcache

        out = resultcache.lookup(store, name, params) if self.cache else None
        if out is None:
            out = fn(store, params) if self.runner is None else self.runner(name, store, params, fn)
            if self.cache:
                resultcache.keep(store, name, params, out)
        return out

    # -- the library mirror of the CLI -------------------------------------------------------

    def ingest(self, paths: list[str | Path], **options: Any) -> Any:
        """``traceprof ingest PATHS``: parse trace files into the store (open the session with
        ``read_only=False``); ``options``: those of :func:`traceprof.ingest.ingest.ingest`.

        Returns:
            The :class:`~traceprof.ingest.ingest.IngestResult`.

        Raises:
            TraceFormatError, UsageError, StoreError: As :func:`traceprof.ingest.ingest.ingest`.
        """
        from traceprof.ingest.ingest import ingest

        return ingest(self.store, paths, **options)

    def analyze(self, name: str, run: str | None = None, **params: Any) -> FrameResult:
        """``traceprof analyze NAME``: analysis ``name`` on ``run`` (name or id; default latest)
        with keyword parameters (values, or ``-p`` strings converted by the parameter's type).

        Raises:
            UsageError: No such analysis, or a bad parameter.
            StoreError: No such run.
            AnalysisError: The analysis does not apply to the run.
        """
        from traceprof.engine import analysis as registry

        spec = registry.get(name)
        return spec.run(self.store, registry.make_params(spec, run, params))

    def summary(
        self,
        run: str | None = None,
        params: dict[str, dict[str, str]] | None = None,
        baseline: str | None = None,
        force: bool = False,
    ) -> Findings:
        """``traceprof summary``: the run's findings and verdicts (``traceprof.engine.findings.summarize``)."""
        from traceprof.engine.findings import summarize

        return summarize(self.store, run, params, baseline, force)

    def diff(
        self,
        base: str,
        cand: str,
        thresholds: dict[str, float] | None = None,
        mfu_options: dict[str, str] | None = None,
        force: bool = False,
    ) -> Any:
        """``traceprof diff BASE CAND``: the regression diff (``traceprof.engine.diff.diff_runs``)."""
        from traceprof.engine.diff import diff_runs

        return diff_runs(self.store, base, cand, thresholds or {}, mfu_options=mfu_options or {}, force=force)

    def history(
        self,
        job: str,
        window: int = 10,
        mfu_options: dict[str, str] | None = None,
        metrics: Sequence[str] = (),
    ) -> Any:
        """``traceprof history JOB``: each gate metric of a job's runs (``traceprof.engine.history``;
        ``metrics``: only these, rows and notes)."""
        from traceprof.engine.history import history

        return history(self.store, job, window=window, mfu_options=mfu_options or {}, metrics=metrics)


@contextmanager
def of(store: Store, *, many: bool = True) -> Iterator[Session]:
    """``store``'s session when it has one that keeps results, else a session for the block (no
    cache, analyses here), detached at its end: library calls on a bare store (``summarize``,
    ``render_html``) share results within themselves as a command's session would."""
    s = getattr(getattr(store, "origin", None) or store, "session", None)
    if s is not None and s.memo is not None:
        yield s
        return
    with Session(store, many=many) as s:
        yield s


def open_session(
    db: str | Path,
    *,
    read_only: bool = True,
    cache: bool = True,
    executor: str = "local",
    scheduler: str | None = None,
    threads: int | None = None,
    memo: bool = True,
    many: bool = True,
    cls: type[Session] | None = None,
) -> Session:
    """Open the store ``db`` as a :class:`Session` (``cls``, default this one: ``traceprof.open``
    gives ``traceprof.api.Session``, which also writes the report); close it with the session.

    Args:
        db: The store file.
        read_only: Open it read-only (analyses; results are kept only then).
        cache: Reuse and keep results beside the store (``TRACEPROF_NO_CACHE=1`` turns it off).
        executor: ``local``, or ``dask``: per-rank analyses on the Dask cluster at ``scheduler``.
        scheduler: Dask scheduler address for ``executor="dask"``.
        threads: Threads for the report's analyses (default: ``TRACEPROF_THREADS`` or 2, at most
            the CPUs).
        memo: Compute each analysis once per params in the session.
        many: Many analyses will run on it (see the module doc).

    Raises:
        StoreError: The store cannot be opened.
        UsageError: A bad executor, scheduler or ``TRACEPROF_THREADS``; with ``dask``: a
            duckdb-layout store, Dask not installed, the scheduler unreachable.
    """
    import duckdb

    from traceprof.storage.store import Store

    store = Store(db, read_only=read_only)
    # DuckDB's allocator keeps what a query freed until its next task flushes it: the activity's
    # reads (hundreds of MiB on 8 x 1 M events) then stay resident under the analyses' own peaks.
    # Its background threads hand it back as it is freed (8 x 1 M, compute items made: 771 -> 650 MiB).
    with suppress(duckdb.Error):  # a DuckDB without the setting: as before
        store.con.execute("SET allocator_background_threads = true")
    try:
        return (cls or Session)(
            store,
            cache=cache_from_env(cache),
            executor=executor,
            scheduler=scheduler,
            threads=threads,
            memo=memo,
            many=many,
            owns_store=True,
        )
    except BaseException:
        store.close()
        raise
