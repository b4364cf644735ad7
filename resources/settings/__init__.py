"""The run's settings: one typed config tree (config.py), its leaves with the names they go by (fields.py), and its
resolution from a preset, files, SPOTLIGHT_* variables and flags (resolve.py). It lives at the bottom layer so that
every room may read it, and imports only pydantic, PyYAML and the standard library so that `spotlight --help` stays
quick.

Example:
    from resources.settings.config import RunConfig
    from resources.settings.resolve import resolve, file_layer, flag_layer
"""

from resources.settings.base import ROLLOUT_MODES, Advantage, OnHacking, SamplingMode, SyncMode

__all__ = ["ROLLOUT_MODES", "Advantage", "OnHacking", "SamplingMode", "SyncMode"]
