"""Collective matching across ranks: which rows of ``collectives`` are the same collective.

README.md "What traceprof handles": Collective matching. Matching never mixes sources (a Kineto row is never matched
with a Flight Recorder row of another rank), and it is recomputed for the whole run whenever the
run gains traces.

A process group is identified by its name (or id) *and* its member ranks (``pg_ranks``): torchft
replica groups or ``split_group`` children can share one name with different members, and their
sequence numbers then collide. Within a group, c10d numbers collectives and point-to-point ops
with two separate counters (``seqCollective_``, ``seqP2P_``), so the op family is part of the key.

Algorithm:
  0. A row whose own trace does not say its group's members (``pg_ranks`` NULL: a Flight Recorder
     dump whose ``pg_config`` lacks the group) takes them from the run's other rows of the same
     source and group name when exactly one member set of that name known there holds its rank
     (stored: :data:`_FILL_RANKS`); otherwise it stays NULL.
  1. Rows with a ``comms_id`` (Kineto ``Comms Id``: a hash of pg name, seq, p2p flag and ranks)
     match on (source, comms_id): method ``comms_id`` (point-to-point rows of a group found wide
     in step 3 excepted).
  2. Other rows that know their process group and sequence number (Kineto ``Process Group Name``
     + ``Seq``, Flight Recorder ``collective_seq_id`` / ``p2p_seq_id``, NDTimeline groups) match on
     (source, pg, pg_ranks, family, seq), family = p2p or collective: method ``pg_seq``.
  3. Sequence numbers that cannot be per group are detected per (source, pg, pg_ranks, family):
     more than :data:`CROSS_STEP_SHARE` of its multi-rank keys hold rows of different steps (a key
     astride a step boundary, its rows in two adjacent steps, each the last of its rank's rows of
     the group in the earlier step or the first in the later one, is one collective launched just
     before a step marker on one rank and just after it on another: it counts as one step), or its
     ranks step their sequence numbers by different median strides (a counter shared with other
     groups; ranks with at least :data:`MIN_STRIDE_DIFFS` steps), or (point-to-point) more than
     that share of its keys are held by three or more ranks (a transfer has two ends; per-rank p2p
     counters of a group wider than a pair do not line up; its ``Comms Id`` hashes that counter, so
     the same holds of them). Such a group's collectives are matched
     by order within the step instead (step 4), method ``step_order``; its point-to-point rows
     that name their peer (``peer``: a send's destination, a recv's source) match as the k-th
     transfer from one rank to the other (by each rank's sequence numbers), method
     ``pair_order`` (a pipeline on the world group: rank 1's send to rank 2 is its p2p Seq 2,
     rank 2's recv its Seq 1) where both ranks hold as many transfers of that direction (or one of
     them none; else a transfer lost from one trace would shift every later pair, so the
     direction is left unmatched, with a note; equal counts can still hide a transfer lost at each
     end, so after clock alignment ``traceprof.ingest.pair_check`` leaves unmatched, with a note, a
     direction with a pair whose recv ends before its send starts or whose sizes differ), the
     others are left unmatched; a note (:attr:`MatchSummary.notes`, :func:`fallback_note`) says so.
     A group whose rows do not list its members (``pg_ranks`` NULL after step 0) and of which more
     ranks hold one collective sequence number than its rows' ``group_size`` is several groups sharing the
     name (torchft replica groups, ``split_group`` children in traces without "Process Group
     Ranks"): which ranks share a collective is unknown, so its rows are left unmatched (no
     instance, no clock alignment through them), with a note; matched by (pg, seq) they gave one
     instance of 4 ranks for two groups of 2 and shifted one group's clocks onto the other's.
     Steps are compared across ranks by the run's step (:data:`RUN_STEPS_SQL`: by number among
     ranks whose step ranges overlap unless the steps' start times (one host) or else its
     collectives (some steps differing by number) line a rank up by position, by order between
     numberings that do not), here and in
     steps 4 and 5; a note (:func:`step_shift_notes`) names a rank lined up off its numbers.
  4. Rows without ids (old Kineto traces, gloo annotations, DeepEP-like kernels without pg/seq)
     match by ordinal: on every rank, the k-th collective of the same group, op and size within the
     same step (or within the trace when steps are unknown) is the same instance: method
     ``ordinal`` (all-to-all ops leave the size out: their per-rank sizes legitimately differ; so do
     a group's ops of which some row's size is unknown, e.g. a gloo ``Input Dims`` holding a NaN).
     Where some rank of the group has no steps at all (no ProfilerStep in its trace) and another
     has, the k-th over the run instead, with a note: within the step, its collectives (no step)
     could never meet the others'. Where it shares a host (one clock) with a rank of the group that
     has steps, its k-th of a kind is lined up with that rank's (k + j)-th for the j whose pairs
     arrive closest (:data:`_SHIFTS`: a profiling window a step later), with a note. A rank with
     steps whose collectives lie outside them (a lost ProfilerStep marker, its events kept) has them
     matched within the step they fall in on another rank of its host, one it lacks (:data:`_ROWS`),
     with a note.
     Ordinals follow each rank's arrival order. Point-to-point ops (``p2p``, or an op in
     :data:`P2P_OPS`) without a process group and sequence number are left unmatched
     (``instance_id`` null): each involves one unknown peer, so the k-th one on two ranks is in
     general not the same transfer (on ``hta/trace_filter`` the ordinal pairs ended up to 116 ms
     before the "other side" started).
  5. Instance ids are numbered 1.. in order of first arrival; ``collective_instances`` gets one row
     per instance with the ranks present and missing (of ``pg_ranks`` when known, else the ranks
     seen in that source and group anywhere in the run; never a rank whose record of the group
     starts at a later sequence number: a wrapped Flight Recorder ring buffer or a profiler that
     started later is compared on the common range only) and arrival / end statistics (recomputed by
     :func:`refresh_instances` after clock alignment). ``last_rank`` is NULL on a tie. Its ``op``
     and ``step``: the most common of its rows' (NULLs aside), the smallest on a tie, whatever the
     rows' order; a send matched with its recv: ``send/recv``.

Arrival of a rank at a collective (:data:`INSTANCE_ARRIVAL_SQL`): the start of the communication kernel on
GPU traces and NCCL Inspector records (the GPU reaches the collective), otherwise the CPU enqueue (``enter_ns``: gloo's c10d
op, Flight Recorder ``time_created_ns``), falling back to the start of the work. One clock per instance: where a
rank's row lacks the preferred time (an Inspector record without kernel times), every rank's other time is read
(else the enqueue-to-kernel gap would count as skew); where neither is common to the rows, the arrival is unknown
(:func:`arrival_clock_note` counts both). Instance numbering and the run shift (step 4) compare ranks the same way.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import msgspec

from traceprof.core.lazy import lazy

# the arrival rule, declared with the view that reads it too
from traceprof.core.schema import (
    ARRIVAL_CLOCK_SQL,
    ARRIVAL_FIRST_SQL,
    ARRIVAL_NEXT_SQL,
    ARRIVAL_SQL,
    INSTANCE_ARRIVAL_SQL,
    one_clock_sql,
)
from traceprof.core.vocab import CollectiveSource
from traceprof.storage.store import Store

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy("polars")

__all__ = [
    "ARRIVAL_CLOCK_SQL",
    "ARRIVAL_SQL",
    "INSTANCE_ARRIVAL_SQL",
    "arrival_clock_note",
    "missing_step_notes",
    "run_missing_step_notes",
    "absorbing_steps",
    "P2P_OPS",
    "CROSS_STEP_SHARE",
    "MatchSummary",
    "match_run",
    "refresh_instances",
    "preferred_source",
    "unmatched_p2p",
    "canonical_ranks",
    "fallback_note",
    "RUN_STEPS_SQL",
    "STEP_SHIFTS_SQL",
    "run_steps",
    "step_shift_notes",
    "stepless_notes",
]


#: Common table expressions of :data:`RUN_STEPS_SQL` and :data:`STEP_SHIFTS_SQL` (``$run``: the run id).
#: Ranks whose step ranges overlap number their steps alike: they form one numbering, in which a step
#: keeps its number (a rank whose trace starts a step later, or lacks a middle step, is aligned by
#: step number). Ranks may also number their ProfilerSteps differently (one rank's #500.. while the
#: others' are #100..): numberings whose ranges do not overlap are aligned by order, the k-th step of
#: each numbering being the same step, labelled with the number of the numbering holding the lowest
#: rank. Within a numbering, a rank whose step range differs from that of the numbering's lowest
#: rank (the reference) may also number its steps off by some (its #5..#7 the reference's #4..#6).
#: The evidence is its collectives (``sig``: source, group, op, sequence number and size, in order,
#: per step): a step agrees when they equal the reference's at the step it is lined up with, and
#: differs when both have collectives and they do not. A shift by position (its p-th step the
#: reference's (p + j)-th; its steps beyond the reference's keep the offset of its first one lined
#: up) is taken only when some steps differ by number, and it has fewer differing steps than by
#: number (the fewest of any shift, agreeing in more steps than it differs, and in the most among
#: those); else by number. When every step runs the same collectives (gloo, no sequence numbers)
#: no step differs either way: no evidence, by number (a trace that starts a step later and a
#: rank numbering its steps off look alike there). Times come first where
#: they are comparable: a rank on the reference's host (``traces.host`` equal, one clock) whose
#: steps' raw starts (clock offsets removed) lie closest to the reference's under one alignment, by
#: a median gap under half the reference's median step, is lined up so (by number on a tie), whatever
#: its collectives say: when every step runs the same collectives, a profiling window that really
#: starts a step later (its #5..#7 at the times of the reference's #5..#7, the reference's range
#: #4..#6) agrees with the reference in more steps one position off than by number.
_STEPS_CTES = """
WITH s AS (SELECT DISTINCT rank, step FROM steps WHERE run_id = $run AND step IS NOT NULL),
nb AS (
  SELECT rank, min(rank) OVER (PARTITION BY grp) AS numbering
  FROM (SELECT rank, sum(CASE WHEN lo > prev_hi THEN 1 ELSE 0 END) OVER (ORDER BY lo, rank) AS grp
        FROM (SELECT rank, lo, max(hi) OVER (ORDER BY lo, rank ROWS BETWEEN UNBOUNDED PRECEDING
                                             AND 1 PRECEDING) AS prev_hi
              FROM (SELECT rank, min(step) AS lo, max(step) AS hi FROM s GROUP BY rank)))
),
own AS (
  SELECT rank, step, numbering, row_number() OVER (PARTITION BY rank ORDER BY step) AS pos,
         count(*) OVER (PARTITION BY rank) AS n, min(step) OVER (PARTITION BY rank) AS lo,
         max(step) OVER (PARTITION BY rank) AS hi
  FROM s JOIN nb USING (rank)
),
odd AS (  -- ranks whose step range differs from their reference's
  SELECT o.rank, any_value(o.numbering) AS numbering, any_value(o.n) AS n, any_value(r.n) AS n_ref
  FROM own o JOIN own r ON r.rank = o.numbering AND r.pos = 1
  WHERE o.lo <> r.lo OR o.hi <> r.hi GROUP BY o.rank
),
sig AS (  -- each rank's collectives per step, in order; read only where some rank is odd
  SELECT rank, step, string_agg(concat_ws(':', source, pg, op, seq, coalesce(bytes_in, nelems_in)), ','
                                ORDER BY start_ns, seq, op) AS sig
  FROM collectives
  WHERE run_id = $run AND step IS NOT NULL AND EXISTS (SELECT 1 FROM odd)
  GROUP BY rank, step
),
tries AS (  -- j NULL: by number; else its p-th step lined up with the reference's (p + j)-th
  SELECT o.rank, o.numbering, o.step, o.pos, unnest(list_concat([NULL::BIGINT], range(1 - d.n, d.n_ref))) AS j
  FROM own o JOIN odd d USING (rank)
),
scores AS (  -- per try: the steps lined up whose collectives agree, and those that differ
  SELECT t.rank, t.j, count(*) FILTER (WHERE h.sig = g.sig) AS agree, count(*) FILTER (WHERE h.sig <> g.sig) AS differ
  FROM tries t JOIN sig g ON g.rank = t.rank AND g.step = t.step
  JOIN own r ON r.rank = t.numbering AND CASE WHEN t.j IS NULL THEN r.step = t.step ELSE r.pos = t.pos + t.j END
  JOIN sig h ON h.rank = r.rank AND h.step = r.step
  GROUP BY ALL
),
best AS (
  SELECT rank, min(differ) FILTER (WHERE j IS NOT NULL) AS low,
         any_value(differ) FILTER (WHERE j IS NULL) AS by_number
  FROM scores GROUP BY rank
),
vote AS (  -- where some steps differ by number: the shift with the fewest differing, agreeing in most
  SELECT rank, min(j) AS j, any_value(agree) AS agree, any_value(by_number) AS by_number
  FROM (SELECT s.*, b.by_number, max(s.agree) OVER (PARTITION BY s.rank) AS top
        FROM scores s JOIN best b USING (rank)
        WHERE s.j IS NOT NULL AND s.differ = b.low AND b.low < coalesce(b.by_number, 0) AND s.agree > s.differ)
  WHERE agree = top
  GROUP BY rank HAVING count(*) = 1
),
tm AS (  -- each step's raw start (clock offset removed) and length, and its traces' hosts; where some rank is odd
  SELECT s.rank, s.step, min(s.cpu_start_ns - coalesce(t.clock_offset_ns, 0)) AS t0,
         min(s.cpu_end_ns - s.cpu_start_ns) AS len, min(t.host) AS h_lo, max(t.host) AS h_hi,
         bool_and(t.host IS NOT NULL) AS named
  FROM steps s JOIN traces t USING (trace_id)
  WHERE s.run_id = $run AND s.step IS NOT NULL AND EXISTS (SELECT 1 FROM odd)
  GROUP BY s.rank, s.step
),
hosts AS (  -- a rank's host, where every trace holding its steps names the same one
  SELECT rank, CASE WHEN bool_and(named) AND min(h_lo) = max(h_hi) THEN min(h_lo) END AS host FROM tm GROUP BY rank
),
gaps AS (  -- per try on the reference's host: the median |start difference| of the steps lined up
  SELECT t.rank, t.j, median(abs(a.t0 - b.t0)) AS gap
  FROM tries t JOIN tm a ON a.rank = t.rank AND a.step = t.step
  JOIN own r ON r.rank = t.numbering AND CASE WHEN t.j IS NULL THEN r.step = t.step ELSE r.pos = t.pos + t.j END
  JOIN tm b ON b.rank = r.rank AND b.step = r.step
  JOIN hosts ha ON ha.rank = t.rank JOIN hosts hb ON hb.rank = r.rank AND hb.host = ha.host
  GROUP BY ALL
),
near AS (  -- the closest tries, where within half the reference's median step
  SELECT g.rank, g.j, g.gap, n.gap AS gap_number, m.step_len
  FROM gaps g JOIN (SELECT rank, min(gap) AS gap FROM gaps GROUP BY rank) USING (rank, gap)
  JOIN (SELECT rank, any_value(numbering) AS numbering FROM own GROUP BY rank) o USING (rank)
  JOIN (SELECT rank AS numbering, median(len) AS step_len FROM tm GROUP BY rank) m USING (numbering)
  LEFT JOIN gaps n ON n.rank = g.rank AND n.j IS NULL
  WHERE 2 * g.gap < m.step_len
),
timed AS (  -- times decide: by number on a tie with it, else the one closest shift
  SELECT rank, CASE WHEN NOT bool_or(j IS NULL) THEN min(j) END AS j, min(gap) AS gap,
         any_value(gap_number) AS gap_number, any_value(step_len) AS step_len
  FROM near GROUP BY rank HAVING bool_or(j IS NULL) OR count(*) = 1
),
shift AS (  -- the shift taken per rank: by times where they decide, else by the collectives' vote
  SELECT t.rank, t.j, sc.agree, b.by_number, t.gap, t.gap_number, t.step_len
  FROM timed t JOIN best b USING (rank) LEFT JOIN scores sc ON sc.rank = t.rank AND sc.j = t.j
  WHERE t.j IS NOT NULL
  UNION ALL
  SELECT rank, j, agree, by_number, NULL, NULL, NULL FROM vote WHERE rank NOT IN (SELECT rank FROM timed)
),
lined AS (  -- each rank's step in its numbering's terms
  SELECT rank, step, numbering,
         coalesce(ref, step + first_value(ref - step IGNORE NULLS) OVER (
           PARTITION BY rank ORDER BY pos ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)) AS nstep
  FROM (SELECT o.rank, o.step, o.numbering, o.pos, CASE WHEN sh.j IS NULL THEN o.step ELSE r.step END AS ref
        FROM own o LEFT JOIN shift sh USING (rank) LEFT JOIN own r ON r.rank = o.numbering AND r.pos = o.pos + sh.j)
),
u AS (  -- the steps of each numbering, k = 1..
  SELECT numbering, nstep, dense_rank() OVER (PARTITION BY numbering ORDER BY nstep) AS k
  FROM (SELECT DISTINCT numbering, nstep FROM lined)
),
lab AS (SELECT k, arg_min(nstep, numbering) AS run_step FROM u GROUP BY k),
mapped AS (SELECT l.rank, l.step, l.numbering, l.nstep, lab.run_step FROM lined l JOIN u USING (numbering, nstep)
           JOIN lab USING (k))
