"""Capture side of the Flight Recorder collector: dump each rank's c10d trace ring as JSON.

Usage on every rank::

    enable_fr()                        # before dist.init_process_group
    dist.init_process_group(...)
    ...train...
    dump_fr_json("traces/run1")        # writes traces/run1/rank<R>.fr.json

The JSON comes from ``torch._C._distributed_c10d._dump_fr_trace_json()`` (the same content as the
default pickle dump, minus Python stack frames); entry times are epoch nanoseconds. This module
imports torch and is for capture only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist

__all__ = ["BUFFER_ENV_VAR", "dump_fr_json", "enable_fr"]

# torch 2.13 reads TORCH_FR_BUFFER_SIZE and warns that TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated;
# older releases read only the NCCL-named variable: set that one yourself there.
BUFFER_ENV_VAR = "TORCH_FR_BUFFER_SIZE"


def enable_fr(buffer_entries: int = 2000) -> None:
    """Turn the Flight Recorder on for process groups created after this call.

    Args:
        buffer_entries: Ring-buffer size (collective records kept per process); a value already
            set in the environment wins.
    """
    os.environ.setdefault(BUFFER_ENV_VAR, str(buffer_entries))


def dump_fr_json(out_dir: str | os.PathLike[str]) -> Path:
    """Write this rank's Flight Recorder buffer to ``out_dir/rank<R>.fr.json``.

    Args:
        out_dir: Destination folder (created if missing).

    Returns:
        Path of the file written.

    Raises:
        RuntimeError: torch.distributed is not initialized, or the Flight Recorder was not enabled
            before the process group was created (the dump then has no entries).
    """
    from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("dump_fr_json needs an initialized torch.distributed process group")
    raw = _dump_fr_trace_json()
    if not json.loads(raw).get("entries"):
        raise RuntimeError(
            "Flight Recorder dump has no entries: call enable_fr() (or set TORCH_FR_BUFFER_SIZE) "
            "before dist.init_process_group"
        )
    path = Path(out_dir) / f"rank{dist.get_rank()}.fr.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
    return path
