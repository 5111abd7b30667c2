"""Parse ByteDance NDTimeline per-op Parquet traces (the OSDI'25 straggler study's format).

One ``trace-<X>.parquet`` holds a whole job: one row per coarse operation of one worker in one
sampled step, timed on the GPU and already aligned across workers by NDTimeline. Its sibling
``meta-<X>.yaml`` gives the parallelism (dp/pp/tp/dsp/vpp sizes, world size). Tensor parallelism is
collapsed: one worker stands for its TP group, so a 64-GPU job with tp 4 has 16 workers.

Algorithm:
  1. Read the Parquet columns (``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id,
     mc, mb_id, gmc``) and the meta YAML (PyYAML's safe loader without aliases, at most 1 MiB).
  2. Times: ``start_ts`` / ``duration`` are float32 seconds relative to the step (its earliest op
     at 0). Sampled steps are laid end to end on one synthetic clock, in step order, 1 ms apart:
     ``ts_ns = step_base_ns + round(start_ts * 1e9)``. Durations within a step are exact to the
     float32 resolution (about 4 us at 46 s); absolute epochs are unknown.
  3. One trace per worker (``rank``). Compute ops (forward-compute, backward-compute, optimizer,
     gc, and layernorm-grads-all-reduce, which only spans the collapsed TP group) become
     ``gpu_user_annotation`` events; communication ops become ``collective`` events plus
     collectives rows whose (pg, seq) names the group exactly as the study's dependency model does:
       - forward-send of stage s with forward-recv of stage s+1, same dp rank, k-th with k-th
         (``pp<d>:<s>-><s+1>:fwd``); backward-send of stage s with backward-recv of stage s-1
         (``pp<d>:<s>-><s-1>:bwd``);
       - params-all-gather / grads-reduce-scatter / separate-grads-all-reduce: all dp ranks of a
         stage (``dp:stage<s>:<optype>``);
       - embedding-grads-all-reduce: first and last stage of a dp rank (``embedding:dp<d>``);
       - optimizer-clip-main-grad: every worker (``world:optimizer-clip-main-grad``; the global
         grad-norm all-reduce).
     seq = step * 1,000,000 + seq_id (NDTimeline's ``seq_id`` numbers ops of one type in a step).
  4. Steps: one row per worker and step, from its first op start to its last op end (the same
     values in the cpu_ and device_ columns: NDTimeline times GPU ops, there is no CPU annotation).

Source fields read: the Parquet columns above; meta ``trial_name, run_id, dp_size, dsp_size,
pp_size, tp_size, vpp_size, world_size``.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from traceprof.collectors._arrow import row_schema
from traceprof.collectors._duplicates import duplicate_table_rows
from traceprof.core.bounded import check_nesting, too_deep
from traceprof.core.errors import TraceFormatError
from traceprof.core.fileio import read_file
from traceprof.core.lazy import lazy
from traceprof.core.limits import INT32, MAX_FIELD_BYTES, polars_out_of_range, shown, skip_hint
from traceprof.core.parsed import DEFAULT_OPTIONS, ParsedTrace, ParseOptions
from traceprof.core.values import checked_int, spelled_int
from traceprof.core.vocab import CollectiveSource, TraceSource
from traceprof.ingest import sources

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml
else:
    np = lazy("numpy")
    pl = lazy("polars")
    pa = lazy("pyarrow")
    # imported by every command that loads the collectors (0.1 s of CPU and 10 MB in each ingest):
    # only when an NDTimeline file is read
    pq = lazy("pyarrow.parquet")
    yaml = lazy("yaml")  # the same: 10 ms of every ingest, for the meta YAML of an NDTimeline file

__all__ = ["parse", "is_ndtimeline_file", "meta_path"]

_COLUMNS = (
    "dp_rank",
    "stage",
    "rank",
    "step",
    "optype",
    "start_ts",
    "duration",
    "seq_id",
    "mc",
    "mb_id",
    "gmc",
)
_COMPUTE = frozenset({"forward-compute", "backward-compute", "optimizer", "gc", "layernorm-grads-all-reduce"})
_OP = {
    "forward-send": "send",
    "backward-send": "send",
    "forward-recv": "recv",
    "backward-recv": "recv",
    "params-all-gather": "all_gather",
    "grads-reduce-scatter": "reduce_scatter",
    "separate-grads-all-reduce": "all_reduce",
    "embedding-grads-all-reduce": "all_reduce",
    "optimizer-clip-main-grad": "all_reduce",
}
_DP_OPS = ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce")
#: Columns a row cannot do without (its group and sequence number are computed from them).
_NOT_NULL = ["rank", "step", "stage", "dp_rank", "seq_id", "optype"]
_STEP_GAP_NS = 1_000_000
_SEQ_STRIDE = 1_000_000


def is_ndtimeline_file(path: Path) -> bool:
    """True for Parquet files (the only Parquet trace format traceprof reads)."""
    return path.name.endswith(".parquet")


def meta_path(path: Path) -> Path:
    """The meta YAML of a trace: ``trace-AR.parquet`` -> ``meta-AR.yaml``."""
    stem = path.name[: -len(".parquet")]
    return path.with_name(
        ("meta-" + stem[len("trace-") :] if stem.startswith("trace-") else stem + ".meta") + ".yaml"
    )


#: Key of the meta mapping under which :func:`_read_meta` leaves the sizes written as strings or
#: floats (key -> ``"'8', a string: read as its integer"``), said and counted in ``traces.meta.repaired`` by :func:`parse`.
_SPELLED = "_spelled"


def _read_meta(path: Path) -> dict[str, Any]:
    """The meta YAML beside ``path`` as a mapping ({} when there is none).

    Raises:
        TraceFormatError: Unreadable, over 1 MiB, not UTF-8, invalid YAML (naming ``line L:C`` and
            what the parser expected, on one line: PyYAML's own message spans several, with caret
            lines), an alias (``*name``: a "billion laughs" file expands without bound), nested over
            :data:`traceprof.core.bounded.MAX_DEPTH` levels, not a mapping, or a ``*_size`` that is not a
            positive integer (naming the key).
    """
    side = meta_path(path)
    if not side.is_file():
        return {}
    try:
        if (size := side.stat().st_size) > _MAX_META_BYTES:
            raise TraceFormatError(
                side,
                "",
                f"meta YAML of {size:,} bytes: an NDTimeline meta file is a few "
                f"hundred; refused above {_MAX_META_BYTES:,} bytes",
            )
        doc = yaml.load(side.read_bytes(), Loader=_no_aliases())  # noqa: S506 - SafeLoader without aliases
    except OSError as e:
        raise TraceFormatError(side, "", f"cannot read the meta YAML: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        where, why = _yaml_problem(e)
        raise TraceFormatError(
            side, where, f"invalid meta YAML: {why}; fix the file or move it away"
        ) from None
    except RecursionError:
        raise too_deep(side, what="meta YAML") from None
    except ValueError as e:  # PyYAML's int() of a number over 4300 digits
        raise TraceFormatError(side, "", f"invalid meta YAML: {e}; fix the file or move it away") from None
    check_nesting(doc, side, "meta YAML")
    if not isinstance(doc, dict):
        raise TraceFormatError(side, "", "meta YAML is not a mapping")
    spelled: dict[str, str] = {}
    for key, v in doc.items():
        if isinstance(key, str) and key.endswith("_size") and v is not None:
            n, _ = checked_int(v, 32)
            if n is None or n < 1:
                raise TraceFormatError(side, key, f"{v!r} is not a positive integer")
            if (
                how := spelled_int(v)
            ) is not None:  # "8": read as 8, said (traceprof.core.values.identity_int)
                spelled[key] = f"{v!r}, {how}: read as its integer"
            doc[key] = n
    if spelled:
        doc[_SPELLED] = spelled
    return doc


#: Largest meta YAML read (bytes); real ones are a few hundred.
_MAX_META_BYTES = 1 << 20


@functools.cache
def _no_aliases() -> type[yaml.SafeLoader]:
    """PyYAML's safe loader, refusing aliases (``*name``): nested aliases ("billion laughs") make a
    few hundred bytes stand for billions of values once the document is copied or encoded, and a
    meta file never needs them. (A class made on first use: PyYAML is imported only then.)"""

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, "an alias (*name): aliases are not read", mark)
            return super().compose_node(parent, index)

    return NoAliases


def _yaml_problem(e: yaml.YAMLError) -> tuple[str, str]:
    """(``line L:C`` or ``byte N`` or "", what is wrong) of a PyYAML error, on one line each."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        why = e.problem or "invalid YAML"
        if e.context:
            cm = e.context_mark
            started = (
                f" started at line {cm.line + 1}:{cm.column + 1}"
                if cm is not None and (cm.line, cm.column) != (mark.line, mark.column)
                else ""
            )
            why += f" ({e.context}{started})"
        return f"line {mark.line + 1}:{mark.column + 1}", why
    if isinstance(e, yaml.reader.ReaderError):
        return f"byte {e.position}", f"not UTF-8 text ({e.reason})"
    return "", str(e).splitlines()[0] if str(e) else type(e).__name__