"""

#: SQL (``$run`` replaced by the run id) mapping each rank's step number to the run's step (columns
#: rank, step, run_step): :data:`_STEPS_CTES`. So raw step numbers are compared across ranks only
#: where their ranges overlap, and a rank's steps are shifted off their numbers only where its
#: steps' start times (on the reference's host) or else its collectives say so.
RUN_STEPS_SQL = _STEPS_CTES + "SELECT rank, step, run_step FROM mapped\n"

#: SQL (``$run``: the run id): the ranks whose steps :data:`RUN_STEPS_SQL` shifted off their numbers
#: (columns rank, first, last: its own step range, ref: the rank it was compared with, ref_first,
#: ref_last: that rank's numbers of those steps, agree: steps whose collectives agree that way,
#: by_number: steps whose collectives differ by number; where times decided (same host), else NULL: gap, gap_number:
#: median |start difference| (ns) of the steps lined up so and by number, step_len: the reference's
#: median step).
_SHIFTS_OF = """SELECT rank, min(step) AS first, max(step) AS last, any_value(numbering) AS ref,
       min(nstep) AS ref_first, max(nstep) AS ref_last, any_value(agree) AS agree,
       any_value(by_number) AS by_number, any_value(gap) AS gap, any_value(gap_number) AS gap_number,
       any_value(step_len) AS step_len
