"""The ``traceprof`` console script: Ctrl-C while the CLI's libraries load is a clean exit too.

Importing the CLI (polars, DuckDB, rich, typer) takes a second or two; a Ctrl-C in that time would
otherwise print a traceback. Nothing has been changed then, and this says so (exit 130).
"""

from __future__ import annotations

import signal
import sys

__all__ = ["main"]


def main() -> None:
    """Load :mod:`traceprof.cli` and run it."""
    try:
        from traceprof.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; nothing was changed\n")
        sys.exit(130)
    try:
        cli_main()
    finally:  # the command is over (its outcome printed): a Ctrl-C while Python exits changes nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
