"""PyTorch Flight Recorder dumps: ``capture`` (needs torch) and ``parse`` (JSON only, no torch)."""

from collectors.flight_recorder.parse import is_fr_file, parse

__all__ = ["parse", "is_fr_file"]
