"""Short display names for long kernel and op names (tables, chart axes); the full name stays in
the data, on hover in the report and in ``-f json``/``csv`` output.

``void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>(int, ...)``
becomes ``vectorized_elementwise_kernel``; ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` becomes
``ncclDevKernel_AllReduce``; ``sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize...`` becomes
``sm80_xmma_gemm_f16f16…``. Names at most ``width`` characters long are kept as they are; text
with spaces before any bracket (a gap's cause such as ``all_reduce (524.3 kB) after ...``) is
prose, not a symbol, and keeps its beginning and end; so does text that starts with a bracket
(``<script>...``: its family would drop the start), or holds control characters or HTML tags
(``x<script>alert(1)</script>``): a display form never drops characters unseen, it cuts with ``…``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["family", "shorten", "distinct_short"]

_GENERIC = {"kernel", "kernel2", "device_kernel"}
#: What marks a name as markup, not a C++ symbol (no template argument list holds these).
_MARKUP = ("</", "/>", "<!")
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


def _prose(name: str) -> bool:
    """Text with a space before any bracket (a gap's cause, a note), or starting with a bracket:
    not a symbol."""
    head = name.removeprefix("void ").split("<", 1)[0].split("(", 1)[0]
    # control characters or HTML tags are no symbol's: its family would drop ``<script>`` unseen
    return " " in head or not head or not name.isprintable() or any(t in name for t in _MARKUP)


def shorten(name: str | None, width: int = 40) -> str:
    """A display form of ``name`` at most ``width`` characters: the name itself when it fits, else
    its :func:`family`, cut with an ellipsis when that is still too long."""
    if name is None:
        return ""
    if len(name) <= width:
        return name
    if _prose(name):  # prose (a gap's cause, a note) or markup, not a symbol: keep both ends
        tail = max(width // 3, 1)
        return name[: width - tail - 1] + "…" + name[-tail:]
    fam = family(name)
    return fam if len(fam) <= width else fam[: width - 1] + "…"


_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


def distinct_short(values: Iterable[str | None], width: int = 40) -> dict[str, str]:
    """Each distinct name of ``values`` -> its display form: :func:`shorten` where that tells it
    apart from the others, else the shortest form that does.

    Names whose short forms collide (eleven template instances of ``par_ranged2d_kernel``) get
    ``family<first … last>`` of the words (identifiers and numbers) that not every name of the
    collision has, in order: the first and the last one, then more from both ends until no two
    forms are alike (``par_ranged2d_kernel<update_halo_kernel … 10>``). Names that even their
    full lists of words do not tell apart (they differ in punctuation only) keep their full text.
    Work: O(n log n) in the names plus their lengths.
    """
    names = list(dict.fromkeys(v for v in values if v is not None))
    out = {v: shorten(v, width) for v in names}
    groups: dict[str, list[str]] = {}
    for v, s in out.items():
        groups.setdefault(s, []).append(v)
    used = set(out.values())
    for vs in groups.values():
        if len(vs) > 1:
            out.update(_tell_apart(vs, used))
    return out


def _tell_apart(names: list[str], used: set[str]) -> dict[str, str]:
    """Forms for ``names`` whose short forms collide (see :func:`distinct_short`); prose (a gap's
    cause: words before any bracket) has no family to build on and keeps its full text."""
    if any(_prose(v) for v in names):
        return {v: v for v in names}
    words = {v: _TOKEN.findall(v) for v in names}
    common = set.intersection(*(set(w) for w in words.values()))
    # each word once, where it last occurs (``(instance 4)`` ends the name even if a 4 came before)
    own = {
        v: list(dict.fromkeys(w for w in reversed(ws) if w not in common))[::-1] for v, ws in words.items()
    }
    fam = {v: family(v) for v in names}
    out: dict[str, str] = {}
    left = list(names)
    level = 0
    while left:
        forms = {v: _form(fam[v], own[v], level) for v in left}
        counts: dict[str, int] = {}
        for f in forms.values():
            counts[f] = counts.get(f, 0) + 1
        done = [v for v in left if counts[forms[v]] == 1 and forms[v] not in used]
        for v in done:
            out[v] = forms[v]
            used.add(forms[v])
        exhausted = [v for v in left if v not in out and (level + 1) // 2 + 1 >= len(own[v])]
        for v in exhausted:  # every word shown and still alike: the full name
            if level > 2 * max(len(own[v]), 1):
                out[v] = v
        left = [v for v in left if v not in out]
        level += 1
    return out


def _form(fam: str, words: list[str], level: int) -> str:
    """``fam<first … last>`` of ``words``: level 0 the first word; each further level one more
    word, alternately from the end and from the start."""
    if not words:
        return fam
    last = (level + 1) // 2
    first = level + 1 - last
    if first + last >= len(words):
        return f"{fam}<{' '.join(words)}>"
    return f"{fam}<{' '.join(words[:first])}{' … ' + ' '.join(words[-last:]) if last else ' …'}>"
