"""Fuzz session summary: how many inputs every decoder was fed (settings: tests/fuzz/fuzzing.py)."""

from __future__ import annotations

from tests.fuzz.fuzzing import EXAMPLES, INPUTS


def pytest_terminal_summary(terminalreporter) -> None:
    if INPUTS:
        per = ", ".join(f"{name} {n}" for name, n in sorted(INPUTS.items()))
        terminalreporter.write_line(
            f"fuzz inputs: {sum(INPUTS.values())} ({per}); max_examples {EXAMPLES} per property"
        )