FROM $rows
GROUP BY rank HAVING bool_or(nstep <> step) ORDER BY rank
"""
STEP_SHIFTS_SQL = _STEPS_CTES + _SHIFTS_OF.replace("$rows", "mapped JOIN shift USING (rank)")

#: :func:`match_run` computes :data:`_STEPS_CTES` once for its three readers (the rows matched,
#: the shift notes, the instances), into two temporary tables: ``_steps_map`` (``mapped`` with
#: its rank's ``shift``, if any: ``shifted``) and ``_run_steps`` (:data:`RUN_STEPS_SQL`'s rows).
_STEPS_MAP = (
    _STEPS_CTES
    + "SELECT m.*, sh.* EXCLUDE (rank), sh.rank IS NOT NULL AS shifted FROM mapped m LEFT JOIN shift sh USING (rank)"
)


def run_steps(store: Store, run_id: int, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (columns rank, step, ...) with ``step`` replaced by the run's step (:data:`RUN_STEPS_SQL`);
    steps the ``steps`` table does not know keep their number."""
    if frame.is_empty() or "step" not in frame.columns:
        return frame
    m = store.sql(RUN_STEPS_SQL.replace("$run", str(int(run_id))))
    if m.is_empty():
        return frame
    m = m.with_columns(
        pl.col("rank").cast(frame.schema["rank"]),
        pl.col("step").cast(frame.schema["step"]),
        pl.col("run_step").cast(frame.schema["step"]),
    )
    cols = frame.columns
    return (
        frame.join(m, on=["rank", "step"], how="left")
        .with_columns(pl.coalesce("run_step", "step").alias("step"))
        .select(cols)
    )


#: Point-to-point ops (``traceprof.core.ops`` names): one peer each, never matched by ordinal.
P2P_OPS = ("send", "recv", "send_recv", "send_coalesced", "recv_coalesced", "send_recv_coalesced")
_P2P_SQL = "(" + ", ".join(f"'{op}'" for op in P2P_OPS) + ")"
_IS_P2P_SQL = f"coalesce(p2p, coalesce(op, '') IN {_P2P_SQL})"

#: A group whose (pg, seq) keys land in different steps more often than this share has sequence
#: numbers that are not per group (step 3). Not 0: a step boundary can fall between two ranks'
#: launches of one collective when their steps are cut at slightly different points.
CROSS_STEP_SHARE = 0.1
#: A rank's stride (median step between its consecutive sequence numbers in a group) is compared
#: only when it has at least this many steps: one missing record makes a single step of 2.
MIN_STRIDE_DIFFS = 3


@dataclass(frozen=True)
class MatchSummary:
    """What matching found in a run.

    Attributes:
        rows: Collectives rows of the run.
        instances: Instances (one per matched collective across ranks).
        by_method: Instances per method (``comms_id``, ``pg_seq``, ``step_order``, ``ordinal``).
        incomplete: Instances that miss at least one rank of their group.
        unmatched_p2p: Point-to-point rows left unmatched (no process group and sequence number).
        notes: Remarks (groups whose sequence numbers fell back to order within the step).
    """

    rows: int
    instances: int
    by_method: dict[str, int]
    incomplete: int
    unmatched_p2p: int = 0
    notes: tuple[str, ...] = field(default=())


def missing_step_notes(steps: pl.DataFrame) -> list[str]:
    """One note per rank that lacks steps other ranks have (its trace starts a step later, ends a
    step earlier, or lost a ProfilerStep): ``rank 0 has no step 4 ...``. Per-rank figures leave
    the step out on that rank; figures across ranks take that step over the ranks that have it. A
    step lost between two the rank has is said to lie in its next step (a rank's step windows
    cover its whole time: each starts where its previous one ended).

    Args:
        steps: rank, step (the run's step, ``matching.run_steps``; null: no steps), one row per
            (rank, step) or more.
    """
    have = steps.filter(pl.col("step").is_not_null()).select("rank", "step").unique()
    if have.is_empty():
        return []
    every = have["step"].unique().sort()
    held = absorbing_steps(have)
    notes = []
    for r in sorted(have["rank"].unique().to_list()):
        own = have.filter(pl.col("rank") == r)["step"]
        lost = every.filter(~every.is_in(own.implode())).to_list()
        if lost:
            one = len(lost) == 1
            # a step lost between two it has: the rank's time of it lies in the next step's window
            inner = held.filter(pl.col("rank") == r).sort("step").iter_rows()
            into = "; ".join(
                f"its time of step {s} is counted in its step {n}" for _, n, ss in inner for s in ss
            )
            notes.append(
                f"rank {r} has no step {', '.join(map(str, lost))} (its trace does not record "
                f"{'it' if one else 'them'}): {'that step is' if one else 'those steps are'} taken over the "
                "ranks that have it" + (f"; {into}" if into else "")
            )
    return notes


def run_missing_step_notes(store: Store, run_id: int) -> list[str]:
    """:func:`missing_step_notes` of run ``run_id``'s stored steps, by the run's step (:func:`run_steps`)."""
    steps = store.sql("SELECT DISTINCT rank, step FROM steps WHERE run_id = ? AND step IS NOT NULL", [run_id])
    return missing_step_notes(run_steps(store, run_id, steps))


def absorbing_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """The rank-steps whose window also holds steps the rank lost between two it has
    (:func:`missing_step_notes`: a rank's step windows tile its time, so a lost middle step's time
    lies in the rank's next step). Such a step spans several steps' time but holds one step's
    work: per-step figures that divide work by time, or take a step's slowest rank, leave it out.

    Args:
        steps: rank, step (the run's step, ``matching.run_steps``; null: no steps), one row per
            (rank, step) or more.

    Returns:
        rank, step, lost (the run's steps it holds besides its own, ascending), one row per such
        rank-step, sorted by rank and step.
    """
    have = steps.filter(pl.col("step").is_not_null()).select("rank", "step").unique()
    every = have["step"].unique().sort().to_list()
    index = {s: i for i, s in enumerate(every)}
    rows = []
    for (r,), own in have.sort("step").group_by(["rank"], maintain_order=False):
        mine = own["step"].to_list()
        for prev, s in itertools.pairwise(mine):
            if index[s] - index[prev] > 1:
                rows.append((r, s, every[index[prev] + 1 : index[s]]))
    frame = pl.DataFrame(
        rows,
        schema={
            "rank": have.schema["rank"],
            "step": have.schema["step"],
            "lost": pl.List(have.schema["step"]),
        },
        orient="row",
    )
    return frame.sort("rank", "step")


def canonical_ranks(value: Any) -> str | None:
    """Member ranks of a process group as a canonical JSON list (sorted, ``"[0, 1]"``).

    Args:
        value: A list of ints, or its JSON text (Kineto ``Process Group Ranks``, FR ``pg_config``
            ``ranks``), or None.

    Returns:
        The canonical text, or None when the value is absent or not a list of integers (e.g. a
        truncated ``"[0, 1, ...]"``).
    """
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(r, int) and not isinstance(r, bool) for r in value)
    ):
        return None
    return "[" + ", ".join(str(r) for r in sorted(set(value))) + "]"


