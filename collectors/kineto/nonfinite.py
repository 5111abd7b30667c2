"""Number words: the ``NaN`` / ``Infinity`` a JSON writer puts where a float is not finite.

JSON has no value for NaN or an infinity. Writers that meet one write a word where the number goes:

  - ``NaN``, ``Infinity``, ``-Infinity``: Python's ``json`` and simplejson, Gson and Jackson with
    their non-numeric option, RapidJSON with ``kWriteNanAndInfFlag``; JSON5 adds ``+Infinity``,
    ``+NaN``, ``-NaN``.
  - ``nan``, ``-nan``, ``inf``, ``-inf``: C's ``printf``, C++ streams and {fmt} (which libkineto
    formats its values with); ``NAN``, ``-NAN``, ``INF``, ``-INF`` with their upper-case conversions
    (``%F``, ``%E``, ``%G``, ``std::uppercase``); Rust's ``Display`` writes ``NaN``, ``inf``, ``-inf``.
  - ``NaN``, ``+Inf``, ``-Inf``: Go's ``strconv`` / ``fmt``.

(serde_json, orjson, nlohmann::json and JavaScript write ``null``: nothing to repair.) With
``--skip-bad-events`` each of these (:data:`WORD`) where a value stands is read as ``null``, counted per
word as written and its first few located (:class:`NumberWords`); any other word there (``NaNx``,
MSVC's ``-nan(ind)`` and its older C runtime's ``1.#QNAN``, ``-1.#IND``, ``1.#INF``, whose digits vary
with the format) is refused, naming the word and its byte (:class:`NotANumber`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["WORD", "NumberWords", "NotANumber", "not_a_number", "word_at", "null_words"]

#: A number word (module doc) ending where a JSON value may end. Not ``\Z``: a piece of a text that
#: ends inside a word (``Inf`` of ``Infinity``) must not match; a whole document never ends in one.
WORD = re.compile(rb"[+-]?(?:NaN|nan|NAN|Infinity|inf|Inf|INF)(?=[ \t\n\r,\]}])")
#: What a word at a value's place looks like, for a refusal's message: a sign or a letter, up to the
#: next delimiter (``NaNx``, ``-nan(ind)``), or MSVC's ``1.#QNAN`` (a digit, ``.#``).
_WORDISH = re.compile(rb"[+-]?(?:[A-Za-z]|[0-9]\.#)[^ \t\n\r,\]}\"]{0,30}")
#: What makes a word a would-be number (``NaNx``, ``Infinite``, ``-nan(ind)``): any other word is
#: left to the other diagnoses (a bzip2 file's ``BZh91``, ``gzip`` in a file named ``.gz``).
_NUMBER_WORD = re.compile(rb"(?i)nan|inf|ind")
#: MSVC's ``1.#QNAN`` / ``-1.#IND`` / ``1.#INF00`` from its start: msgspec names the ``#``.
_MSVC = re.compile(rb"[+-]?[0-9]\.#")
#: A JSON string (skipped whole), a ``"`` that opens a string not closed in the text (the scan stops
#: there: what follows may be inside it), or a number word.
_SCAN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|(")|' + WORD.pattern)
#: For a word that starts with ``n``, msgspec names a byte up to 4 on from it (it read the word as
#: ``null``: the second byte when it skips a value, the fifth when it decodes one).
_NULL_READ = 4
#: The bytes a JSON value may follow.
_VALUE_AFTER = frozenset(b"[:, \t\n\r")


def word_at(data: bytes, at: int, message: str) -> int | None:
    """Where the word starts that msgspec's error ``message`` (naming byte ``at`` of ``data``) stopped
    at: a value's place (after ``[``, ``:``, ``,`` or whitespace) that holds a sign or a letter and
    reads as a would-be number (``NaN``, ``-Infinity``, ``nanx``, MSVC's ``1.#QNAN``); None for any
    other error or word (``BZh91`` of a bzip2 file). msgspec names the
    word's first byte, the letter after its sign, (a word it read as ``null`` from its ``n``) one of
    the 4 after it, or (an ``invalid number``) the ``#`` of MSVC's word."""
    if "invalid number" in message:
        for start in (at - 3, at - 2):  # with a sign, without
            m = _MSVC.match(data, start) if start > 0 else None
            if m is not None and m.end() == at + 1 and data[start - 1] in _VALUE_AFTER:
                return start
        return None
    if "invalid character" not in message:
        return None
    tries = [(at - 1, b"+-"), (at, b"")] + [(at - k, b"n") for k in range(1, _NULL_READ + 1)]
    for start, first in tries:
        if not 0 <= start < len(data) or (first and data[start] not in first):
            continue
        word = _WORDISH.match(data, start) if start == 0 or data[start - 1] in _VALUE_AFTER else None
        if word is not None and _NUMBER_WORD.search(word.group(0)):
            return start
    return None


@dataclass
class NotANumber(Exception):
    """A word where a value stands that no writer emits for a number (``NaNx``): at ``offset`` of
    the text, as written (``word``, at most 32 bytes)."""

    offset: int
    word: bytes

    def reason(self) -> str:
        shown = self.word.decode(errors="replace")
        return (
            f"{shown!r} is not a JSON value (--skip-bad-events reads as null only the words writers "
            "emit for a float that is not finite: NaN, Infinity, -Infinity, nan, inf, -inf, +Inf, NAN, INF)"
        )


def not_a_number(data: bytes, start: int, offset: int) -> NotANumber:
    """:class:`NotANumber` of the word at ``start`` of ``data`` (``offset``: ``start`` in the file's text)."""
    m = _WORDISH.match(data, start)
    return NotANumber(offset, m.group(0) if m else data[start : start + 8])


def null_words(text: bytes, start: int, end: int | None = None) -> tuple[bytes, list[tuple[int, bytes]]]:
    """``text`` with each number word in ``text[start:end]`` replaced by ``null``, and (its position
    in ``text``, the word) of each. ``start`` must be outside a string (where msgspec found a word,
    or between two events); the scan stops at a string not closed before ``end`` (a piece of a
    document), whose content is not read as values. Strings are skipped by one regex, in C; Python
    runs once per string (about 56 k per MB of Kineto JSON, 30 ms a MB), so callers give it the
    piece they decode next, not a whole large text, where they can."""
    parts, found, at = [], [], start
    for m in _SCAN.finditer(text, start, len(text) if end is None else end):
        if m.group(1):  # an unclosed string: stop
            break
        if text[m.start()] == 0x22:  # a string
            continue
        parts += [text[at : m.start()], b"null"]
        found.append((m.start(), m.group(0)))
        at = m.end()
    if not found:
        return text, found
    return b"".join([text[:start], *parts, text[at:]]), found


#: Located words kept for the warning (the first few of a text).
_FIRST = 3


@dataclass
class Where:
    """A number word read as null: its byte in the file's text, the word, its event (index in
    ``traceEvents``; None where the reader does not know it)."""

    offset: int
    word: str
    event: int | None = None

    def __str__(self) -> str:
        return (f"event #{self.event} " if self.event is not None else "") + f"at byte {self.offset}"


@dataclass
class NumberWords:
    """The number words of one text read as null: a count per word as written, the first few located."""

    counts: dict[str, int] = field(default_factory=dict)
    first: list[Where] = field(default_factory=list)

    def add(self, offset: int, word: bytes) -> Where | None:
        """Count ``word`` (at ``offset`` of the file's text); its :class:`Where` when it is one of the
        first few (the caller may fill its ``event``)."""
        w = word.decode()
        self.counts[w] = self.counts.get(w, 0) + 1
        if len(self.first) < _FIRST:
            self.first.append(Where(offset, w))
            return self.first[-1]
        return None

    def __bool__(self) -> bool:
        return bool(self.counts)

    def total(self) -> int:
        return sum(self.counts.values())

    def repaired(self) -> dict[str, int]:
        """Counts for ``traces.meta.repaired`` (the ``issues`` column): ``{"NaN read as null": 2}``."""
        return {f"{w} read as null": n for w, n in self.counts.items()}

    def warning(self, name: str) -> str:
        """``rank0.json: 3 number word(s) (not JSON) read as null: 2 NaN, 1 -inf (first: event #12 at
        byte 200175, ...)``."""
        total = self.total()
        kinds = ", ".join(f"{n} {w}" for w, n in self.counts.items())
        first = ", ".join(map(str, self.first)) + (", ..." if total > len(self.first) else "")
        return f"{name}: {total} NaN/Infinity value(s) (not JSON) read as null: {kinds} (first: {first})"
