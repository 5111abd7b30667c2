"""Tests of rendering (traceprof.render)."""
