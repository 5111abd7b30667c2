"""desync: which ranks fell out of step, the first thing to read after a hang (like PyTorch's fr_trace).

Works on any collectives that carry a process group and a sequence number: Flight Recorder dumps
(preferred when present), NCCL profiler-plugin dumps, Kineto traces with ``Seq``. Not on NCCL
Inspector records: the Inspector writes completed collectives only, and a sample of them (the
latest of each communicator per dump interval), so what a rank lacks there says nothing of a hang.

Algorithm:
  1. A process group is its name *and* its member ranks (``traces.meta.groups``, from FR
     ``pg_config``; else the ranks that hold rows of the name): two groups called "0" with
     different members are different groups. Point-to-point rows (``pg`` ending in ``:p2p``, or a
     group of sends and recvs only) have their own sequence numbers and are checked for presence only.
  2. Each member's window of sequence numbers: from the first one it still holds (a wrapped ring
     buffer has dropped the oldest) to the last it enqueued (``traces.meta.progress`` from FR
     ``pg_status``, else its last row). Sequence numbers before the latest first-held one (the
     common range) are not compared, and never reported missing.
  3. For each sequence number in the common range that some member holds (or its progress names
     as last enqueued; numbering may be sparse, e.g. NDTimeline, so a number nobody holds is no
     collective) and each member: enqueued (a row, or the
     group's progress says so), started (a start time, or progress), completed (an end time, or
     progress); never enqueued (beyond its last, or a hole: no row for it although the member
     holds rows before and after it, e.g. a rank that skipped a collective). Among the members holding a row: the op, the
     input element count and the dtype must agree (collectives only). A coalesced group (several
     rows of one rank at one seq: torch 2.7+ records each member and the group's end entry) is
     compared member by member, in enqueue order, once it has as many entries on every rank (else
     that count is the mismatch);
     it started / completed when any of its rows did (the members of a batched send / recv stay
     ``scheduled``: only the group's end entry records times).
  4. Status per (group, seq): ``ok``; ``mismatch`` (op / size / dtype differ); ``missing`` (some
     member never enqueued it); ``not_completed`` (enqueued by all, completed by some only, or by
     none while later ones completed); ``in_flight``: the group's last seq, enqueued by all and
     completed by some, while every earlier seq completed on every member that has records (a
     member with no dump, ``ranks_unknown``, says nothing either way): a healthy run whose
     ranks wrote their dumps moments apart (one rank's copy finished, the others' were finishing),
     not a divergence (a note says so; a hang leaves earlier seqs or members behind). ``unknown``
     completion (no source timing, e.g. a gloo dump without pg_status) is not an error.
  5. Verdict: the first divergent collective (earliest enqueue, then group and seq) and the ranks
     behind: those that never enqueued it, the minority of a mismatch, or those that did not
     complete it while others did. A rank whose dump holds no collective at all (an empty FR
     ``entries``, or none: ``traces.meta.recorded_nothing``) is missing from every seq and leads
     the verdict (``recorded_nothing``): it is behind everyone; the first divergence among the
     others follows. A dump without entries whose ``pg_status`` shows progress (a dump of active
     entries only) takes part through that progress alone (``progress_by_pg_id``, matched to the
     groups by the ``pg_id`` the other ranks' entries carry).
  6. Records rejected at ingest (``traces.rejected``: ``--skip-bad-events``, e.g. a negative time or
     a sequence number beyond int64): a member whose trace lost some holds no row for them, so a
     hole in its rows (or, without progress, a seq beyond its last row) is ``unknown`` there, not
     never enqueued: its seq's status is ``unknown`` (no other divergence), listed in
     ``ranks_unknown``, and the verdict is ``inconclusive`` unless a divergence of the records kept
     comes first.
  7. Without sequence numbers (gloo, Kineto traces without ``Seq``): the collectives a traced rank
     dropped inside its traced window while its peers ran them (:mod:`traceprof.engine.dropped`,
     from the matched instances' ``ranks_missing``) are each ``missing`` on that rank, and the
     verdict names those ranks, the instances, op and bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceprof.core import columns as rc
from traceprof.core.errors import AnalysisError
from traceprof.core.vocab import CollectiveSource, TraceSource
from traceprof.engine.analysis import (
    Analysis,
    Finding,
    FindingsInput,
    FrameResult,
    Report,
    RunParams,
    Topic,
    Verdict,
    register,
)
from traceprof.engine.dropped import dropped, dropped_text
from traceprof.storage.runs import rank_list, run_name, untraced_ranks
from traceprof.storage.store import Store

# The traces' meta is read once per trace (MATERIALIZED): extracted on every collective's row, its
# JSON (the process groups of every rank) was parsed ranks x collectives times, 3.4 s of 9.7 at 1,024 ranks.
_ROWS = """
WITH t AS MATERIALIZED (
    SELECT trace_id, json_extract(meta, '$.groups') AS groups, json_extract(meta, '$.progress') AS progress,
           json_extract(meta, '$.pg_ids') AS pg_ids
    FROM traces WHERE run_id = $1)
