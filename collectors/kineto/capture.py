"""Capture side of the Kineto collector: profile every rank of a training job with torch.profiler.

A training script wraps its loop and calls ``step()`` once per iteration::

    with profile_ranks("traces/run1", wait=1, warmup=1, active=3) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Each rank writes two files into ``out_dir``:

* ``rank<R>.trace.json.gz``: the Kineto Chrome trace of the active steps (gzipped JSON; ``ts``/``dur``
  in microseconds relative to ``baseTimeNanoseconds``).
* ``rank<R>.meta.json``: a sidecar with what the trace lacks (host, pid, device, FLOPs per step from
  torch's own ``with_flops`` counters, ...). Schema: ``"format": "traceprof-kineto-meta"``,
  ``"version": 1``; see :func:`build_meta`.

This module imports torch and is for capture only: nothing on the analysis side may import it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections import defaultdict
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from traceprof.collectors.kineto.launch import OUT_ENV

__all__ = ["META_FORMAT", "META_VERSION", "RankProfiler", "build_meta", "profile_ranks", "rank_info"]

META_FORMAT = "traceprof-kineto-meta"
META_VERSION = 1
FLOPS_METHOD = (
    "torch.profiler with_flops: sum of FunctionEvent.flops (torch's formulas for aten::mm, addmm, "
    "bmm, baddbmm, conv, mul, add) over the events whose start lies inside each ProfilerStep#N; "
    "ops without a formula (e.g. CPU scaled_dot_product_attention) count 0"
)
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def rank_info() -> tuple[int, int, str | None]:
    """Return ``(rank, world_size, backend)`` of this process.

    Taken from ``torch.distributed`` when it is initialized, else from the ``RANK`` and
    ``WORLD_SIZE`` environment variables (backend ``None``), else ``(0, 1, None)``.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), None


