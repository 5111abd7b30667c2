"""Steps of an nsys trace: which NVTX ranges are iterations, and the step of every event.

A range is a step when its name says so: ``ProfilerStep#12`` (torch.profiler's own annotation,
also emitted as NVTX under ``emit_nvtx``), ``step 12``, ``step_12``, ``Step#12``, ``iteration 12``,
``iter_12``, ``train_step:12``, ``train_step 12`` (case-insensitive; the number is the step).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["step_number", "assign_steps"]

_STEP = re.compile(
    r"^(?:ProfilerStep|train[_ ]?step|step|iteration|iter)\s*[#:_=\- ]?\s*(\d+)$", re.IGNORECASE
)
_GPU = frozenset({"kernel", "memcpy", "memset", "sync"})
_LAUNCH = frozenset({"cuda_runtime", "cuda_driver"})


def step_number(name: str) -> int | None:
    """The step number of a range named like a step, else None (also for a number beyond int32,
    the store's step column: such a range stays an annotation)."""
    m = _STEP.match(name.strip())
    return int(m.group(1)) if m and len(m.group(1)) <= 10 and int(m.group(1)) < 2**31 else None


def assign_steps(cols: dict[str, list[Any]]) -> tuple[list[dict[str, Any]], list[int | None]]:
    """Step rows and each event's step (``traceprof.collectors.nsys.parse`` module doc, step 5).

    Args:
        cols: Event columns (kind, name, ts_ns, dur_ns, correlation), epoch ns.

    Returns:
        (``steps`` rows: step, cpu_start_ns, cpu_end_ns, device_start_ns, device_end_ns, is_last;
        the step of every event, None outside steps). When two ranges carry one number (nested
        annotations), the outermost counts.
    """
    kinds, ts, dur = cols["kind"], cols["ts_ns"], cols["dur_ns"]
    spans: dict[int, tuple[int, int]] = {}
    for i, k in enumerate(kinds):
        if k == "step" and (n := step_number(cols["name"][i])) is not None:
            s, e = ts[i], ts[i] + dur[i]
            old = spans.get(n)
            spans[n] = (min(s, old[0]), max(e, old[1])) if old else (s, e)
    n_ev = len(kinds)
    if not spans:
        return [], [None] * n_ev
    order = sorted(spans.items(), key=lambda kv: kv[1][0])
    starts = np.array([s for _, (s, _) in order], dtype=np.int64)
    ends = np.array([e for _, (_, e) in order], dtype=np.int64)
    nums = [n for n, _ in order]
    t = np.array(ts, dtype=np.int64)
    j = np.searchsorted(starts, t, side="right") - 1
    inside = (j >= 0) & (t < ends[np.clip(j, 0, None)])
    by_time: list[int | None] = [
        nums[x] if ok else None for x, ok in zip(j.tolist(), inside.tolist(), strict=True)
    ]
    first: dict[int, int] = {}  # correlation id -> its earliest launch call, whatever the rows' order
    for i in range(n_ev):
        c = cols["correlation"][i]
        if kinds[i] in _LAUNCH and c is not None and (c not in first or ts[i] < ts[first[c]]):
            first[c] = i
    launched = {c: by_time[i] for c, i in first.items()}
    step: list[int | None] = list(by_time)
    bounds: dict[int, list[int]] = {}
    for i in range(n_ev):
        if kinds[i] not in _GPU:
            continue
        corr = cols["correlation"][i]
        s = launched[corr] if corr in launched else by_time[i]
        step[i] = s
        if s is not None and kinds[i] != "sync":
            b = bounds.setdefault(s, [ts[i], ts[i] + dur[i]])
            b[0], b[1] = min(b[0], ts[i]), max(b[1], ts[i] + dur[i])
    last = nums[-1]
    rows = [
        {
            "step": n,
            "cpu_start_ns": s,
            "cpu_end_ns": e,
            "device_start_ns": bounds.get(n, [None, None])[0],
            "device_end_ns": bounds.get(n, [None, None])[1],
            "is_last": n == last,
        }
        for n, (s, e) in order
    ]
    return rows, step
