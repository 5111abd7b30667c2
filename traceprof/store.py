"""The DuckDB store: open, version-check, insert parsed traces in one transaction, query.

One DuckDB file (default ``traceprof.duckdb`` in the working directory) holds any number of runs.
Tables and views are declared in :mod:`traceprof.schema`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import orjson
import polars as pl

from traceprof import schema
from traceprof.errors import SchemaVersionError, StoreError, TraceprofError
from traceprof.parsed import ParsedTrace

__all__ = ["Store", "DEFAULT_DB"]

DEFAULT_DB = "traceprof.duckdb"


def _magic(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(16)


class Store:
    """A traceprof DuckDB store.

    Args:
        path: Store file; created (with the schema) when absent unless ``read_only``.
        read_only: Open read-only, with external file access disabled (for user SQL).

    Raises:
        StoreError: The file is missing (read-only) or not a DuckDB file.
        SchemaVersionError: The file was written by another schema version.
    """

    def __init__(self, path: str | Path = DEFAULT_DB, *, read_only: bool = False) -> None:
        self.path = Path(path)
        if read_only and not self.path.exists():
            raise StoreError(f"{self.path}: no such store; create it with `traceprof ingest PATH`")
        if self.path.is_file() and _magic(self.path) == b"SQLite format 3\x00":
            raise StoreError(
                f"{self.path}: an SQLite file (an Nsight Systems export?), not a traceprof store (DuckDB)"
            )
        try:
            if read_only:
                self.con = duckdb.connect(
                    str(self.path), read_only=True, config={"enable_external_access": False}
                )
            else:
                self.con = duckdb.connect(str(self.path))
        except duckdb.Error as e:
            raise StoreError(f"{self.path}: cannot open as a DuckDB store: {e}") from None
        self._check_or_create(read_only)

    def _check_or_create(self, read_only: bool) -> None:
        have = {r[0] for r in self.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        if "meta" not in have:
            if have:
                raise StoreError(f"{self.path}: a DuckDB file, but not a traceprof store")
            if read_only:
                raise StoreError(f"{self.path}: empty store; run `traceprof ingest PATH` first")
            self.con.execute("BEGIN")
            for stmt in schema.ddl():
                self.con.execute(stmt)
            self.con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)])
            self.con.execute("COMMIT")
            return
        row = self._one("SELECT value FROM meta WHERE key = 'schema_version'")
        version = int(row[0]) if row else -1
        if version != schema.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path}: store schema version {version}, this traceprof reads version "
                f"{schema.SCHEMA_VERSION}; "
                + ("upgrade traceprof" if version > schema.SCHEMA_VERSION else "re-ingest the traces into a new store")
            )

    def _one(self, query: str, params: Sequence[Any] | None = None) -> tuple[Any, ...] | None:
        """First row of a query (the result is fully consumed), or None."""
        rows = self.con.execute(query, params or []).fetchall()
        return rows[0] if rows else None

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -------------------------------------------------------------------------------

    def sql(self, query: str, params: Sequence[Any] | None = None) -> pl.DataFrame:
        """Run a query and return a polars DataFrame.

        Raises:
            StoreError: The query fails (the message is DuckDB's).
        """
        try:
            rel = self.con.sql(query, params=list(params) if params else None)
            if rel is None:  # a statement without a result
                return pl.DataFrame()
            return pl.from_arrow(rel.to_arrow_table())  # type: ignore[return-value]
        except duckdb.Error as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StoreError(f"SQL error: {first}") from None

    def runs(self) -> pl.DataFrame:
        """One row per run: run_id, name, world_size, ranks (traced), traces, events, ingested_at."""
        return self.sql(
            """
            SELECT r.run_id, r.name, r.world_size, count(DISTINCT t.rank) AS ranks,
                   count(t.trace_id) AS traces, sum(t.events_kept)::BIGINT AS events, r.sources,
                   r.clock_aligned, r.ingested_at
            FROM runs r LEFT JOIN traces t USING (run_id)
            GROUP BY ALL ORDER BY r.run_id
            """
        )

    def resolve_run(self, run: str | int | None) -> int:
        """The run_id of run name or id ``run``; ``None`` means the only (or latest) run.

        Raises:
            StoreError: No such run, or the store is empty.
        """
        rows = self.con.execute("SELECT run_id, name FROM runs ORDER BY run_id").fetchall()
        if not rows:
            raise StoreError(f"{self.path}: no runs; ingest traces first with `traceprof ingest PATH`")
        if run is None:
            return int(rows[-1][0])
        for rid, name in rows:  # names first: a run may be named "1"
            if name == str(run):
                return int(rid)
        for rid, _ in rows:
            if str(rid) == str(run):
                return int(rid)
        names = ", ".join(n for _, n in rows)
        raise StoreError(f"no run named {run!r} in {self.path}; runs: {names}")

    def find_sha(self, sha256: str) -> tuple[str, str] | None:
        """Where a file with this SHA-256 is stored: (run name, "run 'x' (id 3), rank 0"), or None."""
        row = self._one(
            "SELECT r.name, r.run_id, t.rank FROM traces t JOIN runs r USING (run_id) WHERE t.sha256 = ? LIMIT 1",
            [sha256],
        )
        return None if row is None else (row[0], f"run {row[0]!r} (id {row[1]}), rank {row[2]}")

    def save_frames(self, run_id: int, prefix: str, frames: dict[str, pl.DataFrame]) -> list[str]:
        """Store analysis result frames as tables ``<prefix>_<frame>`` so SQL can join them.

        Each table gets a leading ``run_id`` column; rows of the same run are replaced, other runs'
        rows are kept. Returns the table names written.

        Raises:
            StoreError: DuckDB rejects the rows (e.g. the columns changed; drop the table).
        """
        written = []
        self.con.execute("BEGIN")
        try:
            for fname, frame in frames.items():
                name = f"{prefix}_{fname}"
                tbl = frame.with_columns(pl.lit(run_id, pl.Int32).alias("run_id")).select(
                    "run_id", *[c for c in frame.columns if c != "run_id"]
                ).to_arrow()
                self.con.register("_result", tbl)
                self.con.execute(f'CREATE TABLE IF NOT EXISTS "{name}" AS SELECT * FROM _result LIMIT 0')
                self.con.execute(f'DELETE FROM "{name}" WHERE run_id = ?', [run_id])
                self.con.execute(f'INSERT INTO "{name}" BY NAME SELECT * FROM _result')
                self.con.unregister("_result")
                written.append(name)
            self.con.execute("COMMIT")
        except duckdb.Error as e:
            self.con.execute("ROLLBACK")
            raise StoreError(f"cannot save {prefix} results: {e}") from None
        return written

    # -- ingest --------------------------------------------------------------------------------

    def insert_run(
        self, name: str, traces: list[ParsedTrace], after: Callable[[int], object] | None = None
    ) -> int:
        """Insert parsed traces as (part of) run ``name`` in one transaction.

        A run that exists already gains the traces; a trace whose rank and source the run already
        holds from another file is an error. On any error nothing is written. ``after(run_id)``, if
        given, runs inside the transaction once the rows are in (ingest matches collectives and
        aligns clocks there); its errors roll everything back.

        Returns:
            The run_id.

        Raises:
            StoreError: Rank conflicts, or DuckDB rejects the rows.
        """
        con = self.con
        con.execute("BEGIN")
        try:
            run_id = self._run_id(name, traces)
            for pt in traces:
                self._insert_trace(run_id, pt)
            con.execute(
                """
                UPDATE runs SET
                  world_size = (SELECT max(coalesce(world_size, rank + 1)) FROM traces WHERE run_id = ?),
                  sources = (SELECT list(DISTINCT source ORDER BY source) FROM traces WHERE run_id = ?)
                WHERE run_id = ?
                """,
                [run_id, run_id, run_id],
            )
            if after is not None:
                after(run_id)
            con.execute("COMMIT")
        except TraceprofError:
            con.execute("ROLLBACK")
            raise
        except duckdb.Error as e:
            con.execute("ROLLBACK")
            raise StoreError(f"ingest of run {name!r} failed, store unchanged: {e}") from None
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return run_id

    def _run_id(self, name: str, traces: list[ParsedTrace]) -> int:
        row = self._one("SELECT run_id FROM runs WHERE name = ?", [name])
        if row:
            run_id = int(row[0])
        else:
            run_id = int(self._one("SELECT coalesce(max(run_id), 0) + 1 FROM runs")[0])  # type: ignore[index]
            self.con.execute(
                "INSERT INTO runs VALUES (?, ?, NULL, ?, [], false)",
                [run_id, name, datetime.now(timezone.utc).replace(tzinfo=None)],
            )
        held = dict(
            self.con.execute(
                "SELECT rank || '/' || source, path FROM traces WHERE run_id = ?", [run_id]
            ).fetchall()
        )
        for pt in traces:
            key = f"{pt.rank}/{pt.source}"
            if key in held:
                raise StoreError(
                    f"{pt.path}: run {name!r} already has rank {pt.rank} ({pt.source}) from "
                    f"{held[key]}; ingest into another run with --run NAME"
                )
            held[key] = pt.path
        return run_id

    def _insert_trace(self, run_id: int, pt: ParsedTrace) -> None:
        con = self.con
        trace_id = int(self._one("SELECT coalesce(max(trace_id), 0) + 1 FROM traces")[0])  # type: ignore[index]
        t = pt.trace

        con.execute(
            f"INSERT INTO traces ({', '.join(schema.table('traces').column_names)}) "
            f"VALUES ({', '.join('?' * len(schema.table('traces').columns))})",
            [
                trace_id, run_id, pt.rank, pt.world_size, pt.source, pt.format, pt.path, pt.sha256,
                pt.bytes, t.get("host"), t.get("pid"), t.get("backend"), t.get("device_name"),
                t.get("torch_version"), t.get("base_time_ns", 0), 0, None, pt.events_read,
                pt.events_kept, sum(pt.rejected.values()), orjson.dumps(pt.rejected).decode(),
                sum(pt.skipped.values()), orjson.dumps(pt.skipped).decode(),
                sum(pt.flagged.values()), orjson.dumps(pt.flagged).decode(),
                t.get("flops_per_step"), t.get("flops_method"), t.get("meta"),
            ],
        )
        for name in ("events", "devices", "steps", "collectives"):
            tbl = getattr(pt, name)
            if tbl is None or tbl.num_rows == 0:
                continue
            cols = schema.table(name).column_names
            con.register("_incoming", tbl)
            select = ", ".join(
                "?" if c == "run_id" else "? AS trace_id" if c == "trace_id" else
                "? AS rank" if c == "rank" else f'"{c}"' if c in tbl.column_names else f'NULL AS "{c}"'
                for c in cols
            )
            params = [
                {"run_id": run_id, "trace_id": trace_id, "rank": pt.rank}[c]
                for c in cols if c in ("run_id", "trace_id", "rank")
            ]
            con.execute(f"INSERT INTO {name} SELECT {select} FROM _incoming", params)
            con.unregister("_incoming")