def _device() -> tuple[str, int]:
    """Return ``(device name, device count)``: the CUDA device in use, else ``("cpu", 1)``."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device()), torch.cuda.device_count()
    return "cpu", 1


def _flops_by_step(events: Any) -> tuple[dict[int, float], dict[str, float], float]:
    """Attribute torch's per-op FLOP counts to profiler steps.

    Args:
        events: ``prof.events()``, a list of ``FunctionEvent`` (times in microseconds).

    Returns:
        ``(flops per ProfilerStep number, flops per op name over all steps, flops of events
        outside every step)``; FLOPs are floating-point operations (a multiply-add counts 2).
    """
    steps: list[tuple[float, float, int]] = []
    for evt in events:
        # FunctionEvent.name is "ProfilerStep*" for every step; trace_name keeps the number.
        m = _STEP_RE.match(getattr(evt, "trace_name", None) or evt.name)
        if m:
            steps.append((evt.time_range.start, evt.time_range.end, int(m.group(1))))
    steps.sort()
    per_step: dict[int, float] = {s[2]: 0.0 for s in steps}
    per_op: dict[str, float] = defaultdict(float)
    outside = 0.0
    for evt in events:
        flops = getattr(evt, "flops", 0) or 0
        if not flops:
            continue
        start = evt.time_range.start
        owner = next((n for s, e, n in steps if s <= start < e), None)
        if owner is None:
            outside += flops
        else:
            per_step[owner] += flops
            per_op[evt.name] += flops
    return per_step, dict(per_op), outside


def build_meta(prof: profile, trace_file: str, sched: dict[str, int]) -> dict[str, Any]:
    """Build the sidecar dictionary for this rank from a finished profiler cycle.

    Args:
        prof: The profiler whose active window just ended.
        trace_file: File name (no directory) of the trace written for this rank.
        sched: The schedule used, ``{"skip_first", "wait", "warmup", "active"}`` in steps.

    Returns:
        The sidecar: ``format``, ``version``, ``rank``, ``world_size``, ``host``, ``pid``, ``device``
        (CUDA device name, or ``"cpu"``), ``device_count`` (CUDA devices visible to the process, or
        1 for a CPU-only run), ``backend`` (``None`` without torch.distributed), ``torch_version``, ``profiled_steps`` (ProfilerStep#N numbers
        in the trace), ``flops_per_step`` (``{"N": flops}``), ``flops_total``, ``flops_method``,
        ``trace_file``, plus ``flops_by_op`` (``{op name: flops}`` over the profiled steps),
        ``flops_outside_steps``, ``schedule``, ``activities``, ``num_threads``, ``local_rank`` and
        ``written_at_ns`` (epoch ns).
    """
    rank, world_size, backend = rank_info()
    device, device_count = _device()
    per_step, per_op, outside = _flops_by_step(prof.events())
    return {
        "format": META_FORMAT,
        "version": META_VERSION,
        "rank": rank,
        "world_size": world_size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": device,
        "device_count": device_count,
        "backend": backend,
        "torch_version": torch.__version__,
        "profiled_steps": sorted(per_step),
        "flops_per_step": {str(n): per_step[n] for n in sorted(per_step)},
        "flops_total": float(sum(per_step.values())),
        "flops_method": FLOPS_METHOD,
        "trace_file": trace_file,
        "flops_by_op": dict(sorted(per_op.items(), key=lambda kv: -kv[1])),
        "flops_outside_steps": float(outside),
        "schedule": sched,
        "activities": ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"],
        "num_threads": torch.get_num_threads(),
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
        "written_at_ns": time.time_ns(),
    }


class RankProfiler:
    """Context manager that runs torch.profiler on this rank and writes trace + sidecar.

    One profiling cycle: ``skip_first`` steps ignored, ``wait`` idle steps, ``warmup`` steps with
    the profiler armed but not recording, then ``active`` recorded steps. The files are written
    when the last active step ends (or at exit, if the loop stops early). Later steps run
    unprofiled.

    Attributes:
        out_dir: Folder the files go to (created if missing).
        meta: The sidecar dictionary once written, else ``None``.
        trace_path: Path of the trace once written, else ``None``.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        skip_first: int = 0,
        with_stack: bool = False,
    ) -> None:
        if active < 1 or min(wait, warmup, skip_first) < 0:
            raise ValueError(
                f"need active >= 1 and wait, warmup, skip_first >= 0; got active={active}, "
                f"wait={wait}, warmup={warmup}, skip_first={skip_first}"
            )
        self.out_dir = Path(out_dir)
        self.sched = {"skip_first": skip_first, "wait": wait, "warmup": warmup, "active": active}
        self.with_stack = with_stack
        self.meta: dict[str, Any] | None = None
        self.trace_path: Path | None = None
        self._prof: profile | None = None

    def _on_trace_ready(self, prof: profile) -> None:
        rank = rank_info()[0]
        trace_file = f"rank{rank}.trace.json.gz"
        self.trace_path = self.out_dir / trace_file
        prof.export_chrome_trace(str(self.trace_path))  # ".gz" suffix: torch gzips it
        self.meta = build_meta(prof, trace_file, self.sched)
        meta_path = self.out_dir / f"rank{rank}.meta.json"
        meta_path.write_text(json.dumps(self.meta, indent=1) + "\n")

    def __enter__(self) -> RankProfiler:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(repeat=1, **self.sched),
            on_trace_ready=self._on_trace_ready,
            record_shapes=True,
            with_flops=True,
            with_stack=self.with_stack,
        )
        self._prof.__enter__()
        return self

    def step(self) -> None:
        """Mark the end of one training iteration (call once per iteration, after the optimizer)."""
        if self._prof is None:
            raise RuntimeError("RankProfiler.step() called outside its 'with' block")
        self._prof.step()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._prof is not None:
            self._prof.__exit__(exc_type, exc, tb)
            self._prof = None


def profile_ranks(
    out_dir: str | os.PathLike[str] | None = None,
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    skip_first: int = 0,
    with_stack: bool = False,
) -> RankProfiler:
    """Profile this rank's training loop; see :class:`RankProfiler`.

    Args:
        out_dir: Folder for ``rank<R>.trace.json.gz`` and ``rank<R>.meta.json``; all ranks of a run
            should share it. Default: ``$TRACEPROF_OUT`` (set by ``traceprof collect``).
        wait: Steps to skip after ``skip_first`` before arming the profiler.
        warmup: Steps with the profiler armed but discarded (hides its start-up cost).
        active: Steps recorded; they appear as ``ProfilerStep#N`` with
            ``N = skip_first + wait + warmup + i`` (0-based iteration numbers).
        skip_first: Steps ignored at the start (e.g. DDP's first iteration that builds buckets).
        with_stack: Record Python stacks (makes traces much larger).

    Returns:
        A context manager; call its ``step()`` once per iteration.

    Raises:
        ValueError: ``active < 1``, a negative step count, or no ``out_dir`` and no ``$TRACEPROF_OUT``.
    """
    if out_dir is None:
        out_dir = os.environ.get(OUT_ENV)
        if not out_dir:
            raise ValueError(
                f"profile_ranks(): pass out_dir, or run under `traceprof collect` (sets ${OUT_ENV})"
            )
    return RankProfiler(
        out_dir, wait=wait, warmup=warmup, active=active, skip_first=skip_first, with_stack=with_stack
    )
