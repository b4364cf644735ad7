"""Every tensor-store key the project uses, in one place.

All keys are relative to the store root (a folder, or `s3://bucket/prefix`). A *commit
key* names a folder-like prefix holding content-addressed data objects and a
`_MANIFEST.json` written last (see `resources/store/base.py`); readers trust only committed
manifests.

Each key below: the function, the key (a commit key unless noted), what it holds, and who writes it.

- `anchor_key(run, v)` -> `runs/{run}/anchors/v{v:06d}`: full BF16 policy weights at version v, the base
  a PULSE patch chain starts from. Written by the trainer, every `anchor_every` versions.
- `patch_key(run, v)` -> `runs/{run}/patches/v{v:06d}`: PULSE patch v-1 -> v (changed BF16 values) plus
  the weights hash of v. Written by the trainer.
- `weights_key(run, v)` -> `runs/{run}/weights/v{v:06d}`: trainer checkpoint after update v: FP32 master
  weights and optimizer state, for `--resume`. Written by the trainer.
- `rollout_key(run, it, rid)` -> `runs/{run}/rollouts/it-{it:06d}/{rid}`: final result of one request:
  trajectory (latents, log-probs), reward, image; committed exclusively so a duplicate is harmless.
  Written by the rollout worker.
- `rollout_state_key(run, rid)` -> `runs/{run}/rollout_state/{rid}`: a folder of in-flight states of one
  request (latents, step index, log-probs so far): each attempt commits every c steps under its own
  `attempt-{n}-{token}` key (workers/rollout/resume.py), and finishing deletes them all. Written by the
  rollout worker.
- `seed_plan_key(run, it)` -> `runs/{run}/seed_plans/it-{it:06d}`: ranked seeds per prompt for iteration
  it, chosen by exploration on stale weights. Written by the coordinator (explore phase).
- `bandit_state_key(run)` -> `runs/{run}/bandit`: UCB bandit arm statistics, overwritten each iteration.
  Written by the coordinator.
- `exploration_key(run, it)` -> `runs/{run}/exploration/it-{it:06d}`: the exploration session that ran
  beside iteration it's training: arm, budget, request ids. Written by the coordinator (explore phase).
- `explore_result_key(run, it, rid)` -> `runs/{run}/explore/it-{it:06d}/{rid}`: explored (stale, cheap)
  rewards of one prompt's candidate seeds; committed exclusively. Written by the rollout worker.
- `run_rewards_key(run)` -> `runs/{run}/rewards.json`: the reward specs the run scores with (training,
  validation): a worker refuses a request naming any other (a queue is not trusted to pick a URL to send
  images to). Written by the coordinator (sync phase).
- `prompt_embeddings_key(run, prompt)` -> `runs/{run}/prompt_embeddings/{blake2b-20 of the prompt}`: one
  prompt's text-encoder outputs (safetensors: the family's `embedding_names`, e.g. `prompt_embeds`,
  `pooled`), with the prompt and the encoder settings in the manifest: workers read them instead of
  loading the text encoders. Written by the coordinator (sync phase).

Listing helpers: `rollouts_prefix(run, it)` lists one iteration's results,
`run_prefix(run)` everything of a run. Iterations are zero-padded like the Dagster
partition keys (`it-000012`), so keys sort in iteration order.

Example:
    store.publish_tensors(patch_key("demo", 3), patch_tensors)
    for key in store.list_commits(rollouts_prefix("demo", 3)): ...
"""

from __future__ import annotations

import hashlib
import re

# Names that become one key segment: no slashes, no leading dot (hidden/temporary files
# of the local store start with a dot), nothing a shell or S3 console would mangle.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._=+-]{0,199}$")
MANIFEST_NAME = "_MANIFEST.json"


def check_name(value: str, what: str) -> str:
    """Return `value` if it is a safe single key segment, else raise ValueError naming `what`."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid key segment: use 1-200 characters from "
            "A-Z a-z 0-9 . _ = + - , not starting with '.' or '-'"
        )
    return value


def check_key(key: str) -> str:
    """Return `key` if it is a relative store key made of valid segments, else raise ValueError."""
    if not isinstance(key, str) or not key or key.startswith("/") or key.endswith("/"):
        raise ValueError(f"store key {key!r} must be a non-empty relative path like 'runs/demo/x'")
    for segment in key.split("/"):
        check_name(segment, f"segment of store key {key!r}:")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a key (optionally ending in '/')."""
    if prefix:
        check_key(prefix.rstrip("/") or "/")
    return prefix


