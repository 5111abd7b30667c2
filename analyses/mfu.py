"""mfu: achieved TFLOP/s and model FLOPs utilization per step and rank, and for the job.

Algorithm (README.md "Analyses": MFU):
  1. Model FLOPs per (rank, step) from the first available source (``traceprof.engine.flops``):
     declared, PaLM formula, collector sidecar (torch's profiler counts), or op shapes in the trace.
  2. Step time per (rank, step) from ``steps``: the step's wall time, its window in the step
     account (``critical_path``'s, :func:`traceprof.analyses._common.step_windows`): from the end
     of the rank's previous step (the first: its ProfilerStep's start, or its first GPU activity's
     if earlier) to the end of its work (its last GPU activity, else its ProfilerStep's end), so
     the rank's steps tile its time and never overlap. Not the device span alone: a 413 ms step
     that ran one 45 us kernel 395 ms in would claim the step's FLOPs in 45 us (8,800x the MFU).
     The steps of the profiler-start transient are left out (``traceprof.engine.arrivals``, as in every
     analysis; a note says so), here and in the waterfall.
  3. tflops = flops / step time / 1e12; peak = ``peak_tflops`` if given, else the dense peak of
     the rank's device (``traceprof.engine.peaks``, matched from ``devices`` / ``traces.device_name``) for
     the precision: given (``dtype``), else the precision of most matrix-kernel time (kernel names:
     TF32 tensor-op GEMMs such as ``*xmma_gemm*tf32*`` or CUTLASS ``tensorop_s1688gemm``, bf16/fp16
     names; ``traceprof.engine.peaks.kernel_precision``), else the dtype of most matmul FLOPs in the op
     shapes, else bf16. ``dtype_source`` says which (declared, kernels, shapes, default); a note
     gives the reason. A TF32 run thus uses the TF32 tensor-core peak, not the fp32 CUDA-core one.
     mfu_pct = 100 · tflops / peak; no peak (CPU, unknown device, no device name in the trace)
     leaves it null, with a note that says what is missing and to pass ``peak_tflops``.
  4. Recomputation (``recompute``: none, full, or the recomputed fraction of the forward pass f)
     adds f/3 of the model FLOPs (forward = 1/3 of 6N): hardware FLOPs = model · (1 + f/3).
     Declared/PaLM FLOPs are model FLOPs; sidecar/shape counts are executed (hardware) FLOPs.
     hfu_pct is null while recompute is unknown.
  5. Job: total model FLOPs / (Σ over steps of the slowest rank's step time · Σ of rank peaks),
     steps lined up across ranks by the run's step (``traceprof.ingest.matching.run_steps``: a
     rank whose trace numbers its steps from another base joins the others' steps). A rank whose
     trace steps its sidecar does not number is lined up with the sidecar by order, or left out
     with a note (``traceprof.engine.flops``), never silently.
     A rank-step whose window also holds a step the rank's trace lost (a ProfilerStep missing
     between two it has, ``traceprof.ingest.matching.absorbing_steps``) has two steps' time and one
     step's FLOPs: its tflops and mfu_pct are left empty, and the job and the waterfall leave it out.
  6. Waterfall (``waterfall``), from peak FLOP time to achieved over the step account of
     ``critical_path`` (every rank's step windows, to the ns): the time at peak the model FLOPs
     need (FLOPs / peak) is MFU; the rest of the compute time is kernel efficiency; the account's
     idle, transfer (exposed communication), wait (waiting for peers), host_bound
     (launch/host-bound) and memory time are the other rows. Each row's ``pct`` is its share of
     the account's time, so they add up to 100. Refused (n/a with the reason) where the peak is
     unknown, or where the FLOPs at peak would need more time than the compute ran (an MFU above
     100 % of the compute time, let alone of the step: the FLOPs or the peak are wrong).
FLOPs convention (``traceprof.engine.flops.CAUSAL_CONVENTION``): a multiply-add counts 2; causal attention
counts half of its score and value products (shape counts; the PaLM formula and torch's sidecar
counts count attention in full), stated in a note and in the waterfall.
FLOP counts (``flops``, ``flops_per_step``) are float64 FLOPs, in every frame: a job's FLOPs per
step exceed int64 (6·N·tokens for a 405B-parameter model at 16M tokens per step is 3.9e19; int64
holds 9.2e18). They are whole numbers except where a job total is split over its ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceprof.analyses import _common
from traceprof.analyses._common import absorbing_steps, step_windows
from traceprof.core import columns as rc
from traceprof.core.errors import AnalysisError, TraceprofError, UsageError
from traceprof.engine.activity import excluded_note
from traceprof.engine.analysis import (
    Analysis,
    Chart,
    Finding,
    FindingsInput,
    FrameResult,
    Note,
    Report,
    RunParams,
    Topic,
    Verdict,
    register,
)
from traceprof.engine.arrivals import excluded_steps
from traceprof.engine.flops import CAUSAL_CONVENTION, account
from traceprof.engine.peaks import canonical_dtype, kernel_precision, match_device, rank_devices
from traceprof.ingest.matching import run_steps
from traceprof.storage.runs import run_label
from traceprof.storage.store import Store


@dataclass(frozen=True)
class Params(RunParams):
    """FLOPs source, peak and recomputation.

    ``model_flops_per_step``: model FLOPs of one step of the whole job (split over the ranks).
    ``params_count``, ``layers``, ``heads``, ``head_dim``, ``seq_len``, ``tokens_per_step`` (whole
    job): the PaLM formula. ``flops_source``: auto, declared, palm, sidecar or shapes.
    ``peak_tflops``: dense peak per device in TFLOP/s, > 0 (overrides the table; needed for CPU
    runs and devices the table lacks; None: from the table).
    ``dtype``: bf16, fp16, tf32, fp32, fp8 (default: from the trace's matmuls, else bf16).
    ``recompute``: none, full, or the recomputed fraction of the forward pass (0..1); empty = unknown.
    Counts and sizes must be >= 0 (0: not given).

    Raises:
        UsageError: A value out of range (the message names the parameter and the range).
    """

    model_flops_per_step: float = 0.0
    params_count: float = 0.0
    layers: int = 0
    heads: int = 0
    head_dim: int = 0
    seq_len: int = 0
    tokens_per_step: float = 0.0
    flops_source: str = "auto"
    peak_tflops: float | None = None
    dtype: str = ""
    recompute: str = ""

    def __post_init__(self) -> None:
        for name in (
            "model_flops_per_step",
            "params_count",
            "tokens_per_step",
            "layers",
            "heads",
            "head_dim",
            "seq_len",
        ):
            _common.at_least(name, getattr(self, name), 0, "0: not given")
        _common.choice("flops_source", self.flops_source, ("auto", "declared", "palm", "sidecar", "shapes"))
        # the CLI passes a string for a parameter whose default is None
        object.__setattr__(self, "peak_tflops", _common.positive_or_none("peak_tflops", self.peak_tflops))
        if self.dtype and canonical_dtype(self.dtype) is None:
            raise UsageError(f"dtype={self.dtype!r}: expected one of bf16, fp16, tf32, fp32, fp64, fp8")
        _recompute_fraction(self.recompute)


@dataclass(frozen=True)
class Result(FrameResult):
    """Per (rank, step) utilization (``frame``), the job summary (``job``), FLOPs by op (``ops``)
    and the waterfall from peak to achieved (``waterfall``); their columns are declared in :data:`SPEC`."""

    job: pl.DataFrame = field(default_factory=pl.DataFrame)
    ops: pl.DataFrame = field(default_factory=pl.DataFrame)
    waterfall: pl.DataFrame = field(default_factory=pl.DataFrame)
    title = "MFU (model FLOPs utilization)"

    def charts(self) -> list[Chart]:
        value = "mfu_pct" if self.frame["mfu_pct"].is_not_null().any() else "tflops"
        return [Chart(f"{value} per step and rank", "step", ("rank",), kind="heatmap", value=value)]


def _recompute_fraction(raw: str) -> float | None:
    if raw.strip() == "":
        return None
    key = raw.strip().lower()
    if key in ("none", "no", "0"):
        return 0.0
    if key == "full":
        return 1.0
    try:
        f = float(key)
    except ValueError:
        f = -1.0
    if not 0.0 <= f <= 1.0:
        raise UsageError(f"recompute={raw!r}: expected none, full or a fraction 0..1")
    return f


def _peaks(store: Store, run_id: int, params: Params, dtype: str) -> tuple[pl.DataFrame, list[Note]]:
    """Per rank: device, peak_tflops (null when unknown), and notes explaining nulls (of kind
    ``mfu_empty``) or naming the peak."""
    devs = rank_devices(store, run_id)
    notes: list[Note] = []
    rows: list[tuple[object, ...]] = []
    for rank, name, kind in devs.iter_rows():
        if params.peak_tflops is not None:
            rows.append((rank, name, "user", params.peak_tflops))
            continue
        dev = match_device(name) if kind == "gpu" else None
        peak = dev.peak(dtype) if dev else None
        rows.append((rank, name, dev.label if dev else None, peak))
        empty = True  # the note says why MFU is left empty
        if kind == "cpu":
            msg = "CPU-only run: no device peak FLOP/s, MFU left empty; pass peak_tflops=... for MFU"
        elif not name:
            msg = (
                "the trace names no device (no Kineto deviceProperties, no device_name from the collector), "
                "so the peak FLOP/s is unknown: MFU left empty; pass -p peak_tflops=<dense TFLOP/s of one "
                "device> (e.g. 312 for an A100 in bf16)"
            )
        elif dev is None:
            msg = (
                f"unknown device {name!r} (not in the peak table): MFU left empty; pass -p "
                "peak_tflops=<dense TFLOP/s of one device>"
            )
        elif peak is None:
            msg = (
                f"{dev.label} has no published dense {dtype} peak: MFU left empty; pass peak_tflops or dtype"
            )
        else:
            msg, empty = f"peak {peak:g} TFLOP/s per device: {dev.label} ({name}), dense {dtype}", False
        if msg not in notes:
            notes.append(Note(msg, kind="mfu_empty" if empty else ""))
    frame = pl.DataFrame(
        rows,
        schema={"rank": pl.Int32, "device": pl.Utf8, "peak_device": pl.Utf8, "peak_tflops": pl.Float64},
        orient="row",
    )
    return frame, notes


def _utilization_topic(inp: FindingsInput) -> tuple[list[Finding], Verdict | None]:
    """The utilization topic: the job's MFU (informational: no cost); ``n/a`` when it is unknown
    or impossible (above 100%: the inputs are wrong)."""
    m = inp.results.get("mfu")
    if m is None:
        why = str(inp.errors["mfu"]) if "mfu" in inp.errors else "not run"
        return [], Verdict("utilization", "n/a", f"MFU unknown: {why}")
    job = m.frames()["job"].row(0, named=True)
    dtype, src, dev = job.get("dtype"), job.get("dtype_source"), job.get("peak_device")
    if job["mfu_pct"] is None:
        note = m.note("mfu_empty") or "no device peak"
        text = f"{job['tflops']:.3g} TFLOP/s per device; MFU unknown: {note}"
        found = Finding(
            "mfu", text, None, False, "mfu", metric="mfu_pct", cause="no device peak", evidence="mfu:job"
        )
        return [found], Verdict("utilization", "n/a", text)
    peak = f"{dtype} peak {job['peak_tflops']:g} TFLOP/s" + (f", {dev}" if dev else "")
    text = (
        f"MFU {job['mfu_pct']:.1f}% ({peak}; precision from {src}; FLOPs from {job['flops_source']}); "
        f"{job['tflops']:.3g} TFLOP/s per device"
    )
    over = m.note("mfu_over")
    if over is not None or job["mfu_pct"] > 100.0:  # never "ok": the inputs are wrong, so is the number
        why = (
            over
            or "MFU above 100%: impossible, so the FLOPs per step or the peak is wrong (check model_flops_per_step, dtype, peak_tflops)"
        )
        text = f"MFU unknown: {why}; computed: {text}"
        found = Finding(
            "mfu",
            text,
            None,
            True,
            "mfu",
            metric="mfu_pct",
            value=float(job["mfu_pct"]),
            cause="FLOPs per step or peak wrong",
            evidence="mfu:job",
        )
        return [found], Verdict("utilization", "n/a", text)
    problem = job["mfu_pct"] < 30.0
    found = Finding(
        "mfu", text, None, problem, "mfu", metric="mfu_pct", value=float(job["mfu_pct"]), evidence="mfu:job"
    )
    return [found], Verdict("utilization", "problem" if problem else "ok", text)


_SHARED = (rc.number("tflops", "Achieved TFLOP/s per device", "TFLOP/s"),)

SPEC = Analysis(
    name="mfu",
    params=Params,
    result=Result,
    frames=(
        rc.frame(
            "frame",
            "Per (rank, step)",
            rc.RANK,
            rc.STEP,
            rc.ns("step_ns", "Step time"),
            rc.text(
                "step_time_source", "wall (the step range and its GPU activity) or cpu (the step range alone)"
            ),
            rc.number("flops", "Model FLOPs of the rank in the step (float: see the module doc)", "FLOP"),
            *_SHARED,
            rc.text("device", "Device name in the trace"),
            rc.text("dtype", "Precision the peak is for"),
            rc.text("peak_device", "Peak-table entry, or user (-p peak_tflops)"),
            rc.number("peak_tflops", "Dense peak per device; null if unknown", "TFLOP/s"),
            rc.pct("mfu_pct", "Model FLOPs utilization: tflops, % of peak_tflops; null if unknown"),
            rc.pct("hfu_pct", "Hardware FLOPs utilization (recomputation counted); null if unknown"),
            rc.text("flops_source", "Where the FLOPs come from: declared, palm, sidecar or shapes"),
            worst="step_ns",
        ),
        rc.frame(
            "job",
            "One row: the job",
            rc.count("ranks", "Ranks"),
            rc.count("steps", "Steps"),
            rc.number("flops", "Model FLOPs of the job over the steps", "FLOP"),
            rc.ns("time_ns", "Sum over steps of the slowest rank's step time"),
            *_SHARED,
            rc.number("peak_tflops", "Peak per device, mean over ranks", "TFLOP/s"),
            rc.pct("mfu_pct", "Model FLOPs utilization"),
            rc.pct("hfu_pct", "Hardware FLOPs utilization"),
            rc.text("flops_source", "Where the FLOPs come from"),
            rc.text("dtype", "Precision the peak is for"),
            rc.text("dtype_source", "How the precision was chosen: declared, kernels, shapes or default"),
            rc.text("peak_device", "Peak-table entry most ranks use"),
        ),
        rc.frame(
            "ops",
            "FLOPs by op from the recorded shapes (whatever the FLOPs source)",
            rc.text("name", "Op"),
            rc.text("dtype", "Its precision"),
            rc.number("calls_per_step", "Calls per rank and step (mean)"),
            rc.number("flops_per_step", "FLOPs per rank and step (mean)", "FLOP"),
        ),
        rc.frame(
            "waterfall",
            "From the time at peak to the step time (module doc, step 6), over all rank-steps "
            "with FLOPs: the rows add up to the step account's time",
            rc.text(
                "component",
                "idle, exposed communication, waiting for peers, launch/host-bound, memory, "
                "kernel efficiency, MFU (in that order)",
            ),
            rc.Column("ns", "BIGINT", "Its time, summed over the rank-steps", "ns"),
            rc.pct("pct", "ns, % of the account's time; null where refused"),
            rc.text("detail", "What it is, or why it is refused (n/a)"),
        ),
    ),
    report=Report(
        100,
        "ProfilerSteps and a FLOPs source (record_shapes=True, the traceprof collector, or -p "
        "mfu.model_flops_per_step=)",
    ),
    findings=Topic("utilization", 40, _utilization_topic, aliases=("mfu",)),
    requires=("critical_path",),
)


@register(SPEC)
def run(store: Store, params: Params) -> Result:
    """MFU per (rank, step) and for the job.

    Raises:
        StoreError: No such run.
        UsageError: A forced ``flops_source`` that the run lacks (bad values fail in ``Params``).
        AnalysisError: No FLOPs source, or the run has no ProfilerSteps.
    """
    run_id = store.resolve_run(params.run)
    # the step account first, before this analysis' own frames: its peak is then not on top of theirs
    cp = _step_account(store, params)
    palm = None
    if params.params_count > 0 or params.tokens_per_step > 0:
        palm = (
            params.params_count,
            params.layers,
            params.heads,
            params.head_dim,
            params.seq_len,
            params.tokens_per_step,
        )
    acc = account(
        store, run_id, declared_per_step=params.model_flops_per_step, palm=palm, source=params.flops_source
    )
    notes = [f"FLOPs source: {acc.source}", *acc.notes]
    prec = None if params.dtype else kernel_precision(store, run_id)
    if params.dtype:
        dtype, dtype_source = canonical_dtype(params.dtype) or "bf16", "declared"  # validated in Params
    elif prec is not None:
        dtype, dtype_source = prec.dtype, "kernels"
    elif acc.dtype is not None:
        dtype, dtype_source = acc.dtype, "shapes"
    else:
        dtype, dtype_source = "bf16", "default"
    f = _recompute_fraction(params.recompute)
    peaks, peak_notes = _peaks(store, run_id, params, dtype)
    if (peaks["peak_device"].drop_nulls() != "user").any():  # a peak from the table: say which dtype
        if dtype_source == "default":
            notes.append(
                "dtype unknown (no matrix kernels or shapes in the trace): using the bf16 peak; "
                "pass dtype=... to change"
            )
        elif prec is not None:
            notes.append(f"precision {dtype} from the kernels: {prec.reason}; pass dtype=... to override")
        elif dtype == "fp32" and dtype_source == "shapes":
            notes.append(
                "fp32 matmuls (from shapes, no matrix kernels named): using the FP32 (non-tensor-core) "
                "peak; pass dtype=tf32 if TF32 was enabled"
            )
    notes += peak_notes
    steps = step_times(
        store.sql(
            """SELECT rank, step, cpu_start_ns, cpu_end_ns, device_start_ns, device_end_ns
               FROM steps WHERE run_id = ? ORDER BY rank, step""",
            [run_id],
        )
    )
    if steps.is_empty():
        raise AnalysisError(f"{run_label(store, run_id)}: no ProfilerSteps, so no step time for MFU")
    # Executed counts include recomputation: model = executed / (1 + f/3); hardware = model * (1 + f/3).
    measured = acc.source in ("sidecar", "shapes")
    hw = 1.0 + (f or 0.0) / 3.0
    model = pl.col("flops") / hw if measured else pl.col("flops")
    frame = (
        steps.join(acc.per_step.select("rank", "step", "flops"), on=["rank", "step"], how="inner")
        .with_columns(model.alias("flops"))
        .join(peaks, on="rank", how="left")
        .with_columns(
            (pl.col("flops") / pl.col("step_ns") / 1e3).alias("tflops"), pl.lit(dtype).alias("dtype")
        )
        .with_columns(
            (100.0 * pl.col("tflops") / pl.col("peak_tflops")).alias("mfu_pct"),
            pl.lit(acc.source).alias("flops_source"),
        )
        .with_columns(
            (pl.col("mfu_pct") * hw if f is not None else pl.lit(None, pl.Float64)).alias("hfu_pct")
        )
        .select(
            "rank",
            "step",
            "step_ns",
            "step_time_source",
            "flops",
            "tflops",
            "device",
            "dtype",
            "peak_device",
            "peak_tflops",
            "mfu_pct",
            "hfu_pct",
            "flops_source",
        )
    )
    # the profiler-start transient's steps are left out, as of every analysis (traceprof.engine.activity)
    frame = frame.join(excluded_steps(store, run_id).select("rank", "step"), on=["rank", "step"], how="anti")
    frame, held, held_note = _absorbing(store, run_id, steps, frame)
    if held_note:
        notes.append(held_note)
    whole = frame.join(held, on=["rank", "step"], how="anti")  # the rank-steps of one step's time
    if f is None:
        notes.append(
            "recomputation unknown: MFU assumes none, HFU left empty (pass recompute=none|full|0..1)"
        )
    ops = acc.shapes.filter(pl.col("step").is_not_null())
    n = max(steps.height, 1)
    ops = (
        ops.group_by("name", "dtype")
        .agg(
            (pl.col("calls").sum() / n).alias("calls_per_step"),
            (pl.col("flops").sum() / n).alias("flops_per_step"),
        )
        .sort(["flops_per_step", "name", "dtype"], descending=[True, False, False], nulls_last=True)
    )
    over = frame.filter(pl.col("mfu_pct") > 100.0)
    if over.height:
        worst = float(over["mfu_pct"].max())  # type: ignore[arg-type]
        shown = f"{worst:,.0f}" if worst >= 1000 else f"{worst:.1f}"  # 100.4%, not "100%"
        notes.append(
            Note(
                f"MFU above 100% in {over.height:,} of {frame.height:,} step(s) (up to {shown}%): "
                "impossible, so the FLOPs per step or the peak is wrong (check model_flops_per_step, dtype, "
                "peak_tflops)",
                kind="mfu_over",
            )
        )
    waterfall, wnote = _waterfall(store, run_id, params, whole, acc.source, cp)
    notes += [_convention(acc.source), wnote, *(n for n in (excluded_note(store, run_id),) if n)]
    # the job lines its ranks' steps up by the run's step (a rank numbering them from another base)
    job = _job(run_steps(store, run_id, whole), hw if f is not None else None).with_columns(
        pl.lit(dtype).alias("dtype"),
        pl.lit(dtype_source).alias("dtype_source"),
        pl.lit(
            peaks["peak_device"].drop_nulls().mode().sort().first()
            if peaks["peak_device"].drop_nulls().len()
            else None,
            pl.Utf8,
        ).alias("peak_device"),
    )
    return Result(frame=frame, job=job, ops=ops, waterfall=waterfall, notes=tuple(notes))


def _absorbing(
    store: Store, run_id: int, steps: pl.DataFrame, frame: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, str]:
    """``frame`` with tflops, mfu_pct and hfu_pct left empty on the rank-steps that also hold a step
    the rank's trace lost (:func:`traceprof.ingest.matching.absorbing_steps`: two steps' time, one
    step's FLOPs); those rank-steps (rank, step), which the job's row and the waterfall leave out;
    and a note naming them ("" when none)."""
    from traceprof.ingest.matching import run_steps

    mapped = run_steps(store, run_id, steps.select("rank", "step", pl.col("step").alias("own")))
    held = absorbing_steps(mapped).join(mapped, on=["rank", "step"])
    held = held.select("rank", pl.col("own").alias("step"), "lost").join(
        frame.select("rank", "step"), on=["rank", "step"], how="semi"
    )
    if held.is_empty():
        return frame, held.select("rank", "step"), ""
    frame = (
        frame.join(held.select("rank", "step", pl.lit(True).alias("_held")), on=["rank", "step"], how="left")
        .with_columns(
            pl.when(pl.col("_held")).then(pl.lit(None, pl.Float64)).otherwise(pl.col(c)).alias(c)
            for c in ("tflops", "mfu_pct", "hfu_pct")
        )
        .drop("_held")
    )
    which = "; ".join(
        f"rank {r}'s step {s} holds the time of its lost step {', '.join(map(str, lost))} too"
        for r, s, lost in held.sort("rank", "step").iter_rows()
    )
    note = (
        f"{which}, but one step's FLOPs: its TFLOP/s and MFU are left empty, and the job's figures and "
        "the waterfall leave it out"
    )
    return frame, held.select("rank", "step"), note


def _convention(source: str) -> str:
    """The FLOPs convention of ``source``, for the notes."""
    how = {
        "shapes": "these shape counts follow it",
        "sidecar": "torch's profiler counts (the sidecar) count attention in full, not halved when causal",
        "palm": "the PaLM formula counts attention in full (its 12·L·H·Q·T term), not halved when causal",
        "declared": "declared FLOPs are taken as given",
    }.get(source, "")
    return f"FLOPs convention: {CAUSAL_CONVENTION}; {how}"


#: Waterfall rows: (component, critical_path column or None, what it is).
_WATERFALL = (
    ("idle", "idle_ns", "nothing ran and no cause found"),
    (
        "exposed communication",
        "transfer_ns",
        "communication not hidden by compute, after the last rank arrived",
    ),
    ("waiting for peers", "wait_ns", "arrived at a collective, waiting for the last rank"),
    (
        "launch/host-bound",
        "host_bound_ns",
        "the device waited for the host to launch work (Python, data loading)",
    ),
    ("memory", "memory_ns", "memory copies and sets not hidden by compute"),
    ("kernel efficiency", None, "compute time beyond what the model FLOPs need at peak"),
    ("MFU", None, "time the model FLOPs need at the device's peak"),
)


def _step_account(store: Store, params: Params) -> Any:
    """``critical_path``'s result on the run (the waterfall's step account), or the TraceprofError
    it raised (the waterfall is then refused, with the reason)."""
    from traceprof.analyses import critical_path  # here: it registers itself; mfu works without it

    try:
        return critical_path.run(store, critical_path.Params(run=params.run))
    except TraceprofError as e:
        return e


def _waterfall(
    store: Store, run_id: int, params: Params, frame: pl.DataFrame, source: str, cp: Any
) -> tuple[pl.DataFrame, str]:
    """The waterfall from peak FLOP time to achieved (module doc, step 6), and a note on it;
    ``cp``: :func:`_step_account`'s."""
    from traceprof.ingest.matching import run_steps

    schema = {"component": pl.Utf8, "ns": pl.Int64, "pct": pl.Float64, "detail": pl.Utf8}

    def refused(why: str, ns: dict[str, int] | None = None, total: int = 0) -> tuple[pl.DataFrame, str]:
        rows = []
        for name, col, what in _WATERFALL:
            n = (ns or {}).get(col or "", None) if col else None
            if name == "kernel efficiency" and ns is not None:
                n = ns["compute_ns"]
                what = "all compute time (not split: MFU n/a)"
            rows.append(
                (
                    name,
                    n,
                    100.0 * n / total if n is not None and total else None,
                    f"n/a: {why}" if name == "MFU" else what,
                )
            )
        # the missing peak has a note of its own (with what to pass): not said twice
        said = "the device peak is unknown (see above)" if why.startswith("the device peak") else why
        return pl.DataFrame(rows, schema=schema, orient="row"), f"waterfall: MFU n/a: {said}"

    if isinstance(cp, TraceprofError):
        return refused(f"no step account ({cp})")
    mapped = run_steps(store, run_id, frame.select("rank", "step", "flops", "peak_tflops"))
    acc = cp.frame.join(mapped, on=["rank", "step"], how="inner")
    if acc.is_empty():
        return refused("no step of the account has FLOPs")
    cols = [c for _, c, _ in _WATERFALL if c] + ["compute_ns"]
    ns = {c: int(acc[c].sum()) for c in cols}
    total = int(acc["step_ns"].sum())
    if acc["peak_tflops"].null_count():
        return refused("the device peak is unknown (pass -p peak_tflops=)", ns, total)
    ideal = round(float((acc["flops"] / (acc["peak_tflops"] * 1e3)).sum()))  # FLOPs / (TFLOP/s) = ns / 1e3
    if ideal > total:
        return refused(
            f"MFU above 100% ({100.0 * ideal / total:.1f}%): at peak the FLOPs need {ideal / 1e6:,.1f} ms, "
            f"more than the {total / 1e6:,.1f} ms of step time; the FLOPs per step or the peak is wrong",
            ns,
            total,
        )
    if ideal > ns["compute_ns"]:
        return refused(
            f"at peak the FLOPs need {ideal / 1e6:,.1f} ms, more than the {ns['compute_ns'] / 1e6:,.1f} ms "
            "that compute ran; the FLOPs per step or the peak is wrong",
            ns,
            total,
        )
    ns["kernel efficiency"], ns["MFU"] = ns["compute_ns"] - ideal, ideal
    rows = []
    for name, col, what in _WATERFALL:
        n = ns[col] if col else ns[name]
        if name == "MFU":
            what = f"{what}; FLOPs from {source} ({_convention(source).removeprefix('FLOPs convention: ')})"
        rows.append((name, n, 100.0 * n / total, what))
    note = (
        f"waterfall: over the step account's {total / 1e6:,.1f} ms of rank-step time (critical_path: each "
        f"rank's steps from the end of the previous one's work), MFU {100.0 * ideal / total:.1f}%; the job row's "
        "mfu_pct divides by the slowest rank's step time per step (its window in that account) instead"
    )
    return pl.DataFrame(rows, schema=schema, orient="row"), note


