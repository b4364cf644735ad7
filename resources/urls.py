"""URL helpers shared by the store and queue URL parsers."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse


def is_plain_path(text: str, scheme: str) -> bool:
    """True for a URL that is a plain path: no scheme, or a Windows drive letter (C:\\ or C:/)."""
    return scheme == "" or (len(scheme) == 1 and text[1:3] in (":\\", ":/"))


def absolute_url(url: str | Path) -> str:
    """A relative local path made absolute against this process's working directory; anything else unchanged.

    Call it before a path crosses a process boundary (a command line, a spec file, run.json): a
    child started in another directory would read a relative path against its own. URLs with a
    scheme (redis://, rediss://, s3://, and sqlite:/// or file:/// which must already be absolute)
    and Windows drive paths pass through as they are; bad ones are left for the parsers to refuse.
    """
    text = str(url)
    if not text or urlparse(text).scheme != "":
        return text
    return str(Path(text).expanduser().resolve())
