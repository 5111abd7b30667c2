"""parallelism: the mesh, exposed communication per axis, pipeline bubbles, all-to-all load, slow stages."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.builders import BASE, SHIFT_US, collective_args, step, write_ndtimeline
from tests.conftest import SAMPLES, analyze, corpus
from traceprof.analyses import _alltoall, _mesh, _pipeline, parallelism
from traceprof.core.errors import UsageError
from traceprof.engine import findings, verdict
from traceprof.ingest.ingest import ingest

US = 1000  # ns per us


def _write(
    path: Path, events: list[dict], rank: int, world: int, pg_config: list[dict], backend: str = "nccl"
) -> None:
    """A new-style Kineto trace (event ``ts`` us at BASE + ts * 1000 ns) with process groups."""
    events = [{**e, "ts": e["ts"] + SHIFT_US} for e in events]
    doc = {
        "baseTimeNanoseconds": BASE - SHIFT_US * 1000,
        "traceEvents": events,
        "distributedInfo": {
            "rank": rank,
            "world_size": world,
            "backend": backend,
            "pg_count": len(pg_config),
            "pg_config": pg_config,
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _kernel(name: str, ts: float, dur: float, corr: int, stream: int, **args: object) -> list[dict]:
    """A runtime launch (1 us before) and its GPU kernel on device 0, ``stream``."""
    return [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": ts - 1,
            "dur": 0.5,
            "args": {"correlation": corr},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": stream,
            "ts": ts,
            "dur": dur,
            "args": {"correlation": corr, "device": 0, "stream": stream, **args},
        },
    ]


def _pg(name: str, desc: str, ranks: list[int]) -> dict:
    return {
        "pg_name": name,
        "pg_desc": desc,
        "backend_config": "cuda:nccl",
        "pg_size": len(ranks),
        "ranks": ranks,
    }


def _allreduce(pg: str, ranks: list[int], seq: int) -> dict:
    return collective_args(seq=seq, pg=pg, ranks=ranks, nelems=1024, out_nelems=1024)


def _mesh_2x2(
    folder: Path,
    dp_desc: str = "mesh_dp",
    tp_desc: str = "mesh_tp",
    slow: tuple[int, ...] = (),
    extra: tuple[dict, ...] = (),
) -> None:
    """Four GPU ranks, DeviceMesh (dp 2, tp 2): dp groups {0, 2}, {1, 3} (pg 1, 2), tp groups {0, 1},
    {2, 3} (pg 3, 4). Every rank, in us: compute [0, 100] and [160, 200]; tp all-reduce [100, 160];
    dp all-reduce [180, 260]; a second tp all-reduce [230, 290]. Ranks in ``slow`` compute [0, 150]
    instead of [0, 100]."""
    for r in range(4):
        dp = [r % 2, r % 2 + 2]
        tp = [r // 2 * 2, r // 2 * 2 + 1]
        dp_pg, tp_pg = str(1 + r % 2), str(3 + r // 2)
        ev = [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": -5,
                "dur": 305,
            }
        ]
        ev += _kernel("sm90_gemm_kernel", 0, 150 if r in slow else 100, 10, 7) + _kernel(
            "sm90_gemm_kernel", 160, 40, 11, 7
        )
        ev += _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 60, 12, 20, **_allreduce(tp_pg, tp, 1))
        ev += _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 180, 80, 13, 21, **_allreduce(dp_pg, dp, 1))
        ev += _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 230, 60, 14, 20, **_allreduce(tp_pg, tp, 2))
        pgs = [_pg("0", "default_pg", [0, 1, 2, 3]), _pg(dp_pg, dp_desc, dp), _pg(tp_pg, tp_desc, tp)]
        pgs += [g for g in extra if r in g["ranks"]]
        _write(folder / f"rank{r}.json", ev, r, 4, pgs)


def test_dp_tp_mesh_and_exposed_communication_per_axis_by_hand(store, tmp_path):
    _mesh_2x2(tmp_path / "run")
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    # dp groups {0, 2} step by 2 ranks, tp groups {0, 1} by 1: dp is the outer axis. rank = 2 dp + tp.
    assert res.ranks.columns == ["rank", "traced", "dp", "tp"]
    assert res.ranks.select("rank", "dp", "tp").rows() == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    # Per rank: communication [100, 160] u [180, 290] = 170 us, compute [0, 100] u [160, 200];
    # exposed = 170 - [180, 200] = 150 us: [100, 160] (tp), [200, 290] where dp runs to 260 and the
    # second tp all-reduce from 230. The rule gives [230, 260], under both, to tp: tp 60 + 60 = 120,
    # dp [200, 230] = 30 us. Four ranks: tp 480, dp 120 us; total 600 us = overlap's total.
    frame = {r["axis"]: r for r in res.frame.iter_rows(named=True)}
    assert set(frame) == {"tp", "dp"}
    assert frame["tp"]["exposed_comm_ns"] == 480 * US and frame["dp"]["exposed_comm_ns"] == 120 * US
    assert frame["tp"]["comm_ns"] == 4 * 120 * US and frame["dp"]["comm_ns"] == 4 * 80 * US
    # dp's own exposed part is [200, 260]: 60 of its 80 us, so 20 us hidden (25%); tp hides nothing.
    assert frame["dp"]["hidden_ns"] == 4 * 20 * US and frame["dp"]["hidden_pct"] == pytest.approx(25.0)
    assert frame["tp"]["hidden_pct"] == 0.0
    assert (frame["tp"]["size"], frame["tp"]["groups"], frame["tp"]["collectives"]) == (2, 2, 8)
    assert frame["dp"]["found_by"].startswith("named groups (mesh_dp")
    overlap = analyze(store, "overlap", "run")
    assert int(overlap.frame["exposed_comm_ns"].sum()) == 600 * US == int(res.frame["exposed_comm_ns"].sum())
    per_rank = res.axis_ranks.group_by("rank").agg(pl.col("exposed_comm_ns").sum()).sort("rank")
    assert per_rank.rows() == overlap.frame.select("rank", "exposed_comm_ns").sort("rank").rows()
    # rank 3 is in dp replica 1 and tp group 2, 3: a verdict names it with its group
    assert _pipeline.rank_labels(res.ranks)[3] == "dp replica 1, tp group 2, 3"
    assert res.stages.is_empty() and res.alltoall.is_empty()
    _declared(res)


def test_a_stated_mesh_replaces_the_inferred_one(store, tmp_path):
    _mesh_2x2(tmp_path / "run")
    ingest(store, [tmp_path / "run"])
    # Stated as tp outer, dp inner: rank = 2 tp + dp, so rank 1 is tp 0, dp 1; the groups {0, 1}
    # now vary along dp and {0, 2} along tp: the labels follow the stated mesh. Per rank, "tp" (the
    # [180, 260] all-reduce) comes first in the rule and takes [200, 260] = 60 us; "dp" ([100, 160]
    # and [230, 290]) the rest, 60 + [260, 290] 30 = 90 us. Four ranks: tp 240, dp 360 us.
    res = analyze(store, "parallelism", "run", mesh="tp:2,dp:2")
    assert res.ranks.select("rank", "tp", "dp").rows() == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    frame = dict(res.frame.select("axis", "exposed_comm_ns").rows())
    assert frame == {"tp": 240 * US, "dp": 360 * US}
    assert res.frame["found_by"].to_list() == ["stated (-p mesh=tp:2,dp:2)"] * 2
    for bad, why in (("tp:2,dp:3", "multiply to 6"), ("tp:2,tp:2", "given twice"), ("tp-2", "axis:size")):
        with pytest.raises(UsageError, match=why):
            analyze(store, "parallelism", "run", mesh=bad)


def test_a_slow_data_parallel_replica_is_named_as_the_replica(store, tmp_path):
    # Replica dp 1 (ranks 2, 3) computes [0, 150] u [160, 200] = 190 us per step, replica 0 140 us.
    # Each rank's peer on the other replica (same tp coordinate) computes 140: +35.7% > 10%; the
    # extra 50 us is 17.2% of their 290 us step (first to last kernel): a slow replica.
    _mesh_2x2(tmp_path / "run", slow=(2, 3))
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    slow = res.slow.filter(pl.col("slow"))
    assert slow.select("kind", "axis", "index", "ranks", "compute_ns", "peers_ns").rows() == [
        ("replica", "dp", 1, [2, 3], 190 * US, 140 * US)
    ]
    assert slow["excess_pct"][0] == pytest.approx(100 * 50 / 140) and slow["cost_pct"][0] == pytest.approx(
        100 * 50 / 290
    )
    assert res.mesh_view().absorbed([0, 2, 3]) == {2, 3}
    v = verdict.combined_verdict(store, "run")
    assert v.text.startswith(
        "slow replica: data-parallel replica 1 (ranks 2, 3) computes 0.2 ms per step, 36% more"
    )
    assert 2 not in v.stragglers and 3 not in v.stragglers and v.straggling


def test_gloo_device_mesh_groups_come_from_the_flight_recorder(store, tmp_path):
    # A dp 2 x tp 2 DeviceMesh on gloo: Kineto's gloo rows name no group; the Flight Recorder dump
    # (torch 2.13's gloo dump: no member ranks in pg_config, the group's name and description per
    # entry) names the group of the entry created while the rank enqueued each all-reduce. Rank r,
    # in us: compute [0, 100] and [160, 200] (training thread); tp all-reduce enqueued at 100, run on
    # gloo thread 30 over [101, 160]; dp all-reduce enqueued at 170, on thread 40 over [180, 260].
    # Exposed per rank: [101, 160] = 59 us tp, [200, 260] = 60 us dp; four ranks: 236 and 240 us.
    for r in range(4):
        dp, tp = [r % 2, r % 2 + 2], [r // 2 * 2, r // 2 * 2 + 1]
        dp_pg, tp_pg = str(1 + r % 2), str(3 + r // 2)
        mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1}
        enq = {
            "ph": "X",
            "cat": "cpu_op",
            "name": "c10d::allreduce_",
            "pid": 1,
            "tid": 1,
            "dur": 2,
            "args": {"Input Dims": [[[256]], []]},
        }
        work = {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "pid": 1,
            "args": {"Input Dims": [[256]], "Input type": ["float"]},
        }
        ev = [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": -5,
                "dur": 400,
            },
            {**mm, "ts": 0, "dur": 100},
            {**mm, "ts": 160, "dur": 40},
            {**enq, "ts": 100},
            {**enq, "ts": 170},
            {**work, "tid": 30, "ts": 101, "dur": 59},
            {**work, "tid": 40, "ts": 180, "dur": 80},
        ]
        pgs = [_pg("0", "default_pg", [0, 1, 2, 3]), _pg(dp_pg, "mesh_dp", dp), _pg(tp_pg, "mesh_tp", tp)]
        _write(tmp_path / "run" / f"rank{r}.json", ev, r, 4, pgs, backend="gloo")
        entries = [
            {
                "record_id": k,
                "pg_id": int(pg),
                "process_group": [pg, desc],
                "collective_seq_id": 1,
                "p2p_seq_id": 0,
                "op_id": k + 1,
                "profiling_name": "gloo:all_reduce",
                "time_created_ns": BASE + created * 1000,
                "time_discovered_started_ns": 0,
                "time_discovered_completed_ns": 0,
                "input_sizes": [[256]],
                "input_dtypes": ["Float"],
                "output_sizes": [[256]],
                "output_dtypes": ["Float"],
                "state": "scheduled",
                "retired": True,
                "is_p2p": False,
                "timeout_ms": 1800000,
                "thread_id": "1",
                "thread_name": "python",
            }
            for k, (pg, desc, created) in enumerate([(tp_pg, "mesh_tp", 150), (dp_pg, "mesh_dp", 200)])
        ]
        (tmp_path / "run" / f"rank{r}.fr.json").write_text(
            json.dumps(
                {
                    "version": "2.10",
                    "comm_lib_version": "",
                    "pg_config": {"": {"desc": "", "name": "", "ranks": "[]"}},
                    "pg_status": {},
                    "nccl_comm_state": {},
                    "entries": entries,
                }
            )
        )
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    assert res.ranks.select("rank", "dp", "tp").rows() == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    frame = {r["axis"]: r for r in res.frame.iter_rows(named=True)}
    assert {a: r["exposed_comm_ns"] for a, r in frame.items()} == {"tp": 236 * US, "dp": 240 * US}
    assert (frame["tp"]["collectives"], frame["dp"]["collectives"]) == (
        4,
        4,
    )  # the gloo rows, not the FR copies
    assert int(analyze(store, "overlap", "run").frame["exposed_comm_ns"].sum()) == 476 * US
    assert any("Flight Recorder entry" in n for n in res.notes)


def test_unnamed_groups_are_axes_by_size_and_stride(store, tmp_path):
    # The same mesh, its groups described "undefined": two axes found by structure alone, groups of
    # 2 ranks with stride 2 ({0, 2}, {1, 3}: outer) and stride 1 ({0, 1}, {2, 3}: inner), named by
    # their stride since their all-reduces say nothing of their role. A group of ranks 0, 1, 3 (not
    # evenly spaced, like Megatron's tp x pp groups) is no axis.
    _mesh_2x2(tmp_path / "run", "undefined", "undefined", extra=(_pg("9", "undefined", [0, 1, 3]),))
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    assert res.ranks.columns == ["rank", "traced", "dim2", "dim1"]
    assert res.ranks.select("dim2", "dim1").rows() == [(0, 0), (0, 1), (1, 0), (1, 1)]
    frame = {r["axis"]: r for r in res.frame.iter_rows(named=True)}
    assert frame["dim1"]["found_by"] == "structure: unnamed groups of 2 ranks, stride 1"
    # no axis in the rule's list: both by name, dim1 before dim2, so dim1 (the old tp) takes the
    # overlap as tp did: the same split as by hand above
    assert (frame["dim1"]["exposed_comm_ns"], frame["dim2"]["exposed_comm_ns"]) == (480 * US, 120 * US)


@pytest.mark.parametrize("world", [4, 6])
def test_an_unnamed_group_that_does_not_tile_the_world_is_no_axis(store, tmp_path, world):
    # g5 variant nccl_inspector_records/nranks_1_3_4_cut_last, as Kineto: 4 ranks, the world group
    # "0" and one group "9" described "undefined" of ranks 1, 2, 3 (evenly spaced, stride 1). 3
    # divides no mesh of 4 ranks: it was axis dim1 of size 3 (its all-reduces and the world's
    # counted on it, "multiply to 3, not the world size 4"); now the mesh is the world group alone:
    # dp of 4 (DDP), every rank's coordinate its rank. With 6 ranks 3 divides the world, but {1, 2,
    # 3} alone does not tile it (ranks 0, 4, 5 are in no group of its kind): no axis either (it was
    # "mesh dim1:3").
    ranks = list(range(world))
    for r in ranks:
        ev = [step(1, -5, 305), *_kernel("sm90_gemm_kernel", 0, 100, 10, 7)]
        ev += _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 60, 12, 20, **_allreduce("0", ranks, 1))
        pgs = [_pg("0", "default_pg", ranks)]
        if r in (1, 2, 3):
            ev += _kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 40, 13, 21, **_allreduce("9", [1, 2, 3], 1)
            )
            pgs.append(_pg("9", "undefined", [1, 2, 3]))
        _write(tmp_path / "run" / f"rank{r}.json", ev, r, world, pgs)
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    assert res.ranks.columns == ["rank", "traced", "dp"]
    assert res.ranks["dp"].to_list() == ranks
    assert [(r["axis"], r["size"]) for r in res.frame.iter_rows(named=True)] == [("dp", world)]
    assert not [n for n in res.notes if "not the world size" in n]
    assert (
        f"unnamed groups of 3 ranks, stride 1 ({{1, 2, 3}}) cover 3 of the world's {world} ranks: no axis "
        "(the groups of an axis tile the world)"
    ) in res.notes


def test_a_spanning_label_is_the_size_of_its_groups(store, tmp_path):
    """4 ranks, named mesh groups tp {0, 1}, {2, 3} and dp {0, 2}, {1, 3} (one all-reduce each), and
    a group "9" of ranks 0, 1, 3 (described "undefined", not evenly spaced: no axis) with one
    all-reduce. Its members' coordinates (dp, tp) are (0, 0), (0, 1), (1, 1): they differ on both
    axes, label dp+tp. Its size was the product 2 x 2 = 4; the group holds 3 ranks: size 3."""
    ranks = [0, 1, 2, 3]
    for r in ranks:
        tp, dp = [r // 2 * 2, r // 2 * 2 + 1], [r % 2, r % 2 + 2]
        tp_pg, dp_pg = str(3 + r // 2), str(1 + r % 2)
        ev = [step(1, -5, 405), *_kernel("sm90_gemm_kernel", 0, 100, 10, 7)]
        ev += _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 40, 11, 20, **_allreduce(tp_pg, tp, 1))
        ev += _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 150, 40, 12, 20, **_allreduce(dp_pg, dp, 1))
        pgs = [_pg("0", "default_pg", ranks), _pg(tp_pg, "mesh_tp", tp), _pg(dp_pg, "mesh_dp", dp)]
        if r != 2:
            ev += _kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 40, 13, 21, **_allreduce("9", [0, 1, 3], 1)
            )
            pgs.append(_pg("9", "undefined", [0, 1, 3]))
        _write(tmp_path / "run" / f"rank{r}.json", ev, r, 4, pgs)
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    assert res.ranks.columns == ["rank", "traced", "dp", "tp"]
    assert sorted(res.frame.select("axis", "size", "groups", "collectives").rows()) == [
        ("dp", 2, 2, 4),
        ("dp+tp", 3, 1, 3),
        ("tp", 2, 2, 4),
    ]


def _tilings(folder: Path, world: int, families: list[tuple[list[list[int]], int]]) -> None:
    """``world`` GPU ranks with the world group "0" and unnamed families of groups (described
    "undefined"), each (groups, all-reduces per group): every rank computes [0, 100] us, then runs
    the all-reduces of its group of each family one after another, 20 us each from 100 us."""
    ranks = list(range(world))
    for r in ranks:
        ev = [step(1, -5, 2000), *_kernel("sm90_gemm_kernel", 0, 100, 10, 7)]
        pgs, t, corr = [_pg("0", "default_pg", ranks)], 100, 11
        for f, (gs, n) in enumerate(families):
            i, g = next((i, g) for i, g in enumerate(gs) if r in g)
            name = f"{f + 1}{i}"
            pgs.append(_pg(name, "undefined", g))
            for seq in range(1, n + 1):
                ev += _kernel(
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t, 20, corr, 20, **_allreduce(name, g, seq)
                )
                t, corr = t + 30, corr + 1
        _write(folder / f"rank{r}.json", ev, r, world, pgs)


BLOCKS_OF_3 = [[0, 1, 2], [3, 4, 5]]
STRIDE_2_OF_3 = [[0, 2, 4], [1, 3, 5]]


@pytest.mark.parametrize(
    ("calls", "axes", "coords", "left"),
    [
        # more all-reduces on the blocks (2 vs 1 per group): dim1 (blocks) kept; the rest of the
        # world, 6 / 3 = 2, is one more axis: ranks sharing a dim1 coordinate, {0, 3}, {1, 4},
        # {2, 5} (stride 3, outermost), named dp (there is none): rank r = (r // 3, r % 3)
        ((2, 1), ["dp", "dim1"], [(r // 3, r % 3) for r in range(6)], "dim2"),
        # more on the stride-2 groups: dim2 kept, coordinate r // 2 (position in {0, 2, 4}); the
        # rest {0, 1}, {2, 3}, {4, 5} (stride 1, inner): rank r = (r // 2, r % 2)
        ((1, 2), ["dim2", "dp"], [(r // 2, r % 2) for r in range(6)], "dim1"),
    ],
)
def test_two_tilings_that_cannot_form_one_mesh_keep_one(store, tmp_path, calls, axes, coords, left):
    # World 6: blocks of 3 ({0, 1, 2}, {3, 4, 5}: stride 1) and stride-2 groups of 3 ({0, 2, 4},
    # {1, 3, 5}). Each tiles the world, but not together: {0, 1, 2} holds ranks 0 and 2 of {0, 2, 4}
    # (groups of two axes of a mesh share at most one rank), and 3 x 3 = 9 is not 6. Both were axes
    # ("mesh dim2:3, dim1:3", 9 != 6 only noted); now one is kept (sizes tie: the one more
    # collectives ran on) and the other is a note naming its groups and the clash.
    _tilings(tmp_path / "run", 6, [(BLOCKS_OF_3, calls[0]), (STRIDE_2_OF_3, calls[1])])
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    assert res.ranks.columns == ["rank", "traced", *axes]
    assert res.ranks.select(axes).rows() == coords
    assert not [n for n in res.notes if "not the world size" in n]
    (note,) = [n for n in res.notes if "left out" in n]
    groups = {"dim1": "{0, 1, 2}, {3, 4, 5}", "dim2": "{0, 2, 4}, {1, 3, 5}"}
    assert note.startswith(
        f"axis {left} (3 ranks, groups {groups[left]}; structure: unnamed groups of 3 ranks"
    )
    # the clash as _clash finds it: dim1's group {0, 1, 2} against dim2's coordinates 0, 0, 1
    assert (
        "dim1's group {0, 1, 2} holds ranks 0 and 2, both in dim2's group {0, 2, 4}, at positions 0 and 1 "
        "(two groups of different axes share at most one rank)"
    ) in note
    # rows per family: all-reduces per group x 3 ranks x 2 groups: 2 x 6 = 12 kept, 1 x 6 = 6 left out
    kept = "dim2" if left == "dim1" else "dim1"
    assert (
        f"it and axis {kept} (3 ranks, groups {groups[kept]}; 12 collectives rows on them against 6)" in note
    )
    # the left-out axis' collectives are that axis, of its groups' 3 ranks: they were labelled by the
    # kept axes their members cut across (dp+dim1, or dim2+dp), of size 2 x 3 = 6
    frame = {r["axis"]: r for r in res.frame.iter_rows(named=True)}
    assert sorted((a, r["size"], r["groups"], r["collectives"]) for a, r in frame.items()) == sorted(
        [(kept, 3, 2, 12), (left, 3, 2, 6)]
    )
    assert frame[left]["found_by"].endswith("; left out of the mesh (a note says why)")


def test_two_clashing_axes_of_one_stride_get_two_names(store, tmp_path):
    """World 6, unnamed blocks of 2 ({0, 1}, {2, 3}, {4, 5}) and blocks of 3 ({0, 1, 2}, {3, 4, 5}),
    both stride 1, one all-reduce per group: both were called dim1, and the note read "axis dim1
    (3 ranks ...) left out: it and axis dim1 (2 ranks ...)". By hand: the blocks of 3 are dim1_3
    (dim1 is taken); {0, 1} holds ranks 0 and 1, at positions 0 and 1 of dim1_3's {0, 1, 2}: they
    clash; smaller groups first keeps dim1 (coordinate r % 2), the rest 6 / 2 = 3 is dp (r // 2).
    Rows: blocks of 2 1 x 2 x 3 = 6, blocks of 3 1 x 3 x 2 = 6; the blocks of 3 are dim1_3 of 3
    ranks in the frame (were dp+dim1 of 6)."""
    _tilings(tmp_path / "run", 6, [([[0, 1], [2, 3], [4, 5]], 1), (BLOCKS_OF_3, 1)])
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    assert res.ranks.columns == ["rank", "traced", "dp", "dim1"]
    assert res.ranks.select("dp", "dim1").rows() == [(r // 2, r % 2) for r in range(6)]
    (note,) = [n for n in res.notes if "left out" in n]
    assert note.startswith(
        "axis dim1_3 (3 ranks, groups {0, 1, 2}, {3, 4, 5}; structure: unnamed groups of 3 ranks, stride 1) "
        "left out: it and axis dim1 (2 ranks, groups {0, 1}, {2, 3} and 1 more; 6 collectives rows on them "
        "against 6) cannot both be axes of one mesh: dim1's group {0, 1} holds ranks 0 and 1, both in dim1_3's "
        "group {0, 1, 2}, at positions 0 and 1"
    )
    assert sorted(res.frame.select("axis", "size", "collectives").rows()) == [
        ("dim1", 2, 6),
        ("dim1_3", 3, 6),
    ]


@pytest.mark.parametrize(
    ("world", "families", "axes", "coords"),
    [
        # blocks of 2 (stride 1) and stride-2 groups of 3: {0, 1} meets {0, 2, 4} in rank 0 only,
        # and 2 x 3 = 6: a 3 x 2 mesh, rank r = 2 * (r // 2) + r % 2
        (6, [[[0, 1], [2, 3], [4, 5]], STRIDE_2_OF_3], ["dim2", "dim1"], [(r // 2, r % 2) for r in range(6)]),
        # world 8, 2 x 4: blocks of 4 (stride 1) and pairs of stride 4: rank r = 4 * (r // 4) + r % 4
        (8, [[[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]], ["dim4", "dim1"],
         [(r // 4, r % 4) for r in range(8)]),
        # world 8, 2 x 2 x 2: pairs of stride 1, 2 and 4: rank r = 4a + 2b + c
        (8, [[[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2], [1, 3], [4, 6], [5, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]],
         ["dim4", "dim2", "dim1"], [(r // 4, r // 2 % 2, r % 2) for r in range(8)]),
    ],
)  # fmt: skip
def test_tilings_that_form_one_mesh_are_all_axes(store, tmp_path, world, families, axes, coords):
    _tilings(tmp_path / "run", world, [(gs, 1) for gs in families])
    ingest(store, [tmp_path / "run"])
    res = analyze(store, "parallelism", "run")
    assert res.ranks.columns == ["rank", "traced", *axes]
    assert res.ranks.select(axes).rows() == coords
    assert not [n for n in res.notes if "left out" in n or "not the world size" in n]


def test_flight_recorder_groups(store):
    # gloo_cpu_4rank: Flight Recorder dumps only, one group of the 4 ranks: one dp axis; no
    # activity, so no exposed communication to split, and no error
    ingest(store, [corpus("flight_recorder/gloo_cpu_4rank")], run="fr")
    res = analyze(store, "parallelism", "fr")
    assert res.ranks.columns == ["rank", "traced", "dp"] and res.ranks["dp"].to_list() == [0, 1, 2, 3]
    assert res.frame.is_empty() and res.stages.is_empty()
    pgs = store.sql("SELECT json_extract(meta, '$.process_groups') FROM traces ORDER BY rank").item(0, 0)
    assert json.loads(pgs)[0]["ranks"] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("name", "desc", "axes"),
    [
        ("1", "mesh_dp", {"dp"}),
        ("1", "mesh_dp_shard", {"dp_shard"}),
        ("5", "mesh_dp_shard_cp", {"dp_shard", "cp"}),
        ("2", "TENSOR_MODEL_PARALLEL_GROUP", {"tp"}),
        ("3", "PIPELINE_MODEL_PARALLEL_GROUP", {"pp"}),
        ("4", "EXPERT_MODEL_PARALLEL_GROUP", {"ep"}),
        ("pp0:0->1:fwd", None, {"pp"}),
        ("dp:stage3:grads-reduce-scatter", None, {"dp"}),
        ("0", "undefined", set()),
    ],
)
def test_axis_words(name, desc, axes):
    assert _mesh.axis_words(name, desc)[0] == axes


def test_axis_words_world_and_embedding():
    assert _mesh.axis_words("0", "default_pg")[1] and _mesh.axis_words("embedding:dp0")[2]


# --- a 4-stage pipeline with a slow stage (NDTimeline micro trace) -------------------------------

U = 7_812_500  # ns: 1/128 s, exact in NDTimeline's float32 seconds


def _op(rank: int, stage: int, optype: str, start: int, end: int, mb: int = -1, seq: int = 0) -> dict:
    return {
        "dp_rank": 0,
        "stage": stage,
        "rank": rank,
        "step": 1,
        "optype": optype,
        "start_ts": start / 128,
        "duration": (end - start) / 128,
        "seq_id": seq,
        "mc": 0,
        "mb_id": mb,
        "gmc": stage,
    }


def _pipeline_4(folder: Path) -> Path:
    """GPipe, 4 stages (rank = stage, one replica), 2 micro-batches, times in U: forward 1 U per
    micro-batch on stages 0-2, 2 U on stage 3 (the slow stage); backward twice the forward.
    Forward: stage s runs F0 at [s, s+1), F1 at [s+1, s+2); stage 3 F0 [3, 5), F1 [5, 7).
    Backward: stage 3 B0 [7, 11), B1 [11, 15); stage 2 B0 [11, 13), B1 [15, 17); stage 1 [13, 15),
    [17, 19); stage 0, its gradients 1 U late, [16, 18), [20, 22). Receives (waiting for the
    neighbour): stage 3 forward-recv [2, 3); stage 2 backward-recv [7, 11); stage 1 [11, 13);
    stage 0 [13, 16); their sends run inside the sender's compute (stage 2 forward [2, 3), stage 3
    backward [10, 11), stage 2 [12, 13), stage 1 [14, 15)), hidden."""
    f = {0: [(0, 1), (1, 2)], 1: [(1, 2), (2, 3)], 2: [(2, 3), (3, 4)], 3: [(3, 5), (5, 7)]}
    b = {3: [(7, 11), (11, 15)], 2: [(11, 13), (15, 17)], 1: [(13, 15), (17, 19)], 0: [(16, 18), (20, 22)]}
    recv = {
        3: ("forward-recv", 2, 3),
        2: ("backward-recv", 7, 11),
        1: ("backward-recv", 11, 13),
        0: ("backward-recv", 13, 16),
    }
    # the sending side of each receive, inside a compute op of the sender (hidden)
    send = {
        2: ("forward-send", 2, 3),
        3: ("backward-send", 10, 11),
        2.5: ("backward-send", 12, 13),
        1: ("backward-send", 14, 15),
    }
    rows = []
    for s in range(4):
        rows += [_op(s, s, "forward-compute", a, e, mb) for mb, (a, e) in enumerate(f[s])]
        rows += [_op(s, s, "backward-compute", a, e, mb) for mb, (a, e) in enumerate(b[s])]
        kind, a, e = recv[s]
        rows.append(_op(s, s, kind, a, e))
    for k, (kind, a, e) in send.items():
        s = int(k)
        rows.append(_op(s, s, kind, a, e))
    return write_ndtimeline(folder, rows, "P4", dp=1, pp=4)


def test_pipeline_bubble_split_and_slow_stage_by_hand(store, tmp_path):
    ingest(store, [_pipeline_4(tmp_path / "p4")], run="p4")
    res = analyze(store, "parallelism", "p4")
    assert res.ranks.select("rank", "pp").rows() == [(0, 0), (1, 1), (2, 2), (3, 3)]
    st = {r["stage"]: r for r in res.stages.iter_rows(named=True)}
    # Window: the pipeline's step, [0, 22) U. Compute: stages 0-2: 2 x 1 + 2 x 2 = 6 U; stage 3: 12 U.
    # m = 2 (mb_id 0, 1), p = 4: schedule = (p-1)/m x compute = 9 U (stage 3: 18 U, capped at its
    # bubble). Stages 0-2: bubble 22 - 6 = 16 U = schedule 9 + imbalance (12 - 6) 6 + p2p 1 (their
    # receives are 3, 2, 4 U) + other 0. Stage 3: bubble 22 - 12 = 10 U, all schedule (its 18 U
    # capped at 10): imbalance, p2p and other 0 (its 1 U forward receive is explained already).
    want = {
        0: (6, 16, 9, 6, 1, 0, 3, 0, 0),
        1: (6, 16, 9, 6, 1, 0, 2, 1, 3),
        2: (6, 16, 9, 6, 1, 0, 4, 2, 5),
        3: (12, 10, 10, 0, 0, 0, 1, 3, 7),
    }
    for s, (comp, bubble, sched, imb, p2p, other, exposed, warm, cool) in want.items():
        r = st[s]
        assert (r["step_ns"], r["microbatches"], r["schedule_from"]) == (22 * U, 2, "formula")
        got = tuple(
            r[c]
            for c in (
                "compute_ns",
                "bubble_ns",
                "schedule_bubble_ns",
                "imbalance_ns",
                "p2p_wait_ns",
                "other_ns",
                "p2p_exposed_ns",
                "warmup_ns",
                "cooldown_ns",
            )
        )
        # warm-up: first compute at s U (stage 3: 3); cool-down: 22 - last compute end (22, 19, 17, 15)
        assert got == tuple(x * U for x in (comp, bubble, sched, imb, p2p, other, exposed, warm, cool)), s
        assert (
            r["schedule_bubble_ns"] + r["imbalance_ns"] + r["p2p_wait_ns"] + r["other_ns"] == r["bubble_ns"]
        )
    # Stage 3 computes 12 U against its peers' median 6 U: +100%, costing 6 / 22 = 27% of the step.
    slow = res.slow.filter(pl.col("slow"))
    assert slow.select("kind", "index", "ranks").rows() == [("stage", 3, [3])]
    assert slow["cost_pct"][0] == pytest.approx(100 * 6 / 22) and slow["excess_pct"][0] == pytest.approx(
        100.0
    )
    assert st[3]["slow"] and not st[0]["slow"]
    _declared(res)
    # Exposed communication: the receives, all in idle time: 3 + 2 + 4 + 1 = 10 U, all pp.
    assert res.frame.select("axis", "exposed_comm_ns").rows() == [("pp", 10 * U)]
    # The timeline: the one step's compute of each stage, merged, ms from the window start: stage 3
    # computes [3, 15) U without a break; stage 0 [0, 2), then [16, 18) and [20, 22).
    tl = res.timeline.filter(pl.col("state") == "compute")
    assert tl.filter(pl.col("stage") == 3).select("start_ms", "end_ms").rows() == [
        (3 * U / 1e6, 15 * U / 1e6)
    ]
    assert tl.filter(pl.col("stage") == 0).select("start_ms", "end_ms").rows() == [
        (0.0, 2 * U / 1e6),
        (16 * U / 1e6, 18 * U / 1e6),
        (20 * U / 1e6, 22 * U / 1e6),
    ]
    assert res.timeline.filter(pl.col("state") == "p2p")["lane"].to_list() == [
        "stage 0 (rank 0)",
        "stage 1 (rank 1)",
        "stage 2 (rank 2)",
        "stage 3 (rank 3)",
    ]
    # The verdict calls the stage slow; it names no rank as a straggler.
    v = verdict.combined_verdict(store, "p4")
    assert (
        v.text.startswith("slow stage: pipeline stage 3 (rank 3) computes 93.8 ms per step, 100% more")
        and v.stragglers == ()
        and v.straggling
    )


# --- all-to-all with a known imbalance ------------------------------------------------------------


def _a2a(split_in: list[int], split_out: list[int], seq: int) -> dict:
    return collective_args(
        "all_to_all",
        seq,
        pg="1",
        ranks=[0, 1, 2, 3],
        nelems=256 * sum(split_in),
        out_nelems=256 * sum(split_out),
        **{"In split size": json.dumps(split_in), "Out split size": json.dumps(split_out)},
    )


def test_all_to_all_load_by_hand(store, tmp_path):
    # Four ranks of one expert-parallel group ("mesh_ep"). Layer 0: every rank sends rows [1, 1, 1, 5]
    # (256 floats = 1 KiB a row) to ranks 0..3; rank r's kernel starts at 100 + 10 r us, all end at
    # 200. Layer 1: an even [2, 2, 2, 2], from 300 + 10 r to 400.
    for r in range(4):
        ev = [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": 0,
                "dur": 500,
            }
        ]
        ev += _kernel(
            "ncclDevKernel_SendRecv",
            100 + 10 * r,
            100 - 10 * r,
            20,
            20,
            **_a2a([1, 1, 1, 5], [5] * 4 if r == 3 else [1] * 4, 1),
        )
        ev += _kernel(
            "ncclDevKernel_SendRecv", 300 + 10 * r, 100 - 10 * r, 21, 20, **_a2a([2] * 4, [2] * 4, 2)
        )
        _write(
            tmp_path / "ep" / f"rank{r}.json",
            ev,
            r,
            4,
            [_pg("0", "default_pg", [0, 1, 2, 3]), _pg("1", "mesh_ep", [0, 1, 2, 3])],
        )
    ingest(store, [tmp_path / "ep"])
    assert store.sql("SELECT DISTINCT split_in FROM collectives ORDER BY 1").rows() == [
        ("[1, 1, 1, 5]",),
        ("[2, 2, 2, 2]",),
    ]
    res = analyze(store, "parallelism", "ep")
    assert res.ranks.columns == ["rank", "traced", "ep"]
    layer0, layer1 = res.alltoall.sort("index").iter_rows(named=True)
    # Layer 0: each rank sends 8 KiB: 1 KiB to ranks 0-2, 5 KiB to rank 3, so ranks 0-2 receive
    # 4 KiB and rank 3 20 KiB: max 20480, mean 8192, max/mean 2.5; Gini over [4096, 4096, 4096,
    # 20480] = 2 (4096 + 8192 + 12288 + 81920) / (4 x 32768) - 5/4 = 1.625 - 1.25 = 0.375.
    assert (layer0["index"], layer0["axis"], layer0["splits"], layer0["bytes"]) == (
        0,
        "ep",
        "recorded",
        4 * 8192,
    )
    assert (layer0["recv_max_bytes"], layer0["recv_mean_bytes"]) == (20480, 8192.0)
    assert layer0["recv_max_mean"] == pytest.approx(2.5) and layer0["recv_gini"] == pytest.approx(0.375)
    assert (layer0["send_gini"], layer0["send_max_mean"]) == (0.0, 1.0)
    # Waits: last arrival 130 us: 30 + 20 + 10 + 0 = 60 us; transfer = 200 - 130 = 70 us; the
    # imbalance costs 70 x (1 - 8192 / 20480) = 42 us.
    assert (layer0["wait_ns"], layer0["transfer_ns"], layer0["imbalance_ns"]) == (60 * US, 70 * US, 42 * US)
    assert (layer1["index"], layer1["recv_gini"], layer1["imbalance_ns"]) == (1, 0.0, 0)
    _declared(res)
    peers = res.alltoall_peers.filter(pl.col("instance") == layer0["instance"])
    assert peers.filter(pl.col("rank") == 0).select("peer", "bytes").rows() == [
        (0, 1024),
        (1, 1024),
        (2, 1024),
        (3, 5120),
    ]
    m = res.alltoall_matrix.filter((pl.col("rank") == 1) & (pl.col("peer") == 3)).row(0, named=True)
    assert m["bytes"] == 5120 + 2048 and m["mib"] == pytest.approx(7168 / 2**20)


def test_gini():
    assert _alltoall.gini([1, 1, 1, 1]) == 0.0 and _alltoall.gini([]) == 0.0
    assert _alltoall.gini([0, 0, 0, 8]) == pytest.approx(3 / 4)  # one rank gets everything: (n-1)/n


def test_gloo_all_to_all_splits_come_from_the_enqueue(store, tmp_path):
    # gloo's annotation carries no split sizes; its c10d::alltoall_base_ enqueue does, as concrete
    # inputs (output, input, group, output_split_sizes, input_split_sizes, async_op, timeout).
    for r in range(2):
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
                "cat": "cpu_op",
                "name": "c10d::alltoall_base_",
                "pid": 1,
                "tid": 1,
                "ts": 10,
                "dur": 2,
                "args": {
                    "Input Dims": [[4], [4], [], [], [], [], []],
                    "Concrete Inputs": [
                        "",
                        "",
                        "",
                        "[3, 1]" if r == 0 else "[1, 1]",
                        "[1, 3]",
                        "False",
                        "-1",
                    ],
                },
            },
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "gloo:all_to_all",
                "pid": 1,
                "tid": 2,
                "ts": 20,
                "dur": 30,
                "args": {"Input Dims": [[4]], "Input type": ["float"]},
            },
        ]
        _write(tmp_path / "g" / f"rank{r}.json", ev, r, 2, [_pg("0", "default_pg", [0, 1])], backend="gloo")
    ingest(store, [tmp_path / "g"])
    rows = store.sql("SELECT rank, split_in, split_out FROM collectives ORDER BY rank").rows()
    assert rows == [(0, "[1, 3]", "[3, 1]"), (1, "[1, 3]", "[1, 1]")]


# --- recorded runs and the corpus -----------------------------------------------------------------


def _exposed_by_hand(store, run: str) -> int:
    """Exposed communication of a per-op trace, computed with numpy: per rank, the union of its
    collective ops minus the union of its compute ops."""
    df = store.sql(
        """SELECT rank, kind = 'collective' AS comm, ts_ns, ts_ns + dur_ns AS e FROM events
                      WHERE run_id = (SELECT run_id FROM runs WHERE name = ?) AND dur_ns > 0
                        AND kind IN ('collective', 'gpu_user_annotation')""",
        [run],
    )
    total = 0
    for (_,), g in df.group_by(["rank"]):

        def union(sel: pl.DataFrame) -> list[tuple[int, int]]:
            out: list[list[int]] = []
            for a, b in sorted(sel.select("ts_ns", "e").rows()):
                if out and a <= out[-1][1]:
                    out[-1][1] = max(out[-1][1], b)
                else:
                    out.append([a, b])
            return [(a, b) for a, b in out]

        comm, comp = union(g.filter(pl.col("comm"))), union(g.filter(~pl.col("comm")))
        starts = np.array([a for a, _ in comp] or [0])
        ends = np.array([b for _, b in comp] or [0])
        for a, b in comm:  # comm minus compute, one comm interval at a time
            covered = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0, None).sum() if comp else 0
            total += (b - a) - int(covered)
    return total


@pytest.mark.parametrize("name", ["ST", "AR"])
def test_axes_sum_to_the_exposed_communication_on_ndtimeline(store, name):
    ingest(store, [corpus(f"kineto_misc/bytedance_straggler_whatif/trace-{name}.parquet")], run=name)
    res = analyze(store, "parallelism", name)
    assert int(res.frame["exposed_comm_ns"].sum()) == _exposed_by_hand(store, name)
    assert [a for a in res.ranks.columns if a not in ("rank", "traced")] == ["pp", "dp"]
    assert set(res.frame["axis"]) == {"pp", "dp", "world"}  # the grad-norm all-reduce spans both


def test_st_calls_stage_3_slow_and_names_no_straggler_rank(store):
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")], run="ST")
    res = analyze(store, "parallelism", "ST")
    # ST: dp 2 x pp 4, rank = 2 stage + dp_rank (NDTimeline columns); stage 3 = ranks 6, 7.
    assert res.ranks.filter(pl.col("pp") == 3)["rank"].to_list() == [6, 7]
    slow = res.slow.filter(pl.col("slow"))
    assert slow.select("kind", "index", "ranks").rows() == [("stage", 3, [6, 7])]
    # Per step (medians over the 32 sampled steps, from the Parquet rows): stage 3 computes
    # ~1.38 s of forward and backward against ~0.85 s on the others.
    assert slow["excess_pct"][0] > 50
    f = findings.summarize(store, "ST")
    texts = [x.text for x in f.findings]
    assert texts[0].startswith("slow stage: pipeline stage 3 (ranks 6, 7)")
    assert not any(t.startswith("rank ") and "is a straggler" in t for t in texts)
    v = next(x for x in f.verdicts if x.topic == "stragglers")
    assert v.status == "problem" and v.text.startswith("slow stage: pipeline stage 3")


def test_st_replicas_are_compared_like_with_like(store):
    # ST's two data-parallel replicas run the same four stages: a replica's ranks span the stages
    # (slow stage 3 among them), and each rank's one peer is the same stage's rank on the other
    # replica. Compared with the median of its ranks' peers (881 ms: the fast stages'), each replica
    # read "15% more than its peers" at a cost of 6% of the step. Like with like, a replica's peers
    # are the other replica's ranks: peers_ns of one is the other's mean compute, and neither costs.
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")], run="ST")
    slow = analyze(store, "parallelism", "ST").slow
    rep = {r["index"]: r for r in slow.filter(pl.col("kind") == "replica").iter_rows(named=True)}
    comp = dict(analyze(store, "parallelism", "ST").ranks.select("rank", "dp").rows())
    assert sorted(rep) == [0, 1] and rep[0]["ranks"] == [r for r in sorted(comp) if comp[r] == 0]
    assert abs(rep[0]["peers_ns"] - rep[1]["compute_ns"]) <= 1
    assert abs(rep[1]["peers_ns"] - rep[0]["compute_ns"]) <= 1
    assert not rep[0]["slow"] and not rep[1]["slow"]
    assert min(slow["cost_pct"]) >= 0  # extra compute: a slice that computes less costs nothing
    for r in rep.values():
        rel = 100 * (r["compute_ns"] / r["peers_ns"] - 1)
        assert abs(rel) < 1 and f"{abs(rel):.0f}% " in r["text"]


def test_ar_still_names_the_slow_worker(store):
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-AR.parquet")], run="AR")
    res = analyze(store, "parallelism", "AR")
    assert res.slow.filter(pl.col("slow")).is_empty()  # one slow worker makes no stage or replica slow
    v = verdict.combined_verdict(store, "AR")
    assert v.stragglers == (0,) and "in the mesh: rank 0 is pp stage 0, dp replica 0" in v.text


@pytest.mark.parametrize(
    "run",
    [
        "normal",
        "normal_repeat",
        "straggler_rank2",
        "straggler_rank3",
        "clean",
        "sleep_rank1",
        "extra_matmul",
        "pipeline_2stage",
    ],
)
def test_axes_sum_exactly_on_the_samples(store, run):
    ingest(store, [SAMPLES / run], run=run)
    res = analyze(store, "parallelism", run)
    overlap = analyze(store, "overlap", run)
    assert int(res.frame["exposed_comm_ns"].sum()) == int(overlap.frame["exposed_comm_ns"].sum())
    got = res.axis_ranks.group_by("rank").agg(pl.col("exposed_comm_ns").sum()).sort("rank").rows()
    assert got == overlap.frame.select("rank", "exposed_comm_ns").sort("rank").rows()
    axes = [a for a in res.ranks.columns if a not in ("rank", "traced")]
    if run == "pipeline_2stage":
        # two stages: rank r is stage r; all traffic is the pipeline's send / recv
        assert axes == ["pp"] and res.ranks["pp"].to_list() == [0, 1]
        assert res.frame["axis"].to_list() == ["pp"]
        st = res.stages
        assert st["stage"].to_list() == [0, 1] and st["microbatches"].to_list() == [3, 3]
        assert (
            st["schedule_bubble_ns"] + st["imbalance_ns"] + st["p2p_wait_ns"] + st["other_ns"]
            == st["bubble_ns"]
        ).all()
        # the schedule's own bubble: (p-1)/m x compute = compute / 3, at most the bubble
        assert st.select(
            (pl.col("schedule_bubble_ns") == pl.min_horizontal(pl.col("compute_ns") // 3, "bubble_ns")).all()
        ).item()
        assert set(res.timeline["lane"]) == {"stage 0 (rank 0)", "stage 1 (rank 1)"}
    else:  # 4-rank DDP on gloo: one dp axis of the world size
        assert axes == ["dp"] and res.frame["axis"].to_list() == ["dp"] and res.frame["size"].to_list() == [4]


@pytest.mark.parametrize(
    ("folder", "axis"),
    [
        ("hta/nccl_parser_config", "dp"),
        ("hta/trace_filter", "unassigned"),
        ("hta/negative_queue_length_values_check", "unassigned"),
        ("hta/df_index_resolver", "unassigned"),
        ("hta/cpu_only", "dp"),
    ],
)
def test_axes_sum_exactly_on_corpus_kineto(store, folder, axis):
    ingest(store, [corpus(folder)], run="c")
    res = analyze(store, "parallelism", "c")
    overlap = analyze(store, "overlap", "c")
    assert int(res.frame["exposed_comm_ns"].sum()) == int(overlap.frame["exposed_comm_ns"].sum())
    # nccl_parser_config records its groups (one: default_pg of 2 ranks: DDP); the old-style
    # traces record none, so their collectives stay unassigned rather than guessed
    assert res.frame["axis"].to_list() == [axis]


def test_result_tables_are_declared():
    for name, cols in parallelism.COLUMNS.items():
        assert all(doc for doc in cols.values()), name
    assert {f.name for f in dataclasses.fields(parallelism.Result)} - {"notes"} == set(parallelism.COLUMNS)


def _declared(res: parallelism.Result) -> None:
    """Every table of ``res`` has exactly the declared columns (``ranks``: one per mesh axis)."""
    for name, frame in res.frames().items():
        want = list(parallelism.COLUMNS[name])
        if name == "ranks":
            want = ["rank", "traced", *frame.columns[2:]]
        assert frame.columns == want, name


def test_report_draws_the_axes_the_bubble_split_and_the_stage_timeline(store):
    from traceprof.render import plots
    from traceprof.render.report import _section

    ingest(store, [SAMPLES / "pipeline_2stage"], run="pp")
    res = analyze(store, "parallelism", "pp")
    figs: list = []
    html = _section("parallelism", res, figs)
    # the per-axis bar, the bubble split per stage and the stage timeline (no all-to-all: no heat map)
    assert len(figs) == 3 and html.count("<!--PLOT") == 3
    timeline = plots.render(figs[2])  # a holoviews element, drawn with bokeh as the report draws it
    # one lane per stage, stage 0 at the bottom, labelled with its rank
    assert timeline.yaxis[0].major_label_overrides == {0: "stage 0 (rank 0)", 1: "stage 1 (rank 1)"}
    assert {r.glyph.__class__.__name__ for r in timeline.renderers} == {"Quad"}
    # the states drawn are the table's
    assert {item.label.value for item in timeline.legend[0].items} == set(res.timeline["state"])
    assert plots.label("schedule_bubble_ns") == "schedule bubble"


def _stage_steps(values: list[tuple[int, int, int]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One stage (pp 0) of three data-parallel replicas, one rank each (ranks 0, 1, 2 = dp 0, 1, 2):
    ``values`` are the three ranks' compute per step (ms), steps 1, 2, ..."""
    per = pl.DataFrame(
        [(r, s, ms * 1_000_000) for s, row in enumerate(values, 1) for r, ms in enumerate(row)],
        schema={"rank": pl.Int64, "step": pl.Int64, "compute_ns": pl.Int64},
        orient="row",
    )
    coords = pl.DataFrame({"rank": [0, 1, 2], "c_pp": [0, 0, 0], "c_dp": [0, 1, 2]})
    return per, coords


