"""Global ranks and jobs from the communicators of NCCL plugin files (the ``relate`` ingest hook).

NCCL's plugins write what each process knows: its rank *in each communicator* (the profiler
plugin: one file per communicator, ``Rank`` its rank in it; the Inspector: one file per process,
``header.rank`` per communicator) and the process (the profiler plugin's ``pid`` on every event;
the Inspector's file, host and pid). Neither writes a job id or, in a communicator other than the
world's, the global rank. Given a would-be run's files of one such source:

  1. Processes: the files of one process key (:func:`relate`'s ``process_of``); each process's rank in
     each of its communicators.
  2. Processes that share a communicator are one job's (joined transitively: a 2x2 mesh of 2-rank
     communicators is one job). A communicator rank claimed by two processes, or a process with two
     ranks in one communicator, is a conflict: said (:class:`Related`), ranks left as the files give
     them (ingest then refuses the files as two traces of one rank).
  3. Global ranks per joined set: a process's rank in the communicator that spans every process of
     the set with distinct ranks (of several, the one with the largest ranks: the world's, also
     when a folder holds one host's processes, ranks 2 and 3 of 0..3); without one, when each
     process already has one rank and no two share it, those ranks; otherwise the processes are
     numbered 0..N-1 in the order of their key (host, pid), with a note: the records do not say
     the global ranks.
  4. Sets whose global ranks overlap are different jobs (two jobs' files in one folder: both have a
     rank 0); sets whose ranks do not overlap stay one job.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from traceprof.core.parsed import ParsedTrace

__all__ = ["Related", "relate"]


@dataclass
class Related:
    """What :func:`relate` found: ``jobs`` (the traces of each job, in order of their first
    process key), ``notes`` for the user and ``conflicts`` (step 2 of the module doc)."""

    jobs: list[list[ParsedTrace]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def _sets(ranks: dict[Hashable, dict[str, int]]) -> list[list[Hashable]]:
    """Processes joined by shared communicators (module doc, step 2), each set in key order."""
    parent = {p: p for p in ranks}

    def root(p: Hashable) -> Hashable:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    first: dict[str, Hashable] = {}
    for p in sorted(ranks, key=repr):
        for comm in ranks[p]:
            if comm in first:
                parent[root(p)] = root(first[comm])
            else:
                first[comm] = p
    out: dict[Hashable, list[Hashable]] = {}
    for p in sorted(ranks, key=repr):
        out.setdefault(root(p), []).append(p)
    return list(out.values())


def relate(
    traces: list[ParsedTrace],
    comms_of: Callable[[ParsedTrace], dict[str, int]],
    process_of: Callable[[ParsedTrace], Hashable],
    label: Callable[[Hashable], str],
) -> Related:
    """Jobs and global ranks of one source's traces (module doc); sets each trace's ``rank`` (and,
    where the processes were numbered, ``world_size``).

    Args:
        traces: A would-be run's traces of one source.
        comms_of: A trace's {communicator: its rank in it}.
        process_of: A trace's process key (sortable as its ``repr``: ``(host, pid)``).
        label: A process key as messages name it (``pid 5100``).
    """
    res = Related()
    procs: dict[Hashable, list[ParsedTrace]] = {}
    ranks: dict[Hashable, dict[str, int]] = {}
    holder: dict[tuple[str, int], Hashable] = {}
    for pt in traces:
        p = process_of(pt)
        procs.setdefault(p, []).append(pt)
        mine = ranks.setdefault(p, {})
        for comm, r in comms_of(pt).items():
            if mine.get(comm, r) != r:
                res.conflicts.append(f"{label(p)} has ranks {mine[comm]} and {r} in communicator {comm}")
            mine[comm] = r
            other = holder.setdefault((comm, r), p)
            if other != p:
                res.conflicts.append(f"rank {r} of communicator {comm} is both {label(other)} and {label(p)}")
    if res.conflicts:
        return Related([traces], [], sorted(set(res.conflicts)))
    sets = [(s, _global(s, ranks, procs, label, res.notes)) for s in _sets(ranks)]
    taken: set[int] = set()
    overlap = False
    for _, g in sets:
        overlap = overlap or bool(taken & set(g.values()))
        taken |= set(g.values())
    for s, g in sets:
        for p in s:
            for pt in procs[p]:
                pt.rank = g[p]
    if overlap:
        res.jobs = [[pt for p in s for pt in procs[p]] for s, _ in sets]
    else:
        res.jobs = [traces]
    return res


def _global(
    procs_set: list[Hashable],
    ranks: dict[Hashable, dict[str, int]],
    procs: dict[Hashable, list[ParsedTrace]],
    label: Callable[[Hashable], str],
    notes: list[str],
) -> dict[Hashable, int]:
    """Each process's global rank in one joined set (module doc, step 3)."""
    n = len(procs_set)
    members = set(procs_set)
    comms = sorted({c for p in procs_set for c in ranks[p]})
    spanning = []
    for comm in comms:
        held = {p: ranks[p][comm] for p in procs_set if comm in ranks[p]}
        if set(held) == members and len(set(held.values())) == n:
            spanning.append((max(held.values()), comm, held))
    if spanning:  # the world's ranks are the largest (a folder of one host's files: ranks 2, 3 of 0..3)
        _, comm, held = max(spanning)
        if any(pt.rank != held[p] for p in procs_set for pt in procs[p]):
            notes.append(
                f"{n} processes, {len(comms)} communicators: files of a sub-communicator name the "
                f"process's rank in it; each process's global rank is its rank in communicator {comm}, "
                f"which spans all {n} (the processes told apart by pid)"
            )
        return held
    own = {p: {pt.rank for pt in procs[p]} for p in procs_set}
    if all(len(r) == 1 and None not in r for r in own.values()):
        given = {p: next(iter(r)) for p, r in own.items()}
        if len(set(given.values())) == n:
            return given  # type: ignore[return-value]
    numbered = {p: i for i, p in enumerate(sorted(procs_set, key=repr))}
    for p in procs_set:
        for pt in procs[p]:
            pt.world_size = max(pt.world_size or 0, n)
    notes.append(
        f"{n} processes joined by {len(comms)} communicators ({', '.join(comms)}), none of which spans them "
        "all: their files give ranks within each communicator only, so the processes are numbered 0.."
        f"{n - 1} in order ({', '.join(f'{label(p)} = rank {i}' for p, i in numbered.items())}), not by "
        "the job's own global ranks"
    )
    return numbered
