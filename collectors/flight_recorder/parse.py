"""Parse PyTorch Flight Recorder (FR) dumps, JSON or pickle, into collectives rows.

A dump holds one rank's ring buffer of collective records (``entries``), written by
``torch._C._distributed_c10d._dump_fr_trace_json()`` (see ``collectors.flight_recorder.capture``)
or, by default, pickled to ``TORCH_FR_DUMP_TEMP_FILE`` + rank (e.g. ``nccl_trace_rank_3``;
jobs often put the host in the prefix: ``nccl_trace_rank_<host>_<rank>``). Pickles are read with
a restricted unpickler that admits plain data only (``safe_pickle``): a dump copied from a
cluster is untrusted input, and a crafted pickle is refused without running anything.

Algorithm:
  1. Decode the JSON, or the pickle through ``safe_pickle`` (tuples read as JSON lists); refuse
     files without ``entries``. An empty ``entries`` is a trace with no collectives (a warning):
     for hang triage the rank that recorded nothing is the culprit, and ``desync`` says so.
  2. Rank: top-level ``rank`` when present, else the file name (``rank3.fr.json``,
     ``fr_rank3.json``, ``nccl_trace_rank_<host>_3``); world size: the ranks of the default
     process group in ``pg_config``.
  3. One collectives row per entry: pg = ``process_group[0]`` (``pg_id`` when absent; ``:p2p``
     appended for point-to-point entries), seq = ``collective_seq_id`` (``p2p_seq_id`` for p2p),
     op = normalized ``profiling_name``, enter = ``time_created_ns``, start / end =
     ``time_discovered_started_ns`` / ``..._completed_ns`` (0 means unknown: NULL; gloo never
     records them; a completion is derived from ``duration_ms`` when only that is there). An entry
     whose ``state`` is ``scheduled`` or ``started`` has not completed, whatever its times say (end
     NULL). One ``collective`` event per entry keeps the raw entry as args.

Source fields read: top-level ``version``, ``rank``, ``pg_config``, ``entries``; per entry
``record_id, pg_id, process_group, collective_seq_id, p2p_seq_id, is_p2p, profiling_name,
time_created_ns, time_discovered_started_ns, time_discovered_completed_ns, duration_ms,
input_sizes, output_sizes, input_dtypes, output_dtypes, state, thread_id``.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from collectors._arrow import row_schema
from collectors.flight_recorder.safe_pickle import as_json, is_pickle, loads_plain, maybe_pickle
from traceprof.bounded import check_nesting, max_nodes, too_deep
from traceprof.errors import NotATraceError, TraceFormatError
from traceprof.fileio import misnamed_gzip, not_json_because, read_maybe_gzip
from traceprof.limits import INT32, INT64, fits, record_fits, shown
from traceprof.matching import canonical_ranks
from traceprof.ops import dtype_bytes, normalize_op
from traceprof.parsed import ParsedTrace

__all__ = ["parse", "is_fr_file"]

_NAME = re.compile(r"(\.fr\.json(\.gz)?$)|(^fr[_-].*\.json(\.gz)?$)|(^(nccl|fr)_trace_rank_?([\w.-]*[_.-])?\d+"
                   r"(\.pkl|\.pickle)?$)")
_PICKLE_NAME = re.compile(r"(^(nccl|fr)_trace_rank_?([\w.-]*[_.-])?\d+$)|\.(pkl|pickle)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)")
_TRAILING_RANK = re.compile(r"[_.-](\d+)(\.pkl|\.pickle)?$")



def is_fr_file(path: Path) -> bool:
    """True for names Flight Recorder dumps have: ``*.fr.json``, ``fr_*.json`` (optionally
    ``.gz``), and torch's default pickle names ``nccl_trace_rank_<R>`` / ``fr_trace_rank_<R>``,
    also with a host before the rank (``nccl_trace_rank_<host>_<R>``) or ``.pkl``."""
    return _NAME.search(path.name) is not None


def _read(path: Path) -> tuple[bytes, Any, str]:
    """(file bytes, decoded document, ``json`` or ``pickle``); a file with a pickle dump's name
    that is not JSON is unpickled (protocols 0 and 1 have no first-byte marker)."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
            binary = maybe_pickle(head) if _PICKLE_NAME.search(path.name) else is_pickle(head)
        if binary:  # read as bytes, not through the text (UTF-8) reader
            raw = path.read_bytes()
            try:
                return raw, as_json(loads_plain(path, raw)), "pickle"
            except TraceFormatError as e:
                if is_pickle(head) or not e.reason.startswith("broken pickle"):
                    raise
                raise TraceFormatError(path, "", f"neither JSON nor a readable pickle (starts {head[:12]!r}): "
                                       "not a Flight Recorder dump") from None
    except OSError:
        pass  # read_maybe_gzip reports it
    raw, data = read_maybe_gzip(path)
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as err:
        where = f"byte {len(data)}" if "truncated" in str(err) else ""
        raise TraceFormatError(path, where, not_json_because(data) or f"invalid JSON ({err})" + misnamed_gzip(path)) from None
    except RecursionError:
        raise too_deep(path) from None
    check_nesting(doc, path, "JSON", max_nodes=max_nodes(len(data)))
    return raw, doc, "json"


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    return None


