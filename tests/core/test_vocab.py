"""Vocabulary columns (``source``, ``kind``, ``class``, ``flag``) hold only the values their
schema declares (``traceprof.core.vocab``), whatever the input."""

from __future__ import annotations

from tests.conftest import SAMPLES, case, corpus
from traceprof.core import schema
from traceprof.core.vocab import CollectiveSource, EventKind, TraceSource
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store


def test_every_value_written_is_declared(tmp_path):
    # one input of every source: Kineto (GPU and CPU), Flight Recorder, NCCL plugin, NCCL
    # Inspector, Nsight Systems, NDTimeline
    inputs = {
        "samples": SAMPLES / "straggler_rank2",
        "gpu": case("kernel_before_its_launch"),
        "nccl": case("deepep_comm_kernels"),
        "plugin": case("nccl_plugin_zero_timestamps") / "quoted",
        "inspector": case("nccl_inspector_records"),
        "nsys": corpus("nsys/pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite"),
        "ndtimeline": corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet"),
    }
    seen: dict[tuple[str, str], set[str]] = {}
    with Store(tmp_path / "v.duckdb") as store:
        for run, path in inputs.items():
            ingest(store, [path], run=run, jobs=1)
        for t in schema.TABLES:
            for c in t.columns:
                if c.values is None:
                    continue
                got = {
                    r[0] for r in store.con.execute(f'SELECT DISTINCT "{c.name}" FROM {t.name}').fetchall()
                }
                got.discard(None)
                seen[(t.name, c.name)] = got
                assert got <= set(c.values.values()), (t.name, c.name, got - set(c.values.values()))
    # the inputs exercise the vocabularies (so that the check above can fail)
    # every source but export_memory_timeline output (written by torch in tests/analyses/test_memory.py)
    assert seen[("traces", "source")] == set(TraceSource.values()) - {"memory_timeline"}
    assert seen[("collectives", "source")] >= {
        "nccl_kernel",
        "gloo",
        "fr",
        "nccl_profiler",
        "nccl_inspector",
        "ndtimeline",
    }
    assert seen[("events", "kind")] >= {"cpu_op", "kernel", "memcpy", "step"}
    assert seen[("events", "class")] == {"comm", "compute", "memory"}
    assert "before_launch" in seen[("events", "flag")]


def test_vocabularies_print_as_their_values():
    assert f"{CollectiveSource.fr}" == str(CollectiveSource.fr) == "fr" == CollectiveSource.fr
    assert EventKind.sql(EventKind.kernel, EventKind.memcpy) == "('kernel', 'memcpy')"
    assert schema.EVENT_KINDS == EventKind.values() and "other" in schema.EVENT_KINDS
