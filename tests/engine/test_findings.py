"""Findings: ranked by cost, one verdict per topic, what does not apply listed once."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl
import pytest

from tests._cli_inproc import run as cli
from tests.conftest import SAMPLES, analyze, corpus
from traceprof.core.errors import AnalysisError
from traceprof.engine.analysis import FindingsInput
from traceprof.engine.findings import _regression_cost, summarize
from traceprof.ingest.ingest import ingest


def test_regression_against_a_baseline_is_a_finding(store):
    # extra_matmul adds +17.8 % FLOPs to the same job (sample_traces/README.md): a structural regression.
    ingest(store, [SAMPLES / "normal", SAMPLES / "extra_matmul"])
    f = summarize(store, "extra_matmul", baseline="normal")
    reg = [x for x in f.findings if x.topic == "regression"]
    assert (
        len(reg) == 1 and reg[0].problem and "REGRESSION (structural) normal -> extra_matmul" in reg[0].text
    )
    assert "+2 aten::mm (512,128)@(128,512) per step on every rank" in reg[0].text  # the op that was added
    assert {v.topic: v.status for v in f.verdicts}["regression"] == "problem"
    # ranked by the time recoverable by the step account (critical_path), else by cost
    keys = [x.rank_by for x in f.findings if x.rank_by is not None]
    assert keys == sorted(keys, reverse=True)
    assert [x.rank_by is None for x in f.findings] == sorted(x.rank_by is None for x in f.findings)
    assert reg[0].recoverable_pct is None and reg[0].rank_by == reg[0].cost_pct  # no account figure: its cost
    assert {v.topic for v in f.verdicts} == {
        "stragglers",
        "communication",
        "idle",
        "utilization",
        "regression",
    }
    # CPU-only sample: no GPU kernels (nor copies: the nsys-style kernel_sum and memcpy_sum)
    assert {m.analysis for m in f.unavailable} == {"idle", "kernels", "launch", "kernel_sum", "memcpy_sum"}
    frame = f.to_frame()
    assert frame.columns == [
        "position",
        "topic",
        "cost_pct",
        "recoverable_pct",
        "problem",
        "status",
        "finding",
    ]
    assert frame.height == len(f.findings)


def test_baseline_that_cannot_be_compared_is_a_verdict_not_an_error(store):
    ingest(store, [SAMPLES / "normal", corpus("hta/nccl_parser_config")])
    f = summarize(store, "nccl_parser_config", baseline="normal")
    v = {v.topic: v for v in f.verdicts}["regression"]
    assert v.status == "n/a" and "not comparable" in v.text


def test_tf32_mfu_finding_names_precision_and_peak(store):
    ingest(store, [corpus("hta/nccl_parser_config")])
    f = summarize(store, None, params={"mfu": {"model_flops_per_step": "4e13"}})
    mfu = [x for x in f.findings if x.topic == "mfu"][0]
    assert "tf32 peak 156 TFLOP/s, A100; precision from kernels" in mfu.text


def _renamed(src, dst, old: str, new: str):
    """A copy of sample run ``src`` with op name ``old`` replaced by ``new`` in every rank's trace."""
    import gzip
    import shutil

    shutil.copytree(src, dst)
    for f in dst.glob("*.trace.json.gz"):
        f.write_bytes(gzip.compress(gzip.decompress(f.read_bytes()).replace(old.encode(), new.encode())))
    return dst


def test_long_names_shortened_in_findings(store, tmp_path):
    # The top gap cause of `normal` is "all_reduce (...) after <op>"; with a 1,347-character op
    # name the finding was a 1,542-character line. The name shortens to its family
    # (traceprof.core.names.family: no "void ", namespaces, template arguments); full text kept in `full`.
    long = "void at::native::very_long_kernel<" + ", ".join(["float"] * 200) + ">(int)"
    run = _renamed(
        SAMPLES / "normal", tmp_path / "long", "torch.distributed.ddp.reducer::copy_bucket_to_grad", long
    )
    ingest(store, [run])
    f = summarize(store, None)
    comm = [x for x in f.findings if x.topic == "communication"][0]
    # (the line without the name is about 300 characters: both medians named, the step account)
    assert "after very_long_kernel (" in comm.text and len(comm.text) < 400, comm.text
    assert long in comm.full and comm.full.replace(long, "very_long_kernel") == comm.text
    # The report: the full text (a page has the room), not the short one with the full on hover.
    from traceprof.render.report import _findings_html

    listing = _findings_html(f, []).split('<table class="verdicts">')[0]  # the verdicts keep the short text
    assert 'title="exposed communication:' not in listing and "after very_long_kernel (" not in listing
    assert "after void at::native::very_long_kernel&lt;float, float" in listing


def test_a_name_barely_over_the_width_is_whole_in_findings(store, tmp_path):
    # A 61-character op (hta/df_index_resolver's) was cut in the middle to 60, saving one character:
    # "after autograd::engine::evaluate_function: Co…iledFunctionBackward". Cut only where the short
    # form is at most half the name (the 1,347-character kernel above); here whole, in the summary
    # and the report alike.
    name = "autograd::engine::evaluate_function: CompiledFunctionBackward"
    assert len(name) == 61
    run = _renamed(
        SAMPLES / "normal", tmp_path / "n61", "torch.distributed.ddp.reducer::copy_bucket_to_grad", name
    )
    ingest(store, [run])
    f = summarize(store, None)
    comm = [x for x in f.findings if x.topic == "communication"][0]
    assert f"after {name} (" in comm.text and comm.full == "" and "…" not in comm.text
    from traceprof.render.report import _findings_html

    assert f"after {name} (" in _findings_html(f, [])