def _row_checks() -> list[tuple[str, str, pl.Expr]]:
    """(column, problem, predicate true where the row has it), in the order a bad row's message
    names its first: the times (null, NaN, infinite, negative, beyond 2**62 ns), then the ids
    (null, beyond their column) and the optype (null, longer than 1 MiB). Together they are the
    filter of :func:`parse` (which runs as one expression; these run on its bad rows only)."""
    limit_s = float(2**62) / 1e9
    out: list[tuple[str, str, pl.Expr]] = []
    for c in ("start_ts", "duration"):
        v = pl.col(c).cast(pl.Float64)
        out += [
            (c, "null {c}", v.is_null()),
            (c, "NaN {c}", v.is_nan()),
            (c, "infinite {c}", v.is_infinite()),
            (c, "negative {c}", v < 0),
            (c, "{c} beyond 2**62 ns", v.abs() > limit_s),
        ]
    out += [(c, "null {c}", pl.col(c).is_null()) for c in _NOT_NULL]
    out += [
        (c, "{c} beyond int32", ~pl.col(c).is_between(*INT32)) for c in ("rank", "step", "stage", "dp_rank")
    ]
    out.append(("seq_id", f"{{c}} beyond +-{_SEQ_STRIDE - 1}", pl.col("seq_id").abs() >= _SEQ_STRIDE))
    out.append(("optype", "{c} longer than 1 MiB", pl.col("optype").str.len_bytes() > MAX_FIELD_BYTES))
    return out


