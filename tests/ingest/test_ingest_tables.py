"""Every table an ingest writes is the same as the reference path's (issue 34: the ingest of one rank
file imports no polars; matching and clock alignment run in SQL and numpy).

The reference is the polars matching kept in ``test_matching_sql`` (``_assign_ref``), put in place of
the SQL one for a second ingest of the same input into another store; every base table is then
compared row for row (sorted; ``runs.ingested_at`` left out: the time of the ingest). Inputs: micro
traces of ``tests/builders.py`` (one rank; two ranks whose clocks disagree, aligned) and real corpus
traces (one large rank file, several multi-rank runs).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import builders
from tests.conftest import corpus
from tests.ingest.test_matching_sql import _assign_ref
from traceprof.ingest import matching
from traceprof.ingest.ingest import ingest
from traceprof.ingest.matching import _ROWS
from traceprof.storage.store import Store

#: Columns that hold the time of the ingest, not its result.
_VOLATILE = {"runs": {"ingested_at"}}


def _tables(store: Store) -> dict[str, list[tuple]]:
    """Every base table's rows, sorted (by their text: row order is not part of a table)."""
    out = {}
    for (name,) in store.con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
        cols = [
            c
            for (c,) in store.con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [name]
            ).fetchall()
            if c not in _VOLATILE.get(name, ())
        ]
        quoted = ", ".join(f'"{c}"' for c in cols)
        rows = store.con.execute(f"SELECT {quoted} FROM {name}").fetchall()
        out[name] = sorted(rows, key=repr)
    return out


def _reference_assign(store: Store, run_id: int) -> tuple[int, list[str]]:
    """matching._assign as it was: the polars frames of ``_assign_ref``, written by one UPDATE."""
    rows = store.sql(_ROWS.replace("$run", str(int(run_id))))
    if not rows.height:
        return 0, []
    assigned, notes = _assign_ref(rows)
    if assigned.height:
        store.con.register("_match", assigned.to_arrow())
        store.con.execute(
            """UPDATE collectives SET instance_id = m.instance_id, match_method = m.method
               FROM _match m WHERE collectives.rowid = m.rid"""
        )
        store.con.unregister("_match")
    return rows.height, notes


def _both(tmp_path: Path, inputs: list[Path], monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict]:
    """(tables of the ingest of ``inputs``, tables of the reference path's ingest of them)."""
    out = []
    for i, reference in enumerate((False, True)):
        with monkeypatch.context() as m:
            if reference:
                m.setattr(matching, "_assign", _reference_assign)
            with Store(tmp_path / f"s{i}.duckdb") as store:
                ingest(store, inputs, run="r")
                out.append(_tables(store))
    return out[0], out[1]


def _one_collective(folder: Path) -> Path:
    """One rank: a ProfilerStep (0-100 us), a launch at 10 us, its NCCL kernel at 12 us for 20 us."""
    return builders.write_run(
        folder,
        [
            builders.step(1, 0, 100),
            builders.launch(10, corr=7),
            builders.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 7, 12, 20, corr=7),
        ],
    )


def test_one_rank_micro_trace(tmp_path, monkeypatch):
    folder = _one_collective(tmp_path / "in")
    got, want = _both(tmp_path, [folder], monkeypatch)
    assert got == want
    # hand-worked: one kernel at 12 us for 20 us, base time 0: the one collective row is its own
    # instance (ordinal 0 of its kind), arriving at its start 12,000 ns and ending at 32,000 ns
    with Store(tmp_path / "s0.duckdb") as s:
        row = s.con.execute(
            "SELECT instance_id, n_ranks, first_arrival_ns, last_end_ns, match_method FROM collective_instances"
        ).fetchall()
    assert row == [(1, 1, 12_000, 32_000, "ordinal")]


def test_two_ranks_with_skewed_clocks(tmp_path, monkeypatch):
    folder = tmp_path / "in"
    builders.write_skewed_pair(folder)
    got, want = _both(tmp_path, [folder], monkeypatch)
    assert got == want
    # hand-worked (builders.write_skewed_pair): rank 0's all-reduce ends at 12 ms, rank 1's at 32 ms
    # on its own clock: rank 1 is moved 20 ms earlier onto rank 0's clock
    with Store(tmp_path / "s0.duckdb") as s:
        offsets = s.con.execute("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").fetchall()
    assert offsets == [(0, 0), (1, -20_000_000)]


@pytest.mark.parametrize(
    "rel",
    [
        "hta/df_index_resolver",  # the 53.7 MB rank file of issue 34's ingest target
        "hta/trace_filter",
        "hta/nccl_parser_config",
        "flight_recorder/gloo_cpu_4rank",
    ],
)
def test_real_traces(tmp_path, monkeypatch, rel):
    got, want = _both(tmp_path, [corpus(rel)], monkeypatch)
    assert got == want
    assert got["events"] and got["collectives"]


def test_the_ingest_of_one_rank_file_imports_no_polars(tmp_path):
    """Matching, clock alignment and the store's queries of an ingest of one rank run without polars
    (0.1 s of CPU to import: a tenth of the ingest of a 54 MB rank file)."""
    folder = _one_collective(tmp_path / "in")
    code = (
        "import sys; from traceprof.cli import main; sys.argv = ['traceprof', 'ingest', sys.argv[1], '--db', "
        "sys.argv[2]]\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('polars', 'yaml', 'multiprocessing')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(folder), str(tmp_path / "t.duckdb")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"
    with Store(tmp_path / "t.duckdb") as s:
        assert s.con.execute("SELECT count(*) FROM collectives WHERE instance_id IS NOT NULL").fetchall() == [
            (1,)
        ]


def test_an_all_reduce_named_by_its_annotation_takes_its_size_from_input_dims(tmp_path):
    """t16 D4: hta/trace_filter's all-reduce kernels carry no ``In msg nelems``; their launching
    ``nccl:all_reduce`` record_function has ``Input Dims [[19618307]]`` and ``Input type
    ["float"]``. Hand value: 19,618,307 x 4 B = 78,473,228 B (3 such collectives on the two ranks;
    before: nelems_in and bytes_in null). An _all_gather_base's first input is its output: left
    unknown."""
    from tests.conftest import corpus
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    s = Store(tmp_path / "s.duckdb")
    ingest(s, [corpus("hta/trace_filter")])
    rows = s.sql(
        "SELECT dtype, nelems_in, bytes_in, count(*)::BIGINT AS n FROM collectives "
        "WHERE op = 'all_reduce' AND nelems_in = 19618307 GROUP BY ALL"
    ).rows()
    assert rows == [("float", 19_618_307, 78_473_228, 3)]
    assert s.sql("SELECT count(*) FROM collectives WHERE op = 'all_reduce' AND bytes_in IS NULL").item() == 0
    assert s.sql("SELECT count(bytes_in) FROM collectives WHERE op = 'all_gather'").item() == 0
