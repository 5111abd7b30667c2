"""History of a job: change points and noise bands worked by hand."""

from __future__ import annotations

import math

import pytest

from tests.builders import cause_run, memory_gate_run, memory_op, memory_trace, step
from traceprof.core.errors import StoreError, UsageError
from traceprof.engine import noise
from traceprof.engine.history import change_points, history, job_runs
from traceprof.ingest.ingest import ingest


def test_change_points_by_hand():
    # A step from 10 to 20 after four runs: split at 4, both sides without spread, means differ
    # (p = 0); each side alone has no further split. A series without a change has none.
    assert change_points([10, 10, 10, 10, 20, 20, 20, 20], 0.01) == [4]
    assert change_points([10, 11, 10, 11, 20, 21, 20, 21], 0.01) == [4]
    assert change_points([10.0] * 8, 0.01) == []
    # One outlier is not a change (2+ runs on each side): split at 3 compares 10, 10, 10 with 30,
    # 10, 10: means 10 and 16.67, variances 0 and 133.3, SE² = 133.3 / 3, t = 6.67 / 6.67 = 1.0 on
    # Welch's df = 2: two-sided p = 1 - 2 x (1/2 + 1 / (2 sqrt 3)) ... = 0.42, far above 0.01 / 3.
    assert change_points([10, 10, 10, 30, 10, 10], 0.01) == []
    # Bonferroni: with n runs there are n - 3 splits; two clear segments of 3 are found at 3.
    assert change_points([10, 10.1, 9.9, 14, 14.1, 13.9], 0.01) == [3]


def test_noise_band_and_drift_by_hand(store, tmp_path):
    # Five runs, per step: aten::mm 10 us, aten::relu r, aten::gelu 5 (the same in both steps), so
    # compute (typical per step) = 15 + r: 25, 26, 24, 25, then 55 (r = 40).
    runs = [cause_run(tmp_path / f"job_{i}", r, 5) for i, r in enumerate((10, 11, 9, 10, 40))]
    ingest(store, runs)
    assert [
        store.sql(f"SELECT name FROM runs WHERE run_id = {i}")["name"][0] for i in job_runs(store, "job_")
    ] == [f"job_{i}" for i in range(5)]
    h = history(store, "job_")
    c = {r["run"]: r for r in h.frame.filter(h.frame["metric"] == "compute_ns").iter_rows(named=True)}
    assert [c[f"job_{i}"]["value"] for i in range(5)] == [25_000, 26_000, 24_000, 25_000, 55_000]
    assert (
        c["job_0"]["band_lo"] is None and c["job_1"]["band_lo"] is None
    )  # no run-to-run spread before the third run
    # job_3 against job_0..2: mean 25 us, s_b = 1 us, SE = sqrt(1 + 3/9) = 1.1547 us on 2 df;
    # band = 25 ± t(0.995, 2) x SE = 25 ± 9.925 x 1.1547 = 25 ± 11.46 us: inside.
    half = noise.t_ppf(0.995, 2) * math.sqrt(4 / 3) * 1000
    assert (c["job_3"]["band_lo"], c["job_3"]["band_hi"]) == (
        round(25_000 - half),
        round(25_000 + half),
    )  # whole ns
    assert not c["job_3"]["outside"]
    # job_4 against job_0..3: mean 25, s_b = sqrt(2/3), SE = s_b sqrt(1 + 1/4) = 0.9129 us on 3 df:
    # band 25 ± 5.841 x 0.9129 = 25 ± 5.33 us; 55 is outside (+120 %): drift. One run after it
    # cannot make a change point (2+ runs a side).
    half = noise.t_ppf(0.995, 3) * math.sqrt(2 / 3) * math.sqrt(5 / 4) * 1000
    assert c["job_4"]["band_hi"] == round(25_000 + half) and c["job_4"]["outside"]
    assert c["job_4"]["change_pct"] == pytest.approx(120.0) and not c["job_4"]["change_point"]
    # idle drops with it (relu [20, 60] fills the gap before gelu: 45 - r = 5 us, was 34-36)
    assert "outside the noise band of the runs before: job_4 compute_ns, job_4 idle_ns" in h.notes
    flops = h.frame.filter(h.frame["metric"] == "flops")
    assert flops["value"].unique().to_list() == [128.0] and not flops["change_point"].any()  # one mm: 2*4*4*4
    # only compute_ns: its rows, and notes of it alone (idle's drift is no longer said)
    only = history(store, "job_", metrics=["compute_ns"])
    assert set(only.frame["metric"]) == {"compute_ns"} and only.frame.height == 5
    assert "outside the noise band of the runs before: job_4 compute_ns" in only.notes
    assert not [n for n in only.notes if "idle_ns" in n]
    with pytest.raises(UsageError, match="--metric 'nosuch': the job has metrics "):
        history(store, "job_", metrics=["nosuch"])


