"""traceprof collect: torchrun a self-profiling script on 2 ranks, then ingest the folder."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from collectors.kineto.capture import profile_ranks

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
    r = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "collect", "-o", str(out), "-n", "2", "--db", str(db), "--", str(script)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "rank0.meta.json", "rank0.trace.json.gz", "rank1.meta.json", "rank1.trace.json.gz"]
    assert json.loads((out / "rank1.meta.json").read_text())["world_size"] == 2
    q = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "sql", "--db", str(db), "-f", "json",
         "SELECT name, world_size, (SELECT count(*) FROM collectives) AS colls FROM runs"],
        capture_output=True, text=True,
    )
    (row,) = json.loads(q.stdout)
    # 2 active steps x 1 all_reduce x 2 ranks
    assert (row["name"], row["world_size"], row["colls"]) == ("run1", 2, 4)
    # A second collect into the same folder is refused before anything runs.
    again = subprocess.run(
        [sys.executable, "-m", "traceprof.cli", "collect", "-o", str(out), "--", str(script)],
        capture_output=True, text=True,
    )
    assert again.returncode == 1 and "already holds traces" in again.stderr
