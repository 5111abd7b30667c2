"""The analysis registry and the result protocol every renderer (CLI, report) relies on.

An analysis module in ``analyses/`` declares a frozen ``Params`` dataclass, a frozen ``Result``
(a :class:`FrameResult`), and registers ``run(store, params) -> Result`` with :func:`register`.
Adding an analysis never means editing a central list: ``load_all()`` imports every module of
the ``analyses`` package.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import polars as pl

from traceprof.errors import TraceprofError, UsageError

__all__ = ["Analysis", "FrameResult", "Chart", "RunParams", "register", "get", "names", "load_all", "reuse_results",
           "shared", "reusing", "executing", "Runner", "memo_store"]


@dataclass(frozen=True)
class RunParams:
    """Parameters every analysis takes. ``run``: run name or id (default: the latest run)."""

    run: str | None = None


@dataclass(frozen=True)
class Chart:
    """A declarative plot of a result's frame, drawn by the report.

    ``kind`` is ``bars`` (one bar per ``x`` value, one series per ``ys`` column, stacked when
    ``stacked``), ``heatmap`` (``x`` × ``ys[0]`` coloured by ``value``), ``lines`` (``ys`` over a
    time ``x`` in epoch ns, one line per ``group`` value and y column, the rows where the boolean
    column ``mark`` is true drawn as markers) or ``spans`` (intervals from ``ys[0]`` to ``ys[1]``,
    in ms, on lanes ``x``, coloured by ``value``).
    """

    title: str
    x: str
    ys: tuple[str, ...]
    kind: str = "bars"
    stacked: bool = False
    ylabel: str = ""
    value: str = ""
    frame: str = "frame"
    group: str = ""
    mark: str = ""


@dataclass(frozen=True)
class FrameResult:
    """Base of analysis results: a polars frame plus text notes.

    Renderers use only ``title``, ``to_frame()``, ``frames()``, ``notes`` and ``charts()``.
    """

    frame: pl.DataFrame
    notes: tuple[str, ...] = field(default=())
    title: ClassVar[str] = ""

    def to_frame(self) -> pl.DataFrame:
        """The main table (one row per rank for most analyses)."""
        return self.frame

    def frames(self) -> dict[str, pl.DataFrame]:
        """Every table of the result by name: ``frame`` first, then each DataFrame field in the
        order a subclass declares them."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), pl.DataFrame)
        }

    def charts(self) -> list[Chart]:
        return []


@dataclass(frozen=True)
class Analysis:
    """A registered analysis."""

    name: str
    doc: str
    params: type
    run: Callable[[Any, Any], FrameResult]


_REGISTRY: dict[str, Analysis] = {}

class _Slot:
    """One memo entry of :func:`reuse_results`: filled once, by the first thread that asks for it;
    another thread asking meanwhile waits for it (the report runs analyses on two threads, and
    both may need the run's activity frame). ``store`` keeps the store alive, so that its id
    stays unique while its results are kept."""

    __slots__ = ("lock", "store", "done", "value")

    def __init__(self, store: Any) -> None:
        self.lock = threading.RLock()  # re-entrant: a helper asking for itself fails, not hangs
        self.store = store
        self.done = False
        self.value: Any = None


#: Results (or the error raised) of the analyses run inside :func:`reuse_results`, by
#: (id(store), name, params), as :class:`_Slot`; None outside such a block. The store is the
#: one a worker thread's store stands for (:func:`memo_store`).
_MEMO: ContextVar[dict[tuple[int, str, Any], _Slot] | None] = ContextVar("traceprof_analysis_memo", default=None)
_MEMO_LOCK = threading.Lock()  # guards adding slots to a memo


def memo_store(store: Any) -> Any:
    """The store whose results ``store`` shares: itself, or for a worker thread's store
    (``Store.for_thread``) the store it was made from."""
    return getattr(store, "origin", None) or store