def test_job_not_found_and_bad_window(store, tmp_path):
    ingest(store, [cause_run(tmp_path / "a", 10, 5)])
    with pytest.raises(StoreError, match="no job 'zz'"):
        history(store, "zz")
    with pytest.raises(UsageError, match="--window 0"):
        history(store, "a", window=0)
    # one earlier run shows no run-to-run spread: a window of 1 could never give a band
    with pytest.raises(
        UsageError, match=r"--window 1: must be at least 2 \(a noise band needs 2\+ earlier runs\)"
    ):
        history(store, "a", window=1)


def test_diff_rates_on_micro_runs(store, tmp_path):
    # Four healthy runs (relu 10, 11, 9, 10 us per step; compute 25, 26, 24, 25 us; the same ops
    # and step times) and one with an extra aten::mm per step (_micro-like: +1 leaf mm [4,4]x[4,4],
    # FLOPs 128 -> 256 per step). A/A: 12 ordered pairs with one baseline, 4 with three (each run
    # against the other three): no regression. Within-run spread is 0 and the compute changes are
    # at most 26/24 = +8.3 % < 10 %, so each single-baseline diff is ok; with three baselines the
    # noise is at most sqrt(1 + 1/3) us = 4.7 % of 24.67 us: ok too. The injected run is a
    # structural regression against every baseline (4 + 4), naming aten::mm.
    from tests.builders import op, write_run
    from traceprof.engine.diffcal import diff_rates

    healthy = [cause_run(tmp_path / f"h{i}", r, 5) for i, r in enumerate((10, 11, 9, 10))]
    ev = []
    for s in (0, 100):
        ev += [
            op(f"ProfilerStep#{1 + s // 100}", s, 100, cat="user_annotation"),
            op("aten::mm", s + 5, 10, [[4, 4], [4, 4]]),
            op("aten::mm", s + 16, 3, [[4, 4], [4, 4]]),
            op("aten::relu", s + 20, 10, [[4, 4]]),
            op("aten::gelu", s + 60, 5, [[4, 4]]),
        ]
    ingest(store, [*healthy, write_run(tmp_path / "x", ev)])
    r = diff_rates(store, [f"h{i}" for i in range(4)], ["x"], sizes=(1, 3))
    rates = {(row["kind"], row["k"], row["candidate"]): row for row in r.rates.iter_rows(named=True)}
    assert (rates[("healthy", 1, "(all)")]["diffs"], rates[("healthy", 1, "(all)")]["ok"]) == (12, 12)
    assert (rates[("healthy", 3, "(all)")]["diffs"], rates[("healthy", 3, "(all)")]["ok"]) == (4, 4)
    for k in (1, 3):
        x = rates[("injected", k, "x")]
        assert x["diffs"] == 4 and x["regression"] == 4 and x["named_pct"] == 100.0
    assert r.diffs.filter(r.diffs["kind"] == "injected")["summary"][0].startswith(
        "REGRESSION (structural) h0 -> x: flops +100.0% per step (> 1%): +1 aten::mm (4,4)@(4,4) per step on rank 0"
    )
    with pytest.raises(UsageError, match="baselines of 3 need at least 4"):
        diff_rates(store, ["h0", "h1", "h2"], sizes=(3,))


# --- peak memory, as the diff gate has it ---------------------------------------------------------


def _memory_rows(h) -> dict[str, dict]:
    return {r["run"]: r for r in h.frame.filter(h.frame["metric"] == "peak_mem_bytes").iter_rows(named=True)}