def _bad_row_reasons(bad: pl.DataFrame) -> list[str]:
    """What is wrong with each row of ``bad`` (rows :func:`parse`'s filter refused), in its order:
    the first problem of :func:`_row_checks` it has, naming the column and the value
    (``"negative 'duration' (-0.5)"``; an optype by its length). Computed for these rows only."""
    checks = _row_checks()
    first = bad.select(
        pl.coalesce(
            [pl.when(expr.fill_null(False)).then(pl.lit(i)) for i, (_, _, expr) in enumerate(checks)]
        ).alias("i")
    )["i"].to_list()
    out = []
    for r, i in enumerate(first):
        if i is None:  # not reached: the checks cover the filter; said plainly if they ever do not
            out.append("a null, NaN, negative or out-of-range value")
            continue
        col, what, _ = checks[i]
        v = bad[col][r]
        value = "" if v is None else f" ({len(v.encode()):,} bytes)" if col == "optype" else f" ({shown(v)})"
        out.append(what.format(c=repr(col)) + value)
    return out


def _pg(optype: str, dp: int, stage: int) -> str | None:
    if optype == "forward-send":
        return f"pp{dp}:{stage}->{stage + 1}:fwd"
    if optype == "forward-recv":
        return f"pp{dp}:{stage - 1}->{stage}:fwd"
    if optype == "backward-send":
        return f"pp{dp}:{stage}->{stage - 1}:bwd"
    if optype == "backward-recv":
        return f"pp{dp}:{stage + 1}->{stage}:bwd"
    if optype in _DP_OPS:
        return f"dp:stage{stage}:{optype}"
    if optype == "embedding-grads-all-reduce":
        return f"embedding:dp{dp}"
    if optype == "optimizer-clip-main-grad":
        return "world:optimizer-clip-main-grad"
    return None