#: The run's collectives rows as matching reads them (``step``: the run's step). ``lost_step``: a row
#: outside its rank's steps (step NULL) on a rank with steps, whose CPU enqueue (clock offset removed)
#: falls in the window of a step that rank lacks (a lost ProfilerStep marker) on another rank of its
#: host (one clock), one such step only: that step, and the row's ``step`` becomes it.
_ROWS_OF_RS = f"""
c AS (
  SELECT c.rowid AS rid, rank, source, pg, pg_ranks, group_size, seq, comms_id, op, peer,
         coalesce(rs.run_step, step) AS step,
         {_IS_P2P_SQL} AS p2p, coalesce(bytes_in, nelems_in) AS size, {ARRIVAL_SQL} AS arrival_ns, start_ns,
         rank NOT IN (SELECT rank FROM steps WHERE run_id = $run AND step IS NOT NULL) AS stepless,
         {ARRIVAL_SQL} - coalesce(t.clock_offset_ns, 0) AS raw_ns, {ARRIVAL_FIRST_SQL} AS arr1, {ARRIVAL_NEXT_SQL} AS arr2,
         {ARRIVAL_FIRST_SQL} - coalesce(t.clock_offset_ns, 0) AS raw1, {ARRIVAL_NEXT_SQL} - coalesce(t.clock_offset_ns, 0) AS raw2,
         coalesce(enter_ns, start_ns) - coalesce(t.clock_offset_ns, 0) AS _cpu_ns, t.host
  FROM collectives c LEFT JOIN rs USING (rank, step)
  LEFT JOIN (SELECT trace_id, clock_offset_ns, host FROM traces) t ON t.trace_id = c.trace_id
  WHERE c.run_id = $run
),
win AS (  -- each rank-step's raw window on its host, by the run's step
  SELECT s.rank, coalesce(rs.run_step, s.step) AS step, t.host, min(s.cpu_start_ns - coalesce(t.clock_offset_ns, 0)) AS lo,
         max(s.cpu_end_ns - coalesce(t.clock_offset_ns, 0)) AS hi
  FROM steps s JOIN traces t ON t.trace_id = s.trace_id LEFT JOIN rs ON rs.rank = s.rank AND rs.step = s.step
  WHERE s.run_id = $run AND s.step IS NOT NULL AND t.host IS NOT NULL AND EXISTS (
    SELECT 1 FROM c WHERE c.step IS NULL AND NOT c.stepless)
  GROUP BY ALL
),
lost AS (
  SELECT c.rid, min(w.step) AS lost_step
  FROM c JOIN win w ON w.host = c.host AND w.rank <> c.rank AND c._cpu_ns >= w.lo AND c._cpu_ns < w.hi
  WHERE c.step IS NULL AND NOT c.stepless
    AND NOT EXISTS (SELECT 1 FROM win o WHERE o.rank = c.rank AND o.step = w.step)
    AND NOT EXISTS (SELECT 1 FROM rs WHERE rs.rank = c.rank AND rs.run_step = w.step)
  GROUP BY c.rid HAVING count(DISTINCT w.step) = 1
)
SELECT c.* EXCLUDE (_cpu_ns) REPLACE (coalesce(c.step, l.lost_step) AS step), l.lost_step
FROM c LEFT JOIN lost l USING (rid)
"""
_ROWS = f"WITH rs AS ({RUN_STEPS_SQL}),{_ROWS_OF_RS}"
#: :data:`_ROWS` reading the run's steps from ``_run_steps`` (:data:`_STEPS_MAP`).
_ROWS_OF_TABLE = f"WITH rs AS (FROM _run_steps),{_ROWS_OF_RS}"
_GROUP = "source, g_pg, g_ranks, p2p"

#: Step 3 (module doc): the groups whose sequence numbers cannot be per group, each with its
#: reason (``why``); of several reasons the first listed here. Reads ``_match_rows``.
_BAD = f"""
WITH ided AS (
  SELECT *, seq = min(seq) OVER w AS first_in, seq = max(seq) OVER w AS last_in,
         min(step) OVER k AS k_lo, max(step) OVER k AS k_hi
  FROM _match_rows WHERE comms_id IS NULL AND pg IS NOT NULL AND seq IS NOT NULL
  WINDOW w AS (PARTITION BY {_GROUP}, rank, step), k AS (PARTITION BY {_GROUP}, seq)
),
keys AS (  -- steps: of a key not astride a step boundary (its rows in two adjacent steps, each the last of its
  -- rank's rows of the group in the earlier step or the first in the later one: one collective that one rank
  -- launched just before its step marker and another just after it), the distinct steps of its rows; else 1
  SELECT {_GROUP}, seq, count(DISTINCT rank) + (count(rank) < count(*))::INT AS n,
         CASE WHEN max(step) - min(step) = 1 AND bool_and(step IS NULL OR (step = k_lo AND last_in)
                                                           OR (step = k_hi AND first_in))
              THEN 1 ELSE count(DISTINCT step) END AS steps, max(group_size) AS size
  FROM ided GROUP BY ALL
),
crowded AS (  -- collectives, members unknown, and more ranks hold a sequence number than the group has
  -- (point-to-point counters are per rank: a wide group's are told by ``wide`` below)
  SELECT {_GROUP}, 0 AS o, max(n) || ' ranks hold one sequence number of a group of ' || max(size)
         || ' (its size as the rows state it): groups with other members share the name, and the rows do not '
         || 'list the members (no process group ranks)' AS why
  FROM keys WHERE g_ranks = '' AND size > 0 AND NOT p2p GROUP BY ALL HAVING max(n) > max(size)
),
cross_step AS (
  SELECT {_GROUP}, 1 AS o, sum((steps > 1)::INT) || ' of ' || count(*)
         || ' sequence numbers hold rows of different steps' AS why
  FROM keys WHERE n >= 2 GROUP BY ALL
  HAVING sum((steps > 1)::INT)::DOUBLE / count(*) > {CROSS_STEP_SHARE}
),
diffs AS (
  SELECT {_GROUP}, rank, seq - lag(seq) OVER (
    PARTITION BY {_GROUP}, rank ORDER BY arrival_ns ASC NULLS FIRST, seq ASC NULLS FIRST) AS d
  FROM ided
),
per_rank AS (  -- each rank's lower median step between consecutive sequence numbers
  SELECT {_GROUP}, rank, list_sort(list(d))[(count(*) - 1) // 2 + 1] AS stride
  FROM diffs WHERE d IS NOT NULL GROUP BY ALL HAVING count(*) >= {MIN_STRIDE_DIFFS}
),
strides AS (
  SELECT {_GROUP}, 2 AS o, 'ranks step their sequence numbers by ' || min(stride) || ' to ' || max(stride) AS why
  FROM per_rank GROUP BY ALL HAVING count(DISTINCT stride) > 1
),
p2p_keys AS (  -- a Comms Id hashes (pg, seq, p2p, ranks): the per-rank p2p counter, as Seq
  SELECT {_GROUP}, n FROM keys WHERE p2p
  UNION ALL
  SELECT {_GROUP}, count(DISTINCT rank) + (count(rank) < count(*))::INT AS n
  FROM _match_rows WHERE comms_id IS NOT NULL AND p2p GROUP BY {_GROUP}, comms_id
),
wide AS (
  SELECT {_GROUP}, 3 AS o, sum((n > 2)::INT) || ' of ' || count(*)
         || ' point-to-point sequence numbers are held by three or more ranks' AS why
  FROM p2p_keys WHERE n >= 2 GROUP BY ALL
  HAVING sum((n > 2)::INT)::DOUBLE / count(*) > {CROSS_STEP_SHARE}
)
SELECT {_GROUP}, arg_min(why, o) AS why, min(o) = 0 AS lost
FROM (SELECT * FROM crowded UNION ALL SELECT * FROM cross_step UNION ALL SELECT * FROM strides
      UNION ALL SELECT * FROM wide)
GROUP BY ALL ORDER BY ALL
"""

#: Common table expressions of :data:`_SHIFTS` and :data:`_KEYED`: the rows without ids, each with its
#: kind (``_op``, ``_size``), ``by_run`` and ``k0``: the k-th of its kind on its rank (within the step,
#: or over the run where ``by_run``), in arrival order. Reads ``_match_rows`` and ``_match_bad``.
_ORDERED = f"""
WITH r AS (  -- a group whose name several groups share, members unknown (``lost``): no row matched
  SELECT m.*, b.why IS NOT NULL AS bad
  FROM _match_rows m LEFT JOIN _match_bad b USING (source, g_pg, g_ranks, p2p)
  WHERE NOT coalesce(b.lost, false)
),
ordered AS (  -- rows without ids: the k-th of its kind on its rank (within the step), in arrival order
  SELECT *, row_number() OVER (PARTITION BY {_GROUP}, op, _size, step, rank
                               ORDER BY arrival_ns ASC NULLS LAST, start_ns ASC NULLS LAST, rid) - 1 AS k0
  FROM (
    SELECT * REPLACE (CASE WHEN NOT by_run THEN step END AS step) FROM (
      SELECT *, CASE WHEN contains(coalesce(op, ''), 'all_to_all') THEN '*'
                     -- a size unknown on some row (a NaN dim): the op's rows pair by their order alone
                     WHEN bool_or(size IS NULL) OVER (PARTITION BY {_GROUP}, op) THEN '*'
                     ELSE CAST(size AS VARCHAR) END AS _size, coalesce(op, '?') AS _op,
             bool_or(stepless) OVER (PARTITION BY {_GROUP}) AND NOT bool_and(stepless) OVER (PARTITION BY {_GROUP})
               AS by_run  -- a rank without steps: the k-th of its kind over the run
      FROM r
      WHERE comms_id IS NULL AND NOT (pg IS NOT NULL AND seq IS NOT NULL AND (NOT bad OR p2p))
        AND NOT (p2p AND (pg IS NULL OR seq IS NULL))))
)"""

