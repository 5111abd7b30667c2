"""Launch a training script on N local ranks under the Kineto collector (``traceprof collect``).

The script profiles itself with :func:`traceprof.collectors.kineto.capture.profile_ranks` (no ``out_dir``): this
launcher runs it through ``torch.distributed.run`` (torchrun) with ``$TRACEPROF_OUT`` set, so every rank
writes ``rank<R>.trace.json.gz`` and ``rank<R>.meta.json`` into one folder, ready for ``traceprof ingest``.
torch is not imported here (only looked up); the ranks import it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from traceprof.core.blas import user_environ
from traceprof.core.errors import UsageError

__all__ = ["launch", "OUT_ENV"]

#: The folder ``profile_ranks()`` writes to when it is not given one.
OUT_ENV = "TRACEPROF_OUT"


def launch(
    script: Sequence[str], out_dir: str | Path, *, nproc: int = 1, python: str = sys.executable
) -> int:
    """Run ``python -m torch.distributed.run --nproc-per-node NPROC SCRIPT...`` with ``$TRACEPROF_OUT``.

    Args:
        script: The training script and its arguments.
        out_dir: Folder for the traces (created; must not already hold traces).
        nproc: Ranks on this machine.
        python: Interpreter that has torch.

    Returns:
        The job's exit status (0 on success).

    Raises:
        UsageError: No script, ``nproc < 1``, torch not installed, or ``out_dir`` already holds traces.
    """
    if not script:
        raise UsageError("no training script: traceprof collect -o DIR -n N -- train.py [ARGS...]")
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: expected 1 or more ranks")
    if python == sys.executable and importlib.util.find_spec("torch") is None:
        raise UsageError("torch is not installed; capture needs it: pip install 'traceprof[collect]'")
    out = Path(out_dir)
    if out.is_dir() and any(out.glob("rank*.trace.json*")):
        raise UsageError(f"{out}: already holds traces; give each run its own folder")
    out.mkdir(parents=True, exist_ok=True)
    env = user_environ() | {OUT_ENV: str(out.resolve())}  # as the user has it (traceprof.core.blas)
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *script]
    return subprocess.run(cmd, env=env, check=False).returncode
