"""FLOPs accounting: shape formulas, leaf-op counting, sources, and the CPU sample against a hand count."""

from __future__ import annotations

import polars as pl
import pytest

from tests.builders import op, write_run
from tests.conftest import sample_run
from traceprof.core.errors import AnalysisError, UsageError
from traceprof.core.schema import sql_texts
from traceprof.engine import flops
from traceprof.engine.optree import self_times, with_parents
from traceprof.ingest.ingest import ingest

CONV_CONCRETE = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]


def micro_events() -> list[dict]:
    """ProfilerStep#1 [0, 1000 us] with nested and leaf ops; FLOPs by hand (multiply-add = 2):

    linear [4,8,16]x[32,16] -> matmul -> mm [32,16]x[16,32]: only the leaf mm, 2*32*16*32 = 32768
    addmm bias[64], [10,20]x[20,64]: 2*10*20*64 = 25600
    baddbmm self[8,8], [3,8,5]x[3,5,8]: 2*3*8*5*8 = 1920
    conv2d -> convolution -> _convolution, input [2,3,10,10], weight [4,3,3,3], stride 2, pad 1:
        out (10+2-2-1)//2+1 = 5 -> 5x5; 2*N*Cout*25*Cin*9 = 2*2*4*25*3*9 = 10800 (torch's conv2d
        FLOP count for the same call, checked with with_flops, is 10800 too)
    convolution_backward grad_out [2,4,5,5], mask [True, True, False]: 2 * 10800 = 21600
    scaled_dot_product_attention -> _scaled_dot_product_flash_attention_for_cpu (same interval),
        q=k=v [2,4,16,8]: QK^T 2*2*4*16*16*8 = 32768, PV the same: 65536
    bf16 mm [8,8]x[8,8] on a second thread: 2*8*8*8 = 1024
    step total = 32768 + 25600 + 1920 + 10800 + 21600 + 65536 + 1024 = 159248
    Not counted: an mm without shapes (unknown) and an mm after the step (outside steps).
    """
    return [
        op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        op("aten::linear", 10, 100, [[4, 8, 16], [32, 16], []]),
        op("aten::matmul", 12, 90, [[4, 8, 16], [16, 32]]),
        op("aten::mm", 15, 80, [[32, 16], [16, 32]]),
        op("aten::addmm", 200, 50, [[64], [10, 20], [20, 64], [], []]),
        op("aten::baddbmm", 300, 50, [[8, 8], [3, 8, 5], [3, 5, 8], [], []]),
        op("aten::conv2d", 400, 60, [[2, 3, 10, 10], [4, 3, 3, 3], [], [], [], [], []]),
        op("aten::convolution", 401, 58, [[2, 3, 10, 10], [4, 3, 3, 3]] + [[]] * 7, concrete=CONV_CONCRETE),
        op(
            "aten::_convolution",
            402,
            56,
            [[2, 3, 10, 10], [4, 3, 3, 3]] + [[]] * 11,
            concrete=CONV_CONCRETE + ["False", "False", "True", "True"],
        ),
        op(
            "aten::convolution_backward",
            500,
            60,
            [[2, 4, 5, 5], [2, 3, 10, 10], [4, 3, 3, 3]] + [[]] * 8,
            concrete=[
                "",
                "",
                "",
                "[0]",
                "[2, 2]",
                "[1, 1]",
                "[1, 1]",
                "False",
                "[0, 0]",
                "1",
                "[True, True, False]",
            ],
        ),
        op("aten::scaled_dot_product_attention", 600, 50, [[2, 4, 16, 8]] * 3 + [[]] * 5),
        op("aten::_scaled_dot_product_flash_attention_for_cpu", 600, 50, [[2, 4, 16, 8]] * 3 + [[]] * 4),
        op("aten::mm", 700, 10, [[8, 8], [8, 8]], ["c10::BFloat16", "c10::BFloat16"], tid=2),
        op("aten::mm", 800, 10),
        op("aten::mm", 1100, 10, [[32, 16], [16, 32]]),
    ]