def test_straggler_own_idle_and_wait_do_not_outrank_it(store):
    # straggler_rank3: rank 3 sleeps before its all-reduces (sample_traces/README.md). Its sleep is
    # idle time and the others' wait for it is exposed communication: both are the straggler's cost.
    # By the step account (critical_path), the others' waits are credited to rank 3 (blame), idle
    # counts the other ranks' host-bound and idle time only, communication the exposed transfer
    # only (no wait): the straggler's own sleep and the waits for it recover nothing elsewhere.
    ingest(store, [SAMPLES / "straggler_rank3"])
    f = summarize(store, None)
    by = {x.topic: x for x in f.findings}
    cp = f.results["critical_path"]
    acc, total = cp.frame, cp.frame["step_ns"].sum()
    others = acc.filter(acc["rank"] != 3)
    assert (
        by["stragglers"].recoverable_pct
        == 100 * cp.frames()["blame"].filter(cp.frames()["blame"]["rank"] == 3)["waited_ns"].sum() / total
    )
    assert by["idle"].recoverable_pct == 100 * (others["host_bound_ns"] + others["idle_ns"]).sum() / total
    assert by["communication"].recoverable_pct == 100 * acc["transfer_ns"].sum() / total
    assert by["idle"].recoverable_pct < by["stragglers"].recoverable_pct
    # ranked by them: the exposed transfer (gloo all-reduces after the last arrival) is the largest
    assert [x.topic for x in f.findings] == ["communication", "stragglers", "idle", "mfu"]
    # the costs: idle is the other ranks' mean; communication the exposed time beyond the waits for
    # rank 3, wall clock (it read 0% "ok" when the per-instance sum of the waits, over the DDP
    # buckets in flight at once, was subtracted and clipped at 0)
    temporal = f.results["temporal"].frame
    assert by["idle"].cost_pct == temporal.filter(temporal["rank"] != 3)["idle_pct"].mean()
    assert (
        "mean over the ranks that are not stragglers" in by["idle"].text and "(rank 3 29%)" in by["idle"].text
    )
    comm = by["communication"]
    # Per rank, exposed communication beyond the waits for rank 3 lies between the step account's
    # transfer (the waits for ranks 0-2 count too) and all exposed communication: 10.7, 56.1, 15.3
    # and 10.5 ms of windows of 187.9, 187.3, 188.1 and 192.3 ms: 5.7, 30.0, 8.1, 5.5%, median 6.9%.
    ov = f.results["overlap"].frame.sort("rank")
    xfer = cp.frames()["ranks"].sort("rank")["transfer_ns"]
    exposed = (100 * ov["exposed_comm_ns"] / ov["window_ns"]).median()
    assert (100 * xfer / ov["window_ns"]).median() < comm.cost_pct < exposed
    assert comm.cost_pct == pytest.approx(6.9105, abs=1e-3)
    assert comm.problem and comm.status == "problem"
    assert comm.text.startswith(
        "exposed communication beyond waiting for the straggler (rank 3): 7% of the window"
    )
    assert comm.text.endswith(
        f"; step account: exposed transfer {comm.recoverable_pct:.1f}% of all ranks' step time"
    )


def test_communication_beyond_the_waits_for_the_straggler_is_the_step_accounts_transfer(store):
    # straggler_rank2: rank 2 is last at all 12 collectives, so every wait is for it, and the exposed
    # communication beyond those waits (wall clock, transfer of another bucket winning over a wait as
    # in the step account) is critical_path's transfer to the ns on every rank: 41.7, 26.7, 2.6 and
    # 27.1 ms of windows of 223.6, 219.2, 217.7 and 221.9 ms: 18.6, 12.2, 1.2 and 12.2% of the
    # window, median 12.2%: a problem (>= 5%). It read "ok ... 0%": the waits were subtracted as a
    # per-instance sum (rank 0: 386.5 ms, above its window) and clipped at 0.
    from traceprof.analyses import _waits, overlap

    ingest(store, [SAMPLES / "straggler_rank2"], run="s2")
    f = summarize(store, "s2")
    comm = {x.topic: x for x in f.findings}["communication"]
    st, ov = f.results["stragglers"], f.results["overlap"].frame
    inp = FindingsInput(f.results, {}, store, store.resolve_run("s2"), {})
    got = _waits.beyond_waits(overlap._exposed(inp), overlap._copies(st, None), [2])
    xfer = analyze(store, "critical_path", "s2").frames()["ranks"].select("rank", "transfer_ns")
    both = ov.join(got, on="rank").join(xfer, on="rank").sort("rank")
    assert both["beyond_ns"].to_list() == both["transfer_ns"].to_list()
    assert both["beyond_ns"].to_list() == [41_702_127, 26_744_317, 2_617_435, 27_147_544]
    assert comm.cost_pct == pytest.approx((100 * both["beyond_ns"] / both["window_ns"]).median())
    assert comm.cost_pct == pytest.approx(12.2155, abs=1e-3) and comm.problem and comm.status == "problem"
    assert comm.text.startswith("exposed communication beyond waiting for the straggler (rank 2): 12% of")
    # the straggler's finding says the wall-clock wait it caused: 136.9 + 113.9 + 109.7 = 360.5 ms
    # (each waiting rank's waits for it as a union), not the per-instance sum's 813.5 ms
    stf = {x.topic: x for x in f.findings}["stragglers"]
    assert "the others waited 360 ms in total (wall clock)" in stf.text
    assert stf.value == st.frame.filter(pl.col("rank") == 2)["wait_caused_ns"].item() == 360_473_152


