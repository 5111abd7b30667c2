"""Each analysis is one declared spec: its frames hold exactly the declared columns and types, its
notes merge by structure, docs/analyses.md is generated from the specs, and nothing central names
an analysis."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO, SAMPLES, case, corpus
from traceprof.core.columns import POLARS_TYPES
from traceprof.engine import analysis as registry
from traceprof.engine.analysis import Note, merge_notes
from traceprof.ingest.ingest import ingest
from traceprof.render.analysis_docs import markdown
from traceprof.storage.store import Store


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The sample runs (a 2-stage pipeline among them) and four shared cases (GPU lanes, two GPUs per
    process, Flight Recorder groups) and a corpus trace with memory records, in one store."""
    db = tmp_path_factory.mktemp("specs") / "s.duckdb"
    with Store(db) as store:
        ingest(store, [SAMPLES], jobs=1)
        for name in ("two_gpus_one_process", "kernel_before_its_launch", "fr_two_groups_same_pg_name"):
            ingest(store, [case(name)], run=name, jobs=1)
        ingest(store, [corpus("hta/memory_analysis")], run="memory", jobs=1)
    return db


def test_every_frame_has_its_declared_columns_and_types(runs):
    # Each frame an analysis returns: its columns are declared, in the declared order, each with
    # the declared type (polars Int64 -> BIGINT, ...). A frame may lack some (nccl_sum of a run
    # with no timed collective has no duration statistics) or be empty (no devices table).
    checked = set()
    with Store(runs, read_only=True) as store:
        names = store.sql("SELECT name FROM runs ORDER BY run_id")["name"].to_list()
        for spec in registry.specs():
            assert [t.name for t in spec.frames][0] == "frame", spec.name
            for run in names:
                try:
                    res = spec.run(store, spec.params(run=run))
                except Exception:  # noqa: BLE001 - does not apply to this run
                    continue
                assert isinstance(res, spec.result)
                assert list(res.frames()) == [t.name for t in spec.frames], spec.name
                for fname, df in res.frames().items():
                    declared = {c.name: c.type for c in spec.frame(fname).columns}
                    # a wildcard (``<axis>``: one column per mesh axis) stands for the columns it names
                    wild = next((t for c, t in declared.items() if c.startswith("<")), None)
                    cols = [c for c in df.columns if c in declared or wild is None]
                    order = [c for c in declared if c in cols]
                    if df.height:  # an empty frame keeps its query's column order
                        assert cols == order, (spec.name, fname, run, df.columns)
                    assert set(cols) <= set(declared), (spec.name, fname, run, df.columns)
                    for c, t in df.schema.items():
                        if str(t) != "Null":
                            assert POLARS_TYPES.get(str(t)) == declared.get(c, wild), (
                                spec.name,
                                fname,
                                c,
                                str(t),
                            )
                    if df.height and df.columns:
                        checked.add((spec.name, fname))
    # every frame of every analysis but memcpy_sum (GPU traces only) was seen with rows
    expected = {(s.name, t.name) for s in registry.specs() for t in s.frames}
    unseen = expected - checked
    assert {a for a, _ in unseen} <= {
        "memcpy_sum",
        "nvtx_sum",
        "kernel_sum",
        "nccl_sum",
        "overlap",
        "temporal",
        "desync",
        "parallelism",
        "memory",
    }, unseen


def test_every_analysis_declares_what_it_is():
    for spec in registry.specs():
        assert spec.doc.startswith(f"{spec.name}: "), spec.name
        assert spec.run.__module__.endswith(f".{spec.name}") or spec.run.__module__ == f"analyses.{spec.name}"
        for t in spec.frames:
            assert t.doc and all(c.doc for c in t.columns), (spec.name, t.name)
            assert len({c.name for c in t.columns}) == len(t.columns), (spec.name, t.name)
            for c in t.columns:  # units follow the names: _ns is ns, _pct is %
                assert (c.unit == "ns") == (c.name == "ns" or c.name.endswith("_ns")), (
                    spec.name,
                    t.name,
                    c.name,
                )
                if c.name == "pct" or c.name.endswith("_pct"):
                    assert c.unit == "%", (spec.name, t.name, c.name)
        for r in spec.requires:
            assert r in registry.names(), (spec.name, r)


def test_docs_analyses_md_is_current():
    assert (REPO / "docs" / "analyses.md").read_text() == markdown(), "run `make docs`"


def _code_strings(path) -> set[str]:
    """The string constants of a module's code (docstrings left out)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    }


def test_nothing_central_names_an_analysis():
    # The findings, the report, the per-rank merge and the session read the specs: no analysis
    # name in their code, no regex over note wording.
    names = set(registry.names())
    for mod in (
        "engine/findings",
        "engine/rankwise",
        "render/report",
        "engine/session",
        "engine/resultcache",
        "cli",
    ):
        path = REPO / "traceprof" / f"{mod}.py"
        assert not names & _code_strings(path), (mod, names & _code_strings(path))
        assert "re.fullmatch" not in path.read_text(), mod


def test_notes_merge_by_structure_not_wording():
    # Two ranks' notes: the rank lists are joined in order, the counts summed, the rest once each,
    # in the analysis' order; each merged note renders as a local run's would.
    several = "rank(s) {ranks} drive several GPUs: see the devices table"
    rank0 = (Note("plain"), Note(several, ranks=[0]), Note("{number} kernels have no launch call", number=3))
    rank2 = (
        Note("plain"),
        Note(several, ranks=[2]),
        Note("{number} kernels have no launch call", number=4),
        Note("only on rank 2"),
    )
    merged = merge_notes([rank0, rank2])
    assert merged == (
        "plain",
        "rank(s) 0, 2 drive several GPUs: see the devices table",
        "7 kernels have no launch call",
        "only on rank 2",
    )
    assert merged[1].ranks == (0, 2) and merged[2].number == 7
    # a note survives the result cache's JSON (and pickling to a Dask worker) with its figures
    import pickle

    n = Note("ranks without communication (overlap undefined): [{ranks}]", ranks=[1, 3], kind="x")
    for back in (Note.from_dict(n.to_dict()), pickle.loads(pickle.dumps(n))):
        assert back == "ranks without communication (overlap undefined): [1, 3]"
        assert (back.template, back.ranks, back.kind) == (n.template, (1, 3), "x")