def test_shape_flops_leaf_ops_by_hand(store, tmp_path):
    ingest(store, [write_run(tmp_path / "micro", micro_events())])
    sf = flops.shape_flops(store, store.resolve_run(None))
    in_step = sf.filter(sf["step"] == 1)
    by_name = {
        (r["name"], r["dtype"]): (r["calls"], r["flops"], r["unknown_calls"])
        for r in in_step.iter_rows(named=True)
    }
    assert by_name == {
        ("aten::mm", "fp32"): (1, 32768.0, 0),
        ("aten::mm", None): (1, 0.0, 1),
        ("aten::mm", "bf16"): (1, 1024.0, 0),
        ("aten::addmm", "fp32"): (1, 25600.0, 0),
        ("aten::baddbmm", "fp32"): (1, 1920.0, 0),
        ("aten::_convolution", "fp32"): (1, 10800.0, 0),
        ("aten::convolution_backward", "fp32"): (1, 21600.0, 0),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "fp32"): (1, 65536.0, 0),
    }
    acc = flops.account(store, store.resolve_run(None))
    assert acc.source == "shapes" and acc.per_step["flops"].to_list() == [159248.0]
    assert acc.dtype == "fp32"  # most FLOPs are fp32
    assert any("1 calls without usable shapes" in n for n in acc.notes)
    assert any("outside ProfilerSteps" in n for n in acc.notes)  # the mm after the step


@pytest.mark.parametrize(
    "name, dims, concrete, expected",
    [
        ("aten::matmul", [[5, 7], [7]], None, 2 * 5 * 7),  # matrix @ vector
        ("aten::matmul", [[2, 1, 3, 4], [5, 4, 6]], None, 2 * (2 * 5) * 3 * 4 * 6),  # broadcast batch
        ("aten::linear", [[3, 5, 7], [11, 7], [11]], None, 2 * 15 * 7 * 11),
        # transposed conv, weight (Cin=4, Cout=2, 3x3), input 1x4x5x5: each input pixel x Cout x 9 taps
        (
            "aten::convolution",
            [[1, 4, 5, 5], [4, 2, 3, 3]],
            ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "1"],
            2 * 1 * 25 * 4 * 2 * 9,
        ),
        (
            "aten::_scaled_dot_product_flash_attention_backward",
            [[1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 6, 8], [1, 2, 6, 8]],
            None,
            2 * (2 * (1 * 2 * 4) * 6 * (8 + 8)),
        ),
        # causal attention counts half its score and value products (FlashAttention's benchmark, MaxText):
        # q=k=v [2,4,16,8]: full 2*(2*4*16)*16*(8+8) = 65536, causal 32768; is_causal is argument 5 of
        # scaled_dot_product_attention, 4 of the flash kernels, 11 of the flash backward
        (
            "aten::scaled_dot_product_attention",
            [[2, 4, 16, 8]] * 3,
            ["", "", "", "", "0.", "True", "", "False"],
            32768,
        ),
        (
            "aten::scaled_dot_product_attention",
            [[2, 4, 16, 8]] * 3,
            ["", "", "", "", "0.", "False", "", "False"],
            65536,
        ),
        (
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            [[2, 4, 16, 8]] * 3,
            ["", "", "", "0.", "True", "", ""],
            32768,
        ),
        (
            "aten::_scaled_dot_product_flash_attention_backward",
            [[1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 6, 8], [1, 2, 6, 8]],
            [""] * 11 + ["True"],
            2 * (2 * (1 * 2 * 4) * 6 * (8 + 8)) / 2,
        ),
        ("aten::convolution", [[1, 4, 5, 5], [4, 2, 3, 3]], None, None),  # no stride/padding: unknown
        ("aten::mm", [[2, 3]], None, None),  # malformed
        ("aten::add", [[2, 3], [2, 3]], None, None),  # not a counted op
    ],
)
def test_op_flops_formulas(name, dims, concrete, expected):
    c = [flops._concrete(v) for v in concrete] if concrete else None
    assert flops.op_flops(name, dims, c) == expected


def test_palm_formula_by_hand():
    # 6*N*D + 12*L*H*Q*T*D with N=1e9, L=24, H=16, Q=128, T=2048, D=4096*1024 tokens
    d = 4096 * 1024
    assert flops.palm_flops(1e9, 24, 16, 128, 2048, d) == 6e9 * d + 12 * 24 * 16 * 128 * 2048 * d
    with pytest.raises(UsageError):
        flops.palm_flops(1e9, 0, 16, 128, 2048, d)


