"""Files of formats traceprof recognizes and does not read (issue 28, kind 5): named as that format
with what to do, alone, in a folder of their own (never "no trace files found") and beside traces
(a warning). Each file is written here in the first bytes its tool writes."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from tests.conftest import case
from traceprof.core.errors import TraceFormatError, UsageError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


def _et_json(path: Path) -> None:
    """PyTorch ExecutionTraceObserver output (what Chakra converts): schema, pid, time, nodes."""
    path.write_text(
        json.dumps(
            {
                "schema": "1.1.1-chakra.0.0.4",
                "pid": 4242,
                "time": "2026-01-01 00:00:00",
                "start_ts": 17,
                "nodes": [
                    {
                        "id": 1,
                        "name": "[pytorch|profiler|execution_trace|thread]",
                        "ctrl_deps": 0,
                        "inputs": {},
                        "outputs": {},
                        "attrs": [],
                    }
                ],
                "finish_ts": 99,
            }
        )
    )


def _snapshot(path: Path) -> None:
    """torch.cuda.memory._dump_snapshot(): a pickle of segments (with their blocks) and device_traces."""
    seg = {
        "device": 0,
        "address": 139_000_000,
        "total_size": 2_097_152,
        "allocated_size": 512,
        "active_size": 512,
        "requested_size": 500,
        "stream": 0,
        "segment_type": "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [{"address": 139_000_000, "size": 512, "state": "active_allocated"}],
    }
    path.write_bytes(
        pickle.dumps({"segments": [seg], "device_traces": [[]], "allocator_settings": {}}, protocol=4)
    )


def _rocprof(path: Path) -> None:
    path.write_text(
        '"Index","KernelName","gpu-id","queue-id","queue-index","pid","tid","grd","wgr","lds","scr",'
        '"arch_vgpr","accum_vgpr","sgpr","wave_size","sig","obj","DispatchNs","BeginNs","EndNs","CompleteNs"\n'
        '0,"Cijk_Alik_Bljk_HHS_BH",0,0,0,12,12,1024,256,0,0,64,0,48,64,"0x0","0x7f",1,2,3,4\n'
    )


def _prom(path: Path) -> None:
    path.write_text(
        "# HELP nccl_bus_bandwidth_gbs NCCL bus bandwidth in GB/s\n# TYPE nccl_bus_bandwidth_gbs gauge\n"
        'nccl_bus_bandwidth_gbs{comm_id="0xd152c00f111816",collective="AllReduce",rank="4"} 485.1\n'
    )


FORMATS = {  # file name -> (writer, the format's words in the message)
    "report.qdrep": (
        lambda p: p.write_bytes(b"\x00QDREP\x01" * 8),
        "an Nsight Systems report from before 2021.3 "
        "(.qdrep), which traceprof does not read: export it to SQLite with `nsys export --type sqlite "
        "-o NAME.sqlite NAME.qdrep` and ingest the .sqlite",
    ),
    "kernels.ncu-rep": (lambda p: p.write_bytes(b"NVCU\x00" * 8), "an Nsight Compute report (.ncu-rep"),
    "et_rank0.json": (
        _et_json,
        "a PyTorch execution trace / Chakra ET (an operator graph without timings), which "
        "traceprof does not read: ingest the Kineto trace recorded beside it",
    ),
    "chakra.0.et": (
        lambda p: p.write_bytes(b"\x08\x01\x12\x04\x31\x2e\x30"),
        "a PyTorch execution trace / Chakra ET",
    ),
    "snapshot.pickle": (
        _snapshot,
        "a PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot), which "
        "traceprof does not read: it holds allocations, not time",
    ),
    "results.csv": (_rocprof, "a rocprof kernel trace (CSV), which traceprof does not read"),
    "gpu0.prom": (_prom, "NCCL Inspector Prometheus output (NCCL_INSPECTOR_PROM_DUMP=1"),
    "trace.pftrace": (lambda p: p.write_bytes(b"\x0a\x05\x12\x03abc"), "a Perfetto protobuf trace"),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_named_alone_and_in_a_folder_of_their_own(tmp_path, name):
    writer, words = FORMATS[name]
    folder = tmp_path / "run"
    folder.mkdir()
    f = folder / name
    writer(f)
    with Store(tmp_path / "s.duckdb") as store:
        for target in (f, folder):
            with pytest.raises((UsageError, TraceFormatError)) as e:
                ingest(store, [target], jobs=1)
            msg = str(e.value)
            assert words in msg, msg
            assert "no trace files found" not in msg and "not a trace file traceprof reads" not in msg
            assert name in msg
        assert store.sql("SELECT count(*) FROM traces").item() == 0


def test_beside_traces_they_are_named_in_a_warning(tmp_path):
    """A folder with the shared Inspector case's two files, a .qdrep and a memory snapshot: the
    two traces are stored, and each other file is named with its format in a warning."""
    run = tmp_path / "run"
    shutil.copytree(case("nccl_inspector_records") / "nccl-inspector-unknown-jobid", run)
    for name in ("report.qdrep", "snapshot.pickle"):
        FORMATS[name][0](run / name)
    with Store(tmp_path / "s.duckdb") as store:
        res = ingest(store, [run], jobs=1)
        assert store.sql("SELECT count(*) FROM traces").item() == 2
    assert f"not read: {run / 'report.qdrep'}: {FORMATS['report.qdrep'][1]}" in res.warnings
    assert any(
        w.startswith(f"skipped {run / 'snapshot.pickle'}: a PyTorch CUDA memory snapshot")
        for w in res.warnings
    )


def test_inspector_output_of_a_version_not_read_is_named_in_a_folder(tmp_path):
    """A folder of Inspector output written by a version traceprof does not read: the error names
    the format and the version, not an empty folder."""
    src = case("nccl_inspector_records") / "nccl-inspector-unknown-jobid"
    run = tmp_path / "nccl-inspector-7"
    run.mkdir()
    for f in src.iterdir():
        (run / f.name).write_text(f.read_text().replace('"v4.0"', '"v9.1"'))
    with Store(tmp_path / "s.duckdb") as store, pytest.raises(TraceFormatError) as e:
        ingest(store, [run], jobs=1)
    assert (
        "line 1: NCCL Inspector output version 'v9.1', which traceprof does not read: it reads versions v4.0 to "
        "v4.x (NCCL 2.28.3+)" in str(e.value)
    )


def test_a_folder_of_several_such_files_names_each(tmp_path):
    """Some are claimed by a collector first (the .json by Kineto, the .pickle by Flight Recorder)
    and turn out not to be its traces, the .qdrep by none: the one error names all three formats."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("report.qdrep", "et_rank0.json", "snapshot.pickle"):
        FORMATS[name][0](run / name)
    with Store(tmp_path / "s.duckdb") as store, pytest.raises(UsageError) as e:
        ingest(store, [run], jobs=1)
    msg = str(e.value)
    assert msg.startswith(f"{run}: holds no trace file traceprof reads; ")
    for name in ("report.qdrep", "et_rank0.json", "snapshot.pickle"):
        assert f"{name}: {FORMATS[name][1]}" in msg, name


def test_a_snapshot_the_restricted_unpickler_refuses_is_still_named(tmp_path):
    """A memory snapshot holding a set (no plain data for the Flight Recorder reader, which claims
    pickles by name): still named as a memory snapshot, not as a refused Flight Recorder pickle."""
    seg = {"device": 0, "total_size": 512, "segment_type": "small", "blocks": [], "tags": {1, 2}}
    f = tmp_path / "snapshot.pickle"
    f.write_bytes(pickle.dumps({"segments": [seg], "device_traces": []}, protocol=4))
    with Store(tmp_path / "s.duckdb") as store, pytest.raises(TraceFormatError) as e:
        ingest(store, [f], jobs=1)
    assert str(e.value).startswith(
        f"{f}: a PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot), which "
        "traceprof does not read"
    )
