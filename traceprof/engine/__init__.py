"""The analysis engine: the analysis specs and registry, the session, the shared interval and activity algebra, findings, verdicts, the regression gate."""
