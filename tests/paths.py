"""Where the checkout is, for tests that run its commands or read its files (tests live at any depth)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
