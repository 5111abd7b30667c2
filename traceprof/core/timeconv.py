"""Exact conversion of source timestamps to integer nanoseconds (README.md "What traceprof handles": Time)."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, localcontext

__all__ = ["us_to_ns", "TimeOutOfRange"]

_ONE = Decimal(1)
#: Largest decimal exponent converted exactly (int64 ns needs 10^19; anything past that is
#: reported beyond int64 by the caller, with its exact value).
_MAX_EXPONENT = 60


class TimeOutOfRange(ValueError):
    """A time whose nanoseconds are beyond int64: ``beyond int64 (1e300 us)``; the caller puts the
    field's name in front (``'ts' beyond int64 (1e300 us)``, the README's words for every such value)."""


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
        try:
            return int(text) * 1000
        except ValueError:
            raise ValueError(f"not a number: {_shown(text)!r}") from None
    if b"e" not in text and b"E" not in text and not text.startswith(b"-"):
        whole, frac = text.split(b".", 1)
        if len(frac) <= 3 and frac.isdigit():
            return int(whole or b"0") * 1000 + int(frac.ljust(3, b"0"))
    try:
        us = Decimal(text.decode())
    except (ArithmeticError, UnicodeDecodeError):
        raise ValueError(f"not a number: {_shown(text)!r}") from None
    if not us.is_finite() or us.adjusted() > _MAX_EXPONENT:  # a tiny value rounds to 0 ns
        raise TimeOutOfRange(f"beyond int64 ({_shown(text)} us)") from None
    with localcontext() as ctx:  # exact for every value with an exponent up to _MAX_EXPONENT
        ctx.prec = _MAX_EXPONENT + 64
        return us_to_ns(us)


def _shown(text: bytes) -> str:
    """The start of a time's text, for a message."""
    return text[:40].decode(errors="replace")
