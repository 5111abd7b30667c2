"""The sandbox of ``traceprof sql``: user SQL reads the store and writes nothing, anywhere.

Layers, each enough on its own for writes (so one DuckDB quirk does not open the store or the disk):

1. **Only queries run.** Every statement of the text must be a query (``SELECT``, ``WITH``,
   ``FROM``, ``VALUES``, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``: DuckDB's ``SELECT`` type) or
   ``EXPLAIN [ANALYZE]`` of one (the explained text is parsed again and checked). ``COPY``,
   ``EXPORT``, ``ATTACH``, ``INSTALL``/``LOAD``, ``SET``/``RESET``/``PRAGMA``, ``CALL``,
   ``CHECKPOINT``, ``CREATE`` (``TEMP``, ``MACRO``, ``SECRET``), ``PREPARE``, transactions and the
   rest are refused before anything runs, as is text DuckDB cannot split into statements.
2. **A private engine with no writable place.** The store is attached read-only to a private
   in-memory DuckDB (:func:`connect`), never shared with another open of the store in this process,
   with no temporary directory (``temp_directory = ''``: DuckDB allows its temporary directory to
   SQL even with external access off, so there is none; a query that needs more than the memory
   limit fails instead of spilling), external file access off once the store's own files are open
   (a Parquet-layout store may read exactly its dataset's files), and extensions neither installed
   nor loaded.
3. **Settings locked.** ``lock_configuration`` is set last (:func:`lock`): threads (DuckDB's
   default, one per core), memory limit (DuckDB's default, 80 % of RAM), file access and the rest
   cannot be changed by a statement.

Reading other files is not allowed either (``read_csv``, ``read_text``, ``glob``, ... of any path
outside the store): ``traceprof sql`` answers questions about the store only.
"""

from __future__ import annotations

import duckdb

from traceprof.core.errors import StoreError
from traceprof.storage.layout import error_line

__all__ = ["connect", "lock", "check", "ALIAS"]

#: The name the store is attached under (its catalog: ``store.main.events``); the default catalog.
ALIAS = "store"
#: What runs, for messages.
ALLOWED = (
    "queries only: SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN [ANALYZE] <query>; "
    "no writes, no settings, no other files"
)
_QUERY = duckdb.StatementType.SELECT
_EXPLAIN = duckdb.StatementType.EXPLAIN


def connect(path: str) -> duckdb.DuckDBPyConnection:
    """A private DuckDB with the store at ``path`` attached read-only as :data:`ALIAS` and in use
    (module doc, layer 2). External access is still on: call :func:`lock` once the store's own
    files are allowed.

    Raises:
        duckdb.Error: The file cannot be attached (not a DuckDB file, locked by another process).
    """
    con = duckdb.connect(
        ":memory:",
        config={
            "temp_directory": "",
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
        },
    )
    try:
        quoted = path.replace("'", "''")
        con.execute(f"ATTACH '{quoted}' AS {ALIAS} (READ_ONLY)")
        con.execute(f"USE {ALIAS}")
    except BaseException:
        con.close()
        raise
    return con


def lock(con: duckdb.DuckDBPyConnection) -> None:
    """Turn external file access off (the store's own files stay readable) and lock every setting
    (module doc, layer 3)."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def check(con: duckdb.DuckDBPyConnection, query: str) -> int:
    """Refuse ``query`` unless every statement in it is a query (module doc, layer 1).

    Returns:
        The number of statements in ``query`` (at least 1).

    Raises:
        StoreError: One line: the text is not UTF-8, does not parse (DuckDB's first line), holds no
            statement, or holds a statement that is not a query (naming its kind and its text).
    """
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes that are not UTF-8 reach Python as lone surrogates
        raise StoreError(
            f"SQL error: the query is not UTF-8 text (a byte that is not UTF-8 at character "
            f"{e.start}); write it in UTF-8"
        ) from None
    statements = _statements(con, query)
    for kind, text in statements:
        if kind is _EXPLAIN:
            inner = _explained(text)
            if inner is not None and all(k is _QUERY for k, _ in _statements(con, inner)):
                continue
        elif kind is _QUERY:
            continue
        flat = " ".join(text.split())
        shown = flat if len(flat) <= 60 else flat[:57] + "..."
        raise StoreError(
            f"SQL error: {_own_word(kind, flat)} statement {shown!r} is refused: traceprof sql runs {ALLOWED}"
            + ("; for a profile use EXPLAIN ANALYZE <query>" if "profil" in flat.lower() else "")
        )
    return len(statements)


def _own_word(kind: duckdb.StatementType, flat: str) -> str:
    """The word a refused statement is named by: its leading keyword as written (DuckDB files
    INSTALL under LOAD, CHECKPOINT under CALL, ANALYZE under VACUUM, USE and RESET under SET, COMMENT
    under ALTER), with FORCE kept (FORCE INSTALL, FORCE CHECKPOINT); DuckDB's kind where the text
    opens with a WITH clause, a parenthesis or anything else that is not a word."""
    words = flat.upper().split(maxsplit=2)
    if not words or not words[0].isalpha() or words[0] == "WITH":
        return kind.name
    if words[0] == "FORCE" and len(words) > 1 and words[1].isalpha():
        return f"FORCE {words[1]}"
    return words[0]


def _statements(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple[duckdb.StatementType, str]]:
    """(kind, text) of each statement of ``query``."""
    try:
        statements = [(st.type, st.query) for st in con.extract_statements(query)]
    except duckdb.Error as e:
        raise StoreError(f"SQL error: {error_line(e)}") from None
    except (ValueError, TypeError):  # a statement kind this duckdb module has no name for (UPDATE EXTENSIONS)
        raise StoreError(
            f"SQL error: a statement of a kind traceprof sql does not run; it runs {ALLOWED}"
        ) from None
    if not statements:
        raise StoreError("SQL error: no statement (only comments or semicolons)")
    return statements


def _explained(text: str) -> str | None:
    """The statement an ``EXPLAIN [ANALYZE | (options)]`` explains (comments skipped), or None."""
    tokens = duckdb.tokenize(text)
    ends = [pos for pos, _ in tokens[1:]] + [len(text)]
    words = [
        (pos, text[pos:end].strip())
        for (pos, kind), end in zip(tokens, ends, strict=True)
        if kind != duckdb.token_type.comment
    ]
    if not words or words[0][1].upper() != "EXPLAIN":
        return None
    i = 1
    if i < len(words) and words[i][1].upper() in ("ANALYZE", "ANALYSE"):
        i += 1
    elif i < len(words) and words[i][1].startswith("("):  # EXPLAIN (ANALYZE, FORMAT json) <query>
        depth, j = 0, i
        while j < len(words):
            depth += words[j][1].count("(") - words[j][1].count(")")
            j += 1
            if depth <= 0:
                break
        if j < len(words):  # else the parentheses held the query itself: EXPLAIN (SELECT 1)
            i = j
    return text[words[i][0] :] if i < len(words) else None
