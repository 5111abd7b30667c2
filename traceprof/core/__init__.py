"""The ground every layer stands on: the store's schema and vocabularies, values from trace files, errors, table cells and units, files, locks, processes."""
