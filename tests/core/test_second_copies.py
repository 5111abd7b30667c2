"""The guard against a second copy of ``traceprof.analyses`` / ``traceprof.collectors`` imported under
the top-level names of the folders they link in (``analyses``, ``collectors``): ruff's TID251 refuses
the import statements, ``tests/conftest.py`` fails a test (or the collection of a module) that
imports one any other way."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, second_copies


def test_second_copies_names_the_top_level_packages_and_their_modules() -> None:
    """By hand: of these module names, the top-level ``analyses`` and ``collectors`` and their
    submodules are second copies; ``traceprof.analyses`` and a name that merely starts alike are not."""
    modules = [
        "os",
        "analyses",
        "analyses.kernels",
        "traceprof.analyses",
        "collectors.nsys.ranks",
        "collectorsx",
    ]
    assert second_copies(modules) == ["analyses", "analyses.kernels", "collectors.nsys.ranks"]


def test_ruff_refuses_each_form_of_the_import() -> None:
    """``import analyses.x``, ``from analyses import x`` and ``from collectors.x import y`` are each a
    TID251 error (pyproject.toml's banned-api); the same through ``traceprof.`` are not."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed")
    src = (
        "import analyses.kernels\n"
        "from analyses import kernels\n"
        "from collectors.nsys.ranks import Env\n"
        "import traceprof.analyses.kernels\n"
        "from traceprof.analyses import mfu\n"
        "from traceprof.collectors.nsys.ranks import world_size\n"
    )
    out = subprocess.run(
        [
            ruff,
            "check",
            "--select",
            "TID251",
            "--output-format",
            "concise",
            "--stdin-filename",
            "tests/x.py",
            "-",
        ],
        input=src,
        capture_output=True,
        text=True,
        cwd=REPO,
    ).stdout
    lines = sorted(int(x.split(":")[1]) for x in out.splitlines() if "TID251" in x)
    assert lines == [1, 2, 3], out
