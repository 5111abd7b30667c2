"""Run identity within a new run's files (traceprof.storage.identity.check_within): a folder mixing two
jobs' files is refused with how to split or force; micro Flight Recorder dumps built here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceprof.core.errors import StoreError, TraceFormatError
from traceprof.ingest.ingest import ingest

T0 = 1_700_000_000 * 10**9  # an epoch time (2023-11-14)
HOUR = 3_600 * 10**9


def _fr(d: Path, rank: int, t0: int, world: int = 2) -> None:
    """One all_reduce at t0 (created), t0 + 10 (started), t0 + 20 (completed) in group "0"."""
    d.mkdir(exist_ok=True)
    doc = {
        "version": "2.4",
        "rank": rank,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(world)))}},
        "entries": [
            {
                "collective_seq_id": 1,
                "process_group": ["0", "default_pg"],
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": t0,
                "time_discovered_started_ns": t0 + 10,
                "time_discovered_completed_ns": t0 + 20,
                "state": "completed",
            }
        ],
    }
    (d / f"fr_rank{rank}.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("t1", "message"),
    [
        (T0 + 2 * HOUR, "recorded 2.0 h away from fr_rank0.json"),
        (T0 + 3 * 365 * 24 * HOUR, "recorded 3.0 years away from fr_rank0.json"),
    ],
)
def test_a_new_runs_files_of_two_jobs_are_refused(store, tmp_path, t1, message):
    d = tmp_path / "job"
    _fr(d, 0, T0)
    _fr(d, 1, t1)
    # named one run (--run), refused; without it, each file is a run of its own (README "Run names":
    # files recorded apart that cannot be one job are split; tests/ingest/test_run_names.py)
    with pytest.raises(StoreError) as e:
        ingest(store, [d], jobs=1, run="job")
    assert str(e.value) == (
        f"{(d / 'fr_rank1.json').resolve()}: {message}: files of different jobs in run 'job': "
        "put each job's files in its own folder (or ingest them with --run NAME each); if "
        "they do belong together, pass --force-run"
    )
    assert store.sql("SELECT count(*) AS n FROM runs").rows() == [(0,)]
    ingest(store, [d], jobs=1, force_run=True)
    assert store.sql("SELECT count(*) FROM traces").rows() == [(2,)]


def test_one_jobs_files_within_the_tolerance_are_one_run(store, tmp_path):
    d = tmp_path / "job"
    _fr(d, 0, T0)
    _fr(d, 1, T0 + HOUR - 100)  # 59:59.99 apart, under MAX_GAP_NS (1 h)
    ingest(store, [d], jobs=1)
    assert store.sql("SELECT count(*) FROM traces").rows() == [(2,)]


def test_rank_and_world_size_conflicts_name_the_sources_own_fields(store, tmp_path):
    """Two FR dumps of rank 0 in one folder: the message names FR's 'rank' field, not Kineto's
    distributedInfo.rank; two world sizes name FR's pg_config."""
    d = tmp_path / "job"
    _fr(d, 0, T0)
    (d / "fr_rank0.json").rename(d / "a.fr.json")
    _fr(d, 0, T0 + 1)  # 1 ns later: not the same file (that is read once), recorded together
    with pytest.raises(TraceFormatError) as e:
        ingest(store, [d], jobs=1)
    assert ": rank (or the file name): rank 0 also in " in str(e.value)
    assert "distributedInfo" not in str(e.value)
    (d / "a.fr.json").unlink()
    _fr(d, 1, T0, world=4)
    with pytest.raises(TraceFormatError) as e:  # named one run: without --run they are two (test_run_names)
        ingest(store, [d], jobs=1, run="job")
    assert str(e.value).startswith(
        f"{(d / 'fr_rank1.json').resolve()}: pg_config (largest group): world size 4, "
        f"but {(d / 'fr_rank0.json').resolve()} in the same run 'job' says 2"
    )