def test_source_order_and_errors(store, tmp_path):
    ingest(store, [write_run(tmp_path / "micro", micro_events(), world=1)])
    rid = store.resolve_run(None)
    assert flops.account(store, rid, declared_per_step=5e12).source == "declared"
    acc = flops.account(store, rid, palm=(1e6, 2, 2, 4, 8, 100))
    assert acc.source == "palm" and acc.per_step["flops"][0] == 6e6 * 100 + 12 * 2 * 2 * 4 * 8 * 100
    with pytest.raises(UsageError, match="sidecar: not available"):
        flops.account(store, rid, source="sidecar")
    with pytest.raises(UsageError, match="choose auto"):
        flops.account(store, rid, source="magic")


def test_no_source_is_an_error(store, tmp_path):
    ingest(
        store,
        [
            write_run(
                tmp_path / "bare",
                [op("ProfilerStep#1", 0, 100, cat="user_annotation"), op("aten::mm", 10, 10)],
            )
        ],
    )
    with pytest.raises(AnalysisError, match="no FLOPs source"):
        flops.account(store, store.resolve_run(None))


# TinyGPT of sample_traces (scripts/tiny_gpt.py, scripts/record_samples.py defaults): batch B=8,
# seq T=64 -> BT=512 tokens per rank and step; d=128, 4 heads of hd=32, vocab V=512, 2 blocks.
# Forward matmuls per block: qkv 2*512*128*384 = 50,331,648; proj 2*512*128*128 = 16,777,216;
# fc and out 2*512*128*512 = 67,108,864 each -> 201,326,592. Backward of a linear whose input needs
# a gradient = 2x forward (grad input + grad weight), so x3: 603,979,776 per block, 1,207,959,552
# for 2 blocks; LM head 2*512*128*512 * 3 = 201,326,592. All aten::mm: 1,409,286,144.
# Attention per block: baddbmm q@k^T 2*(B*h=32)*64*64*32 = 8,388,608 forward only; bmm att@v the
# same forward, backward 2 bmm for baddbmm's grads (q, k) + 2 for bmm's (att, v): 5 bmm =
# 41,943,040. Two blocks: baddbmm 16,777,216, bmm 83,886,080.
HAND_MM = 1_409_286_144
HAND_BADDBMM = 16_777_216
HAND_BMM = 83_886_080
HAND_STEP = HAND_MM + HAND_BADDBMM + HAND_BMM  # 1,509,949,440 per rank and step
# extra_matmul: u @ extra_w, (BT, d) @ (d, 4d) per block, forward 2*512*128*512 = 67,108,864 and
# its input's gradient the same (extra_w is a buffer, no weight gradient): x2 per block, x2 blocks.
HAND_EXTRA = 4 * 67_108_864


def test_cpu_sample_shapes_vs_sidecar_vs_hand(store):
    rid = sample_run(store, "normal")
    sf = flops.shape_flops(store, rid).filter(pl.col("step").is_not_null())
    per_op = sf.group_by("name").agg(pl.col("flops").sum() / sf.select("rank", "step").n_unique())
    assert dict(per_op.iter_rows()) == {
        "aten::mm": HAND_MM,
        "aten::baddbmm": HAND_BADDBMM,
        "aten::bmm": HAND_BMM,
    }
    shapes = flops.account(store, rid, source="shapes").per_step
    side = flops.account(store, rid, source="sidecar").per_step
    assert shapes.height == side.height == 12  # 4 ranks x ProfilerStep#4..#6
    assert set(shapes["flops"]) == {HAND_STEP}
    joined = shapes.join(side, on=["rank", "step"], suffix="_side")
    # The sidecar also counts elementwise aten::mul/aten::add (torch's formulas), ~0.07 % here.
    assert ((joined["flops_side"] - joined["flops"]).abs() / joined["flops"]).max() < 0.02
    assert (joined["flops_side"] >= joined["flops"]).all()
    assert flops.account(store, rid).source == "sidecar"  # auto prefers the sidecar over shapes


