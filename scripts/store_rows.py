"""Dump every row of every table of the stores that ``traceprof ingest`` writes, to compare two versions
of the ingest (a performance change must store the same rows).

Usage::

    python scripts/store_rows.py OUT_DIR [--only NAME ...] [--all]   # OUT_DIR/<input>.txt: each table's rows, sorted
    python scripts/store_rows.py --compare OLD_DIR NEW_DIR    # the tables that differ; exit 1 if any

Each input (the sample runs, and the Kineto folders and large files of ``../shared/corpus``) is ingested
by ``python -m traceprof.cli ingest`` in a child process of the Python running this script (so the
traceprof of that interpreter's environment is the one measured), into a fresh store. Then every base
table of the store (``duckdb_tables()``, views left out: they are computed from the tables) is written
as text, its rows sorted (row order is not part of a table), with the row count, after the ingest's exit status and messages. The columns that hold
the time of the ingest (``runs.ingested_at``) and the store's own file paths are left out.
"""

from __future__ import annotations

import argparse
import filecmp
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"
#: Columns that differ from one ingest to the next by design (table -> columns).
VOLATILE = {"runs": {"ingested_at"}, "baselines": {"added_at"}}


def inputs(every: bool = False) -> dict[str, Path]:
    """Input name -> folder or file ingested as one run; with ``every``, also each ``../shared/cases``
    folder and each ``corpus/hta`` folder."""
    out = {f"sample_{d.name}": d for d in sorted((REPO / "sample_traces").iterdir()) if d.is_dir()}
    if every:
        for root, tag in ((REPO.parent / "shared" / "cases", "case_"), (CORPUS / "hta", "hta_")):
            if root.is_dir():
                out.update({tag + d.name: d for d in sorted(root.iterdir()) if d.is_dir()})
    if CORPUS.is_dir():
        for f in sorted(CORPUS.rglob("*.json.gz")):
            if f.stat().st_size > 1 << 20:  # the large real traces, one run each
                out["corpus_" + "_".join(f.relative_to(CORPUS).with_suffix("").with_suffix("").parts)] = f
        for d in ("hta/trace_filter", "hta/nccl_parser_config", "hta/critical_path/alexnet"):
            if (CORPUS / d).is_dir():
                out["corpus_" + d.replace("/", "_")] = CORPUS / d
    return out


def dump(db: Path, out: Path, said: str) -> None:
    """Write ``said`` (the ingest's exit status and messages), then every base table of store ``db``,
    rows sorted, to ``out``."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    lines = [said]
    tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
    for t in tables:
        cols = [
            r[0]
            for r in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [t]
            ).fetchall()
            if r[0] not in VOLATILE.get(t, set())
        ]
        sel = ", ".join(f'"{c}"' for c in cols)
        rows = con.execute(f'SELECT {sel} FROM "{t}"').fetchall()
        lines.append(f"## {t} ({len(rows)} rows) {cols}")
        lines += sorted(repr(r) for r in rows)
    con.close()
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--compare", nargs=2, type=Path)
    ap.add_argument("--all", action="store_true", help="also every ../shared/cases and corpus/hta folder")
    a = ap.parse_args()
    if a.compare:
        old, new = a.compare
        names = sorted({p.name for p in old.glob("*.txt")} | {p.name for p in new.glob("*.txt")})
        bad = [
            n
            for n in names
            if not (old / n).exists() or not (new / n).exists() or not filecmp.cmp(old / n, new / n, False)
        ]
        for n in bad:
            print(f"differs: {n}")
        print(f"{len(names) - len(bad)} of {len(names)} inputs store the same rows")
        sys.exit(1 if bad else 0)
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in inputs(a.all).items():
            if a.only and name not in a.only:
                continue
            db = Path(tmp) / f"{name}.duckdb"
            res = subprocess.run(
                [sys.executable, "-m", "traceprof.cli", "ingest", str(src), "--db", str(db), "--run", name],
                capture_output=True,
                text=True,
            )
            said = f"exit {res.returncode}\n{res.stderr.replace(tmp, '<tmp>')}"
            (a.out / f"{name}.txt").write_text(said)
            if not res.returncode:
                dump(db, a.out / f"{name}.txt", said)
            print(name, "exit", res.returncode, file=sys.stderr)


if __name__ == "__main__":
    main()
