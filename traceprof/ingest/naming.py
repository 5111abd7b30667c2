"""Run names of an ingest without ``--run``: what each run is called, and which files are one run.

Rules, in order (each renaming or split is said in a note):
  0. Files of a source whose ranks are ranks within a communicator (NCCL's profiler plugin and
     Inspector: ``sources.Collector.relate``) get their global ranks first; when they are several
     jobs' (two sets of processes sharing no communicator, each with a rank 0), the folder's run is
     one per job, named ``<folder>-pid<its lowest pid>`` (:func:`relate`; jobs of one lowest pid
     numbered ``-pid<pid>-1``, ``-pid<pid>-2``).
  1. A folder of trace files is one run named after the folder; a file named on the command line
     alone (or a whole-run file such as an NDTimeline trace) is one run named after the file, its
     trace suffixes dropped (``x.sqlite`` -> ``x``, ``rank0.pt.trace.json.gz`` -> ``rank0``).
  2. A folder whose files cannot be one job (:func:`conflict`: ranks unknown in several files, one
     rank twice, other world sizes, recorded hours apart, traces of one host that do not overlap
     in time, or of other hosts more than 5 min apart) is split: files of one stated world size
     stay together where they can be one job;
     single-rank files (no world size, or 1) are one run each, named after the file; files of one
     world size that cannot be one job are split by time (:func:`by_clock`: files whose spans
     overlap are one job's) where each such set can be one job, a set of one file named after the
     file, of several ``<folder>-pid<its lowest pid>``; files recorded together that hold complete
     rank sets (0..world-1 once each), each machine's files within one set, are one run per set
     (:func:`_by_host`, named as by time) when that split is unambiguous (the only grouping of whole
     machines into complete rank sets, and on each machine pids rise with rank); what still cannot
     be one run (one rank twice in files recorded together) is left for ingest to refuse.
  3. Runs of this ingest that would share a name (folders ``a/test`` and ``b/test``) are one run
     when their files can be one job (a job's ranks in one folder per host); else each is named
     by as much of its path as tells them apart (``a/test``, ``b/test``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from traceprof.core.errors import StoreError, TraceFormatError
from traceprof.core.parsed import ParsedTrace
from traceprof.ingest import sources
from traceprof.storage.identity import (
    MAX_CLOCK_OFFSET_NS,
    SAME_HOST_SLACK_NS,
    check_within,
    clock_gap,
    duration,
    epoch_span,
    machine,
    process_id,
    same_host_gap,
)
from traceprof.storage.store import Store

__all__ = ["Part", "stem", "conflict", "assign", "relate", "by_clock"]

#: Suffixes dropped from a file's name to name its run (repeatedly, case-insensitively).
TRACE_SUFFIXES = (".gz", ".zst", ".json", ".sqlite", ".db", ".parquet", ".pkl", ".pickle", ".trace", ".pt")


def stem(path: Path) -> str:
    """A file's name without its trace suffixes (:data:`TRACE_SUFFIXES`); the name itself when that
    would leave nothing."""
    name = path.name
    while True:
        low = name.lower()
        cut = next((s for s in TRACE_SUFFIXES if low.endswith(s) and len(name) > len(s)), None)
        if cut is None:
            return name
        name = name[: -len(cut)]


@dataclass
class Part:
    """A would-be run: its name, where its files lie (a folder, or a file for a run of one file
    named after it) and its parsed traces."""

    name: str
    origin: Path
    traces: list[ParsedTrace]


def conflict(traces: list[ParsedTrace]) -> str:
    """Why ``traces`` cannot be one job's run, or ``""``: several files and a rank unknown, one
    (rank, source, part) in two files (``ParsedTrace.part``: the NCCL plugin writes a file per
    communicator), two world sizes, traces of one host that do not overlap in time
    (:func:`traceprof.storage.identity.same_host_gap`), or times more than an hour apart, or of
    other hosts more than 5 min (:func:`traceprof.storage.identity.check_within`)."""
    said = _identity_conflict(traces)
    if said or len({pt.path for pt in traces}) < 2:
        return said
    apart = same_host_gap(traces)
    if apart is not None:
        first, later, host, gap = apart
        return (
            f"{Path(later).name} was recorded {duration(gap)} after {Path(first).name} ended, both on host {host!r}, "
            "whose ranks share a clock"
        )
    try:
        check_within("", traces)
    except StoreError:
        far = clock_gap(traces)
        if far is None:
            return "its files were recorded more than an hour apart"
        first, later, gap = far
        return (
            f"{Path(later).name} was recorded {duration(gap)} after {Path(first).name} ended, more than "
            f"hosts' clocks differ ({duration(MAX_CLOCK_OFFSET_NS)})"
        )
    return ""


def _identity_conflict(traces: list[ParsedTrace]) -> str:
    """:func:`conflict`'s causes that no option overrides (ingest refuses them in one run even with
    ``--force-run``): a rank unknown in several files, one (rank, source, part) twice, two world
    sizes; ``""`` when there is none."""
    files = {pt.path for pt in traces}
    if len(files) < 2:
        return ""
    if any(pt.rank is None for pt in traces):
        n = len({pt.path for pt in traces if pt.rank is None})
        return f"{n} of its {len(files)} files record no rank"
    seen: dict[tuple[int, str, str | None], str] = {}
    for pt in traces:
        key = (int(pt.rank), pt.source, pt.part)  # type: ignore[arg-type]
        if key in seen and seen[key] != pt.path:
            a, b = Path(seen[key]), Path(pt.path)
            return f"rank {pt.rank} is in {a.name if a.name != b.name else a} and {b.name if a.name != b.name else b}"
        seen[key] = pt.path
    worlds = sorted({pt.world_size for pt in traces if pt.world_size is not None})
    if len(worlds) > 1:
        return f"its files state world sizes {', '.join(map(str, worlds))}"
    return ""


def _hint(traces: list[ParsedTrace]) -> str:
    """The split note's hint on ``traces`` (the folder's files): a folder per job; and where only
    their times keep them apart (``--force-run`` overrides those checks, never a rank twice or two
    world sizes), the command that stores them as one run anyway (``--run`` alone is refused)."""
    if _identity_conflict(traces):
        return "(put each job's files in a folder of its own)"
    return "(put each job's files in a folder of its own; to store them as one run anyway: --run NAME --force-run)"


def relate(traces: list[ParsedTrace]) -> list[list[ParsedTrace]]:
    """Rule 0 of the module doc: ``traces`` (one would-be run's) as jobs, their ranks made global by
    each source's ``relate`` hook. Traces of other sources stay with the first job; a source's
    traces that are several jobs beside another source's are returned as one (ingest's checks then
    say which files clash).

    Raises:
        TraceFormatError: A source's files contradict each other (the hook's message).
    """
    jobs = [traces]
    for c in sources.collectors():
        mine = [pt for pt in traces if pt.source == c.name]
        if c.relate is None or len(mine) < 2:
            continue
        found = c.relate(mine)
        if len(found) > 1 and len(mine) == len(traces):
            jobs = found
    return jobs


def _pid_name(name: str, traces: list[ParsedTrace]) -> str:
    """``<name>-pid<lowest pid>`` (as text) of a job's traces, or ``<name>-<its first file's stem>``
    when none states a pid (was ``<name>-pidNone``)."""
    pids = sorted(p for p in (process_id(pt) for pt in traces) if p is not None)
    return f"{name}-pid{pids[0]}" if pids else f"{name}-{stem(Path(min(pt.path for pt in traces)))}"


def _pid_names(name: str, jobs: list[list[ParsedTrace]]) -> list[str]:
    """``<name>-pid<lowest pid>`` per job; jobs of one lowest pid (processes of other hosts or
    containers) numbered, never one run again."""
    names = [_pid_name(name, job) for job in jobs]
    return [f"{n}-{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def by_clock(traces: list[ParsedTrace]) -> list[list[str]]:
    """The files of ``traces`` as sets recorded together, in order of their first time: a file
    whose epoch span begins within max(its span, the span of the file so far that ends last, a
    slack) of that file's end joins its set. The slack is
    :data:`~traceprof.storage.identity.SAME_HOST_SLACK_NS` when both files name one machine
    (:func:`~traceprof.storage.identity.machine`), as
    :func:`~traceprof.storage.identity.same_host_gap` judges one host's files, else
    :data:`~traceprof.storage.identity.MAX_CLOCK_OFFSET_NS` (other hosts' clocks, or hosts unknown,
    as :func:`~traceprof.storage.identity.clock_gap`). One set when some file has no epoch span
    (nothing to tell them apart by). n log n in the traces.
    """
    spans: dict[str, tuple[int, int, str | None]] = {}
    for pt in traces:
        lo, hi = epoch_span(pt)
        if lo is None or hi is None:
            return [list(dict.fromkeys(pt.path for pt in traces))]
        old = spans.get(pt.path, (lo, hi, machine(pt)))
        spans[pt.path] = (min(lo, old[0]), max(hi, old[1]), old[2])
    sets: list[list[str]] = []
    last: tuple[int, int, str | None] | None = None  # the span so far that ends last
    for path, (lo, hi, host) in sorted(spans.items(), key=lambda kv: kv[1][:2]):
        slack = (
            SAME_HOST_SLACK_NS
            if last is not None and host is not None and host == last[2]
            else MAX_CLOCK_OFFSET_NS
        )
        if last is None or lo - last[1] > max(slack, hi - lo, last[1] - last[0]):
            sets.append([])
        sets[-1].append(path)
        if last is None or hi > last[1]:
            last = (lo, hi, host)
    return sets


def _related(part: Part, notes: list[str]) -> list[Part]:
    """Rule 0 of the module doc on one would-be run."""
    jobs = relate(part.traces)
    if len(jobs) < 2:
        return [part]
    names = _pid_names(part.name, jobs)
    out = [Part(n, part.origin, job) for n, job in zip(names, jobs, strict=True)]
    notes.append(
        f"{part.origin}: its files are {len(out)} jobs' (sets of processes that share no communicator, "
        f"each with the same ranks), so they are {len(out)} runs: {', '.join(repr(p.name) for p in out)} "
        "(put each job's files in a folder of its own: they cannot be one run)"
    )
    return out


def _by_file(traces: list[ParsedTrace]) -> dict[str, list[ParsedTrace]]:
    out: dict[str, list[ParsedTrace]] = {}
    for pt in traces:
        out.setdefault(pt.path, []).append(pt)
    return out


def _split(part: Part, why: str, notes: list[str]) -> list[Part]:
    """Rule 2 of the module doc on one folder's would-be run."""
    files = _by_file(part.traces)
    by_world: dict[int | None, list[str]] = {}
    for path, pts in files.items():
        worlds = {pt.world_size for pt in pts}
        w = worlds.pop() if len(worlds) == 1 else None
        by_world.setdefault(w if w is not None and w > 1 else None, []).append(path)
    out: list[Part] = []
    jobs = sum(1 for w, paths in by_world.items() if w is not None and len(paths) > 1)
    for w, paths in by_world.items():
        traces = [pt for p in paths for pt in files[p]]
        if w is None or len(paths) == 1:  # single-rank files: one run each
            if len(paths) > 1 and any(len({pt.rank for pt in files[p]}) > 1 for p in paths):
                return [part]  # a multi-rank file among them: not ours to split
            out += [Part(stem(Path(p)), Path(p), files[p]) for p in paths]
        elif not conflict(traces):  # one job's files: the folder's name (with its world size if two)
            out.append(Part(f"{part.name}-world{w}" if jobs > 1 else part.name, part.origin, traces))
        elif (
            timed := _timed(f"{part.name}-world{w}" if jobs > 1 else part.name, part.origin, files, paths)
        ) is not None:
            out += timed
        elif (
            hosted := _by_host(
                f"{part.name}-world{w}" if jobs > 1 else part.name, part.origin, files, paths, w
            )
        ) is not None:
            out += hosted
        else:
            return [
                part
            ]  # two runs of one job in one folder recorded together: ingest says which files clash
    if len(out) < 2:
        return [part]
    names = ", ".join(repr(p.name) for p in out)
    notes.append(
        f"{part.origin}: its files cannot be one job ({why}), so they are {len(out)} runs: {names} "
        + _hint(part.traces)
    )
    return out


