"""Ingest: the collector registry, parsing in processes or on Dask, collective matching, clock alignment."""
