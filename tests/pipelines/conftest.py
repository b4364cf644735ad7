"""Fixtures of the pipelines tests: SkyPilot's API server and the reserved node's Redis, stood in for
(tests/pipelines/sky_fakes.py)."""

from tests.pipelines.sky_fakes import fake_sky, reserved_redis  # noqa: F401 (pytest finds fixtures here)
