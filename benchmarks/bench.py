"""traceprof ingest vs HTA 0.5.0 load vs a bare JSON parse, and the analyses, timed in one run.

Usage: python benchmarks/bench.py [--quick] [--out benchmarks/out] [--no-hta] [--only SET ...] [--huge]
                                  [--scale]

``make bench`` runs it. Every measured command runs in a child process started by a fresh
measuring process (``--measure``), which reports:

- wall: seconds from start to exit;
- cpu: user + system seconds of the command and every process it waited for
  (``resource.getrusage(RUSAGE_CHILDREN)``);
- rss_max: the largest resident set of any one of those processes (``ru_maxrss``, MB);
- rss_sum: the peak of the summed resident sets of the command's process tree, sampled every
  20 ms (MB; parallel workers count together, and pages they share with their parent count once
  in each);
- pss_sum: the same for the proportional set sizes (``/proc/PID/smaps_rollup``: a page shared by
  k processes counts 1/k in each), the memory the tree really holds (MB).

Sets of the same files for the three tools: corpus traces (``../shared/corpus/hta/...``) and
generated ones (``benchmarks/gen_trace.py``): 1 rank x 2 M events with 100,000 steps (plain
JSON), 8 ranks x 1 M events (gzip), 32 ranks x 125 k events (gzip). ``--quick`` divides the
generated sizes by 10 (development). The tools: ``traceprof ingest`` into a fresh store (default
parallelism), HTA's ``TraceAnalysis(trace_dir=...)`` (its default loader), and the bare parse: each
file read (gzip inflated in memory) and decoded by the fastest generic JSON decoder installed
(orjson or msgspec, chosen by timing both on the first generated file), one file after another.

For each set the ingest's peak summed RSS, summed PSS and largest single process are also given as
multiples of the largest uncompressed rank file, and the peak above the start-up floor (the peak of
an ingest of a trace with no events: libraries and store; matching of one rank needs no polars) as one (target: under 1.5x). The
corpus sets are measured ``--repeat`` times (default 3), the tools interleaved, medians kept. Every
child runs with bytecode written and read, as an installed package has it. The 8-rank set is ingested a second time with
``--layout parquet`` (the Parquet dataset layout). ``--huge`` adds one ~5 GB rank file (18 M events,
not gzip; about 5 GB of disk; traceprof only) to check that it ingests in bounded memory.

Then every analysis, ``report`` (which reads the results the analyses kept beside the store) and
``report --no-cache`` (every analysis computed again) on the 1-rank 100,000-step store and on the 8-rank store
(there also how many stay under issue 34's 1 GiB and whether the report computing every analysis
takes under 15 s),
and ``analyze overlap`` on 1,000 / 10,000 / 100,000-step traces of 20 events per step (the
curve: time and memory should grow linearly). Generated files live in ``--out`` (gitignored) and
are reused; results are printed and written to ``OUT/bench.json``.

Also, first (sets ``startup`` and ``inprocess`` of ``--only``):

- start-up: ``traceprof --version``, ``runs``, ``analyze temporal`` and ``analyze gaps -f csv``
  (their results kept beside the store by an earlier command: printed as kept, without polars) and
  ``analyze overlap --no-cache`` on a 4-rank sample store, the median of 10 runs each (5 with
  ``--quick``), with bytecode written as an installed package has it (``PYTHONDONTWRITEBYTECODE``
  dropped for these children), beside the import of the libraries those commands cannot do without
  (the floor: DuckDB, typer, rich, orjson; and with polars, numpy and pyarrow, what a computing
  ``analyze`` adds);
- in-process: ``traceprof.open(db).analyze(X)`` in a fresh session (``cache=False``) against HTA
  0.5.0's call on its loaded ``TraceAnalysis`` for overlap, temporal, idle and kernels on
  ``hta/df_index_resolver`` (median of 5 each, interleaved; wall and process CPU time).

``--scale`` adds ``benchmarks/scale.py`` (64 / 256 / 1,024 generated ranks, with the Dask ingest;
16 / 32 / 64 with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CORPUS = Path(os.environ.get("TRACEPROF_CORPUS", REPO.parent / "shared" / "corpus"))
CORPUS_SETS = [
    "hta/trace_filter",
    "hta/nccl_parser_config",
    "hta/negative_queue_length_values_check",
    "hta/df_index_resolver",
    "hta/trace_diff/control",
]
# name: (ranks, events per rank, steps, gzip)
GENERATED = {
    "gen_1x2M_100k": (1, 2_000_000, 100_000, False),
    "gen_8x1M": (8, 1_000_000, 1_000, True),
    "gen_32x125k": (32, 125_000, 250, True),
}
HUGE = {"gen_1x18M_huge": (1, 18_000_000, 100_000, False)}  # about 5 GB: --huge only
CURVE = [1_000, 10_000, 100_000]  # steps, 20 events each
ANALYSES = [
    "temporal",
    "overlap",
    "gaps",
    "idle",
    "kernels",
    "launch",
    "mfu",
    "stragglers",
    "whatif",
    "critical_path",
    "parallelism",
    "desync",
    "kernel_sum",
    "nccl_sum",
    "nvtx_sum",
]
#: Issue 34's targets on the 8 x 1 M store: every analysis and ``report`` under this peak RSS (MiB,
#: the largest process), and ``report`` under this many seconds (wall, computing every analysis).
TARGET_RSS_MIB, TARGET_REPORT_S = 1024, 15.0
# the synthetic traces record no shapes: declare the FLOPs so that mfu computes (1 PFLOP per step)
PARAMS = {"mfu": ["-p", "model_flops_per_step=1e15"]}
PY = sys.executable
#: The children's environment: bytecode written and read as an installed package has it (a
#: ``PYTHONDONTWRITEBYTECODE`` inherited from a development shell made every command compile
#: traceprof's modules again: 0.27 s of CPU in each ingest, which no installed copy pays).
INSTALLED = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
#: The smallest Kineto trace (one rank, no events): its ingest's peak RSS is the start-up floor,
#: everything an ingest holds whatever the file (libraries, the DuckDB store; not polars, which matching
#: and clock alignment no longer import for one rank).
EMPTY_TRACE = (
    b'{"distributedInfo": {"rank": 0, "world_size": 1}, "baseTimeNanoseconds": 0, "traceEvents": []}'
)


# --- the measuring child --------------------------------------------------------------------


def _tree_rss(pid: int) -> tuple[int, int]:
    """Summed RSS and summed PSS (bytes) of ``pid`` and its descendants, from /proc; 0 once it is
    gone. PSS counts a page shared by k processes (forked workers share their parent's libraries
    and heap) as 1/k in each, so the sum is the memory the tree really holds; RSS counts it k times."""
    rss, pss, todo = 0, 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                rss += int(f.read().split()[1]) * page
            with open(f"/proc/{p}/smaps_rollup") as f:
                pss += next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError, StopIteration):
            continue
    return rss, pss


def _measure(timeout: float, cmd: list[str]) -> None:
    """Run ``cmd``; print one JSON line with wall, cpu (s), rss_max and rss_sum (MB), rc (124: it ran
    past ``timeout`` seconds and its process group was killed)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    peak = [0, 0]

    def sample() -> None:
        while proc.poll() is None:
            rss, pss = _tree_rss(proc.pid)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        proc.returncode, err = 124, f"timed out after {timeout:g} s".encode()
    wall = time.perf_counter() - t0
    th.join()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "wall": wall,
                "cpu": ru.ru_utime + ru.ru_stime,
                "rss_max": ru.ru_maxrss / 1024,
                "rss_sum": peak[0] / 2**20,
                "pss_sum": peak[1] / 2**20,
                "rc": proc.returncode,
                "err": err.decode(errors="replace")[-400:] if proc.returncode else "",
            }
        )
    )


