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
    # torch 2.13's CPU profiler with gloo aborts about 1 process in 3 at interpreter exit, after the
    # files are written (SIGABRT, "terminate called without an active exception"): not traceprof's
    # code, so each rank leaves without the interpreter's teardown.
    import os, sys
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
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


@pytest.mark.parametrize("writers", [2, 1])
def test_a_job_failing_after_every_rank_wrote_its_files_says_so_and_ingests_nothing(tmp_path, writers):
    # Each rank writes its sidecar (as profile_ranks does after the trace) when RANK < writers; rank 0
    # then waits until the writers' files are all there (torchrun stops the other ranks once one
    # fails) and exits 3, the others exit 0.
    script = tmp_path / "train.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "rank, out = int(os.environ['RANK']), pathlib.Path(os.environ['TRACEPROF_OUT'])\n"
        f"if rank < {writers}:\n"
        "    (out / f'rank{rank}.meta.json').write_text('{}')\n"
        "if rank == 0:\n"
        f"    while len(list(out.glob('*.meta.json'))) < {writers}:\n"
        "        time.sleep(0.05)\n"
        "    sys.exit(3)\n"
    )
    out, db = tmp_path / "my run", tmp_path / "s.duckdb"
    cmd = [sys.executable, "-m", "traceprof.cli", "collect", "-o", str(out), "-n", "2", "--db", str(db)]
    r = subprocess.run([*cmd, "--", str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    said = " ".join(r.stderr.split())
    if writers == 2:
        assert "after every rank wrote its trace and sidecar" in said
        assert f"traceprof ingest '{out}' --db {db} reads them" in said
    else:
        assert "may be partial" in said and "every rank" not in said
    assert not db.exists()
