"""_replay's compact build (issue 34: memory) against the straightforward computation kept here.

``_replay.build`` reads the items into arrays once, finds dependencies and makes node columns a
chunk of ranks or a column at a time, with int32 indices; ``compute_items`` works on chunks of
whole ranks; ``_whatif_blame.charged`` backward-fills on node arrays. Each must give what the plain
whole-run frame code gave (kept below as the reference): the same nodes, edges and levels.
"""

from __future__ import annotations

import weakref

import numpy as np
import polars as pl
import pytest

from tests.analyses.test_whatif import _gen_job
from tests.conftest import SAMPLES
from traceprof.analyses import _replay, _whatif_blame, whatif
from traceprof.ingest.ingest import ingest


def _reference_graph(comp: pl.DataFrame, comm: pl.DataFrame, eps: int) -> dict[str, object]:
    """The replay graph by the module doc, one frame for the whole run: nodes (items, instances,
    comm ends, before ordering by level), edges (src, dst) and each node's level by Kahn's rule."""
    c = comp.filter(pl.col("step").is_not_null()).select(
        pl.lit(0).alias("kind"), "rank", "step", pl.col("name").alias("key0"), "start_ns", "end_ns",
        pl.lit(None, pl.Int64).alias("instance_id"),
    )  # fmt: skip
    m = comm.filter(
        pl.col("step").is_not_null() & pl.col("end_ns").is_not_null() & pl.col("arrival_ns").is_not_null()
    ).with_columns(pl.col("arrival_ns").max().over("instance_id").alias("last_ns"))
    key0 = pl.concat_str(
        [pl.col("op"), pl.col("pg").fill_null("").str.replace_all(r"\d+", "#"),
         pl.col("bytes").cast(pl.Utf8).fill_null("?")], separator="|",
    )  # fmt: skip
    k = m.select(pl.lit(1).alias("kind"), "rank", "step", key0.alias("key0"),
                 pl.col("arrival_ns").alias("start_ns"), "end_ns", "instance_id")  # fmt: skip
    both = pl.concat([c, k])
    uniq = both["key0"].drop_nulls().unique().sort()
    both = both.with_columns(
        pl.col("key0").replace_strict(uniq, pl.int_range(uniq.len(), eager=True), default=None)
    )
    items = both.sort("rank", "step", "start_ns", "end_ns", "kind", "key0", "instance_id", nulls_last=True)
    t0 = int(items["start_ns"].min() or 0)  # type: ignore[arg-type]
    items = items.with_columns(pl.col("start_ns") - t0, pl.col("end_ns") - t0)
    items = items.with_columns(
        (pl.col("key0") * _replay.KEY_SPAN + pl.int_range(pl.len()).over("rank", "step", "key0")).alias("key")
    )
    items = items.join(m.select("instance_id", pl.col("last_ns") - t0).unique(), on="instance_id", how="left")
    ss = items.join(items.group_by("step").agg(pl.col("start_ns").min().alias("ss")), on="step", how="left")[
        "ss"
    ]
    start, end = items["start_ns"].to_numpy(), items["end_ns"].to_numpy()
    group = items.select(pl.struct("rank", "step").rle_id())[:, 0].to_numpy()
    # happens-before by the definition (_deps_of), item by item in each (rank, step)
    src, dst = [], []
    slack = _replay._OVERLAP_SHARE * (end - start)
    for g in np.unique(group):
        idx = np.nonzero(group == g)[0]
        for v in range(len(idx)):
            for u in _replay._deps_of(start[idx], end[idx], slack[idx], eps, v):
                src.append(idx[u])
                dst.append(idx[v])
    src_a, dst_a = np.array(src, np.int64), np.array(dst, np.int64)
    ready = ss.to_numpy().astype(np.float64)
    np.maximum.at(ready, dst_a, end[src_a].astype(np.float64))
    last = items["last_ns"].to_numpy().astype(np.float64)
    is_comm = items["kind"].to_numpy() == 1
    gap = np.maximum(start - ready, 0.0)
    dur = np.where(is_comm, np.maximum(end - np.nan_to_num(last), 0.0), end - start).astype(np.float64)
    n = items.height
    ci = np.nonzero(is_comm)[0]
    inst = items["instance_id"].to_numpy()
    ids, of = np.unique(inst[ci].astype(np.int64), return_inverse=True)
    end_node = n + len(ids) + np.arange(len(ci))
    out = np.arange(n)
    out[ci] = end_node
    e_src = np.concatenate([out[src_a], ci, n + of]).astype(np.int64)
    e_dst = np.concatenate([dst_a, n + of, end_node]).astype(np.int64)
    nn = n + len(ids) + len(ci)
    level = np.zeros(nn, np.int64)
    indeg = np.bincount(e_dst, minlength=nn)
    frontier, lvl = list(np.nonzero(indeg == 0)[0]), 0
    succ: dict[int, list[int]] = {}
    for s, d in zip(e_src.tolist(), e_dst.tolist(), strict=True):
        succ.setdefault(s, []).append(d)
    while frontier:
        nxt = []
        for f in frontier:
            level[f] = lvl
            for d in succ.get(int(f), []):
                indeg[d] -= 1
                if indeg[d] == 0:
                    nxt.append(d)
        frontier, lvl = nxt, lvl + 1
    inst_step = np.zeros(len(ids), np.int64)
    inst_step[of] = items["step"].to_numpy()[ci]
    nodes = pl.DataFrame(
        {
            "kind": np.concatenate([is_comm.astype(np.int64), np.full(len(ids), 2), np.full(len(ci), 3)]),
            "rank": np.concatenate([items["rank"].to_numpy(), np.full(len(ids), -1), items["rank"].to_numpy()[ci]]),
            "step": np.concatenate([items["step"].to_numpy(), inst_step, items["step"].to_numpy()[ci]]),
            "key": pl.concat([items["key"], pl.Series([None] * len(ids), dtype=pl.Int64), items["key"].gather(ci)]),
            "instance": np.concatenate([np.where(is_comm, np.nan_to_num(inst.astype(np.float64), nan=-1), -1).astype(np.int64), ids, inst[ci].astype(np.int64)]),
            "gap": np.concatenate([gap, np.zeros(len(ids) + len(ci))]),
            "dur": np.concatenate([np.where(is_comm, 0.0, dur), np.zeros(len(ids)), dur[ci]]),
            "end": np.concatenate([np.where(is_comm, start, end).astype(np.float64), np.full(len(ids), np.nan), end[ci].astype(np.float64)]),
        }
    )  # fmt: skip
    has_pred = np.zeros(nn, bool)
    has_pred[e_dst] = True
    base = np.concatenate([ss.to_numpy().astype(np.float64), np.zeros(len(ids) + len(ci))])
    nodes = nodes.with_columns(pl.Series("base", np.where(has_pred, -np.inf, base)))
    return {
        "nodes": nodes,
        "edges": (e_src, e_dst),
        "level": level,
        "names": uniq.str.split("|").list.first(),
    }


