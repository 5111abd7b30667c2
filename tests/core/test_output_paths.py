"""write_output's errors for -o paths that cannot be written: they name the -o path and the real
reason, never the temporary file it writes first (D6 of the t9 trial)."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceprof.core.errors import UsageError
from traceprof.core.fileio import write_output


def test_a_file_in_the_way_is_named_not_the_temporary_file(tmp_path):
    """Before: `-o /etc/hostname/x.html` was "Not a directory: /etc/hostname/.x.html.7663a996.tmp"
    (a NotADirectoryError from removing the temporary file that never was). Now the -o path and
    the file in the way, for a file one or three levels above the output."""
    (tmp_path / "f").write_text("keep")
    for out in (tmp_path / "f" / "x.html", tmp_path / "f" / "a" / "b" / "x.html"):
        with pytest.raises(UsageError) as e:
            write_output(out, b"x")
        assert str(e.value) == f"{out}: cannot write: {tmp_path / 'f'} is a file, not a folder"
    assert (tmp_path / "f").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no procfs here")
@pytest.mark.parametrize("out", ["/proc/version", "/proc/self/x.html"])
def test_a_folder_that_takes_no_files_is_not_said_missing(out):
    """Before: `-o /proc/version` was "folder /proc does not exist" (procfs answers ENOENT to a new
    file, the temporary one). Now the folder is said to exist and take no new files."""
    with pytest.raises(UsageError) as e:
        write_output(out, b"x")
    folder = str(Path(out).parent)
    assert str(e.value) == (
        f"{out}: cannot write: folder {folder} takes no new files (No such file or directory)"
    )


def test_a_missing_folder_is_still_said_missing(tmp_path):
    out = tmp_path / "nope" / "x.html"
    with pytest.raises(UsageError) as e:
        write_output(out, b"x")
    assert str(e.value) == f"{out}: folder {tmp_path / 'nope'} does not exist"
