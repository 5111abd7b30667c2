"""The config file: where it is found, what it may hold, and its one-line errors."""

from __future__ import annotations

import pytest

from traceprof.core import config
from traceprof.core.errors import UsageError

FULL = """
db = "store/t.duckdb"
[params]
"mfu.peak_tflops" = 312
hta = true
[params.stragglers]
min_cost_pct = 2.5
[diff]
threshold = 0.05
[diff.thresholds]
flops = 0.02
"""


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(config.ENV, raising=False)


def test_traceprof_toml_found_from_a_subdirectory(tmp_path):
    (tmp_path / "traceprof.toml").write_text(FULL)
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    c = config.load(cwd=sub)
    assert c.path == tmp_path / "traceprof.toml" and c.how == "found"
    assert c.db == str(tmp_path / "store" / "t.duckdb")  # relative to the file, not the cwd
    assert c.params == ("mfu.peak_tflops=312", "hta=true", "stragglers.min_cost_pct=2.5")
    assert c.thresholds == {"*": 0.05, "flops": 0.02}


def test_pyproject_tool_table_and_traceprof_toml_wins(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.traceprof]\ndb = "p.duckdb"\n')
    assert config.load(cwd=tmp_path).db == str(tmp_path / "p.duckdb")
    (tmp_path / "traceprof.toml").write_text('db = "t.duckdb"\n')
    assert config.load(cwd=tmp_path).db == str(tmp_path / "t.duckdb")


def test_pyproject_without_the_table_is_passed_over(tmp_path):
    (tmp_path / "traceprof.toml").write_text('db = "up.duckdb"\n')
    inner = tmp_path / "pkg"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert config.load(cwd=inner).db == str(tmp_path / "up.duckdb")


def test_explicit_and_env_and_none(tmp_path, monkeypatch):
    f = tmp_path / "ci.toml"
    f.write_text('db = "ci.duckdb"\n')
    assert config.load(f, cwd=tmp_path).how == "--config"
    monkeypatch.setenv(config.ENV, str(f))
    c = config.load(cwd=tmp_path)
    assert c.how == config.ENV and c.db == str(tmp_path / "ci.duckdb")
    monkeypatch.setenv(config.ENV, "")
    (tmp_path / "traceprof.toml").write_text('db = "found.duckdb"\n')
    assert config.load(cwd=tmp_path) == config.Config()  # empty: no config file at all


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("dbb = 'x'\n", "dbb: unknown key; keys: db, diff, params"),
        ("db = 3\n", "db: expected a path"),
        ("[diff]\nthreshold = 'high'\n", "diff.threshold: expected a fraction"),
        ("[diff]\nthresold = 0.1\n", "diff.thresold: unknown key"),
        ("[params]\nx = [1, 2]\n", "params.x: expected a number, a string or a boolean"),
        ("db = \n", "not valid TOML"),
    ],
)
def test_bad_files_are_one_line_naming_file_and_key(tmp_path, text, needle):
    f = tmp_path / "traceprof.toml"
    f.write_text(text)
    with pytest.raises(UsageError) as e:
        config.load(cwd=tmp_path)
    assert str(f) in str(e.value) and needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UsageError, match="no such file"):
        config.load(tmp_path / "missing.toml")


def test_a_config_file_not_utf8_is_one_line(tmp_path):
    # tomllib raised UnicodeDecodeError (a traceback from every command); b"\xff" is never UTF-8
    f = tmp_path / "traceprof.toml"
    f.write_bytes(b'db = "x"\n\xff\xfe\n')
    with pytest.raises(UsageError) as e:
        config.load(cwd=tmp_path)
    assert str(e.value) == f"config file {f}: not valid TOML (not UTF-8: byte 9)"
    # a pyproject.toml found while searching is not ours to judge: skipped, as a broken one is
    f.unlink()
    (tmp_path / "pyproject.toml").write_bytes(b"\xff[tool.traceprof]\n")
    assert config.load(cwd=tmp_path) == config.Config()
