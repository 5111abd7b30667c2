"""Parse PyTorch Flight Recorder (FR) dumps, JSON or pickle, into collectives rows.

A dump holds one rank's ring buffer of collective records (``entries``), written by
``torch._C._distributed_c10d._dump_fr_trace_json()`` (see ``traceprof.collectors.flight_recorder.capture``)
or, by default, pickled to ``TORCH_FR_DUMP_TEMP_FILE`` + rank (e.g. ``nccl_trace_rank_3``;
jobs often put the host in the prefix: ``nccl_trace_rank_<host>_<rank>``). Pickles are read with
a restricted unpickler that admits plain data only (``safe_pickle``): a dump copied from a
cluster is untrusted input, and a crafted pickle is refused without running anything.

Algorithm:
  1. Decode the JSON, or the pickle through ``safe_pickle`` (tuples read as JSON lists). A dump
     without ``entries`` (torch's JSON dump leaves the key out when the ring buffer is empty) or
     with an empty list is a trace with no collectives (a warning): when its ``pg_status`` shows no
     enqueued collective (all -1, or none) the rank *recorded nothing* (``traces.meta``
     ``recorded_nothing``), for hang triage the rank to look at, and ``desync`` says so; otherwise
     its progress is kept (``progress_by_pg_id``) for ``desync``. A document that is neither (no
     ``entries``, no ``version`` with ``pg_config`` / ``pg_status``) is not a dump; a dump (those
     fields) whose ``entries`` is not a list is refused naming the field, as a bad entry is.
  2. Version (``versions`` module): entries of versions 2.x number collectives and
     point-to-point ops with ``collective_seq_id`` / ``p2p_seq_id``; versions 1.x with one
     ``seq_id``. A ``version`` written as a JSON number is read as its text (said). The dialect is
     taken from the entries' fields (the version only for messages: an unknown major says which
     reading was assumed; these notes are kept in ``traces.meta.version_notes`` and said once per
     run, with the count of files and the first ones, not once per file); a
     dump whose entries carry neither is refused naming its version, and an entry without its
     dialect's number is a bad entry (error, or skipped with ``on_bad_event="skip"``): sequence
     numbers are never stored NULL.
  3. Rank: top-level ``rank`` when present, else the file name (``rank3.fr.json``,
     ``fr_rank3.json``, ``nccl_trace_rank_<host>_3``); a ``rank`` that is no integer (``1.5``,
     ``"abc"``) is ignored, and one written as a string or float (``"3"``, ``3.0``) is read as its
     integer, each with a warning and a count in ``traces.meta.repaired``
     (``traceprof.core.values.identity_int``, as Kineto's ``distributedInfo.rank``); world size:
     the ranks of the default process group in ``pg_config`` (none when its largest group is not
     ranks 0 to n-1: a replica group of its own, not the world).
  4. One collectives row per entry: pg = ``process_group[0]`` (``pg_id`` when absent; ``:p2p``
     appended for point-to-point entries: ``is_p2p``, else a send / recv by name), seq =
     ``collective_seq_id`` (``p2p_seq_id`` for p2p; ``seq_id`` in 1.x). Coalesced groups (torch
     2.7+ records each member and the group's end entry under one sequence number) give one row
     per member; ``desync`` compares them member by member.
     op = normalized ``profiling_name``, enter = ``time_created_ns``, start / end =
     ``time_discovered_started_ns`` / ``..._completed_ns`` (0 means unknown: NULL; gloo never
     records them; a completion is derived from ``duration_ms`` when only that is there). A time
     field that is not an integer or is negative, or a negative or non-finite ``duration_ms``, is a
     bad entry (an error naming it, or skipped and counted with ``--skip-bad-events``); so is a
     sequence number, a ``record_id`` or a dimension of ``input_sizes`` / ``output_sizes`` that is
     not an integer (a record's number: a JSON integer, ``traceprof.core.values.record_int``'s
     rule; ``"1796034872484434120"``, ``1e18`` and ``true`` are none), or a negative dimension, or an
     entry that is no object. A value torch never writes where the entry is still readable (an
     unknown ``state``, a ``retired`` that is no boolean, a ``pg_id`` that is no integer, a
     ``process_group`` that is no pair, a ``record_id`` two entries share) is read as is, with a
     warning per kind and a count in ``traces.meta.repaired`` (:func:`_odd_fields`). An entry
     whose ``state`` is ``scheduled`` or ``started`` has not completed, whatever its times say (end
     NULL). One ``collective`` event per entry keeps the raw entry as args.

Source fields read: top-level ``version``, ``rank``, ``pg_config``, ``pg_status``, ``entries``; per entry
``record_id, pg_id, process_group, collective_seq_id, p2p_seq_id, seq_id (1.x), is_p2p, profiling_name,
time_created_ns, time_discovered_started_ns, time_discovered_completed_ns, duration_ms,
input_sizes, output_sizes, input_dtypes, output_dtypes, state, thread_id``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from traceprof.collectors._arrow import row_schema
from traceprof.collectors._duplicates import duplicate_records
from traceprof.collectors.flight_recorder.names import is_fr_file
from traceprof.collectors.flight_recorder.safe_pickle import as_json, is_pickle, loads_plain, maybe_pickle
from traceprof.collectors.flight_recorder.versions import dialect, entry_seq, progress_by_pg_id, version_text
from traceprof.core.bounded import check_nesting, max_nodes, too_deep
from traceprof.core.errors import NotATraceError, TraceFormatError
from traceprof.core.fileio import misnamed_gzip, not_json_because, read_maybe_gzip
from traceprof.core.limits import INT32, INT64, fits, record_fits, shown, skip_hint
from traceprof.core.ops import dtype_bytes, normalize_op
from traceprof.core.parsed import DEFAULT_OPTIONS, ParsedTrace, ParseOptions
from traceprof.core.values import identity_int, integer, json_int
from traceprof.core.vocab import CollectiveSource, TraceSource
from traceprof.ingest.matching import canonical_ranks

__all__ = ["parse", "is_fr_file"]

_PICKLE_NAME = re.compile(r"(^(nccl|fr)_trace_rank_?([\w.-]*[_.-])?\d+$)|\.(pkl|pickle)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)")
_TRAILING_RANK = re.compile(r"[_.-](\d+)(\.pkl|\.pickle)?$")


#: Store column -> the dump's field it is read from, so that a value too long or too large is named
#: as the file spells it (``'profiling_name' longer than 1 MiB``, not ``'op'``); ``seq`` is added
#: per entry (its field depends on the dump's version and the entry's family).
_FIELDS = {
    "op": "profiling_name",
    "name": "profiling_name",
    "pg": "process_group",
    "tid": "thread_id",
    "dtype": "input_dtypes",
    "enter_ns": "time_created_ns",
    "ts_ns": "time_created_ns",
    "start_ns": "time_discovered_started_ns",
    "end_ns": "time_discovered_completed_ns",
    "external_id": "record_id",
}


def _read(path: Path, max_ratio: float) -> tuple[bytes, Any, str]:
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
                raise TraceFormatError(
                    path,
                    "",
                    f"neither JSON nor a readable pickle (starts {head[:12]!r}): not a Flight Recorder dump",
                ) from None
    except OSError:
        pass  # read_maybe_gzip reports it
    raw, data = read_maybe_gzip(path, max_ratio)
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as err:
        where = f"byte {len(data)}" if "truncated" in str(err) else ""
        raise TraceFormatError(
            path, where, not_json_because(data) or f"invalid JSON ({err})" + misnamed_gzip(path)
        ) from None
    except RecursionError:
        raise too_deep(path) from None
    check_nesting(doc, path, "JSON", max_nodes=max_nodes(len(data)))
    return raw, doc, "json"


def _nelems(sizes: Any) -> int | None:
    """Elements of the first tensor of ``input_sizes`` / ``output_sizes`` ([[d0, d1], ...]); its
    dimensions are JSON integers (:func:`_odd_dim` says where one is not)."""
    if isinstance(sizes, list) and sizes and isinstance(sizes[0], list):
        return math.prod(sizes[0])
    return None


def _odd_dim(e: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, value text) for the first dimension of ``input_sizes`` / ``output_sizes`` (lists of
    per-tensor lists) that is not a JSON integer or is negative (no tensor has one: its byte count
    would be negative), else None."""
    for k in ("input_sizes", "output_sizes"):
        sizes = e.get(k)
        for dims in sizes if isinstance(sizes, list) else ():
            for d in dims if isinstance(dims, list) else ():
                n = json_int(d)
                if n is None:
                    return f"{k!r} holds a dimension that is not an integer", f" ({shown(d)})"
                if n < 0:
                    return f"{k!r} holds a negative dimension", f" ({shown(d)})"
    return None


