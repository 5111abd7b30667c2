"""Property-based fuzzing of ingest (issue 11): mutated real traces either ingest, or fail with
traceprof's own error naming the file and the place; never a traceback.

Seeds: the small cases under ../shared/cases and one rank of sample_traces/normal. Mutations: byte
flips, truncation, number and string substitution (huge, negative, non-finite, hostile, invalid
UTF-8), deep nesting, gzip. A short run is part of the suite; ``make fuzz`` runs the long one
(FUZZ_EXAMPLES inputs) and prints the outcome counts.
"""

from __future__ import annotations

import collections
import gzip
import itertools
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import CASES, SAMPLES
from traceprof.core.errors import TraceprofError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

#: Inputs per run: 40 in the suite; `make fuzz` sets FUZZ_EXAMPLES (the size of the run, not its verdict).
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))


def _seeds() -> list[tuple[str, bytes]]:
    seeds = [(p.name, p.read_bytes()) for p in sorted(CASES.glob("*/*.json"))]
    normal = SAMPLES / "normal" / "rank0.trace.json.gz"
    if normal.exists():
        seeds.append(("rank0.json", gzip.decompress(normal.read_bytes())))
    return seeds


SEEDS = _seeds()
NUMBERS = [b"9223372036854775808", b"-9223372036854775809", b"2147483648", b"-1", b"0", b"1e308", b"1e400",
           b"-1e400", b"9" * 400, b"0.0000001", b"1.5", b"NaN", b"true", b"null", b'"12"', b'"0x1f"']
STRINGS = [b'""', b'"\\u001b[2J[/x][link=http://e]x"', b'"\xff\xfe"', b'"\xc3"', b'"' + b"A" * 10_000 + b'"',
           b'"ProfilerStep#99999999999"', b'"ncclDevKernel_AllReduce"', b"12", b"[]", b"{}", b'"\\ud800"']
NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
# A place in the file: a byte offset, a record index, a JSON path or a named top-level field.
PLACE = re.compile(r"byte \d+|bytes \d+-\d+|(event|entry|row) #\d+|\$\.|line \d+|distributedInfo|entries|"
                   r"nested too deeply|traceEvents|rank|world size|sidecar")

OUTCOMES: collections.Counter[str] = collections.Counter()
_N = itertools.count()


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    name, data = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "number", "string", "nest"]))
        if kind == "flip" and data:
            buf = bytearray(data)
            for _ in range(draw(st.integers(1, 8))):
                i = draw(st.integers(0, len(buf) - 1))
                buf[i] ^= draw(st.integers(1, 255))
            data = bytes(buf)
        elif kind == "truncate":
            data = data[: draw(st.integers(0, len(data)))]
        elif kind in ("number", "string"):
            spans = [m.span() for m in (NUMBER if kind == "number" else STRING).finditer(data, 0, 200_000)]
            if spans:
                a, b = draw(st.sampled_from(spans))
                data = data[:a] + draw(st.sampled_from(NUMBERS if kind == "number" else STRINGS)) + data[b:]
        else:
            spans = [m.span() for m in NUMBER.finditer(data, 0, 200_000)]
            if spans:
                a, b = draw(st.sampled_from(spans))
                depth = draw(st.sampled_from([2, 64, 1500, 100_000]))
                data = data[:a] + b"[" * depth + data[a:b] + b"]" * depth + data[b:]
    if draw(st.booleans()):
        name, data = name + ".gz", gzip.compress(data, 1)
        if draw(st.booleans()):  # corrupt the compressed stream too
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + bytes([data[i] ^ 0x55]) + data[i + 1 :]
    return name, data


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    with Store(d / "fuzz.duckdb") as s:
        yield d, s
    print(f"\nfuzz outcomes ({sum(OUTCOMES.values())} inputs): " + ", ".join(f"{k} {v}" for k, v in sorted(OUTCOMES.items())))


@pytest.mark.skipif(not SEEDS, reason="no seed traces")
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(case=mutated(), skip=st.booleans())
def test_mutated_traces_ingest_or_fail_cleanly(fuzz_store, case, skip):
    d, store = fuzz_store
    name, data = case
    n = next(_N)
    path = d / f"in{n}" / name
    path.parent.mkdir()
    path.write_bytes(data)
    try:
        ingest(store, [path], run=f"r{n}", jobs=1, on_bad_event="skip" if skip else "raise")
    except TraceprofError as e:
        msg = str(e)
        assert str(path) in msg or path.name in msg, msg
        assert PLACE.search(msg), msg
        OUTCOMES[type(e).__name__] += 1
    else:
        OUTCOMES["stored"] += 1
    store.runs()  # the store still answers
