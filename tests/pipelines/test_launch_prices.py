"""What a launch's nodes are priced at for the ledger and the spend cap: spot workers, the reserved node and the jobs
controller VM, from SkyPilot's catalog (a stand-in built from its `InstanceTypeInfo` rows: the catalog downloads its
tables) or, without it, the price table."""

from __future__ import annotations

import pytest

from tests.pipelines.sky_fakes import invoke as _invoke
from tests.pipelines.sky_fakes import offer


def test_launch_prices_spot_workers_from_skypilots_catalog_and_falls_back_to_the_table(
    fake_sky, reserved_redis
) -> None:
    """The dearest of the allowed types' cheapest VMs (any_of: which type is free is not known); without the catalog
    (no network) the price table's dearest type, never the YAML's flat $0.50."""
    from resources.prices import PriceTable

    fake_sky.catalog = {
        "L4": [offer("AWS", "g6.xlarge", "L4", 1, 0.80, 0.31), offer("GCP", "g2-standard-4", "L4", 1, 0.71, 0.28)],
        "A10G": [offer("AWS", "g5.xlarge", "A10G", 1, 1.01, 0.45)],
        "A100": [
            offer("GCP", "a2-highgpu-1g", "A100", 1, 3.67, 1.47),
            offer("GCP", "a2-highgpu-2g", "A100", 2, 7.35, float("nan")),
        ],
        "H100": [
            offer("AWS", "p5.4xlarge", "H100", 1, 6.88, 2.90),
            offer("GCP", "a3-highgpu-1g", "H100", 1, 5.38, 2.53),
        ],
    }
    result = _invoke("launch", "--workers", "1", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    (task, _), _ = [c[1:] for c in fake_sky.calls if c[0] == "jobs.launch"][0]
    assert float(task.envs["USD_PER_HOUR"]) == 2.53 and "a3-highgpu-1g on GCP" in result.output
    fake_sky.catalog, fake_sky.calls = None, []
    result = _invoke("launch", "--workers", "1", "--store", "s3://b/p", "--gpu", "L4,A10G")
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