def _job(store, tmp_path, job) -> int:
    if isinstance(job, dict):
        ingest(store, [_gen_job(tmp_path / "job", **job)], run="job")
        return store.resolve_run("job")
    if not (SAMPLES / job / "rank0.trace.json.gz").exists():
        pytest.skip(f"{job} not recorded")
    ingest(store, [SAMPLES / job])
    return store.resolve_run(job)


_CASES = {
    "8-ranks-subgroups-of-4": {"ranks": 8, "group": 4, "steps": 3, "events": 300},
    "5-of-6-ranks-traced": {"ranks": 6, "group": 3, "steps": 2, "events": 200, "drop": 4},
    "sample-straggler-rank2": "straggler_rank2",
}


@pytest.mark.parametrize("job", list(_CASES.values()), ids=list(_CASES))
@pytest.mark.parametrize("chunk", [7, 1 << 18], ids=["chunks-of-7-rows", "one-chunk"])
def test_build_equals_the_reference_graph(store, tmp_path, monkeypatch, job, chunk):
    """The compact build (chunks of whole ranks of ``chunk`` rows for compute_items and the
    dependencies) gives the reference graph: every node's kind, rank, step, key, instance, gap,
    dur, end and base (in level order), the same edges, each node at its Kahn level, int32 indices."""
    run_id = _job(store, tmp_path, job)
    monkeypatch.setattr(_replay, "_CHUNK_ROWS", chunk)
    comm, _ = _replay.comm_items(store, run_id, None)
    comp = _replay.compute_items(store, run_id)
    tl = _replay.build(comp, comm)
    ref = _reference_graph(comp, comm, _replay.EPS_NS)
    level = ref["level"]
    perm = np.argsort(level, kind="stable")  # type: ignore[arg-type]
    want = ref["nodes"][perm]  # type: ignore[index]
    assert tl.nodes.cast(want.schema).equals(want, null_equal=True)
    assert tl.pred.dtype == np.int32 and tl.nodes.schema["kind"] == pl.Int8
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    e_src, e_dst = ref["edges"]  # type: ignore[misc]
    targets = np.repeat(np.arange(tl.nodes.height), np.diff(tl.pred_ptr))
    got = sorted(zip(targets.tolist(), tl.pred.tolist(), strict=True))
    assert got == sorted(zip(inv[e_dst].tolist(), inv[e_src].tolist(), strict=True))
    lv = np.sort(level)  # type: ignore[arg-type]
    assert all(lv[a] == lv[b - 1] == i for i, (a, b) in enumerate(tl.levels)) and tl.levels[-1][1] == len(lv)
    assert len(tl.levels) == int(lv.max()) + 1
    assert tl.names.equals(ref["names"])  # type: ignore[arg-type]
    assert comp.columns == ["rank", "step", "name", "start_ns", "end_ns"]


