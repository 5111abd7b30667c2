"""Value coercions shared by the Kineto parser modules."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from traceprof.core.classify import COMM_ARG_KEYS
from traceprof.core.limits import shown
from traceprof.core.values import integer, spelled_int

__all__ = ["args_dict", "int_or_none", "IdRepairs", "Ints", "Strs", "META_KEYS", "meta_dict"]


def args_dict(text: str | bytes) -> dict[str, Any]:
    """An event's args as a dict (non-object args become ``{"value": ...}``; invalid JSON ``{}``)."""
    try:
        d = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return {}
    return d if isinstance(d, dict) else {"value": d}


#: The args keys the parser reads beyond the ids: communication metadata (``traceprof.core.classify``
#: ``COMM_ARG_KEYS``) and what the collectives rows take (``traceprof.collectors.kineto.collectives``).
META_KEYS = tuple(
    sorted(
        COMM_ARG_KEYS
        | {
            "Seq",
            "In msg nelems",
            "Out msg nelems",
            "dtype",
            "Group size",
            "Input Dims",
            "Input type",
            "In split size",
            "Out split size",
            "Dst Rank",
            "Src Rank",
            "Rank",
        }
    )
)
_Meta = msgspec.defstruct(
    "_Meta",
    [(f"k{i}", Any, msgspec.field(default=msgspec.UNSET, name=k)) for i, k in enumerate(META_KEYS)],
    gc=False,
)
_META = msgspec.json.Decoder(_Meta)


def meta_dict(text: str | bytes) -> dict[str, Any]:
    """:func:`args_dict` restricted to :data:`META_KEYS` (the keys present, null ones included):
    the other args are skipped while decoding, so no object is made for them."""
    try:
        return msgspec.to_builtins(_META.decode(text))  # absent keys (UNSET) are left out, in C
    except (msgspec.ValidationError, msgspec.DecodeError):  # not an object, invalid, a key of another type
        d = args_dict(text)
        return {k: d[k] for k in META_KEYS if k in d}


def int_or_none(v: Any, *, keep_large: bool = False) -> int | None:
    """An int64 from a JSON value (``traceprof.core.values.integer``: an int, a numeric string in any
    base, a float with no fraction; not a bool), else None: an id of 1.5 is no id (truncated to 1 it
    would link a kernel to another's launch).

    With ``keep_large`` an integer beyond int64 is returned as is, for the parser's per-event range
    check (``traceprof.core.limits``) to reject with the event index instead of storing NULL.
    """
    n = integer(v)
    return n if n is None or keep_large or -(2**63) <= n < 2**63 else None


#: The id args every event may carry (``args.<key>``, the attribute of the parser's ids struct).
_ID_ARGS = (("correlation", "correlation"), ("External id", "external_id"))
_LANE_ARGS = (("device", "device"), ("stream", "stream"))  # read on GPU rows only
_KEYS = {attr: key for key, attr in (*_ID_ARGS, *_LANE_ARGS)}
#: JSON's first byte of an object, and of null (an ``args: null`` is no args).
_OBJECT_OR_NULL = (b"{", b"n")


