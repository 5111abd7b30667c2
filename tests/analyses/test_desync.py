"""desync on the corpus gloo Flight Recorder dumps (clean) and on copies edited here, each with the
fault named in the test; expected answers follow from the edit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import CASES, analyze, case, corpus
from traceprof.core.errors import AnalysisError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

FR = "flight_recorder/gloo_cpu_4rank"
CASE = CASES / "fr_two_groups_same_pg_name"


def _copy(tmp_path: Path, edit) -> Path:
    """The corpus dumps in a new folder, ``edit(rank, doc)`` applied to each."""
    out = tmp_path / "run"
    out.mkdir()
    for r in range(4):
        doc = json.loads(corpus(f"{FR}/fr_rank{r}.json").read_text())
        edit(r, doc)
        (out / f"fr_rank{r}.json").write_text(json.dumps(doc))
    return out


def _verdict(store, folder: Path):
    ingest(store, [folder], run="run", jobs=1)
    res = analyze(store, "desync", "run")
    return res, res.verdict.row(0, named=True)


def test_corpus_gloo_dumps_are_clean(store):
    ingest(store, [corpus(FR)], run="run", jobs=1)
    res = analyze(store, "desync", "run", all=True)
    v = res.verdict.row(0, named=True)
    assert v["status"] == "clean" and v["behind"] == []
    assert v["text"] == "no desync: 17 collective(s) in 1 group(s) agree on every member"
    # 17 seqs of group "0" with members [0..3] (pg_config), each enqueued and (pg_status) completed by all.
    assert res.frame.height == 17 and set(res.frame["status"]) == {"ok"}
    assert res.frame["members"].to_list()[0] == [0, 1, 2, 3]
    assert all(r == [0, 1, 2, 3] for r in res.frame["ranks_completed"].to_list())


def test_rank_missing_the_last_collective(store, tmp_path):
    def edit(rank, doc):
        if rank == 2:  # rank 2 hangs before enqueueing seq 17: its ring and pg_status end at 16
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] != 17]
            doc["pg_status"]["0"].update(last_enqueued_collective="16", last_completed_collective="16")

    res, v = _verdict(store, _copy(tmp_path, edit))
    assert (v["status"], v["pg"], v["seq"], v["op"], v["behind"]) == ("missing", "0", 17, "barrier", [2])
    assert "rank(s) 2 never enqueued it; rank(s) 0, 1, 3 did" in v["text"]
    (row,) = res.frame.rows(named=True)
    assert (row["seq"], row["ranks_missing"], row["ranks_enqueued"]) == (17, [2], [0, 1, 3])


def test_rank_skipping_a_middle_collective_is_missing_there(store, tmp_path):
    """Rank 1 holds seq 8 and 10 but not 9 (pg_status untouched: it says 17 enqueued). Rank 1 never
    enqueued seq 9 although it has later ones: missing at 9, as collective_instances says."""

    def edit(rank, doc):
        if rank == 1:
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] != 9]

    res, v = _verdict(store, _copy(tmp_path, edit))
    assert (v["status"], v["pg"], v["seq"], v["op"], v["behind"]) == ("missing", "0", 9, "all_reduce", [1])
    assert (
        "rank(s) 1 never enqueued it (rank(s) 1 did enqueue later ones); rank(s) 0, 2, 3 did and wait "
        "for them"
    ) in v["text"]
    (row,) = res.frame.rows(named=True)
    assert (row["seq"], row["ranks_missing"], row["ranks_enqueued"]) == (9, [1], [0, 2, 3])
    (inst,) = store.sql(
        "SELECT seq, ranks_missing FROM collective_instances WHERE len(ranks_missing) > 0"
    ).rows()
    assert inst == (9, [1])


def _nothing(doc, shape):
    """A dump of a rank that ran no collective: its pg_status all -1 and, as torch writes it, an empty
    ``entries`` (pickle) or no ``entries`` key at all (JSON dump of an empty ring buffer)."""
    if shape == "no_key":
        del doc["entries"]
    else:
        doc["entries"] = []
    for st in doc["pg_status"].values():
        st.update(last_enqueued_collective="-1", last_started_collective="-1", last_completed_collective="-1")


@pytest.mark.parametrize("shape", ["empty_list", "no_key"])
def test_rank_that_recorded_nothing_leads_the_verdict(store, tmp_path, shape):
    """Rank 2's dump has no entries (it hung before its first collective): the directory ingests
    (rank 2 with 0 collectives, a warning) and desync leads with rank 2, never "no desync"."""

    def edit(rank, doc):
        if rank == 2:
            _nothing(doc, shape)

    res = ingest(store, [_copy(tmp_path, edit)], run="run", jobs=1)
    assert any("fr_rank2.json: rank 2 recorded no collective" in w for w in res.warnings)
    assert store.sql(
        "SELECT t.rank, count(c.seq) FROM traces t LEFT JOIN collectives c USING (trace_id) "
        "GROUP BY t.rank ORDER BY t.rank"
    ).rows() == [(0, 17), (1, 17), (2, 0), (3, 17)]
    d = analyze(store, "desync", "run")
    v = d.verdict.row(0, named=True)
    assert (v["status"], v["behind"], v["seq"]) == ("recorded_nothing", [2], None)
    assert v["text"] == (
        "rank(s) 2 (fr_rank2.json) recorded nothing while the others enqueued up to seq 17: a "
        "rank that hung or crashed before its first collective (or ran with "
        "TORCH_NCCL_TRACE_BUFFER_SIZE=0) is the one to look at"
    )
    # Every seq 1..17 lists rank 2 as missing (as collective_instances does).
    assert d.frame["seq"].to_list() == list(range(1, 18))
    assert set(map(tuple, d.frame["ranks_missing"].to_list())) == {(2,)}


@pytest.mark.parametrize("shape", ["empty_list", "no_key"])
def test_every_rank_recorded_nothing(store, tmp_path, shape):
    def edit(rank, doc):
        _nothing(doc, shape)

    ingest(store, [_copy(tmp_path, edit)], run="run", jobs=1)
    v = analyze(store, "desync", "run").verdict.row(0, named=True)
    assert (v["status"], v["behind"]) == ("recorded_nothing", [0, 1, 2, 3])
    assert v["text"].startswith(
        "rank(s) 0 (fr_rank0.json), 1 (fr_rank1.json), 2 (fr_rank2.json), 3 "
        "(fr_rank3.json) recorded nothing: no collective ran before the dumps"
    )


def test_rank_missing_without_pg_status(store, tmp_path):
    def edit(rank, doc):
        doc.pop("pg_status")  # completion then unknown (gloo records no times): presence only
        if rank == 0:
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] < 16]

    _, v = _verdict(store, _copy(tmp_path, edit))
    assert (v["status"], v["seq"], v["behind"]) == ("missing", 16, [0])


def test_size_mismatch(store, tmp_path):
    def edit(rank, doc):
        if rank == 3:  # seq 4 (all_reduce of 667136 floats): rank 3 passes a smaller tensor
            e = next(e for e in doc["entries"] if e["collective_seq_id"] == 4)
            e["input_sizes"] = [[1000]]

    res, v = _verdict(store, _copy(tmp_path, edit))
    assert (v["status"], v["seq"], v["op"], v["behind"]) == ("mismatch", 4, "all_reduce", [3])
    assert "size 667136 on most ranks, rank 3 1000" in v["text"]
    assert res.frame["seq"].to_list() == [4]


def test_one_against_one_is_a_tie(store, tmp_path):
    """Two ranks only (dumps of ranks 0 and 1, group members [0, 1]): rank 1 broadcasts at seq 4
    where rank 0 all-reduces. Neither is the majority: both are named, neither blamed."""
    out = _copy(tmp_path, lambda rank, doc: None)
    for r in (2, 3):
        (out / f"fr_rank{r}.json").unlink()
    for r in (0, 1):
        doc = json.loads((out / f"fr_rank{r}.json").read_text())
        for cfg in doc["pg_config"].values():
            cfg["ranks"] = "[0, 1]"
        if r == 1:
            next(e for e in doc["entries"] if e["collective_seq_id"] == 4)["profiling_name"] = (
                "gloo:broadcast"
            )
        (out / f"fr_rank{r}.json").write_text(json.dumps(doc))
    _, v = _verdict(store, out)
    assert (v["status"], v["seq"], v["behind"]) == ("mismatch", 4, [0, 1])
    assert v["text"] == (
        "first divergence at group '0' [0, 1] seq 4 (all_reduce): ranks 0 and 1 disagree on op "
        "with no majority (rank 0 all_reduce, rank 1 broadcast)"
    )


def test_wrapped_ring_buffer_is_not_missing(store, tmp_path):
    def edit(rank, doc):
        if rank == 1:  # rank 1's ring buffer wrapped: its oldest 5 entries (seq 1..5) are gone
            doc["entries"] = doc["entries"][5:]

    res, v = _verdict(store, _copy(tmp_path, edit))
    assert v["status"] == "clean" and res.frame.is_empty()
    assert "seq 1..5 not compared (ring buffer of rank(s) 1 starts at seq 6)" in " ".join(res.notes)
    r1 = res.ranks.filter(rank=1).row(0, named=True)
    assert (r1["first_seq"], r1["wrapped"], r1["last_enqueued"]) == (6, True, 17)


def test_common_range_starts_at_the_latest_first_seq(store, tmp_path):
    """Two ring buffers wrapped by different amounts: rank 1 holds seq 6..17, rank 3 seq 4..17,
    ranks 0 and 2 all of 1..17. The common range starts at the latest first-held seq, max(1, 6, 1,
    4) = 6 (not the earliest, 1, nor rank 3's 4): seqs 6..17 are compared, 12 collectives, all ok."""

    def edit(rank, doc):
        doc["entries"] = doc["entries"][{1: 5, 3: 3}.get(rank, 0) :]

    ingest(store, [_copy(tmp_path, edit)], run="run", jobs=1)
    res = analyze(store, "desync", "run", all=True)
    assert res.frame["seq"].to_list() == list(range(6, 18)) and set(res.frame["status"]) == {"ok"}
    v = res.verdict.row(0, named=True)
    assert v["status"] == "clean"
    assert v["text"].startswith("no desync: 12 collective(s) in 1 group(s) agree on every member")
    assert "seq 1..5 not compared (ring buffer of rank(s) 1 starts at seq 6)" in v["text"]
    assert res.ranks.sort("rank")["first_seq"].to_list() == [1, 6, 1, 4]


def test_wrapped_and_a_real_fault(store, tmp_path):
    def edit(rank, doc):
        if rank == 1:
            doc["entries"] = doc["entries"][5:]
        if rank == 3:  # op mismatch at seq 9: rank 3 broadcasts where the others all-reduce
            e = next(e for e in doc["entries"] if e["collective_seq_id"] == 9)
            other = "gloo:broadcast" if e["profiling_name"] != "gloo:broadcast" else "gloo:all_reduce"
            e["profiling_name"] = other

    _, v = _verdict(store, _copy(tmp_path, edit))
    assert (v["status"], v["seq"], v["behind"]) == ("mismatch", 9, [3])


def test_groups_with_the_same_name_and_not_completed(store, tmp_path):
    out = tmp_path / "case"
    shutil.copytree(case(CASE.name), out, ignore=shutil.ignore_patterns("*.md"))
    ingest(store, [out], run="clean", jobs=1)
    res = analyze(store, "desync", "clean", all=True)
    # Two groups named "0": [0, 1] and [2, 3], 3 collectives each, all completed.
    assert sorted({tuple(m) for m in res.frame["members"].to_list()}) == [(0, 1), (2, 3)]
    assert res.frame.height == 6 and res.verdict["status"][0] == "clean"
    # Rank 3's dump shows seq 3, the last, started but not completed, while rank 2 completed it and
    # seqs 1 and 2 completed on both: the dumps were taken moments apart (rank 2's copy finished,
    # rank 3's was finishing; a completed all-reduce proves both entered it): in flight, no
    # divergence (issue 27).
    doc = json.loads((out / "rank3.fr.json").read_text())
    doc["entries"][2].update(time_discovered_completed_ns=0, state="started", duration_ms=None)
    doc["pg_status"]["0"]["last_completed_collective"] = "2"
    v = _edited(tmp_path, out, "trailing", doc)
    assert (v["status"], v["behind"]) == ("clean", [])
    assert (
        "group '0' [2, 3] seq 3 (all_reduce), the last one: still in flight on rank(s) 3, completed on 2, every "
        "earlier seq completed on every member"
    ) in v["text"]
    # Rank 3 also never completed seq 2 (it started seq 3 without finishing seq 2, as an
    # asynchronous collective can): an earlier seq is behind, so this is a hang at seq 2, rank 3.
    doc["entries"][1].update(time_discovered_completed_ns=0, state="started", duration_ms=None)
    doc["pg_status"]["0"]["last_completed_collective"] = "1"
    v = _edited(tmp_path, out, "hang", doc)
    assert (v["status"], v["members"], v["seq"], v["behind"]) == ("not_completed", [2, 3], 2, [3])
    assert "completed by rank(s) 2 but not by 3" in v["text"]


def _edited(tmp_path: Path, out: Path, name: str, rank3: dict) -> dict:
    """The desync verdict of the folder ``out`` with ``rank3.fr.json`` replaced by ``rank3``."""
    bad = tmp_path / name
    shutil.copytree(out, bad)
    (bad / "rank3.fr.json").write_text(json.dumps(rank3))
    with Store(tmp_path / f"{name}.duckdb") as other:
        ingest(other, [bad], run=name, jobs=1)
        return analyze(other, "desync", name).verdict.row(0, named=True)


def test_trailing_seq_in_flight_flip_point(store, tmp_path):
    """The in-flight rule needs every earlier seq completed on every member, and the trailing seq
    completed somewhere: rank 2 of the corpus dumps never completed seq 17, the last, while ranks
    0, 1, 3 did (in flight: clean); the same with rank 2 also short of seq 16 is a hang at 16."""

    def edit(last_completed: int):
        def apply(rank, doc):
            if rank == 2:
                doc["pg_status"]["0"].update(last_completed_collective=str(last_completed))

        return apply

    _, v = _verdict(store, _copy(tmp_path, edit(16)))
    assert (v["status"], v["behind"]) == ("clean", [])
    assert "seq 17 (barrier), the last one: still in flight on rank(s) 2, completed on 0, 1, 3" in v["text"]
    (tmp_path / "h").mkdir()
    with Store(tmp_path / "h.duckdb") as other:
        _, v = _verdict(other, _copy(tmp_path / "h", edit(15)))
    assert (v["status"], v["seq"], v["behind"]) == ("not_completed", 16, [2])


def test_needs_sequence_numbers(store):
    # CPU Kineto samples: gloo annotations carry no process group or Seq.
    ingest(store, [Path(__file__).resolve().parents[2] / "sample_traces" / "normal"], run="k", jobs=1)
    with pytest.raises(AnalysisError, match="no collectives with a process group and sequence number"):
        analyze(store, "desync", "k")


def test_wrapped_ring_buffer_is_not_missing_in_matching(store, tmp_path):
    # Rank 1 holds seq 6..17 only: instances 1..5 hold ranks 0, 2, 3 and miss nobody; 6..17 hold all four.
    def edit(rank, doc):
        if rank == 1:
            doc["entries"] = doc["entries"][5:]

    res = ingest(store, [_copy(tmp_path, edit)], run="w")
    assert not any("miss some ranks" in w for w in res.warnings)
    inst = store.sql("SELECT seq, ranks_present, ranks_missing FROM collective_instances ORDER BY seq")
    assert inst["ranks_missing"].list.len().sum() == 0
    assert inst.filter(inst["seq"] <= 5)["ranks_present"].to_list() == [[0, 2, 3]] * 5


def test_summary_and_report_carry_the_desync_verdict(store, tmp_path):
    """FR-only run with rank 1 skipping seq 9: the summary lists desync's verdict as a problem
    finding and verdict; the report links it to a desync section. The clean corpus: verdict ok."""
    from traceprof.engine import findings
    from traceprof.render.report import render_html

    def edit(rank, doc):
        if rank == 1:
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] != 9]

    ingest(store, [_copy(tmp_path, edit)], run="run", jobs=1)
    f = findings.summarize(store, "run")
    text = analyze(store, "desync", "run").verdict["text"][0]
    assert [(x.topic, x.text, x.problem, x.section) for x in f.findings if x.topic == "desync"] == [
        ("desync", text, True, "desync")
    ]
    assert [(v.status, v.text) for v in f.verdicts if v.topic == "desync"] == [("problem", text)]
    html = render_html(store, "run")
    assert 'id="desync"' in html and 'href="#desync"' in html
    ingest(store, [corpus(FR)], run="clean", jobs=1)
    clean = findings.summarize(store, "clean")
    assert [x for x in clean.findings if x.topic == "desync"] == []
    assert [v.status for v in clean.verdicts if v.topic == "desync"] == ["ok"]