def test_a_stage_names_its_slowest_replica_past_its_own_noise():
    """Steps (ms, replicas 0, 1, 2): the stage's median per step is replica 0's: 100, 102, 100, 104,
    98; replica 2 is slowest every step: 150/100 = 1.50, 130/102 = 1.27, 140/100 = 1.40,
    120/104 = 1.15, 160/98 = 1.63 -> R = median 1.40. Noise: |median - 100| = 0, 2, 0, 4, 2 -> MAD 2,
    sigma = 1.4826 x 2 / 100 = 2.97 %; margin max(10 %, 3 x 2.97 % = 8.9 %) = 10 % < 40 %: named."""
    per, coords = _stage_steps(
        [(100, 99, 150), (102, 101, 130), (100, 99, 140), (104, 103, 120), (98, 97, 160)]
    )
    assert _pipeline._replica_spread(per, coords, 10.0) == {
        0: "within the stage, its slowest replica each step computes a median 1.40x the stage's median "
        "(more than the 10% margin: 10% or 3x the stage's own step-to-step spread of 3.0%), most often "
        "data-parallel replica 2 (rank 2; slowest in 5 of 5 steps)"
    }
    # a material margin of 45 % (slow_pct) leaves it unnamed
    assert _pipeline._replica_spread(per, coords, 45.0) == {}