class IdRepairs:
    """Events kept without an id arg that is not an integer, or without all of them when ``args``
    is not a JSON object: the policy of :func:`int_or_none` (an id of 1.5 is no id), said now.

    ``args.correlation`` and ``args.External id`` (every event), ``args.device`` and
    ``args.stream`` (GPU rows) that are present but not integers (``1.5``, ``"abc"``, ``true``, a
    list) were read as absent, silently; ``args`` given as a list (or a string, a number) was read
    as no args. A negative ``args.device`` is no device: the event is kept without it (stored NULL).
    An id given as a string or a float that writes an integer (``"0"``, ``"0x1f"``, ``3.0``) is
    read as that integer (ROCm writes ``"stream": "0x0"``), no longer without a word. Each is
    counted by reason (``"args.correlation not an integer: kept without it"``)
    for ``traces.meta.repaired`` (the ``issues`` column of ``traceprof runs``) and said in one
    warning per reason naming the first events. (A value beyond its column is no repair: the
    parser keeps it for ``traceprof.core.limits.drop_out_of_range`` to reject the event.)
    """

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[int, Any]]] = {}  # reason -> (event index, value), first 3
        self.count: dict[str, int] = {}

    def _add(self, reason: str, i: int, value: Any) -> None:
        n = self.count[reason] = self.count.get(reason, 0) + 1
        if n <= 3:
            self.events.setdefault(reason, []).append((i, value))

    def check(self, i: int, raw: Any, ids: Any, gpu: bool) -> None:
        """Note event ``#i``'s problems: ``raw`` its args JSON text (``msgspec.Raw``, empty when
        absent), ``ids`` its decoded id args (attributes ``correlation``, ``external_id``,
        ``device``, ``stream``; None when none), ``gpu`` whether it is a GPU row."""
        if raw and bytes(memoryview(raw)[:1]) not in _OBJECT_OR_NULL:
            self._add(
                "args not an object: kept without its ids", i, bytes(raw)[:40].decode("utf-8", "replace")
            )
            return
        if ids is None:
            return
        for _, attr in (*_ID_ARGS, *_LANE_ARGS) if gpu else _ID_ARGS:
            self.note(i, attr, getattr(ids, attr))

    def note(self, i: int, attr: str, v: Any) -> None:
        """Note event ``#i``'s id arg ``attr`` (``correlation``, ``external_id``, ``device``,
        ``stream``: the parser's ids struct's attribute) of value ``v`` as read from the JSON (a
        device or stream of a GPU row only): counted when it is no integer, a negative device, or
        a string or float that writes an integer."""
        if v is None or type(v) is int and (v >= 0 or attr != "device"):
            return
        key = _KEYS[attr]
        n = integer(v)
        if n is None:
            self._add(f"args.{key} not an integer: kept without it", i, v)
        elif attr == "device" and n < 0:
            self._add(f"args.{key} negative: kept without it", i, v)
        else:  # "0", "0x1f", 3.0: the number it writes, read as such and said
            self._add(f"args.{key} {spelled_int(v)}: read as its integer", i, v)

    def counts(self) -> dict[str, int]:
        """Reason -> events, for ``traces.meta.repaired``."""
        return dict(self.count)

    def warnings(self, file: str) -> list[str]:
        """One line per reason, naming ``file`` and the first events with their values."""
        out = []
        for reason, n in self.count.items():
            first = ", ".join(f"#{i} ({shown(v, 40)})" for i, v in self.events[reason])
            out.append(f"{file}: {n} event(s) with {reason} (event {first}{', ...' if n > 3 else ''})")
        return out


@dataclass
class Ints:
    """An integer column with missing values: ``values`` (0 where missing) and ``ok``. The values
    are int64, or int32 after :meth:`narrow` (ids and lanes of a large trace that all fit: half
    the memory); either converts to the same Arrow column."""

    values: np.ndarray
    ok: np.ndarray

    @classmethod
    def of(cls, items: list[int | None]) -> Ints:
        """From Python ints and None (each within int64).

        Raises:
            OverflowError: A value beyond int64.
        """
        a = pa.array(items, pa.int64())
        return cls(a.fill_null(0).to_numpy(), a.is_valid().to_numpy(zero_copy_only=False))

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> int | None:
        return int(self.values[i]) if self.ok[i] else None

    def take(self, idx: np.ndarray) -> Ints:
        """The rows ``idx`` (indices)."""
        return Ints(self.values[idx], self.ok[idx])

    def __setitem__(self, i: int, v: int | None) -> None:
        if not (self.values.flags.writeable and self.ok.flags.writeable):  # a view of an Arrow buffer
            self.values, self.ok = self.values.copy(), self.ok.copy()
        if v is not None and self.values.dtype != np.int64 and not self.fits(np.array([v], np.int64)):
            self.values = self.values.astype(np.int64)
        self.values[i], self.ok[i] = (0, False) if v is None else (v, True)

    def narrow(self) -> Ints:
        """The column with int32 values when every value fits int32, else itself."""
        v = self.values
        if v.dtype == np.int32 or (len(v) and (v.min() < -(2**31) or v.max() >= 2**31)):
            return self
        return Ints(v.astype(np.int32), self.ok)

    def fits(self, values: np.ndarray) -> bool:
        """Whether ``values`` can be stored in this column's values without changing their type."""
        info = np.iinfo(self.values.dtype)
        return not len(values) or (int(values.min()) >= info.min and int(values.max()) <= info.max)

    @classmethod
    def missing(cls, n: int) -> Ints:
        """``n`` missing values."""
        return cls(np.zeros(n, np.int64), np.zeros(n, bool))

    def __arrow_array__(self, type: pa.DataType | None = None) -> pa.Array:  # noqa: A002 (pyarrow's name)
        """The column as an Arrow array (``pa.array(ints, type)``; a narrower type is range-checked).

        Raises:
            pyarrow.ArrowInvalid: A value does not fit ``type``.
        """
        return pa.array(self.values, type=pa.int64(), mask=~self.ok).cast(type or pa.int64())

    def tolist(self) -> list[int | None]:
        """Python ints, None where missing."""
        out = self.values.astype(object)
        out[~self.ok] = None
        return list(out.tolist())