def _timed(
    name: str, origin: Path, files: dict[str, list[ParsedTrace]], paths: list[str]
) -> list[Part] | None:
    """Rule 2's split by time of one world size's files (:func:`by_clock`), or None when the sets
    are one, or some set still cannot be one job."""
    sets = by_clock([pt for p in paths for pt in files[p]])
    if len(sets) < 2 or any(conflict([pt for p in s for pt in files[p]]) for s in sets):
        return None
    many = [[pt for p in s for pt in files[p]] for s in sets if len(s) > 1]
    names = iter(_pid_names(name, many))
    return [
        Part(next(names), origin, [pt for p in s for pt in files[p]])
        if len(s) > 1
        else Part(stem(Path(s[0])), Path(s[0]), files[s[0]])
        for s in sets
    ]


def _by_host(
    name: str, origin: Path, files: dict[str, list[ParsedTrace]], paths: list[str], world: int
) -> list[Part] | None:
    """Rule 2's split by machine of one world size's files recorded together: each machine's files
    (:func:`~traceprof.storage.identity.machine`) stay in one job, and the jobs are complete rank
    sets (0..``world``-1 once each). None (ingest then refuses the folder, naming a rank twice)
    unless that split is unambiguous (where whole machines group into complete rank sets in more
    than one way, a TraceFormatError naming each machine's ranks, two groupings and what to do): the only way to group whole machines into complete rank sets
    (:func:`_covers`: two jobs' ranks 0-1 on node-a and node-c and 2-3 on node-b and node-d
    pair either way, since hosts' clocks differ by up to 5 min), and on each machine the files'
    pids (``trace["pid"]``) rise with their rank, as one launcher starts a job's local ranks (a
    machine holding ranks 0-1 of one job and 2-3 of another, pids 27284, 27285, 2513, 2514, is two
    jobs' files, not to be cut by machine); also None when a file names no machine, no integer
    pid or no rank. Where a machine holds several jobs' processes, or the machines make no complete
    rank sets while a rank is twice, the refusal is told as well: every machine's files are cut into
    one launcher's (:func:`_pid_runs`) and a TraceFormatError names each run's host, pids and ranks
    and two groupings of them, or the ranks no grouping completes (t12 E3, E7, E4); one grouping
    through a cut machine is left to ingest's refusal (no split on a guess). Linear in the traces
    but for :func:`_covers`'s search, which is bounded.
    """
    hosts: dict[str, list[str]] = {}
    for p in paths:
        found = {machine(pt) for pt in files[p]}
        if None in found or len(found) != 1:
            return None
        hosts.setdefault(str(found.pop()), []).append(p)

    def first(ps: list[str]) -> int:
        return min((epoch_span(pt)[0] or 0) for p in ps for pt in files[p])

    whole = [_pid_runs(ps, files, cut=False) for ps in hosts.values()]
    cut = any(w is not None and len(w) > 1 for w in whole)  # a machine holding several jobs' processes
    runs = [_pid_runs(ps, files, cut=True) for ps in hosts.values()] if cut else whole
    if any(w is None for w in runs):
        return None  # a file without a rank or an integer pid
    blocks: list[list[str]] = sorted((b for w in runs for b in w or []), key=first)
    ranks = [frozenset(int(pt.rank) for p in ps for pt in files[p]) for ps in blocks]  # type: ignore[arg-type]
    covers = _covers(ranks, frozenset(range(world)))
    if covers is not None and len(covers) > 1 and len(covers[0]) > 1:
        raise TraceFormatError(origin, "", _ambiguous(blocks, ranks, covers, files, world))
    if covers == [] and _identity_conflict([pt for p in paths for pt in files[p]]).startswith("rank "):
        raise TraceFormatError(origin, "", _ambiguous(blocks, ranks, [], files, world))
    if cut:
        return None  # one way, through a machine's files: not cut on a guess (ingest names a rank twice)
    cover = covers[0] if covers is not None and len(covers) == 1 else None
    if cover is None or len(cover) < 2:
        return None
    sets = [[pt for i in job for p in blocks[i] for pt in files[p]] for job in cover]
    if any(conflict(s) for s in sets):
        return None
    return [Part(n, origin, job) for n, job in zip(_pid_names(name, sets), sets, strict=True)]


