"""Managing the runs of a store: remove one, rename one.

A bad ingest (wrong folder, wrong ``--run``) no longer means deleting the store: ``traceprof runs rm
NAME`` removes every row of the run from every table that has a ``run_id`` column (the schema's
tables and saved ``result_*`` tables) in one transaction; ``traceprof runs mv OLD NEW`` renames it.
Removing a run frees its files' SHA-256, so they can be ingested again (e.g. under another name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from traceprof.core import term
from traceprof.core.errors import UsageError
from traceprof.core.vocab import PROFILER_SOURCES, TraceSource
from traceprof.storage.layout import error_line
from traceprof.storage.store import Store

__all__ = ["Removed", "remove", "rename", "check_name", "run_name", "run_label", "transaction"]


def run_name(store: Store, run_id: int) -> str:
    """The name of run ``run_id`` (resolved already: ``Store.resolve_run``), for messages and
    titles: an id means nothing to the user."""
    # DuckDB's own rows, not store.sql's frame: `analyze` printing a kept view loads no polars
    return str(store.con.execute("SELECT name FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0])


def run_label(store: Store, run_id: int) -> str:
    """``run 'NAME'``: how every message names run ``run_id``, by its stored name (whether it was
    given by name, by id or not at all), quoted as Python writes a string: control, bidi and other
    unprintable characters as escapes (``'a\\x1bb'``), nothing a terminal would act on."""
    return f"run {run_name(store, run_id)!r}"


def check_name(name: str, what: str, noun: str = "run name") -> None:
    """Refuse a run (or baseline set) name that cannot be told apart from an id or printed as it is.

    Args:
        name: The proposed name.
        what: Where it comes from, for the message (``--run``, ``runs mv``).
        noun: What the name names, for the message (``"run name"``, ``"set name"``).

    Raises:
        UsageError: ``name`` is empty, all digits (``runs rm 1`` would mean run id 1), or holds
            control characters (ESC, newline: they would reach terminals and logs raw).
    """
    if not name.strip():
        raise UsageError(f"{what}: the {noun} is empty")
    if name.isdigit():
        raise UsageError(f"{what}: {name!r} would read as a run id; choose a name with a letter in it")
    from traceprof.core import term  # rich: not for the analyses that name a run (run_label)

    if term.escape(name) != name:
        raise UsageError(
            f"{what}: the {noun} {name!r} holds control characters; "
            "choose one without them (e.g. of letters, digits and -_.)"
        )


@dataclass(frozen=True)
class Removed:
    """What :func:`remove` deleted: the run's ``name`` and ``run_id``, its ``traces`` (files),
    ``rows`` (all rows over all tables, the ``runs`` row included) and the baseline sets it changed."""

    name: str
    run_id: int
    traces: int
    rows: int
    #: Baseline sets the run was removed from that hold other runs still, and those it emptied
    #: (gone; :func:`traceprof.storage.baselines.run_removed`).
    sets_changed: tuple[str, ...] = ()
    sets_emptied: tuple[str, ...] = ()


def _run_tables(store: Store) -> list[str]:
    """Base tables with a ``run_id`` column, ``runs`` last (views such as ``kernels`` are skipped)."""
    names = store.sql(
        """SELECT DISTINCT c.table_name FROM duckdb_columns() c JOIN duckdb_tables() t
             ON t.table_name = c.table_name AND t.schema_name = c.schema_name AND t.database_name = c.database_name
           WHERE c.column_name = 'run_id' AND c.database_name = current_database() ORDER BY 1"""
    )["table_name"].to_list()
    return [n for n in names if n != "runs"] + ["runs"]


def transaction(store: Store, what: str, statements: list[tuple[str, list[object]]]) -> int:
    """Run ``statements`` in one transaction (``Store.transaction``); the number of rows they changed.

    Raises:
        StoreError: DuckDB refused one (``"<what> failed, store unchanged: ..."``).
    """
    changed = 0
    with store.transaction(error=lambda e: f"{what} failed, store unchanged: {error_line(e)}") as con:
        for sql, args in statements:
            row = con.execute(sql, args).fetchone()
            changed += int(row[0]) if row else 0
    return changed


def remove(store: Store, run: str) -> Removed:
    """Delete run ``run`` (name or id) and all its rows from a writable store, its baseline set
    memberships included (the sets it empties are recorded: :mod:`traceprof.storage.baselines`).

    Raises:
        StoreError: No such run, or DuckDB refused (nothing is deleted then).
    """
    run_id = store.resolve_run(run, whole=False)  # a run whose Parquet files are damaged can be removed
    name = run_name(store, run_id)
    traces = int(store.sql("SELECT count(*) AS n FROM traces WHERE run_id = ?", [run_id])["n"][0])
    # rows kept in Parquet files (traceprof.storage.layout) count instead of their parts rows (one per file:
    # bookkeeping, so the count is the same in both layouts)
    in_files, parts = (
        int(x)
        for x in store.sql(
            "SELECT coalesce(sum(rows), 0) AS n, count(*) AS parts FROM parts WHERE run_id = ?", [run_id]
        ).row(0)
    )
    from traceprof.storage.baselines import run_removed  # it imports this module

    changed, emptied, record = run_removed(store, run_id)
    stmts: list[tuple[str, list[object]]] = [
        (f'DELETE FROM "{t}" WHERE run_id = ?', [run_id]) for t in _run_tables(store)
    ]
    # the emptied sets' records change one meta row each: not the run's rows
    rows = transaction(store, f"removing run {name!r}", stmts + record) - len(record) + in_files - parts
    store.remove_run_files(run_id)  # a Parquet-layout store's files of the run, once its rows are gone
    return Removed(name, run_id, traces, rows, changed, emptied)


def rename(store: Store, old: str, new: str) -> int:
    """Rename run ``old`` (name or id) to ``new``; returns its run_id.

    Raises:
        StoreError: No such run.
        UsageError: ``new`` is refused by :func:`check_name`, or is another run's name or a
            baseline set's (the run keeps its sets: they hold its run_id).
    """
    run_id = store.resolve_run(old, whole=False)
    check_name(new, "runs mv")
    taken = store.sql("SELECT run_id FROM runs WHERE name = ? AND run_id <> ?", [new, run_id])
    if taken.height:
        raise UsageError(
            f"runs mv: a run named {new!r} exists already (id {taken['run_id'][0]}); "
            f"remove it first with `{term.command('traceprof', 'runs', 'rm', new)}`"
        )
    if store.sql("SELECT 1 FROM baselines WHERE name = ? LIMIT 1", [new]).height:
        raise UsageError(
            f"runs mv: {new!r} is the name of a baseline set; choose a name that no set has, so that "
            f"`traceprof diff {new} CAND` is not ambiguous"
        )
    transaction(
        store, f"renaming run {old!r}", [("UPDATE runs SET name = ? WHERE run_id = ?", [new, run_id])]
    )
    return run_id


class Held(NamedTuple):
    """What :func:`ranks_held` read of a run: its world size (``runs.world_size``; None: unknown),
    the (rank, source, ranks it stands for) of its traces with a rank (none kept when the world size
    is unknown) and the sources of all its traces (``traces.source``, with a rank or not)."""

    world: int | None
    traces: list[tuple[int, str, int]]
    sources: frozenset[str] = frozenset()


def ranks_held(store: Store, run_id: int) -> Held:
    """The run's world size, its traces' ranks and sources (:class:`Held`), two statements, for
    :func:`untraced_ranks` and :func:`profiler_gap_text` to share (an ingest asks both, and the
    sources for its settle hooks).

    Source fields read: ``runs.world_size``; ``traces.rank``, ``source``, ``meta`` (``stands_for``).
    """
    # plain DuckDB rows, not polars: ingest asks this too, and an ingest does not import polars
    world = store.con.execute("SELECT world_size FROM runs WHERE run_id = ?", [run_id]).fetchall()
    size = world[0][0] if world else None
    # the store's own traces even where a per-rank task shadows them with its rank's rows
    # (traceprof.engine.rankwise.restrict): which ranks the job lacks is a fact of the whole run
    held = store.con.execute(
        f"""SELECT DISTINCT rank, source, {_STANDS_FOR} AS n
            FROM {store.own_table("traces")} WHERE run_id = ?""",
        [run_id],
    ).fetchall()
    sources = frozenset(str(s) for _, s, _ in held)
    if size is None:
        return Held(None, [], sources)
    return Held(int(size), [(int(r), str(s), int(n)) for r, s, n in held if r is not None], sources)


def untraced_ranks(
    store: Store, run_id: int, sources: tuple[str, ...] | None = None, held: Held | None = None
) -> tuple[tuple[int, ...], int | None]:
    """(The ranks of the job that no trace of run ``run_id`` holds, its world size): ranks
    0..world_size-1 (``runs.world_size``) less the ranks of its traces (``traces.rank``) and the
    ranks each trace stands for (:func:`stand_ins`: an NDTimeline worker for its collapsed
    tensor-parallel group); ``()`` when every rank was traced or the world size is unknown (then None).

    Args:
        store: The store.
        run_id: The run.
        sources: Count only traces of these sources (``traces.source``, e.g. :data:`PROFILER_SOURCES`)
            where the run holds any trace of them (a run of Flight Recorder dumps only is judged by
            them); None: a trace of any source counts.
        held: :func:`ranks_held` of the run, read already; None: read here.

    Linear in the run's traces; the ranks listed are at most the world size.
    """
    size, rows, _ = held if held is not None else ranks_held(store, run_id)
    if size is None:
        return (), None
    if sources is not None and any(source in sources for _, source, _ in rows):
        rows = [row for row in rows if row[1] in sources]
    traced = {rank + i for rank, _, n in rows for i in range(max(n, 1))}
    return tuple(r for r in range(size) if r not in traced), size


#: SQL over ``traces``: how many consecutive ranks from ``traces.rank`` the trace stands for (its
#: meta's ``stands_for.ranks``, written by a collector whose source collapses ranks, else 1).
_STANDS_FOR = "coalesce(TRY_CAST(json_extract_string(meta, '$.stands_for.ranks') AS INTEGER), 1)"


def stand_ins(store: Store, run_id: int) -> tuple[int, str]:
    """(How many traced ranks of run ``run_id`` each stand for a group of ranks, why): a source that
    collapses ranks (NDTimeline: one worker per tensor-parallel group) says so in its traces' meta
    (``traces.meta`` ``stands_for``: ``ranks``, the group size, and ``why``, e.g. ``one per
    tensor-parallel group of 4 (NDTimeline collapses TP)``); (0, "") when no trace does."""
    rows = store.con.execute(
        f"""SELECT count(DISTINCT rank), min(json_extract_string(meta, '$.stands_for.why'))
            FROM {store.own_table("traces")} WHERE run_id = ? AND {_STANDS_FOR} > 1""",
        [run_id],
    ).fetchall()
    n, why = rows[0] if rows else (0, None)
    return int(n or 0), str(why or "")


def ranks_text(store: Store, run_id: int) -> str:
    """How many ranks of run ``run_id``'s job were traced, in a few words for the report's header and
    the start of the summary's coverage line (one text, so they agree with ``traceprof runs``):
    ``4 ranks``; ``4 ranks, 3 traced``; ``4 ranks, 3 traced (rank 2: a Flight Recorder dump only)``;
    ``64 ranks, 16 traced: one per tensor-parallel group of 4 (NDTimeline collapses TP)``. Ranks
    are ``traces.rank`` against ``runs.world_size`` (the ranks held when it is unknown); traced means
    by a profiler (:data:`PROFILER_SOURCES`) where the run has any profiler trace."""
    missing, world = untraced_ranks(store, run_id, PROFILER_SOURCES)
    held = store.con.execute(
        "SELECT count(DISTINCT rank), count(DISTINCT rank) FILTER (WHERE list_contains(?, source)) "
        f"FROM {store.own_table('traces')} WHERE run_id = ?",
        [list(PROFILER_SOURCES), run_id],
    ).fetchall()[0]
    with_file, profiled = int(held[0] or 0), int(held[1] or 0)
    traced = profiled or with_file
    world = world if world is not None else with_file
    text = f"{world} rank{'s' if world != 1 else ''}"
    collapsed, why = stand_ins(store, run_id)
    if collapsed and not missing:
        return f"{text}, {collapsed} traced: {why}"
    if traced < world:
        text += f", {traced} traced"
    dump_only = sorted(set(missing) - set(untraced_ranks(store, run_id)[0]))
    if dump_only:
        s = "s" if len(dump_only) > 1 else ""
        text += f" (rank{s} {rank_list(dump_only)}: {_only_text(store, run_id, dump_only)} only)"
    return text


def profiler_gap_text(store: Store, run_id: int, held: Held | None = None) -> str:
    """``no profiler (Kineto/nsys) trace of rank 2 (it has a Flight Recorder dump only)`` for ranks
    with traces of other sources (``traces.source``) but no :data:`PROFILER_SOURCES` trace, where
    other ranks of the run have one; else empty. ``held``: :func:`ranks_held` of the run, read
    already; None: read here (once for both counts)."""
    held = held if held is not None else ranks_held(store, run_id)
    gap = sorted(
        set(untraced_ranks(store, run_id, PROFILER_SOURCES, held)[0])
        - set(untraced_ranks(store, run_id, held=held)[0])
    )
    if not gap:
        return ""
    s = "s" if len(gap) > 1 else ""
    return (
        f"no profiler (Kineto/nsys) trace of rank{s} {rank_list(gap)} "
        f"({'they have' if s else 'it has'} {_only_text(store, run_id, gap)} only)"
    )


def _only_text(store: Store, run_id: int, ranks: list[int]) -> str:
    """``a Flight Recorder dump`` (``and a nccl_profiler trace``...): the sources of run
    ``run_id``'s traces of ``ranks`` (``traces.source``), in words."""
    held = [
        row[0]
        for row in store.con.execute(
            "SELECT DISTINCT source FROM traces WHERE run_id = ? AND list_contains(?, rank) ORDER BY source",
            [run_id, ranks],
        ).fetchall()
    ]
    names = {TraceSource.flight_recorder.value: "a Flight Recorder dump"}
    return " and ".join(names.get(x, f"a {x} trace") for x in held)


