"""PyTorch profiler (Kineto) traces: ``capture`` (needs torch) and ``parse`` (does not)."""

from traceprof.collectors.kineto.enqueue import fill_gloo_enter
from traceprof.collectors.kineto.launch import launch
from traceprof.collectors.kineto.parse import is_trace_file, parse, sidecar_path
from traceprof.ingest import sources

__all__ = ["parse", "is_trace_file", "sidecar_path"]

sources.register(
    sources.Collector(
        "kineto",
        "PyTorch profiler / Kineto JSON (*.json, *.json.gz)",
        lambda p, h: is_trace_file(p),
        lambda p, options: [fill_gloo_enter(parse(p, options))],
        order=100,
        capture=launch,
        rank_field="distributedInfo.rank",
        world_field="distributedInfo.world_size",
        companions=lambda p: [sidecar_path(p)],
    )
)
