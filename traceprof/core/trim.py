"""Handing freed heap memory back to the system (glibc's ``malloc_trim``).

numpy's arrays of a few MB to 32 MB come from glibc's heap once its mmap threshold has risen (it
rises to the largest block freed, up to 32 MB), and glibc keeps what is freed there: after whatif's
replay graph on 8 ranks x 1 M events, 708 MiB resident of which ``malloc_trim(0)`` hands back 404.
Analyses call :func:`trim` between their large phases, so that the next phase's peak does not sit
on the last one's freed arrays. Elsewhere than on glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["trim"]


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim() -> None:
    """Hand the heap's free memory back to the system (glibc; elsewhere nothing). Costs a walk of the
    heap: milliseconds."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