SELECT c.rank, c.source, c.pg, c.seq, c.op, c.dtype, c.nelems_in, c.enter_ns, c.start_ns, c.end_ns,
       t.groups, t.progress, t.pg_ids
FROM collectives c JOIN t USING (trace_id)
WHERE c.run_id = $1 AND c.pg IS NOT NULL AND c.seq IS NOT NULL AND c.source <> 'nccl_inspector'
ORDER BY c.rank, c.pg, c.seq, c.enter_ns, c.ordinal
"""
_P2P_OPS = frozenset({"send", "recv"})
_SOURCE_ORDER = (CollectiveSource.fr, CollectiveSource.nccl_profiler)
_TRACE_SOURCE: dict[str, str] = {
    CollectiveSource.fr: TraceSource.flight_recorder,
    CollectiveSource.nccl_profiler: TraceSource.nccl_profiler,
}
# Traces of a source that hold no collective with group and seq: an empty FR dump (a rank that
# recorded nothing, the usual culprit of a hang, unless its pg_status shows progress).
_EMPTY = """
SELECT t.rank, t.path, json_extract(t.meta, '$.recorded_nothing') AS nothing,
       json_extract(t.meta, '$.progress_by_pg_id') AS progress FROM traces t
WHERE t.run_id = ? AND t.source = ? AND t.rank IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM collectives c WHERE c.trace_id = t.trace_id AND c.pg IS NOT NULL AND c.seq IS NOT NULL)
ORDER BY t.rank
"""


@dataclass(frozen=True)
class Params(RunParams):
    """``all``: list every (group, seq) in ``frame``, not only the divergent ones."""

    all: bool = False


@dataclass(frozen=True)
class Result(FrameResult):
    """Per (group, seq) (``frame``), the verdict (``verdict``) and per (group, rank) (``ranks``);
    their columns are declared in :data:`SPEC`."""

    verdict: pl.DataFrame = field(default_factory=pl.DataFrame)
    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "Collective desync (hang triage)"


@dataclass
class _Rank:
    """One member's rows of a group (seq -> row) and its progress. ``first``, ``hi`` and ``last``
    are computed once (the rows are complete before the first call): :func:`_check` asks them
    for every seq, which must not scan every row each time (that was quadratic in the seqs)."""

    rows: dict[int, dict[str, Any]]
    progress: dict[str, int | None]
    members: dict[int, list[dict[str, Any]]] = field(
        default_factory=dict
    )  # seq -> its rows (coalesced: several)
    _memo: dict[str, int | None] = field(default_factory=dict)

    def first(self) -> int | None:
        if "first" not in self._memo:
            self._memo["first"] = min(self.rows) if self.rows else None
        return self._memo["first"]

    def hi(self) -> int | None:
        """The highest seq it holds a row of."""
        if "hi" not in self._memo:
            self._memo["hi"] = max(self.rows) if self.rows else None
        return self._memo["hi"]

    def last(self, key: str) -> int | None:
        """Last seq ``key`` (enqueued / started / completed): progress, else the rows' times."""
        if key not in self._memo:
            self._memo[key] = self._last(key)
        return self._memo[key]

    def _last(self, key: str) -> int | None:
        p = self.progress.get(key)
        col = {"enqueued": "enter_ns", "started": "start_ns", "completed": "end_ns"}[key]
        seen = [s for s, r in self.rows.items() if r[col] is not None or key == "enqueued"]
        best = max(seen) if seen else None
        if p is not None and p >= 0:
            return max(p, best) if best is not None else p
        if key == "started":
            done = self.last("completed")
            return (
                max(x for x in (best, done) if x is not None)
                if best is not None or done is not None
                else None
            )
        if p == -1 and key == "enqueued":
            return best
        return best if best is not None or key == "enqueued" or self._timed(col) else None

    def _timed(self, col: str) -> bool:
        return any(r[col] is not None for r in self.rows.values())