#: The widest step (in pid) between two local ranks of one launcher, for :func:`_pid_runs`' cut:
#: a launcher forks its local ranks one after another (27284-27287 in sample_traces).
LOCAL_PID_STEP = 32


def _pid_runs(paths: list[str], files: dict[str, list[ParsedTrace]], cut: bool) -> list[list[str]] | None:
    """One machine's files (``paths``) as runs of one launcher's processes: the whole machine when
    its ranks are distinct and its pids rise with them; else (or with ``cut``, for every machine
    once one holds several jobs' processes) cut in pid order wherever the rank does not rise or the
    pid steps more than :data:`LOCAL_PID_STEP` (t12 E3: node-a's pids 2513, 2514, 27284, 27285 hold
    ranks 2, 3, 0, 1: runs {2, 3} and {0, 1}); None when a file has no rank or no integer pid."""
    keyed = []
    for p in paths:
        for pt in files[p]:
            pid = _int_pid(pt)
            if pt.rank is None or pid is None:
                return None
            keyed.append((pid, int(pt.rank), p))
    by_rank = sorted(keyed, key=lambda k: k[1])
    rising = [k[0] for k in by_rank] == sorted({k[0] for k in keyed})
    if not cut and len({r for _, r, _ in keyed}) == len(keyed) and rising:
        return [list(dict.fromkeys(p for *_, p in by_rank))]
    runs: list[list[str]] = []
    last: tuple[int, int] | None = None
    for pid, rank, p in sorted(keyed):
        if last is None or rank <= last[1] or pid - last[0] > LOCAL_PID_STEP:
            runs.append([])
        runs[-1].append(p)
        last = (pid, rank)
    return [list(dict.fromkeys(r)) for r in runs]


