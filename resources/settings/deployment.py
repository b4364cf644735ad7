"""The settings of where a run's resources live and who samples: `spotlight run`'s store, queue and worker pool, the
Dagster deployment's variables, and RunConfigResource fields no command sets."""

from __future__ import annotations

from typing import Optional

from resources.settings.base import Deployment, RunRollouts, SamplingMode
from resources.settings.base import setting as _s

DEPLOYMENT = (
    _s(
        "store",
        Optional[str],
        None,
        "Tensor store: a folder or s3://bucket/prefix (default: RUN_DIR/store). S3 endpoint and credentials come "
        "from boto3's configuration (AWS_ENDPOINT_URL, AWS_PROFILE, ...).",
        commands=("run",),
        resource=False,
    ),
    _s(
        "queue",
        Optional[str],
        None,
        "Request queue: a SQLite file or redis://host:port/db (default: RUN_DIR/queue.db).",
        commands=("run",),
        resource=False,
    ),
    _s(
        "rollouts",
        RunRollouts,
        "local_pool",
        "Who samples: local_pool (rollout worker processes on this machine for the whole run, spot-priced, with "
        "injected preemptions) or inprocess (the trainer itself, batched; no workers). local_cluster, the old "
        "name of local_pool, is still read.",
        commands=("run",),
        env="",
        resource=False,
    ),
    _s(
        "num_workers",
        int,
        2,
        "local_pool: rollout worker processes, one torch thread each (0 on a Redis --queue: remote workers "
        "sample everything).",
        commands=("run",),
        flag="--workers",
        env="",
        resource=False,
    ),
    _s(
        "preemptions_per_hour",
        float,
        12.0,
        "local_pool: preemptions per spot worker-hour, Poisson (0 = none); --notice-share of them with notice.",
        commands=("run",),
        env="",
        resource=False,
        bounds={"ge": 0},
    ),
    _s(
        "notice_share",
        float,
        0.5,
        "local_pool: share of the injected preemptions that come with a 2 s notice (SIGTERM: the worker commits "
        "its request and hands it back); the rest are SIGKILLs, whose requests wait for their lease to expire.",
        commands=("run",),
        env="",
        resource=False,
        bounds={"ge": 0, "le": 1},
    ),
    # The Dagster deployment's own settings (pipelines/deploy.py), and RunConfigResource fields no command sets.
    _s(
        "deployment",
        Deployment,
        "local",
        "local (files on this machine) or cloud (S3 + Redis + spot workers on SkyPilot).",
        commands=(),
        resource=False,
    ),
    _s(
        "run_dir",
        str,
        "runs/dagster",
        "Folder of the ledger, the report and (locally) the store and the queue.",
        commands=(),
        resource=False,
    ),
    _s(
        "run",
        str,
        "demo",
        "Run name: the store prefix runs/{run}/ and the ledger's run_id (default: the run folder's name).",
        commands=(),
    ),
    _s(
        "ledger",
        Optional[str],
        None,
        "The ledger's DuckDB file (default: RUN_DIR/ledger.duckdb).",
        commands=(),
        resource=False,
    ),
    _s(
        "sampling",
        Optional[SamplingMode],
        None,
        "Who samples each rollout phase: inprocess (local default), local_cluster (worker processes started per "
        "phase) or workers (spot workers from sky/spot_workers.yaml pull from the queue; cloud default).",
        commands=(),
        env="SPOTLIGHT_ROLLOUTS",
        resource=False,
    ),
    _s(
        "anchor_every",
        int,
        10,
        "A full BF16 anchor every this many weight versions.",
        commands=(),
        env="",
        bounds={"ge": 1},
    ),
    _s(
        "report_every",
        Optional[int],
        None,
        "Rewrite the report folder and draw sample grids every this many iterations and on the final one "
        "(default: the preset's validate_every, at most 5; each rewrite costs about a second on 2 CPU cores).",
        commands=(),
        env="",
        bounds={"ge": 1},
    ),
    _s(
        "max_validation_drop",
        float,
        0.25,
        "Validation check fails when the held-out score falls more than this below the base's.",
        commands=(),
        env="",
        bounds={"ge": 0},
    ),
    _s(
        "reserved_usd_per_hour",
        float,
        0.10,
        "The reserved node's price in USD per hour (trainer + coordinator): the ledger's trainer rows and so the "
        "spend cap (spotlight launch passes SkyPilot's catalog price of the node plus the jobs controller).",
        commands=("run",),
        env="",
        bounds={"ge": 0},
    ),
)
