"""GPU prices in USD per GPU-hour (on-demand and spot): a cited default table, overridable by YAML.

The ledger multiplies a worker's $/hour by its lifetime, so these figures decide every
cost the ledger reports. Cloud prices move weekly and differ by region; every default
below is therefore marked `approximate` and names where it was read. Put your real
rates in a YAML file and pass it as `prices_path` (format in `load_prices`).

Default figures (USD per GPU-hour, read 2026-11-29):

| GPU | on-demand | spot | where from |
|---|---|---|---|
| H100 (80 GB) | 5.383 | 2.525 | SkyPilot GCP catalog, us-central1: a3-highgpu-1g host + 1 H100 |
| H200 | 5.408 | 1.460 | AWS EC2 Capacity Blocks effective accelerator rate (US East, Ohio); spot derived |
| A100-80GB | 2.946 | 2.011 | SkyPilot GCP catalog, us-central1: a2-ultragpu-1g host + 1 A100-80GB |
| A100 (40 GB) | 3.673 | 1.443 | SkyPilot GCP catalog, us-central1: a2-highgpu-8g host + 8 A100, per GPU |
| L4 | 0.560 | 0.223 | SkyPilot GCP catalog, us-central1: L4 x8 accelerator rate, per GPU |
| A10G | 1.006 | 0.402 | AWS g5.xlarge on-demand list price, us-east-1; spot derived |

"SkyPilot GCP catalog" is skypilot-org/skypilot-catalog `catalogs/v7/gcp/vms.csv`
(stored copy at commit 017e2502), which lists host VM and GPU prices as separate rows;
we add them. "Spot derived" means on-demand x 0.27 or x 0.40 where no spot figure could
be read offline (0.27 is the midpoint of the 69-77 % spot discount SPOTLIGHT reports).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

_READ_ON = "2026-11-29"
_SKY_GCP = "skypilot-org/skypilot-catalog catalogs/v7/gcp/vms.csv @017e2502, us-central1"


@dataclass(frozen=True)
class GpuPrice:
    """Hourly price of one GPU, with where the figure comes from."""

    on_demand_usd_per_gpu_hour: float
    """Price of reserved / on-demand capacity."""
    spot_usd_per_gpu_hour: float
    """Price of preemptible (spot) capacity."""
    source: str
    """Where the figures were read (or how they were derived)."""
    as_of: str
    """Date the figures were read, ISO format."""
    approximate: bool = True
    """True unless the figure is a rate you actually pay (e.g. from your own YAML)."""

    def __post_init__(self) -> None:
        for name in ("on_demand_usd_per_gpu_hour", "spot_usd_per_gpu_hour"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"GpuPrice.{name} must be a number >= 0, got {value!r}")


DEFAULT_GPU_PRICES: Mapping[str, GpuPrice] = {
    "H100": GpuPrice(1.18251 + 4.20076, 0.27193 + 2.253, f"{_SKY_GCP}: a3-highgpu-1g host + H100 x1", _READ_ON),
    "H200": GpuPrice(
        5.408,
        round(5.408 * 0.27, 3),
        "AWS EC2 Capacity Blocks pricing page (copy in the search corpus): p5e/H200 US East (Ohio) "
        "$5.408 per accelerator-hour, a reservation rate used as the on-demand proxy; spot = x0.27 "
        "(SPOTLIGHT: spot is 69-77 % cheaper)",
        _READ_ON,
    ),
    "A100-80GB": GpuPrice(
        1.09962 + 1.8462, 0.43983 + 1.5712, f"{_SKY_GCP}: a2-ultragpu-1g host + A100-80GB x1", _READ_ON
    ),
    "A100": GpuPrice(
        (5.91582 + 23.47126) / 8, (2.36604 + 9.1776) / 8, f"{_SKY_GCP}: (a2-highgpu-8g host + A100 x8) / 8", _READ_ON
    ),
    "L4": GpuPrice(
        4.48032 / 8,
        1.7848 / 8,
        f"{_SKY_GCP}: L4 x8 accelerator row / 8 (g2 host vCPU and memory not included)",
        _READ_ON,
    ),
    "A10G": GpuPrice(
        1.006,
        round(1.006 * 0.40, 3),
        "AWS EC2 on-demand list price of g5.xlarge (1x A10G), us-east-1, as widely published; "
        "not re-checked offline; spot = x0.40 (typical g5 spot discount, approximate)",
        _READ_ON,
    ),
}


@dataclass(frozen=True)
class PriceTable:
    """GPU type -> price; lookups ignore case ("h100" finds "H100")."""

    gpus: Mapping[str, GpuPrice] = field(default_factory=lambda: dict(DEFAULT_GPU_PRICES))
    """The prices in force."""

    def price(self, gpu_type: str) -> GpuPrice:
        """The entry for `gpu_type`; ValueError naming the known types when absent."""
        by_lower = {name.lower(): name for name in self.gpus}
        name = by_lower.get(str(gpu_type).lower())
        if name is None:
            raise ValueError(
                f"no price for GPU type {gpu_type!r}; known: {sorted(self.gpus)}. Add it to a prices "
                "YAML (see resources/prices.py) or pass usd_per_hour explicitly"
            )
        return self.gpus[name]

    def usd_per_hour(self, gpu_type: str, *, spot: bool, num_gpus: int = 1) -> tuple[float, str]:
        """Hourly price of `num_gpus` GPUs and a one-line description of its source."""
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
        entry = self.price(gpu_type)
        rate = entry.spot_usd_per_gpu_hour if spot else entry.on_demand_usd_per_gpu_hour
        kind = "spot" if spot else "on-demand"
        note = " (approximate)" if entry.approximate else ""
        return rate * num_gpus, f"{gpu_type} {kind} x{num_gpus}{note}: {entry.source}, {entry.as_of}"

    def as_json(self) -> dict[str, Any]:
        """The table as plain data, stored in the ledger's `runs` row for audit."""
        return {name: vars(p) for name, p in sorted(self.gpus.items())}


