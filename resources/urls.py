"""URL helpers shared by the store and queue URL parsers."""

from __future__ import annotations


def is_plain_path(text: str, scheme: str) -> bool:
    """True for a URL that is a plain path: no scheme, or a Windows drive letter (C:\\ or C:/)."""
    return scheme == "" or (len(scheme) == 1 and text[1:3] in (":\\", ":/"))
