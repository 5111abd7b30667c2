"""Grouping the ranks of an ingest into jobs by host and time (traceprof.ingest.naming,
traceprof.storage.identity): hosts' clocks differ by at most 5 min, a host name many machines report
holds no ranks to one clock, and two complete rank sets recorded together on their own hosts are
two jobs."""

from __future__ import annotations

import pytest

from tests.ingest.test_copies import T0, _rank_file, _runs
from traceprof.core.errors import StoreError, TraceFormatError
from traceprof.ingest.ingest import ingest


def test_ranks_of_other_hosts_20_min_apart_are_two_runs(store, tmp_path):
    """Ranks 0-1 on node-a at T0, ranks 2-3 on node-b 20 min later: one run before (under the
    hour); other hosts' clocks differ by at most 5 min, so by hand gap = 1200 s - 100 us > 300 s:
    two runs of 2 ranks, named after each set's lowest pid."""
    d = tmp_path / "mix"
    for r in (0, 1):
        _rank_file(d / f"rank{r}.json", r, T0, pid=100 + r, host="node-a")
    for r in (2, 3):
        _rank_file(d / f"rank{r}.json", r, T0 + 1200 * 10**9, pid=200 + r, host="node-b")
    with pytest.raises(StoreError, match="more than hosts' clocks differ"):
        ingest(store, [d], run="one", jobs=1)  # --run: refused, as two jobs of one host are
    res = ingest(store, [d], jobs=1)
    assert _runs(store) == {"mix-pid100": (2, 2), "mix-pid202": (2, 2)}
    note = next(w for w in res.warnings if "cannot be one job" in w)
    assert (
        "(rank2.json was recorded 20.0 min after rank0.json ended, more than hosts' clocks differ (5.0 min))"
        in note
    )


def test_other_hosts_61_s_apart_stay_one_run(store, tmp_path):
    """A 61 s clock offset between two hosts (t10 clk61): 61 s < 5 min, one run, aligned."""
    d = tmp_path / "skew"
    _rank_file(d / "rank0.json", 0, T0, pid=100, host="node-a", world=2)
    _rank_file(d / "rank1.json", 1, T0 + 61 * 10**9, pid=100, host="node-b", world=2)
    ingest(store, [d], jobs=1)
    assert _runs(store) == {"skew": (2, 2)}


def test_two_machines_both_named_localhost_3_s_apart_are_one_run(store, tmp_path):
    """Ranks 0-1 and 2-3 on two machines that both say 'localhost', the second's clock 3 s ahead:
    split before (one host's traces 3 s - 100 us > 1 s apart); 'localhost' names no machine, so the
    5 min of other hosts applies: one run of 4 ranks."""
    d = tmp_path / "lh"
    for r in (0, 1):
        _rank_file(d / f"rank{r}.json", r, T0, pid=100 + r, host="localhost")
    for r in (2, 3):
        _rank_file(d / f"rank{r}.json", r, T0 + 3 * 10**9, pid=100 + r, host="localhost")
    ingest(store, [d], jobs=1)
    assert _runs(store) == {"lh": (4, 4)}


def test_two_complete_rank_sets_at_one_time_on_two_hosts_are_two_jobs(store, tmp_path):
    """Ranks 0-3 of job a on node-a and ranks 0-3 of job b on node-b, recorded at once: refused
    before (rank 0 twice, recorded together); each host's files are a complete rank set (0..3 once),
    so two runs named after their lowest pid (100, 200)."""
    d = tmp_path / "both"
    for r in range(4):
        _rank_file(d / f"a{r}.json", r, T0, pid=100 + r, host="node-a")
        _rank_file(d / f"b{r}.json", r, T0 + 10_000, pid=200 + r, host="node-b")
    res = ingest(store, [d], jobs=1)
    assert _runs(store) == {"both-pid100": (4, 4), "both-pid200": (4, 4)}
    assert any("so they are 2 runs: 'both-pid100', 'both-pid200'" in w for w in res.warnings)


TOLD = (
    "), so which job each file is cannot be told: put each job's files in a folder of its own, or ingest "
    "each job's files on their own with --run NAME"
)
AB, BA = ["node-a", "node-a", "node-b", "node-b"], ["node-b", "node-b", "node-a", "node-a"]