#: The ``state`` values torch writes (an entry of another is read by its times).
_STATES = frozenset({"scheduled", "started", "completed"})


def _odd_fields(e: dict[str, Any]) -> list[tuple[str, Any]]:
    """(reason, value) for each field of an entry that holds a value torch does not write but that
    the entry is still read with: a ``state`` it does not know (read by its times), a ``retired``
    that is no boolean, a ``pg_id`` that is no integer, a ``process_group`` that is not a [name,
    description] pair (its first element is the group's name)."""
    odd: list[tuple[str, Any]] = []
    if (st := e.get("state")) is not None and st not in _STATES:
        odd.append(("unknown 'state' (read by its times)", st))
    if "retired" in e and not isinstance(e["retired"], bool):
        odd.append(("'retired' is not true / false", e["retired"]))
    if e.get("pg_id") is not None and json_int(e["pg_id"]) is None:
        odd.append(("'pg_id' is not an integer", e["pg_id"]))
    pgv = e.get("process_group")
    if pgv is not None and not (isinstance(pgv, list | tuple) and len(pgv) == 2):
        odd.append(("'process_group' is not a [name, description] pair", pgv))
    return odd


def _group_sizes(pg_config: Any) -> tuple[dict[str, int], int | None]:
    """Ranks per process group name from ``pg_config`` (``ranks`` is a JSON string like
    ``"[0, 1, 2, 3]"``), and the world size (largest group); a group listed with no ranks (torch
    2.13's gloo dumps: ``{"": {"name": "", "desc": "", "ranks": "[]"}}``) says nothing of either.
    Nor does a largest group whose members are not ranks 0 to n-1: a dump lists the groups its
    rank is in, and a replica group (torchft: one default group per replica group, e.g. [3, 4]
    beside [0, 1, 2]) is not the world, so its size is no world size that could set the dump
    apart from its job's other dumps."""
    sizes: dict[str, int] = {}
    largest: list[Any] = []
    if isinstance(pg_config, dict):
        for key, cfg in pg_config.items():
            if not isinstance(cfg, dict):
                continue
            ranks = _config_ranks(cfg)
            if isinstance(ranks, list) and ranks:  # torch 2.13's gloo dumps list one group of no ranks
                sizes[str(cfg.get("name", key))] = len(ranks)
                largest = ranks if len(ranks) > len(largest) else largest
    world_like = sorted(r for r in largest if isinstance(r, int)) == list(range(len(largest)))
    return sizes, (max(sizes.values()) if sizes and world_like else None)


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


