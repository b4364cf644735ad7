import pytest
import torch

from workers.algo.sampler import SamplerConfig, rollout

PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow circle"]
SEEDS = [11, 12, 13]


def test_replaying_a_request_gives_a_bit_identical_image(tiny_policy):
    cfg = SamplerConfig(num_steps=6)
    a = rollout(tiny_policy, PROMPTS, SEEDS, cfg)
    b = rollout(tiny_policy, PROMPTS, SEEDS, cfg)
    assert torch.equal(a.images, b.images) and torch.equal(a.log_probs, b.log_probs)


@pytest.mark.parametrize("j", [1, 3, 5])
def test_resuming_from_step_j_gives_a_bit_identical_result(tiny_policy, j):
    cfg = SamplerConfig(num_steps=6)
    full = rollout(tiny_policy, PROMPTS, SEEDS, cfg)
    part = rollout(tiny_policy, PROMPTS, SEEDS, cfg, stop_at=j)
    assert part.step == j and torch.isnan(part.log_probs[j:]).all()
    resumed = rollout(tiny_policy, PROMPTS, SEEDS, cfg, resume=part.state())
    assert torch.equal(resumed.images, full.images)
    assert torch.equal(resumed.log_probs, full.log_probs)


def test_different_seeds_give_different_images(tiny_policy):
    cfg = SamplerConfig(num_steps=4)
    a = rollout(tiny_policy, PROMPTS, SEEDS, cfg)
    b = rollout(tiny_policy, PROMPTS, [s + 100 for s in SEEDS], cfg)
    assert not torch.equal(a.images[0], b.images[0])


def test_only_sde_window_steps_have_log_probs(tiny_policy):
    cfg = SamplerConfig(num_steps=6, sde_window=(1, 3))
    traj = rollout(tiny_policy, PROMPTS, SEEDS, cfg)
    has_lp = ~torch.isnan(traj.log_probs).any(dim=1)
    assert has_lp.tolist() == [False, True, True, False, False, False]


def test_ode_sampling_has_no_log_probs(tiny_policy):
    cfg = SamplerConfig(num_steps=4, noise_level=0.0)
    a = rollout(tiny_policy, PROMPTS, SEEDS, cfg)
    assert torch.isnan(a.log_probs).all() and torch.isfinite(a.images).all()


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_steps": 0}, "num_steps"),
        ({"noise_level": -1}, "noise_level"),
        ({"sde_window": (3, 2)}, "sde_window"),
        ({"forward_dtype": "fp8"}, "forward_dtype"),
    ],
)
def test_bad_sampler_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplerConfig(**kwargs)


def test_auto_forward_dtype_uses_bf16_only_where_it_is_native():
    from workers.algo.sampler import cpu_has_native_bf16, resolve_forward_dtype

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_forward_dtype("auto", cpu) == ("bf16" if cpu_has_native_bf16() else "fp32")
    assert resolve_forward_dtype("auto", cuda) == "bf16"
    assert resolve_forward_dtype("fp32", cuda) == "fp32" and resolve_forward_dtype("bf16", cpu) == "bf16"
