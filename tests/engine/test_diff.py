"""The regression gate: structural layer exact, timing layer with its noise model, both worked by hand,
the rules where they flip, and the CI gate on the real samples (exit codes 0 / 3 / 4)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from tests._cli_inproc import run as cli
from tests.builders import cause_run, kernel, op, write_run
from tests.conftest import REPO, SAMPLES, corpus
from traceprof.core.errors import StoreError, UsageError
from traceprof.engine import noise, structure
from traceprof.engine.diff import (
    DEFAULT_THRESHOLD,
    EXIT_CODES,
    MIN_ITEM_SHARE_PCT,
    _contention,
    _timing_row,
    compare_profiles,
    diff_runs,
    run_profile,
    thresholds,
)
from traceprof.engine.difftext import causes
from traceprof.engine.findings import _regression
from traceprof.ingest.ingest import ingest


def _same(store, name: str, limits: dict | None = None, mfu_options: dict | None = None):
    """The gate's comparison of run ``name`` with itself (``diff_runs`` refuses that: a run is no
    baseline of itself), for checks whose expected answer is "nothing changed"."""
    p = run_profile(store, store.resolve_run(name), mfu_options)
    return compare_profiles([p], p, thresholds(limits or {}), label=name)


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
        ev += [
            op(f"ProfilerStep#{1 + s // 100}", s, 100, cat="user_annotation"),
            op("aten::linear", s + 1, 30, [[4, 4], [4, 4], []]),
            op("aten::mm", s + 5, 10, [[4, 4], [4, 4]]),
            op("aten::mm", s + 40, 40 if s else 10, [[4, 4], [4, 4]]),
        ]
        if extra:
            ev.append(op("aten::mm", s + 32, 8, [[8, 8], [8, 8]]))
        if gpu:  # one kernel per step on stream 7: makes it a GPU run
            ev.append(kernel("gemm", 7, s + 6, 5, corr=1 + s))
    return write_run(folder, ev, world=world)


def test_micro_diff_by_hand(store, tmp_path):
    ingest(store, [_micro(tmp_path / "base", False), _micro(tmp_path / "cand", True)])
    res = diff_runs(store, "base", "cand")
    m = {r["metric"]: r for r in res.frame.iter_rows(named=True)}
    # Structural, exact. FLOPs per step (multiply-add = 2): the leaf aten::mm [4,4]x[4,4] twice
    # (the one inside aten::linear counts, linear itself does not): 2 x 2*4*4*4 = 256; the extra
    # [8,8]x[8,8]: 2*8*8*8 = 1024, so 1280: +400 %. CPU ops per step 3 -> 4: +33.3 %.
    assert (m["flops"]["base"], m["flops"]["cand"], m["flops"]["change_pct"]) == (256, 1280, 400.0)
    assert m["launches"]["change_pct"] == pytest.approx(100 / 3) and m["launches"]["regressed"]
    assert m["collectives"]["verdict"] == "ok" and m["collectives"]["reason"] == "unchanged"
    mm = res.structure.row(0, named=True)
    assert (mm["name"], mm["shape"], mm["delta_calls"], mm["delta_flops"], mm["ranks"]) == (
        "aten::mm",
        "(8,8)@(8,8)",
        1,
        1024,
        [0],
    )
    assert res.verdict == "regression" and res.layers == ("structural",) and res.exit_code == 3
    assert res.summary.startswith(
        "REGRESSION (structural) base -> cand: flops +400.0% per step (> 1%): "
        "+1 aten::mm (8,8)@(8,8) per step on rank 0; launches +33.3% per step (> 5%): "
        "+1 CPU ops per step on rank 0"
    )
    # Timing. compute_ns, the typical time: 40,000 -> 48,000 ns (+20 %). Its noise, one baseline
    # run: per-step typical compute base step 1: linear 20 + mm median(10, 10) x 2 = 40 us; step 2:
    # 20 + median(10, 40) x 2 = 70; cand 48 and 78 (+8 each). Pooled within-run variance
    # ((15² + 15²) + (15² + 15²)) / (1 + 1) = 450 us²; each run's value varies by 450 / 2 steps =
    # 225; SE = sqrt(225 + 225) = 21.21 us = 53.0 % of 40 us > 10 %: inconclusive. t = 8 / 21.21
    # on 2 df: p = 0.5 - t / (2 sqrt(2 + t²)) = 0.3712.
    c = m["compute_ns"]
    assert (c["base"], c["cand"], c["delta"], c["change_pct"]) == (40_000, 48_000, 8_000, pytest.approx(20.0))
    assert c["noise_pct"] == pytest.approx(100 * math.sqrt(450) / 40) and c["verdict"] == "inconclusive"
    t = 8 / math.sqrt(450)
    assert c["p_value"] == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)))
    assert c["reason"] == "noise 53.0% > threshold 10%"
    # step time 100 us in every step of both runs: no change and no noise: ok
    s = m["step_time_ns"]
    assert (s["base"], s["delta"], s["noise_pct"], s["verdict"]) == (100_000, 0, 0.0, "ok")
    # idle 9 us -> 1 us per step (the extra mm fills a gap): -8 % of the step, within threshold
    assert m["idle_ns"]["change_pct"] == pytest.approx(-8.0) and m["idle_ns"]["verdict"] == "ok"
    # the reason says the direction, in the unit of the gate: it read "change -8.0%" beside a
    # delta_pct of -88.9 (9 -> 1 us), and TFLOP/s down 3.6 % read "change +3.6%"
    assert m["idle_ns"]["reason"].startswith("better by 8.0% of the step within threshold 10%")
    assert m["step_time_ns"]["reason"] == "unchanged within threshold 10%, noise 0.0%"
    items = {r["name"]: r for r in res.items.iter_rows(named=True)}
    assert (items["aten::mm"]["base_ns"], items["aten::mm"]["cand_ns"], items["aten::mm"]["cand_calls"]) == (
        20_000,
        28_000,
        3,
    )
    assert items["aten::linear"]["delta_ns"] == 0
    with pytest.raises(UsageError, match="no such metric"):
        diff_runs(store, "base", "cand", {"speed": 0.1})


def test_ns_are_whole_and_chart_labels_short(store, tmp_path):
    # Base step times 100 us and 101.001 us (two samples): median 100,500.5 ns, rounded half to
    # even -> 100,500 (int64 ns, not 100,500.50). Items: mm calls 10 us and 10.001 us, median
    # 10,000.5 ns x 2 calls / 2 steps -> 10,000 ns per step (ns columns int64).
    ev = [
        op("ProfilerStep#1", 0, 100, cat="user_annotation"),
        op("ProfilerStep#2", 100, 101.001, cat="user_annotation"),
        op("aten::mm", 5, 10, [[4, 4], [4, 4]]),
        op("aten::mm", 105, 10.001, [[4, 4], [4, 4]]),
    ]
    ingest(store, [write_run(tmp_path / "odd", ev)])
    res = _same(store, "odd")
    step = res.frame.filter(pl.col("metric") == "step_time_ns").row(0, named=True)
    assert (step["base"], step["cand"], step["delta"]) == (100_500, 100_500, 0)
    assert {res.items[c].dtype for c in ("base_ns", "cand_ns", "delta_ns")} == {pl.Int64}
    assert res.items.filter(pl.col("name") == "aten::mm")["base_ns"].to_list() == [10_000]
    assert all(isinstance(m["base"], int) for m in res.to_dict()["metrics"] if m["metric"].endswith("_ns"))
    (chart,) = res.charts()  # one series: the report can rotate plain labels, not grouped ones
    assert chart.ys == ("delta_ns",) and "(ns)" not in chart.title and chart.x == "label"
    assert res.frames()["top"]["label"].to_list() == ["1. aten::mm"]


#: Step lengths (us) of the MFU runs: 8 samples, median 100 us, a few % of spread between steps.
_MFU_STEPS = (100, 102, 98, 101, 99, 100, 103, 97)


def _mfu_run(folder: Path, rows: int, shift: int = 0) -> Path:
    """One CPU rank, a ProfilerStep per entry of _MFU_STEPS (back to back; entry i rotated by
    ``shift``, so that baseline runs differ a little), each holding one aten::mm [rows, 64] x [64, 64]
    of 50 us at its start + 10 us: 2 * rows * 64 * 64 FLOPs per step, the same kernel time and the
    same step times (in another order) whatever ``rows``."""
    ev, t = [], 0
    steps = _MFU_STEPS[shift:] + _MFU_STEPS[:shift]
    for i, dur in enumerate(steps):
        ev += [
            op(f"ProfilerStep#{i + 1}", t, dur, cat="user_annotation"),
            op("aten::mm", t + 10, 50, [[rows, 64], [64, 64]]),
        ]
        t += dur
    return write_run(folder, ev)


def test_mfu_drop_regresses_and_mfu_rise_does_not(store, tmp_path):
    # MFU is higher-is-better: a significant drop is the regression, a rise never is.
    # "big": 2 * 64 * 64 * 64 = 524,288 FLOPs per step; "small": 2 * 32 * 64 * 64 = 262,144. At the
    # median step of 100 us and a 0.01 TFLOP/s peak: 524,288 / 100e-6 s = 5.24288e9 FLOP/s -> MFU
    # 52.4288 %; small 26.2144 %. Per step MFU = FLOPs / step time: big 50.9 .. 54.1 %, small 25.5 ..
    # 27.0 %, every big sample above every small one. Step time (100 us), kernel time (50 us) and
    # idle are identical in all runs: MFU is the only timing metric that moves. A timing regression
    # needs 2+ baseline runs (one cannot tell a change from run-to-run variation): three of each.
    runs = [_mfu_run(tmp_path / f"big{i}", 64, i) for i in range(3)]
    runs += [_mfu_run(tmp_path / f"small{i}", 32, i) for i in range(3)]
    ingest(store, runs)
    peak = {"peak_tflops": "0.01"}
    drop = diff_runs(store, "big0,big1,big2", "small0", mfu_options=peak)
    m = {r["metric"]: r for r in drop.frame.iter_rows(named=True)}
    assert (m["mfu_pct"]["base"], m["mfu_pct"]["cand"]) == (pytest.approx(52.4288), pytest.approx(26.2144))
    assert m["mfu_pct"]["change_pct"] == pytest.approx(50.0)  # the fall, as % of the base
    assert drop.regressed and {k for k, r in m.items() if r["regressed"]} == {"mfu_pct"}
    rise = diff_runs(store, "small0,small1,small2", "big0", mfu_options=peak)
    m = {r["metric"]: r for r in rise.frame.iter_rows(named=True)}
    assert (m["mfu_pct"]["base"], m["mfu_pct"]["cand"]) == (pytest.approx(26.2144), pytest.approx(52.4288))
    assert not m["mfu_pct"]["regressed"]
    # the rise is a FLOPs growth (+100 %): the structural layer's regression, never MFU's
    assert {k for k, r in m.items() if r["regressed"]} <= {"flops"}


def test_thresholds_are_fractions(store, tmp_path):
    ingest(store, [_micro(tmp_path / "base", False)])
    for bad, shown in [({"*": 5.0}, "-t 5:"), ({"*": 0.0}, "-t 0:"), ({"idle_ns": -0.1}, "-t idle_ns=-0.1:")]:
        with pytest.raises(UsageError, match=f"{shown} thresholds are fractions"):
            diff_runs(store, "base", "base", bad)
    assert _same(store, "base", {"*": 1.0}).verdict == "ok"


def test_runs_not_comparable(store, tmp_path):
    ingest(
        store,
        [
            _micro(tmp_path / "cpu", False),
            _micro(tmp_path / "gpu", False, gpu=True),
            _micro(tmp_path / "two", False, world=2),
        ],
    )
    with pytest.raises(UsageError, match="not comparable .'cpu' is a CPU-only run, 'gpu' a GPU run.:"):
        diff_runs(store, "cpu", "gpu")
    with pytest.raises(UsageError, match=r"not comparable \(world size 1 vs 2\)"):
        diff_runs(store, "cpu", "two")
    with pytest.raises(
        UsageError, match=r"runs 'gpu', 'cpu' and 'two' are not comparable"
    ):  # every baseline checked
        diff_runs(store, "gpu,cpu", "two")
    assert not _same(store, "gpu").regressed
    # --force: compared anyway, on per-rank medians (one sample per rank), with a note saying so.
    forced = diff_runs(store, "cpu", "two", force=True)
    assert any(
        n.startswith("forced (--force): runs 'cpu' and 'two' are not comparable (world size 1 vs 2)")
        for n in forced.notes
    )
    # each run has one traced rank (_micro writes rank 0 only): one per-rank median each
    assert forced.frame.filter(pl.col("metric") == "step_time_ns")[["n_base", "n_cand"]].row(0) == (1, 1)
    # GPU -> CPU: launches count kernels (1 per step) on one and CPU ops (3) on the other: +200 %,
    # shown but not gated, since they count other things
    g2c = diff_runs(store, "gpu", "cpu", force=True)
    launches = g2c.frame.filter(pl.col("metric") == "launches").row(0, named=True)
    assert (
        launches["reason"] == "not gated (--force): +200.0% > threshold 5% (exact)"
        and not launches["regressed"]
    )
    # the summary line agrees with the row (it said "structure changed within thresholds: launches +200.0%")
    assert "not gated (--force): launches +200.0% > 5%" in g2c.summary
    assert "within thresholds: launches" not in g2c.summary


def test_collectives_without_sizes_give_no_comm_bytes(store):
    # HTA's trace_diff control run: an old Kineto trace whose 10 collectives per step carry no
    # collective metadata (no `In msg nelems`): comm_bytes read "0 B -> 0 B unchanged", a figure
    # nothing measured. Its all-reduces are now sized from their annotation's Input Dims (18 of 60);
    # its 42 all-to-alls are not: with every size dropped it is not compared, and a note says why.
    ingest(store, [corpus("hta/trace_diff/control")])
    sized = store.sql("SELECT count(*), count(coalesce(bytes_in, bytes_out)) FROM collectives").row(0)
    assert sized == (60, 18)
    partly = _same(store, "control")
    assert partly.frame.filter(pl.col("metric") == "comm_bytes")["cand"].item() > 0
    assert any(
        n.startswith("comm_bytes sums the collectives of known size only: unknown in 'control' 42 of 60 ")
        for n in partly.notes
    ), partly.notes
    store.sql("UPDATE collectives SET bytes_in = NULL, bytes_out = NULL")
    res = _same(store, "control")
    assert "comm_bytes" not in res.frame["metric"].to_list()
    assert res.frame.filter(pl.col("metric") == "collectives")["cand"].item() == 10
    assert any(
        n.startswith("comm_bytes not compared: the sizes of the collectives are unknown in 'control' (")
        for n in res.notes
    )


def test_bad_mfu_param_is_a_usage_error(store, tmp_path):
    ingest(store, [_micro(tmp_path / "base", False)])
    with pytest.raises(UsageError, match="peak_tflops='-1': must be a finite number > 0"):
        _same(store, "base", mfu_options={"peak_tflops": "-1"})


def test_gpu_corpus_run_against_itself(store):
    ingest(store, [corpus("hta/nccl_parser_config")])
    res = _same(store, "nccl_parser_config")
    assert not res.regressed and set(res.items["kind"]) == {"kernel", "collective"}
    assert (res.items["delta_ns"] == 0).all() and (res.frame["delta"] == 0).all()
    assert res.structure.is_empty()  # the same run: nothing changed
    launches = res.frame.filter(pl.col("metric") == "launches").row(0, named=True)
    # GPU run: launches are kernels per step, the median over each rank's steps, summed over
    # ranks; checked against plain SQL on the same store
    per = store.sql("""SELECT rank, median(n) AS n FROM (SELECT rank, step, count(*) AS n FROM kernels
                       WHERE run_id = 1 AND step IS NOT NULL AND kind = 'kernel' GROUP BY ALL) GROUP BY rank""")
    assert launches["base"] == per["n"].sum() > 0


# --- the noise model: Student's t, and the verdict where it flips -------------------------------


def test_t_distribution_closed_forms():
    # df = 1 (Cauchy): F(t) = 1/2 + atan(t)/pi; df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t²)).
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0, 40.0):
        assert noise.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert noise.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    # quantiles: df = 2 inverts in closed form, t = (2q - 1) sqrt(2 / (1 - (2q - 1)²))
    for q in (0.9, 0.99, 0.995):
        a = 2 * q - 1
        assert noise.t_ppf(q, 2) == pytest.approx(a * math.sqrt(2 / (1 - a * a)), rel=1e-9)
    assert noise.t_ppf(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)
    assert noise.t_ppf(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)  # the normal's


def _per(values: list[float], units: int = 2) -> list[tuple[float, np.ndarray]]:
    """Runs whose steps all equal the run's value (no within-run spread), in us as ns (x 1000)."""
    return [(1000 * v, np.full(units, 1000 * v)) for v in values]


