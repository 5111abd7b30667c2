"""The HTML report: one offline file, names escaped, renders in a real browser without JS errors."""

from __future__ import annotations

import html
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLES, analyze, corpus
from traceprof.core.errors import TraceprofError, UsageError
from traceprof.ingest.ingest import ingest
from traceprof.render.report import SIZE_BUDGET_BYTES, write_report

EVIL = '<script>alert("x")</script>&<img src=x onerror=alert(1)>'


def _evil_trace(path: Path, evil: str = EVIL) -> Path:
    # A kernel and an NCCL kernel whose names try to inject HTML.
    base = 1_700_000_000_000_000_000
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 1,
            "dur": 1,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 2,
            "dur": 1,
            "args": {"correlation": 2},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": evil,
            "pid": 0,
            "tid": 7,
            "ts": 10,
            "dur": 30,
            "args": {"correlation": 1, "stream": 7, "device": 0},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_" + evil,
            "pid": 0,
            "tid": 8,
            "ts": 20,
            "dur": 40,
            "args": {"correlation": 2, "stream": 8, "device": 0},
        },
    ]
    doc = {
        "baseTimeNanoseconds": base,
        "distributedInfo": {"rank": 0, "world_size": 1},
        "deviceProperties": [{"id": 0, "name": evil}],
        "traceEvents": ev,
    }
    path.mkdir()
    (path / "rank0.json").write_text(json.dumps(doc))
    return path


def test_report_offline_and_escaped(store, tmp_path):
    ingest(store, [_evil_trace(tmp_path / "evil")])
    out = write_report(store, None, tmp_path / "r.html")
    text = out.read_text()
    assert EVIL not in text and "&lt;script&gt;alert(" in text
    # Offline: no script or stylesheet is fetched from anywhere.
    assert not re.search(r"<script[^>]+src=", text)
    assert not re.search(r"<link[^>]+href=\"?https?:", text)
    assert "Bokeh" in text and "Temporal breakdown" in text and "Communication/computation overlap" in text


def test_report_shows_control_characters_escaped(store, tmp_path):
    # As the terminal does: ESC as \x1b, newline as \n; never the raw characters in the HTML.
    ingest(store, [_evil_trace(tmp_path / "esc", "k\x1b[31mred\nx")])
    text = write_report(store, None, tmp_path / "r.html").read_text()
    assert "\x1b" not in text and "k\\x1b[31mred\\nx" in text


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.skip("chromium not installed (CI installs it: apt-get install chromium)")
    return exe


#: Screenshots of the reports' first screen (1400 x 900) are kept here (gitignored) for people to look at.
SHOTS = REPO / "build" / "report-screens"

# Measures the page once the plots are drawn: where the findings list ends, and how many plot
# containers bokeh filled. Written into the DOM so that --dump-dom shows it (test-side only).
_PROBE = """<script>
setTimeout(function () {
  const f = document.querySelector(".findings");
  const plots = document.querySelectorAll("div.plot");
  let drawn = 0;
  for (const p of plots) if (p.childElementCount > 0 || p.shadowRoot) drawn++;
  const el = document.createElement("pre");
  el.id = "probe";
  el.textContent = JSON.stringify({findings_bottom: f ? f.getBoundingClientRect().bottom : -1,
                                   plots: plots.length, drawn: drawn, failed: document.body.innerText.includes("plots need")});
  document.body.appendChild(el);
}, 3000);
</script>"""

_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=10000",
    "--window-size=1400,900",
]


