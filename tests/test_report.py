"""The HTML report: one offline file, names escaped, renders in a real browser without JS errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import corpus
from traceprof.errors import UsageError
from traceprof.ingest import ingest
from traceprof.report import write_report

EVIL = '<script>alert("x")</script>&<img src=x onerror=alert(1)>'


def _evil_trace(path: Path) -> Path:
    # A kernel and an NCCL kernel whose names try to inject HTML.
    base = 1_700_000_000_000_000_000
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2, "dur": 1,
         "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": EVIL, "pid": 0, "tid": 7, "ts": 10, "dur": 30,
         "args": {"correlation": 1, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_" + EVIL, "pid": 0, "tid": 8, "ts": 20,
         "dur": 40, "args": {"correlation": 2, "stream": 8, "device": 0}},
    ]
    doc = {"baseTimeNanoseconds": base, "distributedInfo": {"rank": 0, "world_size": 1},
           "deviceProperties": [{"id": 0, "name": EVIL}], "traceEvents": ev}
    path.mkdir()
    (path / "rank0.json").write_text(json.dumps(doc))
    return path


def test_report_offline_and_escaped(store, tmp_path):
    ingest(store, [_evil_trace(tmp_path / "evil")])
    out = write_report(store, None, tmp_path / "r.html")
    text = out.read_text()
    assert EVIL not in text and "&lt;script&gt;alert(" in text
    # Offline: no script or stylesheet is fetched from anywhere.
    assert not re.search(r"<script[^>]+src=", text)
    assert not re.search(r"<link[^>]+href=\"?https?:", text)
    assert "Bokeh" in text and "Temporal breakdown" in text and "Communication/computation overlap" in text


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.skip("chromium not installed (CI installs it: apt-get install chromium)")
    return exe


@pytest.mark.browser
def test_report_renders_without_js_errors(store, tmp_path):
    exe = _chromium()
    ingest(store, [corpus("hta/trace_filter")])
    out = write_report(store, None, tmp_path / "r.html")
    profile = tmp_path / "profile"
    shot = tmp_path / "shot.png"
    r = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-quic",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=5000", "--window-size=1400,2000", f"--screenshot={shot}", out.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    errors = [ln for ln in console if re.search(r"error|Uncaught", ln, re.I)]
    assert shot.exists() and shot.stat().st_size > 10_000, r.stderr[-2000:]
    assert not errors, "\n".join(errors)


def test_report_params_reach_the_analysis(store, tmp_path):
    # nccl_parser_config (A100) has no FLOPs sidecar and no shapes: MFU needs declared FLOPs.
    ingest(store, [corpus("hta/nccl_parser_config")])
    text = write_report(store, None, tmp_path / "r.html", params={"mfu": {"model_flops_per_step": "4e13"}}).read_text()
    assert "MFU (model FLOPs utilization)" in text and "FLOPs source: declared" in text
    with pytest.raises(UsageError, match="no report analysis 'nope'"):
        write_report(store, None, tmp_path / "r2.html", params={"nope": {"x": "1"}})
    with pytest.raises(UsageError, match="peak_tflops"):
        write_report(store, None, tmp_path / "r3.html", params={"mfu": {"peak_tflops": "-1"}})
