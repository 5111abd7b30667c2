"""One rule for integers read from trace files (``traceprof.core.values``), the same in every source."""

from __future__ import annotations

import json

import pytest

from traceprof.collectors.kineto import parse as parse_kineto
from traceprof.collectors.kineto._values import int_or_none
from traceprof.core.values import checked_int, integer, number, parse_bool


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (7, 7),
        (-3, -3),
        (2**70, 2**70),  # ints as they are (bounds are the caller's)
        (2.0, 2),
        (1e3, 1000),
        (1.5, None),
        (float("nan"), None),
        (float("inf"), None),  # floats only when whole
        ("12", 12),
        (" 7 ", 7),
        ("0x1f", 31),
        ("1.5", None),
        ("abc", None),
        ("", None),  # strings Python reads
        (True, None),
        (False, None),  # a bool is no rank and no id
        (None, None),
        ([1], None),
        ({"a": 1}, None),
    ],
)
def test_one_integer_rule(raw, want):
    assert integer(raw) == want
    n, problem = checked_int(raw)
    assert n == (want if want is None or -(2**63) <= want < 2**63 else None)
    assert problem == (
        None if raw is None or n is not None else "beyond int64" if want is not None else "not an integer"
    )
    # the Kineto id reader is the same rule, bounded to int64 unless told to keep larger values
    assert int_or_none(raw) == (want if want is None or -(2**63) <= want < 2**63 else None)
    assert int_or_none(raw, keep_large=True) == want


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (7, 7.0),
        (-3, -3.0),
        (2.5, 2.5),
        (0, 0.0),  # JSON numbers, as floats (the sign is the caller's)
        (float("nan"), None),
        (float("inf"), None),
        (10**400, None),  # not finite (10**400 is beyond any float)
        (True, None),
        ("1.5", None),
        (None, None),
        ([1.0], None),  # a bool or a string is no bandwidth
    ],
)
def test_one_real_number_rule(raw, want):
    assert number(raw) == want and (want is None or type(number(raw)) is float)


def test_a_boolean_id_links_nothing(tmp_path):
    # Kineto args "correlation": true once read as 1 (linking a kernel to launch call 1); it is no id.
    base = 1_700_000_000_000_000_000
    events = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 5,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 10,
            "dur": 5,
            "args": {"correlation": True, "device": 0, "stream": 7},
        },
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": base, "traceEvents": events}))
    ev = parse_kineto(path).events.to_pydict()
    kernel = ev["kind"].index("kernel")
    assert ev["correlation"][kernel] is None and ev["correlation"][ev["kind"].index("cuda_runtime")] == 1


@pytest.mark.parametrize(("raw", "want"), [("true", True), (" ON ", True), ("0", False), ("no", False)])
def test_one_boolean_rule_for_options(raw, want):
    assert parse_bool(raw) is want
    with pytest.raises(ValueError):
        parse_bool("maybe")
