"""The CLI runs numpy's OpenBLAS on one thread (traceprof.core.blas): its pool of one thread per core
only spun (0.03-0.12 s of CPU per process); a value the user set is kept, and a program launched for
the user gets the environment as the user had it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from traceprof.core import blas
from traceprof.core.blas import BLAS_THREADS, one_blas_thread, user_environ

#: The CLI's process after numpy is imported: OPENBLAS_NUM_THREADS, and its threads (/proc/self/task).
_CHILD = (
    "import os, sys\nfrom traceprof.cli import main\nsys.argv = ['traceprof', '--version']\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\nimport numpy\n"
    "print('BLAS', os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')), file=sys.stderr)"
)


def _child(env: dict[str, str]) -> list[str]:
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("BLAS"), r.stderr
    return last.split()[1:]


def _without_blas() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (BLAS_THREADS, blas._SET_HERE)}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_cli_process_runs_openblas_on_one_thread():
    # before: the variable unset and one OpenBLAS thread per core (2 on a 2-core machine) beside
    # the main thread; after: "1" and the main thread alone (--version starts no thread)
    assert _child(_without_blas()) == ["1", "1"]


def test_a_value_the_user_set_is_kept():
    assert _child(_without_blas() | {BLAS_THREADS: "2"})[0] == "2"


def test_programs_launched_for_the_user_get_the_users_environment(monkeypatch, tmp_path):
    kineto_launch = importlib.import_module("traceprof.collectors.kineto.launch")
    export = importlib.import_module("traceprof.collectors.nsys.export")

    for name in (BLAS_THREADS, blas._SET_HERE):  # recorded as absent, restored so after the test
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    one_blas_thread()
    assert os.environ[BLAS_THREADS] == "1" and BLAS_THREADS not in user_environ()
    seen: list[dict[str, str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, env, check: seen.append(env) or _Done())
    kineto_launch.launch(["train.py"], tmp_path / "out", python="/no/such/python")
    monkeypatch.setattr(export.shutil, "which", lambda _: "/usr/bin/nsys")
    export.launch_nsys(["train.py"], tmp_path / "nsys", python="/no/such/python")
    assert len(seen) == 2 and all(BLAS_THREADS not in env for env in seen)
    assert seen[0][kineto_launch.OUT_ENV] == str((tmp_path / "out").resolve())
    monkeypatch.setenv(BLAS_THREADS, "4")  # the user's own value, which the launched program keeps
    monkeypatch.delenv(blas._SET_HERE)
    assert user_environ()[BLAS_THREADS] == "4"


class _Done:
    returncode = 0
