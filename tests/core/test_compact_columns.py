"""The parser's compact columns (issue 10: a 5 GB rank file in bounded memory): string columns as
codes (``Strs``), row positions without an array when every event is kept, numeric columns grown
in place, and finished event columns on disk (``traceprof.core.spill.column``). Each reads as the
plain column it stands for.
"""

from __future__ import annotations

import importlib

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import SAMPLES
from traceprof.collectors.kineto._values import STR_DICT, Strs
from traceprof.collectors.kineto.decode import Positions, _Growing
from traceprof.core import spill

_PARSE = importlib.import_module("traceprof.collectors.kineto.parse")


def test_strs_reads_as_its_list() -> None:
    values = ["kernel", None, "cpu_op", "kernel", None]
    s = Strs.of(values)
    assert s.codes.dtype == np.int8 and len(s) == 5
    assert list(s) == s.tolist() == values and [s[i] for i in range(5)] == values
    assert s.isin({"kernel"}).tolist() == [True, False, False, True, False]
    assert s.isin({None}).tolist() == s.is_none().tolist() == [False, True, False, False, True]
    assert s.take(np.array([3, 2])).tolist() == ["kernel", "cpu_op"]
    arr = pa.array(s, STR_DICT)
    assert arr.type == STR_DICT and arr.to_pylist() == values
    assert pa.array(s, pa.string()).to_pylist() == values


def test_strs_widens_its_codes_past_int8() -> None:
    s = Strs.none(3)
    for k in range(200):  # 200 distinct values do not fit int8 codes
        s[k % 3] = f"v{k}"
    assert s.codes.dtype == np.int16 and s.tolist() == ["v198", "v199", "v197"]
    assert pa.array(s, STR_DICT).to_pylist() == ["v198", "v199", "v197"]


def test_positions_of_every_event_hold_no_array() -> None:
    p = Positions(4)
    assert (len(p), list(p), p[2], p[-1], np.asarray(p).tolist()) == (4, [0, 1, 2, 3], 2, 3, [0, 1, 2, 3])
    with pytest.raises(IndexError):
        p[4]
    p[:] = [1, 3]
    assert list(p) == [1, 3] and len(p) == 2


def test_growing_column_equals_the_concatenation() -> None:
    rng = np.random.default_rng(1)
    parts = [rng.integers(-5, 5, size=int(n)) for n in rng.integers(0, 9000, size=40)]
    g = _Growing(np.int64)
    for p in parts:
        g.add(p)
    assert np.array_equal(g.finish(), np.concatenate(parts))
    codes = _Growing(np.int8)
    codes.add(np.array([1, 2], np.int8))
    codes.add(np.array([300], np.int16))  # codes past int8: the column widens
    assert codes.finish().tolist() == [1, 2, 300]


@pytest.mark.parametrize(
    "values",
    [
        pa.array(np.arange(50_000)),
        pa.array([None, 3, None] * 1000, pa.int32()),
        pa.array(["a", None, "b"] * 1000, STR_DICT),
        pa.chunked_array([pa.array(np.arange(10)), pa.array(np.arange(5))]),
    ],
)
def test_a_spilled_column_reads_the_same(values: pa.Array, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "SPILL_BYTES", 0)
    out = spill.column(values)
    assert out.type == values.type and out.to_pylist() == values.to_pylist()
    assert type(out) is type(values)
    maps = [pa.py_buffer(m) for m in spill._MAPS]
    chunks = out.chunks if isinstance(out, pa.ChunkedArray) else [out]
    data = [c.buffers()[1] if not pa.types.is_dictionary(c.type) else c.indices.buffers()[1] for c in chunks]
    assert all(any(m.address <= d.address < m.address + m.size for m in maps) for d in data)  # on disk


def test_a_column_without_room_stays_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "SPILL_BYTES", 0)
    monkeypatch.setattr(spill, "_room", lambda *a: False)
    values = pa.array(np.arange(1000))
    assert spill.column(values) is values


def test_parse_with_spilled_event_columns_gives_the_same_events(monkeypatch: pytest.MonkeyPatch) -> None:
    path = next(SAMPLES.rglob("*.trace.json.gz"))
    in_memory = _PARSE.parse(path).events
    monkeypatch.setattr(spill, "SPILL_BYTES", 0)
    spilled = _PARSE.parse(path).events
    assert spilled.equals(in_memory) and spilled.num_rows > 100


def test_range_check_of_numpy_and_ints_columns() -> None:
    from traceprof.collectors.kineto._values import Ints
    from traceprof.core.limits import _all_fit

    types = {"device": pa.int32(), "ts_ns": pa.int64(), "dur_ns": pa.int64()}
    ok = {
        "device": Ints(np.array([0, 2**40]), np.array([True, False])),  # the big one is missing: fits
        "ts_ns": np.array([1, 2**62]),
        "dur_ns": np.array([5, 2**62 - 1]),
    }
    assert _all_fit(ok, ["device", "ts_ns", "dur_ns"], types)
    assert not _all_fit(
        {**ok, "device": Ints(np.array([0, 2**31]), np.array([True, True]))}, ["device"], types
    )
    assert not _all_fit(
        {**ok, "dur_ns": np.array([5, 2**62])}, ["ts_ns", "dur_ns"], types
    )  # ts + dur > int64
    assert not _all_fit({**ok, "dur_ns": np.array([-2, 2**62])}, ["ts_ns", "dur_ns"], types)  # through Arrow
    assert _all_fit({"device": [1, None]}, ["device"], types)  # lists go through Arrow
