"""Kineto parsing and ingest: exact ns, both styles, bad files, idempotence, atomicity."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import collective_args
from tests.conftest import corpus
from traceprof.collectors.kineto import parse
from traceprof.core.errors import TraceFormatError
from traceprof.core.parsed import ParseOptions
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


def _write(path: Path, doc: dict, gz: bool = False) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _new_style(rank: int = 0) -> dict:
    # baseTimeNanoseconds + fractional microseconds: 1.001 us -> 1001 ns exactly.
    return {
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"},
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#7",
                "pid": 10,
                "tid": 10,
                "ts": 1000.5,
                "dur": 100.25,
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 10,
                "tid": 10,
                "ts": 1001.001,
                "dur": 2.5,
                "args": {"correlation": 42, "External id": 5},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)",
                "pid": 0,
                "tid": 7,
                "ts": 1010.123,
                "dur": 20.0,
                "args": {
                    "correlation": 42,
                    "device": 0,
                    "stream": 7,
                    **collective_args(seq=3, nelems=1024, out_nelems=1024, group_size=2),
                },
            },
            {"ph": "s", "id": 42, "pid": 10, "tid": 10, "ts": 1001.001, "cat": "ac2g", "name": "ac2g"},
            {"ph": "M", "name": "process_name", "pid": 10, "tid": 0, "args": {"name": "python"}},
        ],
    }


def test_new_style_exact_ns_steps_and_collectives(tmp_path):
    pt = parse(_write(tmp_path / "r0.json", _new_style()))
    ev = pt.events.to_pylist()
    base = 1_700_000_000_000_000_000
    step, launch, kernel = ev
    assert step["kind"] == "step" and step["ts_ns"] == base + 1_000_500 and step["dur_ns"] == 100_250
    assert launch["ts_ns"] == base + 1_001_001 and launch["dur_ns"] == 2_500
    assert kernel["ts_ns"] == base + 1_010_123 and kernel["stream"] == 7 and kernel["device"] == 0
    assert kernel["step"] == 7  # step of the launch, via args.correlation
    assert pt.skipped == {"flow": 1, "metadata": 1} and pt.rejected == {}
    (c,) = pt.collectives.to_pylist()
    assert (c["op"], c["pg"], c["seq"], c["bytes_in"], c["enter_ns"]) == (
        "all_reduce",
        "0",
        3,
        4096,
        base + 1_001_001,
    )
    assert pt.format == "kineto-new" and pt.rank == 0 and pt.world_size == 2


def test_old_style_integer_epoch_us(tmp_path):
    doc = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": 1682725898236567,
                "dur": 68,
            }
        ],
        "distributedInfo": {"rank": 3},
    }
    pt = parse(_write(tmp_path / "r3.json.gz", doc, gz=True))
    (e,) = pt.events.to_pylist()
    assert e["ts_ns"] == 1682725898236567000 and e["dur_ns"] == 68000 and pt.format == "kineto-old"


def test_large_integer_args_kept(tmp_path):
    # An args integer above int64 (breaks yajl/ijson) is kept verbatim in the JSON args.
    pt = parse(corpus("hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"))
    args = [a for a in pt.events.column("args").to_pylist() if "Comms Id" in a]
    assert args and "10159970886766084423" in args[0]


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"traceEvents": [{"ph": "X", "ts": 1', "truncated JSON"),
        (b"this is not json at all", "invalid JSON"),
        (b"\x1f\x8b\x08\x00garbage-gzip", "broken gzip"),
    ],
)
def test_bad_files_raise_naming_the_file(tmp_path, content, message):
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(content)
    with pytest.raises(TraceFormatError) as e:
        parse(bad)
    assert str(bad) in str(e.value) and message in str(e.value)


def test_truncated_gzip(tmp_path):
    good = gzip.compress(json.dumps(_new_style()).encode())
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(TraceFormatError, match="broken gzip"):
        parse(bad)


def test_missing_dur_names_the_event(tmp_path):
    doc = _new_style()
    del doc["traceEvents"][1]["dur"]
    path = _write(tmp_path / "r0.json", doc)
    with pytest.raises(
        TraceFormatError, match=r"event #1 \(ph='X', name='cudaLaunchKernel'\): missing 'dur'"
    ):
        parse(path)
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert pt.rejected["missing 'dur'"] == 1 and pt.events_kept == 2


def _dump(db: Path) -> dict:
    with Store(db, read_only=True) as s:
        return {
            t: s.sql(f"SELECT * FROM {t} ORDER BY ALL").rows() for t in ("runs", "traces", "events", "steps")
        }


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "traceprof.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def test_cli_bad_file_exit_1_store_unchanged_and_reingest_noop(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "rank0.json", _new_style(0))
    _write(run / "rank1.json", _new_style(1))
    db = tmp_path / "s.duckdb"
    assert _cli("ingest", str(run), "--db", str(db), cwd=tmp_path).returncode == 0
    before = _dump(db)
    assert len(before["traces"]) == 2
    # Same files again: nothing added.
    r = _cli("ingest", str(run), "--db", str(db), cwd=tmp_path)
    assert r.returncode == 0 and "2 already stored" in r.stderr
    assert _dump(db) == before
    # A new run with one good and one bad file: exit 1, one line naming the file, nothing written.
    run2 = tmp_path / "run2"
    run2.mkdir()
    _write(run2 / "rank0.json", _new_style(0) | {"baseTimeNanoseconds": 1})
    for name, content in (
        ("rank1.json", b'{"traceEvents": [{"ph'),
        ("rank1.json.gz", b"\x1f\x8bxx"),
        ("rank1.txt.json", b"nope"),
    ):
        for f in run2.glob("rank1*"):
            f.unlink()
        (run2 / name).write_bytes(content)
        r = _cli("ingest", str(run2), "--db", str(db), cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and name in lines[0] and "Traceback" not in r.stderr
        assert _dump(db) == before


def test_conflicting_ranks_rejected(store, tmp_path):
    run = tmp_path / "dup"
    run.mkdir()
    # two traces of rank 0 recorded together (another content, the same times): which job each is
    # cannot be told, so refused (recorded apart they are one run each: tests/ingest/test_run_names.py)
    _write(run / "a.json", _new_style(0))
    _write(run / "b.json", _new_style(0) | {"trace_id": "B"})
    with pytest.raises(TraceFormatError, match="rank 0 also in"):
        ingest(store, [run])
    assert store.runs().height == 0


def test_duplicate_rank_hint_fits_how_the_run_was_named(store, tmp_path):
    # The trial: two files of rank 0 under --run dd were told "... or use --run", which was given.
    # --run puts every file in that one run, so the hint says it cannot split them; without --run
    # the folder is the run; identical copies (same sha256) are one trace given twice.
    run = tmp_path / "dup"
    run.mkdir()
    a, b = (
        _write(run / "a.json", _new_style(0)),
        _write(run / "b.json", _new_style(0) | {"trace_id": "B"}),
    )
    _write(run / "c.json", _new_style(1))
    with pytest.raises(TraceFormatError) as named:
        ingest(store, [run], run="dd")
    assert str(named.value) == (
        f"{b}: distributedInfo.rank: rank 0 also in {a} (same run 'dd'): two traces of one rank are two "
        "jobs; --run puts every file of this ingest in that one run, so it cannot split them: ingest each "
        "job's files on their own, each with its own --run NAME"
    )
    with pytest.raises(TraceFormatError) as folder:
        ingest(store, [run])
    assert str(folder.value).endswith(
        "(same run 'dup'): two traces of one rank are two jobs; put each job's files in their own "
        "directory, or ingest them on their own with --run NAME each"
    )
    # an identical copy of a rank in one run is that rank once (traceprof.ingest.copies rule 1; it
    # was refused, "the same trace (same sha256): leave one out"): run dd holds a and c, b is named
    b.write_bytes(a.read_bytes())
    res = ingest(store, [run], run="dd")
    assert (
        f"{b}: the same bytes (sha256) as {a}, read as rank 0 both: one trace, b.json not stored (leave the copy out)"
        in res.warnings
    )
    assert sorted(res.added) == [str(a), str(run / "c.json")]
    assert store.sql("SELECT rank FROM traces ORDER BY rank").rows() == [(0,), (1,)]
