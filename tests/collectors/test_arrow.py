"""Reading rows of a chunked Arrow column (``traceprof.collectors._arrow.values_at``): the values asked for,
in the order asked, without the copy of the whole column that ``take`` on a chunked array makes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pyarrow as pa

from traceprof.collectors._arrow import chunk_starts, values_at
from traceprof.collectors._duplicates import duplicate_rows


@contextmanager
def _counted_pool() -> Iterator[pa.MemoryPool]:
    """Arrow's default pool replaced, for the block, by one that counts its own peak."""
    old = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(old)
    pa.set_memory_pool(pool)
    try:
        yield pool
    finally:
        pa.set_memory_pool(old)


def test_values_come_back_in_the_order_asked_across_chunks():
    col = pa.chunked_array([pa.array(["a", "b", None]), pa.array([], pa.string()), pa.array(["d", "e"])])
    # rows 0-2 are the first chunk, the empty one starts and ends at row 3, rows 3-4 are the last
    assert chunk_starts(col).tolist() == [0, 3, 3, 5]
    assert values_at(col, np.array([4, 0, 2, 3, 0])) == ["e", "a", None, "d", "a"]
    assert values_at(col.combine_chunks(), np.array([4, 0])) == ["e", "a"]
    assert values_at(col, np.array([], np.int64)) == []


def test_two_rows_of_a_large_chunked_column_do_not_copy_it():
    # two chunks of 4,000 texts of 1,000 bytes: 8 MB that a take of the whole column concatenates
    big = pa.chunked_array([pa.array(["x" * 1000] * 4000), pa.array(["y" * 1000] * 4000)])
    with _counted_pool() as pool:
        got = values_at(big, np.array([4001, 5]))
    assert [v[:1] for v in got] == ["y", "x"]
    assert pool.max_memory() < 1 << 20  # the two values and their indices: a few kB


def test_duplicates_compare_chunked_args_row_by_row():
    # rows 0, 1 and 3 agree on the hashed columns; their args (row 0 in the first chunk, rows 1 and 3
    # in the second) tell row 1 apart, so only row 3 (a copy of row 0) is dropped
    ts = np.array([10, 10, 20, 10])
    args = pa.chunked_array([pa.array(['{"a":1}']), pa.array(['{"a":2}', "{}", '{"a":1}'])])
    assert duplicate_rows([ts], [ts, args]).tolist() == [3]