def _int_pid(pt: ParsedTrace) -> int | None:
    """``pt``'s process id (``trace["pid"]``) as an integer, or None when unstated or not one."""
    pid = process_id(pt)
    try:
        return int(pid) if pid is not None else None
    except ValueError:
        return None


#: Steps :func:`_covers` may take before it calls the grouping ambiguous.
COVER_STEPS = 10_000


def _ambiguous(
    blocks: list[list[str]],
    ranks: list[frozenset[int]],
    covers: list[list[list[int]]],
    files: dict[str, list[ParsedTrace]],
    world: int,
) -> str:
    """The refusal of files recorded together that machines group into jobs in more than one way,
    or in none where a rank is twice (:func:`_by_host`; ``covers`` empty): each machine's ranks (a
    machine holding several jobs' processes once per run of rising pid, with its pids), two of
    the groupings or the ranks that no grouping completes, and what to do."""
    host = [str(machine(files[ps[0]][0])) for ps in blocks]
    label = [
        h if host.count(h) == 1 else f"{h} pids {_span(sorted(_int_pid(files[p][0]) or 0 for p in ps))}"
        for h, ps in zip(host, blocks, strict=True)
    ]
    each = "; ".join(f"{h} ranks {', '.join(map(str, sorted(r)))}" for h, r in zip(label, ranks, strict=True))
    n = sum(len(ps) for ps in blocks)
    if covers:
        ways = ", or as ".join(
            " and ".join("+".join(label[i] for i in job) for job in cover) for cover in covers
        )
        how = f"{len(covers[0])} jobs of {world} ranks recorded together, which their hosts group in more than one way"
        how += f" ({each}: jobs as {ways})"
    else:
        jobs = max(sum(1 for r in ranks if k in r) for k in range(world))
        how = f"{jobs} jobs of {world} ranks recorded together, which their hosts cannot group into complete jobs"
        how += f" ({each}: {_missing(ranks, world, jobs)})"
    return (
        f"its {n} files look like {how}, so which job each file is cannot be told: put each job's files in a "
        "folder of its own, or ingest each job's files on their own with --run NAME"
    )