def measure(cmd: list[str], timeout: float = 1800, env: dict[str, str] | None = None) -> dict:
    """Measure ``cmd`` in a fresh measuring process (so the rusage is this command's alone)."""
    out = subprocess.run(
        [PY, __file__, "--measure", str(timeout), "--", *cmd],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if r["rc"]:
        print(f"  ! {' '.join(cmd)[:120]}: exit {r['rc']}: {r['err'].strip()[-300:]}", file=sys.stderr)
    return r


# --- the bare parse -------------------------------------------------------------------------


def _read(path: Path) -> bytes:
    import gzip

    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def _decoder(name: str):
    if name == "orjson":
        import orjson

        return orjson.loads
    import msgspec

    return msgspec.json.Decoder().decode


def _bare_parse(parser: str, files: list[str]) -> None:
    decode = _decoder(parser)
    for f in files:
        doc = decode(_read(Path(f)))
        assert len(doc["traceEvents"]) >= 0  # noqa: S101 (touch the result)
        del doc


def fastest_parser(sample: Path) -> str:
    """orjson or msgspec (untyped), whichever decodes ``sample`` faster (best of 2 each)."""
    data, best = _read(sample), {}
    for name in ("orjson", "msgspec"):
        try:
            dec = _decoder(name)
        except ImportError:
            continue
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            dec(data)
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    return min(best, key=best.get)


# --- sets, tools, analyses ------------------------------------------------------------------


def trace_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.name.endswith((".json", ".json.gz")))


