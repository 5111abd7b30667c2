"""What an analysis is: one declared spec next to its code, and the registry of them.

An analysis module in ``analyses/`` declares everything about itself in one :class:`Analysis`
spec and registers it with :func:`register`:

- ``name``: the module's name, the CLI word (``traceprof analyze NAME``) and the test file's;
- ``params``: a frozen ``Params`` dataclass (typed fields: ``-p key=value`` strings are converted
  by their annotations, :func:`make_params`);
- ``result`` and ``frames``: a frozen ``Result`` (a :class:`FrameResult`) and the declaration of
  each of its frames (:class:`traceprof.core.schema.Table` of :class:`traceprof.core.schema.Column`), so
  that ``--help``, ``--save`` tables' column comments and ``docs/analyses.md`` come from one place;
- ``report``: whether the report and the summary run it, in what order, what the run must hold
  for it (shown when it does not apply) and, for some, on which runs (:class:`Report`);
- ``findings``: the hook that reads its results into findings and one verdict per topic
  (:class:`Topic`);
- ``per_rank``: how one result per rank merges into the run's (:class:`PerRank`), when its rows
  are computed per rank (``--executor dask`` runs it as one task per rank); None: cross-rank;
- ``requires``: the analyses it runs itself (``stragglers`` runs ``whatif``): run first on the
  report's threads;
- ``reads_activity``: whether it reads the run's activity frame (``traceprof.engine.activity``'s
  ``activity``, itself or through a helper); False (it queries the store's views only) lets the
  report run it after the frame the others share is let go of. A test runs each analysis declared
  False and checks that the frame is never read.

Notes are :class:`Note` strings that carry their figures (ranks listed, rows counted), so that
per-rank results merge by structure, never by their wording. Adding an analysis is adding one
module: nothing else names it (``load_all()`` imports every module of the ``traceprof.analyses``
package, ``analyses/`` in the repository, and of the ``traceprof.analyses`` entry-point group).

How analyses run (results shared, kept beside the store, on a Dask cluster) is the business of
the :class:`traceprof.engine.session.Session` attached to the store; a bare store runs each call here.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.metadata
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import polars as pl

from traceprof.core import plugins
from traceprof.core.errors import UsageError
from traceprof.core.schema import Table
from traceprof.core.values import parse_bool

if TYPE_CHECKING:
    from traceprof.storage.store import Store

__all__ = [
    "Analysis",
    "FrameResult",
    "Chart",
    "Note",
    "RunParams",
    "Report",
    "Lead",
    "Topic",
    "PerRank",
    "Finding",
    "Verdict",
    "FindingsInput",
    "register",
    "get",
    "names",
    "specs",
    "load_all",
    "shared",
    "shared_done",
    "release_pool",
    "release_shared",
    "drop_shared",
    "reusing",
    "make_params",
    "merge_notes",
    "memo_store",
]


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


class Note(str):
    """One note of a result: its text, and the figures it is made of.

    A note that lists ranks (``rank(s) 1, 3 drive several GPUs: ...``) or states a number of rows
    (``12 kernels have no launch call ...``) keeps them, so that the notes of per-rank results
    merge by structure (:func:`merge_notes`): the ranks joined, the numbers summed.

    Attributes:
        template: The text with ``{ranks}`` (the ranks joined by ``", "``) and ``{number}`` standing
            for the figures; the text itself for a plain note.
        ranks: The ranks the note lists, or None.
        number: The number of rows it states, or None.
        kind: A name that code reads the note by (:meth:`FrameResult.note`), ``""`` for none.
    """

    template: str
    ranks: tuple[int, ...] | None
    number: int | None
    kind: str

    def __new__(
        cls,
        template: str = "",
        *,
        ranks: Iterable[int] | None = None,
        number: int | None = None,
        kind: str = "",
    ) -> Note:
        got = None if ranks is None else tuple(int(r) for r in ranks)
        text = template
        if got is not None:
            text = text.replace("{ranks}", ", ".join(map(str, got)))
        if number is not None:
            text = text.replace("{number}", str(int(number)))
        self = super().__new__(cls, text)
        self.template, self.ranks, self.number, self.kind = template, got, number, kind
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: text, template, ranks, number, kind (the result cache keeps notes so)."""
        return {
            "text": str(self),
            "template": self.template,
            "ranks": self.ranks,
            "number": self.number,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | str) -> Note:
        """A note from :meth:`to_dict` (or a plain string)."""
        if isinstance(d, str):
            return cls(d)
        return cls(
            str(d["template"]), ranks=d.get("ranks"), number=d.get("number"), kind=str(d.get("kind") or "")
        )


