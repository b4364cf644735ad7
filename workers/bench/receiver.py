"""`spotlight bench receiver`: what reaching a weights version costs a PULSE receiver.

Two measurements:
- sync: the coordinator's sync phase (`publish_version`) at each version of a chain, with its receiver kept in the
  process between versions (one patch per version) and without (each version replays the chain from the nearest
  anchor, as a freshly started coordinator does): seconds and the bytes it reads from the store.
- memory: a fresh rollout worker process reaching version k of a merged-sync chain (a plain Qwen-Image transformer
  at its real widths with `layers` blocks, random init) with FP32 parameters fed from a BF16 dict (resident_dtype
  fp32) and with BF16 parameters patched in place (bf16): peak RSS, and the bytes its parameters and dicts hold.

Example:
    figures = run_receiver_bench(ReceiverBench(versions=20, layers=1))
    figures["sync"]["rows"]          # per version and mode: replay_s, publish_s, read_bytes
    figures["memory"]["runs"]        # per resident dtype: peak RSS, bytes held
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from resources.store.local import LocalTensorStore

RUN = "bench"


@dataclass(frozen=True)
class ReceiverBench:
    versions: int = 20
    """Sync versions published per mode (after the base, version 0)."""
    anchor_every: int = 10
    """A full anchor every this many versions."""
    changed_share: float = 0.01
    """Share of BF16 values one update moves (by one ULP): PULSE's ~1 %."""
    layers: int = 1
    """Transformer blocks of the real-widths Qwen-Image in the memory measurement (0: skip it)."""
    memory_version: int = 3
    """The version the memory measurement's fresh worker reaches (from the anchor below it)."""
    threads: int = 2

    def __post_init__(self) -> None:
        if self.versions < 1 or self.anchor_every < 1 or self.memory_version < 0 or self.threads < 1:
            raise ValueError("versions, anchor_every and threads must be >= 1, memory_version >= 0")
        if not 0 < self.changed_share <= 1:
            raise ValueError(f"changed_share must be in (0, 1], got {self.changed_share}")
        if self.layers < 0:
            raise ValueError(f"layers must be >= 0 (0 skips the memory measurement), got {self.layers}")


