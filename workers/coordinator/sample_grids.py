"""Held-out samples a person reads: captioned grids (the prompt, pass/fail per criterion or the reward's value) and
base vs latest weights.

The validate phase of a drawn iteration k calls `heldout_pictures`. Scored by MiniGenEval's
detector, a few held-out prompts per category, at the first fixed validation seed, are scored
again for their per-criterion verdicts; scored by a reward (a diffusers pipeline's run, MiniOCR), the
first few held-out prompts are captioned with the reward's value, and with what the reward read in the
image when it reads text (the OCR reward's `readings`). It writes, in the report folder:

    heldout_samples.png / .json        weights v(k): each image captioned with its prompt and criteria
    before_after.png / .json           the same prompts and seeds on the base weights v0 and on v(k)
    samples/heldout-v{k}.npz           the shown images and prompts (v0's are the "before" of every later k)
    grids/it-00000k-heldout.png        the captioned grid of every drawn iteration

The .json files hold the captions, so the report page can print them under the pictures.

Example:
    pictures = heldout_pictures(report_dir, k, result.images[::seeds], result.prompts[::seeds])
    pictures = heldout_pictures(report_dir, k, images, prompts, scores=result.scores[::seeds], reward="clip:/m")
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from resources.keys import iteration_label
from workers.coordinator.plots import captioned_grid_png
from workers.task.detector import score_images
from workers.task.prompts import parse_prompt
from workers.task.rewards import get_reward

SHOWN_PER_CATEGORY = 2
"""Held-out prompts shown per category (counting, color_binding, counting_binding, position)."""
SHOWN_REWARD_PROMPTS = 8
"""Held-out prompts shown when a reward scored them (the first ones)."""
PASS, FAIL = "✓", "✗"


def shown_indices(prompts: list[str], per_category: int = SHOWN_PER_CATEGORY) -> list[int]:
    """The first `per_category` prompts of each category, in the order they come."""
    taken: dict[str, int] = {}
    out = []
    for i, prompt in enumerate(prompts):
        category = parse_prompt(prompt).category
        if taken.get(category, 0) < per_category:
            taken[category] = taken.get(category, 0) + 1
            out.append(i)
    return out


def verdicts(images_NHW3: np.ndarray, prompts: list[str]) -> list[str]:
    """Per image, its criteria with pass/fail marks, one line per object group (criterion "count.1" is group 1's
    count) and one for the position: "color ✓ count ✗ shape ✓\nposition ✗"."""
    out = []
    for score in score_images(images_NHW3, prompts):
        lines: dict[str, list[str]] = {}
        for name, ok in score.criteria.items():
            kind, _, group = name.partition(".")
            lines.setdefault(group, []).append(f"{kind} {PASS if ok else FAIL}")
        out.append("\n".join(" ".join(marks) for marks in lines.values()))
    return out


def reward_marks(scores: list[float], reward: str, images_NHW3: np.ndarray | None = None) -> list[str]:
    """Per image, the reward's value as a caption line ("clip:/models/Pick... 21.37"); for a reward that reads
    text (`readings`), what it read on a second line ('read: "K7P"', or "read: (OCR failed)")."""
    label = reward if len(reward) <= 40 else reward[:37] + "..."
    marks = [f"{label} {score:.4g}" for score in scores]
    read = getattr(get_reward(reward), "readings", None)
    if images_NHW3 is None or read is None:
        return marks
    return [f"{mark}\n{reading_line(text)}" for mark, text in zip(marks, read(images_NHW3), strict=True)]


def reading_line(text: str | None) -> str:
    """A caption's OCR line. PP-OCR's recogniser also reads Chinese, which the plots' font has no glyphs for:
    those characters are written as escapes (`\\u65e5`) instead of an empty box."""
    if text is None:
        return "read: (OCR failed)"
    return f'read: "{text.encode("ascii", "backslashreplace").decode("ascii")}"'


def heldout_pictures(
    report_dir: Path,
    k: int,
    images_NHW3: np.ndarray,
    prompts: list[str],
    scores: list[float] | None = None,
    reward: str | None = None,
) -> dict[str, tuple[bytes, str]]:
    """Write the captioned grid of v(k) and (for k > 0, when v0's samples were kept) the before/after grid;
    returns them as PhaseResult pictures (name -> (PNG, caption)). Captions: the detector's pass/fail per
    criterion, or with `reward` each image's value in `scores`."""
    shown = shown_indices(prompts) if reward is None else list(range(min(len(prompts), SHOWN_REWARD_PROMPTS)))
    images, names = images_NHW3[shown], [prompts[i] for i in shown]
    marks = verdicts(images, names) if reward is None else reward_marks([scores[i] for i in shown], reward, images)
    captions = [f"{p}\n{m}" for p, m in zip(names, marks, strict=False)]
    grid = captioned_grid_png(images, captions, columns=4)
    (report_dir / "grids").mkdir(parents=True, exist_ok=True)
    (report_dir / "samples").mkdir(parents=True, exist_ok=True)
    (report_dir / "grids" / f"{iteration_label(k)}-heldout.png").write_bytes(grid)
    _write(report_dir, "heldout_samples", grid, {"weights_version": k, "captions": captions})
    np.savez_compressed(
        report_dir / "samples" / f"heldout-v{k}.npz", images=images, prompts=np.array(names), marks=np.array(marks)
    )
    scored_by = "pass/fail per criterion" if reward is None else f"scored by {reward}"
    out = {"heldout_samples": (grid, f"weights v{k}: held-out prompts, first fixed seed, {scored_by}")}
    before = report_dir / "samples" / "heldout-v0.npz"
    if k > 0 and before.is_file():
        pair = before_after_png(np.load(before), images, names, marks, k)
        if pair is not None:
            png, pair_captions = pair
            _write(report_dir, "before_after", png, {"weights_version": k, "captions": pair_captions})
            out["before_after"] = (png, f"base weights v0 (top) vs v{k} (bottom): same prompts, same seeds")
    return out


def before_after_png(
    base, images_NHW3: np.ndarray, prompts: list[str], marks: list[str], k: int
) -> tuple[bytes, list[str]] | None:
    """Base samples on the top row, v(k)'s below, one column per prompt (None when v0 showed other prompts)."""
    if [str(p) for p in base["prompts"]] != prompts:
        return None
    # v0's own captions (older reports kept none: the detector's verdicts are computed again).
    before_marks = [str(m) for m in base["marks"]] if "marks" in base else verdicts(base["images"], prompts)
    captions = [f"{p}\nv0: {m}" for p, m in zip(prompts, before_marks, strict=False)] + [f"v{k}: {m}" for m in marks]
    return captioned_grid_png(np.concatenate([base["images"], images_NHW3]), captions, columns=len(prompts)), captions


def _write(report_dir: Path, name: str, png: bytes, captions: dict) -> None:
    (report_dir / f"{name}.png").write_bytes(png)
    (report_dir / f"{name}.json").write_text(json.dumps(captions, ensure_ascii=False, indent=1))
