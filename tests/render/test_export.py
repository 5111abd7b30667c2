"""export perfetto: one Chrome trace with every rank's events on one aligned time axis, the source's
flows and thread names, and traceprof's findings as tracks.

Perfetto's own trace processor cannot run here (``pip install perfetto`` installs, but its
``trace_processor_shell`` is a binary it downloads on first use, and this machine has no route to
Google's storage), so :func:`check_chrome_trace` checks the file against the Chrome JSON trace
format's rules (the "Trace Event Format" document Perfetto's JSON importer follows).
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections import Counter, defaultdict

from tests.conftest import SAMPLES, corpus
from traceprof.ingest.ingest import ingest
from traceprof.render.export import FINDING_TRACKS, export_perfetto

_PHASES = {"X", "B", "E", "i", "I", "s", "t", "f", "M", "C", "b", "e", "n"}
_META = {"process_name", "process_sort_index", "thread_name", "thread_sort_index", "process_labels"}


def check_chrome_trace(doc: dict) -> dict:
    """Assert ``doc`` follows the Chrome JSON trace format; return its tracks' names and flows.

    Rules: ``traceEvents`` a list; every event a known ``ph`` with integer ``pid`` and ``tid``; every
    non-metadata event a numeric ``ts`` (us) >= 0; ``X`` a ``dur`` >= 0; ``i`` a scope ``s`` in g/p/t;
    ``M`` a known metadata name with its ``args``; flow events ``s``/``f`` with ``id``, ``cat`` and
    ``name``, each (cat, id) one ``s`` and one ``f`` (``bp: "e"``: bound to the enclosing slice), the
    ``f`` not before the ``s``, and each end inside an ``X`` slice of its own track (what a viewer binds
    the arrow to); every track and process used named by metadata.
    """
    assert isinstance(doc["traceEvents"], list)
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    threads, processes, flows = {}, {}, defaultdict(dict)
    for e in doc["traceEvents"]:
        assert e["ph"] in _PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in _META and isinstance(e["args"], dict), e
            if e["name"] == "thread_name":
                threads[(e["pid"], e["tid"])] = e["args"]["name"]
            if e["name"] == "process_name":
                processes[e["pid"]] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int | float) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "i":
            assert e.get("s") in ("g", "p", "t"), e
        elif e["ph"] in ("s", "f"):
            assert "id" in e and e["cat"] and e["name"], e
            assert e["ph"] not in flows[(e["cat"], e["id"])], f"two {e['ph']} for flow {e['id']}"
            if e["ph"] == "f":
                assert e.get("bp") == "e", e
            flows[(e["cat"], e["id"])][e["ph"]] = e
    for v in slices.values():
        v.sort()
    for key, ends in flows.items():
        assert set(ends) == {"s", "f"}, (key, ends)
        assert ends["f"]["ts"] >= ends["s"]["ts"], ends
        for end in ends.values():
            track = slices[(end["pid"], end["tid"])]
            i = bisect.bisect_right(track, (end["ts"], float("inf")))
            assert any(a <= end["ts"] <= b for a, b in track[max(i - 50, 0) : i]), (
                f"flow end outside a slice: {end}"
            )
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] != "M"}
    assert used <= set(threads), used - set(threads)
    assert {p for p, _ in used} <= set(processes)
    return {"threads": threads, "processes": processes, "flows": Counter(cat for cat, _ in flows)}


def test_export_all_ranks_aligned(store, tmp_path):
    ingest(store, [corpus("hta/trace_filter")])
    n = export_perfetto(store, None, tmp_path / "t.json.gz", findings=False)
    doc = json.loads(gzip.open(tmp_path / "t.json.gz").read())
    info = check_chrome_trace(doc)
    slices = [e for e in doc["traceEvents"] if e["ph"] in ("X", "i")]
    flow_ends = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    stored = store.sql("SELECT count(*) AS n, min(ts_ns) AS t0 FROM events").row(0, named=True)
    assert len(slices) == stored["n"] and n == len(doc["traceEvents"])  # the metadata counted too
    # 2 ranks x 3 processes x (name, sort index) and (name, sort index) per thread
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    assert n == len(slices) + len(flow_ends) + len(meta) and len(meta) == 12 + 2 * len(info["threads"])
    # The first kernel of rank 1, located by name and stream, sits at (ts_ns - t0) / 1000 us on the
    # track named for its stream in the process "rank 1 GPU".
    k = store.sql(
        "SELECT name, device, stream, ts_ns, dur_ns FROM events WHERE rank = 1 AND kind = 'kernel' ORDER BY ts_ns LIMIT 1"
    ).row(0, named=True)
    gpu1 = next(p for p, name in info["processes"].items() if name == "rank 1 GPU")
    tid = next(
        t
        for (p, t), name in info["threads"].items()
        if p == gpu1 and name == f"dev {k['device']} stream {k['stream']}"
    )
    match = [e for e in slices if (e["pid"], e["tid"]) == (gpu1, tid) and e["name"] == k["name"]]
    assert match[0]["ts"] == (k["ts_ns"] - stored["t0"]) / 1000 and match[0]["dur"] == k["dur_ns"] / 1000
    assert set(info["processes"].values()) == {
        f"rank {r}{w}" for r in (0, 1) for w in ("", " GPU", " findings")
    }


def test_export_keeps_the_sources_flows_and_thread_names(store, tmp_path):
    # hta/nccl_parser_config holds 4,405 flow starts and 9,195 flow ends: 543 fwdbwd pairs, and ac2g
    # records of which 3,862 starts and 8,652 ends (the profiler writes ends without a start). The store
    # keeps links as ids, so the export draws one ac2g arrow per GPU kernel, copy or set whose launch
    # (a runtime call with the same args.correlation) is in the trace, and one fwdbwd arrow per forward
    # op and backward op sharing a "Sequence number": counted here from the source file itself.
    src = corpus("hta/nccl_parser_config")
    raw = json.loads(gzip.open(next(src.glob("*.json.gz"))).read())["traceEvents"]
    source_flows = Counter((e["ph"], e["cat"]) for e in raw if e.get("ph") in ("s", "f"))
    assert source_flows[("s", "fwdbwd")] == source_flows[("f", "fwdbwd")] == 543
    assert sum(v for (ph, _), v in source_flows.items() if ph == "s") == 4_405
    assert sum(v for (ph, _), v in source_flows.items() if ph == "f") == 9_195
    launches = {
        e["args"]["correlation"]
        for e in raw
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    gpu = [e for e in raw if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    launched = sum(1 for e in gpu if e["args"].get("correlation") in launches)
    ingest(store, [src])
    export_perfetto(store, None, tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    info = check_chrome_trace(doc)
    assert info["flows"]["fwdbwd"] == 543
    assert info["flows"]["ac2g"] == launched == 3_774
    # thread names as the source's thread_name metadata gave them
    names = set(info["threads"].values())
    assert {"thread 2910249 (pt_main_thread)", "dev 0 stream 7"} <= names
    # the findings: exposed communication, idle gaps with their cause, the critical path
    assert {"exposed communication", "idle (cause), dev 0 stream 7", "critical path"} <= names
    tracks = {
        t: name.split(",")[0] for t, name in info["threads"].items() if name.split(",")[0] in FINDING_TRACKS
    }
    by_track = Counter(
        tracks[(e["pid"], e["tid"])]
        for e in doc["traceEvents"]
        if e["ph"] == "X" and (e["pid"], e["tid"]) in tracks
    )
    assert all(by_track[t] > 0 for t in ("exposed communication", "idle (cause)", "critical path")), by_track
    # slices on one findings track nest or follow each other, never overlap partly (a viewer drops those)
    for t in tracks:
        spans = sorted(
            (e["ts"], round(e["ts"] + e["dur"], 3))
            for e in doc["traceEvents"]
            if e["ph"] == "X" and (e["pid"], e["tid"]) == t
        )
        stack: list[float] = []
        for a, b in spans:
            while stack and stack[-1] <= a:
                stack.pop()
            assert not stack or b <= stack[-1] + 1e-3, (info["threads"][t], a, b, stack[-1])
            stack.append(b)
    idle = {
        e["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "X" and tracks.get((e["pid"], e["tid"])) == "idle (cause)"
    }
    assert idle <= {"idle: host wait", "idle: kernel wait", "idle: other"} and "idle: host wait" in idle


def test_export_straggler_waits_are_clock_aligned_across_ranks(store, tmp_path):
    # straggler_rank2 (4 ranks, rank 2 sleeps before its all-reduces): each rank's straggler-wait slice
    # runs from its own arrival to the last arrival, so on one aligned time axis every wait slice of
    # one collective ends at the same instant, and the rank waited for is rank 2.
    ingest(store, [SAMPLES / "straggler_rank2"])
    export_perfetto(store, None, tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    info = check_chrome_trace(doc)
    waits = [
        e
        for e in doc["traceEvents"]
        if e["ph"] == "X" and info["threads"].get((e["pid"], e["tid"])) == "straggler wait"
    ]
    assert Counter(e["name"].split(" at ")[0] for e in waits).most_common(1)[0][0] == "wait for rank 2"
    ranks = {info["processes"][e["pid"]] for e in waits}
    assert ranks >= {"rank 0 findings", "rank 1 findings", "rank 3 findings"}
    st = store.sql(
        "SELECT count(DISTINCT instance_id) AS n FROM collectives WHERE run_id = 1 AND instance_id IS NOT NULL"
    ).row(0)[0]
    ends = Counter(round(e["ts"] + e["dur"], 3) for e in waits)
    # one end per collective instance (waits of the instance's ranks all end at its last arrival)
    assert len(ends) <= st and max(ends.values()) >= 3
    # the DDP buckets' all-reduces are in flight at once, so a rank's waits overlap: on the track
    # each keeps its part past the earlier ones (no slice overlaps another, which a viewer drops),
    # and per rank the slices add up to stragglers' wall-clock wait_ns (rank 0: 136,945,424 ns of
    # a 223.6 ms window; the per-collective waits add up to 386.5 ms)
    per_rank: dict[str, list[tuple[float, float]]] = {}
    for e in waits:
        per_rank.setdefault(info["processes"][e["pid"]], []).append((e["ts"], e["dur"]))
    for spans in per_rank.values():
        spans.sort()
        assert all(a + d <= b + 1e-3 for (a, d), (b, _) in zip(spans, spans[1:], strict=False))
    from tests.conftest import analyze

    wall = analyze(store, "stragglers", None).frame.select("rank", "wait_ns").rows()
    total = {
        f"rank {r} findings": sum(round(d * 1000) for _, d in per_rank.get(f"rank {r} findings", []))
        for r, _ in wall
    }
    assert [(total[f"rank {r} findings"], w) for r, w in wall] == [(w, w) for _, w in wall]
    assert dict(wall)[0] == 136_945_424


def test_export_of_a_two_rank_gpu_run_has_every_findings_track(store, tmp_path):
    # hta/trace_filter (2 GPU ranks, NCCL): all four findings tracks are drawn, and the whole file
    # keeps the format's rules (flows bound inside slices, integer ids, named tracks).
    ingest(store, [corpus("hta/trace_filter")])
    export_perfetto(store, None, tmp_path / "t.json")
    info = check_chrome_trace(json.loads((tmp_path / "t.json").read_text()))
    tracks = {name.split(",")[0] for name in info["threads"].values()}
    assert set(FINDING_TRACKS) <= tracks
    assert info["flows"]["ac2g"] > 0 and info["flows"]["fwdbwd"] > 0
