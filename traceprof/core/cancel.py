"""Cooperative cancellation of work on helper threads (the report's analyses, ``traceprof.engine.findings``).

Ctrl-C raises KeyboardInterrupt in the main thread only. A thread running an analysis learns of it
here: inside :func:`scope` the main thread sets the scope's event on Ctrl-C, and every
:func:`checkpoint` after that (each store query, each level of a what-if replay or graph build)
raises KeyboardInterrupt in the thread that reaches it. Outside a scope :func:`checkpoint` does
nothing, so single-threaded callers pay one context-variable read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["scope", "checkpoint"]

_EVENT: ContextVar[threading.Event | None] = ContextVar("traceprof_cancel", default=None)


@contextmanager
def scope() -> Iterator[threading.Event]:
    """A fresh cancellation event for the block; threads started with a copy of this context
    (``contextvars.copy_context``) see it. Set it to stop them at their next :func:`checkpoint`."""
    event = threading.Event()
    token = _EVENT.set(event)
    try:
        yield event
    finally:
        _EVENT.reset(token)


def checkpoint() -> None:
    """Raise KeyboardInterrupt when the current scope was cancelled (see the module doc).

    Raises:
        KeyboardInterrupt: The scope's event is set.
    """
    event = _EVENT.get()
    if event is not None and event.is_set():
        raise KeyboardInterrupt
