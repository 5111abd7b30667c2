"""Analyses: one module per diagnosis, each registering ``run(store, params) -> Result``.

Importing this package imports no analysis; ``traceprof.engine.analysis.load_all()`` does.
"""
