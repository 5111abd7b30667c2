"""Tests of the analyses (analyses/, traceprof.analyses)."""