#: The largest offset (collectives of one kind) :data:`_SHIFTS` tries between a rank without steps
#: and the reference on its host: a window a few steps late of a job with tens of collectives of a
#: kind per step, while the pairs tried stay linear in the collectives (at most 2 x 512 + 1 per row).
MAX_RUN_SHIFT = 512

#: Step 4 (module doc), a rank without steps matched over the run: where it shares a host (one clock)
#: with a rank of the group that has steps (the lowest such, the reference), its k-th collective of a
#: kind is lined up with the reference's (k + j)-th for the j whose pairs' raw arrivals (clock offsets
#: removed) lie closest, by a median |difference| under half the reference's median spacing between
#: collectives of that kind (j 0 on a tie with it; none found: j 0). Columns: the group, rank, ``_op``,
#: ``_size``, ref, j, gap (that median, ns), gap0 (by run order), spacing. Reads what
#: :data:`_ORDERED` reads; empty without such a rank.
_SHIFTS = (
    _ORDERED
    + f""",
hosted AS (  -- a rank's host, where all its rows name the same one
  SELECT rank, CASE WHEN count(host) = count(*) AND min(host) = max(host) THEN min(host) END AS host
  FROM _match_rows GROUP BY rank
),
kinds AS (SELECT {_GROUP}, rank, stepless, _op, _size, count(*) AS n FROM ordered WHERE by_run GROUP BY ALL),
pairs AS (  -- each stepless rank's kinds and the reference on its host
  SELECT a.source, a.g_pg, a.g_ranks, a.p2p, a.rank, a._op, a._size, a.n,
         arg_min(b.rank, b.rank) AS ref, arg_min(b.n, b.rank) AS n_ref
  FROM kinds a JOIN kinds b ON b.source = a.source AND b.g_pg = a.g_pg AND b.g_ranks = a.g_ranks
   AND b.p2p = a.p2p AND b._op = a._op AND b._size = a._size AND NOT b.stepless
  JOIN hosted ha ON ha.rank = a.rank JOIN hosted hb ON hb.rank = b.rank AND hb.host = ha.host
  WHERE a.stepless GROUP BY ALL
),
tries AS (  -- offsets within MAX_RUN_SHIFT: the pairs tried grow linearly with the collectives
  SELECT *, unnest(range(greatest(1 - n, -{MAX_RUN_SHIFT}), least(n_ref, {MAX_RUN_SHIFT} + 1))) AS j FROM pairs
),
gaps AS (
  SELECT t.source, t.g_pg, t.g_ranks, t.p2p, t.rank, t._op, t._size, t.ref, t.j,
         median(abs(CASE WHEN a.raw1 IS NOT NULL AND b.raw1 IS NOT NULL THEN a.raw1 - b.raw1
                         ELSE a.raw2 - b.raw2 END)) AS gap  -- one clock for the pair (INSTANCE_ARRIVAL_SQL)
  FROM tries t
  JOIN ordered a ON a.by_run AND a.source = t.source AND a.g_pg = t.g_pg AND a.g_ranks = t.g_ranks AND a.p2p = t.p2p
   AND a.rank = t.rank AND a._op = t._op AND a._size = t._size
  JOIN ordered b ON b.by_run AND b.source = t.source AND b.g_pg = t.g_pg AND b.g_ranks = t.g_ranks AND b.p2p = t.p2p
   AND b.rank = t.ref AND b._op = t._op AND b._size = t._size AND b.k0 = a.k0 + t.j
  GROUP BY ALL
),
spacing AS (  -- the reference's median spacing between collectives of the kind
  SELECT source, g_pg, g_ranks, p2p, rank AS ref, _op, _size, median(d) AS spacing
  FROM (SELECT *, raw_ns - lag(raw_ns) OVER (PARTITION BY {_GROUP}, rank, _op, _size ORDER BY k0) AS d
        FROM ordered WHERE by_run AND NOT stepless)
  WHERE d IS NOT NULL GROUP BY ALL
),
near AS (
  SELECT g.*, s.spacing FROM gaps g JOIN spacing s USING (source, g_pg, g_ranks, p2p, ref, _op, _size)
  WHERE 2 * g.gap < s.spacing
  QUALIFY g.gap = min(g.gap) OVER (PARTITION BY g.source, g.g_pg, g.g_ranks, g.p2p, g.rank, g._op, g._size)
)
SELECT n.source, n.g_pg, n.g_ranks, n.p2p, n.rank, n._op, n._size, any_value(n.ref) AS ref,
       CASE WHEN bool_or(n.j = 0) THEN 0 ELSE min(n.j) END AS j, min(n.gap) AS gap, any_value(z.gap) AS gap0,
       any_value(n.spacing) AS spacing
FROM near n LEFT JOIN gaps z ON z.source = n.source AND z.g_pg = n.g_pg AND z.g_ranks = n.g_ranks AND z.p2p = n.p2p
 AND z.rank = n.rank AND z._op = n._op AND z._size = n._size AND z.j = 0
GROUP BY ALL HAVING bool_or(n.j = 0) OR count(*) = 1
"""
)

#: The point-to-point rows that may match as the k-th transfer between two ranks (``pair_order``): the
#: sends and recvs naming their peer in a group of :data:`_BAD`, each with its direction (``_src``,
#: ``_dst``). Reads ``r`` of :data:`_ORDERED`.
_PAIR_ROWS = """SELECT *, CASE WHEN op = 'send' THEN rank ELSE peer END AS _src,
               CASE WHEN op = 'send' THEN peer ELSE rank END AS _dst
        FROM r WHERE bad AND p2p AND peer IS NOT NULL AND peer <> rank AND op IN ('send', 'recv')"""

#: The sends and the recvs of each direction (``_src`` to ``_dst``) of :data:`_PAIR_ROWS`.
_PAIRS = (
    _ORDERED
    + f"""
SELECT source, g_pg, g_ranks, _src, _dst, count(*) FILTER (WHERE op = 'send') AS sends,
       count(*) FILTER (WHERE op = 'recv') AS recvs
FROM ({_PAIR_ROWS}) GROUP BY ALL"""
)

#: An instance's first arrival (ns) on its one clock, as an aggregate over its rows (columns arr1, arr2:
#: ARRIVAL_FIRST_SQL, ARRIVAL_NEXT_SQL): the rule of INSTANCE_ARRIVAL_SQL, schema.one_clock_sql.
_FIRST_ARRIVAL = one_clock_sql("arr1", "arr2", agg="min")
#: Steps 1, 2, 4 and 5 (module doc): the instance and method of every matchable row (``rid``: the
#: row's ``collectives.rowid``). Reads ``_match_rows``, ``_match_bad`` (:data:`_BAD`'s groups) and
#: ``_match_shift`` (:data:`_SHIFTS`).
_KEYED = (
    (
        _ORDERED
        + """,
keyed AS (
  SELECT rid, arrival_ns, arr1, arr2, 'comms_id' AS method, 'c|' || source || '|' || comms_id AS key
  FROM r WHERE comms_id IS NOT NULL AND NOT (bad AND p2p)
  UNION ALL
  SELECT rid, arrival_ns, arr1, arr2, 'pg_seq', concat_ws('|', 's', source, g_pg, g_ranks, CAST(p2p AS VARCHAR),
                                              CAST(seq AS VARCHAR))
  FROM r WHERE comms_id IS NULL AND pg IS NOT NULL AND seq IS NOT NULL AND NOT bad
  UNION ALL  -- p2p rows of a group whose counters are per rank: the k-th transfer from one rank to another,
  -- where both ends hold as many (or one end none): else a lost transfer would shift all later pairs
  SELECT rid, arrival_ns, arr1, arr2, 'pair_order',
         concat_ws('|', 'p', source, g_pg, g_ranks, CAST(_src AS VARCHAR), CAST(_dst AS VARCHAR),
                   CAST(row_number() OVER (PARTITION BY source, g_pg, g_ranks, rank, _src, _dst
                                           ORDER BY seq, arrival_ns ASC NULLS LAST, rid) AS VARCHAR))
  FROM ({_PAIR_ROWS}) JOIN _match_pairs USING (source, g_pg, g_ranks, _src, _dst)
  WHERE sends = recvs OR sends = 0 OR recvs = 0
  UNION ALL
  SELECT rid, arrival_ns, arr1, arr2, CASE WHEN bad THEN 'step_order' ELSE 'ordinal' END,
         concat_ws('|', 'o', source, g_pg, g_ranks, CAST(p2p AS VARCHAR), coalesce(op, '?'), _size,
                   coalesce(CAST(step AS VARCHAR), '-'), CAST(k0 + coalesce(sh.j, 0) AS VARCHAR))
  FROM ordered LEFT JOIN _match_shift sh USING (source, g_pg, g_ranks, p2p, rank, _op, _size)
),
firsts AS (  -- numbered by first arrival, one clock per instance (INSTANCE_ARRIVAL_SQL)
  SELECT key, row_number() OVER (
    ORDER BY coalesce({_FIRST_ARRIVAL}, min(arrival_ns)) ASC NULLS LAST, key) AS instance_id
  FROM keyed GROUP BY key
)
SELECT k.rid, f.instance_id::BIGINT AS instance_id, k.method FROM keyed k JOIN firsts f USING (key)
"""
    )
    .replace("{_PAIR_ROWS}", _PAIR_ROWS)
    .replace("{_FIRST_ARRIVAL}", _FIRST_ARRIVAL)
)


