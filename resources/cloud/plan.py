"""What `spotlight launch` was asked for (`LaunchPlan`), checked before anything is submitted; resources/cloud/tasks.py
turns a plan into SkyPilot tasks and resources/cloud/__init__.py submits them.

A plan is the run's resolved config tree (`run`: every run setting, resolved as `spotlight config` resolves it) and
the cloud-only options of the launch (how many spot jobs, which accelerators, the spend cap, ...). No run setting is
declared here: the store, the model, the preset and the rest are read from `run`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from resources.prices import PriceTable
from resources.settings.config import RunConfig

RESERVED_CLUSTER = "spotlight-reserved"
"""The reserved node's SkyPilot cluster (`spotlight launch --cluster`)."""
MODEL_SOURCE_SCHEMES = ("s3", "gs", "r2", "cos", "oci", "https")
"""Bucket URLs SkyPilot can copy a file mount from (https: an Azure blob container)."""
AWS_IDENTITIES = ("keys", "service-account", "role:<instance-profile>")
"""How the nodes reach S3 (`spotlight launch --aws-identity`): this machine's AWS keys as secrets, SkyPilot's own IAM
role, or an IAM instance profile of yours. Only `keys` ships AWS_ACCESS_KEY_ID/SECRET to the nodes."""
_IAM_NAME = re.compile(r"[\w+=,.@-]{1,128}")


def configured_aws_identity(remote_identity: object) -> str | None:
    """The --aws-identity that SkyPilot's configured `aws.remote_identity` means: `role:PROFILE`, `service-account`,
    or `keys` where it names LOCAL_CREDENTIALS (a choice made in SkyPilot's config); None where it names none (or a
    per-cluster list, which a launch cannot read for its own nodes)."""
    if not isinstance(remote_identity, str) or not remote_identity:
        return None
    if remote_identity == "LOCAL_CREDENTIALS":
        return "keys"
    return "service-account" if remote_identity == "SERVICE_ACCOUNT" else f"role:{remote_identity}"


NO_IDENTITY = (
    "--aws-identity: no instance role is configured (SkyPilot's aws.remote_identity). Pass one of: "
    "role:PROFILE (recommended: an IAM instance profile limited to the run's bucket), service-account (SkyPilot's "
    "skypilot-v1 role: AmazonS3FullAccess and AmazonEC2FullAccess on the whole account), or keys (this machine's "
    "AWS keys are shipped to every node, spot VMs included); or set aws.remote_identity in ~/.sky/config.yaml"
)
"""Why a launch with the default --aws-identity (auto) and nothing configured is refused: keys only by choice."""


class CloudError(RuntimeError):
    """The cloud path cannot go on; the message says what to fix (and nothing was submitted unless it says so)."""