def rank_list(ranks: tuple[int, ...] | list[int]) -> str:
    """``2``, ``1, 3`` or ``1-299``: sorted ranks with consecutive runs of 3 or more as ranges."""
    out: list[str] = []
    rs = sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out += [f"{rs[i]}-{rs[j]}"] if j - i >= 2 else [str(r) for r in rs[i : j + 1]]
        i = j + 1
    return ", ".join(out)


#: The verdict topics that need every rank, and their words in :func:`coverage_text`.
EVERY_RANK_TOPICS = {"desync": "desync", "communication": "exposed communication", "stragglers": "stragglers"}


def coverage_text(store: Store, run_id: int, status: Mapping[str, str] | None = None) -> str:
    """What the summary says first about the ranks of the job (``Ranks: ...``), else empty: when ranks
    were not traced, or have no profiler trace (:func:`profiler_gap_text`), ``3 of 4 ranks traced:
    no trace of rank 2; ...; verdicts that need every rank ... are inconclusive ...``; when every rank
    is covered by traces that stand for groups of ranks (:func:`stand_ins`), only that:
    ``16 of 64 ranks traced: one per tensor-parallel group of 4 (NDTimeline collapses TP)``.

    ``status``: verdict topic -> its status (``inconclusive``, ``ok``, ...): of the verdicts of
    :data:`EVERY_RANK_TOPICS`, those inconclusive are named so, those the run has none of (their
    analysis does not apply) are said not to be available, and one that stands is not named;
    None: all three named inconclusive (no verdicts at hand)."""
    missing, world = untraced_ranks(store, run_id)
    gap = profiler_gap_text(store, run_id)
    collapsed, why = stand_ins(store, run_id)
    if world is None or not (missing or gap or collapsed):
        return ""
    if collapsed and not (missing or gap):
        return f"{collapsed} of {world} ranks traced: {why}"
    parts = []
    if missing:
        traced = world - len(missing)
        parts.append(
            f"{traced} of {world} ranks traced: no trace of rank{'s' if len(missing) > 1 else ''} "
            f"{rank_list(missing)}"
        )
    if gap:
        parts.append(gap)
    return "; ".join([*parts, *_every_rank_clause(status)])