def test_a_noisy_stage_does_not_name_its_slowest_replica():
    """Replica 2 is 1.40x the median every step (140/100, 168/120, 112/80, 154/110, 126/90), but the
    stage's median moves 100, 120, 80, 110, 90 ms: |x - 100| = 0, 20, 20, 10, 10 -> MAD 10, sigma =
    1.4826 x 10 / 100 = 14.8 %, margin max(10 %, 44.5 %) = 44.5 % > 40 %: within the noise, unnamed."""
    per, coords = _stage_steps(
        [(100, 99, 140), (120, 119, 168), (80, 79, 112), (110, 109, 154), (90, 89, 126)]
    )
    assert _pipeline._replica_spread(per, coords, 10.0) == {}


def test_se_names_the_replica_imbalance_within_its_stages(store):
    # trace-SE (dp 32 x pp 2; NDTimeline): stage 1 is slow (6,090.8 vs 4,062.0 ms); within each stage
    # the slowest replica per step is a median 1.38x (stage 0) and 1.26x (stage 1) its stage's median,
    # a different replica from step to step: said in the slow stage's text and, for stage 0, a note.
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-SE.parquet")], run="SE")
    res = analyze(store, "parallelism", "SE")
    text = res.slow.filter(pl.col("slow"))["text"].to_list()
    assert len(text) == 1 and text[0].startswith("slow stage: pipeline stage 1")
    assert (
        "; within the stage, its slowest replica each step computes a median 1.26x the stage's median"
        in text[0]
    )
    assert any(
        n.startswith(
            "pipeline stage 0: within the stage, its slowest replica each step computes a median 1.38x"
        )
        for n in res.notes
    )


