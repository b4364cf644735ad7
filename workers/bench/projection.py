"""A PROJECTION (not a measurement) of re-form times for a 20B DiT on one 8-GPU NVLink node.

Inputs measured on this machine: the rendezvous seconds of each path and the naive
path's process start (Python, torch, diffusers imports). Inputs assumed, with sources:

- weights: 20e9 parameters x 2 bytes (BF16) = 40 GB per GPU. Source: Qwen-Image is 20B (SPOTLIGHT); Ulysses SP keeps a
  full replica per GPU.
- NVLink peer copy: 450 GB/s one way. Source: NVIDIA H100 SXM datasheet: NVLink 900 GB/s (both directions).
- host to GPU: 64 GB/s. Source: PCIe Gen5 x16 one way (H100 datasheet: 128 GB/s both directions).
- object store to host: 12.5 GB/s best case, 1.25 GB/s typical. Source: 100 Gbit/s instance networking (AWS S3
  performance guidelines: up to 100 Gb/s per instance with parallel requests); 10 Gbit/s for a common instance.

Not projected: NCCL communicator creation (gloo's measured rendezvous stands in for
it), CUDA context creation, and the warm-up forward of the 20B model, which both paths
pay once. So the figures bound the weight-movement part; they are not an end-to-end
prediction.
"""

from __future__ import annotations

WEIGHTS_BYTES = 20e9 * 2
ASSUMED_GBPS = {
    "nvlink_peer_copy": 450.0,
    "pcie_host_to_gpu": 64.0,
    "object_store_best": 12.5,
    "object_store_typical": 1.25,
}


def project_20b(measured: dict) -> dict:
    """Seconds to re-form after a join, for each path, from the measured fixed costs above."""
    elastic_rdv = measured["elastic"]["join"]["rendezvous_s"]
    naive = measured["naive"]["join"]
    fixed_naive = naive["process_start_s"] + naive["rendezvous_s"]
    nvlink_s = WEIGHTS_BYTES / (ASSUMED_GBPS["nvlink_peer_copy"] * 1e9)
    pcie_s = WEIGHTS_BYTES / (ASSUMED_GBPS["pcie_host_to_gpu"] * 1e9)
    out = {
        "label": "PROJECTION from measured fixed costs and assumed bandwidths (see workers/bench/projection.py)",
        "weights_bytes": WEIGHTS_BYTES,
        "assumed_GBps": dict(ASSUMED_GBPS),
        "elastic.weight_transfer_s": round(nvlink_s, 3),
        "elastic.total_s": round(elastic_rdv + nvlink_s, 3),
    }
    for case in ("best", "typical"):
        store_s = WEIGHTS_BYTES / (ASSUMED_GBPS[f"object_store_{case}"] * 1e9)
        out[f"naive_{case}.weight_transfer_s"] = round(store_s + pcie_s, 2)
        out[f"naive_{case}.total_s"] = round(fixed_naive + store_s + pcie_s, 2)
    out["excluded"] = "NCCL init, CUDA context, the 20B warm-up forward (paid by both paths)"
    return out