def catalog_node_usd_per_hour(
    gpus: tuple[str, ...],
    count: int,
    *,
    spot: bool,
    clouds: Any = None,
    list_accelerators: Callable[..., Mapping[str, list]] | None = None,
) -> tuple[float, str] | None:
    """The whole VM's hourly price from SkyPilot's catalog for `count` of one of `gpus` (spot or on-demand): for
    each GPU type the cheapest VM offering it (what SkyPilot's optimizer launches), then the dearest of the types
    (which one is free is not known in advance: the spend cap must not undercount). (usd, source), or None when
    the catalog cannot be read (it downloads its tables: no network) or offers none of them; the caller then
    falls back to the price table. `list_accelerators`: sky.catalog.list_accelerators (a stand-in in tests)."""
    if list_accelerators is None:
        from sky import catalog

        list_accelerators = catalog.list_accelerators
    cheapest = {}
    for gpu in gpus:
        try:
            offers = list_accelerators(
                gpus_only=True,
                name_filter=f"^{gpu}$",
                quantity_filter=count,
                clouds=clouds,
                case_sensitive=False,
                all_regions=True,
            )
        except (OSError, ValueError):  # requests' errors are OSErrors: no network, an unknown cloud
            return None
        prices = [
            (o.spot_price if spot else o.price, f"{o.instance_type} on {o.cloud} ({o.region})")
            for infos in offers.values()
            for o in infos
            if o.accelerator_name.lower() == gpu.lower() and o.accelerator_count == count
        ]
        prices = [(usd, where) for usd, where in prices if usd == usd and usd > 0]  # no NaN (no spot offer)
        if not prices:
            return None
        cheapest[gpu] = min(prices)
    gpu = max(cheapest, key=lambda name: cheapest[name][0])
    usd, where = cheapest[gpu]
    return usd, f"SkyPilot catalog, {'spot' if spot else 'on-demand'} {gpu}:{count}: {where}"


def load_prices(path: str | Path | None = None) -> PriceTable:
    """The default table, with entries from a user YAML file laid over it.

    YAML format (every field optional except that a new GPU needs both prices):

        gpus:
          H100:
            on_demand_usd_per_gpu_hour: 2.99
            spot_usd_per_gpu_hour: 1.20
            source: our 2026 contract
            as_of: "2026-06-01"
    """
    table = dict(DEFAULT_GPU_PRICES)
    if path is None:
        return PriceTable(table)
    import yaml

    text = Path(path).read_text()
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict) or not isinstance(data.get("gpus", {}), dict) or set(data) - {"gpus"}:
        raise ValueError(f"prices file {path}: expected a mapping with one key 'gpus' (GPU type -> prices)")
    allowed = {f for f in GpuPrice.__dataclass_fields__}
    for gpu, fields in data.get("gpus", {}).items():
        if not isinstance(fields, dict) or set(fields) - allowed:
            raise ValueError(f"prices file {path}: entry {gpu!r} must be a mapping with keys from {sorted(allowed)}")
        base = table.get(str(gpu))
        both = {"on_demand_usd_per_gpu_hour", "spot_usd_per_gpu_hour"} <= set(fields)
        if base is not None and not both:  # a partial override keeps the other figure's provenance
            fields = {"source": f"prices file {path} over default ({base.source})", **fields}
        else:
            fields = {"source": f"prices file {path}", "as_of": "", "approximate": False, **fields}
        if base is None and not both:
            raise ValueError(
                f"prices file {path}: new GPU type {gpu!r} needs on_demand_usd_per_gpu_hour and spot_usd_per_gpu_hour"
            )
        table[str(gpu)] = replace(base, **fields) if base else GpuPrice(**fields)
    return PriceTable(table)
