"""Formats traceprof recognizes and does not read, each named with what to do instead.

A folder of these is never reported as holding "no trace files": ingest names each file's format
(``traceprof.ingest.sources.recognize``). Each entry claims a file by its name or its first bytes, like a
collector (``traceprof.ingest.sources.Unread``):

- Nsight Systems ``.qdrep`` reports (before 2021.3) and Nsight Compute ``.ncu-rep`` reports
  (``.nsys-rep`` is read: the nsys collector exports it, or says how);
- PyTorch execution traces / Chakra ET (``ExecutionTraceObserver`` JSON with ``schema`` and
  ``nodes``; Chakra's protobuf ``.et`` files): an operator graph without timings;
- PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``: a pickle of ``segments``);
- rocprof / rocprofv2 / rocprofv3 kernel-trace CSV files;
- NCCL Inspector Prometheus output (``NCCL_INSPECTOR_PROM_DUMP=1``; its JSON output is read);
- Perfetto protobuf traces (``.pftrace``, ``.perfetto-trace``).
"""

from __future__ import annotations

import re
from pathlib import Path

from traceprof.collectors.flight_recorder.safe_pickle import is_pickle
from traceprof.core.fileio import blank_bom
from traceprof.ingest.sources import Unread, register_unread

__all__: list[str] = []

_ROCPROF_KERNEL = re.compile(rb'"?Kernel_?Name"?')
_ROCPROF_TIME = re.compile(rb'"?(BeginNs|Start_Timestamp|DispatchNs)"?')
_PROM = re.compile(
    rb"^(# (HELP|TYPE) )?nccl_(algorithm_bandwidth_gbs|bus_bandwidth_gbs|collective_exec_time_microseconds)",
    re.MULTILINE,
)


def _first_line(head: bytes) -> bytes:
    return blank_bom(head).lstrip().split(b"\n", 1)[0]


def _execution_trace(path: Path, head: bytes) -> bool:
    """An ExecutionTraceObserver JSON (``{"schema": "1.1.1-chakra.0.0.4", ..., "nodes": [``) or a
    Chakra protobuf ``.et`` file."""
    body = blank_bom(head).lstrip()
    return path.name.endswith(".et") or (
        body.startswith(b"{") and b'"schema"' in body[:256] and b'"nodes"' in body
    )


def _memory_snapshot(path: Path, head: bytes) -> bool:
    """A pickle whose first key is ``segments`` and whose segments carry allocator fields."""
    return (
        is_pickle(head)
        and b"segments" in head[:64]
        and any(k in head for k in (b"device_traces", b"total_size", b"segment_type", b"blocks"))
    )


def _rocprof_csv(path: Path, head: bytes) -> bool:
    line = _first_line(head)
    return (
        path.suffix == ".csv"
        and _ROCPROF_KERNEL.search(line) is not None
        and _ROCPROF_TIME.search(line) is not None
    )


for _u in (
    Unread(
        "nsys_qdrep",
        "an Nsight Systems report from before 2021.3 (.qdrep)",
        lambda p, h: p.name.endswith(".qdrep"),
        "export it to SQLite with `nsys export --type sqlite -o NAME.sqlite NAME.qdrep` and ingest the .sqlite",
    ),
    Unread(
        "ncu_rep",
        "an Nsight Compute report (.ncu-rep: per-kernel metrics, no timeline)",
        lambda p, h: p.name.endswith(".ncu-rep"),
        "record the run with Nsight Systems (`nsys profile`) or torch.profiler for a timeline",
    ),
    Unread(
        "execution_trace",
        "a PyTorch execution trace / Chakra ET (an operator graph without timings)",
        _execution_trace,
        "ingest the Kineto trace recorded beside it (torch.profiler's JSON), which holds the times",
    ),
    Unread(
        "memory_snapshot",
        "a PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot)",
        _memory_snapshot,
        "it holds allocations, not time; view it at https://pytorch.org/memory_viz",
    ),
    Unread(
        "rocprof_csv",
        "a rocprof kernel trace (CSV)",
        _rocprof_csv,
        "record ROCm runs with torch.profiler (Kineto JSON, ROCm included) and ingest that",
    ),
    Unread(
        "nccl_inspector_prom",
        "NCCL Inspector Prometheus output (NCCL_INSPECTOR_PROM_DUMP=1: snapshots, no per-collective record)",
        lambda p, h: p.suffix == ".prom" or _PROM.search(h[:512]) is not None,
        "run with NCCL_INSPECTOR_PROM_DUMP=0 and NCCL_INSPECTOR_DUMP_VERBOSE=1 (JSON lines, read by traceprof)",
    ),
    Unread(
        "perfetto_proto",
        "a Perfetto protobuf trace",
        lambda p, h: p.name.endswith((".pftrace", ".perfetto-trace")),
        "ingest the PyTorch profiler's Kineto JSON (export_chrome_trace / tensorboard_trace_handler) instead",
    ),
):
    register_unread(_u)