def parse(path: str | Path, options: ParseOptions = DEFAULT_OPTIONS) -> list[ParsedTrace]:
    """Parse one NDTimeline Parquet trace into one :class:`ParsedTrace` per worker.

    Args:
        path: ``trace-<X>.parquet``; ``meta-<X>.yaml`` beside it is read when present.
        options: How to read it (``traceprof.core.parsed.ParseOptions``); its ``on_bad_event``: ``"raise"``
            stops at a row with a null, NaN, infinite or negative time (or a null rank, step, stage,
            dp_rank, seq_id or optype, a value beyond its column, or an optype longer than
            ``traceprof.core.limits.MAX_FIELD_BYTES``), naming the field and its value (its first
            problem, :func:`_row_checks`: ``negative 'duration' (-0.5)``); ``"skip"`` drops it,
            counted by that problem (``negative 'duration'``).

    Returns:
        Traces (source ``ndtimeline``) sorted by rank, all with the file's path and SHA-256.

    Raises:
        TraceFormatError: Not a Parquet file, missing columns, no rows (or none left after
            skipping), or a bad row (naming its index).
    """
    p = Path(path).resolve()
    on_bad_event = options.on_bad_event
    raw = read_file(p)
    try:
        # pyarrow checks every page of a damaged file and says what is wrong; polars' reader
        # aborted the process on some (a 2**61-byte allocation) and panicked on others. One thread:
        # after threaded reads of damaged files, with polars loaded, the process sometimes aborted
        # at exit (2 in 12 runs of 400 damaged files; none in 36 runs on one thread)
        table = pq.read_table(pa.BufferReader(raw), use_threads=False)
        table.validate(full=True)
        df = pl.from_arrow(table)
    except Exception as e:  # pyarrow and polars raise several types for bytes that are not Parquet
        first = str(e).splitlines()[0] if str(e) else ""  # one line: polars may add hints below
        raise TraceFormatError(p, "", f"not a readable Parquet file ({type(e).__name__}: {first})") from None
    assert isinstance(df, pl.DataFrame)  # a table converts to a frame
    missing = [c for c in _COLUMNS if c not in df.columns]
    if missing:
        raise TraceFormatError(p, "", f"not an NDTimeline trace: missing columns {missing}")
    for c in _COLUMNS:  # a column of another type made polars fail on the checks below
        dtype = df.schema[c]
        ok = (
            dtype.is_numeric()
            if c in ("start_ts", "duration")
            else dtype == pl.String or isinstance(dtype, (pl.Categorical, pl.Enum))
            if c == "optype"
            else dtype.is_integer()
        )
        if not ok:
            want = "numbers" if c in ("start_ts", "duration") else "text" if c == "optype" else "integers"
            raise TraceFormatError(p, "", f"not an NDTimeline trace: column {c!r} holds {dtype}, not {want}")
    meta = _read_meta(p)
    spelled: dict[str, str] = meta.pop(_SPELLED, {})
    df = df.select(_COLUMNS).with_columns(pl.col("optype").cast(pl.Utf8)).with_row_index("_row")
    if df.is_empty():
        raise TraceFormatError(p, "", "no rows: the trace holds no operation")
    # not finite also catches null (is_finite keeps null; fill_null(False) turns it into bad)
    bad = df.filter(
        ~pl.col("start_ts").is_finite().fill_null(False)
        | ~pl.col("duration").is_finite().fill_null(False)
        | (pl.col("duration") < 0)
        | (pl.col("start_ts") < 0)  # relative to the step, whose earliest op is at 0
        | pl.any_horizontal(pl.col(_NOT_NULL).is_null())
        | polars_out_of_range(
            int32=("rank", "step", "stage", "dp_rank"),
            seconds=("start_ts", "duration"),
            below={"seq_id": _SEQ_STRIDE},
            text=("optype",),
        )
    )
    rejected: dict[str, int] = {}
    if bad.height:
        reasons = _bad_row_reasons(bad)
        if on_bad_event == "raise":
            row = bad.row(0, named=True)
            raise TraceFormatError(
                p,
                f"row #{row['_row']} (optype={shown(row['optype'])})",
                reasons[0] + skip_hint("row"),
            )
        for why in reasons:
            key = why.split(" (", 1)[0]  # counted by the problem, its value left out
            rejected[key] = rejected.get(key, 0) + 1
        df = df.join(bad.select("_row"), on="_row", how="anti")
        if df.is_empty():
            raise TraceFormatError(p, "", f"no valid rows: all {bad.height} rows have a bad time")
    # a row written twice (every column read equal: one worker's op of one type, seq_id and
    # micro-batch at one time) is kept once, said and counted on the first trace
    copied: dict[str, int] = {}
    named = df.select("_row", "optype")
    copies, said_copies = duplicate_table_rows(
        p,
        df.select(_COLUMNS).to_arrow(),
        ("rank", "step", "seq_id"),
        lambda r: f"row #{named.row(r)[0]} (optype={shown(named.row(r)[1])})",
        copied,
    )
    if copies:
        df = df.filter(~pl.int_range(df.height).is_in(copies))
    # Exact float32 -> float64 -> ns; steps laid end to end (module doc, step 2).
    df = df.with_columns(
        (pl.col("start_ts").cast(pl.Float64) * 1e9).round().cast(pl.Int64).alias("rel_ns"),
        (pl.col("duration").cast(pl.Float64) * 1e9).round().cast(pl.Int64).alias("dur_ns"),
    )
    spans = df.group_by("step").agg((pl.col("rel_ns") + pl.col("dur_ns")).max().alias("len")).sort("step")
    bases = np.concatenate([[0], np.cumsum(spans["len"].to_numpy() + _STEP_GAP_NS)[:-1]])
    df = df.join(spans.select("step").with_columns(pl.Series("base", bases, pl.Int64)), on="step")
    df = df.with_columns((pl.col("base") + pl.col("rel_ns")).alias("ts_ns"))
    pp = int(meta.get("pp_size") or (int(df["stage"].max()) + 1))  # type: ignore[arg-type]
    sha = hashlib.sha256(raw).hexdigest()
    sizes = {"world": int(df["rank"].n_unique()), "dp": int(df["dp_rank"].n_unique()), "pp": pp}
    last_step = int(df["step"].max())  # type: ignore[arg-type]
    out: list[ParsedTrace] = []
    for (rank,), g in df.sort("rank", "ts_ns", "optype").group_by("rank", maintain_order=True):
        out.append(
            _trace(p, sha, len(raw), int(rank), g, meta, sizes, last_step, rejected if not out else {})
        )
    if spelled or copied:  # said and counted once, on the first trace, as the rejected rows are
        head = out[0]
        info = msgspec.json.decode(str(head.trace["meta"]))
        info["repaired"] = {f"{k} {said.split(', ', 1)[1]}": 1 for k, said in spelled.items()} | copied
        head.trace["meta"] = msgspec.json.encode(info).decode()
        head.warnings += [f"{meta_path(p).name}: {k} is {said}" for k, said in spelled.items()]
        head.warnings += [said_copies] if said_copies else []
    return out