# Three baseline runs at 100, 102 and 98 us: s_b² = (0 + 4 + 4) / 2 = 4 us², no within-run spread,
# so each run's value varies by 4 and the candidate's change by SE = sqrt(4 + 3 x 4 / 9) = 2.309 us
# (2.31 % of 100); df = 2. One-sided p on 2 df: p = 1/2 - t / (2 sqrt(2 + t²)), t = change / SE:
# below alpha = 0.01 when t > 6.9646 (= t(0.99, 2)), i.e. change > 6.9646 x 2.3094 = 16.084 %.
BASE3 = [100.0, 102.0, 98.0]


@pytest.mark.parametrize(
    "cand, verdict",
    [
        (110.0, "ok"),  # +10 % exactly: not above the 10 % threshold (strictly greater)
        (111.0, "inconclusive"),  # +11 % > 10 %, t = 4.76: p = 0.0207, not significant
        (116.0, "inconclusive"),  # +16.0 %: t = 6.928, p = 0.01010, just not significant
        (116.2, "regression"),  # +16.2 %: t = 7.015, p = 0.00986 < 0.01
    ],
)
def test_noise_floor_and_significance_flip(cand, verdict):
    row = _timing_row("compute_ns", _per([*BASE3, cand]), [2, 2, 2, 2], 100_000.0, 0.10, 0.01)
    se = math.sqrt(4 + 4 / 3)
    t = (cand - 100.0) / se
    assert row["noise_pct"] == pytest.approx(se) and row["base_runs"] == 3
    assert row["p_value"] == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)))
    assert row["verdict"] == verdict and row["regressed"] is (verdict == "regression")