def test_extra_matmul_sample_adds_the_hand_counted_flops(store):
    rid = sample_run(store, "extra_matmul")
    assert set(flops.account(store, rid, source="shapes").per_step["flops"]) == {HAND_STEP + HAND_EXTRA}
    side = flops.account(store, rid, source="sidecar").per_step["flops"]
    assert ((side - (HAND_STEP + HAND_EXTRA)).abs() / (HAND_STEP + HAND_EXTRA)).max() < 0.02


def test_call_tree_by_hand():
    # One lane (tid 1), times in ns:            parent     self
    #   a [0, 100]                               -          100 - (40 + 30 + 0) = 30
    #     b [10, 50]                             a          40 - 10 - 10 = 20
    #       c [10, 20]  (same start as b)        b          10
    #       d [20, 30]  (touches c: a sibling)   b          10
    #     e [60, 90] and f [60, 90], identical:  a / e      0 / 30 (f has the higher priority value)
    #     g [95, 95] (zero duration)             a          0
    #   h [100, 120] (touches a: top level)      -          20
    #   i [110, 130] (overlaps h, not inside)    -          20
    # Lane tid 2: j [15, 40] is top level though it lies inside a's interval.
    rows = [
        ("a", 1, 0, 100, 1),
        ("b", 1, 10, 50, 1),
        ("c", 1, 10, 20, 1),
        ("d", 1, 20, 30, 1),
        ("e", 1, 60, 90, 0),
        ("f", 1, 60, 90, 1),
        ("g", 1, 95, 95, 1),
        ("h", 1, 100, 120, 1),
        ("i", 1, 110, 130, 1),
        ("j", 2, 15, 40, 1),
    ]
    df = pl.DataFrame(rows, schema=["name", "tid", "start_ns", "end_ns", "prio"], orient="row")
    tree = with_parents(df, ["tid"], priority="prio")
    names = dict(zip(tree["id"], tree["name"], strict=True))
    parent = {n: names.get(p) for n, p in zip(tree["name"], tree["parent"], strict=True)}
    assert parent == {
        "a": None,
        "b": "a",
        "c": "b",
        "d": "b",
        "e": "a",
        "f": "e",
        "g": "a",
        "h": None,
        "i": None,
        "j": None,
    }
    own = dict(zip(tree["name"], self_times(tree), strict=True))
    assert own == {"a": 30, "b": 20, "c": 10, "d": 10, "e": 0, "f": 30, "g": 0, "h": 20, "i": 20, "j": 25}