#: Step 0 (module doc): the members of a group a row's own trace does not list, from the run's
#: other rows of that source and group name (one known member set holding the row's rank).
_FILL_RANKS = """
UPDATE collectives c SET pg_ranks = k.pg_ranks
FROM (
  SELECT u.source, u.pg, u.rank, any_value(k.pg_ranks) AS pg_ranks
  FROM (SELECT DISTINCT source, pg, rank FROM collectives
        WHERE run_id = $1 AND pg_ranks IS NULL AND pg IS NOT NULL) u
  JOIN (SELECT DISTINCT source, pg, pg_ranks FROM collectives
        WHERE run_id = $1 AND pg_ranks IS NOT NULL AND pg IS NOT NULL) k
    ON k.source = u.source AND k.pg = u.pg AND list_contains(try_cast(k.pg_ranks AS INTEGER[]), u.rank)
  GROUP BY u.source, u.pg, u.rank HAVING count(DISTINCT k.pg_ranks) = 1
) k
WHERE c.run_id = $1 AND c.pg_ranks IS NULL AND c.source = k.source AND c.pg = k.pg AND c.rank = k.rank
"""


def _assign(store: Store, run_id: int) -> tuple[int, list[str]]:
    """Set ``instance_id`` and ``match_method`` of every matchable row of the run (module doc,
    steps 1 to 4) in SQL, on the store's connection (no polars: an ingest of one rank file imports
    none). Returns (the run's collectives rows, the notes of step 3)."""
    con = store.con
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _match_rows AS "
        "SELECT *, coalesce(pg, '') AS g_pg, coalesce(pg_ranks, '') AS g_ranks FROM ("
        + _ROWS_OF_TABLE.replace("$run", str(int(run_id)))
        + ")"
    )
    try:
        n = int(con.execute("SELECT count(*) FROM _match_rows").fetchall()[0][0])
        if not n:
            return 0, []
        con.execute(f"CREATE OR REPLACE TEMP TABLE _match_bad AS {_BAD}")
        notes = [
            f"source {source}, process group {g_pg!r}{' ' + g_ranks if g_ranks else ''} "
            f"({'point-to-point' if p2p else 'collectives'}): {why}, so they cannot be per group; "
            + (
                "left unmatched (no instance, no clock alignment through them): which ranks share one "
                "collective is unknown"
                if lost
                else "a send and a recv that name their peer matched as the k-th transfer between those two "
                "ranks (match_method pair_order), the others left unmatched"
                if p2p
                else "matched by order within the step instead (match_method step_order)"
            )
            for source, g_pg, g_ranks, p2p, why, lost in con.execute("SELECT * FROM _match_bad").fetchall()
        ]
        con.execute(f"CREATE OR REPLACE TEMP TABLE _match_pairs AS {_PAIRS}")
        uneven = con.execute(
            """SELECT source, g_pg, g_ranks, list((_src, _dst, sends, recvs) ORDER BY _src, _dst) FROM _match_pairs
               WHERE sends <> recvs AND sends > 0 AND recvs > 0 GROUP BY ALL ORDER BY ALL"""
        ).fetchall()
        notes += [
            f"source {source}, process group {g_pg!r}{' ' + g_ranks if g_ranks else ''} (point-to-point): "
            + "; ".join(
                f"rank {a} sent {s} transfer{'s' if s > 1 else ''} to rank {b}, which received {r}"
                for a, b, s, r in pairs
            )
            + ": one end's trace lacks some, so the k-th of each end need not be the same transfer; "
            f"{'these directions were' if len(pairs) > 1 else 'this direction was'} left unmatched"
            for source, g_pg, g_ranks, pairs in uneven
        ]
        mixed = con.execute(
            "SELECT bool_or(stepless) AND NOT bool_and(stepless) FROM _match_rows"
        ).fetchall()[0][0]
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _match_shift AS {_SHIFTS}"
            if mixed
            else "CREATE OR REPLACE TEMP TABLE _match_shift (source VARCHAR, g_pg VARCHAR, g_ranks VARCHAR, "
            "p2p BOOLEAN, rank INTEGER, _op VARCHAR, _size VARCHAR, ref INTEGER, j BIGINT, gap DOUBLE, "
            "gap0 DOUBLE, spacing DOUBLE)"
        )
        con.execute(
            f"""UPDATE collectives SET instance_id = m.instance_id, match_method = m.method
               FROM ({_KEYED}) m WHERE collectives.rowid = m.rid"""
        )
        by_run = con.execute(
            """SELECT m.source, m.g_pg, m.g_ranks, list(DISTINCT m.rank ORDER BY m.rank) FILTER (WHERE m.stepless)
               FROM _match_rows m JOIN collectives c ON c.rowid = m.rid
               WHERE c.match_method IN ('ordinal', 'step_order')
               GROUP BY ALL HAVING bool_or(m.stepless) AND NOT bool_and(m.stepless) ORDER BY ALL"""
        ).fetchall()
        notes += [
            f"source {source}, process group {g_pg!r}{' ' + g_ranks if g_ranks else ''}: "
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
            f"{'have' if len(ranks) > 1 else 'has'} no steps (no ProfilerStep in the trace), so its collectives "
            "without sequence numbers were matched by their order over the run (the k-th of each op and size "
            "on every rank) instead of within the step: right when every rank's trace covers the same steps"
            for source, g_pg, g_ranks, ranks in by_run
        ]
        lost = con.execute(
            """SELECT rank, list(DISTINCT lost_step ORDER BY lost_step), count(*) FROM _match_rows
               WHERE lost_step IS NOT NULL GROUP BY rank ORDER BY rank"""
        ).fetchall()
        notes += [
            f"rank {r} has {n} collective(s) outside its steps, at the time of step{'s' if len(ss) > 1 else ''} "
            f"{', '.join(map(str, ss))} on another rank of its host (one clock), which it lacks (a lost "
            "ProfilerStep): matched within that step"
            for r, ss, n in lost
        ]
        shifted = con.execute(
            """SELECT source, g_pg, g_ranks, rank, any_value(ref), list(DISTINCT j ORDER BY j), max(gap), min(gap0),
                      min(spacing)
               FROM _match_shift GROUP BY source, g_pg, g_ranks, rank HAVING bool_or(j <> 0) ORDER BY ALL"""
        ).fetchall()
        notes += [
            f"source {source}, process group {g_pg!r}{' ' + g_ranks if g_ranks else ''}: rank {r} (no steps) "
            f"shares rank {ref}'s host (one clock), so its collectives were lined up with rank {ref}'s by their "
            f"times, its k-th of a kind rank {ref}'s (k {' or '.join(f'{j:+d}' for j in js)})-th: they arrive a "
            f"median {_ms(gap)} apart so and "
            + (f"{_ms(gap0)}" if gap0 is not None else "none paired")
            + f" by run order (collectives of a kind {_ms(spacing)} apart)"
            for source, g_pg, g_ranks, r, ref, js, gap, gap0, spacing in shifted
        ]
        return n, notes
    finally:  # after a failed statement the transaction is aborted (its error is the one to raise)
        with contextlib.suppress(duckdb.Error):
            con.execute("DROP TABLE IF EXISTS _match_rows")
            con.execute("DROP TABLE IF EXISTS _match_bad")
            con.execute("DROP TABLE IF EXISTS _match_shift")
            con.execute("DROP TABLE IF EXISTS _match_pairs")