@pytest.mark.parametrize("spread, verdict", [(8.0, "ok"), (8.7, "inconclusive")])
def test_noise_above_the_threshold_is_inconclusive(spread, verdict):
    # Baselines 100 - d, 100, 100 + d us: s_b = d, SE = d sqrt(1 + 1/3) = 1.1547 d. d = 8: noise
    # 9.24 % <= 10 %, the unchanged candidate is ok; d = 8.7: noise 10.05 % > 10 %: the gate cannot
    # see a change of 10 %, so even an unchanged candidate is inconclusive, never ok by default.
    row = _timing_row(
        "step_time_ns", _per([100 - spread, 100.0, 100 + spread, 100.0]), [2] * 4, 100_000.0, 0.10, 0.01
    )
    assert row["noise_pct"] == pytest.approx(spread * math.sqrt(4 / 3)) and row["verdict"] == verdict


def test_one_baseline_run_never_makes_a_timing_regression():
    # One baseline run: only the spread between steps is known. Base steps 95, 105 us (value 100),
    # candidate steps c - 5, c + 5: within variance (50 + 50) / 2 = 50 us², SE = sqrt(25 + 25) =
    # 7.07 % of 100. c = 150: +50 % is far beyond it (t = 7.07, p = 0.0097 on 2 df), but the
    # run-to-run variance is unknown: inconclusive. 15 % faster: inconclusive too (the machine may
    # have been faster and hidden a regression); 5 % faster or 8 % slower: ok.
    def row(c: float) -> dict:
        per = [
            (100_000.0, np.array([95_000.0, 105_000.0])),
            (1000 * c, np.array([1000 * (c - 5), 1000 * (c + 5)])),
        ]
        return _timing_row("step_time_ns", per, [2, 2], 100_000.0, 0.10, 0.01)

    slow = row(150.0)
    assert slow["noise_pct"] == pytest.approx(math.sqrt(50)) and slow["p_value"] < 0.01
    assert slow["verdict"] == "inconclusive" and "one baseline run cannot tell" in slow["reason"]
    assert (
        row(85.0)["verdict"] == "inconclusive" and "differ by more than the threshold" in row(85.0)["reason"]
    )
    assert row(95.0)["verdict"] == "ok" and row(108.0)["verdict"] == "ok"


def test_too_little_data_is_inconclusive():
    # one baseline run of one step, a candidate of one step: no spread of any kind to estimate
    row = _timing_row(
        "step_time_ns", [(1e5, np.array([1e5])), (1e5, np.array([1e5]))], [1, 1], 1e5, 0.10, 0.01
    )
    assert (
        row["noise_pct"] is None
        and row["verdict"] == "inconclusive"
        and row["reason"].startswith("too little data")
    )


def test_mfu_counts_a_drop_and_components_a_share_of_the_step():
    # mfu_pct 50 -> 40 with baselines 50, 51, 49 (SE 1.1547): the drop is the bad direction,
    # change +20 % of 50; t = 10 / 1.1547 = 8.66, p = 0.0065: regression.
    mfu = _timing_row(
        "mfu_pct", [(v, np.full(2, v)) for v in (50.0, 51.0, 49.0, 40.0)], [2] * 4, 100.0, 0.10, 0.01
    )
    assert mfu["change_pct"] == pytest.approx(20.0) and mfu["verdict"] == "regression"
    # exposed_comm_ns 10 -> 20 us with a 1,000 us base step: +100 % of itself but +1 % of the step: ok
    comm = _timing_row("exposed_comm_ns", _per([10.0, 10.0, 10.0, 20.0]), [2] * 4, 1_000_000.0, 0.10, 0.01)
    assert comm["delta_pct"] == pytest.approx(100.0) and comm["change_pct"] == pytest.approx(1.0)
    assert comm["verdict"] == "ok"


def test_contention_blocks_wall_clock_regressions_only():
    # Compute calls' inflation over their per-shape medians: baselines at most 2.0; with the 10 %
    # step-time threshold a candidate at 2.2 ran no busier, at 2.21 it did.
    def prof(x: float) -> SimpleNamespace:
        return SimpleNamespace(timing=SimpleNamespace(inflation=x))

    bases = [prof(1.8), prof(2.0)]
    assert _contention(bases, prof(2.2), 0.10) == ""
    busier = _contention(bases, prof(2.21), 0.10)
    assert (
        busier == "the candidate ran under more contention than every baseline run (2.21x vs at most 2.00x)"
    )
    per = _per([*BASE3, 130.0])  # +30 %: p = 0.0017, a regression without contention
    assert _timing_row("step_time_ns", per, [2] * 4, 100_000.0, 0.10, 0.01)["verdict"] == "regression"
    blocked = _timing_row("step_time_ns", per, [2] * 4, 100_000.0, 0.10, 0.01, busier)
    assert blocked["verdict"] == "inconclusive" and blocked["reason"].endswith(busier)
    # compute_ns is a typical time (preempted calls discarded): it still regresses
    assert _timing_row("compute_ns", per, [2] * 4, 100_000.0, 0.10, 0.01, busier)["verdict"] == "regression"


# --- the structural layer: exact, with a threshold ----------------------------------------------


def _structure(flops: float, launches: float = 10.0) -> structure.Structure:
    totals = pl.DataFrame(
        {
            "rank": [0],
            "steps": [3],
            "flops": [flops],
            "launches": [launches],
            "collectives": [4.0],
            "comm_bytes": [1024.0],
        },
        schema_overrides={"rank": pl.Int32},
    )
    keys = pl.DataFrame(
        schema={
            "rank": pl.Int32,
            "kind": pl.Utf8,
            "name": pl.Utf8,
            "sig": pl.Utf8,
            "calls": pl.Float64,
            "flops": pl.Float64,
            "bytes": pl.Float64,
        }
    )
    return structure.Structure(keys, totals, "shapes")


@pytest.mark.parametrize(
    "bases, cand, change, regressed",
    [
        ([1000.0], 1010.0, 1.0, False),  # +1 % exactly: not above the 1 % default
        ([1000.0], 1011.0, 1.1, True),  # +1.1 %
        ([1000.0, 2000.0], 1500.0, 0.0, False),  # inside the baselines' range: no change
        ([1000.0, 2000.0], 2020.0, 1.0, False),  # +1 % of the largest baseline (2000)
        ([1000.0, 2000.0], 2021.0, 1.05, True),
        ([1000.0], 900.0, -10.0, False),  # fewer FLOPs: a change, not a regression
    ],
)
def test_structural_threshold_flip(bases, cand, change, regressed):
    rows, _ = structure.compare(
        [_structure(b) for b in bases], _structure(cand), structure.DEFAULT_THRESHOLDS
    )
    f = {r["metric"]: r for r in rows}["flops"]
    assert f["change_pct"] == pytest.approx(change) and f["regressed"] is regressed
    assert f["varies"] is (len(set(bases)) > 1)
    # exact counts: a launch count that grows 5 % is not above the 5 % default, 5.1 % is
    rows, _ = structure.compare(
        [_structure(1.0, 1000.0)], _structure(1.0, 1051.0), structure.DEFAULT_THRESHOLDS
    )
    assert {r["metric"]: r for r in rows}["launches"]["regressed"]
    rows, _ = structure.compare(
        [_structure(1.0, 1000.0)], _structure(1.0, 1050.0), structure.DEFAULT_THRESHOLDS
    )
    assert not {r["metric"]: r for r in rows}["launches"]["regressed"]


def test_shape_text():
    assert structure.shape_text("op", "aten::mm", "[[512,128],[128,512]]") == "(512,128)@(128,512)"
    assert (
        structure.shape_text("op", "aten::addmm", "[[512],[8,128],[128,512],[],[]]")
        == "(512), (8,128), (128,512), (), ()"
    )
    assert structure.shape_text("collective", "all_reduce", "0") == "pg 0"