SPARSE = 10**9  # seq k of the corpus dumps becomes k * 10**9: NDTimeline-like numbering, 17 seqs over 1.6e10


def _sparse(tmp_path: Path, drop: tuple[int, int] | None = None) -> Path:
    """The corpus dumps with every seq k renumbered k * SPARSE and no pg_status (NDTimeline has no
    progress); ``drop`` = (rank, k) removes that rank's entry of seq k."""

    def edit(rank, doc):
        doc["entries"] = [e for e in doc["entries"] if drop is None or (rank, e["collective_seq_id"]) != drop]
        for e in doc["entries"]:
            e["collective_seq_id"] *= SPARSE
        doc.pop("pg_status", None)

    return _copy(tmp_path, edit)


def test_sparse_seqs_are_not_missing(store, tmp_path):
    """Seqs 1e9, 2e9, ..., 17e9 held by all 4 ranks: 17 collectives compared (not the 1.6e10 numbers
    between, which the old walk over range(first, last) stepped through: it never finished), all ok;
    no rank wrapped (each starts at 1e9, as the others do)."""
    ingest(store, [_sparse(tmp_path)], run="run", jobs=1)
    res = analyze(store, "desync", "run", all=True)
    v = res.verdict.row(0, named=True)
    assert (v["status"], v["behind"]) == ("clean", [])
    assert v["text"] == "no desync: 17 collective(s) in 1 group(s) agree on every member"
    assert res.frame["seq"].to_list() == [k * SPARSE for k in range(1, 18)]
    assert set(res.frame["status"]) == {"ok"}
    assert res.ranks["first_seq"].to_list() == [SPARSE] * 4 and not any(res.ranks["wrapped"])


