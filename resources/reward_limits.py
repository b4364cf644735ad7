"""The reward server's limits: one home for each default (`spotlight reward-serve`'s flags read them here).

Plain dataclasses and the standard library only, so the CLI's `--help` imports neither aiohttp nor PIL.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeLimits:
    """The reward server's bounds on time, size and concurrency (`spotlight reward-serve`'s flags)."""

    deadline_s: float = 120.0
    """Seconds a whole request may take from its connection to its answer: headers, body, decoding and scoring."""
    header_timeout_s: float = 10.0
    """Seconds for the TLS handshake, and then for the request's headers (before the token is checked); at most
    deadline_s (a larger value is taken as deadline_s)."""
    max_connections: int = 64
    """Connections served at once; the next ones get a 503 at once."""
    max_request_bytes: int = 512 << 20
    """Largest request body, checked from Content-Length and while it streams."""
    decode_concurrency: int = 4
    """Requests decoded at once (each on its own thread)."""

    def __post_init__(self):
        if not (self.deadline_s > 0 and self.header_timeout_s > 0):
            raise ValueError(
                f"need deadline_s and header_timeout_s > 0, got {self.deadline_s} and {self.header_timeout_s}"
            )
        object.__setattr__(self, "header_timeout_s", min(self.header_timeout_s, self.deadline_s))  # frozen: set once
        if self.max_connections < 1 or self.max_request_bytes < 1 or self.decode_concurrency < 1:
            raise ValueError(
                f"need max_connections, max_request_bytes and decode_concurrency >= 1, got {self.max_connections}, "
                f"{self.max_request_bytes} and {self.decode_concurrency}"
            )


@dataclass(frozen=True)
class ImageLimits:
    """What one scoring request may carry; each is checked before any image is decoded."""

    max_images: int = 256
    """Most images in one request."""
    max_pixels: int = 4096 * 4096
    """Largest image (width x height): a 4096x4096 RGB image is 48 MiB decoded."""
    max_request_pixels: int = 1 << 26
    """Most pixels in one request, all its images together (64 Mi pixels: 192 MiB decoded)."""

    def __post_init__(self):
        if self.max_images < 1 or self.max_pixels < 1 or self.max_request_pixels < 1:
            raise ValueError(
                f"image limits must be >= 1: max_images={self.max_images}, max_pixels={self.max_pixels}, "
                f"max_request_pixels={self.max_request_pixels}"
            )