class ReadCountingStore(LocalTensorStore):
    """A local store that adds up the committed bytes read: all of them, and those of the PULSE chain (anchors and
    patches; the rest is the trainer checkpoint the sync phase publishes from)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.read_bytes = 0
        self.chain_read_bytes = 0

    def _count(self, commit_key: str, name: str) -> None:
        manifest = self.read_manifest(commit_key)
        if manifest is not None and name in manifest.objects:
            self.read_bytes += manifest.objects[name].size_bytes
            if "/anchors/" in commit_key or "/patches/" in commit_key:
                self.chain_read_bytes += manifest.objects[name].size_bytes

    def load_bytes(self, commit_key: str, name: str) -> bytes:
        self._count(commit_key, name)
        return super().load_bytes(commit_key, name)

    def load_tensors(self, commit_key: str, name: str = "tensors.safetensors"):
        self._count(commit_key, name)
        return super().load_tensors(commit_key, name)


def _bench_policy():
    """The pixel policy at 9.8M parameters: big enough that an anchor read shows against a patch."""
    from workers.model.tiny_policy import PolicyConfig, build_policy

    return build_policy(PolicyConfig(num_layers=4, num_heads=8, head_dim=32), seed=0).eval()


def _nudge(policy, share: float, seed: int) -> None:
    """One update's worth of change: `share` of the BF16 values move by one ULP (the FP32 masters follow)."""
    import torch

    from workers.bench.pulse_stats import synthetic_update

    moved = synthetic_update({n: p.detach().to(torch.bfloat16) for n, p in policy.named_parameters()}, share, seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            param.copy_(moved[name].float())


def sync_costs(bench: ReceiverBench, keep: bool, folder: Path) -> list[dict]:
    """publish_version at versions 1..bench.versions of a fresh chain; `keep` False drops the receiver first."""
    from workers.coordinator.sync import drop_sync_receiver, publish_version
    from workers.model.tiny_policy import save_policy
    from workers.trainer.checkpoint import save_checkpoint

    mode = "kept" if keep else "replayed"
    policy = _bench_policy()
    save_policy(policy, folder / f"base-{mode}")
    store = ReadCountingStore(folder / mode)
    drop_sync_receiver()
    publish_version(store, RUN, 0, anchor_every=bench.anchor_every, base=folder / f"base-{mode}")
    rows = []
    for version in range(1, bench.versions + 1):
        _nudge(policy, bench.changed_share, version)
        save_checkpoint(store, RUN, version, policy)
        if not keep:
            drop_sync_receiver()  # what a coordinator started anew holds
        store.read_bytes = store.chain_read_bytes = 0
        started = time.perf_counter()
        out = publish_version(store, RUN, version, anchor_every=bench.anchor_every)
        rows.append(
            {
                "mode": out.receiver,
                "version": version,
                "anchored": out.anchored,
                "reproduced": out.reproduced,
                "replay_s": round(out.replay_s, 4),
                "publish_s": round(time.perf_counter() - started, 4),
                "read_bytes": store.read_bytes,
                "chain_read_bytes": store.chain_read_bytes,
                "patch_bytes": out.sent_bytes,
                "dense_bytes": out.dense_bytes,
            }
        )
    drop_sync_receiver()
    return rows


def _merged_chain(bench: ReceiverBench, folder: Path) -> dict:
    """A real-widths Qwen-Image transformer published as a plain (merged-sync) chain up to memory_version."""
    from workers.bench.pulse_stats import synthetic_update
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.model.families.tiny import build_tiny_pipeline
    from workers.rollout.weights import publish_policy

    pipeline = build_tiny_pipeline("qwen-image", folder / "qwen", widths="real", num_layers=bench.layers)
    policy = load_model_policy(pipeline, resolution=256)
    numel = sum(p.numel() for p in policy.transformer.parameters())
    store = LocalTensorStore(folder / "memory")
    publisher = publish_policy(store, RUN, policy, anchor_every=bench.anchor_every)
    del policy
    state = publisher.last_state
    for version in range(1, bench.memory_version + 1):
        state = synthetic_update(state, bench.changed_share, version)
        publisher.publish(version, state)
    return {"store": str(folder / "memory"), "transformer_params": numel}


def receiver_memory(store_root: str, version: int, resident_dtype: str, threads: int) -> dict:
    """In a fresh process: a rollout worker's PolicyHolder reaching `version`; RSS and the bytes it holds."""
    import torch

    from workers.bench.memory import peak_rss_bytes, rss_bytes
    from workers.rollout.weights import PolicyHolder

    torch.set_num_threads(threads)
    before = rss_bytes()
    holder = PolicyHolder(LocalTensorStore(store_root), resident_dtype=resident_dtype)
    started = time.perf_counter()
    policy = holder.policy_at(RUN, version)
    seconds = time.perf_counter() - started
    tensors = [*policy.transformer.parameters(), *holder._weights.values()]
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return {
        "resident_dtype": resident_dtype,
        "version": version,
        "param_dtypes": sorted({str(p.dtype) for p in policy.transformer.parameters()}),
        "held_GB": round(sum(held.values()) / 1e9, 3),
        "rss_before_GB": round(before / 1e9, 3),
        "rss_after_GB": round(rss_bytes() / 1e9, 3),
        "peak_rss_GB": round(peak_rss_bytes() / 1e9, 3),
        "reach_s": round(seconds, 2),
    }


def run_receiver_bench(bench: ReceiverBench, progress=lambda line: None) -> dict:
    """Both measurements (module docstring); each memory run in a fresh spawned process."""
    figures: dict = {"bench": dataclasses.asdict(bench)}
    with tempfile.TemporaryDirectory(prefix="receiver-bench-") as tmp:
        folder = Path(tmp)
        rows = []
        for keep in (True, False):
            rows += sync_costs(bench, keep, folder)
            progress(f"sync, receiver {'kept' if keep else 'replayed'}: {bench.versions} versions")
        figures["sync"] = {"rows": rows}
        if bench.layers:
            chain = _merged_chain(bench, folder)
            runs = []
            for dtype in ("fp32", "bf16"):
                with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
                    args = (chain["store"], bench.memory_version, dtype, bench.threads)
                    runs.append(pool.submit(receiver_memory, *args).result())
                progress(f"memory, {dtype}: peak RSS {runs[-1]['peak_rss_GB']} GB")
            figures["memory"] = {"transformer_params": chain["transformer_params"], "runs": runs}
    return figures


def format_receiver_report(figures: dict, versions: tuple[int, ...] = (1, 9, 10, 19, 20)) -> str:
    lines = [f"{'receiver':>9} {'version':>7} {'replay s':>9} {'publish s':>10} {'chain read MB':>14} {'patch MB':>9}"]
    for row in figures["sync"]["rows"]:
        if row["version"] in versions:
            lines.append(
                f"{row['mode']:>9} {row['version']:>7} {row['replay_s']:>9.3f} {row['publish_s']:>10.3f} "
                f"{row['chain_read_bytes'] / 1e6:>14.2f} {row['patch_bytes'] / 1e6:>9.3f}"
            )
    memory = figures.get("memory")
    if memory:
        lines.append(f"receiver memory, transformer of {memory['transformer_params'] / 1e6:.0f}M parameters:")
        for run in memory["runs"]:
            lines.append(
                f"  {run['resident_dtype']}: params {','.join(run['param_dtypes'])}, held {run['held_GB']} GB, "
                f"peak RSS {run['peak_rss_GB']} GB (before {run['rss_before_GB']}, after {run['rss_after_GB']}), "
                f"{run['reach_s']} s"
            )
    return "\n".join(lines)