def _every_rank_clause(status: Mapping[str, str] | None) -> list[str]:
    """What :func:`coverage_text` says of the verdicts that need every rank (see there)."""

    def named(want: str) -> list[str]:
        if status is None:
            return list(EVERY_RANK_TOPICS.values()) if want == "inconclusive" else []
        return [words for topic, words in EVERY_RANK_TOPICS.items() if status.get(topic, "none") == want]

    out = []
    if inc := named("inconclusive"):
        many = len(inc) > 1
        out.append(
            f"{'verdicts that need' if many else 'the verdict that needs'} every rank ({', '.join(inc)}) "
            f"{'are' if many else 'is'} inconclusive where the untraced rank(s) could explain what "
            f"{'they' if many else 'it'} saw"
        )
    if na := named("none"):
        out.append(f"{' and '.join(na)} (also needing every rank): not available from this run's sources")
    return out


def untraced_members(store: Store, run_id: int, untraced: tuple[int, ...]) -> tuple[int, ...]:
    """The ranks of ``untraced`` that are members of run ``run_id``'s collectives
    (``collective_instances.pg_ranks``); all of ``untraced`` where the membership of any instance
    is unknown (``pg_ranks`` NULL: the collective may span the whole job).

    One pass over the run's collective instances; the ranks listed are at most ``len(untraced)``.
    """
    if not untraced:
        return ()
    row = store.sql(
        """SELECT count(*) FILTER (WHERE pg_ranks IS NULL) AS unknown,
                  list_distinct(flatten(list(CAST(pg_ranks AS INTEGER[])))) AS members
           FROM collective_instances WHERE run_id = ?""",
        [run_id],
    ).row(0, named=True)
    if row["unknown"] or row["members"] is None:
        return untraced
    members = set(row["members"])
    return tuple(r for r in untraced if r in members)