#: Collectives rows (about) whose instances :func:`refresh_instances` aggregates in one statement: DuckDB
#: holds the per-instance lists and modes of a statement in memory, which it cannot spill (2 ranks x
#: 100,000 instances took more than the ingest's 96 MB on two threads).
INSTANCE_CHUNK_ROWS = 20_000

#: An instance's last arrival (ns), the aggregate form as :data:`_FIRST_ARRIVAL`; each row's arrival
#: on its instance's clock, the window form (``c``'s rows, one instance's rows per partition).
_LAST_ARRIVAL = one_clock_sql("arr1", "arr2", agg="max")
_ROW_ARRIVAL = one_clock_sql("arr1", "arr2", over="PARTITION BY instance_id")

#: ``collective_instances`` rows of the instances ``$lo``..``$hi`` (``ordinal`` left to
#: :func:`refresh_instances`: it counts over the whole run). Reads ``_run_steps`` (:data:`RUN_STEPS_SQL`).
_INSTANCES = f"""
WITH rs AS (FROM _run_steps),
c AS (
  SELECT rank, source, pg, pg_ranks, {_IS_P2P_SQL} AS p2p, seq, op, coalesce(rs.run_step, step) AS step,
         instance_id, match_method, coalesce(bytes_in, nelems_in) AS size, {ARRIVAL_FIRST_SQL} AS arr1,
         {ARRIVAL_NEXT_SQL} AS arr2, end_ns, peer
  FROM collectives LEFT JOIN rs USING (rank, step)
  WHERE run_id = $run AND instance_id BETWEEN $lo AND $hi
),
members AS (  -- over the whole run, not the chunk
  SELECT source, coalesce(pg, '') AS g, coalesce(pg_ranks, '') AS gr, list(DISTINCT rank ORDER BY rank) AS ranks
  FROM collectives WHERE run_id = $run AND instance_id IS NOT NULL GROUP BY ALL
),
-- each rank's first sequence number per group and family: a rank whose record starts later (a
-- Flight Recorder ring buffer that wrapped, a profiler started later) is not missing before it
held AS (
  SELECT source, coalesce(pg, '') AS g, coalesce(pg_ranks, '') AS gr, {_IS_P2P_SQL} AS p2p, rank,
         min(seq) AS first_seq
  FROM collectives WHERE run_id = $run AND seq IS NOT NULL GROUP BY ALL
),
inst AS (
  SELECT instance_id, any_value(source) AS source, any_value(pg) AS pg, any_value(pg_ranks) AS pg_ranks,
         bool_or(p2p) AS p2p,
         CASE WHEN any_value(match_method) IN ('pg_seq', 'comms_id') THEN any_value(seq) END AS seq,
         max(size) AS bytes,
         list(DISTINCT rank ORDER BY rank) AS ranks_present,
         count(DISTINCT rank)::INTEGER AS n_ranks,
         -- one clock per instance (INSTANCE_ARRIVAL_SQL), its aggregate form
         {_FIRST_ARRIVAL} AS first_arrival_ns, {_LAST_ARRIVAL} AS last_arrival_ns,
         min(end_ns) AS first_end_ns, max(end_ns) AS last_end_ns,
         any_value(match_method) AS match_method, list(DISTINCT peer) FILTER (WHERE peer IS NOT NULL) AS peers
  FROM c GROUP BY instance_id
),
-- the instance's op and step (module doc, step 5): the most common of its rows'
-- (NULLs aside), on a tie the smallest; a send and its recv: 'send/recv'. Not mode(): on a tie it
-- returns the value it met first, so the answer followed the rows' order
ops AS (
  SELECT instance_id, CASE WHEN list_sort(list(op)) = ['recv', 'send'] THEN 'send/recv'
                           ELSE first(op ORDER BY n DESC, op) END AS op
  FROM (SELECT instance_id, op, count(*) AS n FROM c WHERE op IS NOT NULL GROUP BY ALL) GROUP BY instance_id
),
steps AS (
  SELECT instance_id, first(step ORDER BY n DESC, step) AS step
  FROM (SELECT instance_id, step, count(*) AS n FROM c WHERE step IS NOT NULL GROUP BY ALL) GROUP BY instance_id
),
lasts AS (
  SELECT c.instance_id, CASE WHEN count(DISTINCT c.rank) = 1 THEN min(c.rank) END AS last_rank
  FROM (SELECT instance_id, rank, {_ROW_ARRIVAL} AS arr FROM c) c  -- each row's arrival on the one clock
  JOIN inst i ON i.instance_id = c.instance_id AND c.arr = i.last_arrival_ns
  GROUP BY c.instance_id
)
SELECT $run AS run_id, i.instance_id, i.source, i.pg, i.pg_ranks, i.p2p, i.seq, o.op, s.step, i.bytes,
       i.ranks_present,
       CASE WHEN i.match_method = 'pair_order'  -- a transfer's two ends, not its group
            THEN list_filter(i.peers, lambda x: NOT list_contains(i.ranks_present, x))
            ELSE list_filter(coalesce(try_cast(i.pg_ranks AS INTEGER[]), m.ranks),
                             lambda x: NOT list_contains(i.ranks_present, x)
                                       AND NOT list_contains(coalesce(w.later, []::INTEGER[]), x)) END
         AS ranks_missing,
       i.n_ranks, i.first_arrival_ns, i.last_arrival_ns, l.last_rank,
       i.last_arrival_ns - i.first_arrival_ns AS arrival_skew_ns,
       i.first_end_ns, i.last_end_ns, i.match_method
FROM inst i JOIN members m ON m.source = i.source AND m.g = coalesce(i.pg, '') AND m.gr = coalesce(i.pg_ranks, '')
LEFT JOIN lasts l ON l.instance_id = i.instance_id
LEFT JOIN ops o ON o.instance_id = i.instance_id
LEFT JOIN steps s ON s.instance_id = i.instance_id
LEFT JOIN (
  SELECT i.instance_id, list(h.rank) AS later FROM inst i
  JOIN held h ON h.source = i.source AND h.g = coalesce(i.pg, '') AND h.gr = coalesce(i.pg_ranks, '')
   AND h.p2p = i.p2p AND h.first_seq > i.seq
  WHERE i.seq IS NOT NULL GROUP BY i.instance_id
) w ON w.instance_id = i.instance_id
"""


def match_run(store: Store, run_id: int) -> MatchSummary:
    """Match every collective of a run across ranks (module doc) and fill ``collective_instances``.

    Overwrites ``collectives.instance_id`` / ``match_method`` and the run's instances. Runs on the
    store's connection, so inside the caller's transaction when there is one.

    Args:
        store: A writable store.
        run_id: The run.

    Returns:
        A :class:`MatchSummary`.

    Raises:
        StoreError: DuckDB rejects a statement.
    """
    con, run = store.con, str(int(run_id))
    con.execute("UPDATE collectives SET instance_id = NULL, match_method = NULL WHERE run_id = ?", [run_id])
    con.execute(_FILL_RANKS, [run_id])
    # the steps' alignment once (it was computed for each of its three readers: 0.06 s of 0.21 s
    # on hta/df_index_resolver); matching changes no column it reads
    con.execute(f"CREATE OR REPLACE TEMP TABLE _steps_map AS {_STEPS_MAP.replace('$run', run)}")
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _run_steps AS SELECT rank, step, run_step FROM _steps_map")
        rows, notes = _assign(store, run_id)
        notes += _shift_notes(con.execute(_SHIFTS_OF.replace("$rows", "_steps_map WHERE shifted")))
        refresh_instances(store, run_id, steps_made=True)
    finally:  # after a failed statement the transaction is aborted (its error is the one to raise)
        with contextlib.suppress(duckdb.Error):
            con.execute("DROP TABLE IF EXISTS _steps_map")
            con.execute("DROP TABLE IF EXISTS _run_steps")
    stats = con.execute(
        """SELECT match_method, count(*) AS n, count(*) FILTER (WHERE len(ranks_missing) > 0) AS inc
           FROM collective_instances WHERE run_id = ? GROUP BY ALL""",
        [run_id],
    ).fetchall()
    return MatchSummary(
        rows=rows,
        instances=sum(int(n) for _, n, _ in stats),
        by_method={m: int(n) for m, n, _ in stats},
        incomplete=sum(int(inc) for _, _, inc in stats),
        unmatched_p2p=unmatched_p2p(store, run_id),
        notes=tuple(notes),
    )


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3g} ms"