def test_communication_beyond_the_waits_reads_its_rows_alone_once_the_frame_is_let_go(store):
    # The report builds its findings after its analyses have let go of the activity frame: the
    # exposed communication beyond the waits then reads its five columns of the comm and compute
    # rows alone and keeps nothing in the session (it read the whole frame again and kept it: the
    # report's peak on 8 ranks x 1 M events, 978-1,040 MiB), and gives the ns it gives from the frame
    # held: critical_path's transfer on straggler_rank2, as in the test above.
    from traceprof.analyses import _waits, overlap
    from traceprof.engine import session
    from traceprof.engine.activity import activity

    ingest(store, [SAMPLES / "straggler_rank2"], run="s2")
    run_id = store.resolve_run("s2")
    with session.of(store) as s:
        f = summarize(store, "s2")
        inp, st = FindingsInput(f.results, {}, store, run_id, {}), f.results["stragglers"]
        activity(store, run_id, detail=True)  # the frame held: its rows taken from it
        held = _waits.beyond_waits(overlap._exposed(inp), overlap._copies(st, None), [2]).sort("rank")
        s.let_go()
        assert s.memo is not None
        kept = set(s.memo)
        alone = _waits.beyond_waits(overlap._exposed(inp), overlap._copies(st, None), [2]).sort("rank")
        assert set(s.memo) == kept
    assert alone.equals(held)
    assert alone["beyond_ns"].to_list() == [41_702_127, 26_744_317, 2_617_435, 27_147_544]


def test_slower_than_ideal_without_a_cause_is_variability_not_a_problem(store):
    # trace_filter: what-if S = 1.086 (2 steps: no interval since v1; 1.340 before the all-reduces'
    # sizes were read from their Input Dims: the replay pools comm ops by op|group|bytes, so the
    # 78 MB and 105 MB all-reduces no longer share one ideal), but no rank is last more often
    # than chance (rank 1: 8 of 10 with 2 ranks, p = 0.055) and there is no stage or group: the
    # run's variability, said in the findings with no cost (issue 27: a problem needs a cause). Its
    # world size is 128 and only ranks 0, 1 are traced, with no process group membership
    # (pg_ranks NULL): an untraced rank may be the one they wait for, so the verdict is
    # inconclusive, not ok. The finding, the verdict, to_dict and the report say the same.
    ingest(store, [corpus("hta/trace_filter")])
    f = summarize(store, None)
    st = [x for x in f.findings if x.topic == "stragglers"][0]
    assert not st.problem and st.status == "inconclusive" and st.cost_pct is None
    # inconclusive: "not shown to straggle", never the negative claim "no straggler" (it was)
    assert st.text.startswith("not shown to straggle: the job runs 23% slower than its ideal")
    assert "no straggler" not in st.text
    # inconclusive: never "not a problem" (v1), the traced ranks' variability only
    assert "the traced ranks' variability, as far as they show" in st.text and "not a problem" not in st.text
    v = {v.topic: v for v in f.verdicts}["stragglers"]
    assert v.status == "inconclusive" and "rank(s) 2-127 not traced (no profiler trace)" in v.text
    d = f.to_dict()
    assert [x["status"] for x in d["findings"] if x["topic"] == "stragglers"] == ["inconclusive"]


def test_flight_recorder_only_run_says_nothing_costs_step_time(store):
    # A stragglers verdict exists, so the summary and the report say the same: nothing found
    # that costs step time, not "no analysis applied". (Inconclusive, not ok: rank 1's delays cost
    # 4.0 % and no noise floor was measured; test_stragglers has its figures.)
    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")])
    f = summarize(store, None)
    assert f.findings == () and {v.topic: v.status for v in f.verdicts}["stragglers"] == "inconclusive"
    assert f.empty_text == "nothing found that costs step time; the verdict per topic follows"


def test_impossible_mfu_is_never_ok(store):
    # nccl_parser_config at 4e13 FLOPs per step has a plausible MFU; 2,500x that is above 100% in
    # every step, which the inputs (FLOPs or peak) cause, not the GPU: the verdict is unknown, not ok.
    ingest(store, [corpus("hta/nccl_parser_config")])
    sane = summarize(store, None, params={"mfu": {"model_flops_per_step": "4e13"}})
    pct = sane.results["mfu"].frames()["job"]["mfu_pct"][0]
    assert 0 < pct < 100 and {v.topic: v.status for v in sane.verdicts}["utilization"] in ("ok", "problem")
    f = summarize(store, None, params={"mfu": {"model_flops_per_step": "1e17"}})
    job = f.results["mfu"].frames()["job"]["mfu_pct"][0]
    assert job > 100 and abs(job / pct - 2500) < 1e-6 * 2500
    v = {v.topic: v for v in f.verdicts}["utilization"]
    mfu = [x for x in f.findings if x.topic == "mfu"][0]
    # one verdict per topic: the finding carries the topic's n/a, not a problem of its own
    assert v.status == "n/a" and mfu.status == "n/a" and not mfu.problem and v.text == mfu.text
    assert mfu.text.startswith("MFU unknown: MFU above 100% in ") and f"MFU {job:.1f}%" in mfu.text


