"""One ``-p`` syntax in every command, the config file and its precedence, shell completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES


def run(*args: str, cwd, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("TRACEPROF_")}
    return subprocess.run(
        [sys.executable, "-m", "traceprof.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**e, **(env or {})},
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A folder holding s.duckdb with the runs normal and extra_matmul (and no config file)."""
    tmp = tmp_path_factory.mktemp("params")
    r = run("ingest", str(SAMPLES / "normal"), str(SAMPLES / "extra_matmul"), "--db", "s.duckdb", cwd=tmp)
    assert r.returncode == 0, r.stderr
    return tmp


def _job(home, *p: str, db: tuple[str, ...] = ("--db", "s.duckdb"), env=None) -> dict:
    r = run("analyze", "mfu", *db, "--run", "normal", "--table", "job", "-f", "json", *p, cwd=home, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


def test_both_forms_in_analyze_summary_diff_history(home):
    # With a peak of 100 TFLOP/s, MFU (%) = 100 x achieved TFLOP/s / 100 = the achieved TFLOP/s.
    bare, named = _job(home, "-p", "peak_tflops=100"), _job(home, "-p", "mfu.peak_tflops=100")
    assert bare == named and bare["mfu_pct"] == pytest.approx(bare["tflops"])
    for p in ("peak_tflops=100", "mfu.peak_tflops=100"):
        r = run("summary", "--db", "s.duckdb", "--run", "normal", "-f", "json", "-p", p, cwd=home)
        mfu = next(f for f in json.loads(r.stdout)["findings"] if f["topic"] == "mfu")
        assert "peak 100 TFLOP/s, user" in mfu["finding"] and mfu["value"] == pytest.approx(bare["mfu_pct"])
        r = run("diff", "normal", "extra_matmul", "--db", "s.duckdb", "-f", "json", "-p", p, cwd=home)
        assert r.returncode == 3, r.stderr
        metrics = {m["metric"] for m in json.loads(r.stdout)["metrics"]}
        assert "mfu_pct" in metrics and "tflops" not in metrics  # the peak made MFU known
        r = run("history", "normal,extra_matmul", "--db", "s.duckdb", "-f", "json", "-p", p, cwd=home)
        assert r.returncode == 0 and "mfu_pct" in {x["metric"] for x in json.loads(r.stdout)["rows"]}


def test_report_takes_the_bare_form(home):
    r = run(
        "report", "--db", "s.duckdb", "--run", "normal", "-o", "r.html", "-p", "peak_tflops=100", cwd=home
    )
    assert r.returncode == 0, r.stderr
    assert "peak 100 TFLOP/s, user" in (home / "r.html").read_text()


def test_wrong_keys_and_analyses_are_one_line_errors(home):
    r = run("summary", "--db", "s.duckdb", "-p", "peak_tflop=1", cwd=home)
    assert r.returncode == 1 and "no analysis of this command takes 'peak_tflop'" in r.stderr
    assert "mfu.peak_tflops" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run("analyze", "mfu", "--db", "s.duckdb", "-p", "gaps.hta=true", cwd=home)
    assert r.returncode == 1 and "runs no analysis 'gaps'; it runs mfu" in r.stderr
    r = run("diff", "normal", "extra_matmul", "--db", "s.duckdb", "-p", "nosuch=1", cwd=home)
    assert r.returncode == 1 and "analysis 'mfu' has no parameter 'nosuch'" in r.stderr


def test_config_file_store_params_and_precedence(home, tmp_path):
    work = tmp_path / "w" / "sub"
    work.mkdir(parents=True)
    (tmp_path / "w" / "traceprof.toml").write_text(
        f'db = "{home / "s.duckdb"}"\n[params]\n"mfu.peak_tflops" = 100\n[params.mfu]\ndtype = "fp32"\n'
    )
    base = _job(home, "-p", "peak_tflops=100")
    got = _job(work, db=())  # store and peak from the file found one folder up
    assert got["peak_tflops"] == 100 and got["mfu_pct"] == pytest.approx(base["mfu_pct"])
    # the command line overrides the file key by key: half the peak, twice the MFU
    half = _job(work, "-p", "peak_tflops=50", db=())
    assert half["peak_tflops"] == 50 and half["mfu_pct"] == pytest.approx(2 * base["mfu_pct"])
    # the environment overrides the file's store; --db overrides the environment
    r = run("runs", cwd=work, env={"TRACEPROF_DB": str(tmp_path / "none.duckdb")})
    assert r.returncode == 1 and "none.duckdb" in r.stderr
    r = run("runs", "--db", str(home / "s.duckdb"), cwd=work, env={"TRACEPROF_DB": "x.duckdb"})
    assert r.returncode == 0 and "extra_matmul" in r.stdout
    r = run("config", "-f", "json", cwd=work, env={"TRACEPROF_DB": "x.duckdb"})
    rows = {x["setting"]: x for x in json.loads(r.stdout)}
    assert rows["db"]["value"] == "x.duckdb" and rows["db"]["source"] == "environment (TRACEPROF_DB)"
    assert rows["config"]["value"] == str(tmp_path / "w" / "traceprof.toml")
    assert rows["-p mfu.peak_tflops"]["value"] == "100" and rows["-p mfu.dtype"]["value"] == "fp32"
    assert rows["diff -t flops"] == {"setting": "diff -t flops", "value": "0.01", "source": "default"}


def test_config_thresholds_gate_diff_and_cli_overrides(home, tmp_path):
    # extra_matmul's structural changes (flops +17.8%, launches +5.8%) pass thresholds of 50%;
    # the timing changes are inconclusive with one baseline run: exit 4 instead of 3
    f = tmp_path / "gate.toml"
    f.write_text("[diff.thresholds]\nflops = 0.5\nlaunches = 0.5\n")
    args = ("diff", "normal", "extra_matmul", "--db", str(home / "s.duckdb"))
    assert run("--config", str(f), *args, cwd=tmp_path).returncode == 4
    assert run(*args, cwd=tmp_path, env={"TRACEPROF_CONFIG": str(f)}).returncode == 4
    assert run("--config", str(f), *args, "-t", "flops=0.01", cwd=tmp_path).returncode == 3
    assert run(*args, cwd=tmp_path).returncode == 3  # no config: the defaults (1%, 5%)
    bad = tmp_path / "bad.toml"
    bad.write_text("[diff]\nthreshold = 'x'\n")
    r = run("--config", str(bad), *args, cwd=tmp_path)
    assert r.returncode == 1 and f"config file {bad}: diff.threshold: expected a fraction" in r.stderr


def test_shell_completion(tmp_path):
    script = Path(sys.executable).with_name("traceprof")  # the console script, as a shell runs it
    if not script.exists():
        pytest.skip("no traceprof console script beside this Python")
    r = subprocess.run([script, "--show-completion", "bash"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and "_TRACEPROF_COMPLETE=complete_bash" in r.stdout, r.stderr
    assert "complete -o default -F _traceprof_completion traceprof" in r.stdout
    # what bash asks when the user presses tab after `traceprof analyze strag`
    env = {"_TRACEPROF_COMPLETE": "complete_bash", "COMP_WORDS": "traceprof analyze strag", "COMP_CWORD": "2"}
    r = subprocess.run([script], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **env})
    assert r.returncode == 0 and r.stdout.split() == ["stragglers"], r.stderr
    env = {**env, "COMP_WORDS": "traceprof summary --format ", "COMP_CWORD": "3"}
    r = subprocess.run([script], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **env})
    assert r.stdout.split() == ["table", "json", "csv", "markdown"], r.stderr


@pytest.mark.parametrize(
    "body, said",
    [
        # a value the analysis refuses: it blamed "-p" when a command ran, and `config` printed it
        (
            '[params]\n"mfu.peak_tflops" = "abc"\n',
            "[params] mfu.peak_tflops: peak_tflops='abc': expected a number",
        ),
        (
            '[params]\n"mfu.peak_tflops" = -1\n',
            "[params] mfu.peak_tflops: peak_tflops='-1': must be a finite number > 0",
        ),
        ('[params]\n"mfu.bogus" = 1\n', "[params] mfu.bogus: analysis 'mfu' has no parameter 'bogus'"),
        # an unknown bare key was left out silently
        ("[params]\nbogus = 1\n", "[params] bogus: no analysis takes 'bogus'"),
        # thresholds blamed "--threshold" / "-t", naming no file
        ("[diff.thresholds]\nnosuch = 0.1\n", "[diff] thresholds: --threshold nosuch=...: no such metric"),
        ("[diff]\nthreshold = 2\n", "[diff] thresholds: -t 2: thresholds are fractions in (0, 1]"),
    ],
)
def test_a_config_file_no_command_could_use_is_refused_naming_it(tmp_path, body, said):
    f = tmp_path / "traceprof.toml"
    f.write_text(body)
    for args in (("config",), ("runs", "--db", str(tmp_path / "none.duckdb"))):
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"error: {f}: {said}") and "Traceback" not in r.stderr
