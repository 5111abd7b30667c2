"""Regression diff: typical times by hand, the noise test, and the CI gate on the real samples (exit codes)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import REPO, SAMPLES, corpus
from tests.test_flops import op, write_run
from tests.test_idle import kernel
from traceprof.diff import (
    DEFAULT_THRESHOLD,
    MIN_ITEM_SHARE_PCT,
    MIN_SAMPLES,
    _items,
    _metric,
    diff_runs,
    mann_whitney_p,
)
from traceprof.errors import UsageError
from traceprof.ingest import ingest


def _micro(folder: Path, extra: bool, world: int = 1, gpu: bool = False) -> Path:
    """One rank, ProfilerStep#1 [0, 100 us] and #2 [100, 200 us] (times in us, s = step start):

    aten::linear [s+1, s+31] holding aten::mm [s+5, s+15] (linear's self time 20 us);
    aten::mm [s+40, s+50], except in step 2, where it takes 40 us ([140, 180]): an outlier.
    extra: one more aten::mm of another shape per step, [s+32, s+40].
    mm [4,4]x[4,4]: calls of 10, 10, 10, 40 us -> median 10 x 4 calls / 2 steps = 20 us per step;
    extra mm [8,8]x[8,8]: 8 us x 1 per step. linear: 20 us per step.
    compute: base 20 + 20 = 40 us/step; cand 48 us/step (+20 %). Step time 100 us in both.
    """
    ev = []
    for s in (0, 100):
        ev += [op(f"ProfilerStep#{1 + s // 100}", s, 100, cat="user_annotation"),
               op("aten::linear", s + 1, 30, [[4, 4], [4, 4], []]),
               op("aten::mm", s + 5, 10, [[4, 4], [4, 4]]),
               op("aten::mm", s + 40, 40 if s else 10, [[4, 4], [4, 4]])]
        if extra:
            ev.append(op("aten::mm", s + 32, 8, [[8, 8], [8, 8]]))
        if gpu:  # one kernel per step on stream 7: makes it a GPU run
            ev.append(kernel("gemm", 7, s + 6, 5, corr=1 + s))
    return write_run(folder, ev, world=world)


def test_micro_diff_by_hand(store, tmp_path):
    ingest(store, [_micro(tmp_path / "base", False), _micro(tmp_path / "cand", True)])
    res = diff_runs(store, "base", "cand")
    m = {r["metric"]: r for r in res.frame.iter_rows(named=True)}
    assert (m["compute_ns"]["base"], m["compute_ns"]["cand"]) == (40_000, 48_000)
    assert m["compute_ns"]["change_pct"] == pytest.approx(20.0) and m["compute_ns"]["regressed"]
    assert m["compute_ns"]["p_value"] is None  # a typical time, no samples to test
    assert (m["step_time_ns"]["base"], m["step_time_ns"]["delta"], m["step_time_ns"]["regressed"]) == (100_000, 0, False)
    assert m["step_time_ns"]["p_value"] is None  # 2 samples per run: too few for the noise test
    items = {r["name"]: r for r in res.items.iter_rows(named=True)}
    mm = items["aten::mm"]
    assert (mm["base_ns"], mm["cand_ns"], mm["delta_ns"], mm["base_calls"], mm["cand_calls"]) == (20_000, 28_000, 8_000, 2, 3)
    assert mm["delta_pct"] == pytest.approx(40.0) and mm["share_of_step_pct"] == pytest.approx(8.0) and mm["grew"]
    assert items["aten::linear"]["base_ns"] == 20_000 and items["aten::linear"]["delta_ns"] == 0
    assert res.items["name"][0] == "aten::mm"  # largest |delta| first
    assert res.regressed and res.summary.startswith("REGRESSION base -> cand: compute_ns +20.0%")
    assert "grew: aten::mm +0.01 ms/step (+40%)" in res.summary
    assert m["idle_ns"]["cand"] < m["idle_ns"]["base"] and not m["idle_ns"]["regressed"]  # the extra mm fills a gap
    assert not diff_runs(store, "base", "cand", {"compute_ns": 0.3}).regressed  # 20 % < 30 %
    with pytest.raises(UsageError, match="no such metric"):
        diff_runs(store, "base", "cand", {"speed": 0.1})


def test_ns_are_whole_and_chart_labels_short(store, tmp_path):
    # Base step times 100 us and 101.001 us (two samples): median 100,500.5 ns, rounded half to
    # even -> 100,500 (int64 ns, not 100,500.50). Items: mm calls 10 us and 10.001 us, median
    # 10,000.5 ns x 2 calls / 2 steps -> 10,000 ns per step (ns columns int64).
    ev = [op("ProfilerStep#1", 0, 100, cat="user_annotation"), op("ProfilerStep#2", 100, 101.001, cat="user_annotation"),
          op("aten::mm", 5, 10, [[4, 4], [4, 4]]), op("aten::mm", 105, 10.001, [[4, 4], [4, 4]])]
    ingest(store, [write_run(tmp_path / "odd", ev)])
    res = diff_runs(store, "odd", "odd")
    step = res.frame.filter(pl.col("metric") == "step_time_ns").row(0, named=True)
    assert (step["base"], step["cand"], step["delta"]) == (100_500, 100_500, 0)
    assert {res.items[c].dtype for c in ("base_ns", "cand_ns", "delta_ns")} == {pl.Int64}
    assert res.items.filter(pl.col("name") == "aten::mm")["base_ns"].to_list() == [10_000]
    assert all(isinstance(m["base"], int) for m in res.to_dict()["metrics"] if m["metric"].endswith("_ns"))
    chart, = res.charts()  # one series: the report can rotate plain labels, not grouped ones
    assert chart.ys == ("delta_ns",) and "(ns)" not in chart.title and chart.x == "label"
    assert res.frames()["top"]["label"].to_list() == ["1. aten::mm"]


#: Step lengths (us) of the MFU runs: 8 samples, median 100 us, a few % of spread between steps.
_MFU_STEPS = (100, 102, 98, 101, 99, 100, 103, 97)


def _mfu_run(folder: Path, rows: int) -> Path:
    """One CPU rank, a ProfilerStep per entry of _MFU_STEPS (back to back), each holding one
    aten::mm [rows, 64] x [64, 64] of 50 us at its start + 10 us: 2 * rows * 64 * 64 FLOPs per step,
    the same kernel time and step time whatever ``rows``."""
    ev, t = [], 0
    for i, dur in enumerate(_MFU_STEPS):
        ev += [op(f"ProfilerStep#{i + 1}", t, dur, cat="user_annotation"), op("aten::mm", t + 10, 50, [[rows, 64], [64, 64]])]
        t += dur
    return write_run(folder, ev)


def test_mfu_drop_regresses_and_mfu_rise_does_not(store, tmp_path):
    # MFU is higher-is-better: a significant drop is the regression, a rise never is.
    # "big": 2 * 64 * 64 * 64 = 524,288 FLOPs per step; "small": 2 * 32 * 64 * 64 = 262,144. At the
    # median step of 100 us and a 0.01 TFLOP/s peak: 524,288 / 100e-6 s = 5.24288e9 FLOP/s -> MFU
    # 52.4288 %; small 26.2144 %. Per step MFU = FLOPs / step time: big 50.9 .. 54.1 %, small 25.5 ..
    # 27.0 %, every big sample above every small one. Step time (100 us), kernel time (50 us) and
    # idle are identical in both runs: MFU is the only metric that moves.
    ingest(store, [_mfu_run(tmp_path / "big", 64), _mfu_run(tmp_path / "small", 32)])
    peak = {"peak_tflops": "0.01"}
    drop = diff_runs(store, "big", "small", mfu_options=peak)
    m = {r["metric"]: r for r in drop.frame.iter_rows(named=True)}
    assert (m["mfu_pct"]["base"], m["mfu_pct"]["cand"]) == (pytest.approx(52.4288), pytest.approx(26.2144))
    assert m["mfu_pct"]["change_pct"] == pytest.approx(50.0)  # the fall, as % of the base
    assert drop.regressed and {k for k, r in m.items() if r["regressed"]} == {"mfu_pct"}
    assert drop.summary.startswith("REGRESSION big -> small: mfu_pct -50.0%")
    rise = diff_runs(store, "small", "big", mfu_options=peak)
    m = {r["metric"]: r for r in rise.frame.iter_rows(named=True)}
    assert (m["mfu_pct"]["base"], m["mfu_pct"]["cand"]) == (pytest.approx(26.2144), pytest.approx(52.4288))
    assert not rise.regressed and not m["mfu_pct"]["regressed"]
    assert rise.summary.startswith("OK small -> big")


def test_thresholds_are_fractions(store, tmp_path):
    ingest(store, [_micro(tmp_path / "base", False)])
    for bad, shown in [({"*": 5.0}, "-t 5:"), ({"*": 0.0}, "-t 0:"), ({"idle_ns": -0.1}, "-t idle_ns=-0.1:")]:
        with pytest.raises(UsageError, match=f"{shown} thresholds are fractions"):
            diff_runs(store, "base", "base", bad)
    assert not diff_runs(store, "base", "base", {"*": 1.0}).regressed


def test_runs_not_comparable(store, tmp_path):
    ingest(store, [_micro(tmp_path / "cpu", False), _micro(tmp_path / "gpu", False, gpu=True),
                   _micro(tmp_path / "two", False, world=2)])
    with pytest.raises(UsageError, match="not comparable .cpu is a CPU-only run, gpu a GPU run.:"):
        diff_runs(store, "cpu", "gpu")
    with pytest.raises(UsageError, match=r"not comparable \(world size 1 vs 2\)"):
        diff_runs(store, "cpu", "two")
    assert not diff_runs(store, "gpu", "gpu").regressed
    # --force: compared anyway, on per-rank medians (one sample per rank), with a note saying so.
    forced = diff_runs(store, "cpu", "two", force=True)
    assert any(n.startswith("forced (--force): runs cpu and two are not comparable (world size 1 vs 2)")
               for n in forced.notes)
    # each run has one traced rank (_micro writes rank 0 only): one per-rank median each
    assert forced.frame.filter(pl.col("metric") == "step_time_ns")[["n_base", "n_cand"]].row(0) == (1, 1)


def test_bad_mfu_param_is_a_usage_error(store, tmp_path):
    ingest(store, [_micro(tmp_path / "base", False)])
    with pytest.raises(UsageError, match="peak_tflops='-1': must be a finite number > 0"):
        diff_runs(store, "base", "base", mfu_options={"peak_tflops": "-1"})


def test_mann_whitney_by_hand():
    # base 1..5, cand 6..10: every cand sample is larger, U = 25; mean n1*n2/2 = 12.5, variance
    # n1*n2*(n+1)/12 = 25*11/12 (no ties); z = (25 - 0.5 - 12.5) / sqrt(275/12) = 2.5067; p = 0.0061.
    p = mann_whitney_p(np.arange(1, 6), np.arange(6, 11))
    assert p == pytest.approx(0.5 * math.erfc(12 / math.sqrt(275 / 12) / math.sqrt(2)))
    assert 0.006 < p < 0.0062
    assert mann_whitney_p(np.arange(6, 11), np.arange(1, 6)) > 0.99  # the other direction
    assert mann_whitney_p(np.ones(5), np.ones(5)) == 1.0  # all equal


def test_gpu_corpus_run_against_itself(store):
    ingest(store, [corpus("hta/nccl_parser_config")])
    res = diff_runs(store, "nccl_parser_config", "nccl_parser_config")
    assert not res.regressed and set(res.items["kind"]) == {"kernel", "collective"}
    assert (res.items["delta_ns"] == 0).all() and (res.frame["delta"] == 0).all()


# --- the CI gate on the real samples, through the CLI -----------------------------------------

RUNS = ("normal", "normal_repeat", "extra_matmul")


@pytest.fixture(scope="module")
def sample_db(tmp_path_factory) -> Path:
    missing = [r for r in RUNS if not list((SAMPLES / r).glob("rank*.trace.json.gz"))]
    if missing:
        pytest.skip(f"samples not recorded yet: {missing}")
    db = tmp_path_factory.mktemp("diff") / "s.duckdb"
    _cli("ingest", *(str(SAMPLES / r) for r in RUNS), "--db", str(db))
    return db


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "traceprof.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)


def test_extra_matmul_is_flagged_with_exit_3(sample_db):
    p = _cli("diff", "normal", "extra_matmul", "--db", str(sample_db))
    assert p.returncode == 3, p.stdout + p.stderr
    summary = p.stdout.strip().splitlines()[-1]
    assert summary.startswith("REGRESSION normal -> extra_matmul:") and "compute_ns" in summary
    assert "grew: aten::mm" in summary  # the op that grew is named first
    doc = json.loads(_cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "json").stdout)
    assert doc["regressed"] and {m["metric"] for m in doc["metrics"] if m["regressed"]} >= {"compute_ns"}
    compute = [i for i in doc["items"] if i["class"] == "compute"]
    mm = max(compute, key=lambda i: i["delta_ns"])  # the compute item that grew most
    assert mm["name"] == "aten::mm" and mm["grew"]
    # One extra (BT,d)@(d,4d) per block adds 4 of the 27 aten::mm calls per step (test_flops).
    assert (mm["base_calls"], mm["cand_calls"]) == (27, 31)


@pytest.mark.parametrize("base, cand", [("normal", "normal"), ("normal", "normal_repeat"), ("normal_repeat", "normal")])
def test_unchanged_job_passes_at_the_default_threshold(sample_db, base, cand):
    p = _cli("diff", base, cand, "--db", str(sample_db))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith(f"OK {base} -> {cand}")


def test_threshold_option(sample_db):
    assert DEFAULT_THRESHOLD == 0.10
    assert _cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "0.9").returncode == 0
    assert _cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "0.9", "-t", "compute_ns=0.05").returncode == 3
    bad = _cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "speed=0.1")
    assert bad.returncode == 1 and "no such metric" in bad.stderr
    bad = _cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "5")  # not 500 %
    assert bad.returncode == 1 and "-t 5: thresholds are fractions" in bad.stderr
    bad = _cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-p", "peak_tflops=-1")
    assert bad.returncode == 1 and "peak_tflops" in bad.stderr


def test_csv_and_json_carry_the_items(sample_db):
    n = len(json.loads(_cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "json").stdout)["items"])
    # Independent count: distinct training-thread CPU op names of either run + the one collective op.
    names = json.loads(_cli("sql", "SELECT count(DISTINCT e.name) AS n FROM events e JOIN (SELECT DISTINCT run_id, rank, "
                            "pid, tid FROM events WHERE kind = 'step') USING (run_id, rank, pid, tid) "
                            "WHERE kind = 'cpu_op'", "--db", str(sample_db), "-f", "json").stdout)[0]["n"]
    assert n == names + 1  # json: every item, no cap
    csv = _cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "csv")
    assert csv.stdout.startswith("metric,") and f"{n} items, none shown: --table items for all" in csv.stderr
    items = _cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "csv", "--table", "items").stdout
    assert items.startswith("kind,name,class,base_ns") and len(items.strip().splitlines()) == n + 1


def test_gpu_vs_cpu_runs_exit_1(store, tmp_path):
    db = tmp_path / "g.duckdb"
    _cli("ingest", str(SAMPLES / "normal"), str(corpus("hta/nccl_parser_config")), "--db", str(db))
    p = _cli("diff", "normal", "nccl_parser_config", "--db", str(db))
    assert p.returncode == 1 and "not comparable" in p.stderr and "world size 4 vs 2" in p.stderr


def test_report_with_baseline_has_a_diff_section(sample_db, tmp_path):
    out = tmp_path / "r.html"
    p = _cli("report", "--db", str(sample_db), "--run", "extra_matmul", "--baseline", "normal", "-o", str(out))
    assert p.returncode == 0, p.stderr
    page = out.read_text()
    assert 'id="diff"' in page and "REGRESSION normal -&gt; extra_matmul" in page


# --- the gate's decisions where they flip (traceprof.diff._metric and _items)

BASE5 = np.array([100.0, 100.0, 100.0, 100.0, 100.0])


@pytest.mark.parametrize("cand, regressed", [(110.0, False), (109.0, False), (111.0, True)])
def test_gate_at_just_below_and_just_above_the_threshold(cand, regressed):
    # step_time_ns: median 100 -> cand; change = 100 * (cand - 100) / 100 %: 10 % exactly is not
    # above the 10 % threshold (strictly greater regresses), 9 % is below, 11 % above. Five equal
    # samples a side, all cand above all base: Mann-Whitney U = 25, z = (25 - 12.5 - 0.5) / sqrt(
    # 25 / 12 * (11 - 240 / 90)) (ties: 5 values of 100 and 5 of cand: sum t^3 - t = 240) =
    # 12 / 4.167 = 2.880, p = 0.0020 < 0.01, so the threshold alone decides here.
    m = _metric("step_time_ns", BASE5, np.full(5, cand), 0.0, 0.10, 0.01, True)
    assert m["change_pct"] == pytest.approx(cand - 100.0)
    assert m["p_value"] == pytest.approx(0.5 * math.erfc(12 / math.sqrt(25 / 12 * (11 - 240 / 90)) / math.sqrt(2)))
    assert m["regressed"] is regressed


def test_gate_at_just_below_and_just_above_the_p_value():
    # A 50 % rise on fully separated samples (base 100..104, cand 150..154, no ties): U = 25,
    # z = (25 - 12.5 - 0.5) / sqrt(25 / 12 * 11) = 2.5067, p = 0.00609. Regressed only when
    # p < alpha: alpha 0.0061 yes, alpha = p exactly no (strict), alpha 0.006 no.
    b, c = np.arange(100.0, 105.0), np.arange(150.0, 155.0)
    p = 0.5 * math.erfc(12 / math.sqrt(25 / 12 * 11) / math.sqrt(2))
    assert mann_whitney_p(b, c) == pytest.approx(p) and p == pytest.approx(0.00609, abs=1e-5)
    assert _metric("compute_ns", b, c, 0.0, 0.10, 0.0061, True)["regressed"] is True
    assert _metric("compute_ns", b, c, 0.0, 0.10, mann_whitney_p(b, c), True)["regressed"] is False
    assert _metric("compute_ns", b, c, 0.0, 0.10, 0.0060, True)["regressed"] is False
    # Fewer than MIN_SAMPLES (5) a side: no test (p null), the threshold alone decides.
    few = _metric("compute_ns", b[: MIN_SAMPLES - 1], c[: MIN_SAMPLES - 1], 0.0, 0.10, 0.0060, True)
    assert few["p_value"] is None and few["regressed"] is True


@pytest.mark.parametrize("cand, regressed", [(45.0, False), (45.5, False), (44.5, True)])
def test_gate_on_mfu_counts_a_drop(cand, regressed):
    # mfu_pct falls from 50: change = 100 * (50 - cand) / 50 = 10 % (at), 9 %, 11 %. Unsampled
    # (no p-value): the threshold decides.
    m = _metric("mfu_pct", np.array([50.0]), np.array([cand]), 0.0, 0.10, 0.01, False)
    assert m["change_pct"] == pytest.approx(100 * (50 - cand) / 50) and m["regressed"] is regressed


@pytest.mark.parametrize("cand, regressed", [(20.0, False), (19.0, False), (21.0, True)])
def test_gate_on_exposed_comm_is_a_share_of_the_step(cand, regressed):
    # exposed_comm_ns 10 -> cand with a 100 ns base step: change = (cand - 10) / 100 of the step:
    # 10 % (at), 9 %, 11 %; as % of its own base it doubles, which alone must not trip the gate.
    m = _metric("exposed_comm_ns", np.array([10.0]), np.array([cand]), 100.0, 0.10, 0.01, False)
    assert m["change_pct"] == pytest.approx(cand - 10.0) and m["regressed"] is regressed


def _item(name: str, ns: float) -> pl.DataFrame:
    return pl.DataFrame({"kind": ["kernel"], "name": [name], "class": ["compute"], "ns": [ns], "calls": [1.0]})


@pytest.mark.parametrize("cand, step, grew", [
    (1100.0, 10_000.0, False),   # +10 % of itself: not above the 10 % threshold
    (1101.0, 10_000.0, True),    # +10.1 %, and 101 ns = 1.01 % of the step (>= 1 %)
    (1101.0, 20_000.0, False),   # +10.1 %, but 0.505 % of the step (< 1 %)
    (1100.0, 10_000.0 * 1.0001, False),
])
def test_grew_rule(cand, step, grew):
    # An item grew when its typical time per step rose by more than the threshold (10 %) of its
    # own base AND by at least MIN_ITEM_SHARE_PCT (1 %) of the base step time.
    items = _items(_item("gemm", 1000.0), _item("gemm", cand), step, 0.10)
    assert MIN_ITEM_SHARE_PCT == 1.0 and items["grew"].to_list() == [grew]


def test_grew_rule_for_a_new_item():
    # An item absent from the base (delta_pct null, treated as infinite) grew when it takes at
    # least 1 % of the step: 100 ns of a 10,000 ns step yes, 99 ns no.
    empty = _item("x", 0.0).head(0)
    assert _items(empty, _item("new", 100.0), 10_000.0, 0.10)["grew"].to_list() == [True]
    assert _items(empty, _item("new", 99.0), 10_000.0, 0.10)["grew"].to_list() == [False]


def test_the_same_diff_twice_is_the_same_output(tmp_path):
    # items with equal |delta| (the sample runs have several) came out in the order polars' group_by
    # happened to return them, and a name under two classes took either: 2 outputs over 8 runs
    from traceprof.store import Store

    db = tmp_path / "d.duckdb"
    with Store(db) as store:
        for r in ("normal", "extra_matmul"):
            ingest(store, [SAMPLES / r], jobs=1)
    with Store(db, read_only=True) as store:
        outs = {json.dumps(diff_runs(store, "normal", "extra_matmul", {}).to_dict(), sort_keys=True) for _ in range(8)}
    assert len(outs) == 1
    items = json.loads(outs.pop())["items"]
    keys = [(-abs(i["delta_ns"]), i["kind"], i["name"]) for i in items]
    assert keys == sorted(keys) and len(items) > 10