def _browse(report: Path, tmp_path: Path, name: str) -> dict:
    """Open ``report`` in headless Chromium: screenshot of the first screen kept in SHOTS, console
    errors asserted absent; returns the probe's measurements."""
    exe = _chromium()
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / f"{name}.png"
    r = subprocess.run(
        [exe, *_FLAGS, f"--user-data-dir={tmp_path / 'profile1'}", f"--screenshot={shot}", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    errors = [ln for ln in console if re.search(r"error|Uncaught|warn", ln, re.I)]
    assert shot.exists() and shot.stat().st_size > 10_000, r.stderr[-2000:]
    assert not errors, "\n".join(errors)
    probed = tmp_path / f"{name}.probe.html"
    probed.write_text(report.read_text().replace("</body>", _PROBE + "</body>"))
    d = subprocess.run(
        [exe, *_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom", probed.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    m = re.search(r'<pre id="probe">(.*?)</pre>', d.stdout)
    assert m, d.stderr[-2000:]
    return json.loads(html.unescape(m.group(1)))


def _ingest_case(store, case: str) -> str:
    """Ingest one of the browser-test runs; returns the run name."""
    if case == "sample_straggler":
        ingest(store, [SAMPLES / "straggler_rank2"])
        return "straggler_rank2"
    if case == "gpu_corpus":
        ingest(store, [corpus("hta/trace_filter")])
        return "trace_filter"
    if case == "flight_recorder":
        ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")])
        return "gloo_cpu_4rank"
    if case == "nsys":
        path = corpus("nsys/pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
        try:
            ingest(store, [path])
        except TraceprofError as e:
            pytest.skip(f"nsys export not readable yet: {e}")
        return store.runs()["name"][0]
    raise AssertionError(case)


@pytest.mark.browser
@pytest.mark.parametrize("case", ["sample_straggler", "gpu_corpus", "flight_recorder", "nsys"])
def test_report_in_a_browser(store, tmp_path, case):
    run = _ingest_case(store, case)
    out = write_report(store, run, tmp_path / f"{case}.html")
    probe = _browse(out, tmp_path, case)
    # The first screen (900 px) holds the findings list; every plot was drawn; no fallback text.
    assert 0 < probe["findings_bottom"] < 900, probe
    assert probe["drawn"] == probe["plots"] > 0 and not probe["failed"], probe


def test_report_params_reach_the_analysis(store, tmp_path):
    # nccl_parser_config (A100) has no FLOPs sidecar and no shapes: MFU needs declared FLOPs.
    ingest(store, [corpus("hta/nccl_parser_config")])
    text = write_report(
        store, None, tmp_path / "r.html", params={"mfu": {"model_flops_per_step": "4e13"}}
    ).read_text()
    assert "MFU (model FLOPs utilization)" in text and "FLOPs source: declared" in text
    with pytest.raises(UsageError, match="no report analysis 'nope'"):
        write_report(store, None, tmp_path / "r2.html", params={"nope": {"x": "1"}})
    with pytest.raises(UsageError, match="peak_tflops"):
        write_report(store, None, tmp_path / "r3.html", params={"mfu": {"peak_tflops": "-1"}})


def test_findings_open_the_report_within_the_size_budget(store, tmp_path, caplog, capfd):
    # straggler_rank2: rank 2 sleeps before its all-reduces (sample_traces/README.md).
    ingest(store, [SAMPLES / "straggler_rank2"])
    with caplog.at_level(logging.INFO):
        text = write_report(store, "straggler_rank2", tmp_path / "r.html").read_text()
    size = len(text.encode())
    assert size < SIZE_BUDGET_BYTES, (
        f"report is {size:,} bytes, budget {SIZE_BUDGET_BYTES:,} (was 4.1 MB with holoviews)"
    )
    body = text[text.index("<body>") :]
    # Findings come first, ranked; the straggler finding names rank 2 with its evidence and cost.
    order = [body.index(f'id="{s}"') for s in ("findings", "timeline", "temporal", "stragglers", "traces")]
    assert order == sorted(order)
    first = re.search(r'<ol class="findings"><li[^>]*>(.*?)</li>', body).group(1)
    assert (
        "rank 2 is a straggler" in first
        and "12/12 collectives" in first
        and "faster (what-if with only its lateness removed" in first
    )
    # GPU-only sections collapse into one line saying what is missing and how to get it.
    assert body.count('class="missing"') == 1 and 'class="err"' not in body
    missing = re.search(r'<p class="missing".*?</p>', body).group(0)
    assert all(n in missing for n in ("idle", "kernels", "launch", "torch.profiler"))
    # Nothing from bokeh (validation warnings) reaches the terminal or the log; no WebGL.
    assert not [r for r in caplog.records if r.name.startswith("bokeh") and r.levelno >= logging.WARNING]
    assert "bokeh" not in capfd.readouterr().err.lower()
    assert "webgl" not in text.lower()


def test_flight_recorder_only_run_opens_with_findings_not_empty_boxes(store, tmp_path):
    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")])
    text = write_report(store, None, tmp_path / "r.html").read_text()
    assert 'class="err"' not in text and "not available:" not in text
    missing = re.search(r'<p class="missing" id="missing">.*?</p>', text).group(0)
    for name in ("temporal", "overlap", "gaps", "idle", "kernels", "launch", "mfu"):
        assert name in missing
    assert 'id="stragglers"' in text and "no straggler" in text  # the verdict table


def test_baseline_that_is_not_comparable_still_writes_the_report(store, tmp_path):
    # A GPU run against a CPU run: the diff section says why, the rest of the report is there.
    ingest(store, [corpus("hta/nccl_parser_config"), SAMPLES / "normal"])
    text = write_report(store, "nccl_parser_config", tmp_path / "r.html", baseline="normal").read_text()
    diff = re.search(r'<h2 id="diff">.*?</div>', text, re.S).group(0)
    assert "not compared" in diff and "not comparable" in diff
    assert 'id="temporal"' in text and "regression" in text


def test_hta_mode_is_stated(store, tmp_path):
    ingest(store, [corpus("hta/nccl_parser_config")])
    text = write_report(store, None, tmp_path / "r.html", params={"temporal": {"hta": "true"}}).read_text()
    assert "HTA-compatible mode" in text
    assert "HTA-compatible mode" not in write_report(store, None, tmp_path / "r2.html").read_text()


def test_ndtimeline_run_opens_with_its_straggler_and_a_timeline(store, tmp_path):
    # The OSDI'25 artifact's AR trace (16 of 64 ranks, per-op NDTimeline Parquet): no kernels, so the
    # GPU sections collapse into one line; the timeline draws its compute ranges and collectives.
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-AR.parquet")])
    text = write_report(store, None, tmp_path / "r.html").read_text()
    assert 'class="err"' not in text and text.count('class="missing"') == 1
    first = re.search(r'<ol class="findings"><li[^>]*>(.*?)</li>', text).group(1)
    assert "is a straggler" in first
    assert "No timeline" not in text and '<h2 id="timeline">Timeline</h2><div class="plot"' in text


def test_report_and_export_never_overwrite_a_duckdb_database(store, tmp_path):
    # Only the --db store was protected: `report -o other.duckdb` overwrote another store.
    import duckdb

    from traceprof.core.fileio import write_output

    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    before = other.read_bytes()
    ingest(store, [SAMPLES / "normal"])
    for write in (lambda: write_report(store, None, other), lambda: write_output(other, b"x")):
        with pytest.raises(
            UsageError, match=r"other\.duckdb: is a DuckDB database .*write the output elsewhere"
        ):
            write()
    assert other.read_bytes() == before
    plain = tmp_path / "old.html"
    plain.write_text("an earlier report")
    assert write_output(plain, b"new").read_bytes() == b"new"  # any other file is replaced as before


def test_report_force_compares_runs_that_are_not_comparable(store, tmp_path):
    # The refusal says "pass --force": report takes --force too. A GPU run vs a CPU run (world
    # size 1 vs 4): per-rank medians are compared, with the forced note; messages name runs, not ids.
    ingest(store, [corpus("hta/nccl_parser_config"), SAMPLES / "normal"])
    text = write_report(
        store, "nccl_parser_config", tmp_path / "r.html", baseline="normal", force=True
    ).read_text()
    diff = text[text.index('<h2 id="diff">') :]
    assert "forced (--force)" in diff and "not compared" not in diff
    from traceprof.core.errors import AnalysisError
    from traceprof.engine.diff import typical_items

    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")])
    with pytest.raises(AnalysisError, match="^run 'gloo_cpu_4rank': no ProfilerSteps"):
        typical_items(store, store.resolve_run("gloo_cpu_4rank"))


def _html_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(headers, rows of cell texts) of every <table> of a report, parsed with html.parser."""
    from html.parser import HTMLParser

    tables: list[tuple[list[str], list[list[str]]]] = []

    class P(HTMLParser):
        cell: list[str] | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "table":
                tables.append(([], []))
            elif tag == "tr" and tables:
                tables[-1][1].append([])
            elif tag in ("td", "th"):
                self.cell = []

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None:
                text = "".join(self.cell)
                (tables[-1][0] if tag == "th" else tables[-1][1][-1]).append(text)
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    P().feed(text)
    return [(h, [r for r in rows if r]) for h, rows in tables]


@pytest.mark.parametrize("source", ["straggler_rank2", "hta/nccl_parser_config"])
def test_report_tables_carry_units_not_raw_ns(store, tmp_path, source):
    # Every table of the report was raw ns (1,222,847,000). Now no header ends in _ns, and the cells of
    # a duration column (its header names s, ms, us or ns) are in that unit: a raw ns figure of a
    # duration of a millisecond or more would read 1,000,000 or more.
    ingest(store, [SAMPLES / source if "/" not in source else corpus(source)])
    text = write_report(store, None, tmp_path / "r.html").read_text()
    tables = _html_tables(text)
    assert len(tables) > 10
    durations = 0
    for headers, rows in tables:
        assert not [h for h in headers if h.endswith("_ns")], headers
        for i, h in enumerate(headers):
            if re.search(r"\((s|ms|us|ns)\)$", h):
                for r in rows:
                    if i < len(r) and r[i]:
                        durations += 1
                        assert abs(float(r[i].replace(",", ""))) < 1_000_000, (h, r[i])
    assert durations > 50
    # --units ns: the exact integers, under the _ns names
    exact = write_report(store, None, tmp_path / "ns.html", units="ns").read_text()
    heads = [h for hs, _ in _html_tables(exact) for h in hs]
    assert "total_ns" in heads and not [h for h in heads if h.endswith("(ms)")]


def test_nsys_style_summaries_are_sections_with_names_told_apart(store, tmp_path):
    # The nsys-style summaries were not in the report; kernel_sum printed eleven different
    # par_ranged2d_kernel instances as #1..#11. On pipit's CloverLeaf export (102 distinct kernel
    # names) the report has kernel_sum, nvtx_sum and memcpy_sum sections (or says why not), and the
    # kernel table's name cells are all distinct, each long one with its full name on hover.
    ingest(store, [corpus("nsys/pipit_perlmutter-cloverleaf-cuda.sqlite")])
    text = write_report(store, None, tmp_path / "r.html").read_text()
    assert len(text.encode()) < SIZE_BUDGET_BYTES
    assert 'id="kernel_sum"' in text and 'id="memcpy_sum"' in text
    assert 'id="nvtx_sum"' in text or "nvtx_sum" in re.search(r'<p class="missing".*?</p>', text).group(0)
    section = text[text.index('<h2 id="kernel_sum"') :]
    section = section[: section.index("<h2 ", 1)]
    headers, rows = _html_tables(section)[0]
    names = [r[headers.index("name")] for r in rows]
    assert len(names) == len(set(names)) == 102
    assert "par_ranged1d_kernel<update_halo_kernel … 10>" in names and not any(" #" in n for n in names)
    # the full names are stored once in the page (tp-names), each cell pointing to its own
    full = _full_names(text)
    cell = re.search(
        r'<td class="s" data-full="(\d+)">par_ranged1d_kernel&lt;update_halo_kernel … 10&gt;<', section
    )
    assert full[int(cell.group(1))].startswith("void clover::par_ranged1d_kernel<update_halo_kernel(int, int")
    assert "instance 10)" in full[int(cell.group(1))]


def _full_names(page: str) -> list[str]:
    """The report's full names of shortened cells (its ``tp-names`` list: gzip, base64, JSON)."""
    import base64
    import gzip

    packed = re.search(r'<script id="tp-names" type="application/octet-stream">([^<]*)</script>', page).group(
        1
    )
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def test_report_of_long_kernel_names_within_the_budget_and_names_kept(store, tmp_path):
    # hta trace_filter's report was 1,042,726 bytes (README: under 1 MB): 191 KB of it were the
    # full names of shortened kernel names, repeated as the hover text of every cell in every table
    # (928-1,956 characters each). They are stored once now, gzip-compressed; every name the
    # kernel_sum table holds is still in the page, and each shortened cell points to its own.
    ingest(store, [corpus("hta/trace_filter")], run="tf")
    text = write_report(store, "tf", tmp_path / "r.html").read_text()
    assert len(text.encode()) < SIZE_BUDGET_BYTES
    assert not re.search(r'<td class="s" title=', text)
    full = _full_names(text)
    assert len(full) == len(set(full))
    names = set(analyze(store, "kernel_sum", "tf").frame["name"].to_list())
    long_names = {n for n in names if len(n) > 80}  # the report's tables shorten above 80 characters
    assert long_names and long_names <= set(full)
    for k, short in re.findall(r'<td class="s" data-full="(\d+)">([^<]*)<', text):
        assert full[int(k)] != html.unescape(short)


def test_notes_do_not_speak_of_the_projects_own_traces(store, tmp_path):
    # whatif's note said "on a shared few-core CPU, as in the sample traces" on anyone's trace.
    ingest(store, [SAMPLES / "straggler_rank3"])
    text = write_report(store, None, tmp_path / "r.html").read_text()
    assert "S counts every op slower than its typical value" in text  # the note is printed here
    assert "sample traces" not in text and "few-core" not in text


def _figures_data(page: str) -> list[list[dict]]:
    """Each embedded figure's data sources (column -> values) of a report page: the figures' JSON
    unpacked, bokeh's arrays (base64, gzip-compressed when large) decoded."""
    import base64
    import gzip

    import numpy as np

    packed = re.search(r'id="tp-plots" type="application/octet-stream">([^<]*)<', page).group(1)
    items = json.loads(gzip.decompress(base64.b64decode(packed)))

    def value(v):
        if isinstance(v, dict) and v.get("type") == "ndarray":
            raw = v["array"]["data"] if isinstance(v["array"], dict) else v["array"]
            if isinstance(raw, list):
                return raw
            data = base64.b64decode(raw)
            data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
            return np.frombuffer(data, dtype=v["dtype"]).tolist()
        return v

    def sources(o, out):
        if isinstance(o, dict):
            if o.get("name") == "ColumnDataSource":
                entries = o["attributes"]["data"]["entries"]
                out.append({k: value(v) for k, v in entries})
            for v in o.values():
                sources(v, out)
        elif isinstance(o, list):
            for v in o:
                sources(v, out)
        return out

    return [sources(item, []) for _, item in items]


@pytest.mark.slow
def test_report_of_5000_steps_draws_bounded_buckets_with_exact_extremes(store, tmp_path):
    """A generated run of 2 ranks x 5,000 steps (``benchmarks/gen_trace.py``, 20 events a step):
    no figure's line draws more than MAX_POINTS (500) points (its min-max band, one polygon, twice
    that), and what-if's step time is drawn as 500 buckets of 10 consecutive steps whose min, median
    and max are worked out here from what-if's own per-step table; the stragglers' heat map has at
    most MAX_COLUMNS (400) columns per rank. Earlier versions drew 385 means of 13 steps, the
    slowest step hidden in its mean. The report stays within its size budget."""
    import statistics

    from traceprof.render import plots

    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gen_trace.py"), str(tmp_path / "job"), "--ranks", "2"]
        + ["--events", "100000", "--steps", "5000"],
        check=True,
        capture_output=True,
    )
    ingest(store, [tmp_path / "job"], run="job")
    steps = analyze(store, "whatif", "job").frame.sort("step")
    assert steps.height == 5000
    out = write_report(store, "job", tmp_path / "r.html")
    page = out.read_text()
    assert out.stat().st_size < SIZE_BUDGET_BYTES
    assert "5,000 steps drawn as 500 points of 10 consecutive steps" in page
    assert "5,000 steps drawn as 385 points of 13 consecutive steps (the last fewer); each cell shows" in page
    figures = _figures_data(page)
    for sources in figures:
        for data in sources:
            longest = max(map(len, data.values()))
            assert longest <= 2 * plots.MAX_POINTS or ("rank" in data and longest <= 2 * plots.MAX_COLUMNS)
    drawn = [d for sources in figures for d in sources if "median" in d]
    assert len(drawn) == 2  # actual and ideal
    for col, d in zip(("actual_ns", "ideal_ns"), drawn, strict=True):
        values = [v / 1e6 for v in steps[col].to_list()]  # ms, as drawn
        buckets = [values[i : i + 10] for i in range(0, 5000, 10)]
        assert d["step"] == steps["step"].to_list()[::10]
        assert d["min"] == pytest.approx([min(b) for b in buckets], rel=1e-12)
        assert d["max"] == pytest.approx([max(b) for b in buckets], rel=1e-12)
        assert d["median"] == pytest.approx([statistics.median(b) for b in buckets], rel=1e-12)
    assert max(drawn[0]["max"]) == pytest.approx(max(steps["actual_ns"].to_list()) / 1e6, rel=1e-12)


def test_report_tables_of_steps_show_their_worst_rows(store, tmp_path):
    # tests.builders.long_steps_run: 250 steps, step k 1,000 + k us but step 3 5,000 us. The step
    # account's table shows 200 of them: step 3, then 249 down to 51 (before: steps 0-199, the
    # slowest 49 after them hidden)
    from tests.builders import long_steps_run

    ingest(store, [long_steps_run(tmp_path / "run")], run="long")
    page = write_report(store, "long", tmp_path / "r.html").read_text()
    section = page[page.index('<h2 id="critical_path">') :]
    table = section[: section.index("</details>")]
    assert "200 of 250 rows shown: those of largest step_ns, largest first" in table
    steps = [int(m) for m in re.findall(r"<tr><td>0</td><td>(\d+)</td>", table)]
    assert steps == [3, *range(249, 50, -1)]
