"""Short display names for long kernel and op names (tables, chart axes); the full name stays in
the data, on hover in the report and in ``-f json``/``csv`` output.

``void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>(int, ...)``
becomes ``vectorized_elementwise_kernel``; ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` becomes
``ncclDevKernel_AllReduce``; ``sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize...`` becomes
``sm80_xmma_gemm_f16f16…``. Names at most ``width`` characters long are kept as they are; text
with spaces before any bracket (a gap's cause such as ``all_reduce (524.3 kB) after ...``) is
prose, not a symbol, and keeps its beginning and end; so does text that starts with a bracket
(``<script>...``: its family would drop the start).
"""

from __future__ import annotations

import re

__all__ = ["family", "shorten"]

_GENERIC = {"kernel", "kernel2", "device_kernel"}
_NCCL = re.compile(r"^(nccl(?:Dev|Symk)?(?:Dev)?Kernel_[A-Za-z]+)")


def _strip_brackets(s: str, open_: str, close: str) -> str:
    """``s`` without any (nested) ``open_ ... close`` parts."""
    out, depth = [], 0
    for ch in s:
        if ch == open_:
            depth += 1
        elif ch == close and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def family(name: str) -> str:
    """The family of a kernel or op name: no return type, template arguments, parameter list or
    namespaces; NCCL kernels keep their collective (``ncclDevKernel_AllReduce``)."""
    s = name.strip()
    m = _NCCL.match(s)
    if m:
        return m.group(1)
    if s.startswith("void "):
        s = s[5:]
    if "<" in s or "(" in s:
        s = _strip_brackets(_strip_brackets(s, "<", ">"), "(", ")").strip() or s
    if "::" in s and " " not in s:
        s = s.rsplit("::", 1)[-1] or s
    if (
        s.lower() in _GENERIC and "<" in name
    ):  # cutlass::Kernel<cutlass_80_tensorop_...>: the argument says more
        inner = name.split("<", 1)[1]
        inner = re.split(r"[<>,(]", inner, maxsplit=1)[0].strip()
        s = inner.rsplit("::", 1)[-1] or s
    return s


def shorten(name: str | None, width: int = 40) -> str:
    """A display form of ``name`` at most ``width`` characters: the name itself when it fits, else
    its :func:`family`, cut with an ellipsis when that is still too long."""
    if name is None:
        return ""
    if len(name) <= width:
        return name
    head = name.removeprefix("void ").split("<", 1)[0].split("(", 1)[0]
    if " " in head or not head:  # prose (a gap's cause, a note) or markup, not a symbol: keep both ends
        tail = max(width // 3, 1)
        return name[: width - tail - 1] + "…" + name[-tail:]
    fam = family(name)
    return fam if len(fam) <= width else fam[: width - 1] + "…"
