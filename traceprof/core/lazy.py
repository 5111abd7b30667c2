"""Modules imported on first use, so that a command imports only the libraries it runs.

polars, numpy and pyarrow take about 0.6 s of CPU to import together (0.3, 0.15 and 0.2 s on this
project's 2-core machines): more than ``traceprof runs`` needs to run. A module of traceprof that
uses one of them only inside functions names it at the top as::

    if TYPE_CHECKING:
        import pyarrow as pa
    else:
        pa = lazy("pyarrow")

and ``pa.int64()`` imports pyarrow on its first call. The stand-in is not put in ``sys.modules``
(libraries that look there for numpy or pandas see the truth), and each attribute it hands out is
kept on it, so that a hot loop pays the look-up once.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["lazy"]


class _LazyModule:
    """Stands in for module ``name`` until an attribute is read (see :func:`lazy`)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:  # only for attributes not yet kept on self
        if attr.startswith("__"):  # copy/pickle probes: not the module's
            raise AttributeError(attr)
        value = getattr(self._module(), attr)
        setattr(self, attr, value)
        return value

    def _module(self) -> ModuleType:
        return importlib.import_module(self._name)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy(name: str) -> Any:
    """A stand-in for module ``name`` (``"pyarrow.compute"``) that imports it when an attribute is
    first read, and is that module's attribute from then on.

    Raises:
        ModuleNotFoundError: On first use, when ``name`` is not installed.
    """
    return _LazyModule(name)