def test_compute_items_by_chunk_equals_the_whole_run(store, tmp_path, monkeypatch):
    """compute_items on chunks of whole ranks (7 rows: every rank its own chunk) is the frame the
    whole run gives at once, row for row (sorted by rank, lane, start, longest first, name)."""
    run_id = _job(store, tmp_path, _CASES["8-ranks-subgroups-of-4"])
    whole = _replay.compute_items(store, run_id)
    monkeypatch.setattr(_replay, "_CHUNK_ROWS", 7)
    assert _replay.compute_items(store, run_id).equals(whole)
    assert whole.height and whole["rank"].n_unique() == 8


def _reference_charged(nodes: pl.DataFrame) -> np.ndarray:
    """_whatif_blame.charged as frames (the definition): the last-arrival flag of each arrival,
    backward-filled in node order over (rank, step); a comm end takes its arrival's."""
    n = nodes.select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("i"), "kind", "rank", "step", "instance",
        pl.when(pl.col("kind") == 1).then(pl.col("end")).alias("arr"),
    )  # fmt: skip
    arr = (
        n.filter(pl.col("kind") == 1)
        .group_by("instance")
        .agg(pl.col("arr").max().alias("top"), (pl.col("arr") == pl.col("arr").max()).sum().alias("k"))
    )
    items = (
        n.filter(pl.col("kind") <= 1).join(arr, on="instance", how="left").sort("i")
        .with_columns(pl.when(pl.col("kind") == 1).then((pl.col("arr") == pl.col("top")) & (pl.col("k") == 1)).alias("last"))
    )  # fmt: skip
    items = items.with_columns(
        pl.col("last").backward_fill().over("rank", "step").fill_null(False).alias("charged")
    )
    out = np.zeros(nodes.height, bool)
    out[items["i"].to_numpy()] = items["charged"].to_numpy()
    tx = n.filter(pl.col("kind") == 3).join(
        items.filter(pl.col("kind") == 1).select("instance", "rank", "charged"),
        on=["instance", "rank"],
        how="left",
    )
    out[tx["i"].to_numpy()] = tx["charged"].fill_null(False).to_numpy()
    return out


@pytest.mark.parametrize("job", list(_CASES.values()), ids=list(_CASES))
def test_charged_equals_the_frame_definition(store, tmp_path, job):
    """_whatif_blame.charged on node arrays charges exactly the nodes the frame definition does."""
    run_id = _job(store, tmp_path, job)
    comm, _ = _replay.comm_items(store, run_id, None)
    tl = _replay.build(_replay.compute_items(store, run_id), comm)
    got, want = _whatif_blame.charged(tl.nodes), _reference_charged(tl.nodes)
    assert np.array_equal(got, want)
    assert 0 < got.sum() < len(got)  # some nodes charged, not all


def _reference_ideal(nodes: pl.DataFrame, pool: str, ideal: str) -> tuple[np.ndarray, ...]:
    """whatif._ideal as it grouped before: by the two columns kind and key (and step)."""
    by = ["kind", "key", "step"] if pool == "step" else ["kind", "key"]
    d_typ = pl.col("dur").median().over(by)
    if ideal == "mean":
        d_typ = pl.when(pl.col("kind") == 0).then(pl.col("dur").mean().over(by)).otherwise(d_typ)
    med = nodes.select(pl.col("gap").median().over(by).alias("g"), d_typ.alias("d"))
    g_med = med["g"].fill_null(0.0).to_numpy()
    g, d = g_med, med["d"].fill_null(0.0).to_numpy()
    if ideal == "min":
        g, d = np.minimum(g, nodes["gap"].to_numpy()), np.minimum(d, nodes["dur"].to_numpy())
    inst = nodes["kind"].to_numpy() == 2
    return np.where(inst, 0.0, g), np.where(inst, 0.0, d), np.where(inst, 0.0, g_med)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("pool", ["all", "step"])
