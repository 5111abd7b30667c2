"""The peer of a send / recv as each source states it: ``collectives.peer`` (global rank) and
``peer_group_rank`` (its rank in the op's process group)."""

from __future__ import annotations

import json

from tests.builders import pid1_op, write_rank
from traceprof.collectors.flight_recorder.parse import parse as parse_fr
from traceprof.collectors.kineto.parse import parse as parse_kineto


def _peers(table) -> list[tuple]:
    return [(r["op"], r["peer"], r["peer_group_rank"]) for r in table.to_pylist()]


def test_flight_recorder_peer_from_the_profiling_name(tmp_path):
    # rank 2 of a pipeline group {0, 2} (pg "1"): "nccl:recv 1<-0" receives from group rank 0 =
    # global 0, "nccl:send 1->0" sends to it; torch's fr_trace reads the names the same way.
    def entry(name: str, seq: int) -> dict:
        return {
            "p2p_seq_id": seq,
            "collective_seq_id": 0,
            "is_p2p": True,
            "process_group": ["1", "pp"],
            "profiling_name": name,
            "time_created_ns": 10 * seq,
            "state": "completed",
        }

    doc = {
        "version": "2.4",
        "rank": 2,
        "pg_config": {"1": {"name": "1", "desc": "pp", "ranks": "[0, 2]"}},
        "entries": [entry("nccl:recv 1<-0", 1), entry("nccl:send 1->0", 2), entry("gloo:send", 3)],
    }
    path = tmp_path / "rank2.fr.json"
    path.write_text(json.dumps(doc))
    assert _peers(parse_fr(path).collectives) == [("recv", 0, 0), ("send", 0, 0), ("send", None, None)]


def test_kineto_nccl_send_takes_dst_rank_from_its_record_param_comms(tmp_path):
    # torch's profiler (saveNcclMeta) on a send in group [1, 3]: Rank 1 (the peer's group rank),
    # Dst Rank 3 (= [1, 3][1]); the kernel's own args hold the rest of the metadata.
    meta = {
        "Collective name": "send",
        "Process Group Name": "5",
        "Process Group Ranks": "[1, 3]",
        "In msg nelems": 16,
        "Out msg nelems": 16,
        "Group size": 2,
        "dtype": "Float",
        "Seq": 1,
    }
    events = [
        pid1_op("ProfilerStep#1", 0, 100, cat="user_annotation"),
        pid1_op("record_param_comms", 10, 5, **meta, Rank=1, **{"Dst Rank": 3}),
        pid1_op("cudaLaunchKernel", 11, 1, cat="cuda_runtime", correlation=7),
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            "pid": 0,
            "tid": 7,
            "ts": 20,
            "dur": 5,
            "args": {"correlation": 7, "device": 0, "stream": 7, **meta},
        },
    ]
    path = write_rank(tmp_path / "rank1.json", events, 1, world=4, backend="nccl")
    assert _peers(parse_kineto(path).collectives) == [("send", 3, 1)]


def test_gloo_recv_takes_the_group_rank_of_its_enqueue(tmp_path):
    # c10d::recv_(tensors, group, srcRank, tag): Concrete Inputs ["", "", "2", "0"]: group rank 2;
    # gloo's trace names no group, so no global rank
    dims = {"Input Dims": [[[4]], [], [], []], "Input type": ["TensorList", "", "Scalar", "Scalar"]}
    events = [
        pid1_op("ProfilerStep#1", 0, 100, cat="user_annotation"),
        pid1_op("c10d::recv_", 10, 1, **dims, **{"Concrete Inputs": ["", "", "2", "0"]}),
        pid1_op("gloo:recv", 12, 5, cat="user_annotation", **{"Input Dims": [[4]]}),
    ]
    path = write_rank(tmp_path / "rank0.json", events, 0, world=4)
    from traceprof.collectors.kineto.enqueue import fill_gloo_enter

    assert _peers(fill_gloo_enter(parse_kineto(path)).collectives) == [("recv", None, 2)]