def test_sparse_seq_one_rank_lacks_is_missing(store, tmp_path):
    """Rank 1 lacks seq 9e9, which ranks 0, 2, 3 hold: missing there, behind [1] (a hole: rank 1
    holds 10e9 and later). The numbers nobody holds (9e9 + 1, ...) are no collective: the only
    divergent row is 9e9."""
    res, v = _verdict(store, _sparse(tmp_path, drop=(1, 9)))
    assert (v["status"], v["seq"], v["op"], v["behind"]) == ("missing", 9 * SPARSE, "all_reduce", [1])
    (row,) = res.frame.rows(named=True)
    assert (row["seq"], row["ranks_missing"], row["ranks_enqueued"]) == (9 * SPARSE, [1], [0, 2, 3])


def test_ndtimeline_runs_finish_clean(store):
    """The bytedance NDTimeline runs (seqs 16e6..1.24e9, 44 or 1408 per group) finish and find no
    desync: the gaps between seqs are numbering, and a pipeline group's send/recv pair is p2p.
    trace-AR holds 16 workers for its 64 ranks and trace-SE 64 for 128: NDTimeline collapses each
    tensor-parallel group (tp 4; tp 1 x dsp 2) into one worker, so no rank is untraced and nothing
    can be behind unseen: clean, as trace-ST (8 workers, 8 ranks). (They were inconclusive while the
    collapsed ranks counted as untraced: "but rank(s) 1, 2, 3, ... may be behind".)"""
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif")], jobs=1)
    for run in ("trace-ST", "trace-AR", "trace-SE"):
        v = analyze(store, "desync", run).verdict.row(0, named=True)
        assert (run, v["status"], v["source"]) == (run, "clean", "ndtimeline")
        assert "but rank(s)" not in v["text"]
        assert "no desync: " in v["text"] and "collective(s) in" in v["text"]