def step_shift_notes(store: Store, run_id: int) -> list[str]:
    """One note per rank whose steps :data:`RUN_STEPS_SQL` lined up off their numbers, with the evidence
    (on the reference's host, its steps start closer to the reference's that way than by step number;
    elsewhere, its collectives differ from the reference's by step number and agree that way)."""
    return _shift_notes(store.con.execute(STEP_SHIFTS_SQL.replace("$run", str(int(run_id)))))


def _shift_notes(result: Any) -> list[str]:
    """:func:`step_shift_notes` of the rows of :data:`STEP_SHIFTS_SQL` (a DuckDB result)."""
    rows = result.fetchall()
    return [
        f"rank {r} numbers its steps #{lo}..#{hi} where rank {ref} numbers the same steps #{ref_lo}..#{ref_hi} "
        f"(offset {ref_lo - lo:+d}): "
        + (
            f"on rank {ref}'s host, its steps start a median {_ms(gap)} from rank {ref}'s lined up so and "
            + (f"{_ms(gap_number)}" if gap_number is not None else "none lined up")
            + f" by step number (steps of {_ms(step_len)})"
            if gap is not None
            else f"its collectives differ from rank {ref}'s in {by_number} step(s) lined up by step number and "
            f"agree in {agree} lined up so"
        )
        + f", so they are taken as rank {ref}'s steps"
        for r, lo, hi, ref, ref_lo, ref_hi, agree, by_number, gap, gap_number, step_len in rows
    ]


def stepless_notes(store: Store, run_id: int) -> list[str]:
    """The ranks without steps (no ProfilerStep in their traces) whose collectives without sequence
    numbers were matched with those of ranks that have steps, by their order over the run (module doc,
    step 4), in one note (the summary's coverage; ingest says it per process group); empty when none."""
    (ranks,) = store.con.execute(
        """WITH stepped AS (SELECT DISTINCT rank FROM steps WHERE run_id = $1 AND step IS NOT NULL)
           SELECT list(DISTINCT c.rank ORDER BY c.rank) FROM collectives c
           WHERE c.run_id = $1 AND c.match_method IN ('ordinal', 'step_order')
             AND c.rank NOT IN (SELECT rank FROM stepped)
             AND c.instance_id IN (SELECT instance_id FROM collectives
                                   WHERE run_id = $1 AND rank IN (SELECT rank FROM stepped))""",
        [run_id],
    ).fetchone() or (None,)
    if not ranks:
        return []
    many = len(ranks) > 1
    return [
        f"rank{'s' if many else ''} {', '.join(map(str, ranks))} {'have' if many else 'has'} no steps (no "
        f"ProfilerStep in {'their traces' if many else 'its trace'}): {'their' if many else 'its'} collectives "
        "without sequence numbers were matched with the other ranks' by their order over the run"
    ]


def unmatched_p2p(store: Store, run_id: int) -> int:
    """Point-to-point rows of a run that matching left unmatched (module doc, step 4)."""
    return int(
        store.con.execute(
            f"""SELECT count(*) AS n FROM collectives
            WHERE run_id = ? AND instance_id IS NULL AND {_IS_P2P_SQL}""",
            [run_id],
        ).fetchall()[0][0]
    )


def fallback_note(store: Store, run_id: int) -> str | None:
    """A note when some instances of the run were matched by order within the step because their
    sequence numbers cannot be per group (module doc, step 3); None otherwise."""
    df = store.sql(
        """SELECT source, coalesce(pg, '?') AS pg, count(*) AS n FROM collective_instances
           WHERE run_id = ? AND match_method = 'step_order' GROUP BY ALL ORDER BY source, pg""",
        [run_id],
    )
    if df.is_empty():
        return None
    groups = ", ".join(f"{r['source']} pg {r['pg']} ({r['n']})" for r in df.iter_rows(named=True))
    return (
        f"sequence numbers that cannot be per process group (pairs in different steps, or strides that differ "
        f"across ranks) were ignored: {groups} instances matched by order within the step instead"
    )


def arrival_clock_note(store: Store, run_id: int, source: str | None = None) -> str | None:
    """A note when some instances of the run (of ``source``; None: every source) compare their ranks'
    other arrival clock (:data:`INSTANCE_ARRIVAL_SQL`: on GPU sources the CPU enqueue, a rank's
    record lacking the kernel start) or have no arrival (one rank holds only the one clock, another
    only the other); None when every instance reads its preferred clock.

    Source fields read: ``collectives.source``, ``instance_id``, ``start_ns``, ``enter_ns``.

    Raises:
        StoreError: DuckDB rejects the statement.
    """
    df = store.sql(
        f"""SELECT source, clock, count(*) AS n, any_value(n_all) AS n_all FROM (
              SELECT source, instance_id, any_value(clock) AS clock, any_value(n_all) AS n_all FROM (
                SELECT source, instance_id, {ARRIVAL_CLOCK_SQL} AS clock,
                       count(DISTINCT instance_id) OVER (PARTITION BY source) AS n_all
                FROM collectives WHERE run_id = $1 AND instance_id IS NOT NULL AND ($2 IS NULL OR source = $2))
              GROUP BY ALL)
            WHERE clock <> 'first' GROUP BY ALL ORDER BY source, clock""",
        [run_id, source],
    )
    if df.is_empty():
        return None
    parts = []
    for r in df.iter_rows(named=True):
        gpu = r["source"] in (CollectiveSource.nccl_kernel, CollectiveSource.nccl_inspector)
        first, other = ("kernel start", "CPU enqueue") if gpu else ("CPU enqueue", "start of the work")
        if r["clock"] == "next":
            parts.append(
                f"{r['source']}: {r['n']} of {r['n_all']} instances compare every rank's {other} time (a rank's "
                f"record lacks the {first}; one clock per instance, else the gap between the two would count "
                f"as skew)"
            )
        else:
            parts.append(
                f"{r['source']}: {r['n']} of {r['n_all']} instances have no arrival, skew and waits unknown (a "
                f"rank's record holds only the {first}, another's only the {other})"
            )
    return "arrival clock: " + "; ".join(parts)


def refresh_instances(store: Store, run_id: int, *, steps_made: bool = False) -> None:
    """Recompute the run's ``collective_instances`` rows from its matched collectives (after
    matching, and again after clock alignment moved the arrivals). ``steps_made``: ``_run_steps``
    holds :data:`RUN_STEPS_SQL` already (:func:`match_run`); the caller drops it.

    Raises:
        StoreError: DuckDB rejects a statement.
    """
    con, run = store.con, str(int(run_id))
    con.execute("DELETE FROM collective_instances WHERE run_id = ?", [run_id])
    rows, top = con.execute(
        "SELECT count(*), max(instance_id) FROM collectives WHERE run_id = ? AND instance_id IS NOT NULL",
        [run_id],
    ).fetchall()[0]
    if not rows:
        return
    # instance ids are 1..top; ranges of about INSTANCE_CHUNK_ROWS rows each
    width = -(-int(top) // -(-int(rows) // INSTANCE_CHUNK_ROWS))
    con.execute("CREATE OR REPLACE TEMP TABLE _instances AS FROM collective_instances LIMIT 0")
    if not steps_made:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _run_steps AS {RUN_STEPS_SQL.replace('$run', run)}")
    try:
        for lo in range(1, int(top) + 1, width):
            sql = _INSTANCES.replace("$run", run).replace("$lo", str(lo)).replace("$hi", str(lo + width - 1))
            con.execute(f"INSERT INTO _instances BY NAME {sql}")
        con.execute(
            """INSERT INTO collective_instances BY NAME
               SELECT * REPLACE ((row_number() OVER (PARTITION BY source, pg, pg_ranks, op, bytes, step
                                                     ORDER BY instance_id) - 1)::INTEGER AS ordinal)
               FROM _instances"""
        )
    finally:  # after a failed statement the transaction is aborted (its error is the one to raise)
        with contextlib.suppress(duckdb.Error):
            con.execute("DROP TABLE IF EXISTS _instances")
            if not steps_made:
                con.execute("DROP TABLE IF EXISTS _run_steps")


def preferred_source(store: Store, run_id: int) -> str | None:
    """The collectives source to analyse when a run has several (e.g. Kineto and Flight Recorder
    rows of the same all-reduces): the one with the most instances seen by two or more ranks,
    preferring sources that know end times. None when the run has no matched instance."""
    df = store.sql(
        """SELECT source, count(*) FILTER (WHERE n_ranks >= 2) AS multi,
                  count(*) FILTER (WHERE n_ranks >= 2 AND last_end_ns IS NOT NULL) AS with_end
           FROM collective_instances WHERE run_id = ? GROUP BY source
           ORDER BY with_end DESC, multi DESC, source""",
        [run_id],
    )
    return None if df.is_empty() else str(df["source"][0])
