"""Snapshot every analysis' JSON output on the sample runs, the shared cases and the corpus, to compare
two versions of traceprof (a refactor must leave every byte unchanged).

Usage::

    python scripts/snapshot_outputs.py OUT_DIR [--only NAME ...]     # write OUT_DIR/<run>/<analysis>.<table>.json
    python scripts/snapshot_outputs.py --compare OLD_DIR NEW_DIR       # list the files that differ; exit 1 if any
    python scripts/snapshot_outputs.py OUT_DIR --every-format [--only NAME ...]

Each input folder is ingested into its own store under OUT_DIR/.stores (through the CLI, in this process),
then for every analysis of ``traceprof analyze list`` and every table its ``--help`` lists, the output of
``traceprof analyze NAME --run RUN -f json --table TABLE`` is written with its exit code on the first line;
also ``summary -f json`` per run and three diffs of the sample runs. Only the CLI is used, so the script
works across module moves. Inputs that do not exist (no ../shared) are skipped.

``--every-format`` writes each table in every format instead (``OUT_DIR/<run>/<analysis>.<table>.<format>``:
the table in human units and in ns, JSON, CSV and ``--raw`` CSV), each command run twice in a row, both
outputs in the file: the second prints the result kept by the first (``analyze`` printing a kept view).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def inputs() -> dict[str, Path]:
    """Run name -> folder (or file) to ingest as one run."""
    out: dict[str, Path] = {}
    for d in sorted((REPO / "sample_traces").iterdir()):
        if d.is_dir():
            out[f"sample_{d.name}"] = d
    cases = SHARED / "cases"
    if cases.is_dir():
        for d in sorted(cases.iterdir()):
            if d.is_dir():
                out[f"case_{d.name}"] = d
    corpus = SHARED / "corpus"
    if corpus.is_dir():
        for d in sorted(p for p in corpus.rglob("*") if p.is_dir()):
            files = [f for f in d.iterdir() if f.is_file() and f.name != "SOURCE.md"]
            if files and not any(c.is_dir() for c in d.iterdir()):
                out["corpus_" + "_".join(d.relative_to(corpus).parts)] = d
        for f in sorted(corpus.rglob("*.sqlite")):
            out["corpus_" + f.stem] = f
    return out


def cli(args: list[str]) -> tuple[int, str]:
    from typer.testing import CliRunner

    from traceprof.cli import app

    res = CliRunner().invoke(app, args, catch_exceptions=True)
    text = res.stdout
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        text += f"\nEXCEPTION {type(res.exception).__name__}: {res.exception}"
    return res.exit_code, text


def tables(name: str) -> list[str]:
    _, text = cli(["analyze", name, "--help"])
    m = re.search(r"Tables \(--table NAME\):\s*([^\n]+)", text)
    return [t.strip() for t in m.group(1).split(",")] if m else ["frame"]


#: ``--every-format``: each table's outputs (file suffix -> options).
FORMATS = {
    "table": ["-f", "table"],
    "table_ns": ["-f", "table", "--units", "ns"],
    "json": ["-f", "json"],
    "csv": ["-f", "csv"],
    "csv_raw": ["-f", "csv", "--raw"],
}


def snapshot(out: Path, only: list[str], every_format: bool = False) -> None:
    stores = out / ".stores"
    stores.mkdir(parents=True, exist_ok=True)
    code, text = cli(["analyze", "list", "-f", "json"])
    import json

    names = [a["name"] for a in json.loads(text)]
    per = {n: tables(n) for n in names}
    for run, src in inputs().items():
        if only and run not in only:
            continue
        db = stores / f"{run}.duckdb"
        db.unlink(missing_ok=True)
        code, text = cli(["ingest", str(src), "--db", str(db), "--run", run])
        d = out / run
        d.mkdir(exist_ok=True)
        (d / "_ingest.txt").write_text(f"{code}\n")
        if code != 0:
            continue
        for n in names:
            for t in per[n]:
                base = ["analyze", n, "--db", str(db), "--run", run, "--table", t]
                if not every_format:
                    code, text = cli([*base, "-f", "json"])
                    (d / f"{n}.{t}.json").write_text(f"{code}\n{text}")
                    continue
                for form, args in FORMATS.items():
                    runs = [cli([*base, *args]) for _ in range(2)]  # computed (or kept), then printed as kept
                    (d / f"{n}.{t}.{form}").write_text("".join(f"{code}\n{text}\n" for code, text in runs))
        code, text = cli(["summary", "--db", str(db), "--run", run, "-f", "json"])
        (d / "_summary.json").write_text(f"{code}\n{text}")
        print(run, flush=True)
    if not only:
        db = stores / "samples.duckdb"
        db.unlink(missing_ok=True)
        cli(["ingest", str(REPO / "sample_traces"), "--db", str(db)])
        d = out / "_diff"
        d.mkdir(exist_ok=True)
        for base, cand in (("normal", "normal_repeat"), ("normal", "extra_matmul"), ("clean", "sleep_rank1")):
            code, text = cli(["diff", base, cand, "--db", str(db), "-f", "json"])
            (d / f"{base}__{cand}.json").write_text(f"{code}\n{text}")
    shutil.rmtree(stores)


def compare(old: Path, new: Path) -> int:
    bad = 0
    for f in sorted(old.rglob("*")):
        if f.is_file():
            g = new / f.relative_to(old)
            if not g.exists() or not filecmp.cmp(f, g, shallow=False):
                print(f"differs: {f.relative_to(old)}")
                bad += 1
    for g in sorted(new.rglob("*")):
        if g.is_file() and not (old / g.relative_to(new)).exists():
            print(f"new: {g.relative_to(new)}")
    print(f"{bad} file(s) differ")
    return 1 if bad else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("--only", nargs="*", default=[])
    p.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"))
    p.add_argument("--every-format", action="store_true", help="every format, each command twice")
    a = p.parse_args()
    if a.compare:
        sys.exit(compare(*a.compare))
    if a.out is None:
        p.error("OUT_DIR is required")
    snapshot(a.out, a.only, a.every_format)


if __name__ == "__main__":
    main()