def _index(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")
    if value > 999_999:
        raise ValueError(f"{what} {value} exceeds the 6-digit key layout (max 999999)")
    return value


def iteration_label(iteration: int) -> str:
    """`it-000012`: the iteration's key segment, identical to its Dagster partition key."""
    return f"it-{_index(iteration, 'iteration'):06d}"


def version_label(version: int) -> str:
    """`v000012`: a weights version's key segment."""
    return f"v{_index(version, 'version'):06d}"


def run_prefix(run: str) -> str:
    """Everything a run stores lives under this prefix."""
    return f"runs/{check_name(run, 'run name')}/"


def run_rewards_key(run: str) -> str:
    """The rewards a run scores with (JSON list of specs), written by the coordinator: workers score only these."""
    return run_prefix(run) + "rewards.json"


def anchor_key(run: str, version: int) -> str:
    """Full BF16 weights at `version`: the start of a PULSE patch chain."""
    return f"{run_prefix(run)}anchors/{version_label(version)}"


def patch_key(run: str, version: int) -> str:
    """PULSE patch that takes weights from `version - 1` to `version`."""
    if version < 1:
        raise ValueError(f"patch version must be >= 1 (a patch goes from v-1 to v), got {version}")
    return f"{run_prefix(run)}patches/{version_label(version)}"


def weights_key(run: str, version: int) -> str:
    """Trainer checkpoint (FP32 master weights + optimizer state) after update `version`."""
    return f"{run_prefix(run)}weights/{version_label(version)}"


def rollouts_prefix(run: str, iteration: int) -> str:
    """Prefix under which all results of one iteration are committed."""
    return f"{run_prefix(run)}rollouts/{iteration_label(iteration)}/"


def request_id(iteration: int, prompt_index: int, sample_index: int) -> str:
    """`it3-p12-s7`: a rollout request's id; stable, so a re-sent request is recognised by the queue and the store."""
    return f"it{iteration}-p{prompt_index}-s{sample_index}"


def batch_request_id(first_request_id: str, samples: int) -> str:
    """`it3-p2-s0x8`: the queue id of a batched rollout request, a prompt's `samples` seeds from
    `first_request_id` on (each sample keeps its own request id for its result and its ledger row)."""
    return f"{first_request_id}x{samples}"


BATCH_SAMPLES_SQL_RE = "-s[0-9]+x([0-9]+)$"
"""SQL regexp (DuckDB's RE2) whose group 1 is a batch_request_id's sample count; no match: one sample."""
BATCH_FIRST_SAMPLE_SQL_RE = ("(-s[0-9]+)x[0-9]+$", "\\1")
"""regexp_replace's (pattern, replacement) from a batch_request_id to its first sample's request id."""


def rollout_key(run: str, iteration: int, request_id: str) -> str:
    """Final result of one request; committed exclusively (first writer wins)."""
    return rollouts_prefix(run, iteration) + check_name(request_id, "request id")


def rollout_state_key(run: str, request_id: str) -> str:
    """Latest committed in-flight state of one request, for resume after preemption."""
    return f"{run_prefix(run)}rollout_state/{check_name(request_id, 'request id')}"


def seed_plan_key(run: str, iteration: int) -> str:
    """Seed plan (ranked seeds per prompt) used by iteration `iteration`'s rollouts."""
    return f"{run_prefix(run)}seed_plans/{iteration_label(iteration)}"


def bandit_state_key(run: str) -> str:
    """UCB bandit statistics for exploration arms (overwritten each iteration)."""
    return f"{run_prefix(run)}bandit"


def exploration_key(run: str, iteration: int) -> str:
    """The exploration session that ran beside iteration `iteration`'s training (it plans iteration + 1)."""
    return f"{run_prefix(run)}exploration/{iteration_label(iteration)}"


def explore_result_key(run: str, iteration: int, request_id: str) -> str:
    """Explored rewards of one exploration request of iteration `iteration`; committed exclusively."""
    return f"{run_prefix(run)}explore/{iteration_label(iteration)}/{check_name(request_id, 'request id')}"


def prompt_embeddings_prefix(run: str) -> str:
    """Prefix under which a run's cached prompt embeddings are committed, one commit per prompt."""
    return f"{run_prefix(run)}prompt_embeddings/"


def prompt_embeddings_key(run: str, prompt: str) -> str:
    """One prompt's cached text-encoder outputs; the segment is a digest, since prompts are free text."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
    return prompt_embeddings_prefix(run) + hashlib.blake2b(prompt.encode(), digest_size=20).hexdigest()
