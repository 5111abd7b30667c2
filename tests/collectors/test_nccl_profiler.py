"""NCCL profiler-plugin (example) dumps: a fixture written here in the plugin's published format from
the Kineto traces of a 2-rank run (shared case clock_offset_3ms), with the plugin's own clock."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CASES, analyze, case
from traceprof.collectors.nccl_profiler.parse import parse
from traceprof.core.errors import AnalysisError, TraceFormatError
from traceprof.core.parsed import ParseOptions
from traceprof.ingest import sources
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

CASE = CASES / "clock_offset_3ms"
COMM = 6732458103728113409
#: The plugin's clock origin on each rank (epoch ns when the plugin started in that process): any value.
ORIGIN = {0: 1767225600000000000 + 2_500_000_017, 1: 1767225600000000000 + 1_250_000_000}


def _kineto_colls(rank: int) -> list[tuple[int, int, int]]:
    """(launch ns, kernel end ns, elements) of rank's NCCL kernels, from the Kineto JSON itself."""
    doc = json.loads((case(CASE.name) / f"rank{rank}.json").read_text())
    base = doc["baseTimeNanoseconds"]
    launch = {e["args"]["correlation"]: e["ts"] for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"}
    out = [
        (
            base + round(launch[e["args"]["correlation"]] * 1000),
            base + round((e["ts"] + e["dur"]) * 1000),
            e["args"]["In msg nelems"],
        )
        for e in doc["traceEvents"]
        if e.get("cat") == "kernel" and "nccl" in e["name"]
    ]
    return sorted(out)


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _plugin_dump(rank: int) -> str:
    """The example plugin's output for rank: one group with one AllReduce (and a proxy op) per
    collective, begin = the launch call, end = the kernel end, on the plugin clock; Datatype as a
    bare token (a real plugin bug), closed by the plugin's ``{}]``."""
    pid = 4000 + rank
    lines = ["["]
    for seq, (start, end, n) in enumerate(_kineto_colls(rank)):
        s, e = _us(start - ORIGIN[rank]), _us(end - ORIGIN[rank])
        head = f'"id": {seq}, "pid": {pid}, "tid": 1'
        lines += [
            f'{{"name": "Group", "cat": "GROUP", "ph": "b", {head}, "ts": {s}, "args": {{"groupId": {seq}}}}},',
            f'{{"name": "AllReduce", "cat": "COLL", "ph": "b", {head}, "ts": {s}, "args": {{"SeqNum": {seq}, '
            f'"CommHash": {COMM}, "Rank": {rank}, "Count": {n}, "Datatype": ncclBfloat16, "Algorithm": "RING", '
            f'"Protocol": "LL", "nMaxChannels": 2}}}},',
            f'{{"name": "Send", "cat": "PROXY", "ph": "b", {head}, "ts": {s}, "args": {{"Channel": 0, "Peer": '
            f'{1 - rank}, "Steps": 4, "ChunkSize": 131072, "transSize": 1048576}}}},',
            f'{{"name": "Send", "cat": "PROXY", "ph": "e", {head}, "ts": {e}}},',
            f'{{"name": "AllReduce", "cat": "COLL", "ph": "e", {head}, "ts": {e}}},',
            f'{{"name": "Group", "cat": "GROUP", "ph": "e", {head}, "ts": {e}}},',
        ]
    lines.append("{}]")
    return "\n".join(lines) + "\n"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    case(CASE.name)
    out = tmp_path / "job"
    out.mkdir()
    for r in (0, 1):
        shutil.copy(case(CASE.name) / f"rank{r}.json", out / f"rank{r}.json")
        (out / f"nccl_profile_{COMM}_{r}.json").write_text(_plugin_dump(r))
    return out


def test_parse_repairs_and_rows(run_dir):
    f = run_dir / f"nccl_profile_{COMM}_1.json"
    assert sources.claim(f).name == "nccl_profiler"
    assert sources.claim(run_dir / "rank1.json").name == "kineto"
    pt = parse(f)
    assert pt.rank == 1 and pt.source == "nccl_profiler"
    assert pt.warnings == [f"{f.name}: repaired non-strict JSON: 2 x bare enum token quoted"]
    rows = pt.collectives.to_pylist()
    want = _kineto_colls(1)
    assert [(r["pg"], r["seq"], r["op"], r["dtype"], r["nelems_in"], r["bytes_in"]) for r in rows] == [
        (str(COMM), 0, "all_reduce", "bfloat16", 524288, 2 * 524288),
        (str(COMM), 1, "all_reduce", "bfloat16", 524288, 2 * 524288),
    ]
    # Plugin clock, exact to the ns: enter = launch - origin.
    assert [(r["enter_ns"], r["end_ns"]) for r in rows] == [
        (s - ORIGIN[1], e - ORIGIN[1]) for s, e, _ in want
    ]
    kinds = sorted(pt.events.column("kind").to_pylist())
    assert kinds == ["collective"] * 2 + ["other"] * 4 and pt.skipped == {"empty object": 1}


def test_ingest_aligns_and_matches_with_kineto(store, run_dir):
    res = ingest(store, [run_dir], jobs=1)
    assert any("repaired non-strict JSON" in w for w in res.warnings)
    meta = store.sql("""SELECT rank, json_extract_string(meta, '$.clock') AS clock,
                               json_extract(meta, '$.plugin_clock_offset_ns')::BIGINT AS off, clock_offset_ns
                        FROM traces WHERE source = 'nccl_profiler' ORDER BY rank""").rows()
    # The plugin clock is put on the rank's Kineto clock (offset = the plugin's origin), then the run's
    # clock alignment moves rank 1 (3 ms ahead) by -3 ms, Kineto and plugin traces alike.
    assert meta == [
        (0, "aligned_to:nccl_kernel", ORIGIN[0], 0),
        (1, "aligned_to:nccl_kernel", ORIGIN[1], -3_000_000),
    ]
    assert store.sql("SELECT DISTINCT rank, clock_offset_ns FROM traces ORDER BY rank").rows() == [
        (0, 0),
        (1, -3_000_000),
    ]
    for r in (0, 1):
        got = store.sql(f"""SELECT enter_ns - t.clock_offset_ns AS e, end_ns - t.clock_offset_ns AS x FROM collectives c
                            JOIN traces t USING (trace_id) WHERE c.source = 'nccl_profiler' AND c.rank = {r}
                            ORDER BY e""").rows()
        assert got == [(s, e) for s, e, _ in _kineto_colls(r)]
    inst = store.sql("""SELECT pg, seq, match_method, n_ranks, ranks_missing FROM collective_instances
                        WHERE source = 'nccl_profiler' ORDER BY seq""").rows()
    assert inst == [(str(COMM), 0, "comms_id", 2, []), (str(COMM), 1, "comms_id", 2, [])]
    s = analyze(store, "nccl_sum").frame.filter(name="all_reduce").row(0, named=True)
    assert s["instances_total"] == 8 and "nccl_profiler" in s["sources"]  # 2 ranks x 2, Kineto and plugin


def test_repairs_are_issues_of_the_run_and_in_the_report(store, run_dir, tmp_path):
    # each rank's dump writes Datatype as a bare token in its 2 AllReduce begins: 2 repairs a file,
    # 4 over the run, counted in traces.meta.repaired where `runs` and the report read every
    # source's repairs (before: traces.meta.repairs, which neither reads: issues "")
    from traceprof.render.report import write_report

    ingest(store, [run_dir], jobs=1)
    meta = store.sql("SELECT meta FROM traces WHERE source = 'nccl_profiler' ORDER BY rank")["meta"].to_list()
    assert [json.loads(m)["repaired"] for m in meta] == [{"non-strict JSON: bare enum token quoted": 2}] * 2
    issues = store.runs()["issues"].to_list()
    assert issues == ["4 repaired: non-strict JSON: bare enum token quoted"]
    page = write_report(store, None, tmp_path / "r.html").read_text()
    assert "Ingest issues" in page and "4 repaired: non-strict JSON: bare enum token quoted" in page


def test_an_event_written_twice_is_kept_once_and_counted(tmp_path):
    # Rank 0's dump with its second AllReduce begin line written twice (every field equal): kept
    # once, the 2 collectives as without the copy, counted; before, the copy was a third open
    # begin, left unclosed. The dump's zero-ts records are never copies (none here).
    lines = _plugin_dump(0).split("\n")
    at = next(i for i, ln in enumerate(lines) if '"cat": "COLL", "ph": "b"' in ln and '"SeqNum": 1' in ln)
    path = tmp_path / f"nccl_profile_{COMM}_0.json"
    path.write_text("\n".join([*lines[: at + 1], lines[at], *lines[at + 1 :]]))
    pt = parse(path)
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [0, 1] and pt.flagged == {}
    assert json.loads(pt.trace["meta"])["repaired"] == {
        "non-strict JSON: bare enum token quoted": 3,  # the copy's Datatype token too
        "exact duplicate record dropped": 1,
    }
    assert f"{path.name}: 1 duplicate record dropped (first: event #8 (COLL 'AllReduce'))" in pt.warnings


def test_plugin_only_run(tmp_path, run_dir):
    only = tmp_path / "plugin_only"
    only.mkdir()
    for f in run_dir.glob("nccl_profile_*"):
        shutil.copy(f, only / f.name)
    with Store(tmp_path / "p.duckdb") as store:
        res = ingest(store, [only], jobs=1)
        assert any("stay on the plugin's clock" in w for w in res.warnings)
        # Ranks aligned to each other from the matched ends: rank 1's plugin origin differs from rank 0's,
        # and its clock runs 3 ms ahead.
        off = store.sql("SELECT clock_offset_ns FROM traces WHERE rank = 1")["clock_offset_ns"][0]
        assert off == ORIGIN[1] - ORIGIN[0] - 3_000_000
        for name in ("temporal", "overlap", "kernels", "idle", "launch", "kernel_sum"):
            with pytest.raises(AnalysisError) as e:
                analyze(store, name)
            assert "\n" not in str(e.value), name
        st = analyze(store, "stragglers")
        assert st.frame.height == 2
        assert analyze(store, "desync").verdict["status"][0] == "clean"


def test_unrepairable_line_and_truncation(tmp_path, run_dir):
    text = _plugin_dump(0).split("\n")
    bad = tmp_path / "bad.json"
    bad.write_text(
        "\n".join(text[:3] + ['{"name": "AllReduce", "cat": "COLL", "ph": "b", "ts": 12.5,, }'] + text[3:])
    )
    with pytest.raises(TraceFormatError, match=r"line 4:\d+"):
        parse(bad)
    cut = tmp_path / "cut_rank0.json"
    body = "\n".join(text[:-2])  # the process died while writing: no "{}]", last line cut short
    cut.write_text(body[: len(body) - 10])
    pt = parse(cut)
    assert pt.warnings == [
        f"{cut.name}: repaired non-strict JSON: 2 x bare enum token quoted, 1 x last event cut "
        "short (file truncated) dropped"
    ]
    trailing = tmp_path / "comma_rank0.json"  # "...},\n]": a trailing comma before the closing bracket
    trailing.write_text("\n".join(text[:-2]) + "\n]\n")
    assert parse(trailing).warnings[0].endswith("1 x trailing comma before ']' dropped")
    assert pt.flagged == {"unmatched_begin": 1}  # the second group's begin lost its end


@pytest.mark.parametrize("body", ["[\n]\n", "[\n{}]\n"])
def test_empty_dump_named_like_one_says_no_events(tmp_path, body):
    """An empty event array named nccl_profile_rank0.json is the plugin's (by name), not a Kineto
    file without traceEvents."""
    path = tmp_path / "nccl_profile_rank0.json"
    path.write_text(body)
    assert sources.claim(path).name == "nccl_profiler"
    with pytest.raises(TraceFormatError) as e:
        sources.claim(path).parse(path, ParseOptions())
    assert str(e.value) == (
        f"{path.resolve()}: no events: the NCCL profiler plugin wrote an empty dump (the "
        "process ran no NCCL operation while profiled, or exited before the plugin flushed)"
    )


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("Count", "-524288", "negative 'Count' (-524288)"),  # was stored as -1048576 bytes
        # a record's number is a JSON integer (traceprof.core.values.record_int, as the Flight
        # Recorder's and NCCL Inspector's): a float or a string is none, whatever it writes
        ("Count", "1e300", "'Count' not an integer (1e+300)"),
        ("Count", "524288.0", "'Count' not an integer (524288.0)"),  # was read as 524288, silently
        ("Count", '"524288"', "'Count' not an integer ('524288')"),  # was read as 524288, silently
        ("Count", "true", "'Count' not an integer (True)"),
        # SeqNum "0" (and 0.0, "0x0") was read as 0 silently: the collective's instance key came
        # from a value no NCCL writes
        ("SeqNum", '"0"', "'SeqNum' not an integer ('0')"),
        ("SeqNum", "0.0", "'SeqNum' not an integer (0.0)"),
        ("SeqNum", '"0x0"', "'SeqNum' not an integer ('0x0')"),
        (
            "Count",
            str(2**62),
            f"'bytes_in' beyond int64 ({2**63})",
        ),  # 2**62 bfloat16 elements: 2**63 bytes (was a traceback)
        ("Count", '"many"', "'Count' not an integer ('many')"),  # was a NULL count, silently
    ],
)
def test_count_or_seqnum_that_cannot_be_stored_is_refused(tmp_path, key, value, reason):
    # The first AllReduce begin (event #1: #0 is its Group) gets the bad value; the second is intact.
    path = tmp_path / f"nccl_profile_{COMM}_0.json"
    path.write_text(_plugin_dump(0).replace(f'"{key}": ', f'"{key}": {value}, "Was": ', 1))
    with pytest.raises(TraceFormatError) as e:
        parse(path)
    assert str(e.value).startswith(f"{path}: event #1 (COLL 'AllReduce'): {reason}; pass --skip-bad-events")
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1]
    assert pt.rejected == {reason.split(" (")[0]: 1}
    assert sorted(pt.events.column("kind").to_pylist()) == ["collective"] + ["other"] * 4


