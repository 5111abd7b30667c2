"""Column-at-a-time passes over a parsed Kineto trace: the class of every GPU row and the step of
every row (``traceprof.collectors.kineto.parse``, module doc steps 3-4).

The parser's rows are columns (``traceprof.collectors.kineto.decode.Rows``: strings as lists, integers as
numpy arrays, ``args`` an Arrow string column); :class:`Frame` adds the encodings the passes share,
and each pass works on whole columns: names and
kinds dictionary-encoded (each distinct name classified once), the args searched with one
vectorized regex (JSON decoded only for the rows it hits), steps found with ``np.searchsorted``,
launch-call lookups by correlation id with sorted arrays.

Source fields read: events ``kind``, ``name``, ``ts_ns``, ``dur_ns``, ``correlation``,
``external_id``, ``flag``, ``args`` (``Collective name``, ``Process Group Name``, ... of
``traceprof.core.classify.COMM_ARG_KEYS``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceprof.collectors._arrow import chunk_starts, values_at
from traceprof.collectors.kineto._values import STR_DICT, Ints, Strs, meta_dict
from traceprof.core import spill
from traceprof.core.classify import KEPT_FLAGS, Classifier, has_comm_args
from traceprof.core.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS

__all__ = [
    "Frame",
    "COMM_HINT",
    "GPU_KINDS",
    "STR_DICT",
    "classes",
    "assign_steps",
    "first_by_key",
    "PAIRING",
    "lookup",
    "codes",
    "kind_mask",
]

#: Fragments of the args text that mark communication (a cheap test before decoding the args; RE2
#: and Python ``re`` read this literal alternation the same way).
COMM_HINT = "Collective name|Process Group|Comms Id|collective_name|process_group|pg_name"
#: Kinds of the rows that run on a GPU lane (device / stream from the args or the pid / tid).
GPU_KINDS = frozenset({"kernel", "memcpy", "memset", "gpu_user_annotation", "sync"})


def codes(values: Strs | list[str]) -> tuple[np.ndarray, list[str]]:
    """(index of each value in the distinct values (int8, int16 or int32; -1 for None), the
    distinct values) of a string column: a :class:`Strs`'s own, or a list's through Arrow's
    dictionary builder."""
    s = values if isinstance(values, Strs) else Strs.of(values)
    return s.codes, s.values


def kind_mask(kind: Strs | list[str]) -> Callable[[Iterable[str]], np.ndarray]:
    """A function of a set of kinds that gives the rows (of the ``kind`` column) of those kinds."""
    code, distinct = codes(kind)
    return lambda kinds: _rows_of(code, distinct, kinds)


def _rows_of(code: np.ndarray, distinct: list[str], kinds: Iterable[str]) -> np.ndarray:
    """The rows (of a column encoded by :func:`codes`) whose value is one of ``kinds``."""
    wanted = set(kinds)
    return np.isin(code, [i for i, k in enumerate(distinct) if k in wanted])


class Frame:
    """numpy views of the parser's columns, built once after the rows are final.

    Attributes:
        n: Rows.
        kind_code, kinds: Kind of each row as an index into ``kinds`` (the distinct kinds).
        name_code, names: The same for ``name``.
        ts, dur: int64 ns.
        corr, corr_ok / ext, ext_ok: ``correlation`` / ``external_id`` (0 where None) and presence.
        unflagged: ``flag`` is None.
        args: The args JSON text (Arrow string column).
    """

    def __init__(self, cols: dict[str, Any]) -> None:
        self.n = len(cols["kind"])
        self.kind_code, self.kinds = codes(cols["kind"])
        self.name_code, self.names = codes(cols["name"])
        self.ts = np.asarray(cols["ts_ns"], np.int64)
        self.dur = np.asarray(cols["dur_ns"], np.int64)
        self.corr, self.corr_ok = cols["correlation"].values, cols["correlation"].ok
        self.ext, self.ext_ok = cols["external_id"].values, cols["external_id"].ok
        self.unflagged = cols["flag"].is_none()
        self.args = cols["args"]
        self._chunk_at: np.ndarray | None = None  # first row of each chunk of ``args``

    def kind_in(self, kinds: Iterable[str]) -> np.ndarray:
        """Rows whose kind is one of ``kinds``."""
        return _rows_of(self.kind_code, self.kinds, kinds)

    def args_of(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        """The args of ``rows`` (indices), decoded for :data:`traceprof.collectors.kineto._values.META_KEYS`
        only (``meta_dict``); their texts are taken :data:`_ARGS_AT_ONCE` at a time."""
        for at in range(0, len(rows), _ARGS_AT_ONCE):
            yield from map(meta_dict, self.args_text(np.asarray(rows[at : at + _ARGS_AT_ONCE], np.int64)))

    def args_text(self, rows: np.ndarray) -> list[str]:
        """The args texts of ``rows`` (indices), taken a chunk at a time: ``take`` on the whole
        chunked column concatenates its chunks first (a transient copy of all the args text)."""
        args = self.args
        if isinstance(args, pa.Array):
            return values_at(args, rows)
        if self._chunk_at is None:
            self._chunk_at = chunk_starts(args)
        out = values_at(args, rows, self._chunk_at)
        spill.note_read(4096 * len(rows))  # spilled args: drop the pages read now and then
        return out


#: Args texts made into Python strings at once by :meth:`Frame.args_of`.
_ARGS_AT_ONCE = 8192


def first_by_key(keys: np.ndarray, ts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, the value of each key's earliest row by ``ts``; of rows that start
    together, the first): the launch call a correlation id stands for (:data:`PAIRING`)."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    if len(k) > 1 and (k[1:] == k[:-1]).any():  # an id on several rows: the earliest of them
        order = np.lexsort((ts, keys))  # stable: of equal (key, ts), the first row
        k = keys[order]
    first = np.concatenate(([True], k[1:] != k[:-1])) if len(k) else np.zeros(0, bool)
    return k[first], values[order[first]]


#: How a GPU row finds the runtime call that launched it, everywhere (the parser's steps, classes and
#: collectives here; the ``kernels`` view and ``traceprof.engine.activity`` in SQL): the call with its
#: correlation id, and where a broken trace gives several calls one id (the parser warns,
#: ``traceprof.collectors.kineto.checks.shared_correlation_warning``), the one that starts first.
PAIRING = "the earliest runtime call with the GPU row's correlation id"


def lookup(uniq: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position in ``uniq`` of each key, whether it is there) for sorted distinct ``uniq``."""
    pos = np.searchsorted(uniq, keys)
    pos = np.minimum(pos, max(len(uniq) - 1, 0))
    found = (uniq[pos] == keys) if len(uniq) else np.zeros(len(keys), bool)
    return pos, found


