import math

import pytest
import torch

from workers.algo.sde import noise_seed, ode_step, request_noise, sde_step_with_logprob, sigma_schedule


def _inputs(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randn(n, 3, 8, 8, generator=g)


def test_log_prob_equals_an_independent_gaussian_density():
    v, x = _inputs()
    sigma, sigma_next, eta = 0.6, 0.45, 0.7
    noise = request_noise(3, 1, (4, 3, 8, 8))
    prev, log_prob, mean, std = sde_step_with_logprob(v, sigma, sigma_next, x, eta, noise=noise)
    scale = (std * math.sqrt(sigma - sigma_next)).expand_as(mean)
    expected = torch.distributions.Normal(mean.double(), scale.double()).log_prob(prev.double()).mean(dim=(1, 2, 3))
    assert torch.allclose(log_prob.double(), expected, atol=1e-5)


def test_log_prob_of_a_given_prev_sample_matches_the_sampled_one():
    v, x = _inputs()
    sig = torch.tensor([0.9, 0.6, 0.3, 0.2])
    nxt = sig - 0.1
    prev, lp, _, _ = sde_step_with_logprob(v, sig, nxt, x, 0.7, noise=request_noise(1, 1, (4, 3, 8, 8)))
    _, lp2, _, _ = sde_step_with_logprob(v, sig, nxt, x, 0.7, prev_sample=prev)
    assert torch.equal(lp, lp2)


def test_first_step_uses_the_next_sigma_so_std_stays_finite():
    v, x = _inputs()
    sigmas = sigma_schedule(8)
    _, lp, _, std = sde_step_with_logprob(v, sigmas[0], sigmas[1], x, 0.7, noise=torch.zeros_like(x))
    expected = math.sqrt(1.0 / (1 - float(sigmas[1]))) * 0.7
    assert torch.allclose(std, torch.tensor(expected), rtol=1e-5)
    assert torch.isfinite(lp).all()


def test_zero_noise_level_makes_the_sde_step_the_ode_step():
    v, x = _inputs()
    prev, _, mean, _ = sde_step_with_logprob(v, 0.5, 0.375, x, 0.0, noise=torch.randn_like(x))
    assert torch.allclose(mean, ode_step(v, 0.5, 0.375, x), atol=1e-6)


def test_sde_step_refuses_to_draw_global_rng_noise():
    v, x = _inputs()
    with pytest.raises(ValueError, match="noise"):
        sde_step_with_logprob(v, 0.5, 0.4, x, 0.7)


def test_noise_depends_only_on_seed_and_counter():
    a = request_noise(7, 3, (3, 4, 4))
    torch.manual_seed(123)  # the global RNG must not matter
    assert torch.equal(a, request_noise(7, 3, (3, 4, 4)))
    assert not torch.equal(a, request_noise(7, 4, (3, 4, 4)))
    assert not torch.equal(a, request_noise(8, 3, (3, 4, 4)))
    assert noise_seed(1, 2) != noise_seed(2, 1)


def test_sigma_schedule_runs_from_one_to_zero_and_rejects_bad_input():
    s = sigma_schedule(8, shift=3.0)
    assert s[0] == 1.0 and s[-1] == 0.0 and bool((s[1:] < s[:-1]).all())
    with pytest.raises(ValueError, match="num_steps"):
        sigma_schedule(0)
