"""Steps of `spotlight launch` (pipelines/launch_cli.py) that need no typer: its own flags' checks, the nodes' AWS
identity, the reward token a remote reward needs, the run's keys kept on this machine, and `--print-env`.

Only the standard library at import time (SkyPilot loads inside the functions), so `spotlight launch --help` stays
instant.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Optional

_URL_HOST = re.compile(r"https?://(\[[^\]]*\]|[^/:?#+\s]+)")


def spot_workers(spot_workers: Optional[int], extra: list[str]) -> int:
    """--spot-workers, required; ValueError naming the old --workers flag among the extra arguments."""
    if "--workers" in extra or any(a.startswith("--workers=") for a in extra):
        raise ValueError(
            "--workers was renamed --spot-workers (spot jobs); the reserved node's own worker processes are "
            "--local-workers"
        )
    if spot_workers is None:
        raise ValueError("--spot-workers N is required: the spot rollout workers, one managed job each")
    return spot_workers


def check_reward_chosen(plan) -> None:
    """A preset that names no reward (the GPU presets) needs --reward: refused here, before any node bills, rather
    than by `spotlight run` on the reserved node."""
    from workers.trainer.train_config import NO_REWARD

    if plan.run.train.reward == NO_REWARD:
        raise ValueError(
            f"preset {plan.run.preset!r} names no reward: pass --reward SPEC (or train.reward in --config), e.g. "
            "http://HOST:8200 (a spotlight reward-serve server); docs/MODELS.md, Rewards"
        )


def sp_degree(text: Optional[str]):
    """--sp-degree: None, "auto" or an integer (LaunchPlan checks its range)."""
    if text is None or text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--sp-degree must be an integer >= 1 or auto, got {text!r}") from None


def aws_identity(choice: str) -> str:
    """--aws-identity as given, or for `auto` what SkyPilot's config names (aws.remote_identity); ValueError (keys
    only by choice) where it names nothing."""
    from resources.cloud.network import configured_identity
    from resources.cloud.plan import NO_IDENTITY

    if choice != "auto":
        return choice
    configured = configured_identity()
    if configured is None:
        raise ValueError(NO_IDENTITY)
    return configured


def remote_reward_hosts(spec: str) -> list[str]:
    """The hosts of every remote reward (http(s)://HOST...) a reward spec names, loopback ones included."""
    return [host.strip("[]") for host in _URL_HOST.findall(spec)]


def check_reward_token(plan, secrets: Mapping[str, str]) -> None:
    """CloudError when the run scores with a remote reward off loopback and SPOTLIGHT_REWARD_TOKEN is not set here:
    reward-serve refuses every request without it (401), and the nodes get it only from this machine."""
    from resources.cloud import CloudError
    from resources.cloud.tasks import REWARD_TOKEN_ENV
    from resources.reward_server import is_loopback

    remote = [h for h in remote_reward_hosts(plan.run.train.reward or "") if not is_loopback(h)]
    if remote and not secrets.get(REWARD_TOKEN_ENV):
        raise CloudError(
            f"the reward is served at {', '.join(remote)}: set {REWARD_TOKEN_ENV} here to the token its "
            "`spotlight reward-serve` has (the nodes get it as a SkyPilot secret; without it every request "
            "gets a 401)"
        )


def run_keys(secrets: Mapping[str, str], cluster: str, throwaway: bool) -> dict[str, str]:
    """The launch secrets plus the run's TLS material and env-cache keys, kept 0600 on this machine so a relaunch
    reuses them (`throwaway`: made fresh and kept nowhere, for a dry run)."""
    from resources.cloud import env_signing, tls_folder, with_env_signing, with_run_tls
    from resources.cloud.env_pin import make_env_signing
    from resources.queue.redis_tls import make_run_tls, run_tls

    if throwaway:
        return with_env_signing(with_run_tls(secrets, make_run_tls()), make_env_signing())
    folder = tls_folder(cluster)
    return with_env_signing(with_run_tls(secrets, run_tls(folder)), env_signing(folder.parent / "env-signing"))


def print_env(plan, secrets: Mapping[str, str], echo: Callable[[str], None]) -> None:
    """`--print-env`: write each task's env and secret files and echo the `sky` commands; the spot workers' once
    SkyPilot knows the reserved node (its private address, cloud and region)."""
    from resources.cloud import CloudError, node_place, run_config_folder
    from resources.cloud.by_hand import by_hand_commands
    from resources.cloud.network import public_endpoint

    if not secrets:
        raise CloudError("--print-env writes the secrets the tasks need: set them first (see the message above)")
    try:
        place = node_place(plan.cluster)
        host = public_endpoint(plan.cluster) if plan.public_queue else None
    except CloudError as err:
        echo(f"# the reserved node is not up ({err})")
        place, host = None, None
    for line in by_hand_commands(plan, secrets, run_config_folder(plan.cluster), place, host):
        echo(line)
