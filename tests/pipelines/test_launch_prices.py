"""What a launch's nodes are priced at for the ledger and the spend cap: spot workers, the reserved node and the jobs
controller VM, from SkyPilot's catalog (a stand-in built from its `InstanceTypeInfo` rows: the catalog downloads its
tables) or, without it, the price table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipelines.sky_fakes import invoke as _invoke
from tests.pipelines.sky_fakes import offer


def test_launch_prices_spot_workers_from_skypilots_catalog_and_falls_back_to_the_table(
    fake_sky, reserved_redis
) -> None:
    """The dearest of the allowed types' cheapest VMs (any_of: which type is free is not known) on the cloud the
    workers start in (a private queue's: the reserved node's, AWS here); without the catalog (no network) the price
    table's dearest type, never the YAML's flat $0.50."""
    from resources.prices import PriceTable

    fake_sky.catalog = {
        "L4": [offer("AWS", "g6.xlarge", "L4", 1, 0.80, 0.31), offer("GCP", "g2-standard-4", "L4", 1, 0.71, 0.28)],
        "A10G": [offer("AWS", "g5.xlarge", "A10G", 1, 1.01, 0.45)],
        "A100": [
            offer("GCP", "a2-highgpu-1g", "A100", 1, 3.67, 1.47),
            offer("AWS", "p4de.a100x1", "A100", 1, 4.10, 1.60),
            offer("GCP", "a2-highgpu-2g", "A100", 2, 7.35, float("nan")),
        ],
        "H100": [
            offer("AWS", "p5.4xlarge", "H100", 1, 6.88, 2.90),
            offer("GCP", "a3-highgpu-1g", "H100", 1, 5.38, 2.53),
        ],
    }
    result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    (task, _), _ = [c[1:] for c in fake_sky.calls if c[0] == "jobs.launch"][0]
    assert float(task.envs["USD_PER_HOUR"]) == 2.90 and "p5.4xlarge on AWS" in result.output  # not GCP's 2.53
    fake_sky.catalog, fake_sky.calls, fake_sky.jobs = None, [], []
    result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p", "--gpu", "L4,A10G")
    (task, _), _ = [c[1:] for c in fake_sky.calls if c[0] == "jobs.launch"][0]
    assert "priced from the price table" in result.output
    assert float(task.envs["USD_PER_HOUR"]) == pytest.approx(
        max(PriceTable().usd_per_hour(g, spot=True)[0] for g in ("L4", "A10G"))
    )


def test_the_catalog_price_is_the_cheapest_vm_of_the_dearest_type_and_none_without_the_catalog() -> None:
    import requests

    from resources.prices import catalog_node_usd_per_hour

    offers = {
        "L4": [offer("AWS", "g6.12xlarge", "L4", 4, 4.6, 1.9), offer("GCP", "g2-standard-48", "L4", 4, 4.0, 1.6)],
        "A100": [offer("GCP", "a2-highgpu-4g", "A100", 4, 14.7, float("nan"))],
    }  # no spot offer

    def listing(**kwargs):
        return {k: v for k, v in offers.items() if k.lower() in kwargs["name_filter"].lower()}

    assert catalog_node_usd_per_hour(("L4",), 4, spot=True, list_accelerators=listing) == (
        1.6,
        "SkyPilot catalog, spot L4:4: g2-standard-48 on GCP (us-east-1)",
    )
    assert catalog_node_usd_per_hour(("L4", "A100"), 4, spot=False, list_accelerators=listing)[0] == 14.7
    assert catalog_node_usd_per_hour(("L4", "A100"), 4, spot=True, list_accelerators=listing) is None
    assert catalog_node_usd_per_hour(("H100",), 1, spot=True, list_accelerators=listing) is None

    def offline(**kwargs):
        raise requests.exceptions.ConnectionError("Failed to fetch GCP catalog gcp/vms.csv")

    assert catalog_node_usd_per_hour(("L4",), 1, spot=True, list_accelerators=offline) is None


CATALOG = {
    "L4": [offer("AWS", "g6.xlarge", "L4", 1, 0.80, 0.31), offer("GCP", "g2-standard-4", "L4", 1, 0.71, 0.28)],
    "H100": [
        offer("AWS", "p5.48xlarge", "H100", 8, 98.32, 39.0),
        offer("GCP", "a3-highgpu-8g", "H100", 8, 88.25, 30.1),
    ],
}
CONTROLLER = {"aws": ("m6i.xlarge", 0.192), "gcp": ("n2-standard-4", 0.194)}


def _reserved(fake_sky):
    ((task, _),) = [c[1] for c in fake_sky.calls if c[0] == "launch"]
    return task


def _node_price(task) -> float:
    """The reserved node's price in the run's config file the task mounts (what its spotlight run reads)."""
    import yaml

    shipped = task.file_mounts["~/" + task.envs["RUN_CONFIG"]]
    return yaml.safe_load(Path(shipped).read_text())["deployment"]["reserved_usd_per_hour"]


def test_the_reserved_node_is_priced_as_launched_with_the_jobs_controller_and_handed_to_spotlight_run(
    fake_sky, reserved_redis, tmp_path
) -> None:
    """The cheapest on-demand VM with the reserved task's GPUs (the YAML's, or --reserved-gpus), plus SkyPilot's jobs
    controller VM (its default resources, cheapest over the enabled clouds): the ledger's trainer rows and the cap."""
    import os

    from tests.pipelines.sky_blocks import stub_run

    fake_sky.clouds, fake_sky.catalog, fake_sky.controller = ["AWS", "GCP"], CATALOG, CONTROLLER
    result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    assert _node_price(_reserved(fake_sky)) == pytest.approx(0.71 + 0.192)
    assert "g2-standard-4 on GCP" in result.output and "jobs controller m6i.xlarge on aws" in result.output
    fake_sky.calls.clear()
    result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p", "--reserved-gpus", "H100:8")
    assert result.exit_code == 0, result.output
    reserved = _reserved(fake_sky)
    ((resources),) = reserved.resources
    assert resources.accelerators == {"H100": 8} and resources.autostop_config.down and not resources.ports
    assert _node_price(reserved) == pytest.approx(88.25 + 0.192)
    reserved.update_envs({"RUN_DIR": str(tmp_path / "run")})
    home = {**os.environ, "HOME": str(tmp_path)}
    (run,) = [argv for argv in stub_run(reserved, tmp_path, home) if argv[2:4] == ["pipelines.cli", "run"]]
    assert run[run.index("--config") + 1] == str(tmp_path / reserved.envs["RUN_CONFIG"])  # the mount's path