def _load(
    store: Store, run_id: int, run_name: str
) -> tuple[pl.DataFrame, str, dict[int, str], dict[int, Any]]:
    """Rows of the preferred source, the source, and its traces that hold none: rank -> file name
    of those that recorded nothing, rank -> ``progress_by_pg_id`` of those whose progress says
    otherwise (module doc, step 5)."""
    df = store.sql(_ROWS, [run_id])
    if df.is_empty():
        nothing, progress = _empty_traces(store.sql(_EMPTY, [run_id, "flight_recorder"]).rows())
        if nothing:
            return df, "fr", nothing, progress
        if progress:  # no entries anywhere, only pg_status: nothing to compare seq by seq
            said = "; ".join(
                f"rank {r}: "
                + ", ".join(
                    f"pg_id {pg} enqueued {st.get('enqueued')} completed {st.get('completed')}"
                    for pg, st in sorted(p.items())
                )
                for r, p in sorted(progress.items())
            )
            raise AnalysisError(
                f"run {run_name!r}: its Flight Recorder dumps hold no entries, only progress ({said}); "
                "desync compares entries: dump them all (not only the active ones)"
            )
        raise AnalysisError(
            f"run {run_name!r}: no collectives with a process group and sequence number (desync "
            "needs Flight Recorder dumps, NCCL profiler-plugin dumps or Kineto traces with Seq; NCCL "
            "Inspector records hold completed collectives only)"
        )
    present = df["source"].unique().to_list()
    source = (
        next((str(s) for s in _SOURCE_ORDER if s in present), None)
        or df.group_by("source").len().sort(["len", "source"], descending=[True, False])["source"][0]
    )
    empty = store.sql(_EMPTY, [run_id, _TRACE_SOURCE[source]]).rows() if source in _TRACE_SOURCE else []
    return (df.filter(pl.col("source") == source), source, *_empty_traces(empty))


def _rejected(store: Store, run_id: int, source: str) -> dict[int, str]:
    """Rank -> what ingest rejected of its traces of ``source`` (``traces.rejected``: reason ->
    count, e.g. ``1 negative 'time_created_ns'``); ranks that lost nothing are absent (module doc,
    step 6). A source that is no trace source of its own (Kineto's ``Seq``) reads every trace."""
    where = " AND source = ?" if source in _TRACE_SOURCE else ""
    args: list[Any] = [run_id, _TRACE_SOURCE[source]] if where else [run_id]
    out: dict[int, dict[str, int]] = {}
    for rank, text in store.sql(
        "SELECT rank, rejected FROM traces WHERE run_id = ? AND rank IS NOT NULL AND events_rejected > 0"
        + where,
        args,
    ).rows():
        parsed = orjson.loads(text) if text else {}
        got = out.setdefault(int(rank), {})
        for reason, n in parsed.items() if isinstance(parsed, dict) else ():
            got[reason] = got.get(reason, 0) + int(n)
    return {r: ", ".join(f"{n} {k}" for k, n in got.items()) or "records" for r, got in out.items()}


def _empty_traces(rows: list[tuple[Any, ...]]) -> tuple[dict[int, str], dict[int, Any]]:
    """Split traces without rows into those that recorded nothing (rank -> file name; stores
    written before ``recorded_nothing`` existed count here) and those with progress (rank ->
    progress by pg_id)."""
    nothing: dict[int, str] = {}
    progress: dict[int, Any] = {}
    for rank, path, flag, prog in rows:
        if flag is not None and not orjson.loads(flag) and prog:
            progress[rank] = orjson.loads(prog)
        else:
            nothing[rank] = Path(path).name
    return nothing, progress


def _groups(df: pl.DataFrame) -> dict[tuple[str, tuple[int, ...]], dict[int, _Rank]]:
    """(pg, members) -> member rank -> its rows and progress (module doc, step 1)."""
    by_name_ranks: dict[str, set[int]] = {}
    declared: dict[tuple[int, str], tuple[int, ...] | None] = {}
    ranks: dict[tuple[int, str], _Rank] = {}
    for r in df.iter_rows(named=True):
        key = (r["rank"], r["pg"])
        by_name_ranks.setdefault(r["pg"], set()).add(r["rank"])
        if key not in ranks:
            groups = orjson.loads(r["groups"]) if r["groups"] else {}
            progress = orjson.loads(r["progress"]) if r["progress"] else {}
            m = groups.get(r["pg"]) if isinstance(groups, dict) else None
            declared[key] = tuple(sorted(m)) if isinstance(m, list) else None
            ranks[key] = _Rank({}, progress.get(r["pg"], {}) if isinstance(progress, dict) else {})
        ranks[key].members.setdefault(r["seq"], []).append(r)
    for st in ranks.values():
        st.rows = {seq: _merged(rows) for seq, rows in st.members.items()}
    out: dict[tuple[str, tuple[int, ...]], dict[int, _Rank]] = {}
    for (rank, pg), st in ranks.items():
        members = declared[(rank, pg)] or tuple(sorted(by_name_ranks[pg]))
        if rank not in members:
            members = tuple(sorted({*members, rank}))
        out.setdefault((pg, members), {})[rank] = st
    return out


