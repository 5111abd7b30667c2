"""Calibrate traceprof's verdicts on healthy and injected runs of the sample job (issue 27).

Usage:
    python benchmarks/calibrate.py RUN_DIR ... | FOLDER_OF_RUN_DIRS      # runs already recorded
    python benchmarks/calibrate.py --record OUT --healthy 10 --injected 12   # record them first
    options: --db STORE (default: a temporary one) --no-diff --json OUT.json --alpha 0.01
             --aa-pairs N --catch-baselines K (bound the diffs: a spread subset of the pairs)

Each run is a folder written by ``scripts/record_samples.py`` (4-rank DDP of a small GPT on CPU,
gloo). What was injected is read from the exact command in its ``README.md`` (else from a folder
name such as ``healthy_03``, ``slow_r2_15ms``, ``compute_r1``, ``uniform_c288_a``):

- healthy: nothing;
- slowed: ``--slow-rank R --slow-ms MS`` (a sleep on rank R) or ``--extra-rank R`` (an extra
  matmul on rank R only: a compute straggler): the injected rank is R;
- uniform: ``--extra-cols N`` or ``--extra-matmul`` on every rank (a FLOPs regression of
  +3.3 / +10 / +17.8 / +30 % at 96 / 288 / 512 / 864 columns): no rank is a straggler.

Recording (``--record``): N healthy runs, then M injected ones cycling through sleeps of 5-30 ms on
each rank (before backward or at the step start), compute stragglers and uniform extra matmuls;
one at a time (the job pins two ranks per core: record on an otherwise idle machine, or the
arrival order follows the other load).

It ingests every run into one store and prints:

1. straggler ``problem`` rate on healthy runs (``traceprof.engine.verdict.combined_verdict``, the verdict
   of the ``stragglers`` topic that ``summary`` and the report show); target at most 1 in 20;
2. on slowed runs, the named-rank hit rate where the trace shows the slowed rank arriving last
   significantly often (``stragglers``' binomial p < ``--alpha``) — target at least 9 of 10 —
   and, beside it, on every slowed run;
3. false straggler naming on uniform runs (any rank named, or any straggler problem);
4. the communication verdict (the ``communication`` topic of ``overlap``, as ``summary`` shows it,
   from ``overlap``, ``gaps`` and ``stragglers``): its ``problem`` rate on healthy runs, and its
   statuses on the others;
5. unless ``--no-diff``, the A/A regression rate: ``traceprof diff A B`` over every ordered pair of
   healthy runs (``--aa-pairs N``: N of them, spread evenly over that list), by exit code (0 ok, 3
   regression, 4 inconclusive where the CLI has it, anything else an error); and the catch rate of
   the uniform regressions against each healthy baseline (``--catch-baselines K``: K of them, spread
   evenly) (exit 3), per number of extra columns, with how often ``aten::mm`` is named in the summary.

Everything is computed with the traceprof of the interpreter that runs this script (the ``diff``
CLI is the ``traceprof`` script beside it). Two or three minutes for 40 runs without ``--no-diff``
on a 2-core machine for the verdicts; each diff is a CLI process (a few seconds: 240 A/A pairs of
16 healthy runs take about 15 minutes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traceprof.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: Injections ``--record`` cycles through (folder name, record_samples.py options).
INJECTIONS = [
    ("slow_r2_30ms", "--slow-rank 2 --slow-ms 30"),
    ("slow_r1_15ms", "--slow-rank 1 --slow-ms 15"),
    ("slow_r3_10ms", "--slow-rank 3 --slow-ms 10"),
    ("slow_r0_20ms", "--slow-rank 0 --slow-ms 20"),
    ("slowstep_r1_20ms", "--slow-rank 1 --slow-ms 20 --slow-at step"),
    ("compute_r2", "--extra-rank 2 --extra-cols 512"),
    ("uniform_c96", "--extra-cols 96"),
    ("uniform_c288", "--extra-cols 288"),
    ("uniform_c512", "--extra-cols 512"),
    ("uniform_c864", "--extra-cols 864"),
    ("slow_r0_5ms", "--slow-rank 0 --slow-ms 5"),
    ("compute_r1", "--extra-rank 1 --extra-cols 512"),
]


@dataclass
class Run:
    """One recorded run: its folder, kind (healthy, slowed, uniform), the injected rank (slowed
    runs), how (sleep or compute) and the extra columns (uniform runs)."""

    name: str
    path: str
    kind: str
    rank: int | None = None
    how: str = ""
    cols: int = 0


def classify(folder: Path) -> Run:
    """What was injected into ``folder``: from the record_samples command in its README.md, else its name."""
    readme = folder / "README.md"
    cmd = ""
    if readme.exists():
        m = re.search(r"python scripts/record_samples\.py (.*)", readme.read_text())
        cmd = m.group(1) if m else ""
    args = shlex.split(cmd)
    opt = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
    flags = set(args)
    if not cmd:  # no README: the folder name
        n = folder.name
        if m := re.match(r"(?:slow|slowstep)_r(\d+)", n):
            opt = {"--slow-rank": m.group(1), "--slow-ms": "1"}
        elif m := re.match(r"compute_r(\d+)", n):
            opt = {"--extra-rank": m.group(1)}
        elif m := re.match(r"uniform_c(\d+)", n):
            opt = {"--extra-cols": m.group(1)}
    if "--slow-rank" in opt and float(opt.get("--slow-ms", "0")) > 0:
        return Run(folder.name, str(folder), "slowed", int(opt["--slow-rank"]), "sleep")
    if "--extra-rank" in opt:
        return Run(folder.name, str(folder), "slowed", int(opt["--extra-rank"]), "compute")
    if "--extra-cols" in opt or "--extra-matmul" in flags:
        return Run(folder.name, str(folder), "uniform", cols=int(opt.get("--extra-cols", "512")))
    return Run(folder.name, str(folder), "healthy")


def record(out: Path, healthy: int, injected: int) -> list[Path]:
    """Record ``healthy`` + ``injected`` runs into ``out`` with scripts/record_samples.py (skipping
    folders that already hold a recording)."""
    todo = [(f"healthy_{i + 1:02d}", "") for i in range(healthy)]
    for k in range(injected):
        name, opts = INJECTIONS[k % len(INJECTIONS)]
        todo.append((f"{name}_{k // len(INJECTIONS) + 1}", opts))
    done = []
    for name, opts in todo:
        folder = out / name
        if not (folder / "rank3.trace.json.gz").exists():
            print(f"recording {name} {opts}", file=sys.stderr, flush=True)
            subprocess.run(
                [
                    sys.executable,
                    str(REPO / "scripts" / "record_samples.py"),
                    str(folder),
                    *shlex.split(opts),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        done.append(folder)
    return done


def _folders(paths: list[Path]) -> list[Path]:
    """Run folders: the given ones, or the recorded runs inside a folder of runs."""
    out: list[Path] = []
    for p in paths:
        if (p / "rank0.trace.json.gz").exists():
            out.append(p)
        else:
            out += sorted(q for q in p.iterdir() if (q / "rank0.trace.json.gz").exists())
    return out


def communication(store: Store, run: str) -> tuple[str, str]:
    """The communication verdict of ``run`` (status, text) as ``summary`` gives it: the ``overlap``
    topic's hook over the results of ``overlap``, ``gaps`` and ``stragglers`` (the analyses it reads),
    or ("n/a", why) when overlap does not apply."""
    from traceprof.engine import analysis
    from traceprof.engine.analysis import FindingsInput, FrameResult
    from traceprof.engine.findings import run_analyses

    run_id = store.resolve_run(run)
    res = run_analyses(store, run_id, None, names=("overlap", "gaps", "stragglers"))
    ok = {k: v for k, v in res.items() if isinstance(v, FrameResult)}
    errors: dict[str, Exception] = {k: v for k, v in res.items() if not isinstance(v, FrameResult)}
    topic = analysis.get("overlap").findings
    assert topic is not None
    _, v = topic.build(FindingsInput(ok, errors, store, run_id, {}))
    return (v.status, v.text) if v is not None else ("n/a", str(errors.get("overlap", "no verdict")))


def verdicts(db: Path, runs: list[Run]) -> list[dict]:
    """The straggler and communication verdicts of every run (library calls: one process, results shared)."""
    import polars as pl

    from traceprof.core.errors import AnalysisError
    from traceprof.engine import analysis
    from traceprof.engine.session import Session
    from traceprof.engine.verdict import combined_verdict
    from traceprof.ingest.ingest import ingest
    from traceprof.storage.store import Store

    with Store(db) as store:
        have = set(store.sql("SELECT name FROM runs")["name"].to_list())
        for r in runs:
            if r.name not in have:
                ingest(store, [Path(r.path)], run=r.name)
    rows = []
    with Store(db, read_only=True) as store, Session(store):  # each analysis once per run
        for r in runs:
            try:
                v = combined_verdict(store, r.name)
            except AnalysisError as e:  # e.g. a pipeline run: no collective matched across ranks
                print(f"skipped {r.name}: no straggler verdict to calibrate ({e})", flush=True)
                continue
            st = analysis.get("stragglers")
            per = st.run(store, st.params(run=r.name)).frame
            p = float(per.filter(pl.col("rank") == r.rank)["p_value"][0]) if r.rank is not None else None
            comm, comm_text = communication(store, r.name)
            rows.append(
                {
                    **asdict(r),
                    "status": v.status,
                    "named": list(v.stragglers),
                    "cause": v.cause,
                    "rank_p": p,
                    "slowdown": v.slowdown,
                    "slowdown_interval": v.slowdown_interval,
                    "text": v.text,
                    "comm_status": comm,
                    "comm_text": comm_text,
                }
            )
    return rows


def _cli() -> list[str]:
    """How to run the traceprof CLI of this checkout: the script beside this interpreter (its venv)."""
    exe = Path(sys.executable).parent / "traceprof"
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from traceprof.entry import main; main()"]


def diff(db: Path, base: str, cand: str) -> dict:
    """``traceprof diff base cand -f json``: exit code and the JSON's verdict and summary."""
    p = subprocess.run(
        [*_cli(), "diff", base, cand, "--db", str(db), "-f", "json"], capture_output=True, text=True
    )
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else {}
    except json.JSONDecodeError:
        doc = {}
    return {
        "base": base,
        "cand": cand,
        "exit": p.returncode,
        "verdict": doc.get("verdict"),
        "summary": doc.get("summary") or p.stderr.strip().splitlines()[-1:] or [""],
    }