def _stands_for(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The ranks one worker stands for (meta ``world_size / (dp_size x pp_size)``, the TP group NDTimeline
    collapses, ranks ``rank .. rank + n - 1`` as Megatron numbers them, TP innermost) and why, in
    words; None when a worker is one rank or the meta lacks the sizes (module doc)."""
    size = {k: int(meta.get(f"{k}_size") or 0) for k in ("world", "dp", "pp", "tp", "dsp")}
    workers = size["dp"] * size["pp"]
    if not workers or size["world"] <= workers or size["world"] % workers:
        return None
    n = size["world"] // workers
    if size["tp"] == n:
        why = f"one per tensor-parallel group of {n} (NDTimeline collapses TP)"
    else:
        why = (
            f"one per group of {n} ranks (tp {size['tp']} x dsp {size['dsp'] or 1} of meta world_size "
            f"{size['world']} / (dp {size['dp']} x pp {size['pp']}): NDTimeline collapses them)"
        )
    return {"ranks": n, "why": why}


def _group_size(optype: str, sizes: dict[str, int]) -> int:
    """Workers in the group of a communication op (module doc, step 3)."""
    if optype.endswith(("-send", "-recv")):
        return 2
    if optype in _DP_OPS:
        return sizes["dp"]
    if optype == "embedding-grads-all-reduce":
        return min(sizes["pp"], 2)
    return sizes["world"]


def _trace(
    p: Path,
    sha: str,
    nbytes: int,
    rank: int,
    g: pl.DataFrame,
    meta: dict[str, Any],
    sizes: dict[str, int],
    last_step: int,
    rejected: dict[str, int],
) -> ParsedTrace:
    rows = g.to_dicts()
    events, colls = [], []
    counter: dict[tuple[str, str], int] = {}
    for r in rows:
        opt = r["optype"]
        comm = opt not in _COMPUTE
        args = {k: r[k] for k in ("dp_rank", "stage", "seq_id", "mc", "mb_id", "gmc")}
        events.append(
            {
                "kind": "collective" if comm else "gpu_user_annotation",
                "cat": "ndtimeline",
                "name": opt,
                "ts_ns": r["ts_ns"],
                "dur_ns": r["dur_ns"],
                "pid": str(rank),
                "tid": "comm" if comm else "compute",
                "device": None,
                "stream": None,
                "correlation": None,
                "external_id": None,
                "step": r["step"],
                "args": msgspec.json.encode(args).decode(),
            }
        )
        pg = _pg(opt, r["dp_rank"], r["stage"]) if comm else None
        if pg is None:
            continue
        op = _OP.get(opt, opt)
        key = (pg, op)
        colls.append(
            {
                "source": CollectiveSource.ndtimeline,
                "pg": pg,
                "seq": r["step"] * _SEQ_STRIDE + r["seq_id"],
                "op": op,
                "p2p": op in ("send", "recv"),  # pipeline sends and receives: one peer each
                "dtype": None,
                "nelems_in": None,
                "nelems_out": None,
                "bytes_in": None,
                "bytes_out": None,
                "group_size": _group_size(opt, sizes),
                "enter_ns": None,
                "start_ns": r["ts_ns"],
                "end_ns": r["ts_ns"] + r["dur_ns"],
                "stream": None,
                "tid": None,
                "step": r["step"],
                "ordinal": counter.get(key, 0),
            }
        )
        counter[key] = counter.get(key, 0) + 1
    steps = (
        g.group_by("step")
        .agg(pl.col("ts_ns").min().alias("s"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("e"))
        .sort("step")
    )
    step_rows = [
        {
            "step": s,
            "cpu_start_ns": a,
            "cpu_end_ns": b,
            "device_start_ns": a,
            "device_end_ns": b,
            "is_last": s == last_step,
        }
        for s, a, b in steps.iter_rows()
    ]
    first = rows[0]
    info = {
        "trial_name": meta.get("trial_name"),
        "parallelism": {k: v for k, v in meta.items() if k.endswith("_size")},
        "dp_rank": first["dp_rank"],
        "stage": first["stage"],
        "clock": "NDTimeline step-relative seconds; sampled steps laid end to end, 1 ms apart",
        "clock_synced_by_source": True,
    }
    stands = _stands_for(meta)
    if stands:
        info["stands_for"] = stands
    return ParsedTrace(
        path=str(p),
        sha256=sha,
        bytes=nbytes,
        source=TraceSource.ndtimeline,
        format="ndtimeline-parquet",
        rank=rank,
        world_size=int(meta["world_size"]) if meta.get("world_size") else None,
        trace={"meta": msgspec.json.encode(info).decode(), "device_name": None},
        events=pa.Table.from_pylist(events, schema=row_schema("events")),
        steps=pa.Table.from_pylist(step_rows, schema=row_schema("steps")),
        collectives=pa.Table.from_pylist(colls, schema=row_schema("collectives")),
        events_read=len(rows),
        rejected=dict(rejected),
    )


sources.register(
    sources.Collector(
        "ndtimeline",
        "NDTimeline per-op Parquet (*.parquet, one file per run)",
        lambda p, h: is_ndtimeline_file(p),
        parse,
        order=40,
        whole_run=True,
        world_field="world_size (meta-*.yaml)",
        companions=lambda p: [meta_path(p)],
    )
)