def _merged(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for a rank's rows at one seq: the first's fields, started / completed when any row
    is (module doc, step 3)."""
    if len(rows) == 1:
        return rows[0]
    starts = [r["start_ns"] for r in rows if r["start_ns"] is not None]
    ends = [r["end_ns"] for r in rows if r["end_ns"] is not None]
    return {**rows[0], "start_ns": min(starts) if starts else None, "end_ns": max(ends) if ends else None}


def _with_progress(
    groups: dict[tuple[str, tuple[int, ...]], dict[int, _Rank]], df: pl.DataFrame, progress: dict[int, Any]
) -> None:
    """Add the ranks known by progress alone (module doc, step 5) to the groups they are members of."""
    pg_ids: dict[str, str] = {}
    for text in df["pg_ids"].unique().drop_nulls().to_list() if progress and "pg_ids" in df.columns else []:
        ids = orjson.loads(text)
        pg_ids.update(ids if isinstance(ids, dict) else {})
    for (pg, members), ranks in groups.items():
        for rank, prog in progress.items():
            st = prog.get(pg_ids.get(pg, ""))
            if rank in members and rank not in ranks and isinstance(st, dict):
                ranks[rank] = _Rank({}, st)


def _seqs(rowed: set[int], lasts: dict[int, int | None], start: int | None, end: int | None) -> list[int]:
    """The seqs of the common range (module doc, step 2) to compare, ascending: those some member
    holds a row of (``rowed``), and those a member's progress names as its last enqueued. Never every number
    from ``start`` to ``end``: NDTimeline numbers sparsely (a gap is no collective, not a missing
    one), and walking the span was a billion steps there. A seq beyond every row that progress
    does not name is not compared (FR keeps the newest entries, so its progress names no such seq)."""
    if start is None or end is None:
        return []
    present = rowed | {v for v in lasts.values() if v is not None}
    return sorted(s for s in present if start <= s <= end)


def _agree(rows: dict[int, dict[str, Any]], col: str) -> tuple[Any, str, bool]:
    """Majority value of ``col`` over the ranks' rows, a text naming the dissenting ranks, and
    whether the top values tie (then no rank is the odd one: the text names them all and the
    value is the lowest rank's)."""
    votes = Counter(r[col] for r in rows.values())
    if len(votes) <= 1:
        return next(iter(votes), None), "", False
    what = col.replace("nelems_in", "size")
    (major, n1), (_, n2) = votes.most_common(2)
    if n1 == n2:
        ranks = sorted(rows)
        who = ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
        each = ", ".join(f"rank {k} {r[col]}" for k, r in sorted(rows.items()))
        return rows[ranks[0]][col], f"ranks {who} disagree on {what} with no majority ({each})", True
    odd = ", ".join(f"rank {k} {r[col]}" for k, r in sorted(rows.items()) if r[col] != major)
    return major, f"{what} {major} on most ranks, {odd}", False


def _check(
    pg: str,
    members: tuple[int, ...],
    ranks: dict[int, _Rank],
    empty: dict[int, str],
    rejected: dict[int, str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Instance rows and per-rank rows of one group (module doc, steps 2 to 6); members in
    ``empty`` (a dump with no collective) never enqueued anything; a member in ``rejected``
    (:func:`_rejected`) lacking a seq may have lost its record at ingest: unknown there."""
    # Point-to-point: FR's ":p2p" groups, or a group of sends and recvs only (NDTimeline's
    # "pp0:0->1:fwd"): a send and its recv share a seq and differ in op by design.
    p2p = pg.endswith(":p2p") or all(r["op"] in _P2P_OPS for st in ranks.values() for r in st.rows.values())
    firsts = {r: f for r, st in ranks.items() if (f := st.first()) is not None}
    lasts = {r: st.last("enqueued") for r, st in ranks.items()}
    start = max(firsts.values()) if firsts else None
    end = max((v for v in lasts.values() if v is not None), default=None)
    rowed = {s for st in ranks.values() for s in st.rows}  # the seqs some member has a row of
    seqs = _seqs(rowed, lasts, start, end)
    # Dense numbering (FR, NCCL: 1, 2, 3, ...) tells a wrapped ring buffer by a first seq above 1;
    # sparse numbering (NDTimeline: 23000000, 47000000, ...) only by a first seq above the others'.
    dense = not rowed or max(rowed) - min(rowed) + 1 == len(rowed)
    floor = 1 if dense or not firsts else min(firsts.values())
    rank_rows = [
        {
            "pg": pg,
            "members": list(members),
            "rank": m,
            "first_seq": firsts.get(m),
            "last_enqueued": lasts.get(m),
            "last_started": ranks[m].last("started") if m in ranks else None,
            "last_completed": ranks[m].last("completed") if m in ranks else None,
            "wrapped": bool(firsts.get(m) is not None and start is not None and firsts[m] > floor),
        }
        for m in members
    ]
    out = []
    for seq in seqs:
        held = {m: ranks[m].rows[seq] for m in members if m in ranks and seq in ranks[m].rows}
        enq, sta, com, miss, unk, lost = [], [], [], [], [], []
        for m in members:
            st = ranks.get(m)
            last = lasts.get(m) if st is not None else None
            if m in empty:
                miss.append(m)
                continue
            if st is None or last is None:
                unk.append(m)
                continue
            hole = not p2p and seq not in st.rows and st.rows and st.first() <= seq < st.hi()  # type: ignore[operator]
            if seq > last or hole:
                # progress (pg_status) says how far it enqueued whatever was rejected; rows alone do not
                told = isinstance(p := st.progress.get("enqueued"), int) and p >= 0
                if m in rejected and seq not in st.rows and (hole or not told):
                    unk.append(m)  # its record may be one ingest rejected (module doc, step 6)
                    lost.append(m)
                    continue
                miss.append(m)  # beyond its last, or a hole: later ones held, this one never enqueued
                continue
            enq.append(m)
            row = held.get(m)
            ls, lc = st.last("started"), st.last("completed")
            if (row is not None and row["start_ns"] is not None) or (ls is not None and ls >= seq):
                sta.append(m)
            if (row is not None and row["end_ns"] is not None) or (lc is not None and lc >= seq):
                com.append(m)
        op = _agree(held, "op")[0]
        texts, tie, odd = ([], False, []) if p2p else _compare({m: ranks[m].members[seq] for m in held})
        known_done = [m for m in enq if ranks[m].last("completed") is not None]
        later_done = any((ranks[m].last("completed") or -1) > seq for m in enq)
        if texts:
            status = "mismatch"
        elif miss:
            status = "missing"
        elif known_done and len(com) < len(known_done) and (com or later_done):
            status = "not_completed"
        elif lost:
            status = "unknown"
        else:
            status = "ok"
        enters = [r["enter_ns"] for r in held.values() if r["enter_ns"] is not None]
        out.append(
            {
                "pg": pg,
                "members": list(members),
                "seq": seq,
                "op": op,
                "status": status,
                "ranks_enqueued": enq,
                "ranks_started": sta,
                "ranks_completed": com,
                "ranks_missing": miss,
                "ranks_unknown": unk,
                "mismatch": "; ".join(texts) or None,
                "first_enter_ns": min(enters) if enters else None,
                "_behind": _behind(status, odd, miss, known_done, com),
                "_tie": tie,
                "_holes": [m for m in miss if m in ranks and ranks[m].rows and ranks[m].hi() > seq],  # type: ignore[operator]
                "_lost": lost,
            }
        )
    _trailing_in_flight(out, members)
    return out, rank_rows


def _trailing_in_flight(out: list[dict[str, Any]], members: tuple[int, ...]) -> None:
    """Module doc, step 4: the group's last seq, not completed on some members while every earlier
    seq completed on every member, is ``in_flight`` (dumps taken moments apart), not a divergence."""
    if not out or out[-1]["status"] != "not_completed":
        return
    # every member with a record: a member without any (no dump of this run, ``ranks_unknown``)
    # can tell nothing, so the same in-flight state reads the same with or without its files
    if all(
        r["status"] == "ok" and set(r["ranks_completed"]) == set(members) - set(r["ranks_unknown"])
        for r in out[:-1]
    ):
        out[-1].update(status="in_flight", _behind=[])


def _compare(members: dict[int, list[dict[str, Any]]]) -> tuple[list[str], bool, list[int]]:
    """Op, size and dtype of the ranks' rows at one seq (module doc, step 3): the mismatch texts,
    whether a mismatch has no majority (a tie), and the ranks behind it (all sides of a tie)."""
    texts: list[str] = []
    tie = False
    bad: set[int] = set()

    def vote(held: dict[int, dict[str, Any]], col: str, prefix: str = "") -> None:
        nonlocal tie
        major, text, t = _agree(held, col)
        if text:
            texts.append(prefix + text)
            tie = tie or t
            bad.update(held if t else (k for k, r in held.items() if r[col] != major))

    counts = {r: len(rows) for r, rows in members.items()}
    coalesced = max(counts.values(), default=0) > 1
    if len(set(counts.values())) > 1:  # members cannot be paired up: the count is the mismatch
        vote({r: {"entries": n} for r, n in counts.items()}, "entries", "coalesced group: ")
        return texts, tie, sorted(bad)
    for k in range(max(counts.values(), default=0)):
        held = {r: rows[k] for r, rows in members.items() if k < len(rows)}
        for col in ("op", "nelems_in", "dtype"):
            vote(held, col, f"member {k + 1} of the coalesced group: " if coalesced else "")
    return texts, tie, sorted(bad)


def _behind(status: str, odd: list[int], miss: list[int], known: list[int], com: list[int]) -> list[int]:
    if status == "missing":
        return miss
    if status == "mismatch":
        return odd
    if status == "not_completed":
        return [m for m in known if m not in com]
    return []


def _verdict_text(first: dict[str, Any] | None, checked: int, groups: int, notes: list[str]) -> str:
    if first is None:
        return f"no desync: {checked} collective(s) in {groups} group(s) agree on every member" + (
            f" ({'; '.join(notes)})" if notes else ""
        )
    where = f"group {first['pg']!r} {first['members']} seq {first['seq']} ({first['op']})"
    behind = ", ".join(map(str, first["_behind"])) or "none"
    if first["status"] == "missing":
        holes = first["_holes"]
        later = f" (rank(s) {', '.join(map(str, holes))} did enqueue later ones)" if holes else ""
        return (
            f"first divergence at {where}: rank(s) {behind} never enqueued it{later}; rank(s) "
            f"{', '.join(map(str, first['ranks_enqueued']))} did and wait for them"
        )
    if first["status"] == "mismatch":
        if first["_tie"]:  # a tie is a tie: no rank is the odd one
            return f"first divergence at {where}: {first['mismatch']}"
        return f"first divergence at {where}: {first['mismatch']} (ranks behind the mismatch: {behind})"
    return (
        f"first divergence at {where}: completed by rank(s) {', '.join(map(str, first['ranks_completed'])) or 'none'}"
        f" but not by {behind}"
    )


def _lost_text(lost: list[dict[str, Any]], rejected: dict[int, str]) -> str:
    """The seqs that are ``unknown`` because records were rejected at ingest (module doc, step 6),
    in words: the first three, and what each rank lost."""
    seqs = "; ".join(
        f"group {r['pg']!r} seq {r['seq']} ({r['op']}) on rank(s) {', '.join(map(str, r['_lost']))}"
        for r in lost[:3]
    ) + (f" and {len(lost) - 3} more" if len(lost) > 3 else "")
    ranks = sorted({m for r in lost for m in r["_lost"]})
    why = "; ".join(f"rank {m}: {rejected[m]}" for m in ranks)
    return (
        f"unknown (record rejected at ingest): {seqs}; those ranks hold no record of them because "
        f"ingest rejected some of theirs ({why}), so whether they enqueued them is unknown"
    )


def _in_flight_note(r: dict[str, Any]) -> str:
    """What an ``in_flight`` seq is and why it is no divergence."""
    done = set(r["ranks_completed"])
    running = [m for m in r["ranks_enqueued"] if m not in done]
    return (
        f"group {r['pg']!r} {r['members']} seq {r['seq']} ({r['op']}), the last one: still in flight on rank(s) "
        f"{', '.join(map(str, running))}, completed on {', '.join(map(str, sorted(done)))}, every earlier seq "
        "completed on every member with records: the dumps were taken moments apart, not a divergence"
    )


def _nothing_text(empty: dict[int, str], per_rank: list[dict[str, Any]]) -> str:
    who = ", ".join(f"{r} ({name})" for r, name in sorted(empty.items()))
    others = [
        r["last_enqueued"] for r in per_rank if r["rank"] not in empty and r["last_enqueued"] is not None
    ]
    if not others:
        return (
            f"rank(s) {who} recorded nothing: no collective ran before the dumps were written (or the "
            "ring buffer was off: TORCH_NCCL_TRACE_BUFFER_SIZE=0)"
        )
    return (
        f"rank(s) {who} recorded nothing while the others enqueued up to seq {max(others)}: a rank that hung "
        "or crashed before its first collective (or ran with TORCH_NCCL_TRACE_BUFFER_SIZE=0) is the one to "
        "look at"
    )


def _unknown_text(store: Store, run_id: int, per_rank: list[dict[str, Any]]) -> str:
    """Why a run with no divergence is ``inconclusive``, not clean: members with no records (no
    dump, or nothing of the group in it: ``first_seq`` and ``last_enqueued`` null) or ranks of the
    job that no trace holds (:func:`traceprof.storage.runs.untraced_ranks`) may be the ones behind,
    so that is no evidence of a healthy group; empty when every rank left records."""
    untraced, _ = untraced_ranks(store, run_id)
    silent = {r["rank"] for r in per_rank if r["first_seq"] is None and r["last_enqueued"] is None}
    unknown = sorted(silent | set(untraced))
    if not unknown:
        return ""
    return (
        f"no divergence among the ranks with records, but rank(s) {rank_list(unknown)} left none "
        "(not traced, or no dump): whether they fell behind is unknown"
    )


def _desync_topic(inp: FindingsInput) -> tuple[list[Finding], Verdict | None]:
    """The desync topic: its verdict (a hang: ranks out of step, or one that recorded nothing); no cost."""
    d = inp.results.get("desync")
    verdict = getattr(d, "verdict", None)
    if verdict is None or verdict.is_empty():
        return [], None
    v = verdict.row(0, named=True)
    if v["status"] in ("clean", "inconclusive"):  # the analysis decided it (:func:`_unknown_text`)
        return [], Verdict("desync", "ok" if v["status"] == "clean" else "inconclusive", v["text"])
    found = Finding(
        "desync",
        v["text"],
        None,
        True,
        "desync",
        ranks=tuple(int(r) for r in v.get("behind") or ()),
        metric="seq" if v.get("seq") is not None else "",
        value=float(v["seq"]) if v.get("seq") is not None else None,
        cause=str(v["status"]),
        evidence="desync:verdict",
    )
    return [found], Verdict("desync", "problem", v["text"])


def _recorded(store: Store, run_id: int) -> bool:
    """Whether the run holds what desync reads: Flight Recorder or NCCL-plugin dumps, or a traced
    rank that dropped a matched collective inside its window (:func:`traceprof.engine.dropped.dropped`)."""
    return (
        bool(
            store.sql(
                "SELECT count(*) FROM traces WHERE run_id = ? AND source IN "
                + TraceSource.sql(*_TRACE_SOURCE.values()),
                [run_id],
            ).item()
        )
        or not dropped(store, run_id).is_empty()
    )


_GROUP = (rc.text("pg", "Process group"), rc.ranks_list("members", "Ranks of the group"))

SPEC = Analysis(
    name="desync",
    reads_activity=False,  # queries the store's views only
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Per (group, seq): the divergent ones only, unless all=true",
            *_GROUP,
            rc.count("seq", "Sequence number in the group"),
            rc.text("op", "Op (the majority's)"),
            rc.text(
                "status", "What the ranks disagree on (or ok; unknown: a member's record rejected at ingest)"
            ),
            rc.ranks_list("ranks_enqueued", "Ranks that enqueued it"),
            rc.ranks_list("ranks_started", "Ranks that started it"),
            rc.ranks_list("ranks_completed", "Ranks that completed it"),
            rc.ranks_list("ranks_missing", "Ranks that never enqueued it"),
            rc.ranks_list(
                "ranks_unknown",
                "Ranks with no row and no progress, or whose record ingest rejected: completion or details unknown",
            ),
            rc.text("mismatch", "What differs between the ranks' copies (op, size, dtype), in words"),
            rc.ns("first_enter_ns", "First enqueue"),
        ),
        rc.frame(
            "verdict",
            "One row: the verdict",
            rc.text(
                "status",
                "clean, inconclusive (no divergence, but members with no records, records rejected at "
                "ingest or ranks of the job not traced), recorded_nothing, or the first divergent status",
            ),
            rc.text("source", "Collectives source read"),
            *_GROUP,
            rc.count("seq", "Sequence number of the first divergence"),
            rc.text("op", "Its op"),
            rc.ranks_list("behind", "The ranks behind"),
            rc.text("text", "The verdict in words"),
        ),
        rc.frame(
            "ranks",
            "Per (group, rank)",
            *_GROUP,
            rc.count("rank", "Global rank"),
            rc.count("first_seq", "First sequence number held"),
            rc.count("last_enqueued", "Last sequence number enqueued (-1 none, null unknown)"),
            rc.count("last_started", "Last started (-1 none, null unknown)"),
            rc.count("last_completed", "Last completed (-1 none, null unknown)"),
            rc.flag("wrapped", "The ring buffer dropped older entries of the group"),
        ),
    ),
    report=Report(
        110,
        "collectives with process group and sequence number (Flight Recorder or NCCL-plugin dumps), "
        "or a rank that dropped a matched collective inside its traced window",
        when=_recorded,
    ),
    findings=Topic("desync", 50, _desync_topic),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """Desync report of one run (module doc).

    Raises:
        StoreError: No such run.
        AnalysisError: The run has no collectives with process group and sequence number.
    """
    run_id = store.resolve_run(params.run)
    name = run_name(store, run_id)
    try:
        df, source, empty, progress = _load(store, run_id, name)
    except AnalysisError:  # no sequence numbers: the matched instances may still show a rank out of step
        gone = dropped(store, run_id)
        if gone.is_empty():
            raise
        return _dropped_result(gone)
    rejected = _rejected(store, run_id, source)
    inst: list[dict[str, Any]] = []
    per_rank: list[dict[str, Any]] = []
    notes: list[str] = []
    groups = _groups(df)
    _with_progress(groups, df, progress)
    for (pg, members), ranks in sorted(groups.items()):
        rows, rr = _check(pg, members, ranks, empty, rejected)
        inst += rows
        per_rank += rr
        firsts = [r["first_seq"] for r in rr if r["first_seq"] is not None]
        if firsts and max(firsts) > min(firsts):
            late = [r["rank"] for r in rr if r["first_seq"] == max(firsts)]
            notes.append(
                f"group {pg!r} {list(members)}: seq {min(firsts)}..{max(firsts) - 1} not compared (ring "
                f"buffer of rank(s) {', '.join(map(str, late))} starts at seq {max(firsts)})"
            )
        absent = [m for m in members if m not in ranks and m not in empty]
        if absent:
            notes.append(
                f"group {pg!r} {list(members)}: no record from rank(s) {', '.join(map(str, absent))} "
                "(no dump, or nothing of this group in it)"
            )
    bad = [r for r in inst if r["status"] not in ("ok", "in_flight")]
    lost = [r for r in bad if r["status"] == "unknown"]
    for r in inst:
        if r["status"] == "in_flight":
            notes.append(_in_flight_note(r))
    first = min(
        (r for r in bad if r["status"] != "unknown"),
        key=lambda r: (r["first_enter_ns"] is None, r["first_enter_ns"] or 0, r["pg"], r["seq"]),
        default=None,
    )
    text = _verdict_text(first, len(inst), len(groups), notes)
    row: dict[str, Any] = {
        "status": "clean" if first is None else first["status"],
        "source": source,
        "pg": None if first is None else first["pg"],
        "members": None if first is None else first["members"],
        "seq": None if first is None else first["seq"],
        "op": None if first is None else first["op"],
        "behind": [] if first is None else first["_behind"],
        "text": text,
    }
    if empty:  # leads: nothing recorded is further behind than any divergence
        rest = [
            r
            for r in bad
            if r["status"] != "unknown" and (r["status"] != "missing" or set(r["_behind"]) - set(empty))
        ]
        then = min(
            rest,
            key=lambda r: (r["first_enter_ns"] is None, r["first_enter_ns"] or 0, r["pg"], r["seq"]),
            default=None,
        )
        text = _nothing_text(empty, per_rank) + (
            "" if then is None else f"; among the others, {_verdict_text(then, 0, 0, [])}"
        )
        row.update(
            status="recorded_nothing",
            pg=None,
            members=None,
            seq=None,
            op=None,
            behind=sorted(empty),
            text=text,
        )
    if lost and row["status"] == "clean":  # no divergence among the records kept
        text = _lost_text(lost, rejected)
        row.update(status="inconclusive", text=text)
    elif lost:
        notes.append(_lost_text(lost, rejected))
    unknown = _unknown_text(store, run_id, per_rank) if row["status"] in ("clean", "inconclusive") else ""
    if unknown:  # the summary's desync verdict says the same: it reads this row
        text = f"{unknown}; {text}"
        row.update(status="inconclusive", text=text)
    verdict = pl.DataFrame([row], schema=_VERDICT_SCHEMA)
    shown = [{k: r[k] for k in _COLS} for r in (inst if params.all else bad)]
    frame = pl.DataFrame(shown, schema={c: _TYPES.get(c, pl.List(pl.Int64)) for c in _COLS})
    return Result(frame=frame, ranks=pl.DataFrame(per_rank), verdict=verdict, notes=(text, *notes))


def _dropped_result(gone: pl.DataFrame) -> Result:
    """The result from matched instances alone (no sequence numbers; module doc, step 7): each
    collective a traced rank dropped inside its traced window (:func:`traceprof.engine.dropped.dropped`)
    is ``missing`` on that rank; the verdict names every such rank."""
    text = "ranks out of step (matched collectives, no sequence numbers): " + dropped_text(gone)
    frame = pl.DataFrame(
        {
            "pg": gone["pg"],
            "members": [None] * gone.height,
            "seq": [None] * gone.height,
            "op": gone["op"],
            "status": ["missing"] * gone.height,
            **{c: [[]] * gone.height for c in ("ranks_enqueued", "ranks_started", "ranks_completed")},
            "ranks_missing": [[r] for r in gone["rank"].to_list()],
            "ranks_unknown": [[]] * gone.height,
            "mismatch": [None] * gone.height,
            "first_enter_ns": gone["first_arrival_ns"],
        },
        schema={c: _TYPES.get(c, pl.List(pl.Int64)) for c in _COLS},
    )
    first = gone.sort("first_arrival_ns").row(0, named=True)
    verdict = pl.DataFrame(
        [
            {
                "status": "missing",
                "source": first["source"],
                "pg": first["pg"],
                "members": None,
                "seq": None,
                "op": first["op"],
                "behind": sorted(set(gone["rank"].to_list())),
                "text": text,
            }
        ],
        schema=_VERDICT_SCHEMA,
    )
    return Result(frame=frame, ranks=pl.DataFrame(), verdict=verdict, notes=(text,))


_TYPES = {
    "pg": pl.Utf8,
    "seq": pl.Int64,
    "op": pl.Utf8,
    "status": pl.Utf8,
    "mismatch": pl.Utf8,
    "first_enter_ns": pl.Int64,
}
_VERDICT_SCHEMA: dict[str, Any] = {
    "status": pl.Utf8,
    "source": pl.Utf8,
    "pg": pl.Utf8,
    "members": pl.List(pl.Int64),
    "seq": pl.Int64,
    "op": pl.Utf8,
    "behind": pl.List(pl.Int64),
    "text": pl.Utf8,
}
_COLS = [
    "pg",
    "members",
    "seq",
    "op",
    "status",
    "ranks_enqueued",
    "ranks_started",
    "ranks_completed",
    "ranks_missing",
    "ranks_unknown",
    "mismatch",
    "first_enter_ns",
]
