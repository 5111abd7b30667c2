"""The first five minutes: what `make demo` runs, the README's glossary and its links, `make check`."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def _dry_run(target: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make")
    r = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_demo_ends_with_the_straggler_answer_the_gate_and_the_report_path():
    lines = _dry_run("demo").splitlines()
    summary = next(i for i, ln in enumerate(lines) if "traceprof summary" in ln)
    assert "--run straggler_rank2" in lines[summary]
    gate = next(
        i for i, ln in enumerate(lines) if re.search(r"traceprof diff normal extra_matmul .*; code=\$\?", ln)
    )
    assert summary < gate
    # the gate's exit 3 is shown and explained, and does not stop make (the line ends with echo)
    assert "diff exited $code: 3 means a regression was found" in " ".join(lines[gate : gate + 2])
    assert any("report of straggler_rank2: /" in ln for ln in lines[gate:])  # the full path


def test_check_is_lint_and_the_quick_tests():
    out = _dry_run("check")
    assert "ruff check" in out and "mypy" in out and '-m "not slow"' in out


def test_readme_opens_with_the_findings_and_a_glossary_of_every_measure():
    head = README[: README.index("## Using it")]
    assert head.index("### What the findings mean") < head.index("| measure | meaning |")
    glossary = head[head.index("| measure | meaning |") :]
    for term in (
        "overlap_pct",
        "exposed communication",
        "non_compute",
        "step window",
        "straggler",
        "S (what-if slowdown)",
        "cost_pct",
        "recoverable",
        "MFU / HFU",
        "algbw / busbw",
        "wait",
        "critical path",
        "host-bound",
        "noise floor",
    ):
        assert any(term in row.split(" | ")[0] for row in glossary.splitlines()[2:] if row.startswith("|")), (
            term
        )
    assert "about 35 min" in head and "make check" in head
    # the links to the full definitions lead somewhere
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", README, flags=re.M)
    }
    for target in re.findall(r"\]\(([^)]+)\)", head):
        if target.startswith("#"):
            assert target[1:] in anchors, target
        else:
            assert (REPO / target).exists(), target