# --- cause: named only above its own spread; collective wait never the cause of compute ---------


def test_an_item_is_named_only_above_its_own_spread(store, tmp_path):
    # Baselines: relu 10, 11, 9 us per step (mean 10, s_b = 1), gelu 5, 7, 3 (mean 5, s_b = 2).
    # Candidate: relu 20, gelu 7. relu: +10 us, SE = sqrt(1 + 3/9) = 1.155 us, t = 8.66, p =
    # 0.0065 < 0.01: grew. gelu: +2 us (+40 % of itself, 2 % of the 100 us step: the old rule
    # named it), SE = 2 x 1.155 = 2.31 us, t = 0.87: within its spread, not named.
    runs = [
        cause_run(tmp_path / n, r, g)
        for n, r, g in (("b1", 10, 5), ("b2", 11, 7), ("b3", 9, 3), ("c", 20, 7))
    ]
    ingest(store, runs)
    res = diff_runs(store, "b1,b2,b3", "c")
    items = {r["name"]: r for r in res.items.iter_rows(named=True)}
    relu, gelu = items["aten::relu"], items["aten::gelu"]
    assert (relu["delta_ns"], relu["noise_pct"]) == (10_000, pytest.approx(100 * math.sqrt(4 / 3) / 100))
    assert (
        relu["p_value"] == pytest.approx(0.5 - 8.6603 / (2 * math.sqrt(2 + 75.0)), abs=1e-4) and relu["grew"]
    )
    assert gelu["delta_pct"] == pytest.approx(40.0) and gelu["share_of_step_pct"] >= MIN_ITEM_SHARE_PCT
    assert not gelu["grew"]
    assert res.baseline == "b1,b2,b3" and res.frame["base_runs"].unique().to_list() == [3]


def test_collective_wait_is_never_the_cause_of_compute():
    metrics = pl.DataFrame(
        {"metric": ["compute_ns", "step_time_ns"], "layer": ["timing"] * 2, "regressed": [True, True]}
    )
    items = pl.DataFrame(
        {
            "kind": ["collective", "op"],
            "name": ["all_reduce", "aten::mm"],
            "class": ["comm", "compute"],
            "delta_ns": [9_000_000, 4_000_000],
            "delta_pct": [40.0, 25.0],
            "grew": [True, True],
        }
    )
    ranks = pl.DataFrame(
        {"rank": [0, 1, 2, 3], "change_pct": [1.0, -2.0, 31.0, 0.5], "grew": [False, False, True, False]}
    )
    text = causes(metrics, items, ranks)
    assert text == (
        "grew: aten::mm +4.00 ms/step (+25%); compute grew on rank 2 (+31%) "
        "(collective wait on the others is the symptom, not the cause)"
    )
    # exposed communication regressed, compute did not grow anywhere: the collective is named
    comm = causes(
        metrics.with_columns(pl.Series("metric", ["exposed_comm_ns", "idle_ns"])),
        items,
        ranks.with_columns(pl.lit(False).alias("grew")),
    )
    assert comm.startswith("grew: all_reduce +9.00 ms/step (+40%)")


def test_findings_verdict_follows_the_gate(store, tmp_path):
    # _micro: +1 aten::mm per step, a structural regression. _cause_run with a slower relu: the
    # same ops and shapes, compute 25 -> 37 us (+48 %) against one baseline run: inconclusive.
    ingest(
        store,
        [
            _micro(tmp_path / "base", False),
            _micro(tmp_path / "cand", True),
            cause_run(tmp_path / "b1", 10, 5),
            cause_run(tmp_path / "c", 20, 7),
        ],
    )
    for base, cand, status in (("base", "cand", "problem"), ("b1", "c", "inconclusive"), ("b1", "b1", "ok")):
        res = _same(store, base) if base == cand else diff_runs(store, base, cand)
        findings, verdict = _regression(res)
        assert verdict.status == status and findings[0].problem is (status == "problem")
        assert (
            verdict.text.endswith(res.summary)
            and res.exit_code == {"problem": 3, "inconclusive": 4, "ok": 0}[status]
        )


# --- the CI gate on the real samples, through the CLI -----------------------------------------

RUNS = ("normal", "normal_repeat", "extra_matmul")


@pytest.fixture(scope="module")
def sample_db(tmp_path_factory) -> Path:
    missing = [r for r in RUNS if not list((SAMPLES / r).glob("rank*.trace.json.gz"))]
    if missing:
        pytest.skip(f"samples not recorded yet: {missing}")
    db = tmp_path_factory.mktemp("diff") / "s.duckdb"
    code, _, err = cli("ingest", *(str(SAMPLES / r) for r in RUNS), "--db", str(db))
    assert code == 0, err
    return db


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "traceprof.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


def test_extra_matmul_is_a_structural_regression_with_exit_3(sample_db):
    p = _cli("diff", "normal", "extra_matmul", "--db", str(sample_db))
    assert p.returncode == 3, p.stdout + p.stderr
    summary = p.stdout.strip().splitlines()[-1]
    # One extra (B·T, d) @ (d, 4d) matmul per block, 2 blocks: forward +2 aten::mm (512,128)@(128,512),
    # backward +2 (512,512)@(512,128) (its input's gradient; the weight's is the same shape pair).
    # FLOPs per rank-step: +4 x 2*512*128*512 = 268,435,456 over 1,509,949,440 (+17.78 %; the
    # collector's torch count, elementwise ops included, says 1,511,071,744 -> 1,780,162,560: +17.81 %).
    assert summary.startswith(
        "REGRESSION (structural) normal -> extra_matmul: flops +17.8% per step (> 1%): "
        "+2 aten::mm (512,128)@(128,512) per step on every rank, "
        "+2 aten::mm (512,512)@(512,128) per step on every rank"
    )
    doc = json.loads(_cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "json").stdout)
    assert doc["verdict"] == "regression" and doc["exit_code"] == 3 and doc["layers"] == ["structural"]
    flops = next(m for m in doc["metrics"] if m["metric"] == "flops")
    assert (flops["base"], flops["delta"]) == (4 * 1_509_949_440, 4 * 268_435_456)
    mm = [s for s in doc["structure"] if s["name"] == "aten::mm"]
    assert {(s["shape"], s["base_calls"], s["cand_calls"]) for s in mm} == {
        ("(512,128)@(128,512)", 20, 28),
        ("(512,512)@(512,128)", 32, 40),
    }  # 4 ranks x (5 -> 7, 8 -> 10)
    # the timing items still show the typical time: 4 of 27 -> 31 aten::mm calls per step
    item = next(i for i in doc["items"] if i["name"] == "aten::mm")
    assert (item["base_calls"], item["cand_calls"]) == (27, 31)


def test_differing_baselines_quote_the_nearest_run(sample_db, tmp_path):
    db = tmp_path / "c.duckdb"
    db.write_bytes(sample_db.read_bytes())
    assert cli("ingest", str(SAMPLES / "clean"), "--db", str(db))[0] == 0
    sample_db = db
    # Baselines normal, normal_repeat (identical) and clean (fewer matmuls per step). aten::mm calls
    # per rank and step: (512,128)@(128,512) normal 5, clean 3, extra_matmul 7; (512,512)@(512,128)
    # normal 8, clean 5, extra_matmul 10. The range's nearest bound is normal's: +2 and +2 per rank
    # (the mean over the three runs would say 7 - 13/3 = +2.67 and 10 - 21/3 = +3, which no run shows).
    code, out, err = cli("diff", "normal,normal_repeat,clean", "extra_matmul", "--db", str(sample_db))
    summary = out.strip().splitlines()[-1]
    assert code == 3, out + err
    assert (
        "+2 aten::mm (512,128)@(128,512) per step on every rank, "
        "+2 aten::mm (512,512)@(512,128) per step on every rank" in summary
    ), summary
    doc = json.loads(
        cli("diff", "normal,normal_repeat,clean", "extra_matmul", "--db", str(sample_db), "-f", "json")[1]
    )
    flops = next(m for m in doc["metrics"] if m["metric"] == "flops")
    # the reason names the run compared with and quotes its value: normal's 4 x 1.51 = 6.04 GFLOP
    assert flops["reason"].endswith(
        "(the baseline runs differ; compared with the nearest, normal: 6.04 GFLOP)"
    )
    mm = [s for s in doc["structure"] if s["name"] == "aten::mm"]
    assert {(s["shape"], s["base_calls"], s["cand_calls"], s["delta_calls"]) for s in mm} == {
        ("(512,128)@(128,512)", 20, 28, 8),
        ("(512,512)@(512,128)", 32, 40, 8),
    }  # 4 ranks x normal's 5 and 8
    # the baselines are not one configuration (clean: 3.42 GFLOP, normal 6.04 GFLOP per step, +77 % >
    # the 1 % threshold; clean has 20 collectives per step against 16): a note says their spread is
    # not noise alone
    mixed = [n for n in doc["notes"] if n.startswith("the baseline runs are not one configuration")]
    assert len(mixed) == 1, doc["notes"]
    assert summary.endswith("(the baseline runs are not one configuration: see the notes)"), summary
    assert "flops 3.42 GFLOP (clean) to 6.04 GFLOP (normal)" in mixed[0]
    assert "collectives 16 (normal) to 20 (clean)" in mixed[0]
    # one configuration (normal, normal_repeat): no such note
    doc = json.loads(
        cli("diff", "normal,normal_repeat", "extra_matmul", "--db", str(sample_db), "-f", "json")[1]
    )
    assert not [n for n in doc["notes"] if "not one configuration" in n]


