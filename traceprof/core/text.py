"""Lists in messages: the first few items of a list, then what was left out.

One rule for the idiom a message uses to name a long list (files, events, ranks, groups) without
printing it whole: :func:`first_few` shows the first ``n`` items (3 by default) and, when there are
more, either ``, ...`` (:data:`ELLIPSIS`) or how many more (:data:`COUNTED`, `` and 4 more``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = ["first_few", "short_list", "ELLIPSIS", "COUNTED"]

#: What follows the items shown when some are left out, uncounted: ``a, b, c, ...``.
ELLIPSIS = ", ..."
#: ... counted (``{}``: how many were left out): ``a, b, c and 4 more``.
COUNTED = " and {} more"


class Sliceable(Protocol):
    """A list, a tuple, a numpy array: anything with ``len`` whose slice is iterable."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: slice, /) -> Iterable[Any]: ...


def first_few(
    items: Sliceable,
    n: int = 3,
    sep: str = ", ",
    more: str = ELLIPSIS,
    shown: Callable[[Any], str] = str,
) -> str:
    """The first ``n`` of ``items`` as ``shown`` writes each, joined by ``sep``, then ``more``
    (``{}`` in it: how many were left out; ``{total}``: how many there are) when there are more
    than ``n``: ``"a, b, c, ..."``,
    ``"a, b, c and 4 more"``. Only the first ``n`` are formatted (a list of a million rows costs
    no more than three): ``items`` is anything with ``len`` and slicing (a list, a numpy array).

    Returns:
        The text; ``""`` for no items.
    """
    head = sep.join(shown(x) for x in items[:n])
    return head + more.format(len(items) - n, total=len(items)) if len(items) > n else head


def short_list(items: Sliceable, most: int = 8, n: int = 6) -> str:
    """Up to ``most`` items whole (``0, 1, 2``), else the first ``n`` and the count of all:
    ``0, 2, 4, 6, 8, 10, ... (32)`` (ranks of a stage, of a verdict)."""
    return first_few(items, most if len(items) <= most else n, more=", ... ({total})")
