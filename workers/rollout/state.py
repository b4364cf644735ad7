"""What a rollout request asks for, and the formats a rollout worker commits: in-flight state and results.

A rollout request's payload names the run, the prompt, the seed, the weights version,
the sampler config (its steps among them) and the reward, and optionally the resolution
and the guidance (absent: the run's ModelSpec; one worker's policy serves several). The
worker samples it alone (so the result does not depend on which other requests a worker
happens to hold); a batched request carries more
seeds of the same prompt (`batch_seeds`, `TrainConfig.seeds_per_request`), sampled as one
fixed batch, and commits one result per sample. The worker commits two kinds of objects
to the tensor store:

- in-flight state (under `rollout_state_key`, one commit key per attempt: see
  workers/rollout/resume.py): the latents of every step so far, the log-probs so far and
  the step index, overwritten every `commit_every` steps and on a preemption notice. A
  later attempt on any worker resumes from it; the counter-based noise makes the resumed
  result bit-identical to an uninterrupted one.
- the result (`rollout_key`): the whole trajectory (latents of every step, log-probs),
  the final image, the reward and the trajectory's xxh3-128 hash, and for a multi-reward each
  component's raw value (`reward_components`); committed exclusively.

Both carry the request's fingerprint, so state left by a different request under the
same id is never resumed.

Example:
    spec = RolloutSpec.from_payload(lease.request.payload)
    flight = InFlight.fresh(spec, shape)                   # or InFlight.from_commit(tensors, meta, spec, shape)
    tensors, meta = flight.to_commit()                     # store.publish_tensors(key, tensors, meta)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch
import xxhash

from resources.keys import check_name
from workers.algo.sampler import SamplerConfig
from workers.algo.sde import batch_noise
from workers.task.request_fields import check_prompt_fields, check_request_fields

STATE_FORMAT = "spotlight-rollout-state/1"
RESULT_FORMAT = "spotlight-rollout-result/1"
_PAYLOAD_FIELDS = {
    "run",
    "prompt",
    "seed",
    "weights_version",
    "sampler",
    "reward",
    "batch_seeds",
    "sample_ids",
    "resolution",
    "guidance",
    "prompt_fields",
    "init_seed",
}
MAX_RESOLUTION = 8192
"""Largest image side a request may ask for, in pixels."""
MAX_BATCH = 256
"""Most samples one rollout request may carry (a whole group of a prompt is the intended use)."""


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout request: deterministic given these fields and the weights of `weights_version`."""

    run: str
    """Run name: the store prefix holding its weights chain and results."""
    prompt: str
    """Prompt text."""
    seed: int
    """Fixes the initial noise and every SDE step's noise."""
    weights_version: int
    """Policy version to sample with (reached through the PULSE chain)."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Steps, noise level, SDE window and forward dtype."""
    reward: str = "minigeneval"
    """Name in the reward registry (workers/task/rewards.py)."""
    batch_seeds: tuple[int, ...] = ()
    """More samples of the same prompt, sampled in one batch with `seed` (a batched request; empty for one
    sample). The batch is fixed by the request, so its result never depends on what else a worker holds."""
    sample_ids: tuple[str, ...] = ()
    """A batched request's per-sample request ids, one per seed of `seeds`: each sample's result is committed
    under its own `rollout_key`, as if it had been a request of its own (empty for one sample)."""
    resolution: int | None = None
    """Image side in pixels; None = the run's ModelSpec. The worker refuses one its family cannot pack
    (a multiple of the VAE factor x patch size), before sampling."""
    guidance: float | None = None
    """CFG scale (true CFG, or FLUX.1-dev's guidance embedding); None = the run's ModelSpec."""
    prompt_fields: dict[str, Any] | None = None
    """The prompt's other fields from the run's prompts file (a JSON object), handed to a reward that takes them;
    None = none (absent from the payload)."""
    init_seed: int | None = None
    """The seed of every sample's initial noise when the prompt's group shares one (sampling.init_same_noise);
    None = each sample's own seed (absent from the payload)."""

    def __post_init__(self) -> None:
        for seed in (*self.seeds, *(() if self.init_seed is None else (self.init_seed,))):
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
                raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
        if len(self.seeds) > MAX_BATCH:
            raise ValueError(f"a rollout request carries at most {MAX_BATCH} seeds, got {len(self.seeds)}")
        if self.batch_seeds and len(self.sample_ids) != len(self.seeds):
            raise ValueError(
                f"a batched rollout request needs one sample id per seed: {len(self.seeds)} seeds, "
                f"{len(self.sample_ids)} sample ids"
            )
        if not self.batch_seeds and self.sample_ids:
            raise ValueError("sample_ids are only for a batched rollout request (one with batch_seeds)")
        if len(set(self.sample_ids)) != len(self.sample_ids):
            raise ValueError("a batched rollout request's sample ids must be distinct")
        for sample_id in self.sample_ids:
            check_name(sample_id, "sample id")
        if self.resolution is not None and (
            isinstance(self.resolution, bool)
            or not isinstance(self.resolution, int)
            or not 1 <= self.resolution <= MAX_RESOLUTION
        ):
            raise ValueError(
                f"resolution must be an int in [1, {MAX_RESOLUTION}] (pixels) or absent, got {self.resolution!r}"
            )
        if self.guidance is not None and (
            isinstance(self.guidance, bool)
            or not isinstance(self.guidance, (int, float))
            or not math.isfinite(self.guidance)
            or self.guidance < 0
        ):
            raise ValueError(f"guidance must be a finite number >= 0 or absent, got {self.guidance!r}")
        check_request_fields(self.run, self.prompt, self.weights_version, self.reward)
        check_prompt_fields(self.prompt_fields)

    @property
    def seeds(self) -> tuple[int, ...]:
        """Every seed the request samples, in batch order."""
        return (self.seed, *self.batch_seeds)

    @property
    def init_seeds(self) -> tuple[int, ...]:
        """The seed of each sample's initial noise, in batch order (its own seed unless init_seed is set)."""
        return self.seeds if self.init_seed is None else (self.init_seed,) * len(self.seeds)

    def sample(self, n: int) -> "RolloutSpec":
        """Sample n of a batched request as a request of its own (the spec its result is committed for)."""
        return dataclasses.replace(self, seed=self.seeds[n], batch_seeds=(), sample_ids=())

    @classmethod
    def batched(cls, specs: "list[RolloutSpec]", sample_ids: list[str]) -> "RolloutSpec":
        """One request sampling `specs` (one seed each, same everything else) as a batch."""
        first = specs[0]
        if any(dataclasses.replace(s, seed=first.seed) != first or s.batch_seeds for s in specs):
            raise ValueError("a batched rollout request's samples must differ only in their seed")
        if len(specs) == 1:
            return first
        return dataclasses.replace(first, batch_seeds=tuple(s.seed for s in specs[1:]), sample_ids=tuple(sample_ids))

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> "RolloutSpec":
        """Parse a queue payload (see `to_payload`); ValueError names what is missing or wrong."""
        if not isinstance(payload, Mapping):
            raise ValueError(f"a rollout payload must be a dict, got {type(payload).__name__}")
        missing = sorted({"run", "prompt", "seed", "weights_version"} - set(payload))
        extra = sorted(set(payload) - _PAYLOAD_FIELDS)
        if missing or extra:
            raise ValueError(
                f"rollout payload: missing fields {missing}, unknown fields {extra}; allowed {sorted(_PAYLOAD_FIELDS)}"
            )
        config = SamplerConfig.from_json(payload.get("sampler"), "rollout payload")
        batch_seeds, sample_ids = payload.get("batch_seeds", []), payload.get("sample_ids", [])
        if not isinstance(batch_seeds, list) or not isinstance(sample_ids, list):
            raise ValueError("rollout payload: batch_seeds and sample_ids must be lists")
        return cls(
            payload["run"],
            payload["prompt"],
            payload["seed"],
            payload["weights_version"],
            config,
            payload.get("reward", "minigeneval"),
            tuple(batch_seeds),
            tuple(sample_ids),
            payload.get("resolution"),
            payload.get("guidance"),
            payload.get("prompt_fields"),
            payload.get("init_seed"),
        )

    def to_payload(self) -> dict[str, Any]:
        """Plain JSON payload for the queue (the inverse of `from_payload`)."""
        sampler = dataclasses.asdict(self.sampler)
        if sampler["sde_window"] is not None:
            sampler["sde_window"] = list(sampler["sde_window"])
        payload = {
            "run": self.run,
            "prompt": self.prompt,
            "seed": self.seed,
            "weights_version": self.weights_version,
            "sampler": sampler,
            "reward": self.reward,
        }
        if self.batch_seeds:  # absent for one sample: its payload and fingerprint are what they always were
            payload.update(batch_seeds=list(self.batch_seeds), sample_ids=list(self.sample_ids))
        payload.update(
            {
                k: v
                for k, v in (
                    ("resolution", self.resolution),
                    ("guidance", self.guidance),
                    ("prompt_fields", self.prompt_fields),
                    ("init_seed", self.init_seed),
                )
                if v is not None
            }
        )
        return payload

    @property
    def fingerprint(self) -> str:
        """Stable id of what is computed: state or results of another request never match it."""
        text = json.dumps(self.to_payload(), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def rollout_request(request_id: str, iteration: int, spec: RolloutSpec) -> dict[str, Any]:
    """The queue request (a dict for `queue.put`) that asks a rollout worker for `spec`."""
    return {"request_id": request_id, "iteration": iteration, "kind": "rollout", "payload": spec.to_payload()}


@dataclass
class InFlight:
    """A request part-way through sampling: what a worker holds and commits."""

    spec: RolloutSpec
    step: int
    """Denoising steps completed."""
    latents: torch.Tensor
    """(num_steps + 1, B, C, H, W) fp32, B the request's seeds: x before each step; rows after `step` are NaN."""
    log_probs: torch.Tensor
    """(num_steps, B) fp32: filled for SDE steps < step, NaN elsewhere."""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """History of earlier attempts: worker_id, attempt, resumed_from_step, committed_step."""

    @classmethod
    def fresh(cls, spec: RolloutSpec, image_shape: tuple[int, int, int]) -> "InFlight":
        n, b = spec.sampler.num_steps, len(spec.seeds)
        latents = torch.full((n + 1, b, *image_shape), float("nan"))
        latents[0] = batch_noise(list(spec.init_seeds), 0, image_shape)
        return cls(spec, 0, latents, torch.full((n, b), float("nan")))

    def to_commit(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Tensors and manifest metadata of the state commit (only the latents computed so far)."""
        tensors = {"latents": self.latents[: self.step + 1].clone(), "log_probs": self.log_probs.clone()}
        meta = {
            "format": STATE_FORMAT,
            "fingerprint": self.spec.fingerprint,
            "step": self.step,
            "num_steps": self.spec.sampler.num_steps,
            "attempts": list(self.attempts),
        }
        return tensors, meta

    @classmethod
    def from_commit(
        cls,
        tensors: Mapping[str, torch.Tensor],
        meta: Mapping[str, Any],
        spec: RolloutSpec,
        image_shape: tuple[int, int, int],
    ) -> "InFlight":
        """Rebuild committed state; ValueError if it belongs to another request or is malformed."""
        if meta.get("format") != STATE_FORMAT:
            raise ValueError(f"rollout state has format {meta.get('format')!r}, expected {STATE_FORMAT!r}")
        if meta.get("fingerprint") != spec.fingerprint:
            raise ValueError("rollout state belongs to a different request (fingerprint mismatch)")
        n, b, step, attempts = spec.sampler.num_steps, len(spec.seeds), meta.get("step"), meta.get("attempts", [])
        lat, lp = tensors.get("latents"), tensors.get("log_probs")
        if not isinstance(step, int) or not 0 <= step <= n or lat is None or lp is None:
            raise ValueError(f"rollout state is malformed (step {step!r}, tensors {sorted(tensors)})")
        if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
            raise ValueError("rollout state is malformed (attempts is not a list of records)")
        if (
            tuple(lat.shape) != (step + 1, b, *image_shape)
            or tuple(lp.shape) != (n, b)
            or lat.dtype != torch.float32
            or lp.dtype != torch.float32
        ):
            raise ValueError(
                f"rollout state tensors have shapes {tuple(lat.shape)}, {tuple(lp.shape)} for step {step} of {n}"
            )
        latents = torch.full((n + 1, b, *image_shape), float("nan"))
        latents[: step + 1] = lat
        return cls(spec, step, latents, lp.clone(), list(attempts))

    @property
    def done(self) -> bool:
        return self.step >= self.spec.sampler.num_steps


def trajectory_hash(latents: torch.Tensor, log_probs: torch.Tensor) -> str:
    """xxh3-128 over the trajectory's raw bytes: equal hashes mean bit-identical results."""
    digest = xxhash.xxh3_128()
    for tensor in (latents, log_probs):
        flat = tensor.detach().contiguous().reshape(-1)
        digest.update(f"{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def result_commit(
    flight: InFlight,
    image_HW3: torch.Tensor,
    reward: float,
    info: Mapping[str, Any],
    sample: int = 0,
    components: Mapping[str, float] | None = None,
) -> tuple[dict, dict]:
    """Tensors and metadata of the result commit of sample `sample` of a finished request (a batched request
    commits one result per sample, each exactly what a request of that sample alone would commit).
    `components`: a multi-reward's raw value of each component for this sample (metadata `reward_components`)."""
    if not flight.done:
        raise ValueError(f"request is at step {flight.step} of {flight.spec.sampler.num_steps}: not finished")
    if not math.isfinite(reward):
        raise ValueError(f"reward must be finite, got {reward}")
    bad = sorted(name for name, value in (components or {}).items() if not math.isfinite(value))
    if bad:
        raise ValueError(f"reward components {bad} are not finite")
    spec = flight.spec.sample(sample) if flight.spec.batch_seeds else flight.spec
    latents, log_probs = flight.latents[:, sample].contiguous(), flight.log_probs[:, sample].contiguous()
    tensors = {"latents": latents, "log_probs": log_probs, "image": image_HW3}
    meta = {
        "format": RESULT_FORMAT,
        "fingerprint": spec.fingerprint,
        "prompt": spec.prompt,
        "seed": spec.seed,
        "weights_version": spec.weights_version,
        "reward": float(reward),
        "result_hash": trajectory_hash(latents, log_probs),
        **dict(info),
    }
    if components:  # absent for a single reward: those results' metadata is what it always was
        meta["reward_components"] = {name: float(value) for name, value in components.items()}
    return tensors, meta


def result_components(metadata: list[Mapping[str, Any]]) -> dict[str, np.ndarray] | None:
    """Each reward component's values over committed results, in their order ({name: (N,) float64}); None when
    the results carry no components, or not every result carries the same ones (results of another reward)."""
    parts = [m.get("reward_components") for m in metadata]
    if not parts or not isinstance(parts[0], dict) or not parts[0]:
        return None
    names = list(parts[0])
    if any(not isinstance(p, dict) or set(p) != set(names) for p in parts):
        return None
    return {name: np.array([float(p[name]) for p in parts], dtype=np.float64) for name in names}