def not_shown_to_straggle(text: str) -> str:
    """An inconclusive straggler verdict's text: a leading ``no straggler: `` (a negative claim the
    verdict cannot make) said as ``not shown to straggle: `` (the README's rule: "not shown to
    straggle", never "not straggling"); any other text as it is."""
    head = "no straggler: "
    return "not shown to straggle: " + text[len(head) :] if text.startswith(head) else text


def straggler_gap_text(store: Store, run_id: int) -> str:
    """Why no straggler verdict but ``inconclusive`` can be given on run ``run_id`` when no traced
    rank is named: ``rank(s) 2 not traced (no profiler trace): ...``, naming the ranks of the job
    without a profiler (Kineto/nsys) trace (:func:`untraced_ranks` over :data:`PROFILER_SOURCES`)
    that are members of its collectives (:func:`untraced_members`); empty when there are none.

    ``analyze stragglers`` (its ``verdict`` table) and the combined verdict of summary and report
    (``traceprof.engine.verdict``) both say this, so the verdict does not depend on the command.
    """
    untraced = untraced_members(store, run_id, untraced_ranks(store, run_id, PROFILER_SOURCES)[0])
    if not untraced:
        return ""
    return (
        f"rank(s) {rank_list(untraced)} not traced (no profiler trace): the traced ranks may be waiting "
        "for them at the collectives, so a straggler among them cannot be ruled out (inconclusive)"
    )
