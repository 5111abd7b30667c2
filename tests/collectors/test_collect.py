"""traceprof collect: torchrun a self-profiling script on 2 ranks, then ingest the folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

#: The message a rank dies with when torch's profiler thread aborts at stop (not traceprof's code).
TORCH_TEARDOWN_CRASH = "terminate called without an active exception"

SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from traceprof.collectors.kineto.capture import profile_ranks

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    lin = torch.nn.Linear(32, 8, bias=False)
    x = torch.randn(16, 32)
    with profile_ranks(wait=0, warmup=1, active=2) as prof:   # out_dir from $TRACEPROF_OUT
        for _ in range(4):
            with torch.no_grad():
                y = lin(x)
            dist.all_reduce(y)
            prof.step()
    dist.destroy_process_group()
    """
)


def test_collect_two_ranks_then_ingest(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out, db = tmp_path / "run1", tmp_path / "s.duckdb"
    cmd = [
        sys.executable,
        "-m",
        "traceprof.cli",
        "collect",
        "-o",
        str(out),
        "-n",
        "2",
        "--db",
        str(db),
        "--",
        str(script),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and TORCH_TEARDOWN_CRASH in r.stderr:
        # torch 2.13's CPU profiler sometimes aborts a rank as it stops (std::terminate in a profiler
        # thread, exit -6), before any traceprof code runs: seen in about 1 of 4 CI runs. Retry once
        # in a fresh folder; a second failure, or any other failure, fails the test.
        shutil.rmtree(out, ignore_errors=True)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "rank0.meta.json",
        "rank0.trace.json.gz",
        "rank1.meta.json",
        "rank1.trace.json.gz",
    ]
    assert json.loads((out / "rank1.meta.json").read_text())["world_size"] == 2
    q = subprocess.run(
        [
            sys.executable,
            "-m",
            "traceprof.cli",
            "sql",
            "--db",
            str(db),
            "-f",
            "json",
            "SELECT name, world_size, (SELECT count(*) FROM collectives) AS colls FROM runs",
        ],
        capture_output=True,
        text=True,
    )
    (row,) = json.loads(q.stdout)
    # 2 active steps x 1 all_reduce x 2 ranks
    assert (row["name"], row["world_size"], row["colls"]) == ("run1", 2, 4)
    # A second collect into the same folder is refused before anything runs.
    again = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "collect", "-o", str(out), "--", str(script)],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 1 and "already holds traces" in again.stderr
