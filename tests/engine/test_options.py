"""One ``-p`` syntax: ANALYSIS.KEY=VALUE everywhere, the bare KEY=VALUE where the analysis is implied
or for every analysis of the command that takes KEY; config defaults overridden key by key."""

from __future__ import annotations

import pytest

from traceprof.core.errors import UsageError
from traceprof.engine.options import parse, split

REPORT = ["temporal", "overlap", "gaps", "mfu", "stragglers", "whatif"]


def test_split_both_forms():
    assert split("mfu.peak_tflops=312.5") == ("mfu", "peak_tflops", "312.5")  # the value's dot stays
    assert split(" peak-tflops = 312 ") == (None, "peak_tflops", "312")
    assert split("model_flops_per_step=4e13") == (None, "model_flops_per_step", "4e13")
    with pytest.raises(UsageError, match="expected KEY=VALUE or ANALYSIS.KEY=VALUE"):
        split("peak_tflops")


def test_implied_analysis_takes_both_forms():
    one = parse(["peak_tflops=312"], ["mfu"], implied="mfu")
    assert one == parse(["mfu.peak_tflops=312"], ["mfu"], implied="mfu") == {"mfu": {"peak_tflops": "312"}}
    with pytest.raises(UsageError, match="runs no analysis 'gaps'; it runs mfu"):
        parse(["gaps.hta=true"], ["mfu"], implied="mfu")


def test_bare_key_goes_to_every_analysis_that_takes_it():
    # hta is a parameter of temporal, overlap and gaps (of these six), not of mfu, stragglers, whatif
    got = parse(["hta=true"], REPORT)
    assert got == {"temporal": {"hta": "true"}, "overlap": {"hta": "true"}, "gaps": {"hta": "true"}}
    assert parse(["peak_tflops=312"], REPORT) == {"mfu": {"peak_tflops": "312"}}
    # source: stragglers, whatif (and critical_path, not in this scope) take it
    assert set(parse(["source=fr"], REPORT)) == {"stragglers", "whatif"}


def test_unknown_bare_key_lists_the_valid_ones():
    with pytest.raises(UsageError) as e:
        parse(["peak_tflop=312"], REPORT)
    msg = str(e.value)
    assert "no analysis of this command takes 'peak_tflop'" in msg
    assert "mfu.peak_tflops" in msg and "temporal.hta" in msg and "stragglers.alpha" in msg


def test_config_defaults_overridden_key_by_key_and_out_of_scope_left_out():
    defaults = ["mfu.peak_tflops=312", "mfu.dtype=bf16", "gaps.hta=true", "min_cost_pct=2", "nosuch=1"]
    got = parse(["peak_tflops=989"], ["mfu"], implied="mfu", defaults=defaults)
    assert got == {"mfu": {"peak_tflops": "989", "dtype": "bf16"}}  # the CLI's peak, the file's dtype
    # in summary's scope the bare min_cost_pct goes to stragglers (the one of REPORT taking it)
    assert parse([], REPORT, defaults=defaults)["stragglers"] == {"min_cost_pct": "2"}


def test_a_key_given_twice_with_two_values_is_refused():
    # the last one used to win silently: -p peak_tflops=312 -p peak_tflops=989 ran with 989
    with pytest.raises(UsageError) as e:
        parse(["peak_tflops=312", "peak_tflops=989"], ["mfu"], implied="mfu")
    assert (
        str(e.value) == "-p peak_tflops given twice, as 'peak_tflops=312' and 'peak_tflops=989': give it once"
    )
    # under analyze mfu, the bare key and mfu.KEY are one key; '-' and '_' are one spelling
    with pytest.raises(
        UsageError, match=r"^-p mfu.peak_tflops given twice, as 'peak_tflops=312' and 'mfu.peak-tflops=1'"
    ):
        parse(["peak_tflops=312", "mfu.peak-tflops=1"], ["mfu"], implied="mfu")
    with pytest.raises(UsageError, match=r"^-p gaps.hta given twice"):
        parse(["gaps.hta=true", "gaps.hta=false"], REPORT)


def test_the_same_value_twice_is_one_option():
    assert parse(["peak_tflops=312", " peak_tflops = 312 "], ["mfu"], implied="mfu") == {
        "mfu": {"peak_tflops": "312"}
    }


def test_analysis_key_refines_a_bare_key_in_either_order():
    # hta goes to temporal, overlap and gaps; gaps.hta=false sets gaps' alone, whichever comes first
    want = {"temporal": {"hta": "true"}, "overlap": {"hta": "true"}, "gaps": {"hta": "false"}}
    assert parse(["hta=true", "gaps.hta=false"], REPORT) == want
    assert parse(["gaps.hta=false", "hta=true"], REPORT) == want


def test_a_repeated_key_over_a_config_default_is_still_refused():
    # the config file's value is a default, not a repeat; two command-line values are
    assert parse(["peak_tflops=989"], ["mfu"], "mfu", defaults=["mfu.peak_tflops=312"]) == {
        "mfu": {"peak_tflops": "989"}
    }
    with pytest.raises(UsageError, match="given twice"):
        parse(["peak_tflops=989", "peak_tflops=1"], ["mfu"], "mfu", defaults=["mfu.peak_tflops=312"])
