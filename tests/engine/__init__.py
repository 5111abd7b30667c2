"""Tests of the engine (traceprof.engine)."""
