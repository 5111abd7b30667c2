"""traceprof's tests: a folder per package (core, storage, ingest, collectors, engine, analyses, render, cli);
micro-traces come from ``tests.builders``, shared fixtures from ``tests.conftest``."""
