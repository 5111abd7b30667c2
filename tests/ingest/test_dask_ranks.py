"""Many ranks on Dask: a generated 16-rank job (an all-reduce over all ranks and an all-gather in each
of four sub-groups every step) ingested with ``--executor dask`` on a LocalCluster of two worker
*processes*, reached by its TCP address as a remote scheduler is, gives the store and every
analysis a local ingest gives. (tests/ingest/test_dask.py does the same on sample and corpus runs
on an in-process cluster; benchmarks/scale.py times 64 to 1,024 ranks.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.ingest.test_dask import assert_same_stores
from traceprof.engine import analysis as registry
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

distributed = pytest.importorskip("distributed")

RANKS, GROUP, STEPS = 16, 4, 6


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ranks") / "job16"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gen_trace.py"), str(out), "--ranks", str(RANKS)]
        + ["--events", "240", "--steps", str(STEPS), "--group", str(GROUP)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.mark.slow
def test_dask_processes_ingest_of_16_ranks_equals_local(job: Path, tmp_path: Path) -> None:
    with Store(tmp_path / "local.duckdb") as s:
        local = ingest(s, [job], jobs=1)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tcp://")  # the path a remote scheduler takes
        with Store(tmp_path / "dask.duckdb", layout="parquet") as s:
            remote = ingest(s, [job], executor="dask", scheduler=address)
    assert remote.runs == local.runs and remote.added == local.added and remote.warnings == local.warnings
    run = next(iter(local.runs))
    with (
        Store(tmp_path / "local.duckdb", read_only=True) as a,
        Store(tmp_path / "dask.duckdb", read_only=True) as b,
    ):
        # Matching by (process group, Seq): every step one all-reduce instance over the 16 ranks and
        # one all-gather instance in each of the 4 groups of 4 (groups "1".."4"), none missing a rank.
        inst = b.sql(
            "SELECT pg, count(*) AS n, min(len(ranks_present)) AS lo, max(len(ranks_missing)) AS miss "
            "FROM collective_instances GROUP BY pg ORDER BY pg"
        ).rows()
        assert inst == [("0", STEPS, RANKS, 0)] + [(str(g), STEPS, GROUP, 0) for g in range(1, 5)]
        registry.load_all()
        assert_same_stores(a, b, run, [spec.name for spec in registry.specs()])
