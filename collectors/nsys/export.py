"""Capture side of the nsys collector: ``nsys profile`` around every rank, ``nsys export`` of reports.

Both need the ``nsys`` executable (Nsight Systems CLI) on PATH; without it they raise a one-line
:class:`~traceprof.core.errors.UsageError` / :class:`~traceprof.core.errors.TraceFormatError` saying what to run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from traceprof.core import term
from traceprof.core.blas import user_environ
from traceprof.core.errors import TraceFormatError, UsageError

__all__ = ["sqlite_for", "profile_command", "launch_nsys", "TRACE_OPTIONS"]

#: What ``traceprof collect --nsys`` records: CUDA API + GPU activity, NVTX ranges, OS runtime calls.
TRACE_OPTIONS = ("--trace=cuda,nvtx,osrt", "--sample=none", "--cpuctxsw=none")
_REP = ".nsys-rep"

#: First bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"


def _sibling_sqlite(rep: Path) -> Path:
    return rep.with_name(rep.name[: -len(_REP)] + ".sqlite")


def has_export(rep: Path) -> bool:
    """True when ``x.nsys-rep`` has an ``x.sqlite`` beside it (then the SQLite file is read)."""
    return rep.name.endswith(_REP) and _sibling_sqlite(rep).is_file()


def sqlite_for(path: Path) -> Path:
    """The SQLite export to read for ``path``: itself, or for a ``.nsys-rep`` report the ``.sqlite``
    beside it, exported now with ``nsys export --type sqlite`` when absent.

    Raises:
        TraceFormatError: A report with no export beside it and no ``nsys`` on PATH (the message
            gives the command), or ``nsys export`` failed.
    """
    if not path.name.endswith(_REP):
        return path
    out = _sibling_sqlite(path)
    if out.is_file():
        return out
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceFormatError(
            path,
            "",
            f"an Nsight Systems report; nsys is not on PATH to export it: run "
            f"`{term.command('nsys', 'export', '--type', 'sqlite', '-o', out.name, path.name)}` and ingest "
            f"{out.name!r}",
        )
    proc = subprocess.run(
        [nsys, "export", "--type", "sqlite", "--output", str(out), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not out.is_file():
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TraceFormatError(path, "", f"nsys export failed (status {proc.returncode}): {last[0]}")
    return out


def profile_command(command: Sequence[str], out_dir: Path) -> list[str]:
    """``nsys profile`` wrapping ``command`` for one rank: per-rank output ``rank%q{RANK}`` in
    ``out_dir``, with an SQLite export written next to the report (``--export=sqlite``)."""
    return [
        "nsys",
        "profile",
        *TRACE_OPTIONS,
        "--export=sqlite",
        "--force-overwrite=true",
        f"--output={out_dir / 'rank%q{RANK}'}",
        *command,
    ]


def launch_nsys(
    script: Sequence[str], out_dir: str | Path, *, nproc: int = 1, python: str = sys.executable
) -> int:
    """Run a training script on ``nproc`` local ranks with each rank under ``nsys profile``
    (``torchrun --no-python ... nsys profile ... python SCRIPT``).

    Returns:
        The job's exit status.

    Raises:
        UsageError: No script, ``nproc < 1``, or nsys not on PATH (one line saying so).
    """
    if not script:
        raise UsageError("no training script: traceprof collect --nsys -o DIR -n N -- train.py [ARGS...]")
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: expected 1 or more ranks")
    if shutil.which("nsys") is None:
        raise UsageError(
            "--nsys: nsys (Nsight Systems CLI) is not on PATH; install it or add its bin folder to PATH"
        )
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--no-python",
        *profile_command([python, *script], out),
    ]
    return subprocess.run(cmd, env=user_environ(), check=False).returncode  # as the user has it