def _rejected_seq4(tmp_path: Path, also=None) -> Path:
    """The corpus gloo dumps with rank 1's seq 4 entry (all_reduce) given time_created_ns -5 and
    rank 2's seq 5 entry (broadcast) a collective_seq_id of 2**80 (the trial's fr_bad): ingest with
    --skip-bad-events rejects both records (pg_status is untouched: every rank enqueued 17)."""

    def edit(rank, doc):
        for e in doc["entries"]:
            if rank == 1 and e["collective_seq_id"] == 4:
                e["time_created_ns"] = -5
            if rank == 2 and e["collective_seq_id"] == 5:
                e["collective_seq_id"] = 2**80
        if also is not None:
            also(rank, doc)

    return _copy(tmp_path, edit)


def test_a_record_rejected_at_ingest_is_unknown_not_never_enqueued(store, tmp_path):
    """Before: "desync problem: ... seq 4 (all_reduce): rank(s) 1 never enqueued it" (rank 1 did:
    ingest rejected its record). Now seq 4 is unknown on rank 1 and seq 5 on rank 2 (each lost one
    record, and holds seqs before and after it), nothing else diverges: the verdict is inconclusive."""
    ingest(store, [_rejected_seq4(tmp_path)], run="run", jobs=1, on_bad_event="skip")
    res = analyze(store, "desync", "run")
    v = res.verdict.row(0, named=True)
    assert (v["status"], v["seq"], v["behind"]) == ("inconclusive", None, [])
    assert v["text"] == (
        "unknown (record rejected at ingest): group '0' seq 4 (all_reduce) on rank(s) 1; group '0' seq 5 "
        "(broadcast) on rank(s) 2; those ranks hold no record of them because ingest rejected some of "
        "theirs (rank 1: 1 negative 'time_created_ns'; rank 2: 1 'collective_seq_id' beyond int64), so "
        "whether they enqueued them is unknown"
    )
    rows = res.frame.select("seq", "status", "ranks_missing", "ranks_unknown", "ranks_enqueued").rows()
    assert rows == [(4, "unknown", [], [1], [0, 2, 3]), (5, "unknown", [], [2], [0, 1, 3])]