def test_straggler_finding_warns_when_collectives_end_before_the_last_arrival(store, tmp_path):
    # benchmarks/gen_trace.py draws each rank's timeline on its own (no rank waits for another), so
    # most rank copies of a collective end before its last rank arrives: the waits are not real.
    import subprocess
    import sys

    from tests.conftest import REPO

    out = tmp_path / "gen"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gen_trace.py"),
            str(out),
            "--ranks",
            "4",
            "--events",
            "20000",
            "--steps",
            "20",
        ],
        check=True,
        capture_output=True,
    )
    ingest(store, [out], jobs=1)
    # its ranks' timelines are drawn independently, so no rank's cause passes the noise floor
    # (traceprof.analyses._cause); with that test off (cause_alpha 1, and min_cost_pct 0 for the size
    # of the excess over the floor) ranks qualify: a straggler problem, which rests on the arrivals
    f = summarize(store, None, params={"stragglers": {"cause_alpha": "1", "min_cost_pct": "0"}})
    waits = f.results["stragglers"].frames()["waits"]
    early = int(waits["end_before_last_arrival"].sum())
    assert early / waits.height > 0.5
    named = [x for x in f.findings if x.topic == "stragglers" and x.problem]
    v = {v.topic: v for v in f.verdicts}["stragglers"]
    caveat = (
        f"caution: {early:,} of {waits.height:,} rank copies ended before their collective's last arrival"
    )
    assert named and all(caveat in x.text for x in named)
    assert v.status != "problem" or caveat in v.text
    # a real run (straggler_rank3: no copy ends early) carries no caution
    ingest(store, [SAMPLES / "straggler_rank3"])
    g = summarize(store, "straggler_rank3")
    assert not g.results["stragglers"].frames()["waits"]["end_before_last_arrival"].any()
    assert all("caution:" not in x.text for x in g.findings)


def test_one_verdict_per_topic_in_findings_verdicts_json_and_report(store):
    # straggler_rank2 with its Flight Recorder dumps: the dumps were taken moments apart (seq 35
    # still in flight on ranks 0-2, completed on 3, every earlier seq completed everywhere), so
    # desync is clean, not a problem in one place and "info" in another; rank 2 is a straggler.
    # Every finding carries its topic's verdict; the JSON, the summary lines and the report's list
    # and table all show the same status per topic.
    import re

    from traceprof.render.report import render_html

    ingest(store, [SAMPLES / "straggler_rank2"], run="s2")
    f = summarize(store, "s2")
    status = {v.topic: v.status for v in f.verdicts}
    assert status["desync"] == "ok" and status["stragglers"] == "problem"
    assert not [x for x in f.findings if x.topic == "desync"]
    verdict_topic = {"mfu": "utilization"}  # the mfu finding's verdict is the utilization topic's
    for x in f.findings:
        assert x.status == status[verdict_topic.get(x.topic, x.topic)] and x.problem == (
            x.status == "problem"
        )
    d = f.to_dict()
    assert [(x["topic"], x["status"], x["problem"]) for x in d["findings"]] == [
        (x.topic, x.status, x.problem) for x in f.findings
    ]
    assert {v["topic"]: v["status"] for v in d["verdicts"]} == status
    page = render_html(store, "s2")
    listed = re.findall(r'<li class="(problem|ok)">.*?<span class="st-[a-z]+">([a-z/]+)</span>', page)
    assert [(c, s) for c, s in listed] == [("problem" if x.problem else "ok", x.status) for x in f.findings]
    table = dict(re.findall(r'<td class="s">([a-z]+)</td><td class="s st-[a-z]+">([a-z/]+)</td>', page))
    assert table == status


def test_a_missing_rank_is_said_first_and_keeps_its_verdicts_inconclusive(store, tmp_path):
    # straggler_rank2 without rank 2's files: its Kineto traces and FR dumps say world_size 4 and
    # ranks 0, 1, 3 hold traces, so 3 of 4 ranks are traced and rank 2 is missing.
    import shutil

    from traceprof.analyses.desync import Params as DesyncParams
    from traceprof.analyses.desync import run as desync_run

    miss = tmp_path / "miss"
    miss.mkdir()
    for f in (SAMPLES / "straggler_rank2").iterdir():
        if not f.name.startswith("rank2."):
            shutil.copy(f, miss / f.name)
    ingest(store, [miss], run="miss")
    f = summarize(store, "miss")
    assert f.coverage.startswith("3 of 4 ranks traced: no trace of rank 2;")
    assert f.to_dict()["coverage"] == f.coverage
    status = {v.topic: v for v in f.verdicts}
    # seq 35 of group '0': completed by rank 3, not yet by 0 and 1, every earlier seq completed on
    # every rank with records: in flight, as the full run says (where 0, 1 and 2 are still in it),
    # not "first divergence at group '0' ... seq 35" as when rank 2's lack of records counted
    d = desync_run(store, DesyncParams(run="miss"))
    # no divergence among the ranks with records, rank 2 has none: inconclusive, as the summary says
    assert d.verdict["status"].to_list() == ["inconclusive"]
    assert d.verdict["text"].to_list() == [status["desync"].text]
    assert any(
        "seq 35 (all_reduce), the last one: still in flight on rank(s) 0, 1, completed on 3" in n
        for n in d.notes
    )
    assert status["desync"].status == "inconclusive" and "rank(s) 2 left none" in status["desync"].text
    # exposed communication: the waits for rank 2 are counted as transfer, so it is no problem on
    # this evidence; the figures stay in the text, with the reason
    comm = status["communication"]
    assert comm.status == "inconclusive"
    assert "exposed communication: " in comm.text and "% of the window on rank" in comm.text
    assert "rank(s) 2 not traced: exposed time at a collective may be waiting for them" in comm.text
    assert not [x for x in f.findings if x.topic in ("communication", "desync") and x.problem]


