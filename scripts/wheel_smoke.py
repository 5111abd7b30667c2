"""Wheel smoke test (``make smoke``, run by ``.ci/run``): what a user who pip-installs traceprof gets.

1. Build the wheel (``pip wheel --no-deps``) and check what it installs: one top-level package,
   ``traceprof`` (with ``traceprof.analyses`` and ``traceprof.collectors`` inside it), no
   ``analyses`` or ``collectors`` of its own in site-packages.
2. Install it into a fresh virtual environment (its dependencies from the package index).
3. From another folder (nothing of the checkout importable), run ``traceprof --version`` (it must
   print the wheel's version), ingest a copy of ``sample_traces/normal`` and print its summary, as
   a table and as JSON with findings.

Exits 1 with a line saying what failed; 0 when all passed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(cmd: list[str], cwd: Path, what: str) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(
            f"wheel smoke test: {what} failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
        )
    return r.stdout


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="traceprof-smoke-") as tmp:
        work = Path(tmp)
        _run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), str(REPO)],
            REPO,
            "building the wheel",
        )
        (wheel,) = (work / "dist").glob("traceprof-*.whl")
        names = zipfile.ZipFile(wheel).namelist()
        tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
        if tops != {"traceprof"}:
            sys.exit(
                f"wheel smoke test: {wheel.name} installs {sorted(tops)}, not the traceprof package alone"
            )
        for pkg in (
            "traceprof/analyses/__init__.py",
            "traceprof/collectors/__init__.py",
            "traceprof/analyses/gaps.sql",
        ):
            if pkg not in names:
                sys.exit(f"wheel smoke test: {wheel.name} lacks {pkg}")
        venv.create(work / "venv", with_pip=True)
        py = work / "venv" / "bin" / "python"
        _run([str(py), "-m", "pip", "install", "-q", str(wheel)], work, "installing the wheel")
        cli = work / "venv" / "bin" / "traceprof"
        version = wheel.name.split("-")[1]
        got = _run([str(cli), "--version"], work, "traceprof --version").strip()
        if got != f"traceprof {version}":
            sys.exit(f"wheel smoke test: traceprof --version printed {got!r}, not 'traceprof {version}'")
        sample = work / "elsewhere" / "normal"
        shutil.copytree(REPO / "sample_traces" / "normal", sample)
        _run([str(cli), "ingest", str(sample), "--db", "s.duckdb"], work, "traceprof ingest")
        text = _run([str(cli), "summary", "--db", "s.duckdb"], work, "traceprof summary")
        data = json.loads(
            _run([str(cli), "summary", "--db", "s.duckdb", "-f", "json"], work, "traceprof summary -f json")
        )
        if "Findings for run 'normal'" not in text or data["run"] != "normal" or not data["verdicts"]:
            sys.exit(f"wheel smoke test: the summary of the sample is not what it should be:\n{text}")
    print(
        f"wheel smoke test: ok ({wheel.name}: traceprof only; --version, ingest and summary from another folder)"
    )


if __name__ == "__main__":
    main()
