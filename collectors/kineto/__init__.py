"""PyTorch profiler (Kineto) traces: ``capture`` (needs torch) and ``parse`` (does not)."""

from collectors.kineto.parse import is_trace_file, parse, sidecar_path

__all__ = ["parse", "is_trace_file", "sidecar_path"]