def _span(pids: list[int]) -> str:
    """``27284-27285`` for a run of pids (its first and last), ``4900`` for one."""
    return str(pids[0]) if len(pids) == 1 else f"{pids[0]}-{pids[-1]}"


def _missing(ranks: list[frozenset[int]], world: int, jobs: int) -> str:
    """What ``jobs`` complete rank sets of ``world`` would need beyond the files' ``ranks``:
    ``ranks 2, 3 missing once`` (each rank held fewer than ``jobs`` times, by how many)."""
    short: dict[int, list[int]] = {}
    for k in range(world):
        gap = jobs - sum(1 for r in ranks if k in r)
        if gap:
            short.setdefault(gap, []).append(k)
    times = {1: "once", 2: "twice"}
    return (
        "; ".join(
            f"rank{'s' if len(ks) > 1 else ''} {', '.join(map(str, ks))} missing {times.get(g, f'{g} times')}"
            for g, ks in sorted(short.items())
        )
        or "no rank missing"
    )


def _covers(blocks: list[frozenset[int]], whole: frozenset[int]) -> list[list[list[int]]] | None:
    """Up to two partitions of ``blocks`` (each machine's ranks) into groups whose ranks are
    ``whole`` once each, as lists of block indices in order (none, one: the only one, two: there is
    more than one), or None when telling would take more than :data:`COVER_STEPS` steps. Each
    partition is enumerated once: a new group starts with the first block left, and grows by a
    block holding its lowest missing rank.
    """
    found: list[list[list[int]]] = []
    steps = 0

    def grow(left: list[int], job: list[int], have: frozenset[int], done: list[list[int]]) -> bool:
        nonlocal steps
        steps += 1
        if steps > COVER_STEPS:
            return False
        if have == whole:
            if not left:
                found.append([*done, job])
                return len(found) < 2
            return grow(left[1:], [left[0]], blocks[left[0]], [*done, job])
        need = min(whole - have)
        for i in left:
            if need in blocks[i] and not blocks[i] & have and blocks[i] <= whole:
                if not grow([j for j in left if j != i], [*job, i], have | blocks[i], done):
                    return False
        return True

    if not blocks or not blocks[0] <= whole:
        return []
    done = grow(list(range(1, len(blocks))), [0], blocks[0], [])
    return found if done or len(found) > 1 else None


