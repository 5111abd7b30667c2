"""Tests of ingest (traceprof.ingest)."""