def test_without_the_catalog_the_reserved_node_is_priced_from_the_table_and_a_stand_in_controller(
    fake_sky, reserved_redis
) -> None:
    from resources.cloud.tasks import CONTROLLER_FALLBACK
    from resources.prices import PriceTable

    result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p", "--reserved-gpus", "A100:2")
    assert result.exit_code == 0, result.output
    expected = PriceTable().usd_per_hour("A100", spot=False, num_gpus=2)[0] + CONTROLLER_FALLBACK[0]
    assert _node_price(_reserved(fake_sky)) == pytest.approx(expected)
    assert "the price table's A100:2 on-demand (catalog not read)" in result.output


def test_the_jobs_controller_is_priced_from_skypilots_config_when_it_names_its_resources() -> None:
    from resources.cloud.pricing import controller_resources, controller_usd_per_hour
    from sky import skypilot_config

    asked = []

    def default_instance_type(cpus=None, memory=None, clouds=None, **_):
        asked.append((cpus, memory, clouds))
        return {"aws": "m6i.2xlarge", "gcp": "n2-standard-8"}[clouds]

    def hourly_cost(instance_type, use_spot, region, zone, clouds=None):
        return {"m6i.2xlarge": 0.384, "n2-standard-8": 0.389, "t3.large": 0.0832}[instance_type]

    config = skypilot_config.to_dict()
    config.set_nested(("jobs", "controller", "resources"), {"cpus": "8+"})
    with skypilot_config.replace_skypilot_config(config):
        assert controller_resources()["cpus"] == "8+" and controller_resources()["memory"] == "4x"
        assert controller_usd_per_hour(["aws", "gcp"], default_instance_type, hourly_cost) == (
            0.384,
            "SkyPilot catalog, jobs controller m6i.2xlarge on aws",
        )
    assert asked == [("8+", "4x", "aws"), ("8+", "4x", "gcp")]
    config.set_nested(("jobs", "controller", "resources"), {"instance_type": "t3.large"})
    with skypilot_config.replace_skypilot_config(config):
        assert controller_usd_per_hour(["aws"], default_instance_type, hourly_cost)[0] == 0.0832


def test_spotlight_run_hands_the_reserved_price_it_is_given_to_the_runs_config_which_the_ledger_reads() -> None:
    from assets.context import run_context
    from tests.runs import run_resources

    priced = run_resources(Path("/tmp/spotlight-price-check"), "inprocess", reserved_usd_per_hour=12.5)
    assert run_context(**priced).reserved_usd_per_hour == 12.5
    default = run_resources(Path("/tmp/spotlight-price-check"), "inprocess")
    assert run_context(**default).reserved_usd_per_hour == 0.10
    with pytest.raises(ValueError, match="--reserved-usd-per-hour: deployment.reserved_usd_per_hour: Input should be"):
        run_resources(Path("/tmp/spotlight-price-check"), reserved_usd_per_hour=-1.0)