def _nelems(sizes: Any) -> int | None:
    """Elements of the first tensor of ``input_sizes`` / ``output_sizes`` ([[d0, d1], ...])."""
    if isinstance(sizes, list) and sizes and isinstance(sizes[0], list):
        dims = [d for d in sizes[0] if isinstance(d, int)]
        return math.prod(dims) if len(dims) == len(sizes[0]) else None
    return None


def _group_sizes(pg_config: Any) -> tuple[dict[str, int], int | None]:
    """Ranks per process group name from ``pg_config`` (``ranks`` is a JSON string like
    ``"[0, 1, 2, 3]"``), and the world size (largest group)."""
    sizes: dict[str, int] = {}
    if isinstance(pg_config, dict):
        for key, cfg in pg_config.items():
            if not isinstance(cfg, dict):
                continue
            ranks = _config_ranks(cfg)
            if isinstance(ranks, list):
                sizes[str(cfg.get("name", key))] = len(ranks)
    return sizes, (max(sizes.values()) if sizes else None)


def _config_ranks(cfg: dict[str, Any]) -> Any:
    """A ``pg_config`` entry's ``ranks``, decoded when the dump writes it as a JSON string
    (``"[0, 1]"``); None when that string is not JSON."""
    ranks = cfg.get("ranks")
    if isinstance(ranks, str):
        try:
            return msgspec.json.decode(ranks)
        except msgspec.DecodeError:
            return None
    return ranks


