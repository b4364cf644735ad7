"""What a launch's nodes cost per hour, from SkyPilot's catalog on the enabled clouds: each spot worker, and the
reserved node together with the managed-jobs controller VM (both bill for the whole run), for the ledger and the cap.
Where the catalog cannot be read (it downloads its tables) the price table applies, and the echo says so."""

from __future__ import annotations

from typing import Any, Callable

from resources.cloud.plan import LaunchPlan
from resources.cloud.tasks import CONTROLLER_FALLBACK, reserved_accelerators, reserved_table_usd_per_hour, worker_gpus
from resources.prices import catalog_node_usd_per_hour


def catalog_price(plan: LaunchPlan, clouds: list[str], echo: Callable[[str], None] = print) -> float | None:
    """A spot node's $/hour from SkyPilot's catalog on the enabled clouds (resources.prices), or None (the price
    table then applies, as in --dry-run) when the catalog cannot be read; says which."""
    found = catalog_node_usd_per_hour(worker_gpus(plan), plan.node_gpus, spot=True, clouds=[c.lower() for c in clouds])
    if found is None:
        echo("spot workers priced from the price table (SkyPilot's catalog could not be read or lists none)")
        return None
    echo(f"spot workers priced at ${found[0]:.4f}/h: {found[1]}")
    return found[0]


def reserved_price(task: Any, clouds: list[str], echo: Callable[[str], None] = print) -> float:
    """The reserved node's on-demand $/hour for the instance its task asks for, plus the jobs controller's: the
    cheapest VM with those GPUs in SkyPilot's catalog (what its optimizer launches), else the price table's GPUs."""
    name, count = reserved_accelerators(task)
    lowered = [c.lower() for c in clouds]
    node = catalog_node_usd_per_hour((name,), count, spot=False, clouds=lowered)
    if node is None:
        node = (reserved_table_usd_per_hour(task), f"the price table's {name}:{count} on-demand (catalog not read)")
    controller = controller_usd_per_hour(lowered) or CONTROLLER_FALLBACK
    total = round(node[0] + controller[0], 6)
    echo(
        f"reserved node priced at ${total:.4f}/h: ${node[0]:.4f} ({node[1]}) + jobs controller ${controller[0]:.4f} "
        f"({controller[1]})"
    )
    return total


def controller_resources() -> dict[str, Any]:
    """The managed-jobs controller's resources as SkyPilot launches it: its defaults (4+ vCPUs, 4x memory) with
    `jobs.controller.resources` of SkyPilot's config laid over them."""
    from sky.jobs import constants

    from sky import skypilot_config

    return {
        **constants.CONTROLLER_RESOURCES,
        **(skypilot_config.get_nested(("jobs", "controller", "resources"), None) or {}),
    }


def controller_usd_per_hour(
    clouds: list[str],
    default_instance_type: Callable[..., str | None] | None = None,
    hourly_cost: Callable[..., float] | None = None,
) -> tuple[float, str] | None:
    """The jobs controller VM's on-demand $/hour: its instance type (the config's, or SkyPilot's default for its vCPUs
    and memory on each cloud), the cheapest over `clouds`; None when the catalog cannot be read."""
    if default_instance_type is None or hourly_cost is None:
        from sky import catalog

        default_instance_type, hourly_cost = catalog.get_default_instance_type, catalog.get_hourly_cost
    config = controller_resources()
    offers = []
    for cloud in clouds:
        try:
            instance = config.get("instance_type") or default_instance_type(
                cpus=str(config.get("cpus")), memory=str(config.get("memory")), clouds=cloud
            )
            if instance is None:
                continue
            usd = hourly_cost(instance, use_spot=bool(config.get("use_spot")), region=None, zone=None, clouds=cloud)
        except (OSError, ValueError):  # no network (the catalog downloads its tables), a cloud it does not list
            continue
        if usd == usd and usd > 0:
            offers.append((round(float(usd), 6), f"SkyPilot catalog, jobs controller {instance} on {cloud}"))
    return min(offers) if offers else None