@pytest.mark.parametrize(
    ("rank", "what"),
    [
        ('"0"', "a string: read as its integer"),
        ("0.0", "a float: read as its integer"),
        ('"zero"', "not an integer: ignored"),
    ],
)
def test_rank_written_as_text_is_said_and_counted(tmp_path, rank, what):
    # An identity (traceprof.core.values.identity_int): "0" was read as rank 0 silently and "zero"
    # ignored silently; now each is said and counted per record, the rank read where it is one.
    # A file name without rank<R>: the rank comes from args.Rank (both records' Rank changed).
    path = tmp_path / "nccl_profile.json"
    path.write_text(_plugin_dump(0).replace('"Rank": 0,', f'"Rank": {rank},'))
    pt = parse(path)
    assert pt.rank == (None if what.endswith("ignored") else 0)
    assert json.loads(pt.trace["meta"])["repaired"] == {
        f"args.Rank {what}": 2,
        "non-strict JSON: bare enum token quoted": 2,  # the dump's Datatype tokens
    }
    shown = repr(json.loads(rank))
    assert (
        f"nccl_profile.json: 2 COLL / P2P record(s) whose args.Rank is {shown} (first), {what}" in pt.warnings
    )


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (
            "CommHash",
            '{"h": 1}',
            "'CommHash' not a string or an integer ({'h': 1})",
        ),  # was stored as pg "{'h': 1}"
        ("Datatype", "[1]", "'Datatype' not a string ([1])"),
    ],
)
def test_comm_hash_or_datatype_of_another_type_is_refused(tmp_path, key, value, reason):
    path = tmp_path / f"nccl_profile_{COMM}_0.json"
    path.write_text(_plugin_dump(0).replace(f'"{key}": ', f'"{key}": {value}, "Was": ', 1))
    with pytest.raises(TraceFormatError) as e:
        parse(path)
    assert str(e.value).startswith(f"{path}: event #1 (COLL 'AllReduce'): {reason}; pass --skip-bad-events")
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert [(r["pg"], r["seq"]) for r in pt.collectives.to_pylist()] == [(str(COMM), 1)]


