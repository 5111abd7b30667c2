"""The one classifier of GPU activity: communication, memory or compute (README.md "What traceprof handles": Kernel class).

Every collector calls :meth:`Classifier.gpu_class` of its parse options' classifier
(``traceprof.core.parsed.ParseOptions.classifier``: the built-in families plus ``--comm-kernel``
patterns) for each kernel / memcpy / memset row and stores the answer in ``events.class``; the ``kernels`` view, ``traceprof.engine.activity`` and the Kineto collectives rows read
that column, so the rule lives here only. (``hta=true`` analyses copy HTA 0.5.0's own name rule on
purpose, see ``traceprof.engine.activity``.)

Rule, first match wins:
  1. ``memcpy`` / ``memset`` rows (and kernels named ``Memcpy*`` / ``Memset*`` / ``dma*``) are ``memory``.
  2. Metadata: a kernel whose own args, or whose launching CPU op's args, carry collective or
     process-group fields (:data:`COMM_ARG_KEYS`: Kineto ``Collective name``, ``Process Group Name``,
     ``Comms Id``, ...) is ``comm``.
  3. Name families (:data:`COMM_FAMILIES`, listed in the README): NCCL / RCCL / MSCCL(++), DeepEP
     (and Hybrid-EP), MORI, Mooncake EP and TensorRT-LLM expert-parallel dispatch/combine, NVSHMEM, torch symmetric memory, custom all-reduce kernels
     (vLLM / SGLang / TensorRT-LLM / FlashInfer / quick-reduce), Transformer Engine userbuffers, and
     kernels named after a collective (``AllReduce``, ``all_gather``, ``reduce_scatter``,
     ``alltoall``...), plus user patterns (``traceprof ingest --comm-kernel REGEX``). No built-in
     family matches a kernel torch.compile generates (``triton_poi_`` / ``triton_red_`` ...:
     :data:`_INDUCTOR_NAME`); user patterns still do.
  4. Everything else is ``compute``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from traceprof.core.errors import UsageError
from traceprof.core.vocab import Flag

__all__ = [
    "EXCLUDED_FLAGS",
    "KEPT_FLAGS",
    "NO_DURATION_FLAGS",
    "flagged_text",
    "DURATION_SQL",
    "duration_sql",
    "VALID_SQL",
    "valid_sql",
    "COMM_ARG_KEYS",
    "COMM_FAMILIES",
    "CommFamily",
    "Classifier",
    "BUILTIN",
    "gpu_class",
    "comm_family",
]

#: ``events.flag`` values whose records are left out of windows, idle, latency and collectives (they
#: stay in the store): their time cannot be right (another clock domain, an unset or far-off time,
#: a ``B`` never closed).
EXCLUDED_FLAGS = frozenset(Flag.values()[:4])  # before_launch, far_outside, zero_ts, unmatched_begin
#: ``events.flag`` values of records that are kept in every analysis: ``overrun`` (clipped to the
#: next record of its lane), ``launch_skew`` (a GPU record that starts a few us before its launch
#: call: clock jitter, the work is real; left out of launch latency only) and ``unclosed`` (a CPU op
#: still open at profiler stop, ``dur: -1``, clipped to the trace's end).
KEPT_FLAGS = frozenset(Flag.values()[4:])  # overrun, launch_skew, unclosed


def valid_sql(alias: str = "e") -> str:
    """SQL predicate over an events row aliased ``alias`` (``""``: no alias): the record is not
    flagged, or its flag is one of :data:`KEPT_FLAGS`."""
    col = f"{alias}.flag" if alias else "flag"
    return f"({col} IS NULL OR {col} IN ({', '.join(repr(f) for f in sorted(KEPT_FLAGS))}))"


#: :func:`valid_sql` over an events row aliased ``e``.
VALID_SQL = valid_sql()

#: ``events.flag`` values of records whose duration is unknown (an unset timestamp: stored with the
#: duration 0 by the NCCL sources; a ``B`` never closed): the duration sums (``kernel_sum``,
#: ``memcpy_sum``, ``nccl_sum``'s kernels, ``nvtx_sum``) leave them out. The other excluded flags
#: (``before_launch``, ``far_outside``) mark a start in another clock domain: the duration, measured
#: on one clock, is right, and the sums count it.
NO_DURATION_FLAGS = frozenset({Flag.zero_ts.value, Flag.unmatched_begin.value})


def flagged_text(counts: Iterable[tuple[str, int]], what: str) -> str:
    """The count of records flagged at ingest, per flag, for notes: ``"3 kernels flagged at ingest
    (events.flag: before_launch 2, far_outside 1)"`` (thousands separated), one text for every
    analysis that notes them.

    Args:
        counts: (``events.flag`` value, records) pairs, in the order to name them.
        what: The records' plural noun (``kernels``, ``GPU record(s)``).
    """
    pairs = list(counts)
    each = ", ".join(f"{f} {n:,}" for f, n in pairs)
    return f"{sum(n for _, n in pairs):,} {what} flagged at ingest (events.flag: {each})"


def duration_sql(alias: str = "e") -> str:
    """SQL predicate over an events row aliased ``alias`` (``""``: no alias): the record's duration
    is known (not flagged, or its flag is not one of :data:`NO_DURATION_FLAGS`)."""
    col = f"{alias}.flag" if alias else "flag"
    return f"({col} IS NULL OR {col} NOT IN ({', '.join(repr(f) for f in sorted(NO_DURATION_FLAGS))}))"


#: :func:`duration_sql` over an events row aliased ``e``.
DURATION_SQL = duration_sql()

#: Args that mark a kernel (or the CPU op that launched it) as communication.
COMM_ARG_KEYS = frozenset(
    {
        "Collective name",
        "Process Group Name",
        "Process Group Description",
        "Process Group Ranks",
        "Comms Id",
        "collective_name",
        "process_group",
        "pg_name",
    }
)


@dataclass(frozen=True)
class CommFamily:
    """A family of communication kernels: ``pattern`` (regex, searched in the kernel name), the
    collective ``op`` its kernels perform when the name alone says it (else ``None``: read from the
    name's collective token or the metadata)."""

    name: str
    pattern: str
    op: str | None = None
    doc: str = ""


#: The maintained list of communication kernel families (data: extend it here or with --comm-kernel).
COMM_FAMILIES: tuple[CommFamily, ...] = (
    CommFamily("nccl", r"(?i)nccl", None, "NCCL: ncclKernel_*, ncclDevKernel_*, ncclSymkDevKernel_*"),
    CommFamily("rccl", r"(?i)rccl", None, "ROCm RCCL kernels"),
    CommFamily("msccl", r"(?i)msccl", None, "MSCCL / MSCCL++ kernels"),
    CommFamily("other_ccl", r"(?i)hccl|oneccl", None, "other vendors' collective libraries (HCCL, oneCCL)"),
    CommFamily(
        "deepep",
        r"^(?!.*get_dispatch_layout)(?!.*(?:deep_ep|uccl)::(?:\w+::)*layout::)"
        r".*?(?:deep_ep::|uccl::(?:intranode|internode|internode_ll)::)",
        "all_to_all",
        "DeepEP expert-parallel dispatch / combine / notify kernels (NVLink, NVSHMEM), and those of its "
        "fork UCCL-EP (uccl::intranode::, uccl::internode::, uccl::internode_ll::); not their layout "
        "kernels (get_dispatch_layout, in deep_ep::layout::, deep_ep::internode::, "
        "deep_ep::legacy::layout:: or uccl::layout::, counts tokens per rank locally: compute)",
    ),
    CommFamily(
        "mori_ep",
        r"mori::moe::Ep(?:Dispatch|Combine)\w*Kernel\b",
        "all_to_all",
        "AMD MORI expert-parallel dispatch / combine kernels (mori::moe::EpDispatch*Kernel, EpCombine*Kernel; "
        "not the local EpDispatchCopyToStaging nor a kernel that only takes EpDispatchCombineArgs)",
    ),
    CommFamily(
        "moe_a2a",
        r"moeA2A(?:Dispatch|Combine)Kernel",
        "all_to_all",
        "TensorRT-LLM / FlashInfer MoE all-to-all dispatch / combine kernels (moe_comm::moeA2ADispatchKernel; "
        "not the local moeA2APrepare*Kernel)",
    ),
    CommFamily(
        "hybrid_ep",
        r"hybrid_ep::(?:dispatch|combine|device_sync)_kernel\b",
        "all_to_all",
        "DeepEP's Hybrid-EP (NVIDIA) dispatch / combine kernels and their cross-rank barrier "
        "(hybrid_ep::dispatch_kernel, combine_kernel, device_sync_kernel; not its local permute / scan kernels)",
    ),
    CommFamily(
        "mooncake_ep",
        r"mooncake::(?:\w+::)*(?:dispatch|combine)\w*[<(]|mooncake_ep_jit_\w*(?:dispatch|combine)",
        "all_to_all",
        "Mooncake EP (a DeepEP adaptation with IBGDA) dispatch / combine kernels (mooncake::dispatch<...>, "
        "mooncake::combine<...>, the JIT-compiled mooncake_ep_jit_dispatch_kernel)",
    ),
    CommFamily(
        "pplx",
        r"^void (?:\(anonymous namespace\)::)?(?:dispatch|combine)Kernel<.*?, ?(?:true|false), ?(?:true|false)>\(",
        "all_to_all",
        "pplx-kernels (Perplexity) MoE all-to-all dispatch / combine kernels, whose demangled names carry no "
        "library word: void (anonymous namespace)::dispatchKernel<16u, true, true>(...), "
        "void combineKernel<__nv_bfloat16, __nv_bfloat16, 8ul, true, true>(...) (template ends DO_SEND, DO_RECV)",
    ),
    CommFamily("nvshmem", r"(?i)nvshmem", None, "NVSHMEM collectives and puts/gets"),
    CommFamily(
        "symm_mem",
        r"(?i)symmetric_memory|symm_mem|multimem_(all_reduce|all_gather|reduce)",
        None,
        "torch symmetric-memory collectives (one_shot / two_shot / multimem)",
    ),
    CommFamily(
        "custom_all_reduce",
        r"(?i)cross_device_reduce|custom_?all_?reduce|allreduce_fusion|one_?shot_?all_?reduce|"
        r"two_?shot_?all_?reduce|lamport|quick_?reduce|quickreduce",
        "all_reduce",
        "custom all-reduce kernels (vLLM/SGLang cross_device_reduce, TRT-LLM, "
        "FlashInfer allreduce_fusion, quick-reduce)",
    ),
    CommFamily("userbuffers", r"(?i)userbuffers", None, "Transformer Engine userbuffers comm overlap"),
    CommFamily(
        "collective_name",
        r"^(?:.*?(?:(?:^|[^a-z])(?:[aA]ll_?[rR]educe|[aA]ll_?[gG]ather|[rR]educe_?[sS]catter|[aA]ll_?[tT]o_?[aA]ll)"
        r"|All_?Reduce|All_?Gather|Reduce_?Scatter|All_?To_?All|ALL_?REDUCE|ALL_?GATHER))",
        None,
        "any kernel named after a collective (AllReduce, all_gather, reduce_scatter, alltoall)",
    ),
)

#: Kernels torch.compile (Inductor) generates: ``triton_poi_`` / ``triton_red_`` / ``triton_per_`` /
#: ``triton_tem_`` / ``triton_for_`` / ``triton_mix_`` (pointwise, reduction, persistent reduction,
#: template, foreach, mixed). Their names list the ops they fuse or read from (e.g.
#: ``triton_red_fused_add_all_reduce_mean_0`` is the RMSNorm after an all-reduce,
#: ``triton_poi_fused_multimem_all_reduce_0`` a copy beside a symmetric-memory one): no built-in
#: family matches them (Inductor runs collectives as extern kernels, never fused into its own);
#: ``--comm-kernel`` patterns still do.
_INDUCTOR_NAME = re.compile(r"^triton_(?:poi|red|per|tem|for|mix)_")

_MEMORY_NAME = re.compile(r"^(Memcpy|Memset|dma)", re.IGNORECASE)


def _compile(pattern: str, origin: str) -> re.Pattern[str]:
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise UsageError(f"{origin} {pattern!r}: not a valid regular expression ({e})") from None
    if rx.search(""):
        raise UsageError(
            f"{origin} {pattern!r}: matches the empty string, so every kernel would be "
            "communication; give a pattern that names the kernels, e.g. 'fused_exchange'"
        )
    return rx


class Classifier:
    """GPU-activity classifier: the built-in families plus user patterns (module doc).

    Args:
        extra_comm: User regexes (searched in kernel names) that mark communication kernels.

    Raises:
        UsageError: A user pattern is not a valid regular expression, or matches the empty string
            (``''``, ``.*``: every kernel would be communication).
    """

    def __init__(self, extra_comm: Iterable[str] = ()) -> None:
        self.extra = tuple(extra_comm)
        self._families = [(f, re.compile(f.pattern)) for f in COMM_FAMILIES]
        self._builtin = len(self._families)  # the user patterns follow
        self._families += [(CommFamily(f"user:{p}", p), _compile(p, "--comm-kernel")) for p in self.extra]
        self._cache: dict[str, CommFamily | None] = {}

    def family(self, name: str) -> CommFamily | None:
        """The communication family of a kernel name, or ``None`` (cached per name)."""
        hit = self._cache.get(name, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        families = self._families[self._builtin :] if _INDUCTOR_NAME.match(name) else self._families
        fam = next((f for f, rx in families if rx.search(name)), None)
        if len(self._cache) < 1_000_000:
            self._cache[name] = fam
        return fam

    def gpu_class(
        self,
        kind: str,
        name: str,
        args: Mapping[str, Any] | None = None,
        launcher_args: Mapping[str, Any] | None = None,
    ) -> str:
        """Class of one GPU row: ``comm``, ``memory`` or ``compute`` (module doc, rule 1-4).

        Args:
            kind: Event kind (``kernel``, ``memcpy``, ``memset``).
            name: Kernel name.
            args: The row's own args (Kineto ``args``), or None.
            launcher_args: Args of the CPU op that launched it (same ``External id``), or None.
        """
        return self.gpu_class_of(kind, name, has_comm_args(args) or has_comm_args(launcher_args))

    def gpu_class_of(self, kind: str, name: str, comm_args: bool) -> str:
        """:meth:`gpu_class` when it is known whether the row's or its launcher's args carry
        collective / process-group fields (``comm_args``); parsers call it once per distinct
        (kind, name, comm_args)."""
        if kind in ("memcpy", "memset") or _MEMORY_NAME.match(name):
            return "memory"
        if comm_args:
            return "comm"
        return "comm" if self.family(name) is not None else "compute"


def has_comm_args(args: Mapping[str, Any] | None) -> bool:
    """True when ``args`` carry collective / process-group fields (:data:`COMM_ARG_KEYS`)."""
    return bool(args) and not COMM_ARG_KEYS.isdisjoint(args)  # type: ignore[arg-type]


#: The built-in families alone (no ``--comm-kernel`` pattern).
BUILTIN = Classifier()


def gpu_class(
    kind: str,
    name: str,
    args: Mapping[str, Any] | None = None,
    launcher_args: Mapping[str, Any] | None = None,
) -> str:
    """:meth:`Classifier.gpu_class` of the built-in families (:data:`BUILTIN`)."""
    return BUILTIN.gpu_class(kind, name, args, launcher_args)


def comm_family(name: str) -> CommFamily | None:
    """The communication family of a kernel name under the built-in families, or ``None``."""
    return BUILTIN.family(name)


def families_markdown() -> str:
    """The family list as a Markdown table (for the README)."""
    rows = ["| family | name pattern (regex) | op | what |", "|---|---|---|---|"]
    rows += [
        f"| `{f.name}` | `{f.pattern.replace('|', '&#124;')}` | {f.op or 'from name/args'} | {f.doc} |"
        for f in COMM_FAMILIES
    ]
    return "\n".join(rows)
