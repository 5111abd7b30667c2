"""Collectors: one package or module per trace source, each able to capture and parse its files.

Only collectors know a source's field names; they hand :class:`traceprof.core.parsed.ParsedTrace`
objects to the store.
"""
