"""Exact conversion of source timestamps to integer nanoseconds (DESIGN.md §2 "Time")."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

__all__ = ["us_to_ns"]

_ONE = Decimal(1)


def us_to_ns(us: Decimal | int) -> int:
    """Convert microseconds, as written in the source, to integer nanoseconds exactly.

    Args:
        us: Microseconds as a ``Decimal`` parsed from the JSON text (so ``12.345`` is exactly
            12345 ns, never a binary float) or an ``int``.

    Returns:
        Nanoseconds, rounded half-to-even when the source has more than 3 decimals.
    """
    if isinstance(us, int):
        return us * 1000
    return int((us * 1000).quantize(_ONE, rounding=ROUND_HALF_EVEN))
