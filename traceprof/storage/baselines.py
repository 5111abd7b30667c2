"""Named baseline sets: the healthy runs a candidate is compared with (``traceprof baseline``).

A timing regression needs the run-to-run variance of healthy runs (:mod:`traceprof.engine.noise`), which
only several baseline runs show. A set is stored in the store's ``baselines`` table (one row per
member run), so CI names it once (``traceprof baseline add nightly run1 run2 run3``) and diffs
against it (``traceprof diff nightly CAND``). Removing a run (``traceprof runs rm``) removes it from
every set and says which sets it changed; a set it empties is gone, and the store remembers that
(``meta`` key ``baseline_emptied:NAME``: the run removed) so that ``diff NAME`` says the set was
emptied instead of "no run NAME" (until ``baseline add NAME`` fills it again). Renaming a run
keeps it in its sets; a run cannot take a set's name.

A *baseline spec* (what ``diff``, ``report --baseline``, ``summary --baseline`` and ``history``
take) is, in this order: the name of a baseline set; a run name or id; or a comma-separated list of
run names or ids (``base1,base2,base3``), where a baseline set's name stands for its runs
(``nightly,base4``: the set's runs and base4). A name that is both a set and a run is refused as
ambiguous.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import polars as pl

from traceprof.core import term
from traceprof.core.errors import StoreError, UsageError
from traceprof.storage import comparable
from traceprof.storage.runs import check_name, run_name, transaction
from traceprof.storage.store import Store

__all__ = ["Baseline", "add", "remove", "sets", "members", "resolve", "run_removed", "emptied"]

#: The ``meta`` key prefix that records a set emptied by ``runs rm`` (value: the run removed).
EMPTIED = "baseline_emptied:"


#: What a baseline spec must name, for messages.
_NAME_ONE = "name a run, runs separated by commas, or a baseline set"


@dataclass(frozen=True)
class Baseline:
    """Resolved baseline runs: ``run_ids`` in the order given, and ``label`` for messages (the
    set's name, or the run names joined by commas)."""

    run_ids: tuple[int, ...]
    label: str
    #: Names of the runs a comma list named more than once (each is counted once), in order.
    repeated: tuple[str, ...] = ()


def members(store: Store, name: str) -> list[int]:
    """Run ids of baseline set ``name`` in the order they were added ([] when there is no such set)."""
    return store.sql("SELECT run_id FROM baselines WHERE name = ? ORDER BY added_at, run_id", [name])[
        "run_id"
    ].to_list()


def sets(store: Store) -> pl.DataFrame:
    """Every baseline set: name, runs (count), run_names (list, in the order added), added_at (latest)."""
    return store.sql(
        """SELECT b.name, count(*) AS runs, list(r.name ORDER BY b.added_at, b.run_id) AS run_names,
                  max(b.added_at) AS added_at
           FROM baselines b JOIN runs r USING (run_id) GROUP BY b.name ORDER BY b.name"""
    )


def run_removed(
    store: Store, run_id: int
) -> tuple[tuple[str, ...], tuple[str, ...], list[tuple[str, list[object]]]]:
    """What removing run ``run_id`` does to the baseline sets, before it is removed: (the sets it
    leaves with other runs, the sets it empties, the statements that record the emptied ones in
    ``meta`` (:data:`EMPTIED`), one row changed each), names sorted. The ``baselines`` rows
    themselves go with the run's other rows.
    """
    rows = store.sql(
        """SELECT name, count(*) AS n FROM baselines
           WHERE name IN (SELECT name FROM baselines WHERE run_id = ?) GROUP BY name ORDER BY name""",
        [run_id],
    )
    changed = tuple(n for n, k in rows.iter_rows() if k > 1)
    gone = tuple(n for n, k in rows.iter_rows() if k == 1)
    run = run_name(store, run_id)
    return changed, gone, [("INSERT OR REPLACE INTO meta VALUES (?, ?)", [EMPTIED + n, run]) for n in gone]


def emptied(store: Store, name: str) -> str | None:
    """The run whose removal (``runs rm``) emptied baseline set ``name``, or None (no such record)."""
    got = store.sql("SELECT value FROM meta WHERE key = ?", [EMPTIED + name])
    return str(got["value"][0]) if got.height else None


def _check_one_job(store: Store, name: str, run_ids: Sequence[int]) -> None:
    """Refuse a set whose runs ``diff`` would refuse to compare (:mod:`traceprof.storage.comparable`,
    the rule ``diff`` applies): each run against the set's first.

    Raises:
        UsageError: Naming the runs and what differs.
    """
    if len(run_ids) < 2:
        return
    kinds = [comparable.kind_of(store, i) for i in run_ids]
    odd = [(k, why) for k in kinds[1:] if (why := comparable.differences([kinds[0]], k))]
    if odd:
        said = "; ".join(f"{k.name!r}: {', '.join(why)}" for k, why in odd)
        raise UsageError(
            f"baseline add: set {name!r} would hold runs that diff cannot compare with {kinds[0].name!r} "
            f"({said}); a set holds runs of one job on one kind of device: make one set per job"
        )


def add(store: Store, name: str, runs: Sequence[str]) -> tuple[list[str], list[str]]:
    """Add runs (names or ids) to baseline set ``name``, creating it; one transaction.

    Returns:
        (added, already): the run names added, and those that were members already.

    Raises:
        UsageError: ``name`` is not a valid name (:func:`traceprof.storage.runs.check_name`), or is a run's
            name (``diff NAME`` would be ambiguous); no runs given; runs that ``diff`` would not
            compare (:mod:`traceprof.storage.comparable`: GPU and CPU-only, or world sizes that
            differ), the set's own included (nothing is added).
        StoreError: No such run (nothing is added).
    """
    check_name(name, "baseline add", "set name")
    if not runs:
        raise UsageError("baseline add: name at least one run")
    taken = store.sql("SELECT run_id FROM runs WHERE name = ?", [name])
    if taken.height:
        raise UsageError(
            f"baseline add: {name!r} is the name of a run (id {taken['run_id'][0]}); choose a set "
            "name that no run has, so that `traceprof diff NAME CAND` is not ambiguous"
        )
    ids = [store.resolve_run(r, whole=False) for r in runs]
    have = set(members(store, name))
    new = list(dict.fromkeys(i for i in ids if i not in have))
    _check_one_job(store, name, [*members(store, name), *new])
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # UTC, as runs.ingested_at
    # one microsecond apart: the set keeps the order the runs were given in
    transaction(
        store,
        f"adding runs to baseline set {name!r}",
        [
            ("INSERT INTO baselines VALUES (?, ?, ?)", [name, i, now + timedelta(microseconds=j)])
            for j, i in enumerate(new)
        ]
        + [("DELETE FROM meta WHERE key = ?", [EMPTIED + name])],  # filled again (run_removed)
    )
    return [run_name(store, i) for i in new], [run_name(store, i) for i in dict.fromkeys(ids) if i in have]


def remove(store: Store, name: str, runs: Sequence[str] = ()) -> int:
    """Remove runs (names or ids) from baseline set ``name``, or the whole set when ``runs`` is
    empty; returns the number of runs removed.

    Raises:
        StoreError: No such set, or a run that is not a member of it (nothing is removed).
    """
    have = members(store, name)
    if not have:
        raise StoreError(f"no baseline set {name!r}; sets: {', '.join(sets(store)['name']) or 'none'}")
    ids = [store.resolve_run(r, whole=False) for r in runs]
    outside = [run_name(store, i) for i in ids if i not in have]
    if outside:
        raise StoreError(f"baseline set {name!r} does not hold {', '.join(outside)}")
    if not ids:
        return transaction(
            store, f"removing baseline set {name!r}", [("DELETE FROM baselines WHERE name = ?", [name])]
        )
    return transaction(
        store,
        f"removing runs from baseline set {name!r}",
        [("DELETE FROM baselines WHERE name = ? AND run_id = ?", [name, i]) for i in dict.fromkeys(ids)],
    )


def resolve(store: Store, spec: str | Sequence[str]) -> Baseline:
    """The runs of a baseline spec (module doc), or of a list of specs (their runs, in order).

    Raises:
        UsageError: A name that is both a baseline set and a run; an empty spec, list, or comma list that names no run (``,,,``).
        StoreError: No such run or set; a set that ``runs rm`` emptied (:func:`run_removed`).
    """
    if not isinstance(spec, str):
        if not spec:
            raise UsageError(f"empty baseline list: {_NAME_ONE}")
        parts = [resolve(store, s) for s in spec]
        every = [i for p in parts for i in p.run_ids]
        ids = tuple(dict.fromkeys(every))
        again = dict.fromkeys([*(n for p in parts for n in p.repeated), *_repeated(store, every)])
        return Baseline(ids, ",".join(p.label for p in parts), tuple(again))
    spec = spec.strip()
    if not spec:
        raise UsageError(f"empty baseline: {_NAME_ONE}")
    in_set = members(store, spec)
    is_run = store.sql("SELECT run_id FROM runs WHERE name = ?", [spec])
    if in_set and is_run.height:
        raise UsageError(
            f"{spec!r} is both a baseline set and a run; rename the run (`traceprof runs mv`) "
            "or the set (`traceprof baseline rm` and `add`)"
        )
    if in_set:
        return Baseline(tuple(store.resolve_run(str(i)) for i in in_set), spec)
    if not is_run.height and "," not in spec and (gone := emptied(store, spec)) is not None:
        raise StoreError(
            f"baseline set {spec!r} is empty: `traceprof runs rm` removed its last run, {gone!r}; fill it "
            f"with `{term.command('traceprof', 'baseline', 'add', spec, 'RUN')}`, or name runs instead"
        )
    if is_run.height or "," not in spec:
        rid = store.resolve_run(spec)
        return Baseline((rid,), run_name(store, rid))
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:  # ",,,": commas and no name (diff used to call the candidate the baseline's only run)
        raise UsageError(f"empty baseline list {spec!r}: it names no run; {_NAME_ONE}")
    if any(members(store, n) for n in names):  # a set among them: its runs, as a list of specs gives them
        return resolve(store, names)
    every = [store.resolve_run(s) for s in names]
    ids = tuple(dict.fromkeys(every))
    return Baseline(ids, ",".join(run_name(store, i) for i in ids), _repeated(store, every))


def _repeated(store: Store, ids: Sequence[int]) -> tuple[str, ...]:
    """Names of the runs that ``ids`` holds more than once, in order of first appearance."""
    return tuple(run_name(store, i) for i in dict.fromkeys(ids) if ids.count(i) > 1)
