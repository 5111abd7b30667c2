"""``ParsedTrace.of_bytes``: the file identity (path, sha256, bytes) that the collectors which read a
file in one piece (Flight Recorder, NCCL profiler plugin, NCCL Inspector, memory timeline) each wrote out."""

from __future__ import annotations

from pathlib import Path

from traceprof.core.parsed import ParsedTrace


def test_of_bytes_is_the_files_identity() -> None:
    """By hand: b"abc" is 3 bytes, SHA-256 ba7816bf...f20015ad (FIPS 180-2's example); the path as text."""
    pt = ParsedTrace.of_bytes(
        Path("/d/rank0.json"), b"abc", source="nccl_profiler", format="x", rank=0, world_size=None
    )
    assert (pt.path, pt.bytes) == ("/d/rank0.json", 3)
    assert pt.sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert (pt.source, pt.format, pt.rank, pt.world_size, pt.events) == ("nccl_profiler", "x", 0, None, None)