def _as_note(n: str) -> Note:
    return n if isinstance(n, Note) else Note(n)


def merge_notes(per_rank: list[tuple[str, ...]]) -> tuple[Note, ...]:
    """Every rank's notes once, in the analysis' order: notes of one template that list ranks are
    one note listing them all (in order), notes that state a number are one note stating the sum,
    other notes are kept once each."""
    order: list[tuple[str, str]] = []
    merged: dict[tuple[str, str], Note] = {}
    for notes in per_rank:
        at = 0
        for n in map(_as_note, notes):
            if n.ranks is not None:
                key = ("ranks", n.template)
                old = merged.get(key)
                ranks = sorted({*(old.ranks or () if old is not None else ()), *n.ranks})
                merged[key] = Note(n.template, ranks=ranks, kind=n.kind)
            elif n.number is not None:
                key = ("number", n.template)
                old = merged.get(key)
                merged[key] = Note(
                    n.template, number=(old.number or 0 if old is not None else 0) + n.number, kind=n.kind
                )
            else:
                key = ("text", str(n))
                merged.setdefault(key, n)
            if key in order:
                at = order.index(key) + 1
            else:
                order.insert(at, key)
                at += 1
    return tuple(merged[k] for k in order)


@dataclass(frozen=True)
class FrameResult:
    """Base of analysis results: a polars frame plus notes (:class:`Note`, plain strings too).

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

    def note(self, kind: str) -> Note | None:
        """The first note of ``kind`` (:attr:`Note.kind`), or None."""
        return next((n for n in self.notes if isinstance(n, Note) and n.kind == kind), None)


@dataclass(frozen=True)
class Finding:
    """One line of the findings list.

    ``topic``: stragglers, communication, idle, mfu, desync or regression; ``text``: the finding
    with its evidence, long kernel and op names shortened (``traceprof.core.names.shorten``);
    ``cost_pct``: % of step time it costs (None: no cost measured); ``problem``: whether it is
    something to fix; ``section``: the report section with the detail; ``full``: the text with full
    names where ``text`` shortened one (the report shows it on hover), else empty; ``status``: its
    topic's verdict (``problem``, ``ok``, ``n/a``; ``info`` for a topic without one), set by
    :func:`traceprof.engine.findings.build`, which also sets ``problem`` to ``status == "problem"``: one
    verdict per topic, so the findings list, the verdicts table, ``summary -f json`` and the
    report never disagree; ``rank``: the rank a straggler finding names; ``recoverable_pct``: the
    time fixing it could recover by the step account (``critical_path``'s ``refine`` hook), % of
    all ranks' step time (None: no figure).

    The machine-readable side (``summary -f json``; each hook fills what it measured):
    ``ranks``: the ranks the finding names (a straggler, the worst rank, those behind); ``metric``:
    the measure ``value`` is of, its unit in its suffix (``exposed_comm_pct``: %, ``_ns``: ns,
    ``slowdown``: a factor); ``recoverable_ns``: ``recoverable_pct``'s time in ns summed over all
    ranks' steps (None: no figure); ``cause``: what the analysis blames, in its words (``untraced
    host time``, a collective and the op before it); ``evidence``: the analysis and table that show it,
    ``ANALYSIS`` or ``ANALYSIS:TABLE`` (default: ``section``'s table ``frame``).
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
    ranks: tuple[int, ...] = ()
    metric: str = ""
    value: float | None = None
    recoverable_ns: int | None = None
    cause: str = ""
    evidence: str = ""

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
class FindingsInput:
    """What a findings hook reads: the run's results by analysis name (those that applied), the
    errors of those that did not, and the store, run and ``-p`` options they were computed with."""

    results: dict[str, FrameResult]
    errors: dict[str, Exception]
    store: Store
    run_id: int
    params: dict[str, dict[str, str]]


@dataclass(frozen=True)
class Lead:
    """A chart that opens the report, above the findings, built from the analysis' result.

    Attributes:
        anchor: Its id in the page (``waterfall``).
        what: What it shows, for the line that says why there is none (``step account``).
        build: ``build(result)`` -> (frame, chart) to draw as stacked bars, or why there is none.
    """

    anchor: str
    what: str
    build: Callable[[FrameResult], tuple[pl.DataFrame, Chart] | str]


@dataclass(frozen=True)
class Report:
    """An analysis in the report and the summary.

    Attributes:
        order: Its place among the report's sections (ascending).
        needs: What the run must hold for it, and how to record it (shown when it does not apply).
        when: ``when(store, run_id)``: whether to run it at all on this run (``desync``: only on
            runs with Flight Recorder or NCCL-plugin data); None: on every run.
        lead: A chart the report opens with (``critical_path``'s step waterfall); None: none.
        timeline_path: A frame of the result (step, rank, kind, start_ns, duration_ns) the report
            draws on the timeline of the median step (``critical_path``'s ``path``); "": none.
    """

    order: int
    needs: str
    when: Callable[[Store, int], bool] | None = None
    lead: Lead | None = None
    timeline_path: str = ""


@dataclass(frozen=True)
class Topic:
    """A findings hook: ``build(input)`` -> (findings, verdict or None) of one topic.

    Attributes:
        name: The verdict's topic (``stragglers``, ``communication``, ``idle``, ``utilization``,
            ``desync``, ``memory``).
        order: The topic's place among the verdicts (ascending; the regression gate's is
            ``traceprof.engine.findings.REGRESSION_ORDER``).
        build: Reads the results (:class:`FindingsInput`) into findings and the topic's verdict.
        aliases: Finding topics whose status is this topic's verdict (``mfu`` findings: ``utilization``).
    """

    name: str
    order: int
    build: Callable[[FindingsInput], tuple[list[Finding], Verdict | None]]
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class PerRank:
    """An analysis whose rows are computed per rank: one result per rank merges into the run's.

    Frames are concatenated in rank order, notes merged (:func:`merge_notes`).

    Attributes:
        resort: Frames sorted across ranks (not by rank first): frame name -> (columns,
            descending flags) of the analysis' own sort.
        finish: ``finish(merged, per_rank)`` -> the result, recomputing what spans ranks.
    """

    resort: dict[str, tuple[list[str], list[bool]]] = field(default_factory=dict)
    finish: Callable[[FrameResult, list[FrameResult]], FrameResult] | None = None


@dataclass(frozen=True)
class Analysis:
    """A registered analysis (module doc).

    Attributes:
        name: Module name, CLI word, test file name.
        params: The frozen ``Params`` dataclass (a :class:`RunParams`).
        result: The frozen ``Result`` class (a :class:`FrameResult`).
        frames: One :class:`~traceprof.core.schema.Table` per frame of the result, ``frame`` first.
        run: ``run(store, params) -> Result``, as registered (results shared and kept by the
            store's session, if any).
        doc: The module's docstring: what it computes and its algorithm.
        report: In the report and summary, and what it needs (None: not there).
        findings: Its findings hook (None: none).
        refine: ``refine(input, findings)`` -> every topic's findings refined with what this
            analysis measures (``critical_path``: the time each could recover), before they are
            ranked (None: none).
        per_rank: How per-rank results merge (None: cross-rank; it runs on the whole run).
        requires: Analyses it runs itself.
        reads_activity: Whether it reads the run's activity frame (module doc); True unless
            declared otherwise.
    """

    name: str
    params: type
    result: type
    frames: tuple[Table, ...]
    run: Callable[[Any, Any], FrameResult] = field(default=lambda store, p: FrameResult(pl.DataFrame()))
    doc: str = ""
    report: Report | None = None
    findings: Topic | None = None
    refine: Callable[[FindingsInput, list[Finding]], list[Finding]] | None = None
    per_rank: PerRank | None = None
    requires: tuple[str, ...] = ()
    reads_activity: bool = True

    def frame(self, name: str) -> Table:
        """The declaration of frame ``name``; KeyError when it has none."""
        for t in self.frames:
            if t.name == name:
                return t
        raise KeyError(name)

    def worst(self, name: str) -> str:
        """The column by which a table of frame ``name`` too long to show whole shows its worst rows
        (:attr:`traceprof.core.schema.Table.worst`), or "" (its first rows; also for an undeclared frame)."""
        return next((t.worst for t in self.frames if t.name == name), "")

    @property
    def summary(self) -> str:
        """The first paragraph of :attr:`doc` on one line, its reST literals (````x````) as Markdown's
        (```x```): what ``analyze list``, the README's table and docs/analyses.md show."""
        if not self.doc:
            return self.name
        return " ".join(self.doc.split("\n\n", 1)[0].split()).replace("``", "`")


_REGISTRY: dict[str, Analysis] = {}


def memo_store(store: Any) -> Any:
    """The store whose results ``store`` shares: itself, or for a worker thread's store
    (``Store.for_thread``) the store it was made from."""
    return getattr(store, "origin", None) or store


def _session(store: Any) -> Any:
    """The :class:`traceprof.engine.session.Session` attached to ``store`` (or to the store it was made
    from), or None."""
    return getattr(memo_store(store), "session", None)


def reusing(store: Any) -> bool:
    """Whether ``store``'s session runs many analyses (:attr:`Session.many`: the report), so that
    shared helpers may fetch once what all of them need."""
    s = _session(store)
    return s is not None and s.memo is not None and s.many


_F = TypeVar("_F", bound=Callable[..., Any])


def shared(fn: _F) -> _F:
    """Decorator for a helper ``fn(store, *args)`` whose result several analyses read (e.g. the
    activity intervals of a run): with a session that keeps results (``Session.memo``) it runs
    once per (store, args) (positional and keyword arguments, all hashable) and every caller gets
    the same immutable result; otherwise every call runs it. Errors are not kept."""

    @functools.wraps(fn)
    def once(store: Any, *args: Any, **kwargs: Any) -> Any:
        s = _session(store)
        if s is None or s.memo is None:
            return fn(store, *args, **kwargs)
        return s.once(_shared_key(fn, args, kwargs), lambda: fn(store, *args, **kwargs), keep_errors=False)

    return once  # type: ignore[return-value]


def _shared_key(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The memo key of a :func:`shared` helper's call (``fn``: it, or the function it wraps)."""
    return (f"{fn.__module__}.{fn.__qualname__}", (args, tuple(sorted(kwargs.items()))))


#: The qualified names of the :func:`shared` helpers marked :func:`lasting`.
_LASTING: set[str] = set()


def lasting(fn: _F) -> _F:
    """Mark the :func:`shared` helper ``fn`` (written above ``@shared``) as one whose values are
    small and read by heavy analyses of different groups: ``Session.let_go`` keeps them, as it
    keeps the results, instead of letting the next group compute them again
    (``traceprof.engine.flops.signature_flops``: a frame of a few thousand rows that took about 1.1 s
    CPU on 8 ranks x 1 M events, read by ``stragglers`` and by ``mfu``; the collectives' arrivals,
    ``traceprof.engine.arrivals``: 5 MiB and 0.2 s there, read by the replay and by
    ``critical_path``)."""
    _LASTING.add(f"{fn.__module__}.{fn.__qualname__}")
    return fn


def is_lasting(key: Any) -> bool:
    """Whether memo key ``key`` is a :func:`lasting` helper's value (:func:`_shared_key`)."""
    return isinstance(key, tuple) and len(key) == 2 and key[0] in _LASTING


def shared_done(fn: Callable[..., Any], store: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether ``store``'s session holds the result of the :func:`shared` helper ``fn`` for these
    arguments already (a caller that needs part of it takes it from there, else asks for its part)."""
    s = _session(store)
    slot = None if s is None or s.memo is None else s.memo.get(_shared_key(fn, args, kwargs))
    return slot is not None and slot.done


# Two kinds of memory are let go of, by different means, so there are two mechanisms, not one:
# a Python value a :func:`shared` helper keeps in the session's memo, under its key
# (:func:`drop_shared`, and :func:`release_shared` that does it one analysis at a time), and the
# blocks of the store DuckDB keeps cached in its buffer pool, which belong to no key and go all
# at once (:func:`release_pool`). A caller done with both calls both (whatif's compute items).


def _one_at_a_time(store: Any) -> Any:
    """``store``'s session while it runs one analysis at a time (``traceprof analyze``, or a
    report's heavy group: :attr:`Session.many` off), else None (a bare store, a report's shared phase)."""
    s = _session(store)
    return s if s is not None and not s.many else None


def release_shared(fn: Callable[..., Any], store: Any, *args: Any, **kwargs: Any) -> None:
    """Outside a session that runs many analyses (``traceprof analyze``: one analysis and those it
    requires), let go of the kept result of the :func:`shared` helper ``fn`` for these arguments
    (given as its caller gave them): its last reader has taken what it needs, and a later caller
    computes it again. In a report (:func:`reusing`) the result stays for the other analyses."""
    if _one_at_a_time(store) is not None:
        drop_shared(fn, store, *args, **kwargs)


def release_pool(store: Any) -> None:
    """Outside a session that runs many analyses (as :func:`release_shared`: one analysis at a
    time, nothing else queries the store meanwhile), make DuckDB drop the store's blocks it keeps
    cached in its buffer pool (``Session.empty_buffer_pool``): for an analysis whose peak comes
    after its reads (the what-if replay's graph), not on top of the blocks they left. A later query
    reads them again. On a bare store or in a report's shared phase it does nothing. Not a
    :func:`drop_shared`: those blocks are DuckDB's, held under no memo key, and go all together."""
    s = _one_at_a_time(store)
    if s is not None:
        s.empty_buffer_pool()


def drop_shared(fn: Callable[..., Any], store: Any, *args: Any, **kwargs: Any) -> None:
    """Let go of the kept result of the :func:`shared` helper ``fn`` for these arguments (given as
    its caller gave them) in any session, a report's too (:func:`release_shared` keeps it there):
    for a value read once, after the analyses, that no other reader shares (the report's findings
    reading a few columns of the activity alone). A later caller computes it again. It frees one
    Python value of the session's memo; DuckDB's cached blocks are :func:`release_pool`'s."""
    s = _session(store)
    if s is not None and s.memo is not None:
        s.release(_shared_key(fn, args, kwargs))


def register(
    spec: Analysis,
) -> Callable[[Callable[[Any, Any], FrameResult]], Callable[[Any, Any], FrameResult]]:
    """Decorator that registers ``run(store, params) -> Result`` as the analysis ``spec`` declares.

    The registered (and returned) function runs through the store's session when it has one
    (:meth:`traceprof.engine.session.Session.compute`: once per params, kept beside the store, on its
    executor); on a bare store it runs ``run`` directly.
    """

    def deco(fn: Callable[[Any, Any], FrameResult]) -> Callable[[Any, Any], FrameResult]:
        @functools.wraps(fn)
        def once(store: Any, p: Any) -> FrameResult:
            s = _session(store)
            return fn(store, p) if s is None else s.compute(spec.name, fn, store, p)

        module = importlib.import_module(fn.__module__)
        doc = (module.__doc__ or fn.__doc__ or "").strip()
        _REGISTRY[spec.name] = dataclasses.replace(spec, run=once, doc=spec.doc or doc)
        return once

    return deco


#: The package whose modules are the analyses (``analyses/`` in the repository, installed as this).
PACKAGE = "traceprof.analyses"
#: The entry-point group through which another installed package adds analyses: each entry point
#: names a module that registers its own (``[project.entry-points."traceprof.analyses"]``).
ENTRY_POINTS = "traceprof.analyses"
_LOADED = False


def load_all() -> None:
    """Import every module of :data:`PACKAGE` and of the :data:`ENTRY_POINTS` group, so that each
    registers itself (once per process)."""
    global _LOADED
    if _LOADED:
        return
    plugins.load(PACKAGE, ENTRY_POINTS)
    _LOADED = True


def envelope(analysis: Analysis, result: FrameResult, table: str, run: str, run_id: int) -> dict[str, Any]:
    """``analyze -f json --with-notes``: one JSON-ready object for a table of a result.

    Keys: ``analysis``, ``run`` (its name), ``run_id``, ``table``, ``columns`` (one {name, type, unit,
    doc} per column of the frame, from the analysis' declaration; type and unit from the frame alone,
    ``_ns``: ns, ``_pct``: %, where a column is not declared), ``rows`` (the frame's rows, values as
    computed: ns as integers) and ``notes`` (the result's notes: text, ranks, number, kind).

    Raises:
        KeyError: ``table`` is not one of the result's frames.
    """
    frame = result.frames()[table]
    try:
        declared = {c.name: c for c in analysis.frame(table).columns}
    except KeyError:
        declared = {}
    columns = []
    for name, dtype in frame.schema.items():
        c = declared.get(name)
        unit = (
            c.unit
            if c is not None
            else "ns"
            if name.endswith("_ns")
            else "%"
            if name.endswith("_pct")
            else ""
        )
        columns.append(
            {
                "name": name,
                "type": c.type if c is not None else str(dtype),
                "unit": unit,
                "doc": c.doc if c else "",
            }
        )
    return {
        "analysis": analysis.name,
        "run": run,
        "run_id": run_id,
        "table": table,
        "columns": columns,
        "rows": frame.to_dicts(),
        "notes": [_as_note(n).to_dict() for n in result.notes],
    }


def names() -> list[str]:
    """The registered analyses' names, sorted."""
    load_all()
    return sorted(_REGISTRY)


def specs() -> list[Analysis]:
    """Every registered analysis, by name."""
    return [_REGISTRY[n] for n in names()]


def get(name: str) -> Analysis:
    """The analysis called ``name``.

    Raises:
        UsageError: No such analysis (the message lists the known ones).
        ModuleNotFoundError: The analysis' module needs a library that is not installed (the CLI
            names it and what to install: :func:`traceprof.core.errors.missing_module`).
    """
    if name not in _REGISTRY and name.isidentifier() and not name.startswith("_"):
        # an analysis registers itself in the module of its name: import that one alone (the
        # other modules cost about 0.1-0.3 s of every `traceprof analyze` start-up)
        try:
            importlib.import_module(f"{PACKAGE}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{PACKAGE}.{name}":  # the module exists but lacks a dependency: say so
                raise
    if name not in _REGISTRY:
        load_all()
    if name not in _REGISTRY:
        near = difflib.get_close_matches(name.lower(), sorted(_REGISTRY), n=1)  # STRAGGLER -> stragglers
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise UsageError(f"no analysis {name!r}; {hint}choose one of: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def param_types(params: type) -> dict[str, type]:
    """Each field of a ``Params`` dataclass -> the type a ``-p`` string converts to, from its
    annotation (``int``, ``float``, ``bool``, ``str``). An optional one (``X | None``) takes the
    string as given: its ``Params`` converts it (``_common.positive_or_none``), so that the
    message quotes what was typed."""
    hints = typing.get_type_hints(params)
    out: dict[str, type] = {}
    for f in dataclasses.fields(params):
        t = hints.get(f.name, str)
        out[f.name] = t if t in (int, float, bool, str) else str
    return out


def make_params(analysis: Analysis, run: str | None, options: dict[str, Any]) -> Any:
    """Build ``analysis.params`` from the run and ``key=value`` options, converting strings by
    each field's annotation (other values are taken as they are). An empty string or ``default``
    (any case; ``none`` too where the default is None) leaves the parameter at its built-in
    default (:func:`is_default`): ``-p peak_tflops=`` undoes a config file's ``peak_tflops``.

    Raises:
        UsageError: Unknown key or a value of the wrong type or out of range, naming the key, the
            value, what it takes and how to get its default.
    """
    kinds = param_types(analysis.params)
    defaults = {f.name: f.default for f in dataclasses.fields(analysis.params)}
    values: dict[str, Any] = {"run": run}
    for key, raw in options.items():
        key = key.replace("-", "_")
        if key not in kinds or key == "run":
            known = ", ".join(k for k in kinds if k != "run") or "none"
            raise UsageError(f"analysis {analysis.name!r} has no parameter {key!r}; parameters: {known}")
        kind = kinds[key]
        if not isinstance(raw, str):
            values[key] = raw
            continue
        if is_default(raw, defaults[key]):  # the built-in default, over a config file's value
            continue
        try:
            values[key] = parse_bool(raw) if kind is bool else kind(raw)
        except ValueError:
            expected = {bool: "true or false", int: "a whole number", float: "a number"}.get(
                kind, kind.__name__
            )
            raise UsageError(f"{key}={raw!r}: expected {expected}{_DEFAULT_HINT.format(key=key)}") from None
        if kind is int and not -(2**63) <= values[key] < 2**63:  # ns, counts: int64 like the store
            raise UsageError(f"{key}={raw!r}: beyond the 64-bit integer range")
    try:
        return analysis.params(**values)
    except UsageError as e:  # the Params' own check: its message starts with KEY=
        key = str(e).split("=", 1)[0]
        if key not in kinds or _DEFAULT_HINT.format(key=key) in str(e):
            raise
        raise UsageError(f"{e}{_DEFAULT_HINT.format(key=key)}") from None


#: The words that give a ``-p`` parameter its built-in default (any case): ``-p KEY=`` and
#: ``-p KEY=default`` for every parameter, ``-p KEY=none`` too for one whose default is none.
DEFAULT_WORDS = ("", "default")
_DEFAULT_HINT = " (or {key}= for its default)"


def is_default(raw: str, default: object) -> bool:
    """Whether ``-p KEY=raw`` asks for the parameter's built-in default ``default``
    (:data:`DEFAULT_WORDS`, and ``none`` where the default is None)."""
    word = raw.strip().lower()
    return word in DEFAULT_WORDS or (word == "none" and default is None)
