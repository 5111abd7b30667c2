"""Structure-aware fuzzing of every input kind traceprof reads (issue 29), used by tests/test_fuzz.py.

A *kind* is a set of seed inputs (real or shared-case files: a folder of files and the one named on
the command line) and a mutation that knows the format: JSON (numbers at the int64 edges, hostile
and non-UTF-8 strings, nesting 50 to 100,000 deep, changed types, dropped keys, repeated elements),
pickles (shared references, cycles, deep nesting, globals, sets, big ints), YAML (aliases, billion
laughs, deep nesting, bad sizes), Parquet (values at the column edges, NaN, nulls, dropped or
retyped columns), export_memory_timeline entries (fields at the edges or of other types, entries of
other arity, out of order or repeated, coalesced rows of another width, rank and device in the file
name at the edges) and SQLite (hostile cell values, dropped tables and columns, corrupt pages), plus
truncation and byte flips everywhere. Adding a kind is one :func:`kind` entry.

Each input is ingested by the CLI (``traceprof ingest FILE``) in a worker process (:class:`Worker`)
under a time limit (a hang) and a memory limit (resident set size); the outcome is ``stored``, a
``clean error`` (exit 1 with one line naming the file), or a failure (a traceback, another output, a
hang, a blow-up), which fails the test.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import re
import select
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
SHARED = REPO.parent / "shared"
CASES = Path(os.environ.get("TRACEPROF_CASES", SHARED / "cases"))
CORPUS = Path(os.environ.get("TRACEPROF_CORPUS", SHARED / "corpus"))

#: Seconds one input may take (a hang past it fails the test); the machine is shared and slow.
TIME_LIMIT_S = float(os.environ.get("FUZZ_TIME_LIMIT_S", "60"))
#: Resident memory one input may take the worker to (MiB); start-up is about 250.
MEMORY_LIMIT_MIB = int(os.environ.get("FUZZ_MEMORY_LIMIT_MIB", "2048"))

Draw = Callable[[Any], Any]


@dataclass(frozen=True)
class Input:
    """One fuzz input: files written into a fresh folder; ``main`` is the one given to ingest."""

    files: dict[str, bytes]
    main: str

    def __repr__(self) -> str:  # hypothesis prints the draws: sizes, not megabytes of bytes
        return f"Input(main={self.main!r}, files={ {k: f'{len(v):,} bytes' for k, v in self.files.items()} })"


@dataclass(frozen=True)
class Kind:
    """An input kind: its seeds (read once) and its mutation."""

    name: str
    seeds: Callable[[], list[Input]]
    mutate: Callable[[Draw, Input], Input]
    #: Why the kind cannot run here (e.g. no collector reads it yet), or None.
    unavailable: Callable[[list[Input]], str | None] = lambda seeds: None if seeds else "no seed files"


KINDS: dict[str, Kind] = {}


def kind(
    name: str,
    seeds: Callable[[], list[Input]],
    unavailable: Callable[[list[Input]], str | None] | None = None,
) -> Callable[[Callable[[Draw, Input], Input]], Callable[[Draw, Input], Input]]:
    """Register a kind (decorates its mutation)."""

    def register(mutate: Callable[[Draw, Input], Input]) -> Callable[[Draw, Input], Input]:
        KINDS[name] = Kind(name, seeds, mutate, *(() if unavailable is None else (unavailable,)))
        return mutate

    return register


# -- strategies (hypothesis is imported lazily: the worker process does not need it) -----------------


def _st() -> Any:
    from hypothesis import strategies as st

    return st


def pick(draw: Draw, options: list[Any]) -> Any:
    return draw(_st().sampled_from(options))


def number(draw: Draw, lo: int, hi: int) -> int:
    return int(draw(_st().integers(lo, hi)))


INT_EDGES = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**31, -(2**31) - 1, -1, 0, 10**30, -(10**30)]
NUMBER_TEXT = [str(n).encode() for n in INT_EDGES] + [
    b"1e308",
    b"1e400",
    b"-1e400",
    b"9" * 400,
    b"0.0000001",
    b"1.5",
    b"-0.5",
    b"NaN",
    b"Infinity",
    b"true",
    b"null",
    b'"12"',
    b'"0x1f"',
    b'""',
]
STRING_TEXT = [
    b'""',
    b'"\\u001b[2J[/x][link=http://e]x"',
    b'"\\u202eevil\\u2066"',
    b'"\xff\xfe"',
    b'"\xc3"',
    b'"\xed\xa0\x80"',
    b'"' + b"A" * 10_000 + b'"',
    b'"ProfilerStep#99999999999"',
    b'"ncclDevKernel_AllReduce"',
    b'"\\ud800"',
    b'"nccl:all_reduce"',
    b"12",
    b"[]",
    b"{}",
    b'{"a": [1, {"b": null}]}',
    b"null",
]
NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
DEPTHS = [50, 101, 150, 990, 1500, 5000, 100_000]


def _spans(pattern: re.Pattern[bytes], data: bytes) -> list[tuple[int, int]]:
    return [m.span() for m in pattern.finditer(data, 0, 200_000)]


def _tree_op(draw: Draw, doc: Any) -> Any:
    """A change to a decoded JSON document: drop a key or an element, repeat an element, move a
    subtree elsewhere, or change a value's type."""
    nodes: list[Any] = []
    todo = [doc]
    while todo and len(nodes) < 5000:
        n = todo.pop()
        if isinstance(n, (dict, list)) and n:
            nodes.append(n)
            todo.extend(n.values() if isinstance(n, dict) else n)
    if not nodes:
        return doc
    node = pick(draw, nodes)
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    key = pick(draw, keys)
    op = pick(draw, ["drop", "repeat", "move", "retype"])
    if op == "drop":
        del node[key]
    elif op == "repeat" and isinstance(node, list):
        node[key : key + 1] = [node[key]] * pick(draw, [2, 100, 5000])
    elif op == "move":
        node[key] = json.loads(json.dumps(pick(draw, nodes)))
    else:
        v = node[key]
        node[key] = (
            str(v)
            if isinstance(v, (int, float))
            else pick(draw, [0, -1, 2**63, 1.5, None, [], {}, "x", True])
            if not isinstance(v, (dict, list))
            else pick(draw, ["x", 7, None])
        )
    return doc


