"""Safe output of strings that come from traces (names, paths, args) or from user SQL.

A trace is untrusted input: its names may hold terminal escape sequences (clear the screen, set
the window title), rich markup (``[link=...]``, ``[/x]``), newlines that forge table rows, or
spreadsheet formulas. :func:`escape` makes a string inert for a terminal; :func:`text` wraps it in
a rich ``Text`` (never parsed as markup); :func:`csv_cell` neutralizes a CSV cell; :func:`json_text`
makes JSON output inert and keeps every value exact.
"""

from __future__ import annotations

import re
import shlex

from rich.text import Text

__all__ = ["escape", "text", "csv_cell", "json_text", "md_text", "command", "label", "FORMULA_PREFIXES"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Invisible characters that reorder or break lines (bidi overrides and isolates, line separators),
#: or that hide in a name, zero-width (``aten::m\u200bm`` read as ``aten::mm``): the soft hyphen, the
#: Mongolian vowel separator, zero-width space, non-joiner and joiner, the word joiner and invisible
#: operators, the deprecated format controls and the zero-width no-break space (BOM).
_INVISIBLE = (
    0xAD,
    0x180E,
    *range(0x200B, 0x2010),
    *range(0x202A, 0x202F),
    *range(0x2060, 0x2070),
    0x2028,
    0x2029,
    0xFEFF,
)
_TABLE = {
    **{c: _NAMED.get(chr(c), f"\\x{c:02x}") for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    **{c: f"\\u{c:04x}" for c in _INVISIBLE},
}
#: What JSON output writes as ``\\uXXXX`` beyond the control characters every encoder escapes: DEL,
#: C1 controls and the invisible characters (the value is the same once parsed).
_JSON_TABLE = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), *_INVISIBLE)}
#: A CSV cell starting with one of these is read as a formula by spreadsheets.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def escape(s: str) -> str:
    r"""``s`` with control characters written out: ESC as ``\x1b``, newline as ``\n``, bidi
    overrides as ``\u202e``, zero-width characters as ``\u200b``; everything else (markup brackets
    too) unchanged."""
    return s.translate(_TABLE)


def text(s: object, style: str = "") -> Text:
    """A rich Text of ``str(s)``, escaped; rich prints it literally (no markup, no emoji codes)."""
    return Text(escape(str(s)), style=style)


def csv_cell(s: str) -> str:
    """A CSV string cell that spreadsheets show as text and terminals print inertly: control
    characters escaped as in :func:`escape`, and a leading ``= + - @`` (or tab, CR) gets a ``'`` in
    front (OWASP's advice)."""
    return "'" + escape(s) if s.startswith(FORMULA_PREFIXES) else escape(s)


def json_text(s: str) -> str:
    r"""JSON text (from orjson, which escapes only what JSON requires) with DEL, C1 controls and
    bidi overrides, isolates and line separators written as ``\u202e``: parsed, every string is
    exactly as stored; printed on a terminal, none of them reorders or hides text."""
    return s.translate(_JSON_TABLE)


#: Markdown's inline syntax (backslash-escaped), HTML's and GitHub's mentions (as character references).
_MD_TABLE = {
    **{ord(c): "\\" + c for c in "\\`*_[]|~#"},
    ord("<"): "&lt;",
    ord(">"): "&gt;",
    ord("&"): "&amp;",
    ord("@"): "&#64;",
}


def md_text(s: object) -> str:
    r"""``str(s)`` inert in Markdown (a GitHub PR comment, a table cell): control characters written
    out as in :func:`escape` (a newline cannot end a table row), then the backslash, backtick, ``*``,
    ``_``, ``[``, ``]``, ``|``, ``~`` and ``#`` backslash-escaped, ``< > &`` as HTML character
    references (no tag, no comment survives) and ``@`` as ``&#64;`` (a name never mentions anyone)."""
    return escape(str(s)).translate(_MD_TABLE)


def command(*words: object) -> str:
    """A command line one can paste into a shell as it is: ``words`` joined by spaces, each
    shell-quoted (``command("traceprof", "runs", "rm", "my run; rm -rf x")`` gives
    ``traceprof runs rm 'my run; rm -rf x'``); a message suggesting a command builds it here."""
    return " ".join(shlex.quote(str(w)) for w in words)


_PLAIN = re.compile(r"[A-Za-z0-9_.,:@+=/-]+")


def label(name: object) -> str:
    """A run's (or set's) name inside prose such as ``base -> cand``: as it is when it is one plain
    word (letters, digits, ``_ . , : @ + = / -``), else quoted as messages quote names
    (``'my run; rm -rf x'``), so that no name reads as more words than it is."""
    s = str(name)
    return s if _PLAIN.fullmatch(s) else repr(s)