def test_the_full_run_keeps_its_verdicts_and_says_no_rank_is_missing(store):
    ingest(store, [SAMPLES / "straggler_rank2"], run="s2")
    f = summarize(store, "s2")
    assert f.coverage == "" and f.to_dict()["coverage"] is None
    assert {v.topic: v.status for v in f.verdicts}["desync"] == "ok"


def _copy_run(src, dest, keep) -> None:
    """Copy the files of sample run ``src`` whose names ``keep`` accepts into folder ``dest``."""
    import shutil

    dest.mkdir()
    for f in (SAMPLES / src).iterdir():
        if keep(f.name):
            shutil.copy(f, dest / f.name)


def test_an_untraced_rank_leaves_the_straggler_verdict_inconclusive_not_ok(store, tmp_path):
    # straggler_rank2 without any of rank 2's files: among ranks 0, 1, 3 rank 3 is last at 6 of 12
    # collectives (binomial p = 0.18 against chance 1/3), not named; before, "ok" while the
    # untraced rank 2 is the one the others wait for (the full run names it)
    _copy_run("straggler_rank2", tmp_path / "s3", lambda n: not n.startswith("rank2."))
    ingest(store, [tmp_path / "s3"], run="s3")
    st = {v.topic: v for v in summarize(store, "s3").verdicts}["stragglers"]
    assert st.status == "inconclusive"
    assert "rank 3 arrived last at 6 of 12 collectives" in st.text
    assert "rank(s) 2 not traced (no profiler trace): the traced ranks may be waiting for them" in st.text
    # whatif says the same: S's interval alone cannot rule a straggler out with rank 2 unseen
    from traceprof.analyses.whatif import Params as WhatifParams
    from traceprof.analyses.whatif import run as whatif_run

    notes = whatif_run(store, WhatifParams(run="s3")).notes
    # (3 steps: no interval either, and rank 2 unseen is said beside it)
    assert (
        "not shown to straggle (too few steps for an interval: 5 are needed; ranks untraced: their delays are unseen)"
        in notes[0]
    )


def _verdicts_alone_and_in_summary(db: str) -> tuple[dict, list[dict], list[dict], dict[str, list]]:
    """What each command says of one run: the summary's verdicts by topic (``summary -f json``), the
    verdict tables of ``analyze stragglers`` and ``analyze desync``, and the notes of ``analyze
    overlap`` and ``analyze gaps`` (``-f json --with-notes``)."""
    import json

    def js(*args: str):
        code, out, err = cli(*args, "--db", db, "-f", "json")
        assert code == 0, err
        return json.loads(out)

    summary = {v["topic"]: v for v in js("summary")["verdicts"]}
    notes = {a: [n["text"] for n in js("analyze", a, "--with-notes")["notes"]] for a in ("overlap", "gaps")}
    return (
        summary,
        js("analyze", "stragglers", "--table", "verdict"),
        js("analyze", "desync", "--table", "verdict"),
        notes,
    )


def test_each_analysis_alone_gives_the_summary_verdict_with_a_rank_untraced(tmp_path):
    # straggler_rank2 without rank 2's files: world size 4, rank 2 (a member of group '0') untraced.
    # The summary's verdicts are inconclusive with the reason; before, `analyze stragglers` alone
    # ended "no straggler: ... the skew is within the run's noise" (ok), `analyze desync` alone said
    # status "clean", "no desync: ...", and overlap and gaps said nothing of rank 2
    _copy_run("straggler_rank2", tmp_path / "s3", lambda n: not n.startswith("rank2."))
    db = str(tmp_path / "u.duckdb")
    assert cli("ingest", str(tmp_path / "s3"), "--db", db)[0] == 0
    summary, st, de, notes = _verdicts_alone_and_in_summary(db)
    gap = (
        "rank(s) 2 not traced (no profiler trace): the traced ranks may be waiting for them at the "
        "collectives, so a straggler among them cannot be ruled out (inconclusive)"
    )
    assert [r["status"] for r in st] == ["inconclusive"] == [summary["stragglers"]["status"]]
    assert st[0]["evidence"].startswith("not shown to straggle: rank 3 arrived last at 6 of 12 collectives")
    assert summary["stragglers"]["text"].startswith("not shown to straggle: rank 3 arrived")
    assert st[0]["evidence"].endswith("; " + gap) and summary["stragglers"]["text"].endswith("; " + gap)
    # the same evidence: the summary adds the what-if figures before the reason, said once
    own = st[0]["evidence"].removesuffix("; " + gap)
    assert summary["stragglers"]["text"].startswith(own + "; what-if S = ")
    assert summary["stragglers"]["text"].count(gap) == 1
    assert [(r["status"], r["text"]) for r in de] == [("inconclusive", summary["desync"]["text"])]
    assert de[0]["text"].startswith("no divergence among the ranks with records, but rank(s) 2 left none")
    comm = (
        "rank(s) 2 not traced: exposed time at a collective may be waiting for them (their arrival is "
        "unknown, so the wait counts as transfer), not communication to fix"
    )
    assert summary["communication"]["status"] == "inconclusive" and comm in summary["communication"]["text"]
    for a in ("overlap", "gaps"):
        assert [n for n in notes[a] if n.startswith(comm)], (a, notes[a])