@pytest.mark.parametrize(
    ("a_hosts", "b_hosts", "b_pid", "b_ranks", "said"),
    [
        pytest.param(
            AB,
            BA,
            50,
            4,
            "its 8 files look like 2 jobs of 4 ranks recorded together, which their hosts group in more than one "
            "way (node-a pids 100-101 ranks 0, 1; node-b pids 102-103 ranks 2, 3; node-a pids 52-53 ranks 2, 3; "
            "node-b pids 50-51 ranks 0, 1: jobs as node-a pids 100-101+node-b pids 102-103 and node-a pids "
            "52-53+node-b pids 50-51, or as node-a pids 100-101+node-a pids 52-53 and node-b pids 102-103+node-b "
            "pids 50-51",
            id="E3-crossed",
        ),
        pytest.param(
            AB,
            AB,
            200,
            4,
            "its 8 files look like 2 jobs of 4 ranks recorded together, which their hosts group in more than one "
            "way (node-a pids 100-101 ranks 0, 1; node-b pids 102-103 ranks 2, 3; node-a pids 200-201 ranks 0, 1; "
            "node-b pids 202-203 ranks 2, 3: jobs as node-a pids 100-101+node-b pids 102-103 and node-a pids "
            "200-201+node-b pids 202-203, or as node-a pids 100-101+node-b pids 202-203 and node-b pids "
            "102-103+node-a pids 200-201",
            id="E7-shared",
        ),
        pytest.param(
            ["node-a"] * 4,
            ["node-b"] * 2,
            200,
            2,
            "its 6 files look like 2 jobs of 4 ranks recorded together, which their hosts cannot group into "
            "complete jobs (node-a ranks 0, 1, 2, 3; node-b ranks 0, 1: "
            "ranks 2, 3 missing once",
            id="E4-partial",
        ),
    ],
)
def test_two_jobs_on_hosts_that_hold_both_or_make_no_whole_jobs_are_refused_naming_them(
    store, tmp_path, a_hosts, b_hosts, b_pid, b_ranks, said
):
    """Job a: ranks 0-1 on node-a, 2-3 on node-b (pids 100-103); job b recorded at once (10 us later).
    t12 E3 (b's ranks 0-1 on node-b, 2-3 on node-a, pids 50-53): before s7 split by host into two
    mixed runs; node-a's pids by rank are 100, 101, 52, 53, not rising, so node-a holds two jobs'
    files and may not be cut by host. t12 E7 (b on the same hosts as a, pids 200-203: rank 0 twice
    on node-a) and E4 (a's ranks all on node-a, b's ranks 0-1 only, on node-b): all three were refused with the generic
    'rank 0 also in ...'. By hand, each host's files cut where the rank falls or the pid steps over
    32 are one launcher's: E3 node-a 100-101 (ranks 0, 1) and 52-53 (2, 3), node-b 102-103 (2, 3)
    and 50-51 (0, 1), the {0, 1} runs pairing with either {2, 3} run; E7 alike; E4: ranks 0 and 1
    held twice, 2 and 3 once, so two jobs of 4 would need ranks 2, 3 once more. The refusal names
    each run's host, pids and ranks and both groupings, or what is missing; nothing stored."""
    d = tmp_path / "jobs"
    for r in range(4):
        _rank_file(d / f"a{r}.json", r, T0, pid=100 + r, host=a_hosts[r])
    for r in range(b_ranks):
        _rank_file(d / f"b{r}.json", r, T0 + 10_000, pid=b_pid + r, host=b_hosts[r])
    with pytest.raises(TraceFormatError) as e:
        ingest(store, [d], jobs=1)
    assert str(e.value) == f"{d}: {said}{TOLD}"
    assert _runs(store) == {}


def test_two_jobs_on_four_hosts_at_once_are_refused_when_hosts_pair_either_way(store, tmp_path):
    """t12 E (E6 alike): job a's ranks 0-1 on node-a, 2-3 on node-b; job b's 0-1 on node-c, 2-3 on
    node-d, recorded at once (b 2 min later alike: hosts' clocks differ by up to 5 min). Before: two
    runs, node-a paired with whichever host began first. By hand both {a, b} + {c, d} and
    {a, d} + {c, b} are complete rank sets 0..3 (pids rise with rank on every host): ambiguous, so
    refused. t13 D5: the refusal read as the generic 'rank 0 also in ...'; it now says the 8 files
    look like 2 jobs of 4 ranks, each host's ranks (in order of first record: a, b, c, d), both
    pairings and the options."""
    d = tmp_path / "four"
    for r in range(4):
        _rank_file(d / f"a{r}.json", r, T0, pid=100 + r, host=["node-a", "node-b"][r // 2])
        _rank_file(d / f"b{r}.json", r, T0 + 10_000, pid=200 + r, host=["node-c", "node-d"][r // 2])
    with pytest.raises(TraceFormatError) as e:
        ingest(store, [d], jobs=1)
    assert str(e.value) == (
        f"{d}: its 8 files look like 2 jobs of 4 ranks recorded together, which their hosts group in more "
        "than one way (node-a ranks 0, 1; node-b ranks 2, 3; node-c ranks 0, 1; node-d ranks 2, 3: jobs as "
        "node-a+node-b and node-c+node-d, or as node-a+node-d and node-b+node-c), so which job each file is "
        "cannot be told: put each job's files in a folder of its own, or ingest each job's files on their "
        "own with --run NAME"
    )
    assert _runs(store) == {}
