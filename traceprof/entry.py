"""The ``traceprof`` console script: Ctrl-C while the CLI's libraries load is a clean exit too.

Importing the CLI (polars, DuckDB, rich, typer) takes a second or two; a Ctrl-C in that time would
otherwise print a traceback. Nothing has been changed then, and this says so (exit 130). A library
missing from the environment is one line naming it and what to install (exit 1), not a traceback.
"""

from __future__ import annotations

import signal
import sys

from traceprof.core.errors import missing_module

__all__ = ["main"]

#: Compiled libraries whose module initialisation a Ctrl-C must not interrupt: DuckDB's bindings
#: (nanobind) abort the process (SIGABRT, "Critical nanobind error") when a KeyboardInterrupt
#: arrives while they create their types, instead of raising it.
_HELD_IMPORTS = ("duckdb",)


def import_holding_sigint() -> None:
    """Import :data:`_HELD_IMPORTS` with SIGINT blocked (where the platform can), so that a Ctrl-C
    during their initialisation is delivered once they are loaded, as a KeyboardInterrupt at the
    next line of Python. A module already imported costs nothing.

    Raises:
        ModuleNotFoundError: One of them is not installed.
        KeyboardInterrupt: A Ctrl-C came while they loaded (raised just after).
    """
    import importlib

    todo = [n for n in _HELD_IMPORTS if n not in sys.modules]
    held = bool(todo) and hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if held else None
    try:
        for n in todo:
            importlib.import_module(n)
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def main() -> None:
    """Load :mod:`traceprof.cli` and run it."""
    try:
        if sys.argv[1:2] not in (["--version"], ["--help"], []):  # those never open a store (0.2 s less)
            import_holding_sigint()
        from traceprof.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; nothing was changed\n")
        sys.exit(130)
    except ImportError as e:  # typer or rich themselves may be the missing ones: plain text
        sys.stderr.write(f"error: {missing_module(e)}\n")
        sys.exit(1)
    code: str | int | None = 0
    try:
        cli_main()
    except SystemExit as e:  # a command's exit code (an error said, a regression found, ...)
        code = e.code
    finally:  # the command is over (its outcome printed): a Ctrl-C while Python exits changes nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    from traceprof.cli import leave

    leave(code)  # an ingest ends here, failed or not, without Python's teardown, its exit code kept
    sys.exit(code)