def test_peak_memory_deterministic_is_exact(store, tmp_path):
    # tests.builders.memory_gate_run: each step peaks at 512 + 4,096 = 4,608 bytes; mem_3 and mem_4
    # allocate 1,024 more in aten::cat: 5,632. Every run repeats its peak in both steps to the
    # byte (deterministic, diff's rule), so the metric is exact, as a structural one: a change
    # point where the value changes (order 4, +1,024 / 4,608 = +22.2 % against the runs before),
    # bands = zero-width at the value of the 2+ equal runs before (t14 D4): mem_2 from mem_0..1;
    # mem_3 from mem_0..2 (4,608), which it breaks: outside; mem_1 and mem_4 have one earlier run
    # of their segment: no band.
    for i, extra in enumerate((0, 0, 0, 1024, 1024)):
        ingest(store, [memory_gate_run(tmp_path / f"mem_{i}", extra)], run=f"mem_{i}")
    h = history(store, "mem_")
    m = _memory_rows(h)
    assert [m[f"mem_{i}"]["value"] for i in range(5)] == [4608, 4608, 4608, 5632, 5632]
    assert {r["layer"] for r in m.values()} == {"structural"}
    assert [m[f"mem_{i}"]["change_point"] for i in range(5)] == [False, False, False, True, False]
    assert m["mem_3"]["change_pct"] == pytest.approx(100 * 1024 / 4608) and m["mem_3"]["segment"] == 2
    assert (m["mem_1"]["band_lo"], m["mem_1"]["band_hi"]) == (None, None)
    assert (m["mem_2"]["band_lo"], m["mem_2"]["band_hi"], m["mem_2"]["outside"]) == (4608, 4608, False)
    assert (m["mem_3"]["band_lo"], m["mem_3"]["band_hi"], m["mem_3"]["outside"]) == (4608, 4608, True)
    assert (m["mem_4"]["band_lo"], m["mem_4"]["band_hi"], m["mem_4"]["outside"]) == (None, None, False)
    assert any(n.startswith("peak_mem_bytes: allocations are deterministic") for n in h.notes)
    assert "change point: peak_mem_bytes from run 'mem_3' (order 4) (+22.2% vs the runs before)" in h.notes


def test_peak_memory_that_varies_gets_noise_bands(store, tmp_path):
    # Step 2 allocates ``jitter`` bytes more: runs 200, 0, 200 give per-step peaks [4608, 4808],
    # [4608, 4608], [4608, 4808] and values 4808, 4608, 4808; mem_0 and mem_2 do not repeat their
    # peak: not deterministic, so a timing metric. Band of mem_2 from mem_0, mem_1 (traceprof.engine.noise):
    # between-run variance s_b² = var(4808, 4608) = 20,000; within-run pooled w² = (20,000 + 0 +
    # 20,000) / 3 df; each run's variance max(s_b², w² / 2) = 20,000; SE² = 20,000 + 2 x 20,000 / 4
    # = 30,000 on k - 1 = 1 df; band = 4,708 ± t(0.995, 1) x sqrt(30,000) = 4,708 ± 11,026: it would
    # reach 0 (bounds nothing), so no band, and a note says why.
    for i, jitter in enumerate((200, 0, 200)):
        ingest(store, [memory_gate_run(tmp_path / f"mem_{i}", jitter=jitter)], run=f"mem_{i}")
    h = history(store, "mem_")
    m = _memory_rows(h)
    assert [m[f"mem_{i}"]["value"] for i in range(3)] == [4808, 4608, 4808]
    assert {r["layer"] for r in m.values()} == {"timing"}
    assert m["mem_1"]["band_lo"] is None  # one earlier run shows no run-to-run spread
    half = noise.t_ppf(0.995, 1) * math.sqrt(30_000)
    assert half == pytest.approx(11_026, abs=1) and half > 4708
    assert m["mem_2"]["band_lo"] is None and m["mem_2"]["band_hi"] is None and not m["mem_2"]["outside"]
    wide = [n for n in h.notes if n.startswith("no noise band for")]
    assert len(wide) == 1 and "(first: mem_2 " in wide[0] and "t = 63.7 standard errors" in wide[0]
    # its own noise: the sample std of [4608, 4808], 141.4, over sqrt(2 steps) = 100 bytes of 4,808
    assert m["mem_2"]["noise_pct"] == pytest.approx(100 * 100 / 4808)
    assert any(n.startswith("peak_mem_bytes: peaks differ between the steps") for n in h.notes)