def test_candidate_inside_the_baselines_range_has_no_base(sample_db, tmp_path):
    """FLOPs per step (job, 4 ranks): clean 4 x 0.855 = 3.42 GFLOP, normal 4 x 1.51 = 6.04,
    extra_matmul 4 x 1.78 = 7.11. normal against clean,extra_matmul lies inside the range: no one
    run is its base (before, base showed normal's own 6.04 GFLOP); outside it, the nearest run's value."""
    db = tmp_path / "c.duckdb"
    db.write_bytes(sample_db.read_bytes())
    assert cli("ingest", str(SAMPLES / "clean"), "--db", str(db))[0] == 0
    code, out, err = cli(
        "diff", "clean,extra_matmul", "normal", "--db", str(db), "--table", "metrics", "-f", "csv"
    )
    flops = next(r for r in pl.read_csv(out.encode()).iter_rows(named=True) if r["metric"] == "flops")
    assert (flops["base"], flops["cand"], flops["delta"], flops["change_pct"]) == (
        None,
        6_039_797_760,
        None,
        0,
    )
    assert flops["reason"] == "within the baselines' range 3.42-7.11 GFLOP" and flops["verdict"] == "ok"
    doc = json.loads(cli("diff", "clean,extra_matmul", "normal", "--db", str(db), "-f", "json")[1])
    flops = next(m for m in doc["metrics"] if m["metric"] == "flops")
    assert flops["base"] is None and flops["reason"] == "within the baselines' range 3.42-7.11 GFLOP"
    # extra_matmul against clean,normal: above both, compared with normal's 6.04 GFLOP: +17.8 %
    doc = json.loads(cli("diff", "clean,normal", "extra_matmul", "--db", str(db), "-f", "json")[1])
    flops = next(m for m in doc["metrics"] if m["metric"] == "flops")
    assert (flops["base"], flops["change_pct"]) == (
        6_039_797_760,
        pytest.approx(100 * 4 * 268_435_456 / 6_039_797_760),
    )
    assert "compared with the nearest, normal: 6.04 GFLOP" in flops["reason"]
    # the structural helper alone: inside [1000, 2000] no base; at a bound, that run's value
    assert structure.metric_change([1000.0, 2000.0], 1500.0) == (None, 0.0)
    assert structure.metric_change([1000.0, 2000.0], 2000.0) == (2000.0, 0.0)
    assert structure.against_text("launches", [1000.0, 2000.0], 2500.0, ["a", "b"]) == (
        "the baseline runs differ; compared with the nearest, b: 2,000"
    )


def _ranks_of(src: Path, dest: Path, ranks: tuple[int, ...]) -> Path:
    """A copy of sample run ``src`` holding only the traces of ``ranks`` (world size 4 recorded in each)."""
    import shutil

    dest.mkdir()
    for r in ranks:
        shutil.copy(src / f"rank{r}.trace.json.gz", dest)
    return dest


def test_untraced_rank_is_no_structural_change(tmp_path):
    """n3 is normal_repeat without rank 2's trace (world size 4). Every rank of the sample job does
    the same work per step: flops 1,509,949,440 per rank (6,039,797,760 / 4), so over the 3 ranks both
    runs traced, 4,529,848,320 on both sides: unchanged. Before, the job totals compared 4 ranks with
    3: normal +33.3 % against n3, a false regression (exit 3)."""
    db = tmp_path / "c.duckdb"  # a store without normal_repeat (its files would be stored already)
    n3 = _ranks_of(SAMPLES / "normal_repeat", tmp_path / "n3", (0, 1, 3))
    assert cli("ingest", str(SAMPLES / "normal"), "--db", str(db))[0] == 0
    assert cli("ingest", str(n3), "--db", str(db))[0] == 0
    for base, cand in (("n3", "normal"), ("normal", "n3")):
        code, out, err = cli("diff", base, cand, "--db", str(db), "-f", "json")
        doc = json.loads(out)
        assert code == doc["exit_code"] and code != 3 and doc["verdict"] != "regression", doc["summary"]
        m = {r["metric"]: r for r in doc["metrics"]}
        assert (m["flops"]["base"], m["flops"]["cand"]) == (3 * 1_509_949_440, 3 * 1_509_949_440)
        assert m["collectives"]["cand"] == 3 * 4  # 4 all-reduces per rank and step
        assert doc["notes"][0].startswith(
            "ranks: 'n3' has no trace of rank 2; compared on the ranks every run traced (0, 1, 3)"
        )
        assert "'n3' has no trace of rank 2" in doc["summary"]