def mutate_json(draw: Draw, data: bytes) -> bytes:
    """1 to 3 mutations of JSON text (a document, or one JSON value per line)."""
    for _ in range(number(draw, 1, 3)):
        op = pick(draw, ["number", "number", "string", "nest", "tree", "truncate", "flip", "utf8"])
        nums, strs = _spans(NUMBER, data), _spans(STRING, data)
        if op == "number" and nums:
            a, b = pick(draw, nums)
            data = data[:a] + pick(draw, NUMBER_TEXT) + data[b:]
        elif op == "string" and strs:
            a, b = pick(draw, strs)
            data = data[:a] + pick(draw, STRING_TEXT) + data[b:]
        elif op == "nest" and (nums or strs):
            a, b = pick(draw, nums + strs)
            depth, obj = pick(draw, DEPTHS), draw(_st().booleans())
            head, tail = (b'{"k": ', b"}") if obj else (b"[", b"]")
            data = data[:a] + head * depth + data[a:b] + tail * depth + data[b:]
        elif op == "tree":
            data = _json_tree(draw, data)
        elif op == "truncate" and data:
            data = data[: number(draw, 0, len(data) - 1)]
        elif op == "flip" and data:
            buf = bytearray(data)
            for _ in range(number(draw, 1, 8)):
                buf[number(draw, 0, len(buf) - 1)] ^= number(draw, 1, 255)
            data = bytes(buf)
        elif op == "utf8" and strs:
            a, b = pick(draw, strs)
            data = (
                data[: a + 1]
                + pick(draw, [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf4\x90\x80\x80"])
                + data[a + 1 :]
            )
    return data


def _json_tree(draw: Draw, data: bytes) -> bytes:
    """:func:`_tree_op` on the whole document, or on one line of a JSON-lines file."""
    try:
        return json.dumps(_tree_op(draw, json.loads(data))).encode()
    except (ValueError, RecursionError):
        pass
    lines = data.split(b"\n")
    i = number(draw, 0, len(lines) - 1)
    try:
        lines[i] = json.dumps(_tree_op(draw, json.loads(lines[i].rstrip().rstrip(b",")))).encode() + b","
    except (ValueError, RecursionError):
        return data
    return b"\n".join(lines)


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _one(path: Path, name: str | None = None) -> list[Input]:
    data = _read(path)
    return [] if data is None else [Input({name or path.name: data}, name or path.name)]


# -- Kineto JSON (and its sidecar) ----------------------------------------------------------------


def _kineto_seeds() -> list[Input]:
    seeds = []
    for p in sorted(CASES.glob("*/rank*.json")):
        if not p.name.endswith(".fr.json"):
            seeds += _one(p)
    seeds += _one(SAMPLES / "normal" / "rank0.trace.json.gz", "rank0.json.gz")
    return [
        Input(
            {
                k.removesuffix(".gz"): gzip.decompress(v) if k.endswith(".gz") else v
                for k, v in s.files.items()
            },
            s.main.removesuffix(".gz"),
        )
        for s in seeds
    ]


@kind("kineto", _kineto_seeds)
def _kineto(draw: Draw, seed: Input) -> Input:
    data = mutate_json(draw, seed.files[seed.main])
    if draw(_st().booleans()):  # gzip, and maybe a broken stream
        data = gzip.compress(data, 1)
        if draw(_st().booleans()):
            i = number(draw, 0, len(data) - 1)
            data = data[:i] + bytes([data[i] ^ 0x55]) + data[i + 1 :]
        return Input({seed.main + ".gz": data}, seed.main + ".gz")
    return Input({seed.main: data}, seed.main)


def _sidecar_seeds() -> list[Input]:
    trace, side = (
        _read(SAMPLES / "normal" / "rank0.trace.json.gz"),
        _read(SAMPLES / "normal" / "rank0.meta.json"),
    )
    if trace is None or side is None:
        return []
    return [Input({"rank0.trace.json.gz": trace, "rank0.meta.json": side}, "rank0.trace.json.gz")]


@kind("kineto_sidecar", _sidecar_seeds)
def _sidecar(draw: Draw, seed: Input) -> Input:
    return Input(
        {**seed.files, "rank0.meta.json": mutate_json(draw, seed.files["rank0.meta.json"])}, seed.main
    )


# -- Flight Recorder: JSON and pickle -------------------------------------------------------------


def _fr_seeds() -> list[Input]:
    return _one(CORPUS / "flight_recorder" / "gloo_cpu_4rank" / "fr_rank0.json") + _one(
        CASES / "fr_two_groups_same_pg_name" / "rank0.fr.json"
    )


@kind("fr_json", _fr_seeds)
def _fr_json(draw: Draw, seed: Input) -> Input:
    return Input({seed.main: mutate_json(draw, seed.files[seed.main])}, seed.main)


def _fr_pickle_seeds() -> list[Input]:
    return [
        Input(
            {"nccl_trace_rank_0": pickle.dumps(json.loads(s.files[s.main]), protocol=4)}, "nccl_trace_rank_0"
        )
        for s in _fr_seeds()
    ]


#: Pickle opcodes (protocol 2+) standing in for a placeholder string: deep nesting, a cycle, a global.
_DEEP = "@@DEEP@@"


def _shared(levels: int) -> list[Any]:
    x: list[Any] = [1]
    for _ in range(levels):
        x = [x, x]
    return x


def _cycle() -> list[Any]:
    a: list[Any] = []
    a.append(a)
    return a


@kind("fr_pickle", _fr_pickle_seeds)
def _fr_pickle(draw: Draw, seed: Input) -> Input:
    doc = pickle.loads(seed.files[seed.main])
    entries = doc.get("entries") or [{}]
    e = pick(draw, entries)
    field_ = pick(draw, sorted(e) or ["x"])
    op = pick(draw, ["int", "bytes", "shared", "cycle", "deep", "type", "global", "tree", "bytes_level"])
    protocol = pick(draw, [0, 2, 4, 5])
    deep = 0
    if op == "int":
        e[field_] = pick(draw, [*INT_EDGES, 10**400 // 10**300, float("nan"), float("inf"), -0.0, True])
    elif op == "bytes":
        e[field_] = pick(draw, [b"\xff\xfe", b"nccl:all_reduce", "\u202eevil"])
    elif op == "shared":
        e[field_] = _shared(pick(draw, [3, 10, 20, 24, 30, 40]))
    elif op == "cycle":
        e[field_] = _cycle()
    elif op == "deep":
        e[field_], deep = _DEEP, pick(draw, [50, 99, 101, 990, 5000])
        protocol = max(protocol, 2)
    elif op == "type":
        e[field_] = pick(draw, [{1, 2}, bytearray(b"x"), frozenset(), complex(1, 2), range(3)])
    elif op == "tree":
        doc = _tree_op(draw, doc)
    data = pickle.dumps(doc, protocol=protocol)
    if deep:  # the placeholder string's opcodes -> `deep` empty lists, each appended to the one before
        opcodes = b"]" * deep + b"a" * (deep - 1)
        for enc in (
            b"\x8c" + bytes([len(_DEEP)]) + _DEEP.encode(),
            b"X" + len(_DEEP).to_bytes(4, "little") + _DEEP.encode(),
        ):
            data = data.replace(enc, opcodes, 1)
    if op == "global":  # os.system, the classic: refused before it runs
        data = b"cos\nsystem\n(S'echo pwned > /tmp/traceprof_fuzz_pwned'\ntR."
    if op == "bytes_level" or draw(_st().integers(0, 9)) == 0:
        data = mutate_bytes(draw, data)
    return Input({seed.main: data}, seed.main)


def mutate_bytes(draw: Draw, data: bytes) -> bytes:
    """Truncate, or flip up to 8 bytes."""
    if not data:
        return data
    if draw(_st().booleans()):
        return data[: number(draw, 0, len(data) - 1)]
    buf = bytearray(data)
    for _ in range(number(draw, 1, 8)):
        buf[number(draw, 0, len(buf) - 1)] ^= number(draw, 1, 255)
    return bytes(buf)


# -- NCCL profiler plugin ---------------------------------------------------------------------------


def _nccl_seeds() -> list[Input]:
    base = CASES / "nccl_plugin_zero_timestamps"
    return _one(base / "quoted" / "nccl_profile_rank0.txt") + _one(base / "raw" / "nccl_profile_rank0.txt")


@kind("nccl_plugin", _nccl_seeds)
def _nccl(draw: Draw, seed: Input) -> Input:
    return Input({seed.main: mutate_json(draw, seed.files[seed.main])}, seed.main)


# -- NDTimeline Parquet + meta YAML ---------------------------------------------------------------


def _nd_seeds() -> list[Input]:
    src = CORPUS / "kineto_misc" / "bytedance_straggler_whatif"
    if not (src / "trace-ST.parquet").is_file():
        return []
    import polars as pl

    buf = io.BytesIO()
    pl.read_parquet(src / "trace-ST.parquet").head(400).write_parquet(buf)
    return [
        Input(
            {"trace-ST.parquet": buf.getvalue(), "meta-ST.yaml": (src / "meta-ST.yaml").read_bytes()},
            "trace-ST.parquet",
        )
    ]


_YAML_VALUES = [
    b"2",
    b"1180591620717411303424",
    b"-1",
    b"0",
    b"1.5",
    b".inf",
    b".nan",
    b"x",
    b"null",
    b"[1]",
    b"{}",
    b"!!binary aGk=",
    b'"\xff"',
    b"2e400",
]


def _laughs(levels: int) -> bytes:
    lines = [b'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [
        f"a{i}: &a{i} [".encode() + b",".join([f"*a{i - 1}".encode()] * 9) + b"]" for i in range(1, levels)
    ]
    return b"\n".join(lines) + f"\ntrial_name: *a{levels - 1}\n".encode()


@kind("ndtimeline", _nd_seeds)
def _ndtimeline(draw: Draw, seed: Input) -> Input:
    files = dict(seed.files)
    if draw(_st().booleans()):
        files["meta-ST.yaml"] = _mutate_yaml(draw, files["meta-ST.yaml"])
    else:
        files["trace-ST.parquet"] = _mutate_parquet(draw, files["trace-ST.parquet"])
    return Input(files, seed.main)


def _mutate_yaml(draw: Draw, data: bytes) -> bytes:
    op = pick(draw, ["value", "laughs", "alias", "deep", "utf8", "tab", "bytes", "huge", "gone"])
    lines = data.split(b"\n")
    i = number(draw, 0, max(len(lines) - 2, 0))
    if op == "value" and b":" in lines[i]:
        lines[i] = lines[i].split(b":")[0] + b": " + pick(draw, _YAML_VALUES)
    elif op == "laughs":
        return data + _laughs(pick(draw, [2, 4, 9, 12]))
    elif op == "alias":
        return data + b"x: &x [1, 2]\ny: *x\n"
    elif op == "deep":
        d = pick(draw, DEPTHS)
        return data + b"x: " + b"[" * d + b"1" + b"]" * d + b"\n"
    elif op == "utf8":
        lines[i] = lines[i] + b"\xff\xfe"
    elif op == "tab":
        lines[i] = b"\t" + lines[i]
    elif op == "bytes":
        return mutate_bytes(draw, data)
    elif op == "huge":
        return data + b"trial_name: " + b"x" * (1 << 20) + b"\n"
    elif op == "gone":
        return b""
    return b"\n".join(lines)


def _mutate_parquet(draw: Draw, data: bytes) -> bytes:
    import polars as pl

    if draw(_st().integers(0, 4)) == 0:
        return mutate_bytes(draw, data)
    df = pl.read_parquet(io.BytesIO(data))
    col = pick(draw, df.columns)
    op = pick(draw, ["value", "value", "drop", "retype", "empty", "repeat", "rename"])
    if op == "value":
        dtype = df.schema[col]
        row = number(draw, 0, df.height - 1)
        if dtype.is_float():
            v: Any = pick(draw, [float("nan"), float("inf"), float("-inf"), 1e30, -1.0, None, 2.0**62 / 1e9])
        elif dtype.is_integer():
            v = pick(draw, [None, -1, 0, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 10**6])
        else:
            v = pick(draw, [None, "", "forward-compute", "\u202e\x1b[2J", "x" * 10_000])
        vals = df[col].to_list()
        vals[row] = v
        try:
            df = df.with_columns(
                pl.Series(
                    col,
                    vals,
                    dtype=dtype if v is None or not dtype.is_integer() or -(2**63) <= v < 2**63 else pl.Int64,
                    strict=False,
                )
            )
        except Exception:  # noqa: BLE001 - a value the column type cannot hold: widen to Int64 / String
            df = df.with_columns(pl.Series(col, [None if x is None else str(x) for x in vals]))
    elif op == "drop":
        df = df.drop(col)
    elif op == "retype":
        df = df.with_columns(pl.col(col).cast(pl.String))
    elif op == "empty":
        df = df.head(0)
    elif op == "repeat":
        df = pl.concat([df] * pick(draw, [2, 50]))
    else:
        df = df.rename({col: col + "_x"})
    buf = io.BytesIO()
    df.write_parquet(buf)
    return buf.getvalue()


# -- Nsight Systems SQLite ----------------------------------------------------------------------------


def _nsys_seeds() -> list[Input]:
    return _one(CASES / "nsys_graph_level_trace" / "train_rank0.sqlite") + _one(
        CORPUS / "nsys" / "pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite", "rank0.sqlite"
    )


_SQL_VALUES = [
    "NULL",
    str(2**63 - 1),
    str(-(2**63)),
    "-1",
    "0",
    "1.5",
    "'abc'",
    "x'ff00'",
    "CAST(x'ffc3' AS TEXT)",
    "'" + "A" * 10_000 + "'",
    "'ProfilerStep#99999999999'",
    "'\u202e\x1b[2J'",
    "1e308",
    "'RANK=99999999999'",
]


@kind("nsys", _nsys_seeds)
def _nsys(draw: Draw, seed: Input) -> Input:
    data = seed.files[seed.main]
    if draw(_st().integers(0, 4)) == 0:
        return Input({seed.main: mutate_bytes(draw, data)}, seed.main)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "x.sqlite"
        db.write_bytes(data)
        con = sqlite3.connect(db)
        try:
            tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for _ in range(number(draw, 1, 3)):
                _sqlite_op(draw, con, pick(draw, tables))
            con.commit()
        except sqlite3.Error:
            pass
        finally:
            con.close()
        return Input({seed.main: db.read_bytes()}, seed.main)


def _sqlite_op(draw: Draw, con: sqlite3.Connection, table: str) -> None:
    cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
    op = pick(
        draw, ["value", "value", "value", "drop_table", "drop_column", "rename_column", "clear", "repeat"]
    )
    if op == "value" and cols:
        n = con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
        if n:
            rid = con.execute(
                f'SELECT rowid FROM "{table}" LIMIT 1 OFFSET ?', [number(draw, 0, n - 1)]
            ).fetchone()[0]
            con.execute(
                f'UPDATE "{table}" SET "{pick(draw, cols)}" = {pick(draw, _SQL_VALUES)} WHERE rowid = ?',
                [rid],
            )
    elif op == "drop_table":
        con.execute(f'DROP TABLE "{table}"')
    elif op == "drop_column" and len(cols) > 1:
        con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{pick(draw, cols)}"')
    elif op == "rename_column" and cols:
        c = pick(draw, cols)
        con.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{c}" TO "{c}_x"')
    elif op == "clear":
        con.execute(f'DELETE FROM "{table}"')
    elif op == "repeat":
        con.execute(f'INSERT INTO "{table}" SELECT * FROM "{table}"')


# -- NCCL Inspector (JSON lines; fuzzed once a collector reads it) ---------------------------------


def _inspector_seeds() -> list[Input]:
    # kept in their folder (nccl-inspector-<jobid>/), which a collector may claim them by
    return [
        Input({f"{p.parent.name}/{p.name}": p.read_bytes()}, f"{p.parent.name}/{p.name}")
        for p in sorted((CASES / "nccl_inspector_records").glob("*/*.log"))[:1]
    ]


def _inspector_unavailable(seeds: list[Input]) -> str | None:
    if not seeds:
        return "no seed files"
    from traceprof.ingest import sources

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / seeds[0].main
        p.parent.mkdir(parents=True)
        p.write_bytes(seeds[0].files[seeds[0].main])
        return None if sources.claim(p) is not None else "no collector reads NCCL Inspector output yet"


@kind("nccl_inspector", _inspector_seeds, _inspector_unavailable)
def _inspector(draw: Draw, seed: Input) -> Input:
    return Input({seed.main: mutate_json(draw, seed.files[seed.main])}, seed.main)


# -- torch.profiler export_memory_timeline output (raw and coalesced forms) -------------------------

#: A raw timeline worked by hand in tests/test_memory.py: [t ns, action, bytes, category] entries.
_TIMELINE_RAW = [
    [-1, 1, 100, 0],
    [1000, 2, 50, 4],
    [1000, 2, 8, 7],
    [2000, 3, -50, 4],
    [2000, 3, 50, 5],
    [3000, 2, 40, 3],
    [4000, 4, -40, 3],
]
#: The same timeline in the coalesced form: [times in us, sizes [0, parameter, ..., unknown] per time].
_TIMELINE_COALESCED = [
    [1, 2, 3, 4],
    [
        [0, 100, 0, 0, 0, 50, 0, 0, 8],
        [0, 100, 0, 0, 0, 0, 50, 0, 8],
        [0, 100, 0, 0, 40, 0, 50, 0, 8],
        [0, 100, 0, 0, 0, 0, 50, 0, 8],
    ],
]


def _timeline_seeds() -> list[Input]:
    seeds = [
        Input(
            {"rank0_cuda0.raw.json.gz": gzip.compress(json.dumps(_TIMELINE_RAW).encode())},
            "rank0_cuda0.raw.json.gz",
        ),
        Input({"rank1_cuda0.json": json.dumps(_TIMELINE_COALESCED).encode()}, "rank1_cuda0.json"),
    ]
    corpus = _read(CORPUS / "hta" / "memory_analysis" / "memory_timeline.raw.gz")
    if corpus is not None:  # a few entries of the real file, in memory (the corpus is never copied)
        entries = json.loads(gzip.decompress(corpus))
        few = entries[:8] + entries[5000:5032]
        seeds.append(
            Input(
                {"rank2_cuda1.raw.json.gz": gzip.compress(json.dumps(few).encode())},
                "rank2_cuda1.raw.json.gz",
            )
        )
    return seeds


#: File names the rank and device are read from: numbers at the edges, several matches, none.
_TIMELINE_NAMES = [
    "rank99999999999999999999_cuda0",
    "rank0_cuda99999999999999999999",
    "rank2147483648_cuda1",
    "rank-1_cuda_3",
    "RANK_7_CUDA:2",
    "memory_timeline",
    "rank0_rank1_cuda0_cuda1",
    "rank" + "9" * 200,
    "\u202erank0",
]
_ENTRY_VALUES: list[Any] = [*INT_EDGES, 1.5, -0.5, True, None, "3", [], {}, [1, 2], float("nan")]


def _timeline_tree(draw: Draw, doc: Any) -> Any:
    """A change that knows the two forms: an entry's field (time, action, bytes, category) at an
    edge or of another type, an entry with fewer or more values, entries out of time order or
    repeated, a preexisting entry at a real time, a coalesced row of another width, times and
    sizes of different lengths, an entry nested deep."""
    coalesced = (
        len(doc) == 2
        and all(isinstance(x, list) for x in doc)
        and bool(doc[1])
        and isinstance(doc[1][0], list)
        and len(doc[1][0]) == 9
    )
    rows = doc[1] if coalesced else doc
    if not rows:
        return doc
    i = number(draw, 0, len(rows) - 1)
    op = pick(
        draw,
        ["value", "value", "arity", "order", "repeat", "deep", "sign", "lengths" if coalesced else "pre"],
    )
    row = rows[i]
    if op == "value" and isinstance(row, list) and row:
        row[number(draw, 0, len(row) - 1)] = pick(draw, _ENTRY_VALUES)
        if coalesced and draw(_st().booleans()):
            doc[0][i] = pick(draw, _ENTRY_VALUES)
    elif op == "arity" and isinstance(row, list):
        rows[i] = row[:-1] if row and draw(_st().booleans()) else [*row, 0]
    elif op == "order":
        rows.reverse()
    elif op == "repeat":
        rows[i : i + 1] = [row] * pick(draw, [2, 1000, 100_000])
    elif op == "deep":
        d = pick(draw, DEPTHS[:5])
        for _ in range(d):
            row = [row]
        rows[i] = row
    elif op == "sign" and isinstance(row, list) and len(row) == 4 and isinstance(row[2], int):
        row[2] = -row[2] or -1
    elif op == "pre" and isinstance(row, list) and len(row) == 4:
        row[:2] = [pick(draw, [-1, -2, 0, 2**63 - 1]), 1]
    elif op == "lengths":
        doc[0] = doc[0][:-1] if draw(_st().booleans()) else [*doc[0], doc[0][-1]]
    return doc


@kind("memory_timeline", _timeline_seeds)
def _memory_timeline(draw: Draw, seed: Input) -> Input:
    data = seed.files[seed.main]
    gz = seed.main.endswith(".gz")
    text = gzip.decompress(data) if gz else data
    if draw(_st().booleans()):
        text = json.dumps(_timeline_tree(draw, json.loads(text))).encode()
    else:
        text = mutate_json(draw, text)
    name = seed.main
    if draw(_st().integers(0, 3)) == 0:  # the rank and device come from the file name
        name = pick(draw, _TIMELINE_NAMES) + (".raw.json.gz" if gz else ".json")
    if gz:
        text = gzip.compress(text, 1)
        if draw(_st().integers(0, 4)) == 0:
            text = mutate_bytes(draw, text)
    return Input({name: text}, name)


# -- the worker ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What ingesting one input did: ``stored``, ``clean error``, or a failure (anything else)."""

    status: str
    detail: str = ""
    seconds: float = 0.0
    peak_mib: float = 0.0
    input_dir: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("stored", "clean error")


@dataclass
class Worker:
    """A process that ingests fuzz inputs one at a time through the CLI (``python -m tests.fuzzing``),
    restarted after a hang or a blow-up. The parent enforces :data:`TIME_LIMIT_S` and
    :data:`MEMORY_LIMIT_MIB` (the worker's resident set, read from /proc)."""

    root: Path
    proc: subprocess.Popen[bytes] | None = None
    n: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    #: (kind, outcome) of each failure, for the report.
    failures: list[tuple[str, Outcome]] = field(default_factory=list)
    #: Per kind: the longest input (s) and the highest resident memory of the worker (MiB).
    worst: dict[str, dict[str, float]] = field(default_factory=dict)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzzing"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, kind_name: str, inp: Input, skip: bool) -> Outcome:
        """Ingest ``inp`` (``--skip-bad-events`` if ``skip``) and judge the outcome."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.n += 1
        d = Path(tempfile.mkdtemp(prefix=f"{kind_name}-{self.n}-", dir=self.root))
        for name, data in inp.files.items():  # a name may hold a folder (a collector may claim by it)
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
        self.proc.stdin.write(json.dumps({"dir": str(d), "main": inp.main, "skip": skip}).encode() + b"\n")
        self.proc.stdin.flush()
        start, peak, line = time.monotonic(), 0.0, b""
        while not line.startswith(_ANSWER):  # lines a library printed straight to fd 1 are not answers
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.05)
            peak = max(peak, _rss_mib(self.proc.pid))
            took = time.monotonic() - start
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    out = Outcome("crash", f"worker exited with {self.proc.wait()}", took, peak, str(d))
                    self.proc = None
                    return self._count(kind_name, out)
            elif took > TIME_LIMIT_S:
                self.stop()
                return self._count(kind_name, Outcome("hang", f"over {TIME_LIMIT_S:g} s", took, peak, str(d)))
            elif peak > MEMORY_LIMIT_MIB:
                self.stop()
                return self._count(
                    kind_name, Outcome("memory", f"over {MEMORY_LIMIT_MIB} MiB", took, peak, str(d))
                )
        res = json.loads(line[len(_ANSWER) :])
        out = _judge(res, d, inp.main)
        out.seconds, out.peak_mib, out.input_dir = time.monotonic() - start, peak, str(d)
        if out.ok:
            shutil.rmtree(d, ignore_errors=True)
        return self._count(kind_name, out)

    def _count(self, kind_name: str, out: Outcome) -> Outcome:
        c = self.counts.setdefault(kind_name, {})
        c[out.status] = c.get(out.status, 0) + 1
        if not out.ok:
            self.failures.append((kind_name, out))
        w = self.worst.setdefault(kind_name, {"seconds": 0.0, "peak_mib": 0.0})
        w["seconds"], w["peak_mib"] = (
            max(w["seconds"], round(out.seconds, 2)),
            max(w["peak_mib"], round(out.peak_mib)),
        )
        return out


#: The start of the worker's answer line.
_ANSWER = b"@@fuzz-answer "


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _judge(res: dict[str, Any], d: Path, main: str) -> Outcome:
    """stored (exit 0), clean error (exit 1, one line ``error: ...`` naming the file or its folder;
    warnings aside), else a failure with what was printed."""
    code, err = res["code"], res["err"]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith("warning:")]
    if code == 0 and not any(ln.startswith("error") for ln in lines):
        return Outcome("stored")
    named = (
        len(errors) == 1 and errors[0].startswith("error: ") and (str(d) in errors[0] or main in errors[0])
    )
    if code == 1 and named and "Traceback" not in err:
        return Outcome("clean error", errors[0])
    return Outcome("failure", f"exit {code}: {err[-3000:]}")


def _serve() -> None:
    """Worker loop: one JSON request a line on stdin, one JSON answer a line on stdout."""
    from tests._cli_inproc import run

    for line in sys.stdin:
        req = json.loads(line)
        d = Path(req["dir"])
        args = [
            "ingest",
            str(d / req["main"]),
            "--db",
            str(d / "s.duckdb"),
            *(["--skip-bad-events"] if req["skip"] else []),
        ]
        try:
            code, out, err = run(*args)
        except BaseException:  # noqa: BLE001 - a traceback is the finding
            import traceback

            code, out, err = -1, "", traceback.format_exc()
        sys.stdout.write(_ANSWER.decode() + json.dumps({"code": code, "out": out[-2000:], "err": err}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