@pytest.mark.parametrize("ideal", ["mean", "median", "min"])
def test_ideal_on_one_key_equals_the_two_column_grouping(seed: int, pool: str, ideal: str) -> None:
    """whatif._ideal groups (kind, key) as one integer: bit for bit the figures of grouping the two
    columns, on random nodes (instance nodes with null keys, keys sharing a key0 across kinds,
    float gaps and durations whose sums depend on their order), and on keys too large to combine."""
    rng = np.random.default_rng(seed)
    n = 3_000
    kind = rng.integers(0, 4, n).astype(np.int8)
    key = rng.integers(0, 5, n) * _replay.KEY_SPAN + rng.integers(0, 7, n)
    nodes = pl.DataFrame(
        {
            "kind": kind,
            "step": rng.integers(0, 3, n).astype(np.int32),
            "key": pl.Series(key).set(pl.Series(kind == 2), None),
            "gap": rng.random(n) * 1e6,
            "dur": rng.random(n) * 1e7 + rng.integers(0, 2, n) * 1e-3,
        }
    )
    for frame in (nodes, nodes.with_columns(pl.col("key") + 2**61)):  # the second: two columns kept
        got, want = whatif._ideal(frame, pool, ideal), _reference_ideal(frame, pool, ideal)
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)
    assert (whatif._ideal(nodes, pool, ideal)[1] > 0).sum() > n // 2


def _same_timeline(a: _replay.Timeline, b: _replay.Timeline) -> None:
    assert a.nodes.equals(b.nodes, null_equal=True)
    assert np.array_equal(a.pred_ptr, b.pred_ptr) and np.array_equal(a.pred, b.pred)
    assert a.levels == b.levels and a.names.equals(b.names)
    assert a.step_start.sort("step").equals(b.step_start.sort("step"))  # a group_by's: any row order


def test_build_lets_go_of_the_items_a_function_gives_before_its_peak(store, tmp_path, monkeypatch):
    """Given a function for its compute items (whatif's, which lets go of the session's copy), the
    build calls it once and holds its frame no longer than it reads it: dead before the
    dependencies are found (not under the build's peak); the graph is the one the frame gives."""
    run_id = _job(store, tmp_path, _CASES["8-ranks-subgroups-of-4"])
    comm, _ = _replay.comm_items(store, run_id, None)
    want = _replay.build(_replay.compute_items(store, run_id), comm)
    made: list[weakref.ref[pl.DataFrame]] = []

    def items() -> pl.DataFrame:
        comp = _replay.compute_items(store, run_id)  # a bare store: made anew, held by nobody else
        made.append(weakref.ref(comp))
        return comp

    alive: list[bool] = []
    real = _replay._deps_by_chunk

    def deps(*args: object) -> object:
        alive.append(made[-1]() is not None)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_replay, "_deps_by_chunk", deps)
    _same_timeline(_replay.build(items, comm), want)
    assert len(made) == 1 and alive == [False]


def test_a_second_attempt_after_a_cycle_calls_the_items_function_again(store, tmp_path, monkeypatch):
    """On a cycle (here the first levelling says so) the build starts again, dependencies on copies
    that ended early dropped, from the items the function gives again (the first frame let go of):
    the graph a frame's second attempt gives."""
    run_id = _job(store, tmp_path, _CASES["8-ranks-subgroups-of-4"])
    comm, _ = _replay.comm_items(store, run_id, None)
    comp = _replay.compute_items(store, run_id)
    want = _replay.build(comp, comm, _drop_early=True)
    real = _replay._levels
    tries: list[int] = []

    def levels(e_src: np.ndarray, e_dst: np.ndarray, n_nodes: int) -> object:
        tries.append(n_nodes)
        return 5 if len(tries) == 1 else real(e_src, e_dst, n_nodes)  # 5 nodes left: a cycle

    calls: list[int] = []

    def items() -> pl.DataFrame:
        calls.append(1)
        return _replay.compute_items(store, run_id)

    monkeypatch.setattr(_replay, "_levels", levels)
    _same_timeline(_replay.build(items, comm), want)
    assert len(calls) == 2 and len(tries) == 2