@dataclass(frozen=True)
class LaunchPlan:
    """What `spotlight launch` was asked for."""

    spot_workers: int
    """Spot rollout workers (or SP nodes), one managed job each."""
    run: RunConfig = field(default_factory=RunConfig)
    """The run's resolved config tree, before the cloud places it (resources/cloud/tasks.py, `placed_run_config`)."""
    gpus: tuple[str, ...] = ()
    """Accelerators a spot worker may get (any one of them); () = the YAML's any_of list."""
    max_usd: float = 100.0
    """Spend cap: the coordinator stops, and spot jobs stop recovering, once the ledger's spend reaches it."""
    cluster: str = RESERVED_CLUSTER
    model_source: str | None = None
    """A bucket URL holding that folder (s3://bucket/models/Qwen-Image): mounted (copied) at `model` on every node.
    None: the nodes hold it another way (an image, a file_mounts of your own)."""
    sp_degree: int | str | None = None
    """SP nodes: every spot job runs the SP node agent, sampling each request in Ulysses groups of this many GPUs,
    or "auto" (per round, for the queue's backlog). None or 1: one rollout worker per job, on one GPU."""
    gpus_per_node: int | None = None
    """GPUs of each SP node; None: the sp_degree (one group per node). Only with an sp_degree."""
    reserved_gpus: str | None = None
    """The reserved node's accelerators, NAME:COUNT (H100:8); None: sky/reserved.yaml's. Priced on-demand."""
    aws_identity: str = "keys"
    """How the nodes reach S3: "keys" (AWS_ACCESS_KEY_ID/SECRET as secrets), "service-account" (SkyPilot's IAM role)
    or "role:PROFILE" (an IAM instance profile): SkyPilot's aws.remote_identity, and no AWS keys on any node."""
    env_cache: bool = True
    """Mount the store's env-cache/ on every node: sky/setup.sh restores the venv from there instead of installing."""
    public_queue: bool = False
    """Open the reserved node's Redis port to the internet (SkyPilot's `ports:`, 0.0.0.0/0), with mutual TLS: every
    worker shows a client certificate of the run's CA. False: workers reach it on its private address only (same
    cloud, region and security group as the node; the port is never opened)."""

    def __post_init__(self) -> None:
        self._check_model()
        self._check_sp()
        self._check_reserved_and_identity()
        if isinstance(self.spot_workers, bool) or not isinstance(self.spot_workers, int) or self.spot_workers < 1:
            raise ValueError(f"--spot-workers must be an integer >= 1, got {self.spot_workers!r}")
        store = self.run.deployment.store or ""
        if not store.startswith("s3://") or len(store) <= len("s3://"):
            raise ValueError(
                f"--store (deployment.store) must be s3://bucket/prefix (every node reads and writes it), got {store!r}"
            )
        if not self.max_usd > 0:
            raise ValueError(f"--max-usd must be a positive number of dollars, got {self.max_usd!r}")
        known = PriceTable().gpus
        unknown = [g for g in self.gpus if g not in known]
        if unknown or len(set(self.gpus)) != len(self.gpus):
            raise ValueError(
                f"--gpu {','.join(self.gpus)}: give distinct accelerator names from "
                f"{', '.join(sorted(known))} (comma-separated; add others to a prices file)"
            )

    @property
    def store(self) -> str:
        """The tensor store every node shares (the run's deployment.store): s3://bucket/prefix."""
        return self.run.deployment.store or ""

    @property
    def model(self) -> str | None:
        """The diffusers pipeline folder the run trains (model.model), an absolute path every node holds."""
        return self.run.model.model

    @property
    def remote_identity(self) -> str | None:
        """SkyPilot's aws.remote_identity for this launch; None: keys (SkyPilot's config is left as it is)."""
        if self.aws_identity == "keys":
            return None
        return "SERVICE_ACCOUNT" if self.aws_identity == "service-account" else self.aws_identity[len("role:") :]

    @property
    def reserved_accelerators(self) -> tuple[str, int] | None:
        """--reserved-gpus as (name, count); None: the YAML's."""
        if self.reserved_gpus is None:
            return None
        name, _, count = self.reserved_gpus.partition(":")
        return name, int(count or 1)

    def _check_reserved_and_identity(self) -> None:
        if self.reserved_gpus is not None:
            name, _, count = self.reserved_gpus.partition(":")
            if name not in PriceTable().gpus or not (count or "1").isdigit() or int(count or 1) < 1:
                raise ValueError(
                    f"--reserved-gpus must be NAME[:COUNT] with NAME one of {', '.join(sorted(PriceTable().gpus))} "
                    f"and COUNT >= 1, got {self.reserved_gpus!r}"
                )
        identity = self.aws_identity
        role = identity.startswith("role:") and _IAM_NAME.fullmatch(identity[len("role:") :])
        if identity not in ("keys", "service-account") and not role:
            raise ValueError(
                f"--aws-identity must be one of {', '.join(AWS_IDENTITIES)} (an IAM instance profile name: letters, "
                f"digits and +=,.@_-), got {identity!r}"
            )

    @property
    def node_gpus(self) -> int:
        """GPUs each spot job asks for: 1 for a rollout worker, the node's for an SP node."""
        return self.gpus_per_node or (self.sp_degree if isinstance(self.sp_degree, int) else 1)

    def _check_sp(self) -> None:
        degree, gpus = self.sp_degree, self.gpus_per_node
        if (
            degree is not None
            and degree != "auto"
            and (isinstance(degree, bool) or not isinstance(degree, int) or degree < 1)
        ):
            raise ValueError(f"--sp-degree must be an integer >= 1 or auto, got {degree!r}")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
            raise ValueError(f"--gpus-per-node must be an integer >= 1, got {gpus!r}")
        if degree in (None, 1):
            if gpus not in (None, 1):
                raise ValueError(
                    f"--gpus-per-node {gpus} needs --sp-degree: a rollout worker samples on one GPU "
                    "(launch more --spot-workers instead, or SP nodes with --sp-degree 2..8 or auto)"
                )
        elif degree == "auto":
            if gpus is None or gpus < 2:
                raise ValueError("--sp-degree auto needs --gpus-per-node N >= 2: the GPUs the node agent groups")
        elif self.node_gpus % degree:
            raise ValueError(
                f"--sp-degree {degree} must divide --gpus-per-node {self.node_gpus}: the node's GPUs form "
                f"groups of {degree}, and the rest would idle at full price"
            )

    def _check_model(self) -> None:
        if self.model is not None and self.model.rstrip("/") == "":
            raise ValueError(f"--model {self.model!r} must be a folder holding a diffusers pipeline")
        if self.model_source is None:
            return
        if self.model is None:
            raise ValueError("--model-source needs --model: the absolute path the weights are mounted at on every node")
        scheme, sep, rest = self.model_source.partition("://")
        if not sep or scheme not in MODEL_SOURCE_SCHEMES or not rest.strip("/"):
            raise ValueError(
                f"--model-source {self.model_source!r} must be a bucket URL, "
                f"{' or '.join(s + '://...' for s in MODEL_SOURCE_SCHEMES)}"
            )