# --- issue 28: sentinel timestamps (ts 0.0 never set by the plugin) and bare pointer tokens ----------

ZERO = "nccl_plugin_zero_timestamps"


def _zero_case_collectives(store: Store) -> None:
    """The collectives of nccl_plugin_zero_timestamps (numbers in :func:`test_zero_timestamp_case`)."""
    rows = store.sql("SELECT rank, seq, op, end_ns - start_ns FROM collectives ORDER BY rank, seq").rows()
    assert rows == [(r, k, "all_reduce", 500_000 if r == 0 else 460_000) for r in (0, 1) for k in (0, 1, 2)]
    assert store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").rows() == [
        (0, 0),
        (1, 250_000),
    ]
    inst = store.sql("SELECT seq, n_ranks, arrival_skew_ns, last_rank FROM collective_instances ORDER BY seq")
    assert inst.rows() == [(k, 2, 40_000, 1) for k in (0, 1, 2)]


@pytest.mark.parametrize("variant", ["quoted", "raw"])
def test_zero_timestamp_case(tmp_path, variant):
    """Shared case nccl_plugin_zero_timestamps (EXPECT.md), both variants. Per rank 3 AllReduce
    groups k = 0..2 at wall W = 1000000 + 10000 k us; rank 1's plugin clock started 250 us later
    (its ts = W - 250). COLL: begin W + 40 r, end W + 500: rank 0 500 us = 500000 ns, rank 1 460 us
    = 460000 ns. After alignment (+250000 ns on rank 1) rank 1 arrives 40 us = 40000 ns after rank 0
    at each of the 3 instances. The 6 begin records at ts 0.0 per rank (COLL_API, KERNEL_LAUNCH)
    and the 3 KernelCh channel-1 ends at 0.0 are unknown times: flagged zero_ts, duration 0, never
    a ~1 s span from the plugin's time 0 (COLL_API #0 would be 999990000 ns on rank 0); raw/'s bare
    0x... stream pointers are quoted with a warning (2 per group: COLL_API and KERNEL_LAUNCH)."""
    folder = case(ZERO) / variant
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [folder], run=variant, jobs=1)
        _zero_case_collectives(store)
        # the sentinels: flagged, 0 ns, at their known end (begins) or start (KernelCh ends)
        flagged = store.sql("""SELECT rank, cat, count(*), max(dur_ns) FROM events WHERE flag = 'zero_ts'
                               GROUP BY ALL ORDER BY ALL""").rows()
        assert flagged == [
            (r, c, 3, 0) for r in (0, 1) for c in ("nccl:COLL_API", "nccl:GPU", "nccl:KERNEL_LAUNCH")
        ]
        assert (
            store.sql("SELECT max(dur_ns) FROM events WHERE flag IS NULL").item() == 504_000
        )  # GROUP, no 1 s span
        # COLL_API #0 of rank 0 stands at its end, W - 10 us on the plugin clock = 999990 us
        assert (
            store.sql("""SELECT ts_ns FROM events WHERE rank = 0 AND cat = 'nccl:COLL_API'
                            ORDER BY ts_ns LIMIT 1""").item()
            == 999_990_000
        )
        # channel 0's KernelCh is whole (W + 50 .. W + 480 = 430 us), channel 1's end unknown
        ch = store.sql("""SELECT json_extract(args, '$.Channel')::INT AS ch, flag, dur_ns FROM events
                          WHERE rank = 0 AND name = 'KernelCh' ORDER BY ts_ns, ch LIMIT 2""").rows()
        assert ch == [(0, None, 430_000), (1, "zero_ts", 0)]
        assert store.sql("SELECT DISTINCT flagged FROM traces").item() == '{"zero_ts":9}'
    for r in (0, 1):
        w = f"nccl_profile_rank{r}.txt"
        assert (
            f"{w}: 9 record(s) with ts 0.000000, a time the plugin never set (3 x COLL_API AllReduce begin, "
            "3 x GPU KernelCh end, 3 x KERNEL_LAUNCH KernelLaunch begin): that begin or end is unknown; stored "
            "at the other end with duration 0, flagged zero_ts (a collective's start or end NULL)"
        ) in res.warnings
        pointers = ", 6 x bare pointer token quoted" if variant == "raw" else ""
        assert f"{w}: repaired non-strict JSON: 3 x bare enum token quoted{pointers}" in res.warnings


@pytest.mark.parametrize("name", ["nccl_profile_rank{r}.txt.gz", "dump_6479621443159067765_{r}.json.gz"])
def test_gzipped_dumps_are_read(tmp_path, name):
    """The raw/ variant of nccl_plugin_zero_timestamps gzipped (``gzip nccl_profile_rank0.txt``, or
    the plugin's own ``<prefix>_<commHash>_<rank>.json`` name gzipped) reads as the plain files do:
    before, both were skipped as "not traces" and the folder had "no trace files found". Numbers as
    in :func:`test_zero_timestamp_case`: durations 500000 ns (rank 0) / 460000 ns (rank 1) at seq
    0..2, rank 1 aligned by +250000 ns, 3 instances of 2 ranks with skew 40000 ns, rank 1 last."""
    folder = tmp_path / "gz"
    folder.mkdir()
    for r in (0, 1):
        raw = (case(ZERO) / "raw" / f"nccl_profile_rank{r}.txt").read_bytes()
        (folder / name.format(r=r)).write_bytes(gzip.compress(raw))
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [folder], jobs=1)
        _zero_case_collectives(store)
    assert any(w.startswith(f"{name.format(r=0)}: 9 record(s) with ts 0.000000") for w in res.warnings)


