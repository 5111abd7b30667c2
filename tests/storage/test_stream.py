"""Kineto ingest streams its input (issue 10): the text is decoded as it is read or gunzipped, never
held whole, with the same rows as a whole-file read, the gzip-bomb cap still enforced, and peak
memory bounded by the file size.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from traceprof.core import fileio
from traceprof.core.errors import TraceFormatError

_PARSE = importlib.import_module("traceprof.collectors.kineto.parse")
ROOT = Path(__file__).resolve().parents[2]


def _tables(pt: object) -> list[object]:
    keys = (
        "rank",
        "world_size",
        "trace",
        "events_read",
        "rejected",
        "skipped",
        "flagged",
        "warnings",
        "format",
    )
    return [getattr(pt, t).to_pydict() for t in ("events", "devices", "steps", "collectives")] + [
        getattr(pt, k) for k in keys
    ]


def test_stream_pieces_equal_whole_read() -> None:
    # The streamed text of a gzip file is its whole decompressed text; the hash and size are the file's.
    path = next(SAMPLES.rglob("*.trace.json.gz"))
    s = fileio.TextStream(path)
    pieces = list(s)
    assert max(len(p) for p in pieces) <= 1 << 20
    raw, data = fileio.read_maybe_gzip(path)
    assert b"".join(pieces) == data
    assert (s.sha256, s.size) == (hashlib.sha256(raw).hexdigest(), len(raw))


@pytest.fixture(params=["isal", "zlib"])
def inflater(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each gzip test with ISA-L's inflate (the default when installed) and with zlib (the fallback)."""
    import zlib

    mod = pytest.importorskip("isal.isal_zlib") if request.param == "isal" else zlib
    monkeypatch.setattr(fileio, "_inflater", mod)
    monkeypatch.setattr(fileio, "_INFLATE_ERROR", mod.error)
    return str(request.param)


def test_isal_is_the_inflater_when_installed() -> None:
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    assert fileio._inflater is isal_zlib and fileio._INFLATE_ERROR is isal_zlib.error


def test_gzip_and_plain_parse_the_same(tmp_path: Path, inflater: str) -> None:
    # The same document, plain and as a 3-member gzip (as pigz writes), gives the same rows; only
    # the file's hash and size differ.
    src = next(SAMPLES.rglob("*.trace.json.gz"))
    text = gzip.decompress(src.read_bytes())
    plain, gz = tmp_path / "r.json", tmp_path / "r.json.gz"
    plain.write_bytes(text)
    third = len(text) // 3
    gz.write_bytes(b"".join(gzip.compress(text[i : i + third]) for i in range(0, len(text), third)))
    a, b = _PARSE.parse(plain), _PARSE.parse(gz)
    assert _tables(a)[:4] == _tables(b)[:4]
    assert (a.sha256, b.sha256) == (
        hashlib.sha256(text).hexdigest(),
        hashlib.sha256(gz.read_bytes()).hexdigest(),
    )