#: The ``pg_config`` description torch gives a group made without one (``new_group(group_desc=None)``).
_NO_DESC = "undefined"


def _members(doc: dict[str, Any]) -> tuple[dict[str, list[int]], list[int] | None]:
    """Member ranks per group name, key and description in ``pg_config``, and the only group's
    members when every listed group has the same (else None). A description that several groups
    of different members share in the dump, or torch's ``undefined`` (the description of every
    ``new_group`` made without ``group_desc``: a group missing from this ``pg_config`` may carry
    it too), names none of them."""
    members: dict[str, list[int]] = {}
    configs: list[list[int]] = []
    descs: dict[str, set[tuple[int, ...]]] = {}
    raw_cfg = doc.get("pg_config")
    cfg: dict[Any, Any] = raw_cfg if isinstance(raw_cfg, dict) else {}
    for key, c in cfg.items():
        if isinstance(c, dict):
            ranks = _config_ranks(c)
            if isinstance(ranks, list) and all(
                isinstance(r, int) and fits(r, INT32) and r >= 0 for r in ranks
            ):
                configs.append(ranks)
                descs.setdefault(str(c.get("desc", "")), set()).add(tuple(ranks))
                for name in {str(key), str(c.get("name", key)), str(c.get("desc", ""))} - {""}:
                    members.setdefault(name, ranks)
    named = {str(k) for k in cfg} | {str(c.get("name")) for c in cfg.values() if isinstance(c, dict)}
    for desc, sets in descs.items():
        if (len(sets) > 1 or desc == _NO_DESC) and desc not in named:
            members.pop(desc, None)
    return members, configs[0] if len({tuple(v) for v in configs}) == 1 else None