def test_each_analysis_alone_gives_the_summary_verdict_with_every_rank_traced(tmp_path):
    # the whole straggler_rank2 run: rank 2 named by both commands, desync clean in both, no note
    db = str(tmp_path / "f.duckdb")
    assert cli("ingest", str(SAMPLES / "straggler_rank2"), "--db", db)[0] == 0
    summary, st, de, notes = _verdicts_alone_and_in_summary(db)
    assert [(r["rank"], r["status"]) for r in st] == [(2, "problem")]
    assert summary["stragglers"]["status"] == "problem"
    assert [r["status"] for r in de] == ["clean"] and summary["desync"]["status"] == "ok"
    assert not [n for a in notes for n in notes[a] if "not traced" in n]


def test_a_traced_straggler_stays_a_problem_with_another_rank_untraced(store, tmp_path):
    # straggler_rank2 without rank 0's files: rank 2 is still traced and still the straggler
    _copy_run("straggler_rank2", tmp_path / "s0", lambda n: not n.startswith("rank0."))
    ingest(store, [tmp_path / "s0"], run="s0")
    st = {v.topic: v for v in summarize(store, "s0").verdicts}["stragglers"]
    assert st.status == "problem" and "rank 2 (" in st.text


def test_whatif_never_says_not_straggling_with_ranks_untraced():
    import polars as pl

    from traceprof.analyses.whatif import Params as WhatifParams
    from traceprof.analyses.whatif import _notes

    frame = pl.DataFrame({"clamped": [False, False]})
    blame = pl.DataFrame(
        {"by": [], "kind": [], "group": [], "slowdown": [], "excess_alone_pct": []},
        schema={
            "by": pl.String,
            "kind": pl.String,
            "group": pl.String,
            "slowdown": pl.Float64,
            "excess_alone_pct": pl.Float64,
        },
    )
    # both intervals end at or below 1.1: every rank traced, "not straggling"; a rank untraced: its
    # delays are not in the replay, so no more than "not shown to straggle"
    raw, ci = (1.02, 1.01, 1.0, 1.02, 1.02), (1.0, 1.05, 1.0, 1.03)
    full = _notes(raw, ci, 1.0, frame, blame, WhatifParams())
    part = _notes(raw, ci, 1.0, frame, blame, WhatifParams(), True)
    assert "; not straggling by the OSDI'25 threshold" in full[0]
    assert "; not shown to straggle (ranks untraced: their delays are unseen) by" in part[0]


def test_a_rank_with_a_flight_recorder_dump_only_has_no_timeline(store, tmp_path):
    # every FR dump, the Kineto traces of ranks 0, 1, 3 only: rank 2's collectives are known (desync
    # has its records) but not its timeline, so the timeline verdicts cannot see it wait or be waited for
    _copy_run(
        "straggler_rank2",
        tmp_path / "fr",
        lambda n: n.endswith(".fr.json") or (n.endswith(".trace.json.gz") and not n.startswith("rank2.")),
    )
    res = ingest(store, [tmp_path / "fr"], run="fr")
    gap = "no profiler (Kineto/nsys) trace of rank 2 (it has a Flight Recorder dump only)"
    assert res.warnings == [f"run 'fr': {gap}"]
    f = summarize(store, "fr")
    # desync's verdict stands (ok): it is not named inconclusive (before, all three were)
    assert f.coverage == (
        gap + "; verdicts that need every rank (exposed communication, stragglers) are inconclusive where "
        "the untraced rank(s) could explain what they saw"
    )
    status = {v.topic: v for v in f.verdicts}
    assert status["communication"].status == "inconclusive"
    assert status["stragglers"].status == "inconclusive"
    assert status["desync"].status == "ok"  # rank 2's dump is there: its collectives are known
    from traceprof.analyses.whatif import Params as WhatifParams
    from traceprof.analyses.whatif import run as whatif_run

    assert "3 of 4 ranks traced: the replay covers the traced ranks only" in " ".join(
        whatif_run(store, WhatifParams(run="fr")).notes
    )


def test_regression_cost_only_from_a_significant_figure(store):
    # extra_matmul against normal, normal_repeat, clean: a structural regression (+17.8 % FLOPs), but the
    # step-time change (+33.5 %) is inconclusive (noise 28.3 % > threshold 10 %) and so is compute_ns,
    # and no item grew beyond its own noise (aten::mm +51 %, p 0.13). The finding's cost was that +33.5 %
    # ("34%", ranked first); with no significant figure it has none: "-", ranked after the measured findings.
    ingest(store, [SAMPLES / r for r in ("normal", "normal_repeat", "clean", "extra_matmul")])
    f = summarize(store, "extra_matmul", baseline="normal,normal_repeat,clean")
    reg = next(x for x in f.findings if x.topic == "regression")
    assert reg.status == "problem" and "inconclusive: step_time_ns +33.5% (noise 28.3%" in reg.text
    assert reg.cost_pct is None and reg.rank_by is None
    measured = [x for x in f.findings if x.rank_by is not None]
    assert measured and f.findings[: len(measured)] == tuple(measured)


def _gate(step_verdict: str, grew: bool) -> SimpleNamespace:
    """A diff result as the gate returns it: step time +20 % (``step_verdict``), aten::mm added
    (structure) and grown by 6 % of the step (``grew``), aten::add grown by 2 % but not changed."""
    return SimpleNamespace(
        frame=pl.DataFrame(
            {
                "metric": ["flops", "step_time_ns"],
                "delta_pct": [10.0, 20.0],
                "verdict": ["regression", step_verdict],
            }
        ),
        structure=pl.DataFrame({"kind": ["op"], "name": ["aten::mm"]}),
        items=pl.DataFrame(
            {
                "kind": ["op", "op"],
                "name": ["aten::mm", "aten::add"],
                "grew": [grew, True],
                "share_of_step_pct": [6.0, 2.0],
            }
        ),
    )