def test_members_larger_than_the_output_piece_inflate_exactly(
    tmp_path: Path, inflater: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members of several output pieces each, read in small chunks: a member's end then falls where
    the output cap stopped the inflater (zlib used to feed the next member's first bytes twice)."""
    text = b"".join(
        b'{"ph": "X", "name": "op%d", "ts": %d, "dur": 3},' % (i % 977, i) for i in range(200_000)
    )
    parts = [text[i : i + len(text) // 3 + 1] for i in range(0, len(text), len(text) // 3 + 1)]
    raw = b"".join(gzip.compress(part, 6) for part in parts)
    path = tmp_path / "m.json.gz"
    path.write_bytes(raw)
    monkeypatch.setattr(fileio, "MIN_INFLATE_BYTES", 2 * len(text))  # ratio 1.0: a cap of twice the text
    for chunk in (1 << 12, 1 << 16, 1 << 20, len(raw)):
        pieces = list(
            fileio._inflate(path, (raw[i : i + chunk] for i in range(0, len(raw), chunk)), len(raw), 1.0)
        )
        assert b"".join(pieces) == text, chunk


def test_gzip_bomb_refused_while_streaming(tmp_path: Path, inflater: str) -> None:
    # 1 MiB of events-looking text per member, 128 members: 128 MiB from ~130 KB, beyond 64x and the
    # 64 MiB floor; refused with the file named, before the whole text exists.
    path = tmp_path / "bomb.json.gz"
    member = gzip.compress(b" " * (1 << 20), 9)
    path.write_bytes(gzip.compress(b'{"traceEvents": [', 9) + member * 128)
    with pytest.raises(TraceFormatError, match=rf"^{path}: byte \d+: inflates to more than "):
        _PARSE.parse(path)


def test_broken_gzip_named_while_streaming(tmp_path: Path, inflater: str) -> None:
    path = tmp_path / "cut.json.gz"
    whole = gzip.compress(b'{"traceEvents": [' + b'{"ph": "X", "ts": 1, "dur": 1},' * 5000)
    path.write_bytes(whole[:-40])
    with pytest.raises(TraceFormatError, match=rf"^{path}: byte \d+: broken gzip stream \(truncated"):
        _PARSE.parse(path)
    bad = tmp_path / "bad.json.gz"  # a damaged byte inside the deflate data: the inflater's own error
    bad.write_bytes(whole[:12] + bytes([whole[12] ^ 0xFF]) + whole[13:])
    with pytest.raises(
        TraceFormatError, match=rf"^{bad}: bytes 0-\d+: broken gzip stream \(.*\); re-copy the file$"
    ):
        _PARSE.parse(bad)


def test_invalid_utf8_falls_back_to_repair(tmp_path: Path) -> None:
    # Invalid UTF-8 stops the stream; the file is read whole, repaired and the repair reported.
    path = tmp_path / "bad.json"
    path.write_bytes(
        b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a\xffb", "pid": 1, "tid": 1, '
        b'"ts": 1, "dur": 2}], "baseTimeNanoseconds": 1000}'
    )
    pt = _PARSE.parse(path)
    assert pt.events.column("name").to_pylist() == ["a\ufffdb"]
    assert [r.reason for r in fileio.pop_repairs(path.resolve())] == ["invalid UTF-8 replaced by U+FFFD"]


# The child's own peak above its start-up: VmRSS once the parser is imported, then VmHWM after the
# parse, the peak reset in between (/proc/self/clear_refs "5"). Measured in the child because the
# start-up varies with the machine: 115 MB here, 175 MB in a freshly installed venv (its libraries'
# pages all in the page cache, so more of them are mapped). ru_maxrss is not used: Linux carries it
# across exec from the forking parent, here the whole test session.
_MEASURE = """
import importlib, sys
parse = importlib.import_module("traceprof.collectors.kineto.parse").parse
def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
pt = parse(sys.argv[1])
assert pt.events.num_rows > 0
print(base, status("VmHWM"))
"""


@pytest.fixture(scope="module")
def parse_peak(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int, int]:
    """(RSS at start-up, peak RSS of a child process that parses it, file size), all bytes, of a
    ~400 MB generated rank file (benchmarks/gen_trace.py: 1.5 M events, 15k steps; 3 s to write,
    7 s to parse)."""
    out_dir = tmp_path_factory.mktemp("big")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gen_trace.py"),
            str(out_dir),
            "--events",
            "1500000",
            "--steps",
            "15000",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    path = out_dir / "rank0.trace.json"
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)], check=True, capture_output=True, text=True, cwd=ROOT
    )
    base, peak = map(int, out.stdout.split()[-2:])
    return base, peak, path.stat().st_size


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads VmHWM from /proc (Linux)")
def test_peak_memory_bounded_by_file_size(parse_peak: tuple[int, int, int]) -> None:
    # issue 10's target, 1.5x the file, above the interpreter: 484 MB for the 398 MB file (1.22x),
    # the args text spilled to disk (traceprof.core.spill) and the heaps trimmed after each pass (the
    # 565 MB trace of benchmarks/: 1030 MB peak before, 684 MB after, 115 MB of it start-up).
    base, peak, size = parse_peak
    assert size > 300e6
    assert peak - base < 1.5 * size, ((peak - base) / 1e6, size / 1e6)


@pytest.mark.parametrize("gz", [False, True])
def test_read_progress_reaches_the_file_size_in_this_process_only(tmp_path, gz):
    text = b'{"traceEvents": [' + b",".join(b'{"ph": "i", "ts": %d}' % i for i in range(300_000)) + b"]}"
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    size = path.stat().st_size
    calls: list[tuple[int, int]] = []
    fileio.on_read(lambda p, done, total: calls.append((done, total)))
    try:
        assert b"".join(fileio.TextStream(path)) == text
        assert calls and calls[-1] == (size, size) and all(t == size for _, t in calls)
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)
        n = len(calls)
        fileio._ON_READ = (os.getpid() + 1, fileio._ON_READ[1])  # as a forked worker sees it
        b"".join(fileio.TextStream(path))
        assert len(calls) == n
    finally:
        fileio.on_read(None)
