"""Dense peak FLOP/s of accelerators by device name and dtype, the denominator of MFU.

Numbers are the vendors' published *dense* tensor-core peaks (no 2:4 sparsity), per device, in
TFLOP/s (10^12 floating-point operations per second; a multiply-add counts 2). ``fp32`` is the
non-tensor-core (CUDA core / vector) rate; ``tf32`` the tensor-core TF32 rate. A dtype that a
device does not list is unknown, never guessed. Sources: NVIDIA A100, H100, H200 and HGX B200
datasheets; AMD Instinct MI250/MI250X/MI300X/MI325X datasheets.

Device names are matched as Kineto writes them (``deviceProperties[].name``, e.g.
``NVIDIA A100-SXM4-80GB``, ``NVIDIA H100 80GB HBM3``, ``NVIDIA H100 PCIe``, ``AMD Instinct
MI300X``); the first matching rule wins, so the specific variants (PCIe, NVL) come before the
generic name. CPU-only runs have no peak: MFU needs a user-given ``peak_tflops`` there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from traceprof.storage.store import Store

__all__ = [
    "DevicePeak",
    "PEAKS",
    "DTYPES",
    "Precision",
    "canonical_dtype",
    "kernel_dtype",
    "kernel_precision",
    "match_device",
    "rank_devices",
]

#: Canonical dtype names used by the peak table and by ``traceprof.engine.flops``.
DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class DevicePeak:
    """One device model: a label, the name pattern that selects it, dense peaks by dtype (TFLOP/s)."""

    label: str
    pattern: str
    tflops: dict[str, float]

    def peak(self, dtype: str) -> float | None:
        """Dense peak for ``dtype`` (a canonical name, see :data:`DTYPES`) in TFLOP/s, or None."""
        return self.tflops.get(dtype)


_H100_SXM = {"fp64": 67.0, "fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}
_MI300 = {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9}

#: Matched in order against the device name (case-insensitive regular expressions).
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak(
        "H100 PCIe",
        r"H[18]00.*PCIE",
        {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
    ),
    DevicePeak(
        "H100 NVL",
        r"H100.*NVL",
        {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5},
    ),
    DevicePeak(
        "H200 NVL",
        r"H200.*NVL",
        {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5},
    ),
    DevicePeak("H200", r"H200", _H100_SXM),
    DevicePeak("H100 SXM", r"H100|H800|GH200", _H100_SXM),
    DevicePeak("B200", r"(?<![A-Z])B200", {"tf32": 1125.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0}),
    DevicePeak(
        "A100", r"A100|A800", {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}
    ),
    DevicePeak("V100S", r"V100S", {"fp64": 8.2, "fp32": 16.4, "fp16": 130.0}),
    DevicePeak("V100 PCIe", r"V100.*PCIE", {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0}),
    DevicePeak("V100 SXM2", r"V100", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}),
    DevicePeak("L40S", r"L40S", {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "fp8": 733.0}),
    DevicePeak("A10", r"A10(?![0-9])", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    DevicePeak("MI300X", r"MI300X|MI325X", _MI300),
    DevicePeak("MI250X", r"MI250X", {"fp64": 95.7, "fp32": 95.7, "fp16": 383.0, "bf16": 383.0}),
    DevicePeak("MI250", r"MI250", {"fp64": 90.5, "fp32": 90.5, "fp16": 362.1, "bf16": 362.1}),
)

_DTYPE_ALIASES = {
    "double": "fp64",
    "float64": "fp64",
    "fp64": "fp64",
    "float": "fp32",
    "float32": "fp32",
    "fp32": "fp32",
    "tf32": "tf32",
    "tensorfloat32": "tf32",
    "half": "fp16",
    "float16": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "fp8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
}


def canonical_dtype(name: str | None) -> str | None:
    """Canonical dtype (``bf16``, ``fp32``, ...) of a name as traces or users write it
    (``c10::BFloat16``, ``float``, ``Half``, ``bf16``), or None for non-float or unknown types."""
    if not name:
        return None
    return _DTYPE_ALIASES.get(name.rsplit("::", 1)[-1].lower())


def match_device(name: str | None) -> DevicePeak | None:
    """The peak-table entry of a device name, or None (unknown device, ``cpu``, missing name)."""
    if not name or name.lower() == "cpu":
        return None
    for dev in PEAKS:
        if re.search(dev.pattern, name, re.IGNORECASE):
            return dev
    return None


def rank_devices(store: Store, run_id: int) -> pl.DataFrame:
    """The accelerator each rank of a run computed on.

    A rank's device is the most common ``device`` index of its GPU events, looked up in the
    ``devices`` table (Kineto ``deviceProperties``); without GPU events, its lowest-index device;
    without device properties, ``traces.device_name`` (``cpu`` for CPU-only runs).

    Returns:
        Frame with columns rank, device_name (None when unknown), device_kind (``gpu`` or ``cpu``).
    """
    return store.sql(
        """
        WITH used AS (
          SELECT rank, mode(device) AS device FROM events
          WHERE run_id = ? AND kind IN ('kernel', 'memcpy', 'memset') GROUP BY rank
        ),
        props AS (
          SELECT d.rank, arg_min(d.name, CASE WHEN d.device = u.device THEN -1 ELSE d.device END) AS name
          FROM devices d LEFT JOIN used u USING (rank) WHERE d.run_id = ? GROUP BY d.rank
        ),
        tr AS (SELECT rank, any_value(device_name) AS device_name FROM traces WHERE run_id = ? GROUP BY rank)
        SELECT tr.rank, coalesce(p.name, tr.device_name) AS device_name,
               CASE WHEN u.rank IS NOT NULL OR p.name IS NOT NULL THEN 'gpu'
                    WHEN lower(tr.device_name) = 'cpu' THEN 'cpu' ELSE 'gpu' END AS device_kind
        FROM tr LEFT JOIN props p USING (rank) LEFT JOIN used u USING (rank)
        ORDER BY tr.rank
        """,
        [run_id, run_id, run_id],
    )


#: Matrix-multiply kernels (GEMM, convolution, attention MMA): the kernels whose precision sets the peak.
_GEMM = re.compile(r"gemm|xmma|cutlass|mma|conv|wgrad|dgrad|fprop|cublas|matmul|flash", re.IGNORECASE)

#: Precision from a matrix kernel's name, first match wins (bf16 before fp16: "bf16" contains "f16";
#: TF32 tensor-op names carry ``tf32`` or CUTLASS's ``tensorop_s1688``/``tensorop_s16816``, "s" for
#: fp32 operands on tensor cores; plain ``sgemm``/``gcgemm`` are fp32 on CUDA cores).
_KERNEL_DTYPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fp8", re.compile(r"e4m3|e5m2|fp8", re.IGNORECASE)),
    ("bf16", re.compile(r"bf16|bfloat16", re.IGNORECASE)),
    ("tf32", re.compile(r"tf32|tensorop_s1688|tensorop_s16816|tensorop_s884", re.IGNORECASE)),
    ("fp16", re.compile(r"f16|half|h1688|h16816|h884|hgemm|hmma", re.IGNORECASE)),
    ("fp64", re.compile(r"dgemm|f64|fp64|double", re.IGNORECASE)),
    ("fp32", re.compile(r"sgemm|gcgemm|f32|fp32|simt", re.IGNORECASE)),
)


def kernel_dtype(name: str) -> str | None:
    """Canonical dtype (:data:`DTYPES`) a matrix kernel computes in, from its name, or None.

    ``sm80_xmma_gemm_tf32f32_...`` and ``cutlass_80_tensorop_s1688gemm_...`` are tf32,
    ``ampere_bf16_s16816gemm_...`` bf16, ``volta_h884gemm_...`` fp16, ``ampere_sgemm_...`` fp32;
    an elementwise kernel or an unrecognized GEMM is None.
    """
    if not _GEMM.search(name):
        return None
    return next((dtype for dtype, pat in _KERNEL_DTYPES if pat.search(name)), None)


@dataclass(frozen=True)
class Precision:
    """The precision a run's matrix kernels ran in: ``dtype`` (canonical), ``share_pct`` (% of the
    recognized matrix-kernel time in that dtype), ``gemm_ns`` (that time, ns) and ``example`` (the
    longest-running kernel name of that dtype)."""

    dtype: str
    share_pct: float
    gemm_ns: int
    example: str

    @property
    def reason(self) -> str:
        """One line: which kernels set the precision."""
        return (
            f"{self.share_pct:.0f}% of matrix-kernel time is {self.dtype} "
            f"(e.g. {self.example[:80]}{'...' if len(self.example) > 80 else ''})"
        )


def kernel_precision(store: Store, run_id: int) -> Precision | None:
    """The dominant precision of a run's matrix kernels, by kernel time (the ``kernels`` view's rows
    of compute class, names classified by :func:`kernel_dtype`); None when no matrix kernel is
    recognized (CPU runs, traces without kernels).

    Reads ``events`` with the view's row filter and class default: the view's launch join matches
    at most one runtime call per kernel (it adds columns, never rows), and none of them is needed.
    """
    rows = store.sql(
        """SELECT name, sum(dur_ns) AS ns FROM events
           WHERE run_id = ? AND kind IN ('kernel', 'memcpy', 'memset') AND coalesce(class, 'compute') = 'compute'
           GROUP BY name ORDER BY name""",
        [run_id],
    ).rows()
    by: dict[str, tuple[int, int, str]] = {}
    for name, ns in rows:
        dtype = kernel_dtype(name or "")
        if dtype is None or not ns:
            continue
        total, top, example = by.get(dtype, (0, -1, ""))
        by[dtype] = (total + int(ns), max(top, int(ns)), name if int(ns) > top else example)
    if not by:
        return None
    dtype, (ns, _, example) = max(by.items(), key=lambda kv: kv[1][0])
    all_ns = sum(v[0] for v in by.values())
    return Precision(dtype, 100.0 * ns / all_ns, ns, example)
