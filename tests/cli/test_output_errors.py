"""An output that cannot be written is one line and exit 1, for every command that writes to stdout.

Before: `traceprof analyze kernel_sum -f csv > k.csv` on a disk with 4 KiB left exited 0 with a
4,096-byte file (the whole output is 76,590 bytes) and nothing on stderr; `summary -f json` the same.
Two ways lost the error: Python's own flush of stdout at exit (a script's drops its error, exit 0),
and, with PYTHONUNBUFFERED=1, a text layer straight over the file that drops the rest of a short write.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import corpus

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
#: The console script, as users run it (`python -m traceprof.cli` reports a failed exit flush; a
#: script drops it).
TRACEPROF = str(Path(sys.executable).parent / "traceprof")

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")


def _traceprof(
    *args: str, stdout, env: dict[str, str] | None = None, preexec=None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TRACEPROF, *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec,
    )


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("full") / "s.duckdb"
    for run in (SAMPLES / "normal", SAMPLES / "extra_matmul", corpus("hta/trace_filter")):
        r = _traceprof("ingest", str(run), "--db", str(path), stdout=subprocess.PIPE)
        assert r.returncode == 0, r.stderr
    return path


#: Each command that writes to stdout, in each of its formats that goes there.
STDOUT_COMMANDS = [
    ("runs",),
    ("runs", "-f", "csv"),
    ("sql", "select 1 as x"),
    ("analyze", "list"),
    ("analyze", "kernel_sum", "--run", "trace_filter", "-f", "csv"),
    ("analyze", "kernel_sum", "--run", "trace_filter", "-f", "json"),
    ("analyze", "stragglers", "--run", "normal"),
    ("summary", "--run", "normal", "-f", "json"),
    ("summary", "--run", "normal", "-f", "markdown"),
    ("summary", "--run", "normal"),
    ("diff", "normal", "extra_matmul", "--table", "metrics"),
    ("diff", "normal", "extra_matmul", "-f", "json"),
    ("baseline", "list"),
    ("history", "normal,extra_matmul"),
    ("config",),
    ("export", "perfetto", "--run", "normal", "-o", "/dev/stdout"),
]


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED"])
@pytest.mark.parametrize("args", STDOUT_COMMANDS, ids=" ".join)
def test_output_to_a_full_disk_is_one_line_and_exit_1(db, args, unbuffered):
    env = {"PYTHONUNBUFFERED": unbuffered} if unbuffered else {}
    if not unbuffered:
        env["PYTHONUNBUFFERED"] = ""  # an empty value is unset for Python
    with open("/dev/full", "w") as full:
        r = _traceprof(*args, "--db", str(db), stdout=full, env=env)
    # export names the file it writes (/dev/stdout); the others write to stdout itself
    where = "/dev/stdout: cannot write: " if args[0] == "export" else ""
    assert (r.returncode, r.stderr) == (1, f"error: {where}No space left on device\n")


def _file_size_limit(limit: int):
    """A child's setup: files it writes stop at ``limit`` bytes (a write across it is short, the
    next one fails with EFBIG rather than killing it with SIGXFSZ) – a nearly full disk."""

    def setup() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return setup


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED"])
@pytest.mark.parametrize(
    "args",
    [
        ("sql", "select range as n, 'x' as s from range(20000)", "-f", "csv", "--max-rows", "0"),
        ("analyze", "kernel_sum", "--run", "trace_filter", "-f", "csv", "--no-cache"),
    ],
    ids=" ".join,
)
def test_a_short_write_is_an_error_not_a_short_file(db, tmp_path, args, unbuffered):
    """The first write of a large output takes 4,096 bytes: before, the rest was dropped with
    PYTHONUNBUFFERED=1 (exit 0, a 4,096-byte file)."""
    whole = _traceprof(*args, "--db", str(db), stdout=subprocess.PIPE)
    assert whole.returncode == 0 and len(whole.stdout) > 3 * 4096, whole.stderr
    out = tmp_path / "out"
    with out.open("w") as f:
        r = _traceprof(
            *args,
            "--db",
            str(db),
            stdout=f,
            env={"PYTHONUNBUFFERED": unbuffered},
            preexec=_file_size_limit(4096),
        )
    assert (r.returncode, r.stderr) == (1, "error: File too large\n")
    assert out.stat().st_size == 4096


def _undated(data: bytes) -> bytes:
    """The output without the report's generation time ("2026-12-07 06:25 UTC", to the minute): two
    reports written a moment apart differ there when a minute turns between them (CI under load)."""
    return re.sub(rb"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", b"<date>", data)


@pytest.mark.parametrize("to", ["/dev/stdout", "-"])
@pytest.mark.parametrize(
    "args", [("report", "--run", "normal"), ("export", "perfetto", "--run", "normal")], ids=" ".join
)
def test_an_output_file_can_be_stdout_on_a_pipe(db, tmp_path, args, to):
    """Before: `report -o /dev/stdout | wc -c` was "error: /dev/stdout: folder /dev does not exist"
    and exit 1 (/dev/stdout on a pipe resolves to /proc/<pid>/fd/pipe:[n], no file); `-o -` wrote a
    file named "-"."""
    out = tmp_path / "out"
    r = _traceprof(*args, "--db", str(db), "-o", str(out), stdout=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    piped = subprocess.run(
        [TRACEPROF, *args, "--db", str(db), "-o", to],
        capture_output=True,
        cwd=tmp_path,
    )
    assert piped.returncode == 0, piped.stderr
    # the same bytes as the file, but an export to stdout is never gzipped (no .gz suffix)
    data = out.read_bytes()
    assert _undated(piped.stdout) == _undated(data)
    assert not (tmp_path / "-").exists()
    assert piped.stderr.decode().endswith(
        f"written to {'stdout' if to == '-' else to}"
        + (" (metadata events included)\n" if args[0] == "export" else "\n")
    )


@pytest.mark.parametrize(("to", "redirect"), [("/dev/stdout", ""), ("/dev/stderr", "2"), ("/dev/fd/3", "3")])
def test_an_output_descriptor_is_written_as_the_shell_opened_it(db, tmp_path, to, redirect):
    """`echo hello > h.html; traceprof report ... -o /dev/stdout >> h.html`: before, a temporary file
    renamed over h.html (a new inode, "hello" gone); now the report is appended through the
    descriptor the shell opened, as `-o -` writes it."""
    out = tmp_path / "out.html"
    r = _traceprof("report", "--run", "normal", "--db", str(db), "-o", str(out), stdout=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    h = tmp_path / "h.html"
    h.write_text("hello\n")
    inode = h.stat().st_ino
    cmd = f'"$0" report --run normal --db "$1" -o {to} {redirect}>> "$2"'
    sh = subprocess.run(["sh", "-c", cmd, TRACEPROF, str(db), str(h)], capture_output=True)
    assert sh.returncode == 0, sh.stderr
    assert h.stat().st_ino == inode
    said = f"report written to {to}\n".encode() if redirect == "2" else b""
    assert _undated(h.read_bytes()) == b"hello\n" + _undated(out.read_bytes()) + said


@pytest.mark.parametrize("fmt", ["csv", "json", "table"])
def test_a_reader_that_leaves_early_is_exit_0_and_quiet(db, fmt):
    """`sql ... -f csv | head -1`: before, exit 1 and nothing said (typer and rich each take a
    BrokenPipeError raised while a command writes for a failure); now exit 0 quietly, as `analyze`'s
    output flushed at exit was already."""
    q = "SELECT range AS n, repeat('x', 100) AS s FROM range(5000)"  # > 500 kB: more than a pipe holds
    p = subprocess.Popen(
        [TRACEPROF, "sql", q, "--db", str(db), "-f", fmt, "--max-rows", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()
    p.stdout.close()  # the reader leaves, as head -1 does
    err = p.stderr.read()
    assert (p.wait(), err) == (0, b"")
    assert first  # it had started writing


@pytest.mark.parametrize("case", ["other store", "the store", "full disk"])
def test_stdout_as_dash_or_dev_stdout_is_checked_alike(db, tmp_path, case):
    """`report -o -` and `report -o /dev/stdout` are one output (stdout): the same checks, the same
    message but for its name ("stdout", "/dev/stdout"). Before, `-` skipped every check: with
    stdout appended to a DuckDB database (another store, or the --db store itself) it appended the
    report to it (exit 0, the database damaged), where /dev/stdout was refused; on a full disk it
    said "error: No space left on device" where /dev/stdout named itself."""
    import duckdb

    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    target = {"other store": str(other), "the store": str(db), "full disk": "/dev/full"}[case]
    said = {
        "other store": ": is a DuckDB database (a traceprof store?); not overwriting it, write the output elsewhere",
        "the store": f": would overwrite the store {db}; write the output elsewhere",
        "full disk": ": cannot write: No space left on device",
    }[case]
    before = Path(target).read_bytes() if case != "full disk" else b""
    for to, name in (("-", "stdout"), ("/dev/stdout", "/dev/stdout")):
        with open(target, "ab") as f:
            r = _traceprof("report", "--run", "normal", "--db", str(db), "-o", to, stdout=f)
        assert (r.returncode, r.stderr) == (1, f"error: {name}{said}\n"), to
        if case != "full disk":
            assert Path(target).read_bytes() == before


def _into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run the console script with stdout a pipe whose reader has already left (``| head -1``
    after its first line, without the race: every write fails with EPIPE)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([TRACEPROF, *args], stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "markdown"])
def test_a_reader_that_leaves_early_keeps_diffs_verdict(db, fmt):
    """`set -o pipefail; traceprof diff normal extra_matmul | head -1` in a CI step: the verdict is
    a regression (exit 3: extra_matmul adds two aten::mm a step, README). Before, the table output
    exited 0 (the broken pipe ended the command before its `typer.Exit(3)`) and csv, json and
    markdown 1 (typer's exit for a write that failed with EPIPE); now 3 in each, quietly."""
    p = _into_a_closed_pipe("diff", "normal", "extra_matmul", "--db", str(db), "-f", fmt)
    assert (p.returncode, p.stderr) == (3, "")


@pytest.mark.parametrize(
    "args", [("analyze", "--help"), ("runs", "--help"), ("--help",), ("--version",)], ids=" ".join
)
def test_help_into_a_reader_that_leaves_early_is_exit_0(args):
    """`traceprof analyze --help | head -1`: before, exit 1 (rich's help console exits 1 on a
    broken pipe; --version's write, made while the options are parsed, typer's EPIPE exit 1); now 0
    and quiet, as any other output cut short."""
    p = _into_a_closed_pipe(*args)
    assert (p.returncode, p.stderr) == (0, "")
