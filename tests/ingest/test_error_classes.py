"""Every error class a collector raises comes back from a parser process and through the message of
a multi-file ingest as itself: one line naming the file and the record, never a traceback.

Trial t16 (h/knan: three rank files, rank2.json with ``"dur": NaN``) got ``AttributeError: 'str'
object has no attribute 'decode'``: ingest rebuilt the error as ``type(e)(path, where, reason)``,
but ``NonFiniteNumber`` takes ``(path, offset, token)``; with ``-j 2`` the trip back from the worker
(``__reduce__``, the same guess) broke the process pool.
"""

from __future__ import annotations

import importlib
import json
import pickle
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import traceprof.collectors
from tests._cli_inproc import run
from tests.builders import micro_trace
from tests.conftest import REPO
from traceprof.core.errors import NotATraceError, TraceFormatError


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def _samples() -> dict[type, TraceFormatError]:
    """One instance of each TraceFormatError class (a new class with its own constructor goes here)."""
    from traceprof.collectors.kineto.parse import NonFiniteNumber

    return {
        TraceFormatError: TraceFormatError("r.json", "event #3", "missing 'dur'"),
        NotATraceError: NotATraceError("r.json", "", "not a Kineto trace"),
        NonFiniteNumber: NonFiniteNumber(Path("r.json"), 475, b"NaN"),
    }


def test_every_trace_format_error_class_survives_the_worker_trip_and_an_added_reason():
    for m in pkgutil.walk_packages(
        traceprof.collectors.__path__, "traceprof.collectors."
    ):  # every collector's classes
        importlib.import_module(m.name)
    samples = _samples()
    found = {c for c in _subclasses(TraceFormatError) if not c.__module__.startswith("tests")}
    assert found | {TraceFormatError} == set(samples), "add the new class to _samples()"
    for cls, e in samples.items():
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and str(back) == str(e) and back.__dict__ == e.__dict__
        more = e.with_reason("; nothing stored")
        assert type(more) is cls and str(more) == str(e) + "; nothing stored"
        assert more.reason == e.reason + "; nothing stored" and (more.path, more.where) == (e.path, e.where)
        assert str(e).endswith(e.reason)  # the original is left as it was
    nan = samples[next(c for c in samples if c.__name__ == "NonFiniteNumber")]
    assert pickle.loads(pickle.dumps(nan)).token == b"NaN"  # its own attributes too


def _nan_job(d: Path, word: str) -> tuple[Path, int]:
    """Two rank files; rank1.json's aten::mm has ``"dur": <word>`` -> (its path, byte of the word)."""
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm"], rank=0, world=2)))
    text = json.dumps(micro_trace(["aten::mm"], rank=1, world=2)).replace('"dur": 1}', f'"dur": {word}}}')
    (d / "rank1.json").write_text(text)
    return d / "rank1.json", text.index(word)


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_in_one_of_several_files_is_one_line(tmp_path, word):
    """Hand value: the message is the single-file one plus '; nothing stored (--partial stores the
    other files)'; the byte is the offset of the word in rank1.json's text (0-based)."""
    bad, at = _nan_job(tmp_path / "job", word)
    code, _, err = run("ingest", str(tmp_path / "job"), "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and err.splitlines() == [
        f"error: {bad}: byte {at}: {word} is not a JSON number (what Python's json.dumps, C's printf and "
        "others write for a float that is not finite); pass --skip-bad-events to read each as null (its "
        "event is then reported); nothing stored (--partial stores the other files)"
    ], err


def test_a_non_finite_number_comes_back_from_a_parser_process(tmp_path):
    """-j 2: the error is pickled in the worker and rebuilt here (it broke the process pool)."""
    bad, at = _nan_job(tmp_path / "job", "NaN")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "traceprof.cli",
            "ingest",
            str(tmp_path / "job"),
            "--db",
            str(tmp_path / "s.duckdb"),
            "-j",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f"error: {bad}: byte {at}: NaN is not a JSON number (what Python's json.dumps, C's printf and "
        "others write for a float that is not finite); pass --skip-bad-events to read each as null (its "
        "event is then reported); nothing stored (--partial stores the other files)"
    ], r.stderr


def test_a_named_non_trace_beside_a_trace_is_one_line(tmp_path):
    """NotATraceError through the same path: a file named on the command line is not skipped."""
    (tmp_path / "rank0.json").write_text(json.dumps(micro_trace(["aten::mm"])))
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    code, _, err = run(
        "ingest",
        str(tmp_path / "rank0.json"),
        str(tmp_path / "config.json"),
        "--db",
        str(tmp_path / "s.duckdb"),
    )
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {tmp_path / 'config.json'}: ") and lines[0].endswith(
        "; nothing stored (--partial stores the other files)"
    ), err
