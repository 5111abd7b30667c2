"""``-p`` options: one syntax for every command.

``ANALYSIS.KEY=VALUE`` names the analysis; the bare ``KEY=VALUE`` goes to the analysis the command
implies (``analyze NAME``; ``diff`` and ``history``: ``mfu``), or, where a command runs several
(``summary``, ``report``), to every one of them that takes ``KEY``. A key no analysis of the command
takes is an error listing the valid ones. Defaults from a config file
(:mod:`traceprof.core.config`) come first and the command line's options override them key by key;
a config entry for an analysis the command does not run is left out, not refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from traceprof.core.errors import UsageError
from traceprof.core.lazy import lazy

if TYPE_CHECKING:
    from traceprof.engine import analysis as registry
else:  # `analyze NAME -p K=V` with a kept result loads no analysis (nor polars)
    registry = lazy("traceprof.engine.analysis")

__all__ = ["parse", "split"]


def split(option: str) -> tuple[str | None, str, str]:
    """``ANALYSIS.KEY=VALUE`` -> (analysis, key, value); ``KEY=VALUE`` -> (None, key, value). The key's
    ``-`` become ``_``; the value is everything after the first ``=``, stripped.

    Raises:
        UsageError: No ``=``, or an empty key.
    """
    if "=" not in option:
        raise UsageError(f"-p {option!r}: expected KEY=VALUE or ANALYSIS.KEY=VALUE")
    key, value = option.split("=", 1)
    name, _, k = key.strip().rpartition(".")
    if not k:
        raise UsageError(f"-p {option!r}: expected KEY=VALUE or ANALYSIS.KEY=VALUE")
    return name or None, k.replace("-", "_"), value.strip()


def _takes(names: Sequence[str]) -> dict[str, list[str]]:
    """Each parameter name -> the analyses of ``names`` that take it (``run`` aside)."""
    out: dict[str, list[str]] = {}
    for n in names:
        for k in registry.param_types(registry.get(n).params):
            if k != "run":
                out.setdefault(k, []).append(n)
    return out


def parse(
    options: Iterable[str],
    scope: Sequence[str],
    implied: str | None = None,
    defaults: Iterable[str] = (),
) -> dict[str, dict[str, str]]:
    """``-p`` options as {analysis: {key: value}} for a command that runs the analyses ``scope``.

    Args:
        options: ``-p`` values as typed (``mfu.peak_tflops=989``, ``peak_tflops=989``).
        scope: The analyses the command runs (``analyze NAME``: ``[NAME]``).
        implied: Where a bare ``KEY=VALUE`` goes (``analyze NAME``: NAME); None: to every analysis
            of ``scope`` that takes ``KEY``.
        defaults: Options of the same form from a config file, overridden key by key by
            ``options``; those naming an analysis outside ``scope`` are left out, a bare key goes
            to the analyses of ``scope`` that take it (none: left out).

    Returns:
        Analysis -> key -> value string (converted by the analysis' ``Params`` later).

    A key given twice on the command line with two values is refused (:func:`_once`); an
    ``ANALYSIS.KEY`` refines a bare ``KEY`` whatever their order (``-p min_ns=5 -p idle.min_ns=7``:
    7 for idle, 5 for the others).

    Raises:
        UsageError: An option names an analysis the command does not run, a bare key that no
            analysis of the command takes (the message lists the valid ``ANALYSIS.KEY``), or a key
            given twice with two values.
    """
    out: dict[str, dict[str, str]] = {}
    takes: dict[str, list[str]] | None = None
    for strict, given in ((False, defaults), (True, _once(options, implied))):
        for option in given:
            name, key, value = split(option)
            if name is not None:
                if name not in scope:
                    if not strict:
                        continue
                    raise UsageError(
                        f"-p {option!r}: this command runs no analysis {name!r}; "
                        f"it runs {', '.join(scope)} (or give KEY=VALUE)"
                    )
                targets = [name]
            elif implied is not None and strict:
                targets = [implied]
            else:
                takes = _takes(scope) if takes is None else takes
                targets = takes.get(key, [])
                if not targets:
                    if not strict:
                        continue
                    valid = ", ".join(sorted(f"{a}.{k}" for k, names in takes.items() for a in names))
                    raise UsageError(
                        f"-p {option!r}: no analysis of this command takes {key!r}; valid: {valid}"
                    )
            for t in targets:
                out.setdefault(t, {})[key] = value
    return out


def _once(options: Iterable[str], implied: str | None) -> list[str]:
    """``options`` with the bare ``KEY=VALUE`` first (an ``ANALYSIS.KEY`` then refines them),
    refusing a key written twice with two values (where a bare key goes to ``implied``, its
    ``implied.KEY`` is the same key). The same value twice is the same option.

    Raises:
        UsageError: Naming the key and both options as typed.
    """
    options = list(options)
    seen: dict[tuple[str | None, str], tuple[str, str]] = {}
    for option in options:
        name, key, value = split(option)
        where = (name or implied, key)
        if where in seen and seen[where][1] != value:
            shown = key if name is None else f"{name}.{key}"  # as the second one writes it
            raise UsageError(f"-p {shown} given twice, as {seen[where][0]!r} and {option!r}: give it once")
        seen.setdefault(where, (option, value))
    return sorted(options, key=lambda o: split(o)[0] is not None)


def check(options: Iterable[str], scope: Sequence[str]) -> None:
    """Check options of the :func:`parse` form that will be given as its ``defaults`` (a config
    file's ``[params]``), strictly: each must name an analysis of ``scope`` and a parameter it
    takes (a bare key: one that some analysis of ``scope`` takes, :func:`_takes`), with a value
    its ``Params`` accepts (:func:`traceprof.engine.analysis.make_params`).

    Raises:
        UsageError: The first option no command could use, its message starting with the key as
            written (``mfu.peak_tflops: ...``).
    """
    takes: dict[str, list[str]] | None = None
    for option in options:
        written = option.split("=", 1)[0].strip()
        try:
            name, key, value = split(option)
            if name is None:
                takes = _takes(scope) if takes is None else takes
                targets = takes.get(key, [])
                if not targets:
                    raise UsageError(f"no analysis takes {key!r}")
            else:
                targets = [name]
            for t in targets:
                registry.make_params(registry.get(t), None, {key: value})
        except UsageError as e:
            raise UsageError(f"{written}: {e}") from None