def _random_ops(seed: int, n: int) -> pl.DataFrame:
    """``n`` random ops on a few lanes (trace, tid): nested, overlapping, identical and empty
    intervals, and ties broken by a priority column."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        s = rng.randint(0, 60)
        rows.append(
            (
                f"op{i}",
                rng.randint(0, 3),
                rng.choice([1, 2]),
                s,
                s + rng.choice([0, 1, 5, 20, 60]),
                rng.randint(0, 1),
            )
        )
    return pl.DataFrame(rows, schema=["name", "trace_id", "tid", "start_ns", "end_ns", "prio"], orient="row")


@pytest.mark.parametrize("seed", range(20))
def test_call_tree_in_pieces_of_lanes_is_the_one_piece_tree(monkeypatch, seed):
    # with_parents works a large frame in pieces of whole lanes (cut where the first lane column
    # changes): with pieces of 5 rows, every random frame gives the tree of one piece, row for row
    from traceprof.engine import optree

    df = _random_ops(seed, 80)
    lane = ["trace_id", "tid"]
    monkeypatch.setattr(optree, "PIECE_ROWS", 10**9)
    whole = with_parents(df, lane, priority="prio")
    monkeypatch.setattr(optree, "PIECE_ROWS", 5)
    assert len(optree._lane_pieces(whole, "trace_id")) > 1
    pieces = with_parents(df, lane, priority="prio")
    assert pieces.equals(whole)
    assert self_times(pieces).equals(self_times(whole))


def test_shape_flops_in_pieces_of_lanes_on_a_sample(monkeypatch, store):
    # the real ops of a sample run (4 ranks): the same leaf calls with one lane per piece
    from traceprof.engine import optree

    run_id = sample_run(store, "extra_matmul")
    want = flops.signature_flops(store, run_id).sort(pl.all(), nulls_last=True)
    monkeypatch.setattr(optree, "PIECE_ROWS", 1)
    got = flops.signature_flops(store, run_id).sort(pl.all(), nulls_last=True)
    assert want.height > 0 and got.equals(want)


@pytest.mark.parametrize("rows", [1, 3, 1 << 16])
def test_signature_flops_read_in_batches_of_numbered_signatures_on_a_sample(monkeypatch, store, rows):
    # the ops are read a batch of rows at a time, each op's text (name, dims, types, concrete)
    # numbered against the signatures seen so far: the op rows hold no text, each signature is
    # numbered once, and every op's number gives back its own text (the whole query's rows);
    # the FLOPs per signature are those of one read of every row
    run_id = sample_run(store, "extra_matmul")
    sql = flops._OPS_SQL.format(names=sql_texts(flops.SHAPE_OPS), composite=sql_texts(flops._COMPOSITE))
    whole = store.sql(sql, [run_id])
    batches = list(store.batches(sql, [run_id], rows))
    assert max(b.num_rows for b in batches) <= rows and sum(b.num_rows for b in batches) == whole.height
    monkeypatch.setattr(flops, "OPS_BATCH_ROWS", rows)
    ops, sigs = flops._ops(store, run_id)
    assert not {"name", "dims", "types", "concrete"} & set(ops.columns) and ops.height == whole.height
    assert sigs["sig"].n_unique() == sigs.height == sigs.drop("sig").unique().height > 1
    back = ops.join(sigs, on="sig").drop("sig").select(whole.columns)
    assert back.sort(pl.all(), nulls_last=True).equals(whole.sort(pl.all(), nulls_last=True))
    got = flops.signature_flops(store, run_id).sort(pl.all(), nulls_last=True)
    monkeypatch.setattr(flops, "OPS_BATCH_ROWS", 10**9)
    assert got.height > 0 and got.equals(flops.signature_flops(store, run_id).sort(pl.all(), nulls_last=True))


def test_a_session_reads_the_signature_flops_once_and_they_equal_a_bare_read(tmp_path, monkeypatch):
    # mfu (flops.account) and stragglers (_cause.work_ops) both read the run's leaf-op shapes: in a
    # session that keeps results the call tree is built once (one with_parents call for both), and
    # what they get equals a bare store's read (no session: every call reads again)
    import traceprof
    from traceprof.analyses import _cause
    from traceprof.storage.store import Store

    db = tmp_path / "s.duckdb"
    with Store(db) as st:
        run_id = sample_run(st, "extra_matmul")
        bare_sig = flops.signature_flops(st, run_id)
        bare_shapes = flops.shape_flops(st, run_id)
        bare_ops = _cause.work_ops(st, run_id)
    assert bare_sig.height > 0 and bare_ops.height > 0
    calls = []
    real = flops.with_parents
    monkeypatch.setattr(flops, "with_parents", lambda *a, **k: calls.append(1) or real(*a, **k))
    with traceprof.open(db, cache=False, many=True) as s:
        acc = flops.account(s.store, run_id)
        ops = _cause.work_ops(s.store, run_id)
        again = flops.signature_flops(s.store, run_id)
    assert len(calls) == 1
    assert acc.shapes.equals(bare_shapes)
    assert ops.equals(bare_ops)
    # (its rows come in no set order: a group_by's)
    assert again.sort(pl.all(), nulls_last=True).equals(bare_sig.sort(pl.all(), nulls_last=True))


def test_the_signature_flops_outlast_the_sessions_let_go_between_heavy_groups(tmp_path, monkeypatch):
    # the report lets go of its helpers' values before each group of heavy analyses (in this
    # process, or in the one fresh process that runs every group on a large run), but keeps these
    # few rows (`lasting`): stragglers (its own-cause test, _cause.work_ops) and mfu (flops.account)
    # sit in different groups and share one call tree; the activity frame goes
    import traceprof
    from traceprof.analyses import _cause
    from traceprof.engine import activity
    from traceprof.engine.analysis import is_lasting
    from traceprof.storage.store import Store

    db = tmp_path / "s.duckdb"
    with Store(db) as st:
        run_id = sample_run(st, "extra_matmul")
        bare_ops = _cause.work_ops(st, run_id)
    calls = []
    real = flops.with_parents
    monkeypatch.setattr(flops, "with_parents", lambda *a, **k: calls.append(1) or real(*a, **k))
    with traceprof.open(db, cache=False, many=True) as s:
        flops.account(s.store, run_id)
        activity.activity(s.store, run_id)
        assert s.memo is not None
        helpers = {k[0] for k in s.memo if isinstance(k, tuple) and len(k) == 2}
        assert {"traceprof.engine.flops.signature_flops", "traceprof.engine.activity._activity"} <= helpers
        s.let_go()
        kept = [k for k in s.memo if isinstance(k, tuple) and len(k) == 2]
        assert kept and all(is_lasting(k) for k in kept)
        assert "traceprof.engine.flops.signature_flops" in {k[0] for k in kept}
        ops = _cause.work_ops(s.store, run_id)
    assert len(calls) == 1 and bare_ops.height > 0 and ops.equals(bare_ops)


def test_ops_alone_in_their_lane_by_hand():
    # lane (1, a): [0, 5) alone; [10, 20) holds [12, 15); [30, 40) and [30, 35) share a start;
    # lane (1, null): [0, 3) and [5, 9) alone (a null pid is one lane); lane (1, b): [11, 13)
    # alone (it overlaps [10, 20) of another lane only); [50, 60) touches [60, 60) (zero length)
    df = pl.DataFrame(
        {
            "trace_id": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
            "pid": ["a", "a", "a", "a", "a", None, None, "b", "c", "c"],
            "start_ns": [0, 10, 12, 30, 30, 0, 5, 11, 50, 60],
            "end_ns": [5, 20, 15, 40, 35, 3, 9, 13, 60, 60],
            "prio": [1] * 10,
        }
    )
    got = flops._alone(df, ["trace_id", "pid"]).to_list()
    assert got == [True, False, False, False, False, True, True, True, False, False]
    # a null bound: the tree decides every op
    nulls = df.with_columns(
        pl.when(pl.col("start_ns") == 11).then(None).otherwise(pl.col("end_ns")).alias("end_ns")
    )
    assert not flops._alone(nulls, ["trace_id", "pid"]).any()
    # one more op alone, [70, 80); then a copy of it (alike in start, end and prio: which of two such
    # ops is the other's parent is the sort's choice): every op goes to the tree
    twin = pl.concat(
        [
            df,
            df.slice(9, 1).with_columns(
                pl.lit(70, pl.Int64).alias("start_ns"), pl.lit(80, pl.Int64).alias("end_ns")
            ),
        ]
    )
    assert flops._alone(twin, ["trace_id", "pid"]).to_list() == [*got, True]
    assert not flops._alone(pl.concat([twin, twin.tail(1)]), ["trace_id", "pid"]).any()


@pytest.mark.parametrize("seed", range(30))
def test_leaf_ops_are_those_of_the_whole_call_tree(seed):
    # random ops (nested, overlapping, zero-length, tied starts, some far apart): the ops that are
    # alone in their lane plus the leaves of the tree of the others are the leaves of the tree of all
    df = _random_ops(seed, 60 + seed * 5)
    if seed % 3 == 0:  # spread out, no two alike in a lane: many ops alone
        df = df.with_columns(
            pl.col("start_ns") * 50, (pl.col("start_ns") * 49 + pl.col("end_ns")).alias("end_ns")
        )
        df = df.unique(["trace_id", "tid", "start_ns", "end_ns", "prio"], keep="first", maintain_order=True)
    df = df.with_row_index("_op")
    lane = ["trace_id", "tid"]
    tree = with_parents(df, lane, priority="prio")
    want = sorted(tree.filter(~pl.col("id").is_in(tree["parent"].drop_nulls().implode()))["_op"].to_list())
    got = flops._leaves(df, lane).to_list()
    assert sorted(got) == want and len(got) == len(set(got))
    if seed % 3 == 0:
        assert flops._alone(df, lane).any()