#: A point-to-point ``profiling_name``'s peer in the group: ``nccl:send 0->1`` (src->dst), ``nccl:recv 1<-0``.
_P2P_NAME = re.compile(r":(?:send|recv)\S*\s+(\d{1,9})\s*(->|<-)\s*(\d{1,9})\s*$")


def _peers(
    name: str, pgv: Any, members: dict[str, list[int]], only: list[int] | None
) -> tuple[int | None, int | None]:
    """(peer, peer_group_rank) of a send / recv entry: the other end's group rank from its
    ``profiling_name`` (``nccl:send 0->1``: 1; ``nccl:recv 1<-0``: 0, as torch's ``fr_trace`` reads
    it), and its global rank: the group's members (``pg_config``, sorted, by the entry's
    ``process_group`` name or description) at that position; None where unknown."""
    m = _P2P_NAME.search(name)
    if m is None:
        return None, None
    group_rank = int(m.group(3))
    names = [str(v) for v in pgv] if isinstance(pgv, list) else []
    ranks = next((members[n] for n in names if n in members), only)
    ranks = sorted(ranks) if ranks else None
    return (ranks[group_rank] if ranks and group_rank < len(ranks) else None), group_rank


def _group_facts(
    doc: dict[str, Any], kept: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """Normalized per-group facts for ``traces.meta``, keyed by the ``collectives.pg`` names:
    ``groups`` (member ranks from ``pg_config``: by group name, else description, else the only
    group), ``progress`` (``pg_status``: last enqueued / started / completed sequence number,
    -1 for none), ``pg_ids`` (each collectives group's ``pg_id``, which keys ``pg_status``) and
    ``process_groups`` (``[{"name", "desc", "ranks"}]``, the entries' ``process_group`` name and
    description with the members, ranks null when ``pg_config`` lacks them; the normalized form every
    collector writes), so that analyses need no FR field names."""
    members, only = _members(doc)
    raw_status = doc.get("pg_status")
    status: dict[Any, Any] = raw_status if isinstance(raw_status, dict) else {}
    groups: dict[str, list[int] | None] = {}
    progress: dict[str, dict[str, int | None]] = {}
    pg_ids: dict[str, str] = {}
    described: list[dict[str, Any]] = []
    for e, r in zip(kept, rows, strict=True):
        pg = r["pg"]
        if pg is None or pg in groups:
            continue
        if e.get("pg_id") is not None and not pg.endswith(":p2p"):
            pg_ids[pg] = str(e.get("pg_id"))
        pgv = e.get("process_group")
        names = [str(v) for v in pgv] if isinstance(pgv, list) else []
        groups[pg] = next((members[n] for n in names if n in members), only)
        if not pg.endswith(":p2p"):  # process_group = [name, description]
            described.append(
                {"name": pg, "desc": names[1] if len(names) > 1 and names[1] else None, "ranks": groups[pg]}
            )
        st = status.get(str(e.get("pg_id"))) if not pg.endswith(":p2p") else None
        if isinstance(st, dict):
            progress[pg] = {
                k: v if fits(v := integer(st.get(f"last_{k}_collective")), INT64) else None
                for k in ("enqueued", "started", "completed")
            }
    return {"groups": groups, "progress": progress, "pg_ids": pg_ids, "process_groups": described}


def _identity(e: Any) -> bytes | None:
    """What identifies a Flight Recorder entry: all of it (keys sorted); None for no object."""
    if not isinstance(e, dict):
        return None
    try:
        return msgspec.json.encode(e, order="sorted")
    except (TypeError, OverflowError, msgspec.EncodeError):  # e.g. an integer past 64 bits
        return repr(e).encode()


def _is_dump(doc: Any) -> bool:
    """A dict with ``entries`` (a list), or without the key but with ``version`` and ``pg_config`` /
    ``pg_status`` (torch's JSON dump of an empty ring buffer)."""
    if not isinstance(doc, dict):
        return False
    if "entries" in doc:
        return isinstance(doc["entries"], list)
    return "version" in doc and ("pg_config" in doc or "pg_status" in doc)


def _without_entries(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without its ``entries`` (for :func:`_is_dump`'s other test: version and pg_config /
    pg_status)."""
    return {k: v for k, v in doc.items() if k != "entries"}


def _empty_dump(
    name: str, rank: int, doc: dict[str, Any], progress: dict[str, dict[str, int | None]]
) -> tuple[bool, str]:
    """(recorded nothing, warning) for a dump without entries (module doc, step 1)."""
    how = "empty 'entries'" if "entries" in doc else "no 'entries' in the dump"
    done = {pg: st["enqueued"] for pg, st in progress.items() if (st["enqueued"] or -1) >= 0}
    if not done:
        status = ", every pg_status -1" if progress else ""
        return True, (
            f"{name}: rank {rank} recorded no collective ({how}{status}: dumped before any ran on this "
            "rank, or TORCH_NCCL_TRACE_BUFFER_SIZE=0); stored with 0 collectives"
        )
    upto = ", ".join(f"seq {v} in pg_id {pg}" for pg, v in sorted(done.items()))
    return False, (
        f"{name}: rank {rank}'s dump holds no entries ({how}) although its pg_status says it enqueued "
        f"up to {upto} (a dump of active entries only, or without collectives); stored with 0 "
        "collectives, its progress kept for desync"
    )


#: An entry's epoch-ns time fields, in order (``time_created_ns`` must be set; 0 = unknown for the others).
_TIME_FIELDS = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")


def _number(v: Any) -> bool:
    """Whether ``v`` is a JSON number (a bool is not; torch's gloo dumps write ``duration_ms`` as text)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _times(e: dict[str, Any]) -> tuple[tuple[int, int | None, int | None], tuple[str, str] | None]:
    """An entry's (created, started, completed) epoch ns (0 -> None: unknown), or why they cannot be
    stored: (reason, value text) for ``time_created_ns`` missing, not an integer or 0, any time field
    present but not an integer or negative (an epoch time is never below 0), or a numeric
    ``duration_ms`` that is negative or not finite. Fields read: :data:`_TIME_FIELDS`, ``duration_ms``."""
    got: list[int | None] = []
    for k in _TIME_FIELDS:
        raw = e.get(k)
        v = json_int(raw)
        value = "" if raw is None else f" ({shown(raw)})"
        if k == "time_created_ns" and not v:
            return (0, None, None), (
                f"missing {k!r}"
                if raw is None
                else f"{k!r} is not an integer"
                if v is None
                else f"{k!r} is 0",
                value,
            )
        if raw is not None and v is None:
            return (0, None, None), (f"{k!r} is not an integer", value)
        if v is not None and v < 0:
            return (0, None, None), (f"negative {k!r}", value)
        got.append(v or None)
    d: Any = e.get("duration_ms")
    if _number(d) and not (math.isfinite(d) and d >= 0):
        return (0, None, None), ("'duration_ms' negative or not finite", f" ({shown(d)})")
    return (got[0] or 0, got[1], got[2]), None


def parse(path: str | Path, options: ParseOptions = DEFAULT_OPTIONS) -> ParsedTrace:
    """Parse one Flight Recorder dump.

    Args:
        path: A ``.json`` (or ``.json.gz``) dump, or torch's pickle dump.
        options: How to read it (``traceprof.core.parsed.ParseOptions``: the gzip inflate cap, and
            ``on_bad_event``): ``"raise"`` stops at an entry whose ``time_created_ns`` is missing, not an
            integer or 0, with a time field that is not an integer or negative, or a negative or
            non-finite ``duration_ms`` (:func:`_times`), or whose sequence number (``collective_seq_id`` / ``p2p_seq_id``, 1.x
            ``seq_id``) is missing or not an integer; ``"skip"`` counts it in ``rejected`` (keyed by
            the reason).

    Returns:
        A :class:`ParsedTrace` (source ``flight_recorder``) with ``collectives`` and ``events``;
        times are epoch ns as FR records them.

    Raises:
        NotATraceError: A document that is not a dump (module doc, step 1).
        TraceFormatError: Unreadable, a pickle that is not plain data, invalid JSON, entries
            numbered by no field of a known version (naming the version), none left after skipping,
            no rank, or (with ``on_bad_event="raise"``) a bad entry, naming it.
    """
    p = Path(path).resolve()
    on_bad_event = options.on_bad_event
    raw, doc, encoding = _read(p, options.max_inflate_ratio)
    if (
        isinstance(doc, dict)
        and not isinstance(doc.get("entries", []), list)
        and _is_dump(_without_entries(doc))
    ):
        # a dump (its version and pg_config / pg_status say so) with a malformed ring buffer: refused
        # as a malformed entry is, not skipped as a file of another kind
        raise TraceFormatError(
            p,
            "entries",
            f"not a list ({type(doc['entries']).__name__}: {shown(doc['entries'])}); torch writes the ring "
            "buffer's entries as a list of records, so none can be read (the file is damaged or not "
            "torch's)",
        )
    if not _is_dump(doc):
        raise NotATraceError(p, "", "not a Flight Recorder dump (no 'entries' list)")
    entries = doc.get("entries", [])
    said_version = None
    if "version" in doc:
        doc["version"], said_version = version_text(doc["version"])
    rank, said = identity_int(doc.get("rank"))
    repaired = {} if said is None else {f"rank {said}": 1}  # for the issues column (traces.meta.repaired)
    # torch's names end in the rank (a host may precede it); others say rank<R>
    default_name = p.name.startswith(("nccl_trace_rank", "fr_trace_rank"))
    m = (_TRAILING_RANK.search(p.name) if default_name else None) or _RANK_IN_NAME.search(p.name)
    by_name = int(m.group(1)) if m else None
    warnings = [] if said is None else [f"{p.name}: the dump's 'rank' is {shown(doc.get('rank'))}, {said}"]
    if rank is not None and by_name is not None and by_name != rank:
        warnings.append(
            f"{p.name}: the dump's 'rank' {rank} differs from rank {by_name} in the file name; "
            f"stored as rank {rank} (the dump's own field)"
        )
    rank = by_name if rank is None else rank
    if rank is None:
        raise TraceFormatError(
            p, "rank", "no 'rank' in the dump and none in the file name; name the file rank<R>.fr.json"
        )
    style, notes = dialect(p, doc.get("version"), entries)
    version_notes = ([said_version] if said_version else []) + notes  # said once per run (settle)
    sizes, world = _group_sizes(doc.get("pg_config"))
    members, only = _members(doc)
    only_size = next(iter(sizes.values())) if len(sizes) == 1 else None
    rows: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []  # the entries behind rows
    events: list[dict[str, Any]] = []
    rejected: dict[str, int] = {}

    def bad(i: int, name: str | None, why: str, value: str = "") -> None:
        if on_bad_event == "raise":
            where = f"entry #{i}" if name is None else f"entry #{i} ({name!r})"
            raise TraceFormatError(p, where, f"{why}{value}{skip_hint(where)}")
        rejected[why] = rejected.get(why, 0) + 1

    # an entry written twice (every field equal, record_id included: the ring buffer numbers each
    # record) is kept once, said and counted
    copies, said_copies = duplicate_records(
        p,
        entries,
        _identity,
        lambda i: (
            f"entry #{i} ({str(entries[i].get('profiling_name', ''))!r}, record_id {entries[i].get('record_id')})"
        ),
        repaired,
    )
    warnings += [said_copies] if said_copies else []
    read_as_is: dict[str, list[Any]] = {}  # reason -> [count, first entry's index, name, value]
    record_ids: set[int] = set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict):  # a bad entry as any other: skipped and counted on request
            why = "not a JSON object" if encoding == "json" else "not a dict (a pickle dump's entries are)"
            bad(i, None, why, f" ({shown(e)})")
            continue
        if i in copies:
            continue
        name = str(e.get("profiling_name", ""))
        times, wrong = _times(e)
        if wrong is not None:
            bad(i, name, *wrong)
            continue
        created, started, completed = times
        op = normalize_op(name) if name else "unknown"
        p2p = e["is_p2p"] if isinstance(e.get("is_p2p"), bool) else op in ("send", "recv")
        seq, no_seq, detail = entry_seq(e, style, p2p)
        if no_seq is not None:
            bad(i, name, no_seq, f" ({detail})")
            continue
        odd = _odd_dim(e) or (
            ("'record_id' is not an integer", f" ({shown(e['record_id'])})")
            if e.get("record_id") is not None and json_int(e["record_id"]) is None
            else None
        )
        if odd is not None:
            bad(i, name, *odd)
            continue
        rid = json_int(e.get("record_id"))
        oddities = _odd_fields(e)
        if rid is not None:
            if rid in record_ids:  # two different entries (a copy was skipped above) under one number
                oddities.append(("'record_id' repeated", rid))
            record_ids.add(rid)
        for why, value in oddities:
            read_as_is.setdefault(why, [0, i, name, value])[0] += 1
        state = e.get("state")
        if state in ("scheduled", "started"):  # the state wins over a stray completion time or duration
            completed = None
        elif completed is None and started is not None and _number(e.get("duration_ms")):
            completed = started + round(float(e["duration_ms"]) * 1e6)
        pgv = e.get("process_group")
        pg_name = (
            str(pgv[0])
            if isinstance(pgv, list) and pgv
            else (None if e.get("pg_id") is None else str(e.get("pg_id")))
        )
        dtypes_in, dtypes_out = (
            v if isinstance(v := e.get(k), list) else [] for k in ("input_dtypes", "output_dtypes")
        )
        dtype = str(dtypes_in[0]) if dtypes_in else (str(dtypes_out[0]) if dtypes_out else None)
        n_in, n_out = _nelems(e.get("input_sizes")), _nelems(e.get("output_sizes"))
        size = dtype_bytes(dtype)
        group = sizes.get(pg_name or "", None)
        if group is None and isinstance(pgv, list) and len(pgv) > 1:
            group = sizes.get(str(pgv[1]))
        rows.append(
            {
                "source": CollectiveSource.fr,
                "pg": None if pg_name is None else (pg_name + ":p2p" if p2p else pg_name),
                "seq": seq,
                "p2p": p2p,
                "op": op,
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
                **dict(zip(("peer", "peer_group_rank"), _peers(name, pgv, members, only), strict=True)),
            }
        )
        kept.append(e)
        events.append(
            {
                "kind": "collective",
                "cat": "flight_recorder",
                "name": name,
                "ts_ns": created,
                "dur_ns": (completed - created) if completed and completed >= created else 0,
                "pid": "",
                "tid": rows[-1]["tid"] or "",
                "device": None,
                "stream": None,
                "correlation": None,
                "external_id": e.get("record_id"),
                "step": None,
                "args": msgspec.json.encode({k: v for k, v in e.items() if k != "frames"}).decode(),
            }
        )
        if not record_fits(
            p,
            f"entry #{i} ({name!r})",
            on_bad_event,
            rejected,
            (rows[-1], row_schema("collectives")),
            (events[-1], row_schema("events")),
            fields={
                **_FIELDS,
                "seq": "seq_id" if style == 1 else ("p2p_seq_id" if p2p else "collective_seq_id"),
            },
        ):
            rows.pop(), kept.pop(), events.pop()
    for why, (n, i, name, value) in read_as_is.items():  # read as is: said and counted (the issues column)
        warnings.append(
            f"{p.name}: {n} entr{'y' if n == 1 else 'ies'} with {why}, first entry #{i} ({name!r}): {shown(value)}"
        )
        repaired[why] = repaired.get(why, 0) + n
    progress = progress_by_pg_id(doc.get("pg_status"))
    nothing = False
    if not entries:  # for hang triage the rank that recorded nothing is the one to look at
        nothing, why = _empty_dump(p.name, rank, doc, progress)
        warnings.append(why)
    elif not rows:
        raise TraceFormatError(p, "entries", f"no valid entries: all {len(entries)} skipped ({rejected})")
    if style == 1 and any(r["p2p"] for r in rows):
        warnings.append(
            f"{p.name}: Flight Recorder version {doc.get('version')} numbers point-to-point ops with "
            "the collectives' counter (seq_id): where only some ranks of a group ran send / recv, its "
            "sequence numbers differ across ranks (torch 2.4+ dumps, version 2.x, count them apart)"
        )
    counter: dict[tuple[Any, str], int] = {}
    for r in sorted(rows, key=lambda r: r["enter_ns"]):
        key = (r["pg"], r["op"])
        r["ordinal"] = counter.get(key, 0)
        counter[key] = r["ordinal"] + 1
    meta = {k: doc.get(k) for k in ("version", "comm_lib_version", "pg_config", "pg_status")}
    if repaired:
        meta["repaired"] = repaired
    if version_notes:
        meta["version_notes"] = version_notes
    facts = _group_facts(doc, kept, rows)
    meta.update(facts, recorded_nothing=nothing, progress_by_pg_id=progress)
    for r in rows:  # member ranks identify a group: two groups can share one name (torchft replicas)
        r["pg_ranks"] = canonical_ranks(facts["groups"].get(r["pg"]))
    return ParsedTrace.of_bytes(
        p,
        raw,
        source=TraceSource.flight_recorder,
        format=f"fr-{encoding}-{doc.get('version', '?')}",
        rank=rank,
        world_size=world,
        trace={"meta": msgspec.json.encode(meta).decode()},
        events=pa.Table.from_pylist(events, schema=row_schema("events")),
        collectives=pa.Table.from_pylist(rows, schema=row_schema("collectives")),
        events_read=len(entries),
        rejected=rejected,
        warnings=warnings,
        empty_said=not entries,  # its _empty_dump warning says why (ingest adds no second one)
    )
