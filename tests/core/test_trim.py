"""traceprof.core.trim hands the heap's freed memory back to the system (glibc)."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from traceprof.core import trim as trim_mod


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or trim_mod._malloc_trim() is None,
    reason="glibc's malloc_trim only",
)
def test_trim_hands_back_freed_arrays() -> None:
    # a freed 16 MB block raises glibc's mmap threshold to 16 MB: 4 MB arrays then come from the
    # heap, and freeing them (all but the last, so the heap's top stays in use) keeps them resident
    # until trimmed: 30 x 4 MB = 120 MB freed, most of it handed back
    big = np.ones(2 << 20)  # 16 MiB
    del big
    arrays = [np.ones(1 << 19) for _ in range(31)]  # 4 MiB each, written
    keep = arrays.pop()
    del arrays
    before = _rss_mib()
    trim_mod.trim()
    after = _rss_mib()
    assert before - after > 60, (before, after)
    assert keep.sum() == 1 << 19