def test_notes_on_a_per_op_trace_say_where_exposed_time_and_the_first_window_come_from(store):
    """t16 D5: on NDTimeline (no kernels, no CPU training-thread ops, no ProfilerStep) parallelism's
    column doc said its exposed time "sums to overlap's total" and critical_path's note spoke of "its
    ProfilerStep start", but `analyze overlap` fails there and no ProfilerStep exists. The notes now
    say exposed_comm_ns is overlap's rule applied here, and the first window starts at the first op."""
    from traceprof.core.errors import AnalysisError

    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")], run="ST")
    with pytest.raises(AnalysisError):  # the premise: overlap does not run on this trace
        analyze(store, "overlap", "ST")
    notes = [str(n) for n in analyze(store, "parallelism", "ST").notes]
    assert any(
        "`analyze overlap` reads kernels or CPU ops and does not run on this trace" in n for n in notes
    )
    assert "where overlap does not run" in parallelism.COLUMNS["frame"]["exposed_comm_ns"]
    cp = [str(n) for n in analyze(store, "critical_path", "ST").notes]
    (tile,) = [n for n in cp if n.startswith("step windows tile")]
    assert "the first from its first op's start (NDTimeline records no ProfilerStep)" in tile, tile
    assert "ProfilerStep start" not in tile


def test_collectives_of_unknown_size_give_null_bytes_and_a_note(store):
    """t16 D4: trace-ST's NDTimeline collectives record no size: pp's 3,200, dp's 512 and world's 256
    gave "bytes": 0 (a sum of nulls). Unknown is null, and a note counts the unknown per axis."""
    ingest(store, [corpus("kineto_misc/bytedance_straggler_whatif/trace-ST.parquet")], run="ST")
    res = analyze(store, "parallelism", "ST")
    assert res.frame.select("axis", "collectives", "bytes").rows() == [
        ("pp", 3200, None),
        ("dp", 512, None),
        ("world", 256, None),
    ]
    notes = [str(n) for n in res.notes]
    assert "axis pp: 3,200 of 3,200 collectives have no recorded size: bytes is null, not 0" in notes, notes