def generated(out: Path, name: str, ranks: int, events: int, steps: int, gz: bool) -> Path:
    folder = out / name
    stamp = folder / ".done"
    if not stamp.exists():
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(
            [
                PY,
                str(HERE / "gen_trace.py"),
                str(folder),
                "--ranks",
                str(ranks),
                "--events",
                str(events),
                "--steps",
                str(steps),
                *(["--gzip"] if gz else []),
            ],
            check=True,
        )
        stamp.write_text("")
    return folder


def traceprof(*args: str) -> list[str]:
    return [PY, "-m", "traceprof.cli", *args]


def largest_uncompressed(files: list[Path]) -> int:
    """Bytes of the largest rank file once inflated (gzip files are inflated in 16 MiB pieces to count)."""
    sizes = []
    for p in files:
        if p.suffix == ".gz":
            import gzip

            with gzip.open(p, "rb") as f:
                sizes.append(sum(len(b) for b in iter(lambda f=f: f.read(1 << 24), b"")))
        else:
            sizes.append(p.stat().st_size)
    return max(sizes, default=0)


def parquet_db(db: Path) -> Path:
    """The store the Parquet-layout ingest of ``db``'s set writes (its dataset: ``<that>.parquet``)."""
    return db.with_suffix(".pq.duckdb")


def tools(
    folder: Path, db: Path, parser: str, hta: bool, parquet: bool = False, only_traceprof: bool = False
) -> dict[str, list[str]]:
    files = [str(p) for p in trace_files(folder)]
    cmds = {"traceprof": traceprof("ingest", str(folder), "--db", str(db), "--run", "bench")}
    if parquet:
        cmds["traceprof_parquet"] = traceprof(
            "ingest", str(folder), "--db", str(parquet_db(db)), "--run", "bench", "--layout", "parquet"
        )
    if only_traceprof:
        return cmds
    if hta:
        cmds["hta"] = [
            PY,
            "-c",
            "import logging, sys; logging.disable(logging.WARNING); "
            "from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])",
            str(folder),
        ]
    cmds["bare"] = [PY, __file__, "--bare-parse", parser, "--", *files]
    return cmds


def drop_store(db: Path) -> None:
    """Delete a store and the analysis results kept beside it (``DB.results``)."""
    db.unlink(missing_ok=True)
    shutil.rmtree(db.with_name(db.name + ".results"), ignore_errors=True)


def analyses(db: Path, names: list[str], html: Path) -> dict[str, dict]:
    res = {}
    for a in names:
        res[a] = measure(traceprof("analyze", a, "--db", str(db), "-f", "csv", *PARAMS.get(a, [])))
    report = ("report", "--db", str(db), "-o", str(html), "-p", "mfu.model_flops_per_step=1e15")
    res["report"] = measure(traceprof(*report))  # reads the results the analyses kept (STORE.results/)
    res["report_cold"] = measure(traceprof(*report, "--no-cache"))  # computes every analysis itself
    return res


# --- start-up and in-process analyses ----------------------------------------------------------