def _filled(memo: dict[tuple[int, str, Any], _Slot], key: tuple[int, str, Any], store: Any,
            compute: Callable[[], Any], keep_errors: bool) -> Any:
    """The value of memo entry ``key``, computing it with ``compute()`` once. An error
    ``compute`` raises is kept as the value when ``keep_errors`` (a TraceprofError), else raised
    and the entry left empty (the next caller tries again)."""
    with _MEMO_LOCK:
        slot = memo.get(key)
        if slot is None:
            slot = memo[key] = _Slot(store)
    with slot.lock:
        if not slot.done:
            try:
                slot.value = compute()
            except TraceprofError as e:
                if not keep_errors:
                    raise
                slot.value = e
            slot.done = True
    return slot.value


#: Whether the active :func:`reuse_results` block runs many analyses (see :func:`reusing`).
_MANY: ContextVar[bool] = ContextVar("traceprof_analysis_many", default=False)


@contextmanager
def reuse_results(many: bool = True) -> Iterator[None]:
    """Inside the block, each analysis runs at most once per (store, name, params).

    A repeated call (the report's findings, verdict and sections, or ``stragglers`` running
    ``whatif`` for its costs) returns the first call's result object, or raises the
    :class:`~traceprof.errors.TraceprofError` it raised. Results are immutable (frozen
    dataclasses of polars frames), so sharing them is safe. The store must not change inside the
    block. Nested blocks share the outermost one's results.

    Args:
        many: Many analyses will run (the report): shared helpers may fetch once what all of
            them need (:func:`reusing`). False for one analysis (``analyze NAME``), which would pay
            for the others' columns (the activity frame's detail columns: +0.8 GB for 8 x 1 M events).
    """
    if _MEMO.get() is not None:
        yield
        return
    token, many_token = _MEMO.set({}), _MANY.set(many)
    try:
        yield
    finally:
        _MEMO.reset(token)
        _MANY.reset(many_token)


def reusing() -> bool:
    """Whether a :func:`reuse_results` block for many analyses is active."""
    return _MEMO.get() is not None and _MANY.get()


#: Runs a registered analysis in place of calling it here: ``runner(name, store, params, fn)``
#: returns what ``fn(store, params)`` would (``traceprof.rankwise`` runs per-rank analyses on a
#: Dask cluster and calls ``fn`` for the rest).
Runner = Callable[[str, Any, Any, Callable[[Any, Any], "FrameResult"]], "FrameResult"]
_RUNNER: ContextVar[Runner | None] = ContextVar("traceprof_analysis_runner", default=None)


@contextmanager
def executing(runner: Runner | None) -> Iterator[None]:
    """Inside the block, every registered analysis is computed by ``runner`` (None: here, as
    outside any block). Results of :func:`reuse_results` are still shared; a runner must return
    exactly what the analysis returns here."""
    token = _RUNNER.set(runner)
    try:
        yield
    finally:
        _RUNNER.reset(token)


def _compute(name: str, fn: Callable[[Any, Any], FrameResult], store: Any, p: Any) -> FrameResult:
    from traceprof import resultcache  # here: it imports this module's FrameResult

    out = resultcache.lookup(store, name, p)  # None unless inside ``resultcache.caching``
    if out is None:
        runner = _RUNNER.get()
        out = fn(store, p) if runner is None else runner(name, store, p, fn)
        resultcache.keep(store, name, p, out)
    return out


_F = TypeVar("_F", bound=Callable[..., Any])


def shared(fn: _F) -> _F:
    """Decorator for a helper ``fn(store, *args)`` whose result several analyses read (e.g. the
    activity intervals of a run): inside :func:`reuse_results` it runs once per (store, args)
    (positional and keyword arguments, all hashable) and every caller gets the same immutable
    result; outside, every call runs it. Errors are not kept."""

    @functools.wraps(fn)
    def once(store: Any, *args: Any, **kwargs: Any) -> Any:
        memo = _MEMO.get()
        if memo is None:
            return fn(store, *args, **kwargs)
        origin = memo_store(store)
        key = (id(origin), f"{fn.__module__}.{fn.__qualname__}", (args, tuple(sorted(kwargs.items()))))
        return _filled(memo, key, origin, lambda: fn(store, *args, **kwargs), keep_errors=False)

    return once  # type: ignore[return-value]