def _rate(k: int, n: int) -> str:
    return f"{k} of {n}" + (f" ({100 * k / n:.0f}%)" if n else "")


def report(rows: list[dict], alpha: float) -> dict:
    """The verdict figures (module doc, 1-4) as a dict, printed as they are computed."""
    healthy = [r for r in rows if r["kind"] == "healthy"]
    slowed = [r for r in rows if r["kind"] == "slowed"]
    uniform = [r for r in rows if r["kind"] == "uniform"]
    shown = [r for r in slowed if r["rank_p"] is not None and r["rank_p"] < alpha]
    out = {
        "healthy_problem": [sum(r["status"] == "problem" for r in healthy), len(healthy)],
        "slowed_named_where_significant": [sum(r["rank"] in r["named"] for r in shown), len(shown)],
        "slowed_named_all": [sum(r["rank"] in r["named"] for r in slowed), len(slowed)],
        "slowed_wrong_rank": [sum(bool(set(r["named"]) - {r["rank"]}) for r in slowed), len(slowed)],
        "uniform_named": [sum(bool(r["named"]) or r["status"] == "problem" for r in uniform), len(uniform)],
        "straggler_status": {
            kind: dict(sorted(Counter(r["status"] for r in rows if r["kind"] == kind).items()))
            for kind in ("healthy", "slowed", "uniform")
        },
        "healthy_comm_problem": [sum(r["comm_status"] == "problem" for r in healthy), len(healthy)],
        "comm_status": {
            kind: dict(sorted(Counter(r["comm_status"] for r in rows if r["kind"] == kind).items()))
            for kind in ("healthy", "slowed", "uniform")
        },
    }
    print(
        f"{len(rows)} runs: {len(healthy)} healthy, {len(slowed)} slowed, {len(uniform)} uniform regressions",
        flush=True,
    )
    print(f"straggler problem on healthy runs: {_rate(*out['healthy_problem'])} (target: at most 1 in 20)")
    for r in healthy:
        if r["status"] == "problem":
            print(f"    {r['name']}: {r['text'][:300]}")
    print(
        f"slowed rank named where the trace shows it last significantly often (p < {alpha:g}): "
        f"{_rate(*out['slowed_named_where_significant'])} (target: at least 9 of 10)"
    )
    print(
        f"slowed rank named, all slowed runs: {_rate(*out['slowed_named_all'])}; another rank named: "
        f"{_rate(*out['slowed_wrong_rank'])}"
    )
    for r in slowed:
        mark = "named" if r["rank"] in r["named"] else "not named"
        print(
            f"    {r['name']}: rank {r['rank']} ({r['how']}) p = {r['rank_p']:.2g}: {mark}"
            + (f" (named {r['named']})" if r["named"] and r["rank"] not in r["named"] else "")
        )
    print(
        f"straggler named or problem on uniform-regression runs: {_rate(*out['uniform_named'])} (target: 0)"
    )
    for r in uniform:
        if r["named"] or r["status"] == "problem":
            print(f"    {r['name']}: {r['text'][:300]}")
    print(f"straggler verdict statuses by kind: {out['straggler_status']}")
    print(
        f"communication problem on healthy runs: {_rate(*out['healthy_comm_problem'])}; statuses by kind: "
        f"{out['comm_status']}"
    )
    for r in healthy:
        if r["comm_status"] == "problem":
            print(f"    {r['name']}: {r['comm_text'][:300]}")
    return out