#: Commands timed for start-up (``DB`` is the sample store).
STARTUP = {
    "--version": ["--version"],
    "runs": ["runs", "--db", "DB"],
    "analyze temporal (kept)": ["analyze", "temporal", "--db", "DB"],
    "analyze gaps -f csv (kept)": ["analyze", "gaps", "--db", "DB", "-f", "csv"],
    "analyze overlap --no-cache": ["analyze", "overlap", "--db", "DB", "--no-cache"],
}
#: What ``runs`` and ``analyze`` printing a kept result cannot do without: the start-up floor (typer
#: without pydantic: ``traceprof.cli`` converts option values itself); an ``analyze`` that computes
#: adds polars, numpy and pyarrow (FLOOR_ANALYZE).
FLOOR = "import duckdb, typer, rich.console, rich.table, orjson"
FLOOR_ANALYZE = FLOOR + ", numpy, pyarrow, polars"
#: HTA 0.5.0's in-memory calls, by traceprof analysis.
HTA_CALLS = {
    "overlap": "ta.get_comm_comp_overlap(visualize=False)",
    "temporal": "ta.get_temporal_breakdown(visualize=False)",
    "idle": "ta.get_idle_time_breakdown(ranks=ta.t.get_ranks(), visualize=False)",
    "kernels": "ta.get_gpu_kernel_breakdown(visualize=False)",
}


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def startup(out: Path, n: int) -> dict:
    """Median wall and CPU (s) of ``n`` runs of each :data:`STARTUP` command and of the floors."""
    db = out / "startup.duckdb"
    drop_store(db)
    subprocess.run(
        traceprof("ingest", str(REPO / "sample_traces" / "normal"), "--db", str(db)),
        check=True,
        capture_output=True,
    )
    env = INSTALLED
    cmds = {k: traceprof(*(str(db) if x == "DB" else x for x in c)) for k, c in STARTUP.items()}
    cmds["floor: runs' libraries"] = [PY, "-c", FLOOR]
    cmds["floor: + polars, numpy, pyarrow"] = [PY, "-c", FLOOR_ANALYZE]
    cmds["python -c pass"] = [PY, "-c", "pass"]
    runs: dict[str, list[dict]] = {k: [] for k in cmds}
    for i in range(n + 1):  # interleaved; the first round writes bytecode and the kept result
        for k, c in cmds.items():
            r = measure(c, env=env)
            if i:
                runs[k].append(r)
    res = {
        k: {
            "wall": _median([r["wall"] for r in v]),
            "cpu": _median([r["cpu"] for r in v]),
            "rss_max": _median([r["rss_max"] for r in v]),
        }
        for k, v in runs.items()
    }
    res["load"] = os.getloadavg()[0]
    drop_store(db)
    return res


def ingest_floor(out: Path, n: int) -> dict:
    """Median figures of ``n`` ingests of :data:`EMPTY_TRACE` into a fresh store."""
    trace, db = out / "empty" / "rank0.json", out / "empty.duckdb"
    trace.parent.mkdir(exist_ok=True)
    trace.write_bytes(EMPTY_TRACE)
    runs = []
    for _ in range(n):
        drop_store(db)
        runs.append(measure(traceprof("ingest", str(trace), "--db", str(db)), env=INSTALLED))
    drop_store(db)
    return _median_run(runs)


def in_process(folder: Path, db: Path, n: int) -> dict:
    """traceprof's analyses in a fresh session vs HTA's calls on its loaded trace, in one child
    process (``--in-process``): median seconds of ``n`` interleaved runs each."""
    drop_store(db)
    subprocess.run(
        traceprof("ingest", str(folder), "--db", str(db), "--run", "r"), check=True, capture_output=True
    )
    out = subprocess.run(
        [PY, __file__, "--in-process", str(n), "--", str(folder), str(db)],
        capture_output=True,
        text=True,
        check=True,
    )
    drop_store(db)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _in_process(n: int, folder: str, db: str) -> None:
    import logging

    import traceprof as tp

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=folder)
    res: dict = {"hta_load": time.perf_counter() - t0}
    for name, call in HTA_CALLS.items():
        hta, ours, hta_cpu, ours_cpu = [], [], [], []
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.process_time()
            eval(call, {"ta": ta})  # noqa: S307 - our own constant
            hta.append(time.perf_counter() - t0)
            hta_cpu.append(time.process_time() - c0)
            with tp.open(db, cache=False) as s:  # nothing computed yet in this session
                t0, c0 = time.perf_counter(), time.process_time()
                s.analyze(name, "r")
                ours.append(time.perf_counter() - t0)
                ours_cpu.append(time.process_time() - c0)  # every thread of the process (DuckDB's)
        res[name] = {
            "hta": _median(hta),
            "traceprof": _median(ours),
            "hta_cpu": _median(hta_cpu),
            "traceprof_cpu": _median(ours_cpu),
        }
    res["load"] = os.getloadavg()[0]
    print(json.dumps(res))