@pytest.mark.parametrize("twice", [False, True])
def test_channel_ends_printed_alike_are_not_copies(tmp_path, twice):
    """NCCL 2.29's example plugin (every channel's end set, NVIDIA/nccl#2391) prints each channel's
    KernelCh begin and end together and every KernelCh with id 0 (``kernelId`` is never
    incremented): the two channels of an AllReduce at W = 3000000 + 10000 k us (k = 0..2) both run
    [W + 40, W + 390], so their end records are equal in every field. Each closes its own begin (the
    begins differ by Channel): 6 channel spans of 350 us = 350000 ns, no copy, nothing unclosed.
    ``twice``: channel 1's begin / end pair of group 0 written a second time is a copy (2 records)."""
    head = '"pid": 51, "tid": 1'
    lines = ["["]
    for k in range(3):
        w = 3000000 + 10000 * k
        coll = f'"name": "AllReduce", "cat": "COLL", "id": {k}, {head}'
        lines.append(
            f'{{{coll}, "ph": "b", "ts": {w}.000000, "args": {{"SeqNum": {k}, "CommHash": 7, "Rank": 0, '
            '"Count": 4096, "Datatype": "ncclFloat32"}},'
        )
        for ch in (0, 1):
            kch = f'"name": "KernelCh", "cat": "GPU", "id": 0, {head}'
            pair = [
                f'{{{kch}, "ph": "b", "ts": {w + 40}.000000, "args": {{"Channel": {ch}}}}},',
                f'{{{kch}, "ph": "e", "ts": {w + 390}.000000}},',
            ]
            lines += pair * (2 if twice and k == 0 and ch == 1 else 1)
        lines.append(f'{{{coll}, "ph": "e", "ts": {w + 400}.000000}},')
    path = tmp_path / "nccl_profile_rank0.txt"
    path.write_text("\n".join([*lines, "{}]"]))
    pt = parse(path)
    spans = [(e["ts_ns"], e["dur_ns"], e["flag"]) for e in pt.events.to_pylist() if e["name"] == "KernelCh"]
    assert spans == [((3000040 + 10000 * k) * 1000, 350_000, None) for k in range(3) for _ in (0, 1)]
    assert pt.flagged == {}
    repaired = json.loads(pt.trace["meta"]).get("repaired", {})
    assert repaired == ({"exact duplicate record dropped": 2} if twice else {})


def test_zero_sentinels_on_collectives_and_pointer_tokens(tmp_path):
    """A dump of the kind, written here: a P2P send whose begin is 0.0 (start unknown: NULL start,
    end 2000.5 us = 2000500 ns), a COLL begun at 3000 us = 3000000 ns whose end is 0.0 (end NULL,
    not a 0 ns collective; 128 float32 = 512 bytes, like the send's 256 float16), a
    KernelCh on channel 3 ending at 0.0 and an instant at 0.0; pointers printed bare, one of them
    glibc's (nil). Every zero is flagged zero_ts and counted; the pointers are read as text / null."""
    head = '"pid": 7, "tid": 1'
    lines = [
        "[",
        f'{{"name": "Send", "cat": "P2P", "ph": "b", "id": 0, {head}, "ts": 0.000000, "args": {{"CommHash": 9, '
        f'"Rank": 0, "Peer": 1, "Count": 256, "Datatype": ncclFloat16, "Stream": 0x7f00aa}}}},',
        f'{{"name": "Send", "cat": "P2P", "ph": "e", "id": 0, {head}, "ts": 2000.500000}},',
        f'{{"name": "AllGather", "cat": "COLL", "ph": "b", "id": 1, {head}, "ts": 3000.000000, "args": {{"SeqNum": 4, '
        f'"CommHash": 9, "Rank": 0, "Count": 128, "Datatype": ncclFloat32, "Stream": (nil)}}}},',
        f'{{"name": "KernelCh", "cat": "GPU", "ph": "b", "id": 2, {head}, "ts": 3010.000000, "args": {{"Channel": 3}}}},',
        f'{{"name": "KernelCh", "cat": "GPU", "ph": "e", "id": 2, {head}, "ts": 0.000000}},',
        f'{{"name": "AllGather", "cat": "COLL", "ph": "e", "id": 1, {head}, "ts": 0}},',
        f'{{"name": "Mark", "cat": "NET", "ph": "i", "id": 3, {head}, "ts": 0.0}},',
        "{}]",
    ]
    f = tmp_path / "nccl_profile_rank0.json"
    f.write_text("\n".join(lines) + "\n")
    pt = parse(f)
    colls = sorted(pt.collectives.to_pylist(), key=lambda r: r["op"])
    assert [(r["op"], r["pg"], r["seq"], r["start_ns"], r["end_ns"], r["bytes_in"]) for r in colls] == [
        ("all_gather", "9", 4, 3_000_000, None, 512),
        ("send", "9:p2p", None, None, 2_000_500, 512),
    ]
    ev = {(r["cat"], r["name"]): (r["ts_ns"], r["dur_ns"], r["flag"]) for r in pt.events.to_pylist()}
    assert ev == {
        ("nccl:P2P", "Send"): (2_000_500, 0, "zero_ts"),
        ("nccl:COLL", "AllGather"): (3_000_000, 0, "zero_ts"),
        ("nccl:GPU", "KernelCh"): (3_010_000, 0, "zero_ts"),
        ("nccl:NET", "Mark"): (0, 0, "zero_ts"),
    }
    assert pt.flagged == {"zero_ts": 4}
    args = {r["name"]: json.loads(r["args"]) for r in pt.events.to_pylist()}
    assert (args["Send"]["Stream"], args["AllGather"]["Stream"]) == ("0x7f00aa", None)
    assert pt.warnings == [
        f"{f.name}: repaired non-strict JSON: 2 x bare enum token quoted, 1 x bare pointer token quoted, "
        "1 x null pointer (nil) -> null",
        f"{f.name}: 4 record(s) with ts 0.000000, a time the plugin never set (1 x COLL AllGather end, 1 x GPU "
        "KernelCh end, 1 x NET Mark instant, 1 x P2P Send begin): that begin or end is unknown; stored at the "
        "other end with duration 0, flagged zero_ts (a collective's start or end NULL)",
    ]


# --- NCCL numbers each op type of a communicator separately: (CommHash, SeqNum) is per op ------------


def _mixed_dump(rank: int) -> str:
    """A plugin dump of one communicator (CommHash 77) running AllReduce and AllGather alternately,
    each numbered from 0 by NCCL's per-op counter: AllReduce SeqNum 0, AllGather 0, AllReduce 1,
    AllGather 1 (the plugin's COLL begin / end, us on the plugin clock, the same origin on both ranks)."""
    begins = {0: (1000, 2000, 3000, 4000), 1: (1010, 2030, 3005, 4050)}[rank]
    ends = (1100, 2200, 3100, 4200)
    colls = (("AllReduce", 0, 1024), ("AllGather", 0, 256), ("AllReduce", 1, 1024), ("AllGather", 1, 256))
    lines = ["["]
    for i, ((name, seq, count), b, e) in enumerate(zip(colls, begins, ends, strict=True)):
        head = f'"id": {i}, "pid": {500 + rank}, "tid": 1'
        lines += [
            f'{{"name": "{name}", "cat": "COLL", "ph": "b", {head}, "ts": {b}.000000, "args": {{"SeqNum": {seq}, '
            f'"CommHash": 77, "Rank": {rank}, "Count": {count}, "Datatype": "ncclFloat32"}}}},',
            f'{{"name": "{name}", "cat": "COLL", "ph": "e", {head}, "ts": {e}.000000}},',
        ]
    lines.append("{}]")
    return "\n".join(lines) + "\n"


