"""The config file: defaults for the store, ``-p`` analysis parameters and the diff gate's thresholds.

Where it is read from, the first that applies: ``--config PATH``; the ``TRACEPROF_CONFIG``
environment variable (empty: no config file); else, from the current directory up to the root, the
first directory holding ``traceprof.toml`` (its whole content) or a ``pyproject.toml`` with a
``[tool.traceprof]`` table (that table; ``traceprof.toml`` wins in the same directory).

Its keys (all optional)::

    db = "runs/traceprof.duckdb"     # the store (relative paths: from the file's directory)
    [params]                         # -p defaults
    "mfu.peak_tflops" = 312          # ANALYSIS.KEY, as -p takes it
    peak_tflops = 312                # a bare KEY: every analysis that takes it
    [params.stragglers]              # or a table per analysis
    min_cost_pct = 2
    [diff]
    threshold = 0.05                 # -t 0.05: every timing metric
    [diff.thresholds]
    flops = 0.02                     # -t flops=0.02

Precedence, highest first: the command line, environment variables (``TRACEPROF_DB``), the
config file, the built-in defaults. ``traceprof config`` prints what is in effect and where each
value came from.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceprof.core.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Config", "load", "find", "ENV", "FILE", "TOOL"]

#: The environment variable naming the config file (empty: none).
ENV = "TRACEPROF_CONFIG"
#: The config file's name; and the table of ``pyproject.toml`` that can hold the same keys.
FILE, TOOL = "traceprof.toml", "tool.traceprof"

_KEYS = {"db", "params", "diff"}
_DIFF_KEYS = {"threshold", "thresholds"}


@dataclass(frozen=True)
class Config:
    """What a config file sets.

    Attributes:
        path: The file read (None: none).
        how: How it was found: ``--config``, ``TRACEPROF_CONFIG``, ``found`` (the search upward) or
            ``""`` (no file).
        db: The store (absolute, or relative to the current directory), None: not set.
        params: ``-p`` options, ``ANALYSIS.KEY=VALUE`` or ``KEY=VALUE``, in the file's order.
        thresholds: Diff thresholds as fractions: ``*`` (every timing metric) or a metric's name.
    """

    path: Path | None = None
    how: str = ""
    db: str | None = None
    params: tuple[str, ...] = ()
    thresholds: dict[str, float] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """The file as a source (``config file traceprof.toml``), for ``traceprof config``."""
        return f"config file {self.path}" if self.path else "config file"


def find(start: Path) -> Path | None:
    """The nearest ``traceprof.toml``, or ``pyproject.toml`` with ``[tool.traceprof]``, from ``start`` up."""
    for d in (start, *start.parents):
        if (d / FILE).is_file():
            return d / FILE
        py = d / "pyproject.toml"
        if py.is_file() and _tool_table(py) is not None:
            return py
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise UsageError(f"config file {path}: cannot read it ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"config file {path}: not valid TOML ({e})") from None
    except UnicodeDecodeError as e:  # tomllib decodes the bytes as UTF-8 before parsing
        raise UsageError(f"config file {path}: not valid TOML (not UTF-8: byte {e.start})") from None


def _tool_table(py: Path) -> dict[str, Any] | None:
    try:
        tool = _read(py).get("tool", {})
    except UsageError:
        return None  # a broken pyproject.toml is not ours to judge while searching
    table = tool.get("traceprof") if isinstance(tool, dict) else None
    return table if isinstance(table, dict) else None


def load(explicit: str | Path | None = None, cwd: Path | None = None) -> Config:
    """The config in effect (module doc): ``explicit`` (``--config``), else ``TRACEPROF_CONFIG``,
    else the search from ``cwd`` (default: the current directory).

    Raises:
        UsageError: The file named does not exist (or is a folder) or is not valid TOML, or holds an unknown key or a
            value of the wrong type (the message names the file and the key).
    """
    how = "--config"
    if explicit is None:
        env = os.environ.get(ENV)
        if env is not None:
            if not env.strip():
                return Config()
            explicit, how = env, ENV
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir():
            raise UsageError(f"config file {path} ({how}): a folder, not a file")
        if not path.is_file():
            raise UsageError(f"config file {path} ({how}): no such file")
    else:
        found = find((cwd or Path.cwd()).resolve())
        if found is None:
            return Config()
        path, how = found, "found"
    if path.name == "pyproject.toml":
        table = _tool_table(path)
        if table is None:
            raise UsageError(f"config file {path}: no [{TOOL}] table")
        return _parse(path, how, table, f"[{TOOL}] ")
    return _parse(path, how, _read(path), "")


def _parse(path: Path, how: str, doc: dict[str, Any], prefix: str) -> Config:
    def bad(key: str, what: str) -> UsageError:
        return UsageError(f"config file {path}: {prefix}{key}: {what}")

    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise bad(unknown[0], f"unknown key; keys: {', '.join(sorted(_KEYS))}")
    db = doc.get("db")
    if db is not None:
        if not isinstance(db, str) or not db:
            raise bad("db", "expected a path (a string)")
        p = Path(db).expanduser()
        db = str(p if p.is_absolute() else path.parent / p)
    params: list[str] = []
    raw = doc.get("params", {})
    if not isinstance(raw, dict):
        raise bad("params", "expected a table")
    for k, v in raw.items():
        if isinstance(v, dict):  # [params.ANALYSIS]
            for kk, vv in v.items():
                params.append(f"{k}.{kk}={_value(bad, f'params.{k}.{kk}', vv)}")
        else:
            params.append(f"{k}={_value(bad, f'params.{k}', v)}")
    thresholds: dict[str, float] = {}
    diff = doc.get("diff", {})
    if not isinstance(diff, dict):
        raise bad("diff", "expected a table")
    unknown = sorted(set(diff) - _DIFF_KEYS)
    if unknown:
        raise bad(f"diff.{unknown[0]}", f"unknown key; keys: {', '.join(sorted(_DIFF_KEYS))}")
    if "threshold" in diff:
        thresholds["*"] = _fraction(bad, "diff.threshold", diff["threshold"])
    per = diff.get("thresholds", {})
    if not isinstance(per, dict):
        raise bad("diff.thresholds", "expected a table of METRIC = fraction")
    for k, v in per.items():
        thresholds[k] = _fraction(bad, f"diff.thresholds.{k}", v)
    return Config(path, how, db, tuple(params), thresholds)


def _value(bad: Any, key: str, v: object) -> str:
    """A parameter's value as ``-p`` would give it (booleans ``true``/``false``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float | str):
        return str(v)
    raise bad(key, "expected a number, a string or a boolean")


def _fraction(bad: Any, key: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise bad(key, "expected a fraction such as 0.05 (5%)")
    return float(v)