def step_times(steps: pl.DataFrame) -> pl.DataFrame:
    """Each step's time (module doc, step 2): its step window's length.

    Args:
        steps: rank, step, cpu_start_ns, cpu_end_ns, device_start_ns, device_end_ns (ns; device
            ones null for a step without GPU activity), one row per (rank, step).

    Returns:
        rank, step, step_ns (ns), step_time_source (``device``: the step ends with its GPU
        activity; ``cpu``: with its ProfilerStep), sorted by rank and step.
    """
    return step_windows(steps, keep=["device_end_ns"]).select(
        "rank",
        "step",
        (pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"),
        pl.when(pl.col("device_end_ns").is_not_null())
        .then(pl.lit("device"))
        .otherwise(pl.lit("cpu"))
        .alias("step_time_source"),
    )


def _job(frame: pl.DataFrame, hw: float | None) -> pl.DataFrame:
    """The job's row: each step lasts its slowest rank's ``step_ns``, and counts the devices of the
    ranks that have that step (a rank whose trace lacks a step adds neither its FLOPs nor its time:
    FLOPs of 11 rank-steps over the time of 12 read 8 % low); TFLOP/s = FLOPs / that device time,
    MFU = FLOPs / the peak FLOPs of that time."""
    per = (
        frame.group_by("step", "rank")
        .agg(pl.col("step_ns").max(), pl.col("peak_tflops").first())
        .group_by("step")
        .agg(pl.col("step_ns").max().alias("t"), pl.len().alias("n"), pl.col("peak_tflops").sum().alias("p"))
    )
    time_ns = float(per["t"].sum())
    device_ns = float((per["t"] * per["n"]).sum())
    ranks = frame["rank"].n_unique()
    peaks = frame.group_by("rank").agg(pl.col("peak_tflops").first())["peak_tflops"]
    total = float(frame["flops"].sum())
    tflops = total / device_ns / 1e3 if device_ns else None
    known = frame["peak_tflops"].null_count() == 0 and time_ns > 0
    mfu = 100.0 * total / 1e3 / float((per["t"] * per["p"]).sum()) if known else None
    return pl.DataFrame(
        {
            "ranks": [ranks],
            "steps": [frame["step"].n_unique()],
            "flops": [total],
            "time_ns": [int(time_ns)],
            "tflops": [tflops],
            "peak_tflops": [float(peaks.sum()) / ranks if known else None],
            "mfu_pct": [mfu],
            "hfu_pct": [mfu * hw if mfu is not None and hw is not None else None],
            "flops_source": [frame["flops_source"][0] if frame.height else None],
        },
        schema_overrides={
            "tflops": pl.Float64,
            "peak_tflops": pl.Float64,
            "mfu_pct": pl.Float64,
            "hfu_pct": pl.Float64,
        },
    )