def _pair_store(tmp_path: Path, dump: Callable[[int], str]) -> Store:
    """A store with ranks 0 and 1's plugin dumps (``dump(rank)``) ingested as one job."""
    for r in (0, 1):
        (tmp_path / "job").mkdir(exist_ok=True)
        (tmp_path / "job" / f"nccl_profile_rank{r}.txt").write_text(dump(r))
    store = Store(tmp_path / "t.duckdb")
    ingest(store, [tmp_path / "job"], jobs=1)
    return store


def test_sequence_numbers_count_per_op_within_a_communicator(tmp_path):
    # By hand: 4 instances of 2 ranks, one per (op, SeqNum), never AllReduce 0 with AllGather 0.
    # Ends agree on both ranks, so clock alignment moves rank 1 by 0. Arrival skew = rank 1's begin
    # - rank 0's: 1010 - 1000 = 10 us, 2030 - 2000 = 30 us, 3005 - 3000 = 5 us, 4050 - 4000 = 50 us,
    # rank 1 last each time. Bytes: AllReduce 1024 float32 = 4096, AllGather 256 float32 (its
    # per-rank input) = 1024. The stored values stay pg = CommHash, seq = SeqNum.
    with _pair_store(tmp_path, _mixed_dump) as store:
        assert store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank").rows() == [(0, 0), (1, 0)]
        inst = store.sql("""SELECT op, seq, n_ranks, bytes, arrival_skew_ns, last_rank, match_method
                            FROM collective_instances ORDER BY first_arrival_ns""").rows()
        assert inst == [
            ("all_reduce", 0, 2, 4096, 10_000, 1, "comms_id"),
            ("all_gather", 0, 2, 1024, 30_000, 1, "comms_id"),
            ("all_reduce", 1, 2, 4096, 5_000, 1, "comms_id"),
            ("all_gather", 1, 2, 1024, 50_000, 1, "comms_id"),
        ]
        rows = store.sql("SELECT DISTINCT pg, seq, op, comms_id FROM collectives ORDER BY seq, op").rows()
        assert rows == [
            ("77", 0, "all_gather", "77:all_gather:0"),
            ("77", 0, "all_reduce", "77:all_reduce:0"),
            ("77", 1, "all_gather", "77:all_gather:1"),
            ("77", 1, "all_reduce", "77:all_reduce:1"),
        ]
        # every row of an instance is of one op
        assert (
            store.sql("""SELECT count(*) FROM (SELECT instance_id FROM collectives GROUP BY instance_id
                            HAVING count(DISTINCT op) > 1)""").item()
            == 0
        )


def _ce_dump(rank: int) -> str:
    """NCCL 2.28+ example plugin: a kernel AllReduce (COLL, SeqNum 0, CommHash 77) then a
    copy-engine AllGather (``CE_COLL``, with its ``CE_SYNC`` / ``CE_BATCH`` children: no SeqNum,
    CommHash or Rank; lowercase ``count`` / ``datatype``), as ``print_event.cc`` prints them (g12
    variant g16_plugin_ce_collectives). us on the plugin clock, the same origin on both ranks."""
    head = f'"pid": {500 + rank}, "tid": 1'
    ce_b = 2000 + 30 * rank
    ce = (
        f'"eventId": 0, "count": 512, "datatype": "ncclBfloat16", "strategy": "batch", '
        f'"start_ts_cpu": {ce_b}.0, "stop_ts_cpu": 2300.0, "duration_cpu_us": 1.0, "duration_gpu_us": 1'
    )
    lines = [
        "[",
        f'{{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 0, {head}, "ts": {1000 + 10 * rank}.000000, '
        f'"args": {{"SeqNum": 0, "CommHash": 77, "Rank": {rank}, "Count": 1024, "Datatype": "ncclFloat32"}}}},',
        f'{{"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 0, {head}, "ts": 1100.000000}},',
        f'{{"name": "AllGather", "cat": "CE_COLL", "ph": "b", "id": 0, {head}, "ts": {ce_b}.000000, "args": {{{ce}}}}},',
        f'{{"name": "CeSync", "cat": "CE_SYNC", "ph": "b", "id": 0, {head}, "ts": {ce_b}.000000, '
        '"args": {"eventId": 0, "type": "Ready", "nRanks": 2}},',
        f'{{"name": "CeSync", "cat": "CE_SYNC", "ph": "e", "id": 0, {head}, "ts": 2060.000000}},',
        f'{{"name": "CeBatch", "cat": "CE_BATCH", "ph": "b", "id": 0, {head}, "ts": 2060.000000, '
        '"args": {"eventId": 0, "numOps": 2, "totalBytes": 2048}},',
        f'{{"name": "CeBatch", "cat": "CE_BATCH", "ph": "e", "id": 0, {head}, "ts": 2290.000000}},',
        f'{{"name": "AllGather", "cat": "CE_COLL", "ph": "e", "id": 0, {head}, "ts": 2300.000000}},',
        "{}]",
    ]
    return "\n".join(lines) + "\n"


def test_copy_engine_collectives_are_collectives_of_the_files_communicator(tmp_path):
    # By hand: the CE AllGather is a collective of the file's one communicator (77), matched
    # across ranks by its order (no SeqNum): rank 0 [2000, 2300] us, rank 1 [2030, 2300] us ->
    # arrival skew 30 us, rank 1 last; 512 bfloat16 = 1024 bytes. The AllReduce as before (skew
    # 10 us). Before, CE_COLL was an 'other' event: no all_gather instance, nccl_sum without it.
    with _pair_store(tmp_path, _ce_dump) as store:
        inst = store.sql("""SELECT op, pg, n_ranks, bytes, arrival_skew_ns, last_rank
                            FROM collective_instances ORDER BY first_arrival_ns""").rows()
        assert inst == [("all_reduce", "77", 2, 4096, 10_000, 1), ("all_gather", "77", 2, 1024, 30_000, 1)]
        durs = store.sql(
            "SELECT rank, end_ns - start_ns FROM collectives WHERE op = 'all_gather' ORDER BY rank"
        ).rows()
        assert durs == [(0, 300_000), (1, 270_000)]


@pytest.mark.parametrize(
    ("ts", "reason"),
    [
        ("-12.500", "negative 'ts'"),
        # beyond int64 ns, named by the field and its text as Kineto's are: it was "ends before its
        # begin (event #1) by 999,...,498,880.017 us" (the end was the sane one), or on an end
        # "'enter_ns' beyond int64 (1000...000)" in ns
        ("1e30", "'ts' beyond int64"),
        ("9223372036854775.808", "'ts' beyond int64"),  # 2**63 ns, one past int64
    ],
)
def test_negative_or_out_of_range_timestamp_is_a_bad_event(tmp_path, ts, reason):
    # The plugin's steady clock never reads below 0: the first AllReduce begin (event #1) at
    # -12.5 us was stored as a time. Now it is a bad event naming the file and the event; skipped,
    # its end has no begin (rejected too) and only the second AllReduce (seq 1) is left.
    path = tmp_path / f"nccl_profile_{COMM}_0.json"
    lines = _plugin_dump(0).splitlines()
    assert '"name": "AllReduce", "cat": "COLL", "ph": "b"' in lines[2]
    lines[2] = re.sub(r'"ts": [0-9.]+', f'"ts": {ts}', lines[2])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as e:
        parse(path)
    assert str(e.value).startswith(f"{path}: event #1 (COLL 'AllReduce'): {reason} ({ts} us); pass")
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1]
    assert pt.rejected == {reason: 1, "end without a begin": 1}


