"""Exact conversion of source timestamps to integer nanoseconds (README.md "What traceprof handles": Time)."""

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


def us_text_to_ns(text: bytes) -> int:
    """Convert a JSON number's text in microseconds (``b"1010.123"``, ``b"1682725898236567"``,
    ``b"1.5e3"``) to integer nanoseconds exactly, without going through a binary float.

    Raises:
        ValueError: ``text`` is not a JSON number.
    """
    if b"." not in text and b"e" not in text and b"E" not in text:
        return int(text) * 1000
    if b"e" not in text and b"E" not in text and not text.startswith(b"-"):
        whole, frac = text.split(b".", 1)
        if len(frac) <= 3 and frac.isdigit():
            return int(whole or b"0") * 1000 + int(frac.ljust(3, b"0"))
    try:
        return us_to_ns(Decimal(text.decode()))
    except ArithmeticError:
        raise ValueError(f"not a number: {text[:40]!r}") from None