def test_peak_memory_left_out_when_some_runs_have_none(store, tmp_path):
    ingest(store, [memory_gate_run(tmp_path / "mem_0")], run="mem_0")
    (tmp_path / "mem_1").mkdir()
    ingest(
        store,
        [memory_trace(tmp_path / "mem_1" / "rank0.json.gz", [step(1, 0, 100), memory_op("aten::mm", 10, 5)])],
        run="mem_1",
    )
    h = history(store, "mem_")
    assert (
        not _memory_rows(h)
        and "peak_mem_bytes not shown: only 1 of 2 runs recorded memory (profile_memory=True)" in h.notes
    )


def _mm_run(folder, mms: list[int]):
    """One rank, one ProfilerStep of 100 us per entry of ``mms``, step i holding mms[i] aten::mm
    [4,4]x[4,4] (2 x 4 x 4 x 4 = 128 FLOPs each) of 2 us."""
    from tests.builders import op, write_run

    ev = []
    for i, n in enumerate(mms):
        ev.append(op(f"ProfilerStep#{i + 1}", 100 * i, 100, cat="user_annotation"))
        ev += [op("aten::mm", 100 * i + 5 + 10 * j, 2, [[4, 4], [4, 4]]) for j in range(n)]
    return write_run(folder, ev)


def test_structural_band_from_the_equal_runs_before(store, tmp_path):
    # t14 D4 (sample_traces: normal, normal_repeat, straggler_rank3 at 6,039,797,760 FLOPs per step,
    # then extra_matmul at 7,113,539,584): the run that broke three equal runs had no band and was
    # not outside. Here 1, 1, 1, then 2 mm per step: FLOPs 128, 128, 128, 256. Band of run 3 from
    # runs 1-2: [128, 128]; of run 4 from runs 1-3: [128, 128], 256 outside (a change point too,
    # +100 %); run 2 has one earlier run: no band; so has run 5 in its segment (256 after 256).
    for i, n in enumerate((1, 1, 1, 2, 2)):
        ingest(store, [_mm_run(tmp_path / f"s_{i}", [n, n])], run=f"s_{i}")
    h = history(store, "s_", metrics=["flops"])
    rows = h.frame.sort("order").to_dicts()
    assert [r["value"] for r in rows] == [128, 128, 128, 256, 256]
    assert [(r["band_lo"], r["band_hi"]) for r in rows] == [
        (None, None),
        (None, None),
        (128, 128),
        (128, 128),
        (None, None),
    ]
    assert [r["outside"] for r in rows] == [False, False, False, True, False]
    assert [r["change_point"] for r in rows] == [False, False, False, True, False]
    assert {r["layer"] for r in rows} == {"structural"}


def test_structural_count_varying_between_steps_is_a_timing_metric(store, tmp_path):
    # t14 D1's rule in history: s_1 runs 1 mm in step 1 and 2 in step 2 (FLOPs 128, 256: median 192),
    # so FLOPs per step is no exact count in the job: noise bands and change points as a timing metric
    # (no change point from one value that differs), with a note.
    for i, mms in enumerate(([1, 1], [1, 2], [1, 1])):
        ingest(store, [_mm_run(tmp_path / f"v_{i}", mms)], run=f"v_{i}")
    h = history(store, "v_", metrics=["flops"])
    rows = h.frame.sort("order").to_dicts()
    assert [r["value"] for r in rows] == [128, 192, 128]
    assert {r["layer"] for r in rows} == {"timing"} and not any(r["change_point"] for r in rows)
    # its own noise, v_1: std(128, 256) = 90.51 over sqrt(2 steps) = 64 FLOPs of 192
    assert rows[1]["noise_pct"] == pytest.approx(100 * 64 / 192)
    assert any(n.startswith("flops: counted differently in two steps of a rank") for n in h.notes)
