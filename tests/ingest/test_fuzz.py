"""Property-based fuzzing of ingest over every input kind (issues 11 and 29): a mutated input either
ingests, or fails with traceprof's own one-line error naming the file; never a traceback, a hang
(over ``FUZZ_TIME_LIMIT_S``, 60 s) or a memory blow-up (over ``FUZZ_MEMORY_LIMIT_MIB``, 2048 MiB).

The kinds and their structure-aware mutations are in tests/fuzzing.py (one entry per kind). The
suite runs ``FUZZ_EXAMPLES`` inputs per kind (20); ``make fuzz`` runs many more and prints the
outcome counts per kind (``FUZZ_REPORT=file.json`` also writes them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import case, corpus
from tests.fuzzing import KINDS, Worker

#: Inputs per kind: 20 in the suite (about 150 in all); `make fuzz` sets FUZZ_EXAMPLES.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))
#: The suite draws the same inputs on every run (a CI result is reproducible, a red one is a real
#: regression); `make fuzz` sets FUZZ_RANDOM=1 to draw new ones each time, which is how new faults are found.
RANDOM = bool(os.environ.get("FUZZ_RANDOM"))
_SEEDS = {name: k.seeds() for name, k in KINDS.items()}
#: A pickle global that ran would leave this file (the fr_pickle kind tries os.system).
PWNED = Path("/tmp/traceprof_fuzz_pwned")


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    # FUZZ_DIR keeps the inputs that failed (under a temporary folder they go with the session)
    root = Path(os.environ["FUZZ_DIR"]) if os.environ.get("FUZZ_DIR") else tmp_path_factory.mktemp("fuzz")
    root.mkdir(parents=True, exist_ok=True)
    w = Worker(root)
    yield w
    w.stop()
    total = sum(sum(c.values()) for c in w.counts.values())
    print(
        f"\nfuzz outcomes ({total} inputs): "
        + "; ".join(
            f"{k}: " + ", ".join(f"{s} {n}" for s, n in sorted(c.items()))
            for k, c in sorted(w.counts.items())
        )
    )
    if os.environ.get("FUZZ_REPORT"):
        Path(os.environ["FUZZ_REPORT"]).write_text(
            json.dumps(
                {
                    "counts": w.counts,
                    "worst": w.worst,
                    "failures": [
                        {"kind": k, "status": o.status, "input": o.input_dir, "detail": o.detail[-600:]}
                        for k, o in w.failures
                    ],
                },
                indent=2,
            )
        )


def _param(name: str) -> object:
    why = KINDS[name].unavailable(_SEEDS[name])
    return pytest.param(name, marks=pytest.mark.skip(reason=why)) if why else name


@pytest.mark.parametrize("name", [_param(n) for n in KINDS])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not RANDOM,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(data=st.data())
def test_mutated_inputs_ingest_or_fail_in_one_line(worker, name, data):
    kind = KINDS[name]
    seed = data.draw(st.sampled_from(_SEEDS[name]))
    inp = kind.mutate(data.draw, seed)
    out = worker.run(name, inp, skip=data.draw(st.booleans()))
    assert out.ok, (
        f"{name}: {out.status} after {out.seconds:.1f} s, {out.peak_mib:.0f} MiB ({out.input_dir}): {out.detail}"
    )
    assert not PWNED.exists(), "a pickle ran code"


def test_every_kind_has_seeds():
    # a kind without seeds would fuzz nothing silently (the Inspector kind waits for its collector);
    # most seeds come from ../shared: without it this skips (CI sets TRACEPROF_REQUIRE_CORPUS: fails)
    case(".")
    corpus(".")
    assert {n for n, s in _SEEDS.items() if not s} <= {"nccl_inspector"}, _SEEDS.keys()
