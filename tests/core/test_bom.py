"""A leading UTF-8 byte order mark (EF BB BF) in a JSON trace, plain or inside gzip, is read as
whitespace (``traceprof.core.fileio.blank_bom``): the trace ingests to the same rows as without it, and
byte offsets in error messages stay the file's offsets."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from tests.builders import micro_trace
from tests.conftest import SAMPLES
from traceprof.core import fileio
from traceprof.core.errors import TraceFormatError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

BOM = b"\xef\xbb\xbf"

#: Per table, the columns that name the file or the ingest (differ between two copies of a run)
#: and the columns that order its rows.
_TABLES = {
    "events": ("trace_id", "rank, kind, ts_ns, dur_ns, name, pid, tid, device, stream, correlation, args"),
    "steps": ("trace_id", "rank, step"),
    "devices": ("trace_id", "rank, device"),
    "collectives": ("trace_id", "rank, source, pg, seq, ordinal, enter_ns, start_ns, end_ns"),
    "collective_instances": ("", "instance_id"),
    "traces": ("trace_id, path, sha256, bytes", "rank, source"),
}


def _with_bom(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst``, a BOM before its text (inside the gzip stream for a .gz)."""
    if src.suffix == ".gz":
        dst.write_bytes(gzip.compress(BOM + gzip.decompress(src.read_bytes())))
    else:
        dst.write_bytes(BOM + src.read_bytes())


def _tables(db: Path, paths: list[Path], run: str) -> dict[str, list[tuple]]:
    with Store(db) as store:
        ingest(store, paths, run=run, jobs=1)
        out = {}
        for table, (drop, order) in _TABLES.items():
            exclude = f"EXCLUDE (run_id{', ' + drop if drop else ''})"
            out[table] = store.con.execute(f"SELECT * {exclude} FROM {table} ORDER BY {order}").fetchall()
        return out


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_bom_copy_of_a_run_ingests_to_the_same_rows(tmp_path, gz):
    # straggler_rank2: Kineto (.json.gz) with their sidecars (.meta.json) and Flight Recorder
    # (.fr.json) files of 4 ranks.
    src = SAMPLES / "straggler_rank2"
    orig, bom = tmp_path / "orig", tmp_path / "bom"
    orig.mkdir()
    bom.mkdir()
    for f in sorted(src.iterdir()):
        if f.name.endswith(
            (".trace.json.gz", ".fr.json", ".meta.json")
        ):  # .meta.json: the collector's sidecar
            name = f.name if gz or f.suffix != ".gz" else f.name[: -len(".gz")]
            plain = f if name == f.name else orig / name
            if plain is not f:
                plain.write_bytes(gzip.decompress(f.read_bytes()))
            else:
                shutil.copy(f, orig / name)
            _with_bom(orig / name, bom / name)
    assert all((bom / p.name).read_bytes() != p.read_bytes() for p in orig.iterdir())
    want = _tables(tmp_path / "a.duckdb", [orig], "r")
    got = _tables(tmp_path / "b.duckdb", [bom], "r")
    assert {t: len(rows) for t, rows in got.items()} == {t: len(rows) for t, rows in want.items()}
    assert len(want["events"]) > 1000 and len(want["collectives"]) > 0
    assert got == want


def test_bom_split_across_gzip_members_is_blanked(tmp_path):
    # Two gzip members, the first holding one byte of the mark: the stream's first piece is
    # shorter than the mark and is joined with the next.
    text = json.dumps(micro_trace(["op"])).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(BOM[:1]) + gzip.compress(BOM[1:] + text))
    stream = fileio.TextStream(path)
    assert b"".join(stream) == b"   " + text
    assert fileio.read_maybe_gzip(path)[1] == b"   " + text


def test_blank_bom_only_touches_a_leading_mark():
    assert fileio.blank_bom(BOM + b"{}") == b"   {}"
    assert fileio.blank_bom(b"{}" + BOM) == b"{}" + BOM
    assert fileio.blank_bom(BOM[:2]) == BOM[:2]
    assert fileio.blank_bom(b"") == b""


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_error_offsets_count_the_bom(tmp_path, gz):
    # Truncated JSON after the mark: the offset named is the length of the (decompressed) file,
    # BOM included, as a hex editor shows it.
    text = BOM + json.dumps(micro_trace(["op"])).encode()[:-5]
    path = tmp_path / ("rank0.json.gz" if gz else "rank0.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    with Store(tmp_path / "s.duckdb") as store, pytest.raises(TraceFormatError) as e:
        ingest(store, [path], run="r", jobs=1)
    assert f"byte {len(text)}" in str(e.value)


def test_bom_nccl_profiler_dump_is_claimed_and_parsed_the_same(tmp_path):
    from tests.collectors.test_nccl_profiler import COMM, _plugin_dump
    from traceprof.collectors.nccl_profiler.parse import parse as nccl_parse
    from traceprof.ingest import sources

    plain = tmp_path / f"nccl_profile_{COMM}_0.json"
    plain.write_text(_plugin_dump(0))
    bom = tmp_path / "bom" / plain.name
    bom.parent.mkdir()
    _with_bom(plain, bom)
    assert sources.claim(bom).name == "nccl_profiler"
    a, b = nccl_parse(plain), nccl_parse(bom)
    assert b.collectives.num_rows > 0
    assert b.collectives.equals(a.collectives) and b.events.equals(a.events)
    assert (b.rank, b.world_size, b.rejected) == (a.rank, a.world_size, a.rejected)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "empty: no JSON text"),
        (BOM, "no JSON text, only 3 bytes of whitespace or byte order mark"),
        (b"  \n", "no JSON text, only 3 bytes of whitespace or byte order mark"),
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_a_file_without_json_text_says_so(tmp_path, body, message, gz):
    from traceprof.collectors.kineto.parse import parse

    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(body) if gz else body)
    with pytest.raises(TraceFormatError) as e:
        parse(path)
    assert str(e.value) == f"{path}: {message}"