def test_end_before_its_begin_is_a_bad_event(tmp_path):
    # The first AllReduce's end (event #4) written 3 us before its begin (event #1): its collective
    # was stored with end_ns < start_ns and its event with duration 0, silently. Now a bad event;
    # skipped, the pair is left out (counted once) and only the second AllReduce (seq 1) is left.
    path = tmp_path / f"nccl_profile_{COMM}_0.json"
    lines = _plugin_dump(0).splitlines()
    assert '"name": "AllReduce", "cat": "COLL", "ph": "e"' in lines[5]
    begin = re.search(r'"ts": ([0-9.]+)', lines[2]).group(1)
    whole, frac = begin.split(".")
    lines[5] = re.sub(r'"ts": [0-9.]+', f'"ts": {int(whole) - 3}.{frac}', lines[5])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as e:
        parse(path)
    assert str(e.value).startswith(
        f"{path}: event #4 (COLL 'AllReduce'): ends before its begin (event #1) by 3.000 us; pass"
    )
    pt = parse(path, ParseOptions(on_bad_event="skip"))
    assert [r["seq"] for r in pt.collectives.to_pylist()] == [1]
    assert pt.rejected == {"ends before its begin": 1}


# --- the plugin writes one file per communicator: <NCCL_PROFILE_DUMP_FILE>_<commHash>_<rank>.json ----


def _comm_dump(rank: int, comm: int, op: str, base_us: int, pid: int | None = None) -> str:
    """One communicator's dump of one process, as the example plugin (2.29, profiler API v5) prints
    it: per group k = 0..2 at wall W = base_us + 10000 k, on rank 1's plugin clock 250 us later
    (ts = W - 250): a COLL_API begin at 0.0 (never set) and a COLL [W + 40 rank, W + 500] with a
    ProxyStep whose SendGpuWait end is 0.0 (timestamp[SEND_PEER_WAIT] never set). The process's
    pid: ``pid``, else 5100 + rank."""
    pid, shift = 5100 + rank if pid is None else pid, 250 * rank
    lines = ["["]
    for k in range(3):
        w = base_us + 10000 * k - shift
        head = f'"id": {k}, "pid": {pid}, "tid": 1'
        lines += [
            f'{{"name": "{op}", "cat": "COLL_API", "ph": "b", {head}, "ts": 0.000000, "args": {{"count": 1024, '
            '"datatype": "ncclFloat32", "root": 0, "GraphCaptured": 0, "Stream": "0x7f3a1c00a0"}},',
            f'{{"name": "{op}", "cat": "COLL", "ph": "b", {head}, "ts": {w + 40 * rank}.000000, "args": {{"SeqNum": '
            f'{k}, "CommHash": {comm}, "Rank": {rank}, "Count": 1024, "Datatype": "ncclFloat32"}}}},',
            f'{{"name": "SendGpuWait", "cat": "NET", "ph": "b", {head}, "ts": {w + 60}.000000, "args": {{"Step": 0}}}},',
            f'{{"name": "SendGpuWait", "cat": "NET", "ph": "e", {head}, "ts": 0.000000}},',
            f'{{"name": "{op}", "cat": "COLL", "ph": "e", {head}, "ts": {w + 500}.000000}},',
            f'{{"name": "{op}", "cat": "COLL_API", "ph": "e", {head}, "ts": {w - 10}.000000}},',
        ]
    lines.append("{}]")
    return "\n".join(lines) + "\n"


def test_one_file_per_communicator_is_one_job(tmp_path):
    """Two processes, two communicators (hashes 647... and 131...: a data-parallel group and a
    second group of the same two ranks), so four files, two per rank, as the plugin names them: one
    run, not four (it was four runs of 1 of 2 ranks each, and --run refused "rank 0 also in ...").
    By hand: comm A's AllReduces at W = 1000000 + 10000 k us, comm B's AllGathers at 1005000 +
    10000 k; rank 0 [W, W + 500] = 500000 ns, rank 1 [W + 40, W + 500] = 460000 ns on the wall
    clock; rank 1's plugin clock is 250 us behind on both files (one process, one clock): offset
    +250000 ns on both; 6 instances of [0, 1], each skew 40000 ns, rank 1 last; per rank 3 COLL_API
    begins and 3 SendGpuWait ends per file flagged zero_ts (12 per rank)."""
    job = tmp_path / "job"
    job.mkdir()
    comms = ((6479621443159067765, "AllReduce", 1000000), (1311768467463790320, "AllGather", 1005000))
    for r in (0, 1):
        for comm, op, base in comms:
            (job / f"nccl_profile_{comm}_{r}.json").write_text(_comm_dump(r, comm, op, base))
    with Store(tmp_path / "t.duckdb") as store:
        ingest(store, [job], jobs=1)
        assert store.sql("SELECT count(*) FROM runs").item() == 1
        assert store.sql("SELECT rank, clock_offset_ns FROM traces ORDER BY rank, path").rows() == [
            (0, 0),
            (0, 0),
            (1, 250_000),
            (1, 250_000),
        ]
        durs = store.sql("SELECT rank, op, end_ns - start_ns FROM collectives ORDER BY rank, enter_ns").rows()
        assert durs == [
            (r, op, 460_000 if r else 500_000) for r in (0, 1) for op in ["all_reduce", "all_gather"] * 3
        ]
        inst = store.sql("""SELECT op, seq, n_ranks, arrival_skew_ns, last_rank FROM collective_instances
                            ORDER BY first_arrival_ns""").rows()
        assert inst == [(op, k, 2, 40_000, 1) for k in range(3) for op in ("all_reduce", "all_gather")]
        flagged = store.sql(
            "SELECT rank, count(*) FROM events WHERE flag = 'zero_ts' GROUP BY rank ORDER BY rank"
        )
        assert flagged.rows() == [(0, 12), (1, 12)]


def test_the_same_communicator_twice_for_one_rank_is_still_two_jobs(tmp_path):
    # two dumps of one communicator and rank (two runs of the job in one folder) stay a clash
    job = tmp_path / "job"
    job.mkdir()
    (job / "a_77_0.json").write_text(_comm_dump(0, 77, "AllReduce", 1000000))
    (job / "b_77_0.json").write_text(_comm_dump(0, 77, "AllReduce", 2000000))
    with Store(tmp_path / "t.duckdb") as store, pytest.raises(TraceFormatError, match="rank 0 also in"):
        ingest(store, [job], run="one", jobs=1)


def test_two_jobs_in_one_folder_are_two_runs(tmp_path):
    """Two jobs' plugin files in one folder: job A (pids 5100, 5101; communicators 64... and 13...)
    and job B (pids 9100, 9101; communicators 77... and 88...), each of 2 ranks. No process of one
    shares a communicator with the other's and both have ranks 0 and 1: two runs of 2 ranks and 4
    files each, named after their lowest pid (on 4eb6579 one run of 8 traces, rank 0 under pids
    5100 and 9100); with --run, refused naming both jobs."""
    job = tmp_path / "job"
    job.mkdir()
    comms = {5100: ((6479621443159067765, "AllReduce", 1000000), (1311768467463790320, "AllGather", 1005000))}
    comms[9100] = ((7777777777777777777, "AllReduce", 1000000), (8888888888888888888, "AllGather", 1005000))
    for first, mine in comms.items():
        for r in (0, 1):
            for comm, op, base in mine:
                (job / f"nccl_profile_{comm}_{r}.json").write_text(_comm_dump(r, comm, op, base, first + r))
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [job], jobs=1)
        assert sorted(res.runs) == ["job-pid5100", "job-pid9100"]
        rows = store.sql("""SELECT r.name, t.rank, t.pid, count(*) FROM traces t JOIN runs r USING (run_id)
                            GROUP BY ALL ORDER BY ALL""").rows()
        assert rows == [
            ("job-pid5100", 0, "5100", 2),
            ("job-pid5100", 1, "5101", 2),
            ("job-pid9100", 0, "9100", 2),
            ("job-pid9100", 1, "9101", 2),
        ]
        # the note offers no one-run option: --run is refused below, with --force-run too (t10: the
        # hint said "or name one run with --run")
        (note,) = [w for w in res.warnings if "2 jobs'" in w]
        assert note.endswith("(put each job's files in a folder of its own: they cannot be one run)")
    with Store(tmp_path / "u.duckdb") as store, pytest.raises(TraceFormatError, match="2 jobs'"):
        ingest(store, [job], run="one", jobs=1)
    with Store(tmp_path / "v.duckdb") as store, pytest.raises(TraceFormatError, match="2 jobs'"):
        ingest(store, [job], run="one", jobs=1, force_run=True)


