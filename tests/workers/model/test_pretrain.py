import pytest
import torch

from workers.model.pretrain import PretrainConfig, SceneStream, flow_matching_loss, lr_factor, pretrain
from workers.model.tiny_policy import PolicyConfig, build_policy


def test_scene_stream_is_seeded_and_never_shows_heldout_prompts():
    from workers.task.prompts import split_prompts

    a_prompts, a_images = SceneStream(3).batch(16)
    b_prompts, b_images = SceneStream(3).batch(16)
    assert a_prompts == b_prompts and torch.equal(a_images, b_images)
    assert a_images.shape == (16, 3, 32, 32) and a_images.min() >= -1 and a_images.max() <= 1
    heldout = set(split_prompts()["heldout"])
    assert not heldout & set(SceneStream(0).batch(256)[0])


def test_pretraining_lowers_the_flow_matching_loss():
    config = PolicyConfig(num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    policy = build_policy(config, seed=0)
    prompts, x0 = SceneStream(1).batch(32)

    def held_loss():
        with torch.no_grad():
            return float(flow_matching_loss(policy, prompts, x0, torch.Generator().manual_seed(0)))

    before = held_loss()
    for _ in pretrain(policy, PretrainConfig(steps=40, batch_size=16, lr=2e-3, warmup_steps=5, ema_decay=0.0)):
        pass
    assert held_loss() < 0.8 * before


def test_learning_rate_warms_up_then_decays_to_five_percent():
    cfg = PretrainConfig(steps=100, warmup_steps=10)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(100, cfg) == pytest.approx(0.05)


@pytest.mark.parametrize("field,value", [("steps", 0), ("lr", -1.0), ("ema_decay", 1.0), ("warmup_steps", -1)])
def test_bad_pretrain_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        PretrainConfig(**{field: value})


def test_text_stream_draws_only_training_strings():
    from workers.model.pretrain import TextStream
    from workers.task.miniocr import parse_ocr_prompt
    from workers.trainer.presets import get_preset

    heldout = {parse_ocr_prompt(p).text for p in get_preset("cpu_tiny_ocr").prompts.table().heldout}
    prompts, x0 = TextStream(seed=0).batch(64)
    assert x0.shape == (64, 3, 32, 32) and not {parse_ocr_prompt(p).text for p in prompts} & heldout


def test_a_miniocr_base_starts_from_another_tasks_transformer_with_its_own_text_encoder():
    from workers.model.tiny_policy import with_task

    scenes = build_policy(PolicyConfig(num_layers=1))
    text = with_task(scenes, "miniocr")
    assert text.transformer is scenes.transformer and text.config.task == "miniocr"
    step, loss = next(pretrain(text, PretrainConfig(steps=1, batch_size=2, task="miniocr")))
    assert step == 1 and loss > 0
    with pytest.raises(ValueError, match="pretraining task is minigeneval"):
        next(pretrain(text, PretrainConfig(steps=1, batch_size=2)))


def test_runs_on_miniocr_prompts_start_from_the_miniocr_base():
    from workers.model.tiny_policy import SHIPPED_BASE, SHIPPED_OCR_BASE, load_policy, shipped_base_for
    from workers.trainer.presets import get_preset

    assert shipped_base_for(get_preset("cpu_tiny_ocr_spot").prompts.path) == SHIPPED_OCR_BASE
    assert shipped_base_for(None) == SHIPPED_BASE
    emb, _ = load_policy(SHIPPED_OCR_BASE).encode_prompts(['"K7P" in bold red'])
    assert emb.shape[0] == 1