def spread(items: list, n: int | None) -> list:
    """``n`` of ``items`` spread evenly over the list (the first, then every len/n-th), or all of
    them when ``n`` is None or not less than their number."""
    if n is None or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(max(n, 0))]


def report_diffs(diffs: list[dict]) -> dict:
    """The diff gate's figures (module doc, 5) as a dict, printed as they are computed."""
    out: dict = {}
    if diffs:
        aa = [d for d in diffs if d["kind"] == "aa"]
        codes = {c: sum(d["exit"] == c for d in aa) for c in sorted({d["exit"] for d in aa})}
        out["aa_exit_codes"] = codes
        out["aa_regression"] = [codes.get(3, 0), len(aa)]
        print(
            f"diff A/A over {len(aa)} ordered pairs of healthy runs: regression (exit 3) {_rate(codes.get(3, 0), len(aa))}; "
            f"exit codes {codes} (target: at most 1 in 20 exit 3)"
        )
        inj = [d for d in diffs if d["kind"] == "injected"]
        by_cols: dict[int, list[dict]] = {}
        for d in inj:
            by_cols.setdefault(d["cols"], []).append(d)
        out["injected"] = {}
        for cols, ds in sorted(by_cols.items()):
            caught = sum(d["exit"] == 3 for d in ds)
            mm = sum(d["exit"] == 3 and "aten::mm" in json.dumps(d["summary"]) for d in ds)
            inc = sum(d["exit"] == 4 for d in ds)
            out["injected"][cols] = {
                "caught": caught,
                "aten_mm_named": mm,
                "inconclusive": inc,
                "pairs": len(ds),
            }
            print(
                f"    uniform +{cols} cols vs each healthy baseline: regression {_rate(caught, len(ds))}, aten::mm named "
                f"in {mm}, inconclusive {inc}"
            )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path, help="run folders, or folders of run folders")
    ap.add_argument("--record", type=Path, help="record runs into this folder first")
    ap.add_argument("--healthy", type=int, default=10, help="healthy runs to record (default 10)")
    ap.add_argument("--injected", type=int, default=12, help="injected runs to record (default 12)")
    ap.add_argument("--db", type=Path, help="store to ingest into (default: a temporary one)")
    ap.add_argument("--no-diff", action="store_true", help="skip the diff gate's A/A and catch rates")
    ap.add_argument("--alpha", type=float, default=0.01, help="significance of 'arrives last' (default 0.01)")
    ap.add_argument("--json", type=Path, help="write the figures and every run's verdict here")
    ap.add_argument(
        "--aa-pairs",
        type=int,
        help="diff this many ordered pairs of healthy runs, spread evenly (default: all)",
    )
    ap.add_argument(
        "--catch-baselines",
        type=int,
        help="diff each uniform run against this many healthy baselines, spread evenly (default: all)",
    )
    a = ap.parse_args(argv)
    folders = record(a.record, a.healthy, a.injected) if a.record else []
    folders += _folders(a.runs)
    if not folders:
        ap.error("no runs: give run folders or --record OUT")
    runs = [classify(f) for f in folders]
    tmp = None
    if a.db is None:
        tmp = tempfile.TemporaryDirectory(prefix="calibrate-")
        a.db = Path(tmp.name) / "calibrate.duckdb"
    try:
        rows = verdicts(a.db, runs)
        figures = report(rows, a.alpha)
        diffs = None
        if not a.no_diff:
            healthy = [r.name for r in runs if r.kind == "healthy"]
            pairs = spread(list(itertools.permutations(healthy, 2)), a.aa_pairs)
            diffs = [{**diff(a.db, x, y), "kind": "aa"} for x, y in pairs]
            diffs += [
                {**diff(a.db, h, r.name), "kind": "injected", "cols": r.cols}
                for r in runs
                if r.kind == "uniform"
                for h in spread(healthy, a.catch_baselines)
            ]
            figures.update(report_diffs(diffs))
        if a.json:
            a.json.write_text(
                json.dumps({"figures": figures, "runs": rows, "diffs": diffs}, indent=2, default=str)
            )
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
