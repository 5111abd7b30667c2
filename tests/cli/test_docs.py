"""The README's generated tables (commands, kernel families), ``--version`` and the changelog stay
true to the code: each is generated from, or checked against, the one place it is declared."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer

import traceprof
from tests.conftest import REPO
from traceprof import docs
from traceprof.cli import app
from traceprof.core.classify import COMM_FAMILIES

README = REPO / "README.md"


def _section(text: str, name: str) -> list[str]:
    body = text.split(f"<!-- generated: {name} ")[1].split(f"<!-- end: {name} -->")[0]
    return [ln for ln in body.splitlines() if ln.startswith("| ")][1:]  # the table rows, header off


def test_readme_generated_sections_are_current():
    text = README.read_text()
    assert docs.render(text) == text, "run `make docs`"


def test_commands_table_has_one_row_per_command_with_its_options():
    rows = _section(README.read_text(), "commands")
    # Counted by hand from cli.py: 10 top-level commands (ingest, sql, analyze, summary, report,
    # diff, history, collect, runs, config), runs rm/mv, baseline + list/add/rm, export perfetto = 17.
    assert len(rows) == 17
    paths = [r.split("`")[1] for r in rows]
    assert paths[:3] == ["traceprof ingest PATH...", "traceprof sql QUERY", "traceprof analyze [NAME]"]
    assert "traceprof baseline rm NAME [RUN...]" in paths and "traceprof export perfetto" in paths
    analyze = rows[2]
    for opt in ("--db", "--run", "--param", "--table", "--save", "--units", "--no-cache"):
        assert f"`{opt}`" in analyze, analyze
    assert "`--help`" not in analyze
    # Every command says what it does (its help's first paragraph, never empty).
    assert all(r.split(" | ")[1].strip() for r in rows)


def test_a_stale_table_is_rewritten_and_missing_markers_are_an_error():
    text = README.read_text()
    stale = text.replace("`--skip-bad-events`, ", "", 1)
    assert stale != text and docs.render(stale) == text
    with pytest.raises(ValueError, match="kernel-families"):
        docs.render(text.replace("<!-- end: kernel-families -->", ""))


def test_kernel_family_table_lists_every_family():
    rows = _section(README.read_text(), "kernel-families")
    assert [r.split("`")[1] for r in rows] == [f.name for f in COMM_FAMILIES]
    # A pattern with | is escaped so the table keeps its four columns.
    assert all(r.count(" | ") == 3 for r in rows)


def test_version_is_declared_once_and_printed():
    # pyproject takes the version from traceprof.__version__ (the wheel's name carries it: the
    # smoke test checks that the installed CLI prints the same).
    pyproject = (REPO / "pyproject.toml").read_text()
    project = pyproject.split("\n[project]\n")[1].split("\n[")[0]
    dynamic = pyproject.split("\n[tool.setuptools.dynamic]\n")[1].split("\n[")[0]
    assert re.search(r'^dynamic = \["version"\]', project, re.M) and not re.search(
        r"^version =", project, re.M
    )
    assert re.search(r'^version = \{attr = "traceprof.__version__"\}', dynamic, re.M)
    assert re.fullmatch(r"\d+\.\d+\.\d+", traceprof.__version__)
    r = subprocess.run([sys.executable, "-m", "traceprof.cli", "--version"], capture_output=True, text=True)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"traceprof {traceprof.__version__}\n", "")
    # --version is eager: it answers before a command's own arguments are parsed.
    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "--version", "diff"], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout == f"traceprof {traceprof.__version__}\n"


def test_changelog_has_the_version_and_an_unreleased_section():
    heads = re.findall(r"^## \[?([^\]\s]+)\]?", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert heads[0] == "Unreleased" and traceprof.__version__ in heads


def test_every_command_has_help():
    group = typer.main.get_command(app)
    for path, cmd in docs._commands(group, "traceprof"):
        assert (cmd.help or "").strip(), path
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden:
                assert getattr(p, "help", None), f"{path} {p.opts[0]}"