def _typical_collective_sql(db: Path, run: str, ranks: tuple[int, ...]) -> dict[str, float]:
    """Plain SQL of the timing layer's typical collective time per rank-step (engine/timing.py, step
    2) over ``ranks`` of ``run``: per op, the sum over sizes of calls x median duration, divided by
    the ranks' steps."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            f"""WITH r AS (SELECT run_id FROM runs WHERE name = ?),
                c AS (SELECT op, coalesce(CAST(bytes_in AS VARCHAR), '') AS sig, end_ns - start_ns AS ns
                      FROM collectives WHERE run_id = (SELECT run_id FROM r) AND step IS NOT NULL
                      AND end_ns IS NOT NULL AND rank IN {ranks}),
                g AS (SELECT op, sig, count(*) AS n, median(ns) AS med FROM c GROUP BY ALL)
            SELECT op, sum(n * med) / (SELECT count(*) FROM steps WHERE run_id = (SELECT run_id FROM r)
                                       AND rank IN {ranks})
            FROM g GROUP BY op""",
            [run],
        ).fetchall()
    finally:
        con.close()
    return {op: float(v) for op, v in rows}


def test_item_timings_are_over_the_common_ranks(tmp_path):
    """n3 (normal_repeat without rank 2) against normal: the items table compared normal's typical
    all_reduce time over all 4 ranks (28,762,560 ns per rank-step by plain SQL) with n3's over 3;
    it now compares both over ranks 0, 1, 3 (normal: 28,457,694 ns) and says so."""
    db = tmp_path / "c.duckdb"
    n3 = _ranks_of(SAMPLES / "normal_repeat", tmp_path / "n3", (0, 1, 3))
    assert cli("ingest", str(SAMPLES / "normal"), "--db", str(db))[0] == 0
    assert cli("ingest", str(n3), "--db", str(db))[0] == 0
    common = _typical_collective_sql(db, "normal", (0, 1, 3))["all_reduce"]
    every = _typical_collective_sql(db, "normal", (0, 1, 2, 3))["all_reduce"]
    own = _typical_collective_sql(db, "n3", (0, 1, 3))["all_reduce"]
    assert round(common) != round(every)  # rank 2's calls move the median: the test can tell
    for base, cand, want in (("n3", "normal", (own, common)), ("normal", "n3", (common, own))):
        code, out, err = cli("diff", base, cand, "--db", str(db), "-f", "json")
        doc = json.loads(out)
        (ar,) = [i for i in doc["items"] if (i["kind"], i["name"]) == ("collective", "all_reduce")]
        assert (ar["base_ns"], ar["cand_ns"]) == tuple(round(x) for x in want)
        assert doc["notes"][0].endswith(
            "compared on the ranks every run traced (0, 1, 3) only: per-step totals are over those ranks, "
            "and so are the per-item timings (items)"
        )


def test_no_rank_traced_in_both_runs_is_inconclusive(tmp_path):
    """Ranks 0, 1 of normal_repeat against ranks 2, 3 of normal: no rank in common, so the structure
    cannot be compared: inconclusive (exit 4), not a regression and not ok."""
    db = tmp_path / "c.duckdb"  # a store without normal_repeat (its files would be stored already)
    assert (
        cli("ingest", str(_ranks_of(SAMPLES / "normal_repeat", tmp_path / "lo", (0, 1))), "--db", str(db))[0]
        == 0
    )
    assert cli("ingest", str(_ranks_of(SAMPLES / "normal", tmp_path / "hi", (2, 3))), "--db", str(db))[0] == 0
    code, out, err = cli("diff", "lo", "hi", "--db", str(db), "-f", "json")
    doc = json.loads(out)
    assert (code, doc["verdict"]) == (4, "inconclusive"), doc["summary"]
    s = [m for m in doc["metrics"] if m["layer"] == "structural"]
    assert s and all(m["verdict"] == "inconclusive" and not m["regressed"] for m in s)
    assert all(m["reason"].startswith("not gated: no rank was traced in every run") for m in s)
    assert (
        "'lo' has no trace of ranks 2, 3" in doc["notes"][0]
        and "'hi' has no trace of ranks 0, 1" in doc["notes"][0]
    )


@pytest.mark.parametrize("base, cand", [("normal", "normal_repeat"), ("normal_repeat", "normal")])
def test_unchanged_job_passes(sample_db, base, cand):
    code, out, err = cli("diff", base, cand, "--db", str(sample_db))
    assert code == 0, out + err
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith(f"OK {base} -> {cand}: no structural change; timing within thresholds")
    )


def test_diff_of_a_run_with_itself_is_refused(sample_db):
    code, out, err = cli("diff", "normal", "normal", "--db", str(sample_db))
    assert code == 1 and err.strip().splitlines()[-1].startswith(
        "error: run 'normal' is the only run of the baseline 'normal': a run is no baseline of itself"
    ), out + err


def test_inconclusive_exits_4(sample_db):
    # Structural thresholds lifted to 100 %: only the timing layer speaks, and with one baseline
    # run the +21.6 % step time and +25.9 % compute cannot be told from run-to-run variation.
    code, out, err = cli(
        "diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "flops=1", "-t", "launches=1"
    )
    assert code == EXIT_CODES["inconclusive"] == 4, out + err
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith(
            "INCONCLUSIVE normal -> extra_matmul: structure changed within "
            "thresholds: flops +17.8%, launches +5.8%; inconclusive: step_time_ns"
        )
    )
    assert "give 3+ baseline runs" in err


def test_threshold_option(sample_db):
    assert DEFAULT_THRESHOLD == 0.10
    assert (
        cli(
            "diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "flops=0.2", "-t", "launches=0.1"
        )[0]
        == 4
    )
    assert cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "flops=0.17")[0] == 3
    bad = cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "speed=0.1")
    assert bad[0] == 1 and "no such metric" in bad[2]
    bad = cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-t", "5")  # not 500 %
    assert bad[0] == 1 and "-t 5: thresholds are fractions" in bad[2]
    # 1e400 reads as inf: the message gives the value and the option as typed, not "-t inf"
    for option, value in [("-t", "1e400"), ("--threshold", "1e400"), ("--threshold", "flops=1e400")]:
        bad = cli("diff", "normal", "extra_matmul", "--db", str(sample_db), option, value)
        assert (
            bad[0] == 1
            and bad[2] == f"error: {option} {value}: thresholds are fractions in (0, 1] (0.05 = 5%)\n"
        )
    bad = cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-p", "peak_tflops=-1")
    assert bad[0] == 1 and "peak_tflops" in bad[2]


def test_csv_and_json_carry_the_items(sample_db):
    n = len(
        json.loads(cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "json")[1])["items"]
    )
    # Independent count: distinct training-thread CPU op names of either run + the one collective op.
    names = json.loads(
        cli(
            "sql",
            "SELECT count(DISTINCT e.name) AS n FROM events e JOIN (SELECT DISTINCT run_id, rank, "
            "pid, tid FROM events WHERE kind = 'step') USING (run_id, rank, pid, tid) "
            "WHERE kind = 'cpu_op'",
            "--db",
            str(sample_db),
            "-f",
            "json",
        )[1]
    )[0]["n"]
    assert n == names + 1  # json: every item, no cap
    code, out, err = cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "csv")
    assert out.startswith("metric,layer,") and f"{n} items, none shown: --table items for all" in err
    items = cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "csv", "--table", "items")[1]
    assert items.startswith("kind,name,class,base_ns") and len(items.strip().splitlines()) == n + 1
    ranks = cli("diff", "normal", "extra_matmul", "--db", str(sample_db), "-f", "csv", "--table", "ranks")[1]
    assert ranks.startswith("rank,base_ns,cand_ns") and len(ranks.strip().splitlines()) == 5


def test_baseline_sets_and_lists(sample_db, tmp_path):
    db = tmp_path / "b.duckdb"
    db.write_bytes(sample_db.read_bytes())
    assert cli("baseline", "add", "nightly", "normal", "normal_repeat", "--db", str(db))[0] == 0
    code, out, _ = cli("baseline", "list", "--db", str(db), "-f", "json")
    assert json.loads(out) == [
        {
            "name": "nightly",
            "runs": 2,
            "run_names": ["normal", "normal_repeat"],
            "added_at": json.loads(out)[0]["added_at"],
        }
    ]
    _, _, err = cli("baseline", "add", "nightly", "normal", "--db", str(db))
    assert "added nothing; already in it: normal" in err
    # a set named like a run, and an unknown run, are refused (nothing added)
    assert "is the name of a run" in cli("baseline", "add", "normal", "normal_repeat", "--db", str(db))[2]
    assert cli("baseline", "add", "other", "normal", "nope", "--db", str(db))[0] == 1
    assert (
        json.loads(cli("baseline", "--db", str(db), "-f", "json")[1])[0]["name"] == "nightly"
    )  # only one set
    # The set, and the same runs as a list: two baseline runs, the structural change exits 3.
    for spec in ("nightly", "normal,normal_repeat"):
        code, out, _ = cli("diff", spec, "extra_matmul", "--db", str(db))
        assert code == 3 and out.strip().splitlines()[-1].startswith(
            f"REGRESSION (structural) {spec} -> extra_matmul"
        )
    code, out, _ = cli(
        "diff", "nightly", "normal", "--db", str(db), "-f", "json"
    )  # the candidate is left out of its baseline
    doc = json.loads(out)
    assert (
        doc["baseline"] == "normal_repeat"
        and "is in the baseline 'nightly': left out of it" in doc["notes"][0]
    )
    assert cli("baseline", "rm", "nightly", "normal", "--db", str(db))[0] == 0
    assert json.loads(cli("baseline", "list", "--db", str(db), "-f", "json")[1])[0]["run_names"] == [
        "normal_repeat"
    ]
    assert cli("baseline", "rm", "nightly", "--db", str(db))[0] == 0
    assert json.loads(cli("baseline", "list", "--db", str(db), "-f", "json")[1]) == []
    assert "no baseline set 'nightly'" in cli("baseline", "rm", "nightly", "--db", str(db))[2]


def test_removing_a_run_removes_it_from_its_sets(store, tmp_path):
    from traceprof.storage import baselines
    from traceprof.storage.runs import remove

    ingest(store, [_micro(tmp_path / "a", False), _micro(tmp_path / "b", False)])
    baselines.add(store, "set", ["a", "b"])
    remove(store, "a")
    assert baselines.resolve(store, "set").run_ids == (store.resolve_run("b"),)
    with pytest.raises(StoreError, match="no run with name or id 'zzz'"):
        baselines.resolve(store, "b,zzz")


def test_removing_a_sets_last_run_says_so_and_diff_says_the_set_is_empty(store, tmp_path):
    # runs rm of a set's only run deleted the set silently, and `diff bs CAND` then said "no run with
    # name or id 'bs'". Now remove() says which sets it changed (still holding runs) and which it
    # emptied, and the emptied set, named, is said to be empty until `baseline add` fills it again.
    from traceprof.storage import baselines
    from traceprof.storage.runs import remove

    ingest(store, [_micro(tmp_path / n, False) for n in ("a", "b", "c")])
    baselines.add(store, "solo", ["b"])
    baselines.add(store, "pair", ["b", "c"])
    r = remove(store, "b")
    assert (r.sets_changed, r.sets_emptied) == (("pair",), ("solo",))
    assert baselines.resolve(store, "pair").run_ids == (store.resolve_run("c"),)
    with pytest.raises(
        StoreError, match=r"^baseline set 'solo' is empty: `traceprof runs rm` removed its last run, 'b'"
    ):
        diff_runs(store, "solo", "a")
    assert remove(store, "c").sets_emptied == ("pair",)
    baselines.add(store, "solo", ["a"])  # filled again: a set like any other
    assert baselines.resolve(store, "solo").run_ids == (store.resolve_run("a"),)
    with pytest.raises(StoreError, match="no run with name or id 'zzz'"):
        baselines.resolve(store, "zzz")  # never a set: as before


def test_runs_rm_names_the_sets_it_changed(sample_db, tmp_path):
    db = tmp_path / "b.duckdb"
    db.write_bytes(sample_db.read_bytes())
    assert cli("baseline", "add", "bs", "normal_repeat", "--db", str(db))[0] == 0
    assert cli("baseline", "add", "two", "normal_repeat", "normal", "--db", str(db))[0] == 0
    code, _, err = cli("runs", "rm", "normal_repeat", "--db", str(db))
    lines = err.strip().splitlines()
    assert code == 0 and lines[1:] == [
        "removed it from baseline set(s) 'two', which hold other runs",
        "warning: baseline set(s) 'bs' held only this run and are gone: `traceprof baseline add NAME RUN...` "
        "to fill one again",
    ]
    code, _, err = cli("diff", "bs", "normal", "--db", str(db))
    assert code == 1 and "baseline set 'bs' is empty" in err
    # a run renamed keeps its sets (they hold its id), and cannot take a set's name (diff NAME: ambiguous)
    assert cli("runs", "mv", "normal", "n2", "--db", str(db))[0] == 0
    doc = json.loads(cli("baseline", "list", "--db", str(db), "-f", "json")[1])
    assert [(d["name"], d["run_names"]) for d in doc] == [("two", ["n2"])]
    code, _, err = cli("runs", "mv", "extra_matmul", "two", "--db", str(db))
    assert code == 1 and "runs mv: 'two' is the name of a baseline set" in err


def test_a_set_of_runs_diff_cannot_compare_is_refused_when_made(store, tmp_path):
    # `baseline add nb control base` took runs of world size 8 and 2; only `diff nb CAND` said they
    # were not comparable. The same rule (traceprof.storage.comparable) refuses the set when it is made,
    # and when a run added later differs from the set's first; nothing is added then.
    from traceprof.storage import baselines

    ingest(
        store,
        [
            _micro(tmp_path / "w1", False),
            _micro(tmp_path / "w1b", True),
            _micro(tmp_path / "w2", False, world=2),
            _micro(tmp_path / "gpu", False, gpu=True),
        ],
    )
    with pytest.raises(UsageError, match=r"cannot compare with 'w1' \('w2': world size 1 vs 2\)"):
        baselines.add(store, "nb", ["w1", "w2"])
    assert baselines.sets(store).is_empty()
    baselines.add(store, "nb", ["w1", "w1b"])
    with pytest.raises(UsageError, match=r"'gpu': 'w1' is a CPU-only run, 'gpu' a GPU run"):
        baselines.add(store, "nb", ["gpu"])
    assert baselines.sets(store)["run_names"].to_list() == [["w1", "w1b"]]
    # diff says the same of the same runs
    with pytest.raises(UsageError, match=r"not comparable \(world size 1 vs 2\)"):
        diff_runs(store, "w1", "w2")


def test_gpu_vs_cpu_runs_exit_1(tmp_path):
    db = tmp_path / "g.duckdb"
    cli("ingest", str(SAMPLES / "normal"), str(corpus("hta/nccl_parser_config")), "--db", str(db))
    code, _, err = cli("diff", "normal", "nccl_parser_config", "--db", str(db))
    assert code == 1 and "not comparable" in err and "world size 4 vs 2" in err


def test_report_with_baseline_has_a_diff_section(sample_db, tmp_path):
    out = tmp_path / "r.html"
    code, _, err = cli(
        "report",
        "--db",
        str(sample_db),
        "--run",
        "extra_matmul",
        "--baseline",
        "normal,normal_repeat",
        "-o",
        str(out),
    )
    assert code == 0, err
    page = out.read_text()
    assert 'id="diff"' in page and "REGRESSION (structural) normal,normal_repeat -&gt; extra_matmul" in page
    assert 'class="s st-problem">problem' in page


def test_history_finds_the_structural_change(sample_db):
    code, out, err = cli(
        "history", "normal,normal_repeat,extra_matmul", "--db", str(sample_db), "-f", "json", "-m", "flops"
    )
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [(r["run"], r["change_point"], r["segment"]) for r in rows] == [
        ("normal", False, 1),
        ("normal_repeat", False, 1),
        ("extra_matmul", True, 2),
    ]
    assert rows[2]["change_pct"] == pytest.approx(100 * 268_435_456 / 1_509_949_440)
    code, out, _ = cli("history", "normal", "--db", str(sample_db), "-m", "step_time_ns")  # a name prefix
    assert code == 0 and "2 runs, in the order they were recorded" in out
    assert "no job 'zz'" in cli("history", "zz", "--db", str(sample_db))[2]


def test_the_same_diff_twice_is_the_same_output(tmp_path):
    # items with equal |delta| (the sample runs have several) came out in the order polars' group_by
    # happened to return them, and a name under two classes took either: 2 outputs over 8 runs
    from traceprof.storage.store import Store

    db = tmp_path / "d.duckdb"
    with Store(db) as store:
        for r in ("normal", "extra_matmul"):
            ingest(store, [SAMPLES / r], jobs=1)
    with Store(db, read_only=True) as store:
        outs = {
            json.dumps(diff_runs(store, "normal", "extra_matmul", {}).to_dict(), sort_keys=True)
            for _ in range(8)
        }
    assert len(outs) == 1
    doc = json.loads(outs.pop())
    keys = [(-abs(i["delta_ns"]), i["kind"], i["name"]) for i in doc["items"]]
    assert keys == sorted(keys) and len(doc["items"]) > 10


def test_a_run_is_no_baseline_of_itself(store, tmp_path):
    # `diff normal normal`, or a set holding only the candidate (a CI job that adds each nightly run to
    # the set before diffing), compared the run with itself and passed (exit 0): refused now. A set
    # holding the candidate and others leaves it out, with a note, as before.
    ingest(store, [_micro(tmp_path / "a", False), _micro(tmp_path / "b", True)])
    with pytest.raises(
        UsageError, match="run 'a' is the only run of the baseline 'a': a run is no baseline of itself"
    ):
        diff_runs(store, "a", "a")
    from traceprof.storage import baselines

    baselines.add(store, "solo", ["a"])
    with pytest.raises(UsageError, match="only run of the baseline 'solo'"):
        diff_runs(store, "solo", "a")
    baselines.add(store, "pair", ["a", "b"])
    res = diff_runs(store, "pair", "a")
    assert (
        any(n.startswith("run 'a' is in the baseline 'pair': left out of it") for n in res.notes)
        and res.frame["n_base"].max() > 0
    )


def test_structural_decreases_are_said_not_gated(store, tmp_path):
    # _micro: base "b" runs one more aten::mm per step (4x4 @ 4x4 twice and the extra shape) than
    # "a". a against b: less work, fewer launches; growth is gated, a decrease is not, and the
    # summary says so instead of calling it "within thresholds" (a dropped all-reduce would hide there).
    ingest(store, [_micro(tmp_path / "a", False), _micro(tmp_path / "b", True)])
    res = diff_runs(store, "b", "a")
    assert not res.regressed
    assert "structure shrank (decreases are not gated): flops -80.0%, launches -25.0%" in res.summary
    assert "within thresholds: flops" not in res.summary


@pytest.mark.parametrize("spec", [",,,", " , ", ",", ["", " "], []])
def test_a_baseline_list_that_names_no_run_is_said_to_be_empty(store, tmp_path, spec):
    # `diff ,,, a` resolved the list to no runs, and the gate then said "run 'a' is the only run of
    # the baseline ''", as if the candidate had been named in it: the list itself is empty
    ingest(store, [_micro(tmp_path / "a", False)])
    with pytest.raises(UsageError, match=r"^empty baseline( list)?\b") as e:
        diff_runs(store, spec, "a")
    assert "only run" not in str(
        e.value
    ) and "name a run, runs separated by commas, or a baseline set" in str(e.value)


@pytest.mark.parametrize(
    ("change", "of", "reason"),
    [
        (3.62, "", "worse by 3.6% within threshold 10%, noise 6.3%"),  # TFLOP/s 0.0249 -> 0.0240
        (-4.02, "", "better by 4.0% within threshold 10%, noise 6.3%"),
        (2.13, " of the step", "worse by 2.1% of the step within threshold 10%, noise 6.3%"),
    ],
)
def test_a_timing_reason_says_which_way_the_metric_moved(change, of, reason):
    # change_pct is the change in the bad direction: a drop of TFLOP/s is +3.6 there and -3.6 in the
    # summary line ("tflops -3.6%"); the reason said "change +3.6%", the opposite sign of the line
    from traceprof.engine import noise

    assert noise.judge(change, 6.34, 0.33, 2, 10.0, 0.01, of) == ("ok", reason)


def test_a_run_named_twice_in_a_baseline_list_is_said(store, tmp_path):
    # `diff a,a b` (or the lists ["a,a", "a"]) compared b with a single baseline run without a word:
    # the repeat was dropped silently. Counted once, with a note naming the run; once is no note.
    ingest(
        store, [_micro(tmp_path / "a", False), _micro(tmp_path / "b", True), _micro(tmp_path / "c", False)]
    )
    said = "run 'a' is named more than once in the baseline: counted once"
    for base in ("a,a", "a, c,a", ["a", "a"], ["a,c", "a"]):
        res = diff_runs(store, base, "b")
        assert [n for n in res.notes if n.startswith(said)] and res.frame["n_base"].max() > 0, base
    assert not [n for n in diff_runs(store, "a,c", "b").notes if "more than once" in n]


def test_a_rank_that_lost_a_step_is_said_and_tflops_has_three_digits(tmp_path):
    # 'lost' is sample run normal with rank 1's ProfilerStep#5 removed (its steps 4, 5, 6 -> 4, 6):
    # 11 rank-steps against 12, the same structure per step. The diff said "OK ... no structural
    # change" and nothing of the lost step; it names it (matching.missing_step_notes), in the one
    # line too, whichever side lacks it. tflops (0.0259 TFLOP/s here) read "0.03" with two places.
    import gzip
    import shutil

    from traceprof.core.display import metric_text

    lost = tmp_path / "lost"
    shutil.copytree(SAMPLES / "normal", lost)
    path = lost / "rank1.trace.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"]
    doc["traceEvents"] = [e for e in events if e.get("name") != "ProfilerStep#5"]
    assert len(doc["traceEvents"]) == len(events) - 1
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    db = tmp_path / "l.duckdb"
    assert cli("ingest", str(SAMPLES / "normal"), str(lost), "--db", str(db))[0] == 0
    note = (
        "rank 1 has no step 5 (its trace does not record it): that step is taken over the ranks that "
        "have it; its time of step 5 is counted in its step 6"
    )
    for base, cand, role in (("normal", "lost", "candidate"), ("lost", "normal", "baseline")):
        code, out, _ = cli("diff", base, cand, "--db", str(db), "-f", "json")
        res = json.loads(out)
        assert f"{role} 'lost': {note}" in res["notes"]
        assert res["summary"].endswith(f"(ranks lack steps in {role} 'lost': see the notes)")
        m = {r["metric"]: r for r in res["metrics"]}
        assert (m["step_time_ns"]["n_base"] + m["step_time_ns"]["n_cand"]) == 12 + 11
    code, out, _ = cli("diff", "normal", "lost", "--db", str(db))
    assert "ranks lack steps in candidate 'lost'" in out
    row = next(line for line in out.splitlines() if " tflops " in line)
    cells = [c.strip() for c in row.split("│")]
    tflops = m["tflops"]["cand"]  # the last diff: lost -> normal; normal's rate on both sides
    assert 0.01 <= tflops < 0.1 and cells[3:5] == [f"{tflops:.3g}", f"{tflops:.3g}"] == ["0.0259", "0.0259"]
    assert [metric_text(v, "tflops") for v in (0.0241, 0.0245, 0.0004, 0.0, 12.345, 989.0)] == [
        "0.0241",
        "0.0245",
        "0.0004",
        "0",
        "12.3",
        "989",
    ]


@pytest.mark.parametrize(
    ("change", "k", "verdict", "reason"),
    [
        # step time -33.3 %, noise 28.8 % > threshold 10 %; one noise SE worse the change is
        # -33.3 + 28.8 = -4.5 % < +10 %: no regression with two baseline runs
        (-33.3, 2, "ok", "no regression: better by 33.3%, noise 28.8%: +1 SE -4.5% < threshold 10%"),
        (-19.0, 2, "ok", "no regression: better by 19.0%, noise 28.8%: +1 SE +9.8% < threshold 10%"),
        # hta/trace_compare has one baseline run: it cannot tell the code from the machine, whichever
        # way the change goes (else a noisier comparison would get the surer verdict: -33.3 % with
        # noise 28.8 % ok, -19.1 % with noise 4.7 % inconclusive, and the verdict would flip as the
        # threshold rises)
        (-33.3, 1, "inconclusive", "noise 28.8% > threshold 10%"),
        # the other side: -18.8 + 28.8 = 10.0, not under 10 %; -5 + 28.8 = 23.8: a regression of up to
        # 23.8 % cannot be ruled out
        (-18.8, 2, "inconclusive", "noise 28.8% > threshold 10%"),
        (-5.0, 2, "inconclusive", "noise 28.8% > threshold 10%"),
        (5.0, 2, "inconclusive", "noise 28.8% > threshold 10%"),
    ],
)
def test_a_change_below_the_threshold_even_at_its_noise_floor_is_no_regression(change, k, verdict, reason):
    from traceprof.engine import noise

    assert noise.judge(change, 28.8, 0.4, k, 10.0, 0.01) == (verdict, reason)


def test_a_comma_list_may_name_a_baseline_set_among_runs(store, tmp_path):
    # `traceprof diff base,normal extra_matmul` with `base` a set said "no run with name or id 'base'";
    # a set in a comma list now stands for its runs: set s = (a, b), "s,c" -> runs a, b, c (labelled
    # "s,c"), and a run named twice that way ("s,a") is counted once and said to be repeated.
    from traceprof.storage import baselines

    ingest(store, [_micro(tmp_path / n, False) for n in ("a", "b", "c")])
    baselines.add(store, "s", ["a", "b"])
    ids = tuple(store.resolve_run(n) for n in ("a", "b", "c"))
    got = baselines.resolve(store, "s,c")
    assert (got.run_ids, got.label) == (ids, "s,c")
    again = baselines.resolve(store, "s, a")
    assert (again.run_ids, again.repeated) == (ids[:2], ("a",))


def _kernels_per_step(folder: Path, counts: list[int]) -> Path:
    """One GPU rank, one ProfilerStep of 100 us per entry of ``counts``, step i holding counts[i]
    kernels ``k`` of 2 us (stream 7) after one aten::add."""
    ev = []
    for i, n in enumerate(counts):
        s = 100 * i
        ev += [op(f"ProfilerStep#{i + 1}", s, 100, cat="user_annotation"), op("aten::add", s + 1, 2)]
        ev += [kernel("k", 7, s + 5 + 10 * j, 2, corr=1000 * i + j + 1) for j in range(n)]
    return write_run(folder, ev)


@pytest.mark.parametrize(
    "base_counts, cand_counts, layer, verdict",
    [
        # t14 D1 (corpus hta/trace_compare as `diff test base`): kernels per step 4, 1 (median 2.5)
        # against 4, 2 (median 3): +20 % > 5 % was gated as an exact +0.50 kernels per step (exit 3).
        # The counts differ between the steps of each run: noise-tested. Hand: base units 4, 1 (mean
        # 2.5, variance 1.5² x 2 / 1 = 4.5), cand 4, 2 (mean 3, variance 2); pooled within-run
        # variance (4.5 + 2) / 2 = 3.25, each run's value varies by 3.25 / 2 steps; SE =
        # sqrt(1.625 + 1.625) = 1.803 = 72.1 % of 2.5 > 5 %: inconclusive (one baseline run)
        ([4, 1], [4, 2], "timing", "inconclusive"),
        # only the candidate's steps differ: 4 -> 3 kernels, within-run SE sqrt(2 / 2) = 1 = 25 % of 4
        ([4, 4], [4, 2], "timing", "inconclusive"),
        ([2, 2], [3, 3], "structural", "regression"),  # every step agrees: exact, 2 -> 3 (+50 %)
    ],
)
def test_count_varying_between_steps_is_not_exact(store, tmp_path, base_counts, cand_counts, layer, verdict):
    ingest(
        store,
        [
            _kernels_per_step(tmp_path / "base", base_counts),
            _kernels_per_step(tmp_path / "cand", cand_counts),
        ],
    )
    res = diff_runs(store, "base", "cand")
    m = {r["metric"]: r for r in res.frame.iter_rows(named=True)}["launches"]
    assert (m["layer"], m["verdict"]) == (layer, verdict)
    assert m["base"] == pytest.approx(float(np.median(base_counts)))
    assert m["cand"] == pytest.approx(float(np.median(cand_counts)))
    assert list(res.frame["metric"][:3]) == ["launches", "collectives", "comm_bytes"]  # in its place
    if layer == "timing":
        assert not m["regressed"] and "counts differ between the steps of a run" in m["reason"]
        assert any(n.startswith("launches: the steps of ") for n in res.notes)
    if base_counts == [4, 1]:
        assert m["change_pct"] == pytest.approx(20.0)
        assert m["noise_pct"] == pytest.approx(100 * math.sqrt(3.25) / 2.5)
        assert res.exit_code == 4 and "+0.50 kernels" not in res.summary
        assert "the steps of 'base' count it differently (rank 0: 4, 1 per step)" in res.notes[-2]
