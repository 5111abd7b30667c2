"""Rendering: the HTML report, its plots, exports to other tools, the generated analysis reference."""
