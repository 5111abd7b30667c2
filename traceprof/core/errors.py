"""The one error hierarchy of traceprof.

The CLI catches :class:`TraceprofError` once, prints its message on one line and exits 1. Anything
else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "TraceprofError",
    "TraceFormatError",
    "NotATraceError",
    "StoreError",
    "SchemaVersionError",
    "UsageError",
    "AnalysisError",
    "Interrupted",
    "missing_module",
]


class TraceprofError(Exception):
    """Base class of every error that traceprof reports to a user as a message, not a traceback.

    Attributes:
        exit_code: The CLI's exit status for it (1; 130 for :class:`Interrupted`).
    """

    exit_code = 1


class TraceFormatError(TraceprofError):
    """A trace file cannot be read.

    Args:
        path: The file, or ``""`` for an error about several files (``reason`` names each, one line
            each). An error about one file is one line: line breaks in ``where`` and ``reason``
            become spaces.
        where: The record, e.g. ``"event #18231 (ph='X', name='ncclDevKernel_...')"``, or ``""``
            when the problem is the whole file.
        reason: What is wrong and, where possible, what to do.
    """

    def __init__(self, path: str | Path, where: str, reason: str) -> None:
        self.path = str(path)
        if self.path:  # one file, one line: a library's message may span several (SQLite quotes schema text)
            where, reason = _cut(_one_line(where), WHERE_CHARS), _cut(_one_line(reason), REASON_CHARS)
        self.where = where
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        loc = "".join(f"{part}: " for part in (self.path, self.where) if part)
        return loc + self.reason

    def with_reason(self, more: str) -> TraceFormatError:
        """A copy of this error, of its class and attributes, whose reason ends with ``more``.

        A subclass may take other constructor arguments than ``(path, where, reason)`` (e.g. the
        Kineto collector's ``NonFiniteNumber(path, offset, token)``): the copy is made without
        calling the constructor, so it works for every subclass.
        """
        copy = _restore(type(self), self.args, dict(self.__dict__))
        copy.reason = self.reason + more
        copy.args = (copy._message(),)
        return copy

    def __reduce__(self) -> tuple[Any, tuple[type[TraceFormatError], tuple[Any, ...], dict[str, Any]]]:
        # Parsers run in worker processes; the error must survive the trip back. Its attributes are
        # restored without calling the constructor, whose arguments differ in subclasses.
        return (_restore, (type(self), self.args, dict(self.__dict__)))


_E = TypeVar("_E", bound=BaseException)


def _restore(cls: type[_E], args: tuple[Any, ...], state: dict[str, Any]) -> _E:
    """An exception of class ``cls`` with ``args`` and attributes ``state``, its ``__init__`` not called."""
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(state)
    return e


#: The longest ``where`` and ``reason`` of an error about one file (characters): a record named by
#: a 20 MB name from the trace is shown by its first characters.
WHERE_CHARS, REASON_CHARS = 200, 2000


def _cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters (``...`` ending the cut)."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _one_line(text: str) -> str:
    """``text`` with each line break (and the blanks around it) made one space."""
    return (
        " ".join(part.strip() for part in text.splitlines() if part.strip())
        if "\n" in text or "\r" in text
        else text
    )


class NotATraceError(TraceFormatError):
    """The file is well-formed (e.g. valid JSON) but not a trace of the source that tried it.

    Ingest skips such files, with a warning, when it finds them while scanning a directory, and
    fails on them when the user named the file.
    """


class StoreError(TraceprofError):
    """The store cannot be opened or does not hold what was asked for."""


class SchemaVersionError(StoreError):
    """The store file was written by a different schema version of traceprof."""


class UsageError(TraceprofError):
    """Options or arguments do not make sense together."""


class AnalysisError(TraceprofError):
    """An analysis cannot run on the data in the store (e.g. no GPU and no CPU activity)."""


class Interrupted(TraceprofError):
    """Ctrl-C: the message says what was stored (old or new state); the CLI exits 130."""

    exit_code = 130


#: pip's name of a module's package, where the two differ (else the module's top-level name).
_PACKAGES = {
    "yaml": "pyyaml",
    "dask": "traceprof[dask]",
    "distributed": "traceprof[dask]",
    "hta": "holistictraceanalysis",
    "torch": "torch==2.13.0",
}


def missing_module(e: ImportError) -> str:
    """The one-line message for a library that is not installed (``e.name``, e.g. ``bokeh``), or
    that is installed but does not load (a plain ImportError: a broken or mismatched install):
    which module, and the ``pip install`` that brings it."""
    name = e.name or str(e)
    pkg = _PACKAGES.get(name.split(".")[0], name.split(".")[0])
    if not isinstance(e, ModuleNotFoundError):
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        return (
            f"this command cannot load the Python module {name!r} ({why}): its installation looks broken; "
            f"pip install --force-reinstall '{pkg}' (or reinstall traceprof: pip install -e .)"
        )
    return (
        f"this command needs the Python module {name!r}, which is not installed here: "
        f"pip install '{pkg}' (or reinstall traceprof: pip install -e .)"
    )
