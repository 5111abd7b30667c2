"""Near-copies of a rank file: a small sample of a trace's events that two files share only when
one is the other with a few events edited or removed.

Two ranks of one job are two processes: their events start at times (ns) of their own, so no
(name, start, duration) triple of one rank recurs in another's trace but by chance. A rank file
copied, its rank (and host) edited and an event or a few removed (t15 F5b: one ``aten::mm``) has a
digest of its own (``traceprof.ingest.copies.events_digest``) yet nearly all its events at the other
file's times. The rule:

  1. Each event is hashed to 64 bits from its name, ``ts_ns`` and ``dur_ns`` (not its pid, tid or
     args, which an edit may change); a trace's *sketch* is the :data:`SKETCH` smallest distinct
     hashes (a bottom-k MinHash sample), or None under :data:`MIN_EVENTS` distinct events (too few
     to tell a copy from a coincidence).
  2. Two sketches estimate the share of events two traces hold in common (Jaccard): of the
     :data:`SKETCH` smallest hashes of both together, those in each. At :data:`NEAR` or above the
     two are a copy of one process's trace; independent ranks share none (every sample_traces and
     corpus multi-rank folder: 0 of 128).
  3. Candidates are found in linear time: traces are bucketed by each value of their sketch, and
     each trace is compared with the first trace of every bucket it falls in (independent ranks
     fall in buckets of their own; a copy, in its original's).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, TypeVar

from traceprof.core.lazy import lazy

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    np = lazy("numpy")
    pa = lazy("pyarrow")
    pc = lazy("pyarrow.compute")

__all__ = ["events_sketch", "shared", "near", "near_pairs", "SKETCH", "NEAR", "MIN_EVENTS"]

#: Hashes kept per trace (bottom-k): the estimate's standard error is at most 1 / (2 sqrt(k)), 4.4 %.
SKETCH = 128
#: The least distinct events a trace needs for a sketch: below it, a few identical events (two
#: hand-built traces of one op at one time) prove nothing.
MIN_EVENTS = 16
#: The share of events in common (estimated) at which two traces are one process's.
NEAR = 0.9
T = TypeVar("T")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _text_hash(text: object) -> int:
    """A 64-bit hash of a name (BLAKE2b, stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(str(text).encode(), digest_size=8).digest(), "little")


def events_sketch(events: pa.Table | None) -> tuple[int, ...] | None:
    """Rule 1 of the module doc: the :data:`SKETCH` smallest distinct 64-bit hashes of
    ``events``' (name, ts_ns, dur_ns), ascending, or None when the table holds fewer than
    :data:`MIN_EVENTS` distinct ones (or no ``name``/``ts_ns``/``dur_ns`` column).

    Reads the columns ``name``, ``ts_ns`` (ns) and ``dur_ns`` (ns); nulls hash as an empty name or
    0. Linear in the rows (the names hashed once each; a partition, not a sort, of the hashes)."""
    if events is None or events.num_rows == 0:
        return None
    if not {"name", "ts_ns", "dur_ns"} <= set(events.column_names):
        return None
    names = events["name"].combine_chunks()
    if not pa.types.is_dictionary(names.type):
        names = names.cast(pa.string()).dictionary_encode()
    by_name = np.array(  # one hash per distinct name, and one more for a null name
        [_text_hash(v) for v in names.dictionary.to_pylist()] + [0],
        dtype=np.uint64,
    )
    idx = pc.fill_null(names.indices, len(names.dictionary)).to_numpy(zero_copy_only=False)
    ts, dur = (
        pc.fill_null(events[c], 0).cast(pa.int64()).to_numpy().view(np.uint64) for c in ("ts_ns", "dur_ns")
    )
    with np.errstate(over="ignore"):
        h = _mix(ts * np.uint64(0x9E3779B97F4A7C15) + dur * np.uint64(0xD6E8FEB86659FD93) ^ by_name[idx])
    k = 32 * SKETCH
    low = np.unique(np.partition(h, k)[:k] if h.size > k else h)
    if low.size < SKETCH and h.size > k:  # many repeats among the smallest: all of them
        low = np.unique(h)
    if low.size < MIN_EVENTS:
        return None
    return tuple(int(v) for v in low[:SKETCH])


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int]:
    """Rule 2 of the module doc: (hashes in both, hashes sampled) among the :data:`SKETCH`
    smallest of the two sketches together; their ratio estimates the share of events in common."""
    both = set(a) & set(b)
    union = sorted(set(a) | set(b))[:SKETCH]
    return sum(1 for v in union if v in both), len(union)


def near(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int] | None:
    """(shared, sampled) of two sketches (:func:`shared`) when they share at least :data:`NEAR` of
    their sample (one process's trace: rule 2 of the module doc), else None."""
    n, of = shared(a, b)
    return (n, of) if n >= NEAR * of else None


def near_pairs(sketched: list[tuple[T, tuple[int, ...]]]) -> list[tuple[T, T, int, int]]:
    """Rule 3 of the module doc: pairs (earlier, later, shared, sampled) of ``sketched`` items
    (item, sketch), in their order, whose sketches share at least :data:`NEAR` of their sample.
    Linear in the items (each compared with at most :data:`SKETCH` others, in practice none)."""
    first: dict[int, int] = {}
    found: list[tuple[T, T, int, int]] = []
    for i, (item, sk) in enumerate(sketched):
        seen: set[int] = set()
        for v in sk:
            j = first.setdefault(v, i)
            if j == i or j in seen:
                continue
            seen.add(j)
            got = near(sketched[j][1], sk)
            if got is not None:
                found.append((sketched[j][0], item, *got))
                break
    return found
