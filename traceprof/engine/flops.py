"""Model FLOPs per step and rank, from a stated source (README.md "Analyses": MFU).

FLOPs are floating-point operations; a multiply-add counts 2 (the convention of torch's profiler
and FlopCounterMode). Causal attention (``is_causal`` true in the op's ``Concrete Inputs``) counts
half of its score and value products, as FlashAttention's benchmark and MaxText count it
(:data:`CAUSAL_CONVENTION`); torch's FlopCounterMode counts them in full. Sources, in the order :func:`account` prefers them:

1. ``declared``: the user's model FLOPs per step of the whole job, split evenly over its ranks.
2. ``palm``: the PaLM formula (Chowdhery et al. 2022, appendix B) per step of the whole job,
   ``6·N·tokens + 12·L·H·Q·T·tokens`` (N parameters, L layers, H heads, Q head dim, T sequence
   length, tokens per step), split evenly over the ranks.
3. ``sidecar``: the collector's per-step counts from torch's profiler (``traces.flops_per_step``,
   written by ``traceprof.collectors.kineto.capture``); they include elementwise ``mul``/``add``.
4. ``shapes``: computed here from the trace's CPU ops (Kineto ``record_shapes``: ``args."Input
   Dims"``, ``args."Input type"``, ``args."Concrete Inputs"``) for the matmul, convolution and
   attention ops in :data:`SHAPE_OPS`. Only *leaf* ops count: an op of that set that has another
   op of the set nested inside it on the same thread (``aten::linear`` -> ``aten::matmul`` ->
   ``aten::mm``) is skipped, so nothing is counted twice (the nesting comes from
   ``traceprof.engine.optree``, per thread).

Source fields read: ``events`` (kind ``cpu_op``: name, ts_ns, dur_ns, pid, tid, step, args) and
``traces.flops_per_step``. Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import polars as pl

from traceprof.core.errors import AnalysisError, UsageError
from traceprof.core.schema import sql_texts
from traceprof.engine.analysis import lasting, release_pool, shared
from traceprof.engine.optree import with_parents
from traceprof.engine.peaks import canonical_dtype
from traceprof.storage.store import Store

__all__ = [
    "CAUSAL_CONVENTION",
    "SHAPE_OPS",
    "FlopsAccount",
    "op_flops",
    "palm_flops",
    "signature_flops",
    "shape_flops",
    "sidecar_flops",
    "account",
]

Dims = list[list[int]]


def _prod(xs: list[int]) -> int:
    return math.prod(int(x) for x in xs)


def _mm(d: Dims, c: list[object]) -> float:
    (m, k), (_, n) = d[0], d[1]
    return 2.0 * m * k * n


def _addmm(d: Dims, c: list[object]) -> float:
    return _mm(d[1:], c)


def _bmm(d: Dims, c: list[object]) -> float:
    (b, m, k), (_, _, n) = d[0], d[1]
    return 2.0 * b * m * k * n


def _baddbmm(d: Dims, c: list[object]) -> float:
    return _bmm(d[1:], c)


def _matmul(d: Dims, c: list[object]) -> float:
    a, b = list(d[0]), list(d[1])
    a = [1, *a] if len(a) == 1 else a
    b = [*b, 1] if len(b) == 1 else b
    batch_a, batch_b = a[:-2], b[:-2]
    n = max(len(batch_a), len(batch_b))
    batch_a, batch_b = [1] * (n - len(batch_a)) + batch_a, [1] * (n - len(batch_b)) + batch_b
    return 2.0 * _prod([max(x, y) for x, y in zip(batch_a, batch_b, strict=True)]) * a[-2] * a[-1] * b[-1]


def _linear(d: Dims, c: list[object]) -> float:
    x, w = d[0], d[1]
    return 2.0 * _prod(x[:-1]) * x[-1] * w[0]


def _conv_forward(d: Dims, c: list[object]) -> float | None:
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...)
    x, w = d[0], d[1]
    if len(c) < 8 or not isinstance(c[3], list) or not isinstance(c[4], list) or not isinstance(c[5], list):
        return None
    stride, pad, dil, transposed = c[3], c[4], c[5], bool(c[6])
    nsp = len(x) - 2
    stride, pad, dil = ([v[0]] * nsp if len(v) == 1 else v for v in (stride, pad, dil))
    if transposed:  # weight (C_in, C_out/g, k...): every input pixel scatters into the output
        sp = x[2:]
    else:
        sp = [
            (i + 2 * p - dl * (k - 1) - 1) // s + 1
            for i, p, dl, k, s in zip(x[2:], pad, dil, w[2:], stride, strict=True)
        ]
    return 2.0 * x[0] * _prod(sp) * w[0] * w[1] * _prod(w[2:])


def _conv_backward(d: Dims, c: list[object]) -> float | None:
    # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
    #  groups, output_mask): grad input and grad weight each cost one forward.
    gout, x, w = d[0], d[1], d[2]
    transposed = len(c) > 7 and bool(c[7])
    mask = c[10] if len(c) > 10 and isinstance(c[10], list) else [True, True]
    fwd = 2.0 * gout[0] * _prod((x if transposed else gout)[2:]) * w[0] * w[1] * _prod(w[2:])
    return fwd * (int(bool(mask[0])) + int(bool(mask[1])))


def _causal(c: list[object], at: int) -> bool:
    """Whether concrete input ``at`` (the op's ``is_causal`` argument) is true."""
    return len(c) > at and c[at] is True


def _sdpa_at(at: int) -> Callable[[Dims, list[object]], float]:
    """Forward attention FLOPs, ``is_causal`` at concrete input ``at``: the score (QK^T) and
    value (PV) products, ``2·B·H·Lq·Lk·(Dqk + Dv)``, halved when causal (:data:`CAUSAL_CONVENTION`)."""

    def sdpa(d: Dims, c: list[object]) -> float:
        q, k, v = d[0], d[1], d[2]
        full = 2.0 * _prod(q[:-1]) * k[-2] * (q[-1] + v[-1])
        return full / 2 if _causal(c, at) else full

    return sdpa


def _sdpa_backward_at(at: int) -> Callable[[Dims, list[object]], float]:
    """Backward attention FLOPs (grad_out, query, key, value, ...): dq, dk, dv and dP are four
    matmuls, twice the forward (torch's FlopCounterMode convention; a flash kernel's recomputation
    of QK^T is not counted); halved when causal, like the forward."""
    fwd = _sdpa_at(at - 1)  # the forward's arguments start one later (after grad_out)

    def sdpa_backward(d: Dims, c: list[object]) -> float:
        return 2.0 * fwd(d[1:], c[1:])

    return sdpa_backward


#: How attention is counted (``mfu`` states it): causal attention (``is_causal``) counts half the
#: score and value products, as FlashAttention's own benchmark and MaxText count it.
CAUSAL_CONVENTION = (
    "a multiply-add counts 2; causal attention (SDPA / flash attention with is_causal) counts half "
    "of its score (QK^T) and value (PV) products, as FlashAttention's benchmark and MaxText do"
)


#: Ops whose FLOPs are computed from shapes, with their formula ``f(input dims, concrete inputs)``.
SHAPE_OPS: dict[str, Callable[[Dims, list[object]], float | None]] = {
    "aten::mm": _mm,
    "aten::addmm": _addmm,
    "aten::bmm": _bmm,
    "aten::baddbmm": _baddbmm,
    "aten::matmul": _matmul,
    "aten::linear": _linear,
    "aten::convolution": _conv_forward,
    "aten::_convolution": _conv_forward,
    "aten::convolution_backward": _conv_backward,
    # attention: the position of is_causal among the op's arguments (ATen's schemas) is its argument
    "aten::scaled_dot_product_attention": _sdpa_at(5),
    "aten::_scaled_dot_product_flash_attention": _sdpa_at(4),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _sdpa_at(4),
    "aten::_scaled_dot_product_efficient_attention": _sdpa_at(6),
    "aten::_scaled_dot_product_cudnn_attention": _sdpa_at(6),
    "aten::_scaled_dot_product_flash_attention_backward": _sdpa_backward_at(11),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward_at(7),
    "aten::_scaled_dot_product_efficient_attention_backward": _sdpa_backward_at(11),
    "aten::_scaled_dot_product_cudnn_attention_backward": _sdpa_backward_at(14),
}
# Composite ops that dispatch to other ops of the set; on identical intervals the other one is the leaf.
_COMPOSITE = ("aten::linear", "aten::matmul", "aten::convolution", "aten::scaled_dot_product_attention")


def _concrete(raw: object) -> object:
    """One ``Concrete Inputs`` string (``"[1, 1]"``, ``"False"``, ``"2"``, ``""``) as a Python value."""
    if not isinstance(raw, str) or not raw:
        return None
    try:  # Python literals as torch writes them: "[True, True, False]", "False", "[2, 2]", "1"
        return msgspec.json.decode(raw.replace("True", "true").replace("False", "false"))
    except msgspec.DecodeError:
        return raw


def op_flops(name: str, dims: Dims, concrete: list[object] | None = None) -> float | None:
    """FLOPs of one call of op ``name`` with input shapes ``dims`` (Kineto ``Input Dims``).

    Args:
        name: Op name, e.g. ``aten::mm``.
        dims: Shapes of the op's inputs in order (an empty list for a non-tensor input).
        concrete: Decoded ``Concrete Inputs`` (scalars and int lists), needed for convolutions.

    Returns:
        FLOPs (multiply-add = 2), or None when the op is not in :data:`SHAPE_OPS` or its inputs
        do not have the shapes the formula needs.
    """
    fn = SHAPE_OPS.get(name)
    if fn is None:
        return None
    try:
        return fn(dims, concrete or [])
    except (IndexError, ValueError, TypeError):
        return None


def palm_flops(params: float, layers: int, heads: int, head_dim: int, seq_len: int, tokens: float) -> float:
    """Model FLOPs of one training step by the PaLM formula: ``6·N·tokens + 12·L·H·Q·T·tokens``.

    Args:
        params: Parameter count N (the PaLM paper counts non-embedding parameters).
        layers, heads, head_dim: L, H, Q of the transformer.
        seq_len: Sequence length T (tokens).
        tokens: Tokens processed per step by the whole job (global batch × sequence length).

    Raises:
        UsageError: A non-positive input.
    """
    if min(params, layers, heads, head_dim, seq_len, tokens) <= 0:
        raise UsageError(
            "the PaLM formula needs params, layers, heads, head_dim, seq_len and tokens_per_step > 0"
        )
    return 6.0 * params * tokens + 12.0 * layers * heads * head_dim * seq_len * tokens


# The three keys parsed out of each op's args in one pass (a list of paths), and only where the text
# can hold one of them: every key holds ``Input``, so args without that text and without a ``\u``
# escape (a key spelled with escapes) have none of them, and their JSON is not parsed (traces
# recorded without shapes: 8 ranks x 1 M events, 0.75 s CPU of parsing for null).
_OPS_SQL = """
SELECT * EXCLUDE (_j), _j[1] AS dims, _j[2] AS types, _j[3] AS concrete FROM (
    SELECT rank, trace_id, pid, tid, step, name, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns,
           CASE WHEN name IN ({composite}) THEN 0 ELSE 1 END AS prio,
           CASE WHEN contains(args, 'Input') OR contains(args, '\\u')
                THEN json_extract_string(args, ['$."Input Dims"', '$."Input type"', '$."Concrete Inputs"'])
           END AS _j
    FROM events
    WHERE run_id = ? AND kind = 'cpu_op' AND name IN ({names})
)
"""


@lasting
@shared
def signature_flops(store: Store, run_id: int) -> pl.DataFrame:
    """FLOPs of the leaf matmul/convolution/attention calls of a run, per call signature.

    Read once per run in a session that keeps results (``traceprof.engine.analysis.shared``): the
    report's ``mfu`` (through :func:`account`) and ``stragglers`` (its extra-work test) both read
    it (on 8 ranks x 1 M events about 1.7 s CPU in a fresh process, for a frame of a few thousand rows).

    Returns:
        Frame with columns rank, step (ProfilerStep, null outside steps), name, dims (Kineto
        ``Input Dims`` as stored, JSON text), dtype (canonical, e.g. ``fp32``; null if unknown),
        calls (leaf calls of that signature in the rank-step), flops_call (FLOPs of one call, null
        when the formula cannot use the shapes). Calls that differ only in ``Input type`` or
        ``Concrete Inputs`` are separate rows.
    """
    ops, sigs = _ops(store, run_id)
    # the events' blocks the scan of every op's arguments left cached (128 MiB on 8 ranks x 1 M
    # events) are not held under the call tree below and the caller's work after it (stragglers')
    release_pool(store)
    # the call tree of the columns it reads (and each op's row), not of the shapes' text
    lane = ["trace_id", "pid", "tid"]
    leaf = _leaves(ops.select(*lane, "start_ns", "end_ns", "prio").with_row_index("_op"), lane)
    leaves = ops[leaf].group_by("rank", "step", "sig").agg(pl.len().cast(pl.Int64).alias("calls"))
    del ops, leaf
    text = pl.Utf8
    schema = pl.Schema(
        {
            "rank": pl.Int32,
            "step": pl.Int32,
            "name": text,
            "dims": text,
            "dtype": text,
            "calls": pl.Int64,
            "flops_call": pl.Float64,
        }
    )
    if leaves.is_empty():
        return pl.DataFrame(schema=schema)
    used = sigs.join(leaves.select("sig").unique(), on="sig", how="semi")
    rows = []
    for sig, name, dims, types, concrete in used.iter_rows():  # distinct signatures only: a few hundred
        d = msgspec.json.decode(dims) if dims else None
        c = [_concrete(v) for v in msgspec.json.decode(concrete)] if concrete else []
        t = msgspec.json.decode(types) if types else []
        dtype = next((canonical_dtype(x) for x in t if canonical_dtype(x)), None)
        rows.append((sig, name, dims, dtype, op_flops(name, d, c) if d else None))
    per_sig = pl.DataFrame(
        rows,
        orient="row",
        schema={
            "sig": sigs.schema["sig"],
            "name": text,
            "dims": text,
            "dtype": text,
            "flops_call": pl.Float64,
        },
    )
    return leaves.join(per_sig, on="sig", how="left").select(schema.names()).cast(schema)


def _leaves(spans: pl.DataFrame, lane: list[str]) -> pl.Series:
    """The ``_op`` of the rows of ``spans`` (``lane`` columns, start_ns, end_ns, prio, _op) that are
    leaves of their lane's call tree (:func:`traceprof.engine.optree.with_parents`: no op has them
    as parent), in no particular order.

    Ops that overlap no other op of their lane (:func:`_alone`) are leaves, and neither nest in nor
    change the tree of the others (an op's depth counts only the ops open at its start): the tree
    is built of the rest alone (on 8 ranks x 1 M events nearly every op: 1.1 s CPU)."""
    alone = _alone(spans, lane)
    nested = spans.filter(~alone)
    leaf = spans.filter(alone)["_op"]
    if nested.height:
        tree = with_parents(nested, lane, priority="prio")
        leaf = leaf.append(tree.filter(~pl.col("id").is_in(tree["parent"].drop_nulls().implode()))["_op"])
    return leaf


def _alone(spans: pl.DataFrame, lane: list[str]) -> pl.Series:
    """Per row of ``spans`` (``lane`` columns, start_ns, end_ns, prio), in its order: whether the op
    overlaps (or touches, or shares a start with) no other op of its lane: it starts after every
    earlier op of its lane ends and ends before the next one starts.

    All false when a bound is null, or when two ops of a lane tie on start, end and prio: the call
    tree of such ops depends on the order the sort leaves them in, which leaving out rows may
    change (:func:`traceprof.engine.optree.with_parents` of every op decides then)."""
    none = pl.Series("alone", [False] * spans.height, pl.Boolean)
    if (
        spans.is_empty()
        or spans.select(pl.any_horizontal(pl.col("start_ns", "end_ns").is_null().any())).item()
    ):
        return none
    keys = [*lane, "start_ns", "end_ns", "prio"]
    s = spans.select(*keys, pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row")).sort(keys)
    same = [pl.col(c).eq_missing(pl.col(c).shift(1)) for c in keys]
    if s.select(pl.all_horizontal(same).any()).item():
        return none
    # a lane's number: the count of lane changes so far in the sorted rows (a null equal to a null)
    change = pl.any_horizontal(*(~c for c in same[: len(lane)]))
    s = s.with_columns(change.cast(pl.UInt32).cum_sum().alias("_lane"))
    before = pl.col("end_ns").cum_max().shift(1).over("_lane")
    after = pl.col("start_ns").shift(-1).over("_lane")
    alone = (before.is_null() | (pl.col("start_ns") > before)) & (
        after.is_null() | (pl.col("end_ns") < after)
    )
    return s.select("_row", alone.alias("alone")).sort("_row")["alone"]


#: Rows of the shape ops read at a time by :func:`_ops`.
OPS_BATCH_ROWS = 1 << 16

_SIGNATURE = ("name", "dims", "types", "concrete")


def _ops(store: Store, run_id: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The rows of :data:`_OPS_SQL` of run ``run_id``, their signature's text (name, ``Input Dims``,
    ``Input type``, ``Concrete Inputs``) replaced by a number ``sig``, and the signatures: (sig,
    name, dims, types, concrete), one row each.

    Read :data:`OPS_BATCH_ROWS` rows at a time, each batch's text numbered against the distinct
    signatures seen so far (a few hundred), so that the text of one batch is held at a time, not
    that of every op (on 8 ranks x 1 M events a million ops' JSON text: the fresh process's peak
    in ``stragglers``)."""
    sql = _OPS_SQL.format(names=sql_texts(SHAPE_OPS), composite=sql_texts(_COMPOSITE))
    sig_type = pl.UInt32
    sigs = pl.DataFrame(schema={"sig": sig_type, **{c: pl.Utf8 for c in _SIGNATURE}})
    parts = []
    for batch in store.batches(sql, [run_id], OPS_BATCH_ROWS):
        rows = pl.DataFrame(pl.from_arrow(batch))
        new = (
            rows.select(_SIGNATURE)
            .unique(maintain_order=True)
            .join(sigs, on=list(_SIGNATURE), how="anti", nulls_equal=True)
        )
        if new.height:
            sigs = pl.concat(
                [
                    sigs,
                    new.with_row_index("sig", offset=sigs.height).with_columns(pl.col("sig").cast(sig_type)),
                ]
            )
        parts.append(
            rows.join(sigs, on=list(_SIGNATURE), how="left", nulls_equal=True, maintain_order="left").drop(
                _SIGNATURE
            )
        )
    if not parts:  # no rows: the schema of the query's columns, sig for the text
        empty = store.sql(f"SELECT * FROM ({sql}) WHERE false", [run_id])
        return empty.drop(_SIGNATURE).with_columns(pl.lit(None, sig_type).alias("sig")), sigs
    return pl.concat(parts, rechunk=True), sigs


def shape_flops(store: Store, run_id: int) -> pl.DataFrame:
    """FLOPs of the leaf matmul/convolution/attention ops of a run, from their recorded shapes.

    Returns:
        Frame with columns rank, step (ProfilerStep, null outside steps), name, dtype (canonical,
        e.g. ``fp32``, ``bf16``; null if unknown), calls, flops (FLOPs of the calls whose shapes
        the formula could use), unknown_calls (calls without usable shapes, not in ``flops``).
    """
    schema = pl.Schema(
        {
            "rank": pl.Int32,
            "step": pl.Int32,
            "name": pl.Utf8,
            "dtype": pl.Utf8,
            "calls": pl.Int64,
            "flops": pl.Float64,
            "unknown_calls": pl.Int64,
        }
    )
    unknown = pl.col("flops_call").is_null()
    return (
        signature_flops(store, run_id)
        .group_by("rank", "step", "name", "dtype")
        .agg(
            pl.col("calls").sum(),
            (pl.col("calls") * pl.col("flops_call")).sum().alias("flops"),
            pl.col("calls").filter(unknown).sum().alias("unknown_calls"),
        )
        .cast(schema)
        .sort("rank", "step", "name")
    )


def sidecar_flops(store: Store, run_id: int) -> pl.DataFrame:
    """The collector sidecar's FLOPs per profiled step (``traces.flops_per_step``).

    Returns:
        Frame with columns rank, step, flops (FLOPs of that rank in that step); empty when no trace
        of the run has a sidecar with FLOPs.
    """
    return store.sql(
        """SELECT t.rank, CAST(k.key AS INTEGER) AS step, CAST(k.value AS DOUBLE) AS flops
           FROM traces t, json_each(t.flops_per_step) k
           WHERE t.run_id = ? AND t.flops_per_step IS NOT NULL ORDER BY 1, 2""",
        [run_id],
    )


@dataclass(frozen=True)
class FlopsAccount:
    """Model FLOPs per rank and step and where they came from.

    Attributes:
        per_step: Frame with columns rank, step, flops (FLOPs of the rank in the step).
        source: ``declared``, ``palm``, ``sidecar`` or ``shapes``.
        dtype: Canonical dtype of most matmul FLOPs (from shapes), or None when unknown.
        notes: What the user should know (unknown shapes, ops outside steps, ...).
        shapes: The run's :func:`shape_flops` frame (computed for ``dtype`` whatever the source,
            kept so that callers do not compute it again).
    """

    per_step: pl.DataFrame
    source: str
    dtype: str | None = None
    notes: tuple[str, ...] = field(default=())
    shapes: pl.DataFrame = field(default_factory=pl.DataFrame)


def _dominant_dtype(shapes: pl.DataFrame) -> str | None:
    by = shapes.filter(pl.col("dtype").is_not_null()).group_by("dtype").agg(pl.col("flops").sum())
    return None if by.is_empty() else by.sort("flops", descending=True)["dtype"][0]


def account(
    store: Store,
    run_id: int,
    *,
    declared_per_step: float = 0.0,
    palm: tuple[float, int, int, int, int, float] | None = None,
    source: str = "auto",
) -> FlopsAccount:
    """Model FLOPs of every (rank, step) of a run from the first available source (module doc).

    Args:
        store: An open store.
        run_id: The run.
        declared_per_step: Model FLOPs per step of the whole job (0: not declared).
        palm: ``(params, layers, heads, head_dim, seq_len, tokens_per_step)`` for the PaLM formula.
        source: ``auto`` (the order of the module doc) or one of ``declared``, ``palm``,
            ``sidecar``, ``shapes`` to force it.

    Raises:
        UsageError: Unknown ``source``, or a forced source that is not available.
        AnalysisError: No source is available (nothing declared, no sidecar, no shapes).
    """
    order = ("declared", "palm", "sidecar", "shapes")
    if source != "auto" and source not in order:
        raise UsageError(f"flops_source={source!r}: choose auto, {', '.join(order)}")
    steps = store.sql("SELECT rank, step FROM steps WHERE run_id = ? ORDER BY rank, step", [run_id])
    world = (
        store.sql("SELECT world_size FROM runs WHERE run_id = ?", [run_id])["world_size"][0]
        or steps["rank"].n_unique()
    )
    shapes = shape_flops(store, run_id)
    dtype = _dominant_dtype(shapes)
    for name in order if source == "auto" else (source,):
        if name == "declared" and declared_per_step > 0:
            per = steps.with_columns(pl.lit(declared_per_step / world).alias("flops"))
            return FlopsAccount(
                per,
                name,
                dtype,
                (f"declared {declared_per_step:.4g} FLOPs/step for the job, split over {world} ranks",),
                shapes,
            )
        if name == "palm" and palm is not None:
            total = palm_flops(*palm)
            per = steps.with_columns(pl.lit(total / world).alias("flops"))
            return FlopsAccount(
                per,
                name,
                dtype,
                (f"PaLM formula: {total:.4g} FLOPs/step for the job, split over {world} ranks",),
                shapes,
            )
        if name == "sidecar":
            side = sidecar_flops(store, run_id)
            if not side.is_empty():
                per, notes = _sidecar_steps(steps, side)
                return FlopsAccount(per, name, dtype, notes, shapes)
        if name == "shapes" and shapes["flops"].sum() > 0:
            return _from_shapes(steps, shapes, dtype)
        if source != "auto":
            raise UsageError(f"flops_source={name}: not available for this run")
    raise AnalysisError(
        "no FLOPs source: declare model_flops_per_step (or params/layers/heads/head_dim/seq_len/"
        "tokens_per_step for the PaLM formula), or record with the traceprof collector (sidecar) or "
        "with record_shapes=True"
    )


def _steps_text(steps: list[int]) -> str:
    """``#4..#6`` for a run of consecutive step numbers, else ``#4, #7``."""
    if len(steps) > 2 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"#{steps[0]}..#{steps[-1]}"
    return ", ".join(f"#{x}" for x in steps)


def _sidecar_steps(steps: pl.DataFrame, side: pl.DataFrame) -> tuple[pl.DataFrame, tuple[str, ...]]:
    """The sidecar's FLOPs on the trace's steps (columns rank, step, flops) and a note per rank whose
    trace has steps its sidecar does not number (never a silent drop: t14's rank 1 renumbered
    #104..#106 against its sidecar's #4..#6 fell out of the job). A rank whose trace and sidecar both
    hold n steps, none in common, is lined up by order (the k-th trace step takes the k-th sidecar
    count: one profiling session numbered from another base); otherwise its unmatched steps are
    left out of the MFU, the job and the waterfall. One sort per rank."""
    joined = steps.join(side, on=["rank", "step"], how="left")
    lost = joined.filter(pl.col("flops").is_null())
    if lost.is_empty():
        return joined, ()
    notes, parts = [], [joined.filter(pl.col("flops").is_not_null())]
    for (rank,), own in lost.group_by(["rank"], maintain_order=True):
        trace = sorted(steps.filter(pl.col("rank") == rank)["step"].to_list())
        car = sorted(side.filter(pl.col("rank") == rank)["step"].to_list())
        missing = sorted(own["step"].to_list())
        known = f"its sidecar numbers {_steps_text(car)}" if car else "it has no sidecar FLOPs"
        if car and len(car) == len(trace) and not set(car) & set(trace):
            flops = side.filter(pl.col("rank") == rank).sort("step")["flops"]
            parts.append(pl.DataFrame({"rank": [rank] * len(trace), "step": trace, "flops": flops}))
            notes.append(
                f"rank {rank}: trace steps {_steps_text(trace)} are not in its sidecar, which numbers "
                f"{_steps_text(car)}: lined up by order (the k-th step takes the k-th sidecar count)"
            )
        else:
            notes.append(
                f"rank {rank}: trace steps {_steps_text(missing)} have no sidecar FLOPs ({known}): "
                "left out of the MFU, the job and the waterfall (pass flops_source=shapes to count them "
                "from op shapes)"
            )
    per = pl.concat([p.cast(joined.schema) for p in parts]).sort("rank", "step")
    return per, tuple(notes)


def _from_shapes(steps: pl.DataFrame, shapes: pl.DataFrame, dtype: str | None) -> FlopsAccount:
    notes = []
    unknown = shapes.filter(pl.col("unknown_calls") > 0)
    if not unknown.is_empty():
        names = ", ".join(sorted(set(unknown["name"])))
        notes.append(f"{unknown['unknown_calls'].sum()} calls without usable shapes not counted ({names})")
    outside = shapes.filter(pl.col("step").is_null())["flops"].sum()
    if outside:
        notes.append(f"{outside:.4g} FLOPs outside ProfilerSteps not counted")
    per = steps.join(
        shapes.group_by("rank", "step").agg(pl.col("flops").sum()), on=["rank", "step"], how="left"
    ).with_columns(pl.col("flops").fill_null(0.0))
    return FlopsAccount(per, "shapes", dtype, tuple(notes), shapes)