def _group_facts(doc: dict[str, Any], kept: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Normalized per-group facts for ``traces.meta``, keyed by the ``collectives.pg`` names:
    ``groups`` (member ranks from ``pg_config``: by group name, else description, else the only
    group) and ``progress`` (``pg_status``: last enqueued / started / completed sequence number,
    -1 for none), so that analyses need no FR field names."""
    members: dict[str, list[int]] = {}
    configs: list[list[int]] = []
    cfg = doc.get("pg_config") if isinstance(doc.get("pg_config"), dict) else {}
    for key, c in cfg.items():
        if isinstance(c, dict):
            ranks = _config_ranks(c)
            if isinstance(ranks, list) and all(isinstance(r, int) and fits(r, INT32) and r >= 0 for r in ranks):
                configs.append(ranks)
                for name in {str(key), str(c.get("name", key)), str(c.get("desc", ""))} - {""}:
                    members.setdefault(name, ranks)
    only = configs[0] if len({tuple(v) for v in configs}) == 1 else None
    status = doc.get("pg_status") if isinstance(doc.get("pg_status"), dict) else {}
    groups: dict[str, list[int] | None] = {}
    progress: dict[str, dict[str, int | None]] = {}
    for e, r in zip(kept, rows, strict=True):
        pg = r["pg"]
        if pg is None or pg in groups:
            continue
        pgv = e.get("process_group")
        names = [str(v) for v in pgv] if isinstance(pgv, list) else []
        groups[pg] = next((members[n] for n in names if n in members), only)
        st = status.get(str(e.get("pg_id"))) if not pg.endswith(":p2p") else None
        if isinstance(st, dict):
            progress[pg] = {k: v if fits(v := _int(st.get(f"last_{k}_collective")), INT64) else None
                            for k in ("enqueued", "started", "completed")}
    return {"groups": groups, "progress": progress}


def parse(path: str | Path, *, on_bad_event: str = "raise") -> ParsedTrace:
    """Parse one Flight Recorder dump.

    Args:
        path: A ``.json`` (or ``.json.gz``) dump, or torch's pickle dump.
        on_bad_event: ``"raise"`` stops at an entry whose ``time_created_ns`` is missing, not an
            integer or 0; ``"skip"`` counts it in ``rejected`` (keyed by the reason).

    Returns:
        A :class:`ParsedTrace` (source ``flight_recorder``) with ``collectives`` and ``events``;
        times are epoch ns as FR records them.

    Raises:
        TraceFormatError: Unreadable, a pickle that is not plain data, invalid JSON, no ``entries`` (or
            none left after skipping), no rank, or (with ``on_bad_event="raise"``) an entry without a valid
            creation time, naming the entry.
    """
    p = Path(path).resolve()
    raw, doc, encoding = _read(p)
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise NotATraceError(p, "", "not a Flight Recorder dump (no 'entries' list)")
    rank = _int(doc.get("rank"))
    # torch's names end in the rank (a host may precede it); others say rank<R>
    default_name = p.name.startswith(("nccl_trace_rank", "fr_trace_rank"))
    m = (_TRAILING_RANK.search(p.name) if default_name else None) or _RANK_IN_NAME.search(p.name)
    by_name = int(m.group(1)) if m else None
    warnings = []
    if rank is not None and by_name is not None and by_name != rank:
        warnings.append(f"{p.name}: the dump's 'rank' {rank} differs from rank {by_name} in the file name; "
                        f"stored as rank {rank} (the dump's own field)")
    rank = by_name if rank is None else rank
    if rank is None:
        raise TraceFormatError(p, "rank", "no 'rank' in the dump and none in the file name; "
                               "name the file rank<R>.fr.json")
    sizes, world = _group_sizes(doc.get("pg_config"))
    only_size = next(iter(sizes.values())) if len(sizes) == 1 else None
    rows: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []  # the entries behind rows
    events: list[dict[str, Any]] = []
    rejected: dict[str, int] = {}
    for i, e in enumerate(doc["entries"]):
        if not isinstance(e, dict):
            raise TraceFormatError(p, f"entry #{i}", "not a JSON object")
        raw_created = e.get("time_created_ns")
        created = _int(raw_created)
        name = str(e.get("profiling_name", ""))
        if not created:
            why = ("missing 'time_created_ns'" if raw_created is None else "'time_created_ns' is not an integer"
                   if created is None else "'time_created_ns' is 0")
            if on_bad_event == "raise":
                value = "" if raw_created is None else f" ({shown(raw_created)})"
                raise TraceFormatError(p, f"entry #{i} ({name!r})", f"{why}{value}; "
                                       "pass --skip-bad-events to skip such entries")
            rejected[why] = rejected.get(why, 0) + 1
            continue
        started = _int(e.get("time_discovered_started_ns")) or None
        completed = _int(e.get("time_discovered_completed_ns")) or None
        state = e.get("state")
        if state in ("scheduled", "started"):  # the state wins over a stray completion time or duration
            completed = None
        elif completed is None and started is not None and isinstance(e.get("duration_ms"), (int, float)):
            completed = started + round(float(e["duration_ms"]) * 1e6)
        pgv = e.get("process_group")
        pg_name = str(pgv[0]) if isinstance(pgv, list) and pgv else (
            None if e.get("pg_id") is None else str(e.get("pg_id")))
        p2p = bool(e.get("is_p2p"))
        seq = _int(e.get("p2p_seq_id") if p2p else e.get("collective_seq_id"))
        dtypes_in, dtypes_out = (v if isinstance(v := e.get(k), list) else [] for k in ("input_dtypes", "output_dtypes"))
        dtype = str(dtypes_in[0]) if dtypes_in else (str(dtypes_out[0]) if dtypes_out else None)
        n_in, n_out = _nelems(e.get("input_sizes")), _nelems(e.get("output_sizes"))
        size = dtype_bytes(dtype)
        group = sizes.get(pg_name or "", None)
        if group is None and isinstance(pgv, list) and len(pgv) > 1:
            group = sizes.get(str(pgv[1]))
        rows.append(
            {
                "source": "fr",
                "pg": None if pg_name is None else (pg_name + ":p2p" if p2p else pg_name),
                "seq": seq,
                "op": normalize_op(name) if name else "unknown",
                "dtype": dtype,
                "nelems_in": n_in,
                "nelems_out": n_out,
                "bytes_in": n_in * size if n_in is not None and size else None,
                "bytes_out": n_out * size if n_out is not None and size else None,
                "group_size": group if group is not None else only_size,
                "enter_ns": created,
                "start_ns": started,
                "end_ns": completed,
                "stream": None,
                "tid": None if e.get("thread_id") is None else str(e.get("thread_id")),
                "step": None,
            }
        )
        kept.append(e)
        events.append(
            {
                "kind": "collective", "cat": "flight_recorder", "name": name, "ts_ns": created,
                "dur_ns": (completed - created) if completed and completed >= created else 0,
                "pid": "", "tid": rows[-1]["tid"] or "", "device": None, "stream": None,
                "correlation": None, "external_id": _int(e.get("record_id")), "step": None,
                "args": msgspec.json.encode({k: v for k, v in e.items() if k != "frames"}).decode(),
            }
        )
        if not record_fits(p, f"entry #{i} ({name!r})", on_bad_event, rejected,
                           (rows[-1], row_schema("collectives")), (events[-1], row_schema("events"))):
            rows.pop(), kept.pop(), events.pop()
    if not doc["entries"]:  # for hang triage the rank that recorded nothing is the one to look at
        warnings.append(f"{p.name}: rank {rank} recorded no collective (empty 'entries': dumped before any "
                        "ran on this rank, or TORCH_NCCL_TRACE_BUFFER_SIZE=0); stored with 0 collectives")
    elif not rows:
        raise TraceFormatError(p, "entries", f"no valid entries: all {len(doc['entries'])} skipped ({rejected})")
    counter: dict[tuple[Any, str], int] = {}
    for r in sorted(rows, key=lambda r: r["enter_ns"]):
        key = (r["pg"], r["op"])
        r["ordinal"] = counter.get(key, 0)
        counter[key] = r["ordinal"] + 1
    meta = {k: doc.get(k) for k in ("version", "comm_lib_version", "pg_config", "pg_status")}
    facts = _group_facts(doc, kept, rows)
    meta.update(facts)
    for r in rows:  # member ranks identify a group: two groups can share one name (torchft replicas)
        r["pg_ranks"] = canonical_ranks(facts["groups"].get(r["pg"]))
    return ParsedTrace(
        path=str(p),
        sha256=hashlib.sha256(raw).hexdigest(),
        bytes=len(raw),
        source="flight_recorder",
        format=f"fr-{encoding}-{doc.get('version', '?')}",
        rank=rank,
        world_size=world,
        trace={"meta": msgspec.json.encode(meta).decode()},
        events=pa.Table.from_pylist(events, schema=row_schema("events")),
        collectives=pa.Table.from_pylist(rows, schema=row_schema("collectives")),
        events_read=len(doc["entries"]),
        rejected=rejected,
        warnings=warnings,
    )
