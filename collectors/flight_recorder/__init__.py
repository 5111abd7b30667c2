"""PyTorch Flight Recorder dumps: ``capture`` (needs torch) and ``parse`` (JSON or plain-data
pickle, no torch)."""

from pathlib import Path
from typing import Any

from traceprof.collectors._dtypes import unknown_dtypes
from traceprof.collectors.flight_recorder.names import is_fr_file
from traceprof.collectors.flight_recorder.safe_pickle import is_pickle
from traceprof.core.parsed import ParsedTrace, ParseOptions
from traceprof.core.text import COUNTED, first_few
from traceprof.ingest import sources

__all__ = ["is_fr_file"]


def _claims(path: Path, head: bytes) -> bool:
    """By name, or a pickle whose name says nothing else (a custom ``TORCH_FR_DUMP_TEMP_FILE``
    prefix); a pickle that is not a dump is then skipped as not a trace."""
    return is_fr_file(path) or (
        is_pickle(head) and (path.suffix in ("", ".pkl", ".pickle") or path.suffix[1:].isdigit())
    )


def _parse(path: Path, options: ParseOptions) -> list[ParsedTrace]:
    """The file's traces. The parser is imported here, when a file of this source is read, not
    when files are claimed: an ingest of other sources does not import it."""
    from traceprof.collectors.flight_recorder.parse import parse

    return [parse(path, options)]


#: Each version note of the run's dumps (``traces.meta.version_notes``, parse step 2) with its files.
_VERSION_NOTES = """
SELECT note, list(path ORDER BY rank, path) AS paths FROM (
  SELECT t.rank, t.path, unnest(CAST(json_extract(t.meta, '$.version_notes') AS VARCHAR[])) AS note
  FROM traces t WHERE t.run_id = ? AND t.source = 'flight_recorder' AND json_exists(t.meta, '$.version_notes'))
GROUP BY note ORDER BY min(rank), note
"""


def _settle(store: Any, run_id: int) -> list[str]:
    """The run's notes of this source: its dumps' versions, each note once with the count of its files
    and the first 3 (a run's dumps come from one torch), then entries of a dtype of unknown size
    (``collectors._dtypes``)."""
    notes = [
        f"{note} ({len(paths)} file(s): {first_few(paths, more=COUNTED, shown=lambda p: Path(p).name)})"
        for note, paths in store.con.execute(_VERSION_NOTES, [run_id]).fetchall()
    ]
    return notes + unknown_dtypes(store, run_id, "fr", "Flight Recorder")


sources.register(
    sources.Collector(
        "flight_recorder",
        "PyTorch Flight Recorder dumps (*.fr.json, fr_*.json, nccl_trace_rank_*, JSON or pickle)",
        _claims,
        _parse,
        order=10,
        rank_field="rank (or the file name)",
        world_field="pg_config (largest group)",
        settle=_settle,
    )
)