def register(name: str, params: type) -> Callable[[Callable[[Any, Any], FrameResult]], Callable[[Any, Any], FrameResult]]:
    """Decorator that registers ``run(store, params) -> Result`` under ``name``.

    The registered (and returned) function runs ``run`` once per (store, params) inside
    :func:`reuse_results`, and every time outside it.
    """

    def deco(fn: Callable[[Any, Any], FrameResult]) -> Callable[[Any, Any], FrameResult]:
        @functools.wraps(fn)
        def once(store: Any, p: Any) -> FrameResult:
            memo = _MEMO.get()
            if memo is None:
                return _compute(name, fn, store, p)
            origin = memo_store(store)
            out = _filled(memo, (id(origin), name, p), origin, lambda: _compute(name, fn, store, p), keep_errors=True)
            if isinstance(out, TraceprofError):
                raise out
            return out

        module = importlib.import_module(fn.__module__)
        doc = (module.__doc__ or fn.__doc__ or "").strip()
        _REGISTRY[name] = Analysis(name, doc, params, once)
        return once

    return deco


def load_all() -> None:
    """Import every module of the ``analyses`` package so that each registers itself."""
    import analyses

    for mod in pkgutil.iter_modules(analyses.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"analyses.{mod.name}")


def names() -> list[str]:
    load_all()
    return sorted(_REGISTRY)


def get(name: str) -> Analysis:
    """The analysis called ``name``.

    Raises:
        UsageError: No such analysis (the message lists the known ones).
        ModuleNotFoundError: The analysis' module needs a library that is not installed (the CLI
            names it and what to install: :func:`traceprof.entry.missing_module`).
    """
    if name not in _REGISTRY and name.isidentifier() and not name.startswith("_"):
        # an analysis registers itself in the module of its name: import that one alone (the
        # other modules cost about 0.1-0.3 s of every `traceprof analyze` start-up)
        try:
            importlib.import_module(f"analyses.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"analyses.{name}":  # the module exists but lacks a dependency: say so
                raise
    if name not in _REGISTRY:
        load_all()
    if name not in _REGISTRY:
        raise UsageError(f"no analysis {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def make_params(analysis: Analysis, run: str | None, options: dict[str, str]) -> Any:
    """Build ``analysis.params`` from the run and ``key=value`` strings, converting types.

    Raises:
        UsageError: Unknown key or a value of the wrong type.
    """
    fields = {f.name: f for f in dataclasses.fields(analysis.params)}
    values: dict[str, Any] = {"run": run}
    for key, raw in options.items():
        key = key.replace("-", "_")
        if key not in fields or key == "run":
            known = ", ".join(k for k in fields if k != "run") or "none"
            raise UsageError(f"analysis {analysis.name!r} has no parameter {key!r}; parameters: {known}")
        default = fields[key].default
        kind = type(default) if default is not None and default is not dataclasses.MISSING else str
        try:
            if kind is bool:
                if raw.lower() not in _BOOLS:
                    raise ValueError(raw)
                values[key] = _BOOLS[raw.lower()]
            else:
                values[key] = kind(raw)
        except ValueError:
            expected = "true or false" if kind is bool else kind.__name__
            raise UsageError(f"{key}={raw!r}: expected {expected}") from None
        if kind is int and not -(2**63) <= values[key] < 2**63:  # ns, counts: int64 like the store
            raise UsageError(f"{key}={raw!r}: beyond the 64-bit integer range")
    return analysis.params(**values)
