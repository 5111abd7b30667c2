"""The combined straggler verdict (traceprof.engine.verdict): stragglers and whatif in one answer."""

from __future__ import annotations

import pytest

from tests.conftest import SAMPLES, analyze, case, corpus
from traceprof.engine.verdict import combined_verdict
from traceprof.ingest.ingest import ingest

# (run, named ranks, straggling, how the text starts). sleep_rank1 / clean are the fresh pair
# recorded for issue 9 (rank 1 sleeps 50 ms before each step / nothing injected).
CASES = [
    ("sleep_rank1", (1,), True, "straggler: rank 1 (untraced host time"),
    ("clean", (), False, "no straggler:"),
    ("normal", (), False, "no straggler:"),
    ("normal_repeat", (), False, "no straggler:"),
    ("straggler_rank2", (2,), True, "straggler: rank 2 (untraced host time"),
    ("straggler_rank3", (3,), True, "straggler: rank 3 (untraced host time"),
]


@pytest.mark.parametrize("run, named, straggling, start", CASES)
def test_samples(store, run, named, straggling, start):
    if not (SAMPLES / run / "rank3.trace.json.gz").exists():
        pytest.skip(f"sample_traces/{run} not recorded")
    ingest(store, [SAMPLES / run], run=run)
    v = combined_verdict(store, run)
    assert v.text.startswith(start), v.text
    assert (v.stragglers, v.straggling) == (named, straggling)
    # whatif agrees: a named rank's host gaps or op times alone cost >= 5% (alone S >= 1.05), and
    # an unnamed run has S and the host-gap slowdown <= 1.1 (clean 1.000 / 1.040, normal 1.098 /
    # 1.000, normal_repeat 1.033 / 1.020).
    alone = v.figures["whatif_alone_by_rank"]
    for r in named:
        assert alone[r] >= 1.05
    if not named:
        assert max(v.slowdown, v.host_slowdown) <= 1.1
    assert f"what-if S = {v.slowdown:.3f}" in v.text


@pytest.mark.parametrize(
    "trial, start, named",
    [
        ("AR", "straggler: rank 0 (compute", (0,)),
        ("SE", "slow stage: pipeline stage 1 (ranks 64, 66,", ()),
        ("ST", "slow stage: pipeline stage 3 (ranks 6, 7)", ()),
    ],
)
def test_production_traces(store, trial, start, named):
    # AR: one slow worker (global rank 0), given its place in the mesh; SE: sequence-length
    # imbalance, half the workers (stage 1) each last significantly often: no single worker, the
    # whole stage 1 computes 50% more than stage 0 (parallelism's slow stage); ST: the last pipeline
    # stage (its two workers, ranks 6 and 7), named as the stage, not as two stragglers.
    ingest(store, [corpus(f"kineto_misc/bytedance_straggler_whatif/trace-{trial}.parquet")])
    v = combined_verdict(store, f"trace-{trial}")
    assert v.text.startswith(start), v.text
    assert v.stragglers == named and v.straggling
    if trial == "SE":
        assert "no single straggler: 32 of 64 ranks" in v.text and "largest by stage: 1" in v.text
    if trial == "ST":  # stragglers' rule picks ranks 6 and 7; the mesh names their stage instead
        assert v.figures["mesh_absorbed"] == [6, 7]
    if trial == "AR":
        assert "in the mesh: rank 0 is pp stage 0, dp replica 0" in v.text


def test_flight_recorder_only_run_quotes_no_step_time(store):
    # fr_two_groups_same_pg_name: Flight Recorder dumps only (no steps, no compute): rank 1 (group
    # A) and rank 3 (group B) are last at 3 of 3 each (p = 0.5^3 = 0.125, not named); costs are
    # hold-ups over the time the collectives cover, so no verdict speaks of "% of step time".
    # 3 collectives with one last rank: even last at all 3, p >= 0.125 > 0.01: the test cannot
    # decide, and rank 1's hold-ups cost 1.0% (>= min_cost_pct 1%: 3 x 100 us of the 3 x 10 ms its
    # collectives cover, a pace apart): inconclusive, not ok.
    ingest(store, [case("fr_two_groups_same_pg_name")], run="fr2")
    v = combined_verdict(store, "fr2")
    assert v.status == "inconclusive" and v.text.startswith(
        "too few collectives to test for a straggler: rank 1"
    )
    assert (
        v.stragglers == () and "of step time" not in v.text and "of the time the collectives cover" in v.text
    )
    evidence = analyze(store, "stragglers", "fr2").verdict["evidence"][0]
    assert "of step time" not in evidence and "of the time the collectives cover" in evidence
