"""Tests of the collectors (collectors/, traceprof.collectors)."""
