"""Plugin discovery, one rule for the analyses and the collectors: a module registers itself when
imported, and :func:`load` imports them all."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil

__all__ = ["load"]


def load(package: str, group: str) -> None:
    """Import every module of ``package`` whose name does not start with ``_``, then every entry
    point of ``group`` (modules another installed package adds: ``[project.entry-points."<group>"]``),
    so that each registers itself."""
    pkg = importlib.import_module(package)
    for mod in pkgutil.iter_modules(pkg.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{package}.{mod.name}")
    for ep in importlib.metadata.entry_points(group=group):
        ep.load()
