"""Run the traceprof CLI in this process (fast) and capture exit code, stdout and stderr."""

from __future__ import annotations

import contextlib
import io
import sys


def run(*args: str) -> tuple[int, str, str]:
    """``traceprof ARGS`` through :func:`traceprof.cli.main`: (exit code, stdout, stderr).

    ``ingest`` runs with ``-j 1`` unless told otherwise: forking parser workers from the test process,
    which holds threads (DuckDB, torch), can crash the child; the subprocess tests exercise workers.
    """
    from traceprof.cli import main

    if args and args[0] == "ingest" and "-j" not in args and "--jobs" not in args:
        args = (*args, "-j", "1")

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["traceprof", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
        # the pandas guard `ingest` installs lasts for its process; here the process goes on (a
        # later in-process `report` draws with bokeh, which imports pandas)
        sys.meta_path[:] = [f.finder if type(f).__name__ == "_NoPandas" else f for f in sys.meta_path]
    return code, out.getvalue(), err.getvalue()
