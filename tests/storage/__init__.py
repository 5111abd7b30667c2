"""Tests of the store (traceprof.storage)."""
