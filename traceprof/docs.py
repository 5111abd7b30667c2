"""The README's generated sections: the command reference (from the CLI itself) and the
communication kernel families (from ``traceprof.core.classify``).

``python -m traceprof.docs README.md`` (``make docs``) rewrites each section between its markers,
``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``; a test checks that the README is current,
as ``docs/schema.md`` and ``docs/analyses.md`` are checked against their declarations.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

from traceprof.cli import app, argument_word
from traceprof.core.classify import families_markdown

__all__ = ["commands_markdown", "SECTIONS", "render", "main"]


def _commands(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """Every command of ``group`` (a click group, as typer builds it: typer vendors click), in order;
    a sub-group with a command of its own (``runs``, ``baseline``) counts as one too."""
    for name, cmd in group.commands.items():
        path = f"{prefix} {name}"
        if hasattr(cmd, "commands"):
            if cmd.callback is not None:
                yield path, cmd
            yield from _commands(cmd, path)
        else:
            yield path, cmd


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "&#124;")


def commands_markdown() -> str:
    """The command reference: each command, what it does (its help's first sentence) and its options."""
    rows = ["| command | what it does | options |", "|---|---|---|"]
    for path, cmd in _commands(typer.main.get_command(app), "traceprof"):
        doc = (cmd.help or "").strip().split("\n\n")[0]
        args = " ".join(argument_word(p) for p in cmd.params if p.param_type_name == "argument")
        opts = ", ".join(
            f"`{o}`"
            for p in cmd.params
            if p.param_type_name == "option" and not p.hidden
            for o in p.opts[:1]
            if o != "--help"
        )
        rows.append(f"| `{path}{' ' + args if args else ''}` | {_cell(doc)} | {opts} |")
    return "\n".join(rows)


#: The generated sections, by marker name.
SECTIONS: dict[str, Callable[[], str]] = {"commands": commands_markdown, "kernel-families": families_markdown}


def render(text: str) -> str:
    """``text`` (the README) with every generated section rewritten.

    Raises:
        ValueError: A section's markers are missing.
    """
    for name, make in SECTIONS.items():
        rx = re.compile(
            rf"(<!-- generated: {re.escape(name)} [^\n]*-->\n)(.*?)(<!-- end: {re.escape(name)} -->)", re.S
        )
        m = rx.search(text)
        if m is None:
            raise ValueError(f"README: no <!-- generated: {name} ... --> ... <!-- end: {name} --> section")
        text = text[: m.start(2)] + make() + "\n" + text[m.end(2) :]
    return text


def main(argv: list[str] | None = None) -> None:
    """Rewrite the README named by the first argument (default ``README.md``) in place."""
    path = Path((argv if argv is not None else sys.argv[1:] or ["README.md"])[0])
    path.write_text(render(path.read_text()))


if __name__ == "__main__":
    main()
