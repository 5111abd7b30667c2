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
#: What marks a name as markup, not a C++ symbol (no template argument list holds these): an HTML
#: closing or empty tag, a comment or doctype, a tag with an attribute (``<img src=x onerror=...>``),
#: rich markup's closing tags and links (``[/]``, ``[/bold]``, ``[link=...]``), a script URL.
_MARKUP = re.compile(
    r"</|/>|<!|<[A-Za-z][\w-]*\s+[\w:-]+\s*=|\[/|\[link=|javascript:",
    re.IGNORECASE,
)
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
    return " " in head or not head or not name.isprintable() or _MARKUP.search(name) is not None


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
    forms are alike (``par_ranged2d_kernel<update_halo_kernel … 10>``). Names that their words do
    not tell apart (the same words in other places, or punctuation only) show the part where they
    differ (``index_elementwise_kernel<…OpaqueType<4>…>``); only names whose such parts read alike
    keep their full text.
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
            out.update(_tell_apart(vs, used, width))
    return out


def _tell_apart(names: list[str], used: set[str], width: int) -> dict[str, str]:
    """Forms for ``names`` whose short forms collide (see :func:`distinct_short`); prose (a gap's
    cause: words before any bracket) has no family to build on and keeps its full text. Names that
    words cannot tell apart (the same words in other places: ``OpaqueType<1>`` and ``<4>`` in two
    928-character ``index_elementwise_kernel`` names) are told apart by where they differ
    (:func:`_by_difference`); a word longer than ``width`` (a mangled symbol) shows its two ends."""
    if any(_prose(v) for v in names):
        return {v: v for v in names}
    words = {v: _TOKEN.findall(v) for v in names}
    common = set.intersection(*(set(w) for w in words.values()))
    # each word once, where it last occurs (``(instance 4)`` ends the name even if a 4 came before)
    own = {  # a word longer than the width (a mangled symbol) is cut: a form stays about the width
        v: [_ends(w, width) for w in dict.fromkeys(w for w in reversed(ws) if w not in common)][::-1]
        for v, ws in words.items()
    }
    fam = {v: _ends(family(v), width) for v in names}
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
    whole = [v for v in names if out[v] == v and len(v) > width]
    if whole:  # against the whole group: a name whose every word another one has is told apart too
        for v in whole:
            used.discard(v)
        out.update(_by_difference(names, used, width, whole))
    return out


def _cut(text: str, width: int) -> str:
    """``text`` when at most ``width`` characters, else its first ``width - 1`` and ``…``."""
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"


def _ends(word: str, width: int) -> str:
    """``word`` when at most ``width`` characters, else its first and last ``width // 2`` around ``…``
    (long identifiers of one family differ at either end: ``..._weighted_kernel_cta_per_row_1``)."""
    half = max(width // 2, 1)
    return word if len(word) <= width else word[:half] + "…" + word[-half:]


_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _by_difference(
    names: list[str], used: set[str], width: int, only: list[str] | None = None
) -> dict[str, str]:
    """Forms for distinct ``names`` (those of ``only``, default all) from the places where they
    differ: in sorted order a name is told from every other by where it first differs from the
    names before and after it, so its form shows those places, each widened to whole words (and the
    ``<`` / ``>`` of a template argument) up to a quarter of the width each side:
    ``index_elementwise_kernel<…OpaqueType<4>…>``. An ``…`` stands for each part left out; names whose forms would still read alike keep
    their full text. O(n log n) comparisons plus the names' lengths."""
    order = sorted(names)
    at: dict[str, list[int]] = {v: [] for v in order}
    for a, b in zip(order, order[1:], strict=False):
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        at[a].append(k)
        at[b].append(k)
    out = {v: _difference_form(v, sorted(set(at[v])), width) for v in (names if only is None else only)}
    forms = set(out.values())
    if len(forms) < len(out) or forms & used:
        return {v: v for v in out}
    used.update(forms)
    return out


def _difference_form(v: str, places: list[int], width: int) -> str:
    """``v``'s form from the characters at ``places``, each widened to whole words up to a quarter
    of ``width`` each side (:func:`_by_difference`)."""
    reach = max(width // 4, 1)
    spans: list[list[int]] = []
    for k in places:
        lo, hi = k, min(k + 1, len(v))
        while lo > 0 and k - lo < reach and (v[lo - 1] in _WORD_CHARS or v[lo - 1] == "<"):
            lo -= 1
        while hi < len(v) and hi - k < reach and (v[hi] in _WORD_CHARS or v[hi] == ">"):
            hi += 1
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    body = "…".join(v[lo:hi] for lo, hi in spans)
    before = "" if spans and spans[0][0] == 0 else "…"
    after = "" if spans and spans[-1][1] == len(v) else "…"
    return f"{_cut(family(v), width)}<{before}{body}{after}>"


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
