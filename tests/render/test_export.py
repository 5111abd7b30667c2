"""export perfetto: one Chrome trace with every rank's events on one aligned time axis."""

from __future__ import annotations

import gzip
import json

from tests.conftest import corpus
from traceprof.ingest.ingest import ingest
from traceprof.render.export import export_perfetto


def test_export_all_ranks_aligned(store, tmp_path):
    ingest(store, [corpus("hta/trace_filter")])
    n = export_perfetto(store, None, tmp_path / "t.json.gz")
    doc = json.loads(gzip.open(tmp_path / "t.json.gz").read())
    events = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    stored = store.sql("SELECT count(*) AS n, min(ts_ns) AS t0 FROM events").row(0, named=True)
    assert n == len(events) == stored["n"]
    # The first kernel of rank 1, located by name and stream, sits at (ts_ns - t0) / 1000 us.
    k = store.sql(
        "SELECT name, device, stream, ts_ns, dur_ns FROM events WHERE rank = 1 AND kind = 'kernel' ORDER BY ts_ns LIMIT 1"
    ).row(0, named=True)
    match = [
        e
        for e in events
        if e["pid"] == 3 and e["tid"] == f"dev {k['device']} stream {k['stream']}" and e["name"] == k["name"]
    ]
    assert match[0]["ts"] == (k["ts_ns"] - stored["t0"]) / 1000 and match[0]["dur"] == k["dur_ns"] / 1000
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 0 GPU", "rank 1", "rank 1 GPU"}
