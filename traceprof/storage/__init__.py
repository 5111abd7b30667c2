"""The DuckDB store: opening, layouts, transactions, runs and baseline sets, read-only SQL."""