def test_regression_cost_rules():
    # a step time the gate called a regression: its change (+20 %); inconclusive: the time the changed
    # op (aten::mm) grew by beyond its noise, 6 % of the step (aten::add grew, but is no structural
    # change: not its cost); nothing of it grew: no cost
    assert _regression_cost(_gate("regression", False)) == 20.0
    assert _regression_cost(_gate("inconclusive", True)) == 6.0
    assert _regression_cost(_gate("inconclusive", False)) is None
    assert _regression_cost(_gate("ok", False)) is None


def test_slow_pipeline_stage_verdict_says_its_source_and_takes_the_waits_for_it(store):
    # pipeline_2stage (sample_traces/README.md): a 2-stage GPipe pipeline on gloo; its send / recv carry
    # no process group or sequence number, so no collective matches across ranks and `stragglers` does
    # not apply; parallelism finds stage 1 (rank 1) slow and gives the stragglers verdict. The summary
    # listed stragglers as "not available" beside that verdict, and ranked "exposed communication" first
    # (61.7 %) while the slow stage's finding, with no matched waits, recovered 0 %.
    ingest(store, [SAMPLES / "pipeline_2stage"], run="pp")
    f = summarize(store, "pp")
    v = {v.topic: v for v in f.verdicts}["stragglers"]
    assert v.status == "problem" and v.text.startswith("slow stage: pipeline stage 1 (rank 1)")
    assert v.text.endswith(
        "(from parallelism: stragglers does not apply, it needs collectives matched across 2+ ranks "
        "(Kineto or Flight Recorder traces of every rank))"
    )
    assert "stragglers" not in {m.analysis for m in f.unavailable} and "whatif" in {
        m.analysis for m in f.unavailable
    }
    # gloo's send / recv have no sequence number: each send is paired with its peer's recv by order per
    # (sender, receiver) and step (12 pairs), and waits from its arrival to the peer's. The step account
    # (critical_path) holds rank 0's waits for stage 1 (rank 1): 45,312,580 (step 4) + 18,950,730 (step 5)
    # = 64,263,310 ns, all credited to rank 1 (blame), of 62,325,551 + 42,692,273 + 57,826,583 +
    # 51,123,877 = 213,968,284 ns of step time: the slow stage's finding recovers them (30.0 %) and
    # leads; communication keeps the transfer, 10,584,361 + 1,333,739 (rank 0) + 30,619,167 +
    # 17,877,152 (rank 1) = 60,414,419 ns (28.2 %; before the pairing every exposed send / recv was
    # transfer, 132,007,628 ns, and communication led at 53.2 %).
    stage = next(x for x in f.findings if x.topic == "stragglers")
    comm = next(x for x in f.findings if x.topic == "communication")
    cp = f.results["critical_path"]
    assert cp.frame.select("rank", "step", "wait_ns", "transfer_ns").rows() == [
        (0, 4, 45_312_580, 10_584_361),
        (0, 5, 18_950_730, 1_333_739),
        (1, 4, 2_306_888, 30_619_167),
        (1, 5, 5_309_427, 17_877_152),
    ]
    assert int(cp.frame["step_ns"].sum()) == 213_968_284
    assert int(cp.frames()["blame"].filter(pl.col("rank") == 1)["waited_ns"].sum()) == 64_263_310
    assert stage.recoverable_ns == 64_263_310 and stage.recoverable_pct == pytest.approx(
        100 * 64_263_310 / 213_968_284
    )
    assert comm.recoverable_ns == 60_414_419 and comm.recoverable_pct == pytest.approx(
        100 * 60_414_419 / 213_968_284
    )
    assert comm.text.startswith(
        "exposed communication beyond point-to-point waits for the peer: 28% of the window"
    )
    assert [x.topic for x in f.findings][:3] == ["stragglers", "communication", "idle"]
    # `analyze stragglers` still does not apply, and points to what does
    with pytest.raises(
        AnalysisError, match=r"`traceprof analyze parallelism --table slow` compares a pipeline's stages$"
    ):
        analyze(store, "stragglers", "pp")


def test_communication_medians_name_their_measure(store):
    # the communication verdict gave "N% of its communication hidden; median over ranks M%" where M
    # was the median exposed share of the window, not of the hidden share: each median now names its
    # measure, both computed here from overlap's frame (median of 4 ranks: the mean of the middle two)
    ingest(store, [SAMPLES / "normal"])
    f = summarize(store, None)
    ov = f.results["overlap"].frame.sort("exposed_comm_pct")
    exposed = (ov["exposed_comm_pct"][1] + ov["exposed_comm_pct"][2]) / 2
    hidden = sorted(ov["overlap_pct"].to_list())
    text = next(v.text for v in f.verdicts if v.topic == "communication")
    assert (
        f"median over ranks: exposed {exposed:.0f}% of the window, hidden {(hidden[1] + hidden[2]) / 2:.0f}% of "
        in text
    )
    assert ov.height == 4


