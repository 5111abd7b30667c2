"""Output for CI and agents: structured findings (``summary -f json``), the JSON envelope of
``analyze --with-notes``, and Markdown for a pull-request comment (``summary``/``diff -f markdown``)."""

from __future__ import annotations

import json
import shlex

import polars as pl
import pytest

from tests.cli.test_cli import cli
from tests.conftest import SAMPLES


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("machine")
    path = tmp / "s.duckdb"
    runs = [str(SAMPLES / n) for n in ("straggler_rank2", "normal", "extra_matmul")]
    r = cli("ingest", *runs, "--db", str(path), cwd=tmp)
    assert r.returncode == 0, r.stderr
    return path


def _json(db, *args):
    r = cli(*args, "--db", str(db), "-f", "json", cwd=db.parent)
    assert r.returncode in (0, 3), r.stderr
    return json.loads(r.stdout)


def test_summary_json_findings_carry_rank_metric_cause_and_evidence(db):
    doc = _json(db, "summary", "--run", "straggler_rank2")
    top = doc["findings"][0]
    assert top["topic"] == "stragglers" and top["ranks"] == [2] and top["status"] == "problem"
    # value: the stragglers table's wait_caused_ns of rank 2, an exact integer of ns
    st = pl.DataFrame(_json(db, "analyze", "stragglers", "--run", "straggler_rank2"))
    assert top["metric"] == "wait_caused_ns" and top["unit"] == "ns"
    assert top["value"] == st.filter(pl.col("rank") == 2)["wait_caused_ns"].item()
    verdict = pl.DataFrame(
        _json(db, "analyze", "stragglers", "--run", "straggler_rank2", "--table", "verdict")
    )
    assert top["cause"] == verdict.filter(pl.col("rank") == 2)["cause"].item() == "untraced host time"
    # recoverable_ns: the others' waits for rank 2 by the step account (critical_path's blame rows
    # of rank 2), and recoverable_pct is that time as % of all ranks' step time
    cp = pl.DataFrame(_json(db, "analyze", "critical_path", "--run", "straggler_rank2"))
    blame = pl.DataFrame(
        _json(db, "analyze", "critical_path", "--run", "straggler_rank2", "--table", "blame")
    )
    waited = int(blame.filter(pl.col("rank") == 2)["waited_ns"].sum())
    assert top["recoverable_ns"] == waited > 0
    assert top["recoverable_pct"] == pytest.approx(100 * waited / int(cp["step_ns"].sum()))
    # evidence: the table that shows it, and a command that prints it
    ev = top["evidence"]
    assert (ev["analysis"], ev["table"]) == ("stragglers", "verdict")
    # the command names the store, so that it runs as printed from any folder
    assert ev["command"].endswith(f" --db {shlex.quote(str(db))}")
    r = cli(*shlex.split(ev["command"])[1:], cwd="/")
    assert r.returncode == 0 and "untraced host time" in r.stdout, r.stderr
    # every finding has the fields, typed
    verdicts = {v["topic"]: v["status"] for v in doc["verdicts"]}
    for f in doc["findings"]:
        assert {"topic", "ranks", "metric", "value", "unit", "recoverable_ns", "cause", "evidence"} <= set(f)
        # each finding joins to its verdict (the mfu finding's is the utilization topic's)
        if f["status"] != "info":
            assert verdicts[f["verdict_topic"]] == f["status"]
        assert all(isinstance(x, int) for x in f["ranks"])
        assert f["recoverable_ns"] is None or isinstance(f["recoverable_ns"], int)
    comm = next(f for f in doc["findings"] if f["topic"] == "communication")
    gaps = _json(db, "analyze", "gaps", "--run", "straggler_rank2")
    assert comm["cause"] == gaps[0]["cause"] and comm["metric"] == "exposed_comm_pct"


def test_summary_json_regression_finding_names_the_change(db):
    # extra_matmul adds aten::mm calls to the same job: FLOPs per step +17.8% (the diff's own
    # delta_pct: (7,113,539,584 - 6,039,797,760) / 6,039,797,760 = 17.78%), on every rank
    doc = _json(db, "summary", "--run", "extra_matmul", "--baseline", "normal")
    reg = next(f for f in doc["findings"] if f["topic"] == "regression")
    assert doc["baseline"] == "normal"
    assert reg["metric"] == "flops_change_pct" and reg["unit"] == "%"
    assert reg["value"] == pytest.approx(100 * (7_113_539_584 - 6_039_797_760) / 6_039_797_760)
    assert reg["ranks"] == [0, 1, 2, 3] and reg["cause"] == "op aten::mm (512,128)@(128,512)"
    assert reg["evidence"]["command"] == f"traceprof diff normal extra_matmul --db {shlex.quote(str(db))}"


def test_summary_markdown_is_a_pr_comment(db):
    r = cli("summary", "--db", str(db), "--run", "straggler_rank2", "-f", "markdown", cwd=db.parent)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "### traceprof summary: run straggler\\_rank2"
    # the exposed transfer beyond the waits for rank 2 (12% of the window, the step account's
    # transfer) is a problem of its own (it read "ok, 0%" while the waits were a per-collective sum)
    assert "Verdict: **problem** (stragglers, communication)" in lines
    row = next(ln for ln in lines if ln.startswith("| 1 |"))
    # its cost: 21.2% of the lower median step (71.69 ms, the 6th of 12), 21.1% of the true median
    # (72.20 ms, the mean of the 6th and 7th)
    assert row.startswith("| 1 | stragglers | problem | 13.8% | 21.1% | 2 | rank 2 is a straggler")


def test_diff_markdown_gates_and_exits_3(db):
    r = cli("diff", "normal", "extra_matmul", "--db", str(db), "-f", "markdown", cwd=db.parent)
    assert r.returncode == 3, r.stderr
    out = r.stdout
    assert "Verdict: **REGRESSION** (exit 3)" in out
    flops = next(ln for ln in out.splitlines() if ln.startswith("| flops |"))
    assert "| +17.8% | 1.0% |" in flops and "| regression |" in flops
    step = next(ln for ln in out.splitlines() if ln.startswith("| step\\_time\\_ns |"))
    assert "| inconclusive |" in step and " ms |" in step  # durations in human units
    # every table row has as many cells as its header (no name broke a row)
    for block in out.split("\n\n"):
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        if rows:
            assert len({ln.replace("\\|", "").count("|") for ln in rows}) == 1, block


def test_analyze_json_with_notes_carries_units_and_notes(db):
    doc = _json(db, "analyze", "mfu", "--run", "straggler_rank2", "--with-notes")
    assert doc["analysis"] == "mfu" and doc["run"] == "straggler_rank2" and doc["table"] == "frame"
    units = {c["name"]: c["unit"] for c in doc["columns"]}
    assert units["step_ns"] == "ns" and units["tflops"] == "TFLOP/s" and units["flops"] == "FLOP"
    assert doc["rows"] == _json(db, "analyze", "mfu", "--run", "straggler_rank2")
    assert [c["name"] for c in doc["columns"]] == list(doc["rows"][0])
    # a CPU-only sample: the note saying why MFU is empty is there, with its kind
    assert any(n["kind"] == "mfu_empty" and "CPU-only run" in n["text"] for n in doc["notes"])
    r = cli("analyze", "mfu", "--db", str(db), "--with-notes", cwd=db.parent)
    assert r.returncode == 1 and "--with-notes goes with --format json" in r.stderr