def _hint_read(f: Frame, gpu: np.ndarray, launch: np.ndarray, act: np.ndarray) -> np.ndarray:
    """The rows whose :data:`COMM_HINT` :func:`classes` reads: CPU rows with an External id and GPU
    activity rows. The regex runs on those alone (runtime calls, instants and CPU rows without an
    External id are skipped: 45% of the args text of ``hta/df_index_resolver``, 15 ms of CPU)."""
    return (~gpu & ~launch & f.ext_ok) | act


def _hinted(args: pa.Array) -> np.ndarray:
    """Whether each args text matches :data:`COMM_HINT` (False for null)."""
    return pc.fill_null(pc.match_substring_regex(args, COMM_HINT), False).to_numpy(zero_copy_only=False)


def classes(f: Frame, classifier: Classifier) -> Strs:
    """``class`` of every row (``traceprof.core.classify``): GPU activity rows get comm / memory / compute
    from their own args, the args of the CPU op with their ``External id`` (the op that launched
    them; a GPU row without its own ``External id`` reaches it through its runtime call's
    ``correlation``) and their name; other rows None.

    Returns:
        One value per row of ``f`` (None for rows that are not GPU activity).
    """
    gpu, launch, act = f.kind_in(GPU_KINDS), f.kind_in(set(LAUNCH_KINDS)), f.kind_in(set(GPU_ACTIVITY_KINDS))
    need = _hint_read(f, gpu, launch, act)
    hint = np.zeros(f.n, bool)
    at = 0
    for chunk in spill.chunks(f.args):  # a chunk at a time: spilled args stay off the resident set
        part = need[at : at + len(chunk)]
        if part.all():
            hint[at : at + len(chunk)] = _hinted(chunk)
        elif part.any():
            hint[at + np.flatnonzero(part)] = _hinted(chunk.filter(pa.array(part)))
        at += len(chunk)
    del need
    ops = np.flatnonzero(~gpu & ~launch & f.ext_ok & hint)
    comm_ext = np.unique(f.ext[ops][np.fromiter(map(has_comm_args, f.args_of(ops)), bool, len(ops))])
    rows = np.flatnonzero(act)  # the GPU activity rows: everything below is one value per such row
    comm = np.zeros(len(rows), bool)  # launched by a CPU op with communication args
    if len(comm_ext):
        ext, ext_ok = f.ext[rows], f.ext_ok[rows]
        lc = np.flatnonzero(launch & f.corr_ok)
        uniq, last = first_by_key(f.corr[lc], f.ts[lc], lc)  # the runtime call of each correlation id
        del lc
        need = np.flatnonzero(~ext_ok & f.corr_ok[rows])
        pos, found = lookup(uniq, f.corr[rows[need]])
        via = last[pos[found]]
        ext[need[found]], ext_ok[need[found]] = f.ext[via], f.ext_ok[via]
        del uniq, last, need, pos, found, via
        comm = ext_ok & np.isin(ext, comm_ext)
        del ext, ext_ok
    hits = np.flatnonzero(hint[rows])  # positions in rows
    comm[hits] |= np.fromiter(map(has_comm_args, f.args_of(rows[hits])), bool, len(hits))
    del hint, hits
    key = (f.name_code[rows].astype(np.int64) * len(f.kinds) + f.kind_code[rows]) * 2 + comm
    uniq_keys, inv = np.unique(key, return_inverse=True)
    per_key = [
        classifier.gpu_class_of(
            f.kinds[(k >> 1) % len(f.kinds)], f.names[(k >> 1) // len(f.kinds)], bool(k & 1)
        )
        for k in uniq_keys.tolist()
    ]
    out = Strs.none(f.n)
    if len(rows):
        out.codes[rows] = np.array([out.code(c) for c in per_key], np.int32)[inv]
    return out


class RowInts(Protocol):
    """Integers read a row at a time (a list, :class:`Ints`, the parser's step numbers)."""

    def __getitem__(self, i: int) -> int | None: ...


def assign_steps(
    f: Frame, step_numbers: RowInts, flags: Strs
) -> tuple[list[dict[str, Any]], Ints, list[tuple[int, int, int]]]:
    """Step of every row and one row per ProfilerStep (``traceprof.collectors.kineto.parse`` module doc, step 3).

    Args:
        f: The rows.
        step_numbers: N of each ``step`` row's ``ProfilerStep#N`` (None elsewhere; unique).
        flags: ``events.flag`` of each row (clipped ``overrun`` rows count towards device bounds).

    Returns:
        (steps rows: step, cpu_start_ns, cpu_end_ns, device_start_ns, device_end_ns, is_last;
        step of each row, missing outside the steps; ProfilerStep (start_ns, end_ns, N) sorted by
        start).
    """
    # step_numbers read at these rows only; a step clipped to the trace's end (checks, step 3c) counts
    cand = np.flatnonzero(f.kind_in({"step"}) & (flags.is_none() | flags.isin(KEPT_FLAGS)))
    cand_nums = [step_numbers[i] for i in cand.tolist()]
    s_rows = cand[np.array([v is not None for v in cand_nums], bool)] if len(cand) else cand
    s_num = np.array([v for v in cand_nums if v is not None], np.int64)
    s_ts, s_end = f.ts[s_rows], f.ts[s_rows] + f.dur[s_rows]
    order = np.lexsort((s_num, s_end, s_ts))
    s_ts, s_end, s_num = s_ts[order], s_end[order], s_num[order]
    spans = list(zip(s_ts.tolist(), s_end.tolist(), s_num.tolist(), strict=True))
    if not spans:
        return [], Ints.missing(f.n), spans
    # index in spans of each row's step, -1: none (int32, and computed in place: these per-row
    # arrays were the largest of the parse on 18 M events)
    span = np.searchsorted(s_ts, f.ts, side="right").astype(np.int32)
    span -= 1
    span[f.ts >= s_end[np.maximum(span, 0)]] = -1
    gpu = f.kind_in(GPU_KINDS)
    lc = np.flatnonzero(f.kind_in(set(LAUNCH_KINDS)) & f.corr_ok & f.unflagged)
    uniq, launch_span = first_by_key(f.corr[lc], f.ts[lc], span[lc])  # the step of each id's launch
    g = np.flatnonzero(gpu & f.corr_ok)
    pos, found = lookup(uniq, f.corr[g])
    span[g[found]] = launch_span[pos[found]]
    clipped_ok = flags.is_none() | flags.isin(KEPT_FLAGS)
    dev = np.flatnonzero(gpu & f.kind_in(set(GPU_ACTIVITY_KINDS)) & clipped_ok & (span >= 0))
    lo = np.full(len(spans), np.iinfo(np.int64).max)
    hi = np.full(len(spans), np.iinfo(np.int64).min)
    np.minimum.at(lo, span[dev], f.ts[dev])
    np.maximum.at(hi, span[dev], f.ts[dev] + f.dur[dev])
    has = np.zeros(len(spans), bool)
    has[span[dev]] = True
    last = spans[-1][2]
    rows = [
        {
            "step": num,
            "cpu_start_ns": s,
            "cpu_end_ns": e,
            "device_start_ns": int(lo[k]) if has[k] else None,
            "device_end_ns": int(hi[k]) if has[k] else None,
            "is_last": num == last,
        }
        for k, (s, e, num) in enumerate(spans)
    ]
    inside = span >= 0
    number = s_num[np.maximum(span, 0)]
    del span
    number[~inside] = 0
    return rows, Ints(number, inside), spans