def test_the_fallback_straggler_verdict_keeps_an_inconclusive_status():
    """The topic's own verdict (used where the combined verdict cannot be given) read an inconclusive
    stragglers verdict as "no straggler: ..." with status ok; it now says "not shown to straggle:"
    with status inconclusive, as the combined verdict does. Whatif's S = 1.05 is at most 1.1, so the
    text adds the slowdown and no finding."""
    from traceprof.analyses._stragglers_topic import _straggler_findings

    evidence = "not shown to straggle: rank 3 arrived last at 6 of 12 collectives"
    verdict = pl.DataFrame(
        {"rank": [3], "status": ["inconclusive"], "named": [False], "evidence": [evidence]}
    )
    st = SimpleNamespace(frames=lambda: {"verdict": verdict}, frame=pl.DataFrame())
    wi = SimpleNamespace(frames=lambda: {"summary": pl.DataFrame({"slowdown": [1.05]})})
    findings, v = _straggler_findings(st, wi)  # type: ignore[arg-type]
    assert findings == [] and v is not None and v.status == "inconclusive"
    assert v.text == (
        "not shown to straggle: rank 3 arrived last at 6 of 12 collectives; what-if slowdown S = 1.05 "
        "(straggling above 1.1)"
    )
    # an ok verdict stays "no straggler:" and ok
    ok = verdict.with_columns(status=pl.lit("ok"), evidence=pl.lit("no straggler: skew within noise"))
    _, v = _straggler_findings(SimpleNamespace(frames=lambda: {"verdict": ok}, frame=pl.DataFrame()), None)  # type: ignore[arg-type]
    assert v is not None and (v.status, v.text) == ("ok", "no straggler: skew within noise")


def test_the_coverage_line_names_only_the_verdicts_left_inconclusive(store, tmp_path):
    """The t9 trial (df_index_resolver, 1 of 2 ranks traced): the Ranks line said "verdicts that
    need every rank (desync, exposed communication, stragglers) are inconclusive" while desync and
    stragglers gave no verdict at all (not available). Here sample `normal` with rank 0's files only
    (world 4): communication's verdict stands (ok), stragglers (one rank: no collective matched
    across ranks) and desync (no Flight Recorder dump) give none: none is named inconclusive, the two
    are said not available."""
    _copy_run("normal", tmp_path / "r0", lambda n: n.startswith("rank0."))
    ingest(store, [tmp_path / "r0"], run="r0")
    f = summarize(store, "r0")
    status = {v.topic: v.status for v in f.verdicts}
    assert status.get("communication") == "ok" and "stragglers" not in status and "desync" not in status
    assert f.coverage == (
        "1 of 4 ranks traced: no trace of ranks 1-3; desync and stragglers (also needing every rank): "
        "not available from this run's sources"
    )


def test_the_ranks_that_bound_next_are_of_the_kind_of_the_stragglers_fix():
    """straggler_rank2 (demo): rank 2 straggles by host gaps (whatif host kind: fix 1.12x, bound 51 %;
    rank 1 45 %, rank 3 4 %), while the blocking kind's excess is negligible (every rank's alone
    slowdown 1.000000003) yet is shared out too (rank 1 63 %, rank 0 19 %, rank 3 11 %, rank 2 7 %).
    The finding named the blocking kind's shares after the host kind's fix; it now names the ranks of
    the kind whose fix of the straggler is the larger, here host: rank 1 (45 %), rank 3 (4 %; rank 0's
    0.03 % is under the 1 % floor)."""
    from traceprof.analyses._stragglers_topic import _fix_slowdown, _other_bounds

    rows = [
        ("blocking", "0", 1.0, 18.7),
        ("blocking", "1", 1.0122, 63.1),
        ("blocking", "3", 1.0481, 11.5),
        ("blocking", "2", 1.00036, 6.7),
        ("host", "2", 1.1206, 50.9),
        ("host", "0", 1.0, 0.03),
        ("host", "1", 1.00007, 44.6),
        ("host", "3", 1.00035, 4.4),
    ]
    blame = pl.DataFrame(
        [("rank", k, g, f, b) for k, g, f, b in rows],
        schema=["by", "kind", "group", "fix_slowdown", "bound_pct"],
        orient="row",
    )
    assert _fix_slowdown(2, blame) == 1.1206
    assert _other_bounds(2, blame) == "rank 1 (45%), rank 3 (4%)"
    # a blocking straggler (rank 3's blocking fix 1.048 > its host fix 1.00035) is followed by the blocking shares
    assert _other_bounds(3, blame) == "rank 1 (63%), rank 0 (19%), rank 2 (7%)"


def test_other_bounds_says_how_many_more_ranks_bound_steps():
    """Past the first 3 ranks that bound steps, the finding says how many more (text.first_few, as
    every list of the findings): before, ``.head(3)`` dropped them unsaid. Rank 4 straggles (blocking
    fix 1.5x); ranks 0-3 bound 40, 30, 20 and 5% (each >= the 1% floor): the first 3 and "1 more"."""
    from traceprof.analyses._stragglers_topic import _other_bounds

    blame = pl.DataFrame(
        [
            ("rank", "blocking", str(g), f, b)
            for g, f, b in [(4, 1.5, 0.0), (0, 1.1, 40.0), (1, 1.05, 30.0), (2, 1.02, 20.0), (3, 1.01, 5.0)]
        ],
        schema=["by", "kind", "group", "fix_slowdown", "bound_pct"],
        orient="row",
    )
    assert _other_bounds(4, blame) == "rank 0 (40%), rank 1 (30%), rank 2 (20%) and 1 more"
    # with 3 ranks that bound, no count
    assert (
        _other_bounds(4, blame.filter(pl.col("group") != "3")) == "rank 0 (40%), rank 1 (30%), rank 2 (20%)"
    )