# --- printing -------------------------------------------------------------------------------


def _median_run(runs: list[dict]) -> dict:
    """The median of each figure of several measurements of one command (the worst exit status)."""
    out = {k: _median([r[k] for r in runs]) for k in ("wall", "cpu", "rss_max", "rss_sum", "pss_sum")}
    worst = max(runs, key=lambda r: r["rc"] != 0)
    return {**out, "rc": worst["rc"], "err": worst["err"], "n": len(runs)}


def _row(label: str, r: dict) -> str:
    s = f"  {label:<22} {r['wall']:8.2f} {r['cpu']:8.2f} {r['rss_max']:8.0f} {r['rss_sum']:8.0f} {r['pss_sum']:8.0f}"
    return s + ("   TIMED OUT (a lower bound)" if r["rc"] == 124 else "   FAILED" if r["rc"] else "")


HEAD = f"  {'':<22} {'wall s':>8} {'cpu s':>8} {'rss MB':>8} {'sum MB':>8} {'pss MB':>8}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--quick", action="store_true", help="generated sizes / 10")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument(
        "--hta-timeout", type=float, default=300, help="seconds; HTA is stopped after (default 300)"
    )
    ap.add_argument("--only", nargs="*", help="sets to run (corpus paths or generated names)")
    ap.add_argument("--skip-analyses", action="store_true")
    ap.add_argument("--huge", action="store_true", help="add a ~5 GB rank file (traceprof ingest only)")
    ap.add_argument("--scale", action="store_true", help="add benchmarks/scale.py (many ranks, Dask)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="interleaved rounds of each corpus set, median kept (default 3)"
    )
    a = ap.parse_args()
    out = a.out / ("quick" if a.quick else "full")
    out.mkdir(parents=True, exist_ok=True)
    div = 10 if a.quick else 1
    gen = {
        n: (r, e // div, max(s // div, 1), gz)
        for n, (r, e, s, gz) in {**GENERATED, **(HUGE if a.huge else {})}.items()
    }
    folders = {n: generated(out, n, *spec) for n, spec in gen.items() if not a.only or n in a.only}
    sets = {
        rel: CORPUS / rel for rel in CORPUS_SETS if (not a.only or rel in a.only) and (CORPUS / rel).exists()
    }
    sets.update(folders)
    candidates = [f for folder in folders.values() for f in trace_files(folder)]
    parser = fastest_parser(min(candidates, key=lambda f: f.stat().st_size)) if candidates else "orjson"
    result: dict = {
        "parser": parser,
        "quick": a.quick,
        "cpus": os.cpu_count(),
        "ingest": {},
        "analyses": {},
        "curve": {},
    }
    if not a.only or "startup" in a.only:
        n = 5 if a.quick else 10
        su = result["startup"] = startup(out, n)
        print(
            f"start-up, median of {n} (bytecode cached; load avg {su['load']:.1f} on {os.cpu_count()} CPUs)"
        )
        print(f"  {'':<30} {'wall s':>8} {'cpu s':>8} {'rss MB':>8}")
        for k, r in su.items():
            if k != "load":
                print(f"  {k:<30} {r['wall']:8.3f} {r['cpu']:8.3f} {r['rss_max']:8.0f}")
    big = CORPUS / "hta" / "df_index_resolver"
    if (not a.only or "inprocess" in a.only) and not a.no_hta and big.exists():
        ip = result["inprocess"] = in_process(big, out / "inprocess.duckdb", 5)
        print(
            f"\nin-process on hta/df_index_resolver, median of 5 (HTA's load {ip['hta_load']:.1f} s; "
            f"load avg {ip['load']:.1f}): wall s, and CPU s (process time: the CPU a busy machine "
            f"cannot inflate)\n  {'':<12} {'hta s':>8} {'traceprof s':>12} {'ratio':>7}"
            f" {'hta cpu':>8} {'traceprof cpu':>14} {'ratio':>7}"
        )
        for k in HTA_CALLS:
            r = ip[k]
            print(
                f"  {k:<12} {r['hta']:8.3f} {r['traceprof']:12.3f} {r['traceprof'] / r['hta']:6.2f}x"
                f" {r['hta_cpu']:8.3f} {r['traceprof_cpu']:14.3f} {r['traceprof_cpu'] / r['hta_cpu']:6.2f}x"
            )
    subprocess.run(
        [PY, "-m", "compileall", "-q", str(REPO / "traceprof"), str(REPO / "collectors")], env=INSTALLED
    )
    floor = ingest_floor(out, a.repeat)
    result["ingest_floor"] = floor
    print(
        f"\ningest start-up floor (peak of a trace with no events, median of {a.repeat}): "
        f"{floor['wall']:.2f} s wall, {floor['cpu']:.2f} s cpu, {floor['rss_sum']:.0f} MB RSS"
    )
    print(f"\nbare parse: {parser}; ratios are traceprof / other (wall, cpu, summed rss)")
    for name, folder in sets.items():
        files = trace_files(folder)
        size = sum(p.stat().st_size for p in files)
        print(f"\n{name}: {len(files)} files, {size / 1e6:.1f} MB on disk\n{HEAD}")
        db = out / f"{name.replace('/', '_')}.duckdb"
        drop_store(db)
        cmds = tools(
            folder, db, parser, not a.no_hta, parquet=name == "gen_8x1M", only_traceprof=name in HUGE
        )
        reps = a.repeat if name in CORPUS_SETS else 1
        runs: dict[str, list[dict]] = {k: [] for k in cmds}
        for _ in range(reps):  # interleaved: each tool once per round, a fresh store each time
            for k, cmd in cmds.items():
                drop_store(db)
                drop_store(parquet_db(db))
                runs[k].append(measure(cmd, a.hta_timeout if k == "hta" else 1800, env=INSTALLED))
        res = {k: _median_run(v) for k, v in runs.items()}
        from traceprof.storage.layout import (
            dataset_dir,  # here: the measuring children import traceprof themselves
        )

        parquet_db(db).unlink(missing_ok=True)
        shutil.rmtree(dataset_dir(parquet_db(db)), ignore_errors=True)
        res["files"], res["bytes"] = len(files), size
        res["largest_rank_bytes"] = big = largest_uncompressed(files)
        for k in ("traceprof", "traceprof_parquet", "hta", "bare"):
            if k in res:
                print(_row(k, res[k]))
        tp = res["traceprof"]
        print(
            f"  traceprof peak memory / largest uncompressed rank file ({big / 1e6:.0f} MB): summed RSS "
            f"{tp['rss_sum'] * 2**20 / big:.2f}x, summed PSS {tp['pss_sum'] * 2**20 / big:.2f}x, largest "
            f"process {tp['rss_max'] * 2**20 / big:.2f}x; above the start-up floor "
            f"{(tp['rss_sum'] - floor['rss_sum']) * 2**20 / big:.2f}x"
        )
        for k in ("hta", "bare"):
            if k in res:
                tp, o = res["traceprof"], res[k]
                print(
                    f"  traceprof / {k:<10} wall {tp['wall'] / o['wall']:.2f}x  cpu {tp['cpu'] / o['cpu']:.2f}x  "
                    f"rss_sum {tp['rss_sum'] / o['rss_sum']:.2f}x"
                )
        result["ingest"][name] = res
        if name in ("gen_1x2M_100k", "gen_8x1M") and not a.skip_analyses:
            names = (
                ANALYSES if name == "gen_8x1M" else [x for x in ANALYSES if x not in ("stragglers", "whatif")]
            )
            an = analyses(db, names, out / f"{name}.html")
            print(f"  analyses on {name}:\n{HEAD}")
            for k, r in an.items():
                print(_row(k, r))
            if name == "gen_8x1M":
                over = [k for k, r in an.items() if r["rss_max"] >= TARGET_RSS_MIB]
                print(
                    f"  targets: {len(an) - len(over)} of {len(an)} under {TARGET_RSS_MIB} MiB (largest "
                    f"process){'; over: ' + ', '.join(over) if over else ''}; report computing every "
                    f"analysis {an['report_cold']['wall']:.1f} s wall (target {TARGET_REPORT_S:g} s)"
                )
            total = res["traceprof"]["wall"] + sum(r["wall"] for k, r in an.items() if k != "report_cold")
            print(
                f"  ingest + every analysis + report: {total:.1f} s wall (the report reusing the analyses' "
                f"results; with --no-cache it takes {an['report_cold']['wall']:.1f} s)"
            )
            result["analyses"][name] = {**an, "ingest_plus_all_wall": total}
        drop_store(db)  # stores are large; the traces stay for the next run
    if not a.skip_analyses and (not a.only or "curve" in a.only):
        print(
            f"\noverlap vs steps (20 events per step):\n  {'steps':>8} {'events':>9} {'wall s':>8} {'rss MB':>8}"
        )
        for steps in CURVE:
            s = max(steps // div, 10)
            same = [n for n, spec in gen.items() if spec == (1, 20 * s, s, False)]  # reuse an identical set
            folder = (
                generated(out, same[0], *gen[same[0]])
                if same
                else generated(out, f"curve_{s}", 1, 20 * s, s, False)
            )
            db = out / f"curve_{s}.duckdb"
            drop_store(db)
            ing = measure(traceprof("ingest", str(folder), "--db", str(db)))
            ov = measure(traceprof("analyze", "overlap", "--db", str(db), "-f", "csv"))
            print(f"  {s:>8} {20 * s:>9} {ov['wall']:8.2f} {ov['rss_max']:8.0f}")
            result["curve"][s] = {"ingest": ing, "overlap": ov}
            drop_store(db)
    print(
        "\nsummary (one run): wall s / cpu s / peak summed RSS MB; ratios traceprof / other (wall, cpu, rss)"
    )
    print(f"  {'set':<40} {'traceprof':>20} {'hta':>22} {'bare':>20}   {'vs hta':>18}   {'vs bare':>18}")
    for name, res in result["ingest"].items():
        cells, ratios = [], []
        for k in ("traceprof", "hta", "bare"):
            r = res.get(k)
            cpu = "-" if r is None or r["rc"] == 124 else f"{r['cpu']:.1f}"  # killed workers report no CPU
            cells.append(
                "-"
                if r is None
                else f"{r['wall']:.1f}{'+' if r['rc'] == 124 else ''}/{cpu}/{r['rss_sum']:.0f}"
            )
        tp = res["traceprof"]
        for k in ("hta", "bare"):
            r = res.get(k)
            cpu = "-" if r is None or r["rc"] == 124 else f"{tp['cpu'] / r['cpu']:.2f}"
            ratios.append(
                "-" if r is None else f"{tp['wall'] / r['wall']:.2f}/{cpu}/{tp['rss_sum'] / r['rss_sum']:.2f}"
            )
        print(
            f"  {name:<40} {cells[0]:>20} {cells[1]:>22} {cells[2]:>20}   {ratios[0]:>18}   {ratios[1]:>18}"
            f"   rss/file {tp['rss_sum'] * 2**20 / res['largest_rank_bytes']:.2f}x"
            f" pss/file {tp['pss_sum'] * 2**20 / res['largest_rank_bytes']:.2f}x"
            f" max/file {tp['rss_max'] * 2**20 / res['largest_rank_bytes']:.2f}x"
            f" above-floor/file {(tp['rss_sum'] - floor['rss_sum']) * 2**20 / res['largest_rank_bytes']:.2f}x"
        )
    print("  (+: stopped at the time limit, a lower bound)")
    if a.scale:
        sizes = ["16", "32", "64"] if a.quick else ["64", "256", "1024"]
        subprocess.run(
            [PY, str(HERE / "scale.py"), "--ranks", *sizes, "--dask", "--out", str(out / "scale")], check=True
        )
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out / 'bench.json'}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        _measure(float(sys.argv[2]), sys.argv[4:])
    elif len(sys.argv) > 2 and sys.argv[1] == "--bare-parse":
        _bare_parse(sys.argv[2], sys.argv[4:])
    elif len(sys.argv) > 2 and sys.argv[1] == "--in-process":
        _in_process(int(sys.argv[2]), *sys.argv[4:])
    else:
        main()