def _suffix(origin: Path, name: str, depth: int) -> str:
    """``name`` under the last ``depth`` folders above ``origin``'s own (``a/test`` for depth 1)."""
    above = origin.parent.parts[-depth:] if depth else ()
    return "/".join((*above, name))


def _apart(parts: list[Part], notes: list[str]) -> list[Part]:
    """Rule 3 of the module doc on would-be runs of one name."""
    if len(parts) < 2 or not conflict([pt for p in parts for pt in p.traces]):
        return [Part(parts[0].name, parts[0].origin, [pt for p in parts for pt in p.traces])]
    depth = 1
    while len({_suffix(p.origin, p.name, depth) for p in parts}) < len(parts) and depth < 64:
        depth += 1
    out = [Part(_suffix(p.origin, p.name, depth), p.origin, p.traces) for p in parts]
    why = conflict([pt for p in parts for pt in p.traces])
    notes.append(
        f"{len(parts)} inputs would be run {parts[0].name!r} but cannot be one job ({why}): runs "
        + ", ".join(repr(p.name) for p in out)
    )
    return out


def assign(parts: list[Part], store: Store | None = None) -> tuple[dict[str, list[ParsedTrace]], list[str]]:
    """Run name -> traces for the would-be runs of an ingest (one per folder or lone file, named by
    rule 1), after rules 0, 2 and 3 (and 4 with ``store``); and the notes saying what was split or
    renamed.

    Rule 4: a run of the name already in ``store`` whose files lie elsewhere and hold the same
    ranks, or another world size, is another job's: the new one is named by its path
    (``b/test``) as in rule 3. A name that would still clash (the same path named twice) is left
    as it is, for ingest's checks to refuse with their message.
    """
    notes: list[str] = []
    split: list[Part] = []
    for p in [q for part in parts for q in _related(part, notes)]:
        why = conflict(p.traces)
        split += _split(p, why, notes) if why and p.origin.is_dir() else [p]
    by_name: dict[str, list[Part]] = {}
    for p in split:
        by_name.setdefault(p.name, []).append(p)
    merged = [p for same in by_name.values() for p in _apart(same, notes)]
    if store is not None:
        taken = {p.name for p in merged}
        merged = [_beside_stored(store, p, taken, notes) for p in merged]
    out: dict[str, list[ParsedTrace]] = {}
    for p in merged:
        out.setdefault(p.name, []).extend(p.traces)
    return out, notes


def _beside_stored(store: Store, part: Part, taken: set[str], notes: list[str]) -> Part:
    """Rule 4 of :func:`assign` for one would-be run."""
    held = store.con.execute(
        "SELECT t.rank, t.source, t.world_size, t.path FROM traces t JOIN runs r USING (run_id) WHERE r.name = ?",
        [part.name],
    ).fetchall()
    if not held:
        return part
    home = part.origin if part.origin.is_dir() else None
    if home is not None and any(Path(path).is_relative_to(home) for *_, path in held):
        return part  # more files of the same folder: the run's own checks decide
    ranks = {(r, src): path for r, src, _, path in held if r is not None}
    worlds = {w for _, _, w, _ in held if w is not None}
    clash = next(
        (
            f"rank {pt.rank} is in {ranks[(pt.rank, pt.source)]}"
            for pt in part.traces
            if (pt.rank, pt.source) in ranks and ranks[(pt.rank, pt.source)] != pt.path
        ),
        "",
    ) or next(
        (
            f"world size {pt.world_size}, the run's {min(worlds)}"
            for pt in part.traces
            if worlds and pt.world_size is not None and pt.world_size not in worlds
        ),
        "",
    )
    if not clash:
        return part
    stored = {str(n) for (n,) in store.con.execute("SELECT name FROM runs").fetchall()}
    depth = 1
    while depth < 64 and (_suffix(part.origin, part.name, depth) in stored | taken):
        depth += 1
    name = _suffix(part.origin, part.name, depth)
    notes.append(f"run {part.name!r} in the store is another job ({clash}): these files are run {name!r}")
    taken.add(name)
    return Part(name, part.origin, part.traces)
