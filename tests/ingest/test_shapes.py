"""Real-world trace shapes (issue 8): the MUST lines of ../shared/cases/ as tests.

Each case folder holds a small input with exact expected values in its EXPECT.md; the numbers below
are worked out there by hand (µs offsets from the case's T0 / B, converted to ns).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from tests.builders import collective_args
from tests.conftest import analyze, case
from traceprof.core.errors import TraceFormatError
from traceprof.ingest.ingest import ingest
from traceprof.storage.store import Store

US = 1000


def _store(tmp_path: Path, *paths: Path, **kw: object) -> Store:
    s = Store(tmp_path / "t.duckdb")
    ingest(s, list(paths), **kw)  # type: ignore[arg-type]
    return s


def _row(df: pl.DataFrame, **eq: object) -> dict:
    for k, v in eq.items():
        df = df.filter(pl.col(k) == v)
    assert df.height == 1, df
    return df.row(0, named=True)


# --- deepep_comm_kernels: communication kernels not named nccl* ---------------------------------


def test_deepep_kernels_are_comm(tmp_path: Path) -> None:
    s = _store(tmp_path, case("deepep_comm_kernels"))
    k = analyze(s, "kernels")
    for rank in (0, 1):
        r = _row(k.frame, rank=rank)
        # comm = [200,550] ∪ [850,1250] ∪ [1500,1700] = 950 us; compute = 300+400+200 = 900 us
        assert r["comm_ns"] == 950 * US and r["compute_ns"] == 900 * US
        assert r["busy_ns"] == 1650 * US and r["kernel_ns"] == 1850 * US
        assert (r["compute_only_ns"], r["comm_only_ns"], r["overlapped_ns"]) == (700 * US, 750 * US, 200 * US)
        o = _row(analyze(s, "overlap").frame, rank=rank)
        assert o["overlap_ns"] == 200 * US and o["exposed_comm_ns"] == 750 * US
        assert o["overlap_pct"] == pytest.approx(100 * 200 / 950)
        assert o["exposed_comm_pct"] == pytest.approx(100 * 750 / 1700)
    top = k.top.filter((pl.col("rank") == 0) & pl.col("name").str.contains("deep_ep::"))
    assert top.height == 3 and set(top["class"]) == {"comm"}
    # DeepEP rows are collectives with an op, and unknown (NULL) bytes, not 0
    c = s.sql("SELECT op, bytes_in FROM collectives WHERE rank = 0 AND op <> 'all_reduce'")
    assert c.height == 3 and set(c["op"]) == {"all_to_all"} and c["bytes_in"].null_count() == 3


def test_user_comm_kernel_pattern(tmp_path: Path) -> None:
    # Without the pattern a custom kernel is compute; --comm-kernel makes it communication.
    src = json.loads((case("deepep_comm_kernels") / "rank0.json").read_text())
    for ev in src["traceEvents"]:
        if "deep_ep::" in ev.get("name", ""):
            ev["name"] = "my_team::fused_exchange_kernel"
    f = tmp_path / "in" / "rank0.json"
    f.parent.mkdir()
    f.write_text(json.dumps(src))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = _store(tmp_path / "a", f)
    assert _row(analyze(plain, "kernels").frame, rank=0)["comm_ns"] == 200 * US  # only the NCCL kernel
    custom = _store(tmp_path / "b", f, comm_kernels=("fused_exchange",))
    assert _row(analyze(custom, "kernels").frame, rank=0)["comm_ns"] == 950 * US


_LAYOUT = "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int)"


@pytest.mark.parametrize(
    ("names", "comm_us", "overlap_us", "a2a"),
    [
        # DeepEP low-latency kernels; its layout kernel (tokens per rank, counted locally) is compute:
        # comm = [250,550] + [850,1250] + [1500,1700] = 900 us, compute still 900 us ([200,250] lies
        # in GEMM A), overlap [250,300] + [500,550] + [850,900] = 150 us, exposed 750 us
        (
            (
                _LAYOUT,
                "void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*)",
                "void deep_ep::internode_ll::combine<3, 7168, 128>(void*)",
            ),
            900,
            150,
            2,
        ),
        # AMD MORI's expert-parallel kernels: all three communication, the case's figures
        (
            tuple(
                f"void mori::moe::{k}<__hip_bfloat16>(mori::moe::EpDispatchCombineArgs<__hip_bfloat16>)"
                for k in (
                    "EpDispatchInterNodeV1Kernel",
                    "EpDispatchIntraNodeKernel",
                    "EpCombineIntraNodeKernel",
                )
            ),
            950,
            200,
            3,
        ),
        # UCCL-EP (a DeepEP fork, namespace uccl::): intranode kernels, all communication (the
        # case's figures; g3 variant uccl_ep_intranode)
        (
            (
                "void uccl::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int)",
                "void uccl::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*)",
                "void uccl::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*)",
            ),
            950,
            200,
            3,
        ),
        # its low-latency kernels, and its layout kernel is compute (g3 variant uccl_ep_ll_with_layout)
        (
            (
                "void uccl::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int)",
                "void uccl::internode_ll::dispatch<false, false, 7168>(void*, float*, int*, long*)",
                "void uccl::internode_ll::combine<false, 7168, 128>(void*, void*, int*, void*)",
            ),
            900,
            150,
            2,
        ),
        # DeepEP's Hybrid-EP (namespace hybrid_ep): its cross-rank barrier, dispatch and combine,
        # all communication, the case's figures (g5 variant hybrid_ep_kernels)
        (
            (
                "void hybrid_ep::device_sync_kernel<8>(hybrid_ep::device_sync_param_t)",
                "void hybrid_ep::dispatch_kernel<unsigned short, 8, 7168, true>(hybrid_ep::dispatch_kernel_param_t<unsigned short>)",
                "void hybrid_ep::combine_kernel<8, 7168, false>(hybrid_ep::combine_kernel_param_t)",
            ),
            950,
            200,
            3,
        ),
        # Mooncake EP (namespace mooncake, and its JIT-compiled dispatch entry): the case's figures
        # (g5 variant mooncake_ep_kernels)
        (
            (
                "mooncake_ep_jit_dispatch_kernel",
                "void mooncake::dispatch<false, 3, 10, 7168>(void*, float*, int*, long*, int*, int*, void*)",
                "void mooncake::combine<3, 10, 7168, 9>(void*, void*, int*, void*, void*, int*, int*)",
            ),
            950,
            200,
            3,
        ),
        # pplx-kernels (vLLM's pplx all-to-all backend): no library word in the demangled names
        # (dispatchKernel in an anonymous namespace, combineKernel at global scope; the template
        # ends with DO_SEND, DO_RECV): split-mode send half, recv half and combine, all
        # communication, the case's figures (g12 variant g01_kineto_pplx_a2a)
        (
            (
                "void (anonymous namespace)::dispatchKernel<16u, true, false>(int*, unsigned long, std::byte*)",
                "void (anonymous namespace)::dispatchKernel<16u, false, true>(int*, unsigned long, std::byte*)",
                "void combineKernel<__nv_bfloat16, __nv_bfloat16, 8ul, true, true>(__nv_bfloat16*, unsigned long)",
            ),
            950,
            200,
            3,
        ),
    ],
    ids=[
        "deepep_ll_and_layout",
        "mori",
        "uccl_ep_intranode",
        "uccl_ep_ll_with_layout",
        "hybrid_ep",
        "mooncake_ep",
        "pplx",
    ],
)
def test_other_expert_parallel_kernel_names(
    tmp_path: Path, names: tuple[str, ...], comm_us: int, overlap_us: int, a2a: int
) -> None:
    renames = dict(zip(("notify_dispatch", "dispatch<", "combine<"), names, strict=True))
    for f in ("rank0.json", "rank1.json"):
        src = json.loads((case("deepep_comm_kernels") / f).read_text())
        for ev in src["traceEvents"]:
            hit = next(
                (v for k, v in renames.items() if "deep_ep::intranode::" + k in ev.get("name", "")), None
            )
            ev["name"] = hit or ev["name"]
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f).write_text(json.dumps(src))
    s = _store(tmp_path, tmp_path / "in")
    for rank in (0, 1):
        r = _row(analyze(s, "kernels").frame, rank=rank)
        assert (r["comm_ns"], r["compute_ns"], r["overlapped_ns"]) == (
            comm_us * US,
            900 * US,
            overlap_us * US,
        )
        o = _row(analyze(s, "overlap").frame, rank=rank)
        assert (o["overlap_ns"], o["exposed_comm_ns"]) == (overlap_us * US, 750 * US)
        assert o["overlap_pct"] == pytest.approx(100 * overlap_us / comm_us)
    # the expert-parallel kernels are all-to-all collectives (the layout kernel is not one)
    assert s.sql("SELECT count(*) FROM collectives WHERE rank = 0 AND op = 'all_to_all'").item() == a2a


def test_inductor_kernel_named_after_the_all_reduce_it_reads_is_compute(tmp_path: Path) -> None:
    # g5 variant inductor_name_lists_all_reduce: GEMM C [1300,1500] of the case becomes the
    # torch.compile'd RMSNorm after the all-reduce, whose name lists the ops it fuses or reads,
    # all_reduce among them. It is compute: the case's figures (comm 950, compute 900, overlap 200,
    # exposed 750 us), not comm [200,550] + [850,1250] + [1300,1700] = 1150 us / compute 700 us.
    name = "triton_red_fused__to_copy_add_all_reduce_mean_mul_pow_rsqrt_0"
    for f in ("rank0.json", "rank1.json"):
        src = json.loads((case("deepep_comm_kernels") / f).read_text())
        gemms = [e for e in src["traceEvents"] if e.get("cat") == "kernel" and "xmma_gemm" in e["name"]]
        max(gemms, key=lambda e: e["ts"])["name"] = name
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f).write_text(json.dumps(src))
    s = _store(tmp_path, tmp_path / "in")
    for rank in (0, 1):
        r = _row(analyze(s, "kernels").frame, rank=rank)
        assert (r["comm_ns"], r["compute_ns"], r["overlapped_ns"]) == (950 * US, 900 * US, 200 * US)
        o = _row(analyze(s, "overlap").frame, rank=rank)
        assert (o["overlap_ns"], o["exposed_comm_ns"]) == (200 * US, 750 * US)
    from traceprof.core.classify import gpu_class

    assert gpu_class("kernel", "triton_poi_fused_all_gather_copy_in_0") == "compute"
    assert gpu_class("kernel", "void ctran::alltoall_kernel()") == "comm"  # still named after a collective


@pytest.mark.parametrize(
    "name",
    [
        "triton_poi_fused_one_shot_all_reduce_0",  # custom_all_reduce's words
        "triton_red_fused_two_shot_all_reduce_add_1",
        "triton_poi_fused_lamport_0",
        "triton_poi_fused_multimem_all_reduce_0",  # symm_mem's
        "triton_per_fused_nvshmem_put_0",  # nvshmem's
        "triton_tem_fused_deep_ep::dispatch_mm_0",  # deepep's
    ],
)
def test_inductor_kernels_match_no_built_in_family_but_a_user_pattern(name: str) -> None:
    # t6: the triton_ exclusion covered the collective_name family only; Inductor's names list the
    # ops fused or read whatever family their words belong to (a user pattern still marks them)
    from traceprof.core.classify import Classifier, gpu_class

    assert gpu_class("kernel", name) == "compute"
    assert Classifier([re.escape(name)]).gpu_class("kernel", name) == "comm"
    assert gpu_class("kernel", name.replace("triton_", "my_", 1)) == "comm"  # the family itself still matches


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        # pplx-kernels' names as a demangler may render the template (CUPTI: "(unsigned int)16",
        # "8UL", "int *"): still its family (g12: the first pattern stopped at the parenthesis)
        (
            "void (anonymous namespace)::dispatchKernel<(unsigned int)16, true, false>(int *, unsigned long)",
            "comm",
        ),
        (
            "void combineKernel<__nv_bfloat16, __nv_bfloat16, 8UL, true, true>(__nv_bfloat16 *, unsigned long)",
            "comm",
        ),
        # a kernel merely named dispatchKernel, without pplx's trailing DO_SEND, DO_RECV, is compute
        ("void dispatchKernel<float>(float *, int)", "compute"),
        ("void (anonymous namespace)::combineKernel<4>(float *)", "compute"),
    ],
)
def test_pplx_names_however_rendered(name: str, cls: str) -> None:
    from traceprof.core.classify import gpu_class

    assert gpu_class("kernel", name) == cls


def test_metadata_makes_comm() -> None:
    from traceprof.core.classify import gpu_class

    assert gpu_class("kernel", "some_kernel", {"Collective name": "allreduce"}) == "comm"
    assert gpu_class("kernel", "some_kernel", None, {"Process Group Name": "0"}) == "comm"
    assert gpu_class("kernel", "some_kernel") == "compute"
    assert gpu_class("memcpy", "Memcpy DtoD", {"Collective name": "x"}) == "memory"
    for name in (
        "void deep_ep::internode::dispatch<4>()",
        "cross_device_reduce_2stage<half>",
        "ncclDevKernel_AllGather_RING_LL()",
        "rccl_kernel",
        "nvshmemi_reduce",
        "c10d::symmetric_memory::two_shot_all_reduce_kernel",
        "void deep_ep::internode_ll::combine<3, 7168, 128>(void*)",
        "void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int**, int)",
        "void mori::moe::EpCombineInterNodeKernel<float>(mori::moe::EpDispatchCombineArgs<float>)",
        "void tensorrt_llm::kernels::moe_comm::moeA2ADispatchKernel<8, false, false>(int const*)",
        "void tensorrt_llm::kernels::moe_comm::moeA2ACombineKernel<__nv_bfloat16, 8>(int)",
    ):
        assert gpu_class("kernel", name) == "comm", name
    prepare = "tensorrt_llm::kernels::moe_comm::moeA2APrepareDispatchKernel(int*, int*, int, int)"
    local = (
        # DeepEP's layout kernel in its older (internode) and current (legacy::layout) namespaces,
        # MORI's copy to the staging buffer and a kernel that only takes the dispatch/combine args
        "void deep_ep::internode::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
        "void deep_ep::legacy::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int)",
        "void mori::moe::EpDispatchCopyToStaging<float>(mori::moe::EpDispatchCombineArgs<float>)",
        "void mori::moe::SomeLocalReorder<float>(mori::moe::EpDispatchCombineArgs<float>)",
    )
    for name in (
        "small_gather_kernel",
        "sm90_xmma_gemm_bf16",
        "reduce_kernel<512>",
        _LAYOUT,
        prepare,
        *local,
    ):
        assert gpu_class("kernel", name) == "compute", name


# --- cuda_graph_launch: many kernels share one launch ---------------------------------------------


def test_cuda_graph_launch(tmp_path: Path) -> None:
    s = _store(tmp_path, case("cuda_graph_launch"))
    k = s.sql(
        "SELECT count(*) AS n, sum(dur_ns) AS t, count(DISTINCT step) AS steps, min(step) AS step "
        "FROM kernels WHERE kind = 'kernel'"
    )
    assert k.row(0) == (12, 840 * US, 1, 3)  # all kept, 100 + 340 + 60 + 340 us, in ProfilerStep#3
    la = _row(analyze(s, "launch").frame, rank=0)
    # per launch call: 20, 60, 20, 30 us -> p50 25 us (linear), max 60 us
    assert (la["launches"], la["latency_p50_ns"], la["latency_max_ns"]) == (4, 25 * US, 60 * US)
    assert (la["graph_launches"], la["graph_kernels"]) == (2, 10)
    idle = _row(analyze(s, "idle").frame, rank=0, stream=7)
    # window [30, 1170] = 1140 us, busy 840, idle 300 us, all host wait (130 + 40 + 130)
    assert (idle["window_ns"], idle["idle_ns"], idle["host_wait_ns"]) == (1140 * US, 300 * US, 300 * US)
    assert idle["idle_pct"] == pytest.approx(100 * 300 / 1140)


def test_graph_launch_whose_first_node_is_a_memset_or_memcpy(tmp_path: Path) -> None:
    # A memset node [240, 250] heads graph 102 (launched at 200) and a memcpy [815, 825] heads graph
    # 104 (launched at 800): each launch is still measured once, to its first GPU activity:
    # 20, 40, 20, 15 us -> p50 20 us, max 40, mean 23.75 us; 2 graph launches of 5 kernels each.
    def edit(evs: list[dict]) -> None:
        for corr, cat, name, ts in (
            (102, "gpu_memset", "Memset (Device)", 240),
            (104, "gpu_memcpy", "Memcpy DtoD (Device -> Device)", 815),
        ):
            k = _by_corr(evs, corr, "kernel")[0]
            evs.append(k | {"cat": cat, "name": name, "ts": 1_000_000.0 + ts, "dur": 10.0})

    s = _store(tmp_path, _variant(tmp_path, "cuda_graph_launch", edit))
    la = _row(analyze(s, "launch").frame, rank=0)
    assert (la["launches"], la["latency_p50_ns"], la["latency_max_ns"]) == (4, 20 * US, 40 * US)
    assert (la["latency_mean_ns"], la["graph_launches"], la["graph_kernels"], la["kernel_ns"]) == (
        23_750,
        2,
        10,
        840 * US,
    )


def test_graph_launch_without_gpu_records_is_said_missing(tmp_path: Path) -> None:
    # The case with graph 104's 5 kernels (340 us) gone, as a profiler that does not trace graph
    # nodes leaves them: its cudaGraphLaunch has no GPU record, so the figures miss 340 us of busy
    # time; ingest warns, traces.meta counts it and the idle figures and finding say so (the
    # nsys_graph_level_trace kind: replays must not vanish silently into "idle, host wait").
    def edit(evs: list[dict]) -> None:
        evs[:] = [e for e in evs if e not in _by_corr(evs, 104, "kernel")]

    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [_variant(tmp_path, "cuda_graph_launch", edit)], run="r")
    assert sum("1 of 2 CUDA graph launch(es) have no GPU record" in w for w in res.warnings) == 1
    meta = json.loads(s.sql("SELECT meta FROM traces").item())
    assert (meta["graph_launches"], meta["graph_launches_without_gpu"]) == (2, 1)
    lost = "incomplete: CUDA graph launches with no GPU record (rank 0: 1 of 2 (50.0%)), more than 10%"
    for name in ("temporal", "idle", "launch", "kernel_sum"):
        assert any(n.startswith(lost) for n in analyze(s, name).notes), name
    from traceprof.engine.findings import summarize

    assert lost in next(v for v in summarize(s, "r").verdicts if v.topic == "idle").text
    # the case itself: every graph launch has its kernels, nothing said
    c = Store(tmp_path / "c.duckdb")
    assert not any("no GPU record" in w for w in ingest(c, [case("cuda_graph_launch")]).warnings)
    assert "graph_launches_without_gpu" not in json.loads(c.sql("SELECT meta FROM traces").item())


def test_launches_whose_only_gpu_record_is_a_copy_or_an_annotation_count_alike(tmp_path: Path) -> None:
    # Two graph launches and two kernel launches, one pair per kind of lone GPU record:
    # - graph 1 and kernel 2: their only GPU record is a memset / a memcpy (GPU activity): neither
    #   lacks a GPU record, for both counts;
    # - graph 3 and kernel 4: their only GPU record is a gpu_user_annotation (a span, no GPU time of
    #   the launch): both lack one. Before, the graph count took annotations and syncs for GPU
    #   records and the kernel count did not: graph 3 was counted as traced (graph 2, 0 lost;
    #   kernel 2, 1 lost); now (2, 1) and (2, 1).
    def call(name: str, corr: int, ts: float) -> dict:
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2.0,
                "args": {"correlation": corr}}  # fmt: skip

    def gpu(cat: str, name: str, corr: int, ts: float) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 5.0,
                "args": {"correlation": corr, "device": 0, "stream": 7}}  # fmt: skip

    evs = [
        call("cudaGraphLaunch", 1, 10.0),
        gpu("gpu_memset", "Memset (Device)", 1, 15.0),
        call("cudaLaunchKernel", 2, 30.0),
        gpu("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 2, 35.0),
        call("cudaGraphLaunch", 3, 50.0),
        gpu("gpu_user_annotation", "graph_region", 3, 55.0),
        call("cudaLaunchKernel", 4, 70.0),
        gpu("gpu_user_annotation", "kernel_region", 4, 75.0),
    ]
    s = Store(tmp_path / "t.duckdb")
    ingest(s, [_write(tmp_path, evs)])
    meta = json.loads(s.sql("SELECT meta FROM traces").item())
    assert (meta["graph_launches"], meta["graph_launches_without_gpu"]) == (2, 1)
    assert (meta["kernel_launches"], meta["kernel_launches_without_gpu"]) == (2, 1)


def test_device_runtime_categories_are_launches(tmp_path: Path) -> None:
    src = json.loads((case("cuda_graph_launch") / "rank0.json").read_text())
    cats = iter(["xpu_runtime", "privateuse1_runtime", "mtia_runtime", "hip_runtime"])
    for ev in src["traceEvents"]:
        if ev.get("cat") == "cuda_runtime":
            ev["cat"] = next(cats)
    f = tmp_path / "in" / "rank0.json"
    f.parent.mkdir()
    f.write_text(json.dumps(src))
    s = _store(tmp_path, f)
    assert s.sql("SELECT count(*) FROM events WHERE kind = 'other'").item() == 0
    assert s.sql("SELECT count(*) FROM events WHERE kind = 'cuda_runtime'").item() == 4
    assert _row(analyze(s, "launch").frame, rank=0)["latency_p50_ns"] == 25 * US


# --- kernel_before_its_launch: another clock domain ---------------------------------------------


def test_kernel_before_its_launch(tmp_path: Path) -> None:
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [case("kernel_before_its_launch")])
    warn = [w for w in res.warnings if "before the CPU call" in w]
    assert len(warn) == 1 and "rank0.json" in warn[0] and ": 2 GPU" in warn[0]
    assert "by up to 100,000 s" in warn[0]  # 99,999,999,980,000 ns, in human units
    assert s.sql("SELECT events_flagged FROM traces").item() == 2
    flagged = s.sql("SELECT correlation FROM events WHERE flag = 'before_launch' ORDER BY 1")["correlation"]
    assert flagged.to_list() == [501, 502]  # kept in the store, flagged
    t = _row(analyze(s, "temporal").frame, rank=0)
    assert t["window_ns"] == 350 * US and t["idle_ns"] == 150 * US  # [230, 580], busy 200
    assert t["idle_pct"] == pytest.approx(100 * 150 / 350)
    idle = _row(analyze(s, "idle").frame, rank=0)
    assert (idle["window_ns"], idle["idle_ns"]) == (350 * US, 150 * US)
    la = _row(analyze(s, "launch").frame, rank=0)
    assert (la["latency_p50_ns"], la["latency_max_ns"], la["latency_mean_ns"]) == (20 * US, 20 * US, 20 * US)
    k = _row(analyze(s, "kernels").frame, rank=0)
    assert (k["flagged_kernels"], k["flagged_ns"]) == (2, 100 * US)


def test_before_launch_on_several_ranks_and_a_rank_all_early(tmp_path: Path) -> None:
    # g3 variant kernel_before_its_launch/three_ranks_magnitudes: the case's six launches (10, 110,
    # ..., 510 us) on three ranks, each kernel really at launch + 20 us for 50 us, written x us before
    # its launch: rank 0 #1 1e14 ns, #2 3 ms, #3 28 us (jitter band: kept); rank 1 #1 1 hour, #4 (mid
    # session) 10 s; rank 2 all six 1e14 ns (its whole GPU timeline in the other clock domain).
    early = {
        0: {501: 1e11, 502: 3000.0, 503: 28.0},
        1: {501: 3.6e9, 504: 1e7},
        2: dict.fromkeys(range(501, 507), 1e11),
    }
    d = tmp_path / "in"
    d.mkdir()
    for rank, xs in early.items():
        src = json.loads((case("kernel_before_its_launch") / "rank0.json").read_text())
        src["distributedInfo"].update(rank=rank, world_size=3)
        launch = {
            e["args"]["correlation"]: e["ts"] for e in src["traceEvents"] if e.get("cat") == "cuda_runtime"
        }
        for e in src["traceEvents"]:
            if e.get("cat") == "kernel":
                c = e["args"]["correlation"]
                e["ts"] = launch[c] - xs[c] if c in xs else launch[c] + 20
        (d / f"rank{rank}.json").write_text(json.dumps(src))
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [d])
    warn = sorted(w for w in res.warnings if "): another clock domain" in w)
    assert [w.split(" GPU")[0] for w in warn] == ["rank0.json: 2", "rank1.json: 2", "rank2.json: 6"]
    assert "100,000 s" in warn[0] and "3,600 s" in warn[1] and "100,000 s" in warn[2]
    idle = analyze(s, "idle").frame
    # rank 0: [182,232] [330,380] [430,480] [530,580]: window 398 us, idle 198; rank 1: [130..580]
    # without #4: window 450, idle 250; rank 2 has no valid GPU activity: no lane
    assert idle.sort("rank").select("rank", "window_ns", "idle_ns").rows() == [
        (0, 398 * US, 198 * US),
        (1, 450 * US, 250 * US),
    ]
    la = analyze(s, "launch").frame.sort("rank")
    assert la.select("rank", "launches", "latency_p50_ns", "latency_max_ns").rows() == [
        (0, 3, 20 * US, 20 * US),  # #3 (28 us early) kept with its work but not measured
        (1, 4, 20 * US, 20 * US),
    ]
    k = analyze(s, "kernels")
    rows = k.frame.sort("rank").select("rank", "kernels", "busy_ns", "flagged_kernels", "flagged_ns").rows()
    # the rank whose records are all flagged keeps its row, its 6 x 50 us counted
    assert rows == [(0, 4, 200 * US, 2, 100 * US), (1, 4, 200 * US, 2, 100 * US), (2, 0, 0, 6, 300 * US)]
    assert any("10 GPU record(s) flagged" in str(n) for n in k.notes), k.notes


def test_far_outside_records_never_stretch_the_window(tmp_path: Path) -> None:
    # An old-style-like ts == 0 record: moved to the epoch start, decades before the steps.
    src = json.loads((case("two_gpus_one_process") / "rank0.json").read_text())
    extra = dict(next(e for e in src["traceEvents"] if e.get("cat") == "kernel"))
    extra["ts"] = 0
    extra["args"] = dict(extra["args"], correlation=999)
    src["traceEvents"].append(extra)
    f = tmp_path / "in" / "rank0.json"
    f.parent.mkdir()
    f.write_text(json.dumps(src))
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [f])
    assert any("ts == 0" in w for w in res.warnings)
    assert _row(analyze(s, "temporal").frame, rank=0)["window_ns"] == 1300 * US


# --- two_gpus_one_process: lanes are (device, stream) ---------------------------------------------


def test_two_gpus_one_process(tmp_path: Path) -> None:
    s = _store(tmp_path, case("two_gpus_one_process"))
    idle = analyze(s, "idle")
    for dev in (0, 1):
        r = _row(idle.frame, rank=0, device=dev, stream=1)
        assert (r["kernels"], r["window_ns"], r["idle_ns"], r["host_wait_ns"]) == (
            2,
            1000 * US,
            200 * US,
            200 * US,
        )
    ranks = _row(idle.ranks, rank=0)
    assert (ranks["streams"], ranks["stream_window_sum_ns"], ranks["stream_idle_sum_ns"]) == (
        2,
        2000 * US,
        400 * US,
    )
    assert ranks["stream_idle_pct"] == pytest.approx(20.0)
    la = analyze(s, "launch")
    r = _row(la.frame, rank=0)
    assert (r["latency_p50_ns"], r["latency_max_ns"], r["idle_launches"]) == (20 * US, 20 * US, 4)
    assert sorted(la.streams["idle_launches"].to_list()) == [2, 2]
    t = analyze(s, "temporal")
    for dev in (0, 1):
        d = _row(t.devices, rank=0, device=dev)
        assert (d["window_ns"], d["idle_ns"]) == (1000 * US, 200 * US)
    assert any("several GPUs" in n for n in t.notes)


def test_two_gpus_idle_verdict_uses_the_devices_figures(tmp_path: Path) -> None:
    # The case's MUST/SHOULD: per device 200 us idle of a 1000 us window; merged, the GPUs are idle
    # 0 % of [100, 1400] us (one device always busy). The verdict leads with the devices' figure:
    # 400 of 2000 us = 20 % (>= 10 %: problem), the merged 0 % only in the clause that says so;
    # the step window's figure (merged: [0, 1500] us, busy 1300) is 13 %. A one-GPU run gets no clause.
    from traceprof.engine.findings import summarize

    s = _store(tmp_path, case("two_gpus_one_process"))
    idle = next(v for v in summarize(s, None).verdicts if v.topic == "idle")
    assert idle.status == "problem"
    assert idle.text.startswith(
        "the GPU is idle 20% of the activity window (first to last activity; mean over ranks; rank 0 20%) "
        "and 13% of the step window"
    )
    assert (
        "rank(s) 0 drive several GPUs: their idle share is per device (idle time over the sum of their "
        "devices' windows: rank 0 400 us of 2 ms; most idle rank 0 device 0 20%, temporal's devices "
        "table); merged (one window over all devices): rank 0 0%"
    ) in idle.text
    (tmp_path / "one").mkdir()
    one = _store(tmp_path / "one", case("one_collective_per_step"))
    assert "several GPUs" not in next(v for v in summarize(one, None).verdicts if v.topic == "idle").text


def _dp_nccl_both_devices(tmp_path: Path) -> Store:
    """g7 variant two_gpus_one_process/dp_nccl_both_devices, on the case's GEMMs (device 0 [100, 500]
    [700, 1100], device 1 [400, 800] [1000, 1400] us) plus a broadcast kernel on each device's
    stream 2 (one process driving both GPUs, as DataParallel does): device 0 [500, 700] while only
    device 1 computes, device 1 [800, 1000] while only device 0 computes; ingested."""
    src = json.loads((case("two_gpus_one_process") / "rank0.json").read_text())
    t0 = next(e["ts"] for e in src["traceEvents"] if e.get("name") == "ProfilerStep#1")
    for dev, start, corr in ((0, 500, 701), (1, 800, 702)):
        ext = {"External id": corr, "Record function id": 0}
        src["traceEvents"] += [
            {"ph": "X", "cat": "cpu_op", "name": "nccl:broadcast", "pid": 10001, "tid": 10001,
             "ts": t0 + start - 25, "dur": 15.0, "args": ext},
            {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 10001, "tid": 10001,
             "ts": t0 + start - 20, "dur": 5.0, "args": {"External id": corr, "correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             "pid": dev, "tid": 2, "ts": t0 + start, "dur": 200.0,
             "args": {"External id": corr, "device": dev, "stream": 2, "correlation": corr}},
        ]  # fmt: skip
    f = tmp_path / "in" / "rank0.json"
    f.parent.mkdir()
    f.write_text(json.dumps(src))
    return _store(tmp_path, f)


def test_two_gpus_communication_verdict_uses_the_devices_figures(tmp_path: Path) -> None:
    # g7 variant two_gpus_one_process/dp_nccl_both_devices, on the case's GEMMs (device 0 [100, 500]
    # [700, 1100], device 1 [400, 800] [1000, 1400] us) plus a broadcast kernel on each device's
    # stream 2 (one process driving both GPUs, as DataParallel does): device 0 [500, 700] while only
    # device 1 computes, device 1 [800, 1000] while only device 0 computes. Per device nothing of it
    # is hidden: 200 us exposed of each 1000 us window, 400 of 2000 = 20 % (problem); merged over the
    # rank, the other device's GEMMs "hide" all 400 us (0 %, ok), said only in the clause.
    from traceprof.engine.findings import summarize

    s = _dp_nccl_both_devices(tmp_path)
    ov = analyze(s, "overlap")
    assert _row(ov.frame, rank=0)["exposed_comm_ns"] == 0  # the merged per-rank figure, noted
    for dev in (0, 1):
        d = _row(ov.devices, rank=0, device=dev)
        assert (d["comm_ns"], d["overlap_ns"], d["exposed_comm_ns"], d["window_ns"]) == (
            200 * US,
            0,
            200 * US,
            1000 * US,
        )
    comm = next(v for v in summarize(s, None).verdicts if v.topic == "communication")
    assert comm.status == "problem"
    assert comm.text.startswith(
        "exposed communication: 20% of the window on rank 0 (400 us; 0% of its communication hidden; "
        "median over ranks: exposed 20% of the window, hidden 0% of communication); rank(s) 0 drive "
        "several GPUs: their figures are per device (each device's communication against that device's "
        "compute, exposed time over the sum of their devices' windows: rank 0 400 us of 2 ms; overlap's "
        "devices table); merged (one device's communication hidden behind any device's compute): rank 0 "
        "exposed 0% of the window"
    )


def test_two_gpus_kernels_overlap_per_device(tmp_path: Path) -> None:
    # dp_nccl_both_devices: per device, busy [100, 1100] / [400, 1400] = 1000 us each, compute 800,
    # comm 200, none of it under that device's compute. Summed: busy 2000, compute_only 1600,
    # comm_only 400, overlapped 0 (80 / 20 / 0 %). Merged over the rank (before): busy 1300,
    # overlapped 400 (each broadcast "under" the other device's GEMM), comm_only 0.
    k = analyze(_dp_nccl_both_devices(tmp_path), "kernels")
    r = _row(k.frame, rank=0)
    cols = ("busy_ns", "compute_ns", "comm_ns", "compute_only_ns", "comm_only_ns", "overlapped_ns")
    assert tuple(r[c] for c in cols) == (2000 * US, 1600 * US, 400 * US, 1600 * US, 400 * US, 0)
    assert (r["compute_only_pct"], r["comm_only_pct"], r["overlapped_pct"]) == pytest.approx(
        (80.0, 20.0, 0.0)
    )
    assert sorted(k.types.select("kernel_type", "time_ns").rows()) == [
        ("comm", 400 * US),
        ("compute", 1600 * US),
    ]
    assert any("rank(s) 0 drive several GPUs" in str(n) for n in k.notes)


def test_two_gpus_gaps_per_device(tmp_path: Path) -> None:
    # dp_nccl_both_devices: per device each broadcast is exposed whole (its device computes nothing
    # then): device 0 [500, 700] after its GEMM ending at 500, device 1 [800, 1000] after its GEMM
    # ending at 800; 400 us exposed of 2 x 1000 us device windows (20 %). Merged over the rank
    # (before) the other device's GEMMs hid both: no gaps, "all of it is hidden behind compute".
    from traceprof.engine.findings import summarize

    s = _dp_nccl_both_devices(tmp_path)
    g = analyze(s, "gaps")
    t0 = 1767225601000000000
    rows = g.gaps.sort("start_ns").select("start_ns", "dur_ns", "op", "last_compute_end_ns", "top_op").rows()
    assert rows == [
        (t0 + 500 * US, 200 * US, "broadcast", t0 + 500 * US, "aten::mm"),
        (t0 + 800 * US, 200 * US, "broadcast", t0 + 800 * US, "aten::mm"),
    ]
    assert g.frame.select("cause", "exposed_ns", "gaps").rows() == [("broadcast after aten::mm", 400 * US, 2)]
    r = _row(g.ranks, rank=0)
    assert (r["comm_ns"], r["exposed_ns"], r["window_ns"], r["gaps"]) == (400 * US, 400 * US, 2000 * US, 2)
    st = _row(g.steps, rank=0, step=1)
    assert (st["comm_ns"], st["exposed_ns"], st["step_ns"]) == (400 * US, 400 * US, 2000 * US)
    assert any("rank(s) 0 drive several GPUs" in str(n) for n in g.notes)
    comm = next(v for v in summarize(s, None).verdicts if v.topic == "communication")
    assert "broadcast after aten::mm" in comm.text


def test_two_gpus_critical_path_says_its_account_is_the_wall_clock(tmp_path: Path) -> None:
    # dp_nccl_both_devices on the rank's wall clock (module doc): step [0, 1400] us, compute wherever
    # either device computes ([100, 1400] = 1300 us), host-bound [0, 100], no transfer (each broadcast
    # runs while the other device computes). The note and the communication finding's step-account
    # clause say so and give the per-device exposed figure (400 us, gaps').
    from traceprof.engine.findings import summarize

    s = _dp_nccl_both_devices(tmp_path)
    cp = analyze(s, "critical_path")
    r = _row(cp.frame, rank=0, step=1)
    assert (r["step_ns"], r["compute_ns"], r["transfer_ns"], r["host_bound_ns"]) == (
        1400 * US,
        1300 * US,
        0,
        100 * US,
    )
    note = cp.note("multi_device")
    assert note is not None and note.ranks == (0,)
    assert note.endswith(
        "per device their exposed communication is rank 0 400 us (gaps, overlap's devices table)"
    )
    comm = next(f for f in summarize(s, None).findings if f.topic == "communication")
    assert comm.text.endswith(
        "step account: exposed transfer 0.0% of all ranks' step time (rank(s) 0 drive several GPUs: on their "
        "wall clock one device's communication while another device computes counts as compute; per device it "
        "is exposed: gaps)"
    )


def test_two_gpus_export_tracks_do_not_overlap(tmp_path: Path) -> None:
    from traceprof.render.export import export_perfetto

    s = _store(tmp_path, case("two_gpus_one_process"))
    out = tmp_path / "all.json"
    export_perfetto(s, s.resolve_run(None), out)
    evs = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    tracks: dict[tuple, list[tuple[float, float]]] = {}
    for e in evs:
        tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    assert len(tracks) == 2
    for spans in tracks.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


# --- trace structure: B/E pairs, several processes in one file, overruns -------------------------


def _write(tmp_path: Path, events: list[dict], name: str = "rank0.json") -> Path:
    """A new-style trace of ``events`` (``ts`` in us after baseTimeNanoseconds; 0 would be an unset time)."""
    doc = {
        "distributedInfo": {"rank": 0, "world_size": 1},
        "baseTimeNanoseconds": 1767225600000000000,
        "traceEvents": events,
    }
    d = tmp_path / "in"
    d.mkdir(exist_ok=True)
    f = d / name
    f.write_text(json.dumps(doc))
    return f


def test_begin_end_pairs(tmp_path: Path) -> None:
    evs = [
        {"ph": "B", "cat": "user_annotation", "name": "outer", "pid": 1, "tid": 1, "ts": 100.0},
        {"ph": "B", "cat": "user_annotation", "name": "inner", "pid": 1, "tid": 1, "ts": 110.0},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 120.0},  # unnamed: closes the latest B (inner)
        {"ph": "E", "name": "outer", "pid": 1, "tid": 1, "ts": 200.0},
        {"ph": "B", "cat": "user_annotation", "name": "never_ends", "pid": 1, "tid": 2, "ts": 150.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 130.0, "dur": 5.0},
    ]
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [_write(tmp_path, evs)])
    got = dict(s.sql("SELECT name, dur_ns FROM events WHERE kind = 'user_annotation'").iter_rows())
    assert got == {"outer": 100 * US, "inner": 10 * US, "never_ends": 0}
    assert s.sql("SELECT flag FROM events WHERE name = 'never_ends'").item() == "unmatched_begin"
    assert any("without their 'E'" in w for w in res.warnings)


def test_one_file_several_processes_is_an_error(tmp_path: Path) -> None:
    evs = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#5",
            "pid": 10,
            "tid": 10,
            "ts": 0.0,
            "dur": 10.0,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#5",
            "pid": 20,
            "tid": 20,
            "ts": 0.0,
            "dur": 10.0,
        },
    ]
    with pytest.raises(TraceFormatError, match=r"rank0\.json.*ProfilerStep#5.*several"):
        ingest(Store(tmp_path / "t.duckdb"), [_write(tmp_path, evs)])
    evs = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 10,
            "tid": 10,
            "ts": 1.0,
            "dur": 1.0,
            "args": {"correlation": 7},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 20,
            "tid": 20,
            "ts": 1.0,
            "dur": 1.0,
            "args": {"correlation": 7},
        },
    ]
    with pytest.raises(TraceFormatError, match=r"correlation 7.*two processes"):
        ingest(Store(tmp_path / "u.duckdb"), [_write(tmp_path, evs, "rank1.json")])
    # the same step twice on one pid (two profiler sessions in one file) says so, not "pids 10 and 10"
    evs = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#5",
            "pid": 10,
            "tid": 10,
            "ts": 0.0,
            "dur": 10.0,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#5",
            "pid": 10,
            "tid": 10,
            "ts": 20.0,
            "dur": 10.0,
        },
    ]
    with pytest.raises(TraceFormatError, match=r"ProfilerStep#5.*appears twice \(both on pid 10\)"):
        ingest(Store(tmp_path / "v.duckdb"), [_write(tmp_path, evs, "rank2.json")])


def test_one_correlation_id_on_two_launches_warns_and_pairs_with_the_earliest(tmp_path: Path) -> None:
    # Steps #1 [10, 110] and #2 [110, 210] us; correlation 7 is launched twice in one process: on thread
    # 1 at 50 us (event #2, step 1) and on thread 2 at 150 us (event #3, step 2; last in the file). The
    # all-reduce kernel with id 7 runs at 160 us. It was paired silently with the last launch in the file
    # (step 2, enter 150 us) while the kernels view took the earliest (launch 50 us); now both take the
    # earliest call: step 1, enter = launch = 50 us, and a warning names the id and the count.
    launch = {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "dur": 2.0,
        "args": {"correlation": 7},
    }
    evs = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 10.0,
            "dur": 100.0,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#2",
            "pid": 1,
            "tid": 1,
            "ts": 110.0,
            "dur": 100.0,
        },
        {**launch, "tid": 1, "ts": 50.0},
        {**launch, "tid": 2, "ts": 150.0},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "pid": 0,
            "tid": 7,
            "ts": 160.0,
            "dur": 20.0,
            "args": {
                "correlation": 7,
                "device": 0,
                "stream": 7,
                **collective_args(seq=1, dtype=None),
            },
        },
    ]
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [_write(tmp_path, evs)])
    assert (
        "rank0.json: 1 correlation id(s) of GPU records belong to several CUDA runtime/driver calls (e.g. "
        "correlation 7: 2 calls, events #2, #3, on thread(s) '1', '2'): each such GPU record is paired with "
        "the earliest of them (its step, class, collective and launch latency follow from that call)"
        in res.warnings
    )
    b = 1767225600000000000
    assert s.sql("SELECT step, launch_ts_ns - $1 AS l FROM kernels", [b]).rows() == [(1, 50 * US)]
    assert s.sql("SELECT step, enter_ns - $1 AS e FROM collectives", [b]).rows() == [(1, 50 * US)]
    s.close()


def test_overrun_clipped_pdl_left_alone(tmp_path: Path) -> None:
    k = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7}
    evs = [
        {
            **k,
            "name": "a",
            "ts": 1000.0,
            "dur": 5000.0,
            "args": {"device": 0, "stream": 7},
        },  # runs 4,990 us past b
        {**k, "name": "b", "ts": 1010.0, "dur": 10.0, "args": {"device": 0, "stream": 7}},
        {**k, "name": "c", "ts": 1100.0, "dur": 13.0, "args": {"device": 0, "stream": 7}},  # 3 us PDL overlap
        {**k, "name": "d", "ts": 1110.0, "dur": 10.0, "args": {"device": 0, "stream": 7}},
    ]
    s = _store(tmp_path, _write(tmp_path, evs))
    got = {
        n: (d, f, r) for n, d, f, r in s.sql("SELECT name, dur_ns, flag, raw_dur_ns FROM events").iter_rows()
    }
    assert got["a"] == (10 * US, "overrun", 5000 * US)
    assert got["c"] == (13 * US, None, None)
    # busy from clipped values: [1000,1020] + [1100,1120] = 40 us (times: us after the trace's base)
    assert _row(analyze(s, "kernels").frame, rank=0)["busy_ns"] == 40 * US


def test_overruns_on_several_lanes_are_named_in_lane_order(tmp_path: Path) -> None:
    # Three lanes, written (device 1, stream 2), (0, 9), (0, 3); on each the first kernel runs past
    # the next one's start (us): p [100, 150) past q at 120 -> 20 us (30 cut); x [200, 240) past y
    # at 210 -> 10 us (30 cut); m [300, 400) past n at 350 -> 50 us (50 cut). The rule is the shared
    # collectors._far_end.lane_overruns (nsys uses it too); the warning names the clipped events in
    # (device, stream) order: m (#4), x (#2), p (#0), and the largest cut, 50 us.
    k = {"ph": "X", "cat": "kernel", "pid": 0}
    lanes = {"p": (1, 2), "q": (1, 2), "x": (0, 9), "y": (0, 9), "m": (0, 3), "n": (0, 3)}
    times = {"p": (100, 50), "q": (120, 10), "x": (200, 40), "y": (210, 10), "m": (300, 100), "n": (350, 10)}
    evs = [
        {**k, "tid": lanes[n][1], "name": n, "ts": float(t), "dur": float(d)}
        | {"args": {"device": lanes[n][0], "stream": lanes[n][1]}}
        for n, (t, d) in times.items()
    ]
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [_write(tmp_path, evs)])
    got = dict(s.sql("SELECT name, dur_ns FROM events WHERE flag = 'overrun'").iter_rows())
    assert got == {"p": 20 * US, "x": 10 * US, "m": 50 * US}
    (w,) = [w for w in res.warnings if "run past the next record on their stream" in w]
    assert "rank0.json: 3 GPU record(s)" in w and "by up to 50.000 us (events #4, #2, #0)" in w


def test_step_window_columns(tmp_path: Path) -> None:
    # two_gpus_one_process: ProfilerStep#1 [0, 1500] us; GPU busy [100, 1400] -> 200 us idle in the step
    s = _store(tmp_path, case("two_gpus_one_process"))
    t = _row(analyze(s, "temporal").frame, rank=0)
    assert (t["step_window_ns"], t["step_idle_ns"]) == (1500 * US, 200 * US)
    assert _row(analyze(s, "idle").ranks, rank=0)["step_idle_ns"] == 200 * US


def test_launching_op_metadata_makes_comm(tmp_path: Path) -> None:
    # A kernel with a name no family knows, launched under record_param_comms carrying a collective:
    # its External id (or, without one, its runtime call's) links it to that op -> comm.
    evs = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 50.0,
            "args": {"External id": 5, "Collective name": "all_reduce", "Process Group Name": "0"},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 1.0,
            "dur": 2.0,
            "args": {"External id": 5, "correlation": 11},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 3.0,
            "dur": 2.0,
            "args": {"External id": 5, "correlation": 12},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "vendor_xfer_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 10.0,
            "dur": 10.0,
            "args": {"External id": 5, "correlation": 11, "device": 0, "stream": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "vendor_xfer_kernel",
            "pid": 0,
            "tid": 7,
            "ts": 30.0,
            "dur": 10.0,
            "args": {"correlation": 12, "device": 0, "stream": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm",
            "pid": 0,
            "tid": 8,
            "ts": 10.0,
            "dur": 5.0,
            "args": {"correlation": 13, "device": 0, "stream": 8},
        },
    ]
    s = _store(tmp_path, _write(tmp_path, evs))
    got = s.sql("SELECT name, class FROM kernels ORDER BY ts_ns, name").rows()
    assert got == [("gemm", "compute"), ("vendor_xfer_kernel", "comm"), ("vendor_xfer_kernel", "comm")]


def test_step_cutting_through_an_op_warns(tmp_path: Path) -> None:
    evs = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 1000.0,
            "dur": 100.0,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#2",
            "pid": 1,
            "tid": 1,
            "ts": 1100.0,
            "dur": 100.0,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 1, "tid": 1, "ts": 1090.0, "dur": 20.0},
    ]
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [_write(tmp_path, evs)])
    assert any("run past the end of the ProfilerStep" in w and "aten::copy_" in w for w in res.warnings)
    assert s.sql("SELECT step FROM events WHERE name = 'aten::copy_'").item() == 1  # the step it starts in


# --- variants found by trying to break the above (times: us after the case's T0) -------------------


def _variant(tmp_path: Path, name: str, edit) -> Path:
    src = json.loads((case(name) / "rank0.json").read_text())
    edit(src["traceEvents"])
    d = tmp_path / "v"
    d.mkdir(exist_ok=True)
    f = d / "rank0.json"
    f.write_text(json.dumps(src))
    return f


def _by_corr(evs: list[dict], corr: int, cat: str) -> list[dict]:
    return [e for e in evs if e.get("cat") == cat and e.get("args", {}).get("correlation") == corr]


def test_last_kernel_of_a_lane_running_seconds_is_clipped(tmp_path: Path) -> None:
    # The last graph kernel (corr 104, [1130, 1170]) reported 5 s long: no later record on its lane,
    # but it ends ~5 s past the 2 ms step. Clipped to the end of the step range (T0 + 2000).
    f = _variant(
        tmp_path, "cuda_graph_launch", lambda evs: _by_corr(evs, 104, "kernel")[-1].update(dur=5_000_000.0)
    )
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [f])
    assert any("clipped" in w for w in res.warnings)
    assert s.sql("SELECT dur_ns, raw_dur_ns FROM events WHERE flag = 'overrun'").row(0) == (
        870 * US,
        5_000_000 * US,
    )
    assert _row(analyze(s, "temporal").frame, rank=0)["window_ns"] == (2000 - 30) * US


def test_kernel_seconds_after_the_steps_is_flagged(tmp_path: Path) -> None:
    f = _variant(
        tmp_path,
        "cuda_graph_launch",
        lambda evs: _by_corr(evs, 104, "kernel")[-1].update(ts=1001130.0 + 5_000_000),
    )
    s = Store(tmp_path / "t.duckdb")
    assert any("far outside" in w for w in ingest(s, [f]).warnings)
    assert _row(analyze(s, "temporal").frame, rank=0)["window_ns"] == (1130 - 30) * US


def test_unset_launch_time_vouches_for_nothing(tmp_path: Path) -> None:
    # cudaLaunchKernel of corr 103 at ts 0: flagged; its kernel keeps its step and is not measured.
    f = _variant(
        tmp_path, "cuda_graph_launch", lambda evs: _by_corr(evs, 103, "cuda_runtime")[0].update(ts=0)
    )
    s = _store(tmp_path, f)
    la = _row(analyze(s, "launch").frame, rank=0)
    assert (la["launches"], la["latency_max_ns"]) == (3, 60 * US)  # 20, 60, 30 us
    assert s.sql("SELECT step FROM kernels WHERE correlation = 103").item() == 3


def test_unset_step_time_is_flagged(tmp_path: Path) -> None:
    def edit(evs: list[dict]) -> None:
        next(e for e in evs if e.get("name") == "ProfilerStep#3").update(ts=0)

    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [_variant(tmp_path, "cuda_graph_launch", edit)])
    assert any("ts == 0" in w for w in res.warnings)
    assert s.sql("SELECT flag FROM events WHERE kind = 'step'").item() == "zero_ts"


def test_graph_launch_whose_first_kernel_is_flagged_is_not_measured(tmp_path: Path) -> None:
    f = _variant(
        tmp_path, "cuda_graph_launch", lambda evs: _by_corr(evs, 102, "kernel")[0].update(ts=1000260.0 - 2000)
    )
    s = _store(tmp_path, f)
    la = _row(analyze(s, "launch").frame, rank=0)
    assert (la["launches"], la["latency_max_ns"]) == (3, 30 * US)  # 20, 20, 30: not 100 us of graph execution


def test_export_leaves_flagged_records_out(tmp_path: Path) -> None:
    from traceprof.render.export import export_perfetto

    s = _store(tmp_path, case("kernel_before_its_launch"))
    out = tmp_path / "x.json"
    n = export_perfetto(s, None, out)
    evs = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] != "M"]
    assert n == len(json.loads(out.read_text())["traceEvents"]) > len(evs)  # metadata counted too
    # the store's events are written once each (the others: flows and findings tracks), flagged ones not
    names = {
        int(e["pid"]): e["args"]["name"]
        for e in json.loads(out.read_text())["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    own = [e for e in evs if e["ph"] in ("X", "i") and "findings" not in names.get(int(e["pid"]), "")]
    assert len(own) == s.sql("SELECT count(*) FROM events WHERE flag IS NULL").item()
    assert min(e["ts"] for e in evs) >= 0 and max(e["ts"] for e in evs) < 2000  # no 27.8 h span


@pytest.mark.parametrize("pattern", ["", ".*", "x?"])
def test_comm_kernel_pattern_matching_everything_is_refused(tmp_path: Path, pattern: str) -> None:
    from traceprof.core.errors import UsageError

    with pytest.raises(UsageError, match="empty string"):
        ingest(Store(tmp_path / "t.duckdb"), [case("deepep_comm_kernels")], comm_kernels=(pattern,))


def test_rank_outside_world_is_an_error(tmp_path: Path) -> None:
    for rank in (-1, 5):
        f = _write(
            tmp_path,
            [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}],
            f"r{rank}.json",
        )
        doc = json.loads(f.read_text())
        doc["distributedInfo"] = {"rank": rank, "world_size": 4}
        f.write_text(json.dumps(doc))
        with pytest.raises(TraceFormatError, match="outside 0..world_size-1"):
            ingest(Store(tmp_path / f"{rank}.duckdb"), [f])


def test_begin_end_mismatches_are_reported(tmp_path: Path) -> None:
    evs = [
        {"ph": "B", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000.0},
        {"ph": "E", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 1010.0},
        {"ph": "B", "cat": "cpu_op", "name": "late", "pid": 1, "tid": 1, "ts": 1100.0},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 1050.0},
    ]
    s = Store(tmp_path / "t.duckdb")
    res = ingest(s, [_write(tmp_path, evs)])
    assert any("matches no open 'B'" in w for w in res.warnings)
    assert any("'E' before its 'B'" in w for w in res.warnings)
    assert s.sql("SELECT flag FROM events WHERE name = 'late'").item() == "unmatched_begin"


def test_overlap_per_device_for_a_rank_with_two_gpus(tmp_path: Path) -> None:
    # deepep_comm_kernels with the combine kernel [850, 1250] moved to device 1: per rank it is still
    # hidden 50 us behind GEMM B on device 0; per device, device 1 has no compute, so all 400 us exposed.
    def edit(evs: list[dict]) -> None:
        for e in evs:
            if "combine" in e.get("name", "") and e.get("cat") == "kernel":
                e["args"]["device"] = 1

    s = _store(tmp_path, _variant(tmp_path, "deepep_comm_kernels", edit))
    ov = analyze(s, "overlap")
    assert _row(ov.frame, rank=0)["overlap_ns"] == 200 * US
    d1 = _row(ov.devices, rank=0, device=1)
    assert (d1["comm_ns"], d1["overlap_ns"], d1["exposed_comm_ns"]) == (400 * US, 0, 400 * US)
    assert any("several GPUs" in n for n in ov.notes)


@pytest.mark.parametrize("key", ["correlation", "External id"])
def test_ids_beyond_int64_are_rejected_per_event_not_stored_null(tmp_path: Path, key: str) -> None:
    # The kernel of correlation 101 is event #9 of the file; 2**63 does not fit the BIGINT column.
    f = _variant(
        tmp_path,
        "cuda_graph_launch",
        lambda evs: _by_corr(evs, 101, "kernel")[0]["args"].update({key: 2**63}),
    )
    with pytest.raises(
        TraceFormatError,
        match=rf"event #9 \(ph='X', name='sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x128x64_w'\): "
        rf"'{'correlation' if key == 'correlation' else 'external_id'}' beyond int64",
    ):
        ingest(Store(tmp_path / "a.duckdb"), [f])
    s = Store(tmp_path / "b.duckdb")
    ingest(s, [f], on_bad_event="skip")
    assert s.sql("SELECT count(*) FROM events WHERE kind = 'kernel'").item() == 11  # 12 minus the bad one
