"""Resolution and guidance as request fields: absent, the run's ModelSpec; set, the worker's policy serves them from
the same weights; a value the policy cannot serve is refused before any sampling, and bad payloads raise ValueError."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from resources.keys import rollout_state_key
from resources.queue.records import Request
from tests.fuzz.fuzzing import FUZZ
from workers.algo.sampler import SamplerConfig
from workers.model.families.diffusers_policy import load_model_policy
from workers.model.families.tiny import build_tiny_pipeline
from workers.rollout.request import StepHooks, work_request
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import PolicyHolder, publish_policy

SAMPLER = SamplerConfig(num_steps=2, forward_dtype="fp32")
PROMPT = "two red circles"


@pytest.fixture(scope="module")
def qwen_path(tmp_path_factory):
    return build_tiny_pipeline("qwen-image", tmp_path_factory.mktemp("qwen") / "qwen")


def _work(store, rid: str, spec: RolloutSpec, holder: PolicyHolder | None = None):
    request = Request.from_dict(rollout_request(rid, 0, spec))
    return work_request(request, 1, store, holder or PolicyHolder(store), worker_id="w", commit_every=1)


def _publish(store, run: str, path, **fields) -> None:
    policy = load_model_policy(path, lora_rank=2, **fields)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    publish_policy(store, run, policy)


def test_a_request_at_another_resolution_and_guidance_equals_a_run_whose_spec_has_them(tmp_store, qwen_path):
    _publish(tmp_store, "demo", qwen_path, resolution=32)  # the run samples at 32 by default
    _publish(tmp_store, "demo64", qwen_path, resolution=64, guidance=3.0)  # same weights, other defaults
    holder = PolicyHolder(tmp_store)
    base = _work(tmp_store, "r32", RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, "jpeg_compressibility"), holder)
    asked = _work(
        tmp_store,
        "r64",
        RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, "jpeg_compressibility", resolution=64, guidance=3.0),
        holder,
    )  # the same worker serves both
    native = _work(tmp_store, "n64", RolloutSpec("demo64", PROMPT, 3, 0, SAMPLER, "jpeg_compressibility"))
    # Tiny Qwen-Image: VAE factor 4, 2x2 packing, 4 latent channels -> (side/8)^2 tokens of 16.
    shapes = {o.request_id: tuple(tmp_store.load_tensors(o.result_key)["latents"].shape) for o in (base, asked)}
    assert shapes == {"r32": (3, 16, 16), "r64": (3, 64, 16)}
    assert tuple(tmp_store.load_tensors(asked.result_key)["image"].shape) == (64, 64, 3)
    assert asked.result_hash == native.result_hash
    again = _work(tmp_store, "r32b", RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, "jpeg_compressibility"), holder)
    assert again.result_hash == base.result_hash  # the run's default is untouched by a request's fields


def test_guidance_changes_the_sample(tmp_store, qwen_path):
    _publish(tmp_store, "demo", qwen_path, resolution=32)
    one, four = (
        _work(tmp_store, f"g{g}", RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, "jpeg_compressibility", guidance=g))
        for g in (1.0, 4.0)
    )
    assert one.result_hash != four.result_hash


@pytest.mark.parametrize("resolution", [36, 20])
def test_a_resolution_the_family_cannot_pack_is_refused_before_sampling(tmp_store, qwen_path, resolution):
    _publish(tmp_store, "demo", qwen_path, resolution=32)
    reports = []
    spec = RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, "jpeg_compressibility", resolution=resolution)
    request = Request.from_dict(rollout_request("bad", 0, spec))
    with pytest.raises(ValueError, match=rf"resolution {resolution} must be a multiple of 8 for qwen-image"):
        work_request(
            request,
            1,
            tmp_store,
            PolicyHolder(tmp_store),
            worker_id="w",
            commit_every=1,
            hooks=StepHooks(report=lambda event, **fields: reports.append(event)),
        )
    assert reports == [] and tmp_store.list_keys(rollout_state_key("demo", "bad") + "/") == []


def test_the_pixel_policy_refuses_another_size_or_a_guidance(rollout_store):
    with pytest.raises(ValueError, match="pixel policy"):
        _work(rollout_store, "p", RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, resolution=32))
    with pytest.raises(ValueError, match="pixel policy"):
        _work(rollout_store, "g", RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, guidance=2.0))
    assert _work(rollout_store, "same", RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, resolution=16)).status == "done"


def test_a_request_at_the_runs_defaults_keeps_its_payload_and_fingerprint():
    plain = RolloutSpec("demo", PROMPT, 3, 0, SAMPLER)
    assert "resolution" not in plain.to_payload() and "guidance" not in plain.to_payload()
    asked = RolloutSpec("demo", PROMPT, 3, 0, SAMPLER, resolution=64, guidance=4.5)
    assert RolloutSpec.from_payload(json.loads(json.dumps(asked.to_payload()))) == asked
    assert asked.fingerprint != plain.fingerprint


GOOD = RolloutSpec("demo", PROMPT, 3, 0, SAMPLER).to_payload()
values = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=6)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)


@FUZZ
@given(resolution=values, guidance=values)
def test_payload_resolution_and_guidance_parse_or_raise_value_error(resolution, guidance):
    try:
        spec = RolloutSpec.from_payload({**GOOD, "resolution": resolution, "guidance": guidance})
    except ValueError:
        return
    assert spec.resolution is None or (type(spec.resolution) is int and 1 <= spec.resolution <= 8192)
    assert spec.guidance is None or (spec.guidance >= 0 and math.isfinite(spec.guidance))
    assert RolloutSpec.from_payload(json.loads(json.dumps(spec.to_payload()))) == spec