def test_a_rejected_record_does_not_hide_a_real_divergence(store, tmp_path):
    """Rank 3 also drops seq 9 outright (no record rejected on rank 3): seq 9 is still missing on
    rank 3 (the verdict), and the rejected seqs 4 and 5 are a note, not divergences."""

    def drop9(rank, doc):
        if rank == 3:
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] != 9]

    ingest(store, [_rejected_seq4(tmp_path, drop9)], run="run", jobs=1, on_bad_event="skip")
    res = analyze(store, "desync", "run")
    v = res.verdict.row(0, named=True)
    assert (v["status"], v["seq"], v["behind"]) == ("missing", 9, [3])
    assert any(n.startswith("unknown (record rejected at ingest): group '0' seq 4") for n in res.notes)
    assert res.frame.select("seq", "status").rows() == [(4, "unknown"), (5, "unknown"), (9, "missing")]


def test_progress_still_tells_a_hang_on_a_rank_that_lost_a_record(store, tmp_path):
    """Rank 2 lost its seq 5 record at ingest (2**80) and hangs before seq 17 (entries and
    pg_status end at 16): pg_status counts what was rejected too, so seq 17 is still missing on
    rank 2 (the verdict), while its seq 5 is unknown, not a divergence."""

    def hang(rank, doc):
        if rank == 2:
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] != 17]
            doc["pg_status"]["0"].update(last_enqueued_collective="16", last_completed_collective="16")

    ingest(store, [_rejected_seq4(tmp_path, hang)], run="run", jobs=1, on_bad_event="skip")
    res = analyze(store, "desync", "run")
    v = res.verdict.row(0, named=True)
    assert (v["status"], v["seq"], v["behind"]) == ("missing", 17, [2])
    assert res.frame.select("seq", "status", "ranks_unknown").rows() == [
        (4, "unknown", [1]),
        (5, "unknown", [2]),
        (17, "missing", []),
    ]