def test_sub_communicator_files_get_global_ranks(tmp_path):
    """4 processes (pids 5100..5103) in world communicator 11 (ranks 0..3) and two 2-rank
    sub-communicators, 21 = {5100, 5101} and 22 = {5102, 5103}: the plugin's files of 22 say Rank 0
    (pid 5102) and Rank 1 (pid 5103), ranks within 22. Each process's global rank is its rank in
    11, the communicator spanning all 4: 22's files are ranks 2 and 3, so 22's instances are of
    ranks [2, 3] (on 4eb6579 [0, 1], beside 21's [0, 1]: pid 5102's files under ranks 2 and 0)."""
    job = tmp_path / "job"
    job.mkdir()
    for pid in range(5100, 5104):
        g = pid - 5100
        (job / f"nccl_profile_11_{g}.json").write_text(_comm_dump(g, 11, "AllReduce", 1000000, pid))
        sub, local = (21 if g < 2 else 22), g % 2
        (job / f"nccl_profile_{sub}_{local}.json").write_text(
            _comm_dump(local, sub, "AllGather", 1005000, pid)
        )
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [job], jobs=1)
        assert list(res.runs) == ["job"]
        ranks = store.sql("SELECT pid, list(DISTINCT rank) FROM traces GROUP BY pid ORDER BY pid").rows()
        assert ranks == [("5100", [0]), ("5101", [1]), ("5102", [2]), ("5103", [3])]
        per_comm = store.sql("""SELECT pg, list(DISTINCT rank ORDER BY rank) FROM collectives
                                GROUP BY pg ORDER BY pg""").rows()
        assert per_comm == [("11", [0, 1, 2, 3]), ("21", [0, 1]), ("22", [2, 3])]
        assert any("rank in communicator 11, which spans all 4" in w for w in res.warnings)


def test_sub_communicator_files_of_one_host_per_folder(tmp_path):
    """The same 4 processes' files in a folder per host, a/job (pids 5100, 5101) and b/job (5102,
    5103): each folder's processes are spanned by 11 (ranks 0, 1 and 2, 3) and by their
    sub-communicator (ranks 0, 1); 11's are the larger, the world's: b's are ranks 2 and 3, and
    the two folders are one run "job" of ranks 0..3 (numbering b's processes 0, 1 would make them
    two jobs)."""
    for pid in range(5100, 5104):
        g = pid - 5100
        job = tmp_path / ("a" if g < 2 else "b") / "job"
        job.mkdir(parents=True, exist_ok=True)
        (job / f"nccl_profile_11_{g}.json").write_text(_comm_dump(g, 11, "AllReduce", 1000000, pid))
        sub, local = (21 if g < 2 else 22), g % 2
        (job / f"nccl_profile_{sub}_{local}.json").write_text(
            _comm_dump(local, sub, "AllGather", 1005000, pid)
        )
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [tmp_path / "a" / "job", tmp_path / "b" / "job"], jobs=1)
        assert list(res.runs) == ["job"]
        ranks = store.sql("SELECT pid, list(DISTINCT rank) FROM traces GROUP BY pid ORDER BY pid").rows()
        assert ranks == [("5100", [0]), ("5101", [1]), ("5102", [2]), ("5103", [3])]


def _two_hosts(folder_of, pid_of) -> None:
    """The 4 processes of test_sub_communicator_files_get_global_ranks (world 11, sub-communicators
    21 = global ranks {0, 1}, 22 = {2, 3}) on two hosts whose processes have pids 7 and 8 (rank g:
    pid ``pid_of(g)``), each file in ``folder_of(g)``."""
    for g in range(4):
        job = folder_of(g)
        job.mkdir(parents=True, exist_ok=True)
        (job / f"nccl_profile_11_{g}.json").write_text(_comm_dump(g, 11, "AllReduce", 1000000, pid_of(g)))
        sub, local = (21 if g < 2 else 22), g % 2
        (job / f"nccl_profile_{sub}_{local}.json").write_text(
            _comm_dump(local, sub, "AllGather", 1005000, pid_of(g))
        )


def test_one_pid_on_two_hosts_in_one_folder_is_refused(tmp_path):
    """Two hosts' files in one flat folder, pids 7 and 8 on each (rank g: pid 7 + g % 2): pid 7's
    files hold ranks 0 and 2 of communicator 11, so they are two processes, but 21_0 and 22_0
    (pid 7, rank 0 of a sub-communicator each) could be either's: refused naming the files and
    the fix. It was stored with 22's collectives on ranks [0, 1] (22_0 under rank 0, pid 7's
    lowest), beside 21's."""
    _two_hosts(lambda g: tmp_path / "job", lambda g: 7 + g % 2)
    with Store(tmp_path / "t.duckdb") as store, pytest.raises(TraceFormatError) as e:
        ingest(store, [tmp_path / "job"], jobs=1)
    assert str(e.value).startswith(
        f"{tmp_path / 'job' / 'nccl_profile_11_0.json'}: pid: 4 files of pid 7 (nccl_profile_11_0.json, "
        "nccl_profile_11_2.json, nccl_profile_21_0.json, nccl_profile_22_0.json) hold ranks [0, 2] of "
        "communicator 11: processes of several hosts or containers with one pid"
    )
    assert "put each host's (container's) files in a folder of its own" in str(e.value)


def test_one_pid_on_two_hosts_in_a_folder_per_host_with_run(tmp_path):
    """The same files in a folder per host (a: ranks 0, 1; b: 2, 3), ingested as one run with
    --run: a process is its folder, dump prefix and pid, so pid 7 of a and of b are two processes
    and 22's collectives are ranks [2, 3]. It was [0, 1]: the two folders' pid 7 one process,
    whose ranks 0 and 2 in 11 were a conflict left unsaid."""
    _two_hosts(lambda g: tmp_path / ("a" if g < 2 else "b"), lambda g: 7 + g % 2)
    with Store(tmp_path / "t.duckdb") as store:
        ingest(store, [tmp_path / "a", tmp_path / "b"], run="one", jobs=1)
        per_comm = store.sql("""SELECT pg, list(DISTINCT rank ORDER BY rank) FROM collectives
                                GROUP BY pg ORDER BY pg""").rows()
        assert per_comm == [("11", [0, 1, 2, 3]), ("21", [0, 1]), ("22", [2, 3])]