#: Arrow type of a :class:`Strs` column: int32 codes into its distinct strings.
STR_DICT = pa.dictionary(pa.int32(), pa.string())


def code_type(distinct: int) -> type[np.signedinteger[Any]]:
    """The narrowest signed integer type for codes 0..distinct-1 and -1."""
    return np.int8 if distinct <= 128 else np.int16 if distinct <= 32768 else np.int32


@dataclass(eq=False)
class Strs:
    """A string column with few distinct values (kinds, names, lanes, flags): ``codes`` into
    ``values``, -1 where the value is None; the codes are int8, int16 or int32, the narrowest
    that holds them (:func:`code_type`): 1 to 4 bytes a row, where a Python list of the same
    strings takes 8 (a pointer a row) and makes every pass over it a Python loop.

    It reads like the list it stands for (``len``, ``[i]``, iteration, ``[i] = v``) for the few
    rows code looks at one by one; whole-column passes use ``codes`` (:meth:`isin`, :meth:`is_none`).
    """

    codes: np.ndarray
    values: list[str]
    _index: dict[str, int] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, items: Iterable[str | None]) -> Strs:
        """From Python strings and None (Arrow's dictionary builder: no Python object per row)."""
        enc = pa.array(items if isinstance(items, list) else list(items), STR_DICT)
        values = enc.dictionary.to_pylist()
        # a writable copy, in the narrowest type
        codes = np.array(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), code_type(len(values)))
        return cls(codes, values)

    @classmethod
    def none(cls, n: int) -> Strs:
        """``n`` None values."""
        return cls(np.full(n, -1, np.int8), [])

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: int) -> str | None:
        c = int(self.codes[i])
        return None if c < 0 else self.values[c]

    def __iter__(self) -> Iterator[str | None]:
        lookup: list[str | None] = [*self.values, None]  # code -1: the last entry
        return (lookup[c] for c in self.codes.tolist())

    def __setitem__(self, i: int, v: str | None) -> None:
        self.codes[i] = self.code(v)

    def code(self, v: str | None) -> int:
        """The code of ``v`` (added to ``values`` when new; -1 for None)."""
        if v is None:
            return -1
        if self._index is None:
            self._index = {s: k for k, s in enumerate(self.values)}
        k = self._index.get(v)
        if k is None:
            k = self._index[v] = len(self.values)
            self.values.append(v)
            if k > np.iinfo(self.codes.dtype).max:
                self.codes = self.codes.astype(code_type(k + 1))
        return k

    def isin(self, wanted: Iterable[str | None]) -> np.ndarray:
        """Rows whose value is one of ``wanted`` (bool, one per row)."""
        w = set(wanted)
        want = [k for k, s in enumerate(self.values) if s in w] + ([-1] if None in w else [])
        return np.isin(self.codes, want)

    def is_none(self) -> np.ndarray:
        """Rows whose value is None (bool, one per row)."""
        return self.codes < 0

    def take(self, idx: np.ndarray) -> Strs:
        """The rows ``idx`` (indices), sharing ``values``."""
        return Strs(self.codes[idx], self.values)

    def tolist(self) -> list[str | None]:
        """Python strings, None where missing."""
        return list(self)

    def __arrow_array__(self, type: pa.DataType | None = None) -> pa.Array:  # noqa: A002 (pyarrow's name)
        """The column as an Arrow dictionary array (:data:`STR_DICT`; ``type`` may ask for plain strings)."""
        codes = self.codes.astype(np.int32, copy=False)
        none = codes < 0
        idx = pa.array(codes, pa.int32(), mask=none if none.any() else None)
        out = pa.DictionaryArray.from_arrays(idx, pa.array(self.values, pa.string()))
        return out if type is None or type == STR_DICT else out.cast(type)