def test_one_pid_in_every_container_of_one_communicator(tmp_path):
    """One process per container, every one pid 7, one communicator (11, ranks 0..3) in one
    folder: pid 7's 4 files hold 4 ranks of 11, each file one rank, so each file is a process of
    its own: ranks 0..3, said (it was the same ranks, from a conflict left unsaid)."""
    job = tmp_path / "job"
    job.mkdir()
    for g in range(4):
        (job / f"nccl_profile_11_{g}.json").write_text(_comm_dump(g, 11, "AllReduce", 1000000, 7))
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [job], jobs=1)
        assert store.sql("SELECT rank FROM traces ORDER BY rank").rows() == [(0,), (1,), (2,), (3,)]
        assert (
            "NCCL profiler-plugin files: 4 files of pid 7 hold ranks [0, 1, 2, 3] of communicator 11: "
            "processes of several hosts or containers with one pid, one per file"
        ) in res.warnings


def test_two_jobs_with_the_same_pids_and_dump_prefixes_apart(tmp_path):
    """Two 2-rank jobs with the same pids (5100, 5101: containers) in one folder, told apart by
    their NCCL_PROFILE_DUMP_FILE prefix (job2_nccl_profile_ and nccl_profile_): a process writes
    every file with its one prefix, so the prefix is part of the process. Two runs of 2 ranks,
    numbered after their common lowest pid (it was one run: pid 5100 one process in 4
    communicators)."""
    job = tmp_path / "job"
    job.mkdir()
    jobs = {"nccl_profile": (6479621443159067765, 1311768467463790320), "job2_nccl_profile": (77, 88)}
    for prefix, comms in jobs.items():
        for r in (0, 1):
            for comm, (op, base) in zip(comms, (("AllReduce", 1000000), ("AllGather", 1005000)), strict=True):
                (job / f"{prefix}_{comm}_{r}.json").write_text(_comm_dump(r, comm, op, base))
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [job], jobs=1)
        assert sorted(res.runs) == ["job-pid5100-1", "job-pid5100-2"]
        rows = store.sql("""SELECT r.name, c.rank, list(DISTINCT c.pg ORDER BY c.pg) FROM collectives c
                            JOIN runs r USING (run_id) GROUP BY ALL ORDER BY ALL""").rows()
        assert rows == [
            ("job-pid5100-1", 0, ["77", "88"]),
            ("job-pid5100-1", 1, ["77", "88"]),
            ("job-pid5100-2", 0, ["1311768467463790320", "6479621443159067765"]),
            ("job-pid5100-2", 1, ["1311768467463790320", "6479621443159067765"]),
        ]


def test_plugin_clock_note_once_per_run(tmp_path):
    """4 processes, 8 files (test_sub_communicator_files_get_global_ranks), no GPU trace to align
    to: one note for the run, counting files and ranks and naming the first 3 files in rank order
    (it was a note per file, 8 lines)."""
    _two_hosts(lambda g: tmp_path / "job", lambda g: 5100 + g)
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [tmp_path / "job"], jobs=1)
    said = [w for w in res.warnings if "plugin's clock" in w]
    assert said == [
        "run 'job': NCCL profiler-plugin times of 8 file(s) of 4 rank(s) stay on the plugin's clock (no "
        "Kineto or nsys trace of their rank with collectives to align to): nccl_profile_11_0.json, "
        "nccl_profile_21_0.json, nccl_profile_11_1.json and 5 more"
    ]


def test_unknown_datatype_is_said_once_per_run_and_fp8_has_a_size(tmp_path):
    """Two ranks of communicator 5: AllReduce of 1024 x ncclFloat8e4m3 (1 byte: NCCL's name, it was
    unknown) and a file of a Datatype no table knows (ncclFoo, 3 records a rank): bytes NULL, said
    once for the run with the dtype and the count (it was silent)."""
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        fp8 = _comm_dump(r, 5, "AllReduce", 1000000).replace("ncclFloat32", "ncclFloat8e4m3")
        (job / f"nccl_profile_5_{r}.json").write_text(fp8)
        foo = _comm_dump(r, 6, "AllGather", 1005000).replace("ncclFloat32", "ncclFoo")
        (job / f"nccl_profile_6_{r}.json").write_text(foo)
    with Store(tmp_path / "t.duckdb") as store:
        res = ingest(store, [job], jobs=1)
        rows = store.sql("SELECT DISTINCT dtype, bytes_in FROM collectives ORDER BY dtype").rows()
    assert rows == [("float8e4m3", 1024), ("foo", None)]
    assert [w for w in res.warnings if "dtype" in w] == [
        "run 'job': NCCL profiler-plugin: 6 collective(s) of a dtype traceprof does not know the size of "
        "('foo' x 6): their bytes are unknown (NULL; no bandwidth for them)"
    ]


def test_communicators_that_start_together_have_their_own_pace(tmp_path):
    """Two communicators of the same 2 processes whose collectives start together (AllReduce on 647...
    and AllGather on 131..., both at W = 1000000 + 10000 k us), no steps; rank 1 40 us late at all 6.
    By hand: the pace is the spacing within a communicator, 10000 us (across the two it is 0, and
    the lateness was "4000000% of the pace"): late_pct = 40 / 10000 = 0.4 %. Held up: [W, W + 40]
    at each pair, the same 40 us for both communicators, 3 x 40 = 120 us; covered: 3 collectives
    a pace apart per communicator, 30000 us (> the 20500 us span; it was the 20500 us, 0.59 %):
    cost 120 / 30000 = 0.4 %, nobody named."""
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        for comm, op in ((6479621443159067765, "AllReduce"), (1311768467463790320, "AllGather")):
            (job / f"nccl_profile_{comm}_{r}.json").write_text(_comm_dump(r, comm, op, 1000000))
    with Store(tmp_path / "t.duckdb") as store:
        ingest(store, [job], jobs=1)
        res = analyze(store, "stragglers", "job")
        r1 = res.frame.filter(res.frame["rank"] == 1).row(0, named=True)
        assert (r1["last_count"], r1["median_lateness_ns"], r1["holdup_ns"]) == (6, 40_000, 120_000)
        assert r1["late_pct"] == pytest.approx(0.4)
        assert (r1["holdup_pct"], r1["cost_pct"]) == (pytest.approx(0.4), pytest.approx(0.4))
        assert not res.frame["named"].any()
        assert any("pace 10.00 ms" in n and "time covered 30.0 ms" in n for n in res.notes)


def test_a_dump_whose_events_lack_a_pid_has_no_process_named_none(tmp_path):
    """A plugin dump whose events carry no ``pid`` (a plugin built without it): the trace's pid was
    the text 'None' and every event's lane pid/tid 'None', read as a process named None. By hand:
    no event names a process, so the trace's pid is None (``process_id``: unstated) and the lanes
    are empty; with the plugin's ``"pid": 5100`` on every event, the trace's pid is '5100'."""
    bare = tmp_path / "nccl_profile_11_0.json"
    bare.write_text(_comm_dump(0, 11, "AllReduce", 1_000_000).replace('"pid": 5100, ', ""))
    pt = parse(bare, ParseOptions())
    assert pt.trace["pid"] is None
    assert set(pt.events["pid"].to_pylist()) == {""}
    said = tmp_path / "said" / "nccl_profile_11_0.json"
    said.parent.mkdir()
    said.write_text(_comm_dump(0, 11, "AllReduce", 1_000_000))
    pt = parse(said, ParseOptions())
    assert pt.trace["pid"] == "5100"
