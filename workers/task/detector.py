"""MiniGenEval's detector: colour segmentation, connected components, shape tests, scoring.

Deterministic and GenEval-like: each prompt expands into criteria (colour present,
count, shape, relation/position), each scored pass/fail on the detected objects. An
image is correct when every criterion passes (the strict score); the partial score is
the share of criteria that pass (a denser training reward).

Example:
    objects = detect_objects(images_NHW3)           # list (per image) of DetectedObject
    scores = score_images(images_NHW3, prompts)     # list of ImageScore
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workers.task.prompts import COLORS, SceneSpec, parse_prompt

MIN_AREA_PX = 8
"""Components smaller than this are specks of noise, not objects."""
MAX_COLOR_DIST = 110.0
"""A pixel belongs to a palette colour only when this close to it (RGB Euclidean)."""
SQUARE_MIN_FILL, CIRCLE_MIN_FILL = 0.86, 0.66
"""Area / bounding-box area: square ~1.0, circle ~0.78, triangle ~0.5."""
RELATION_MARGIN_PX = 2.0
_PALETTE = np.array([(0, 0, 0)] + list(COLORS.values()), dtype=np.float32)  # index 0 = background
_COLOR_NAMES = list(COLORS)


@dataclass(frozen=True)
class DetectedObject:
    color: str
    shape: str
    area_px: int
    cx: float
    cy: float


@dataclass(frozen=True)
class ImageScore:
    criteria: dict[str, bool] = field(default_factory=dict)
    """Criterion name ("color", "count", "shape", "position" with a group suffix) -> passed."""

    @property
    def strict(self) -> float:
        return float(all(self.criteria.values()))

    @property
    def partial(self) -> float:
        return sum(self.criteria.values()) / len(self.criteria)


def classify_pixels(images_NHW3: np.ndarray) -> np.ndarray:
    """Palette index per pixel (0 = background), shape (N, H, W)."""
    px = images_NHW3.astype(np.float32)[..., None, :]  # N H W 1 3
    dist = np.sqrt(((px - _PALETTE) ** 2).sum(-1))  # N H W K
    idx = dist.argmin(-1)
    too_far = np.take_along_axis(dist, idx[..., None], -1)[..., 0] > MAX_COLOR_DIST
    idx[too_far] = 0
    return idx


def label_components(classes_NHW: np.ndarray) -> np.ndarray:
    """4-connected component labels within each colour class (0 = background), shape (N, H, W)."""
    n, h, w = classes_NHW.shape
    big = n * h * w + 1
    fg = classes_NHW > 0
    labels = np.where(fg, np.arange(1, n * h * w + 1).reshape(n, h, w), big)
    while True:  # min-label propagation; converges in about a blob's diameter
        prev = labels
        for axis, shift in ((1, 1), (1, -1), (2, 1), (2, -1)):
            nb = np.roll(labels, shift, axis=axis)
            same = np.roll(classes_NHW, shift, axis=axis) == classes_NHW
            edge = np.zeros_like(fg)  # np.roll wraps around: block the wrapped row/column
            if axis == 1:
                edge[:, 0 if shift == 1 else -1, :] = True
            else:
                edge[:, :, 0 if shift == 1 else -1] = True
            labels = np.where(fg & same & ~edge, np.minimum(labels, nb), labels)
        if np.array_equal(labels, prev):
            break
    return np.where(fg, labels, 0)


def _shape_of(fill: float) -> str:
    if fill >= SQUARE_MIN_FILL:
        return "square"
    return "circle" if fill >= CIRCLE_MIN_FILL else "triangle"


def detect_objects(images_NHW3: np.ndarray) -> list[list[DetectedObject]]:
    """Objects (colour, shape, area, centroid) found in each image."""
    classes = classify_pixels(images_NHW3)
    labels = label_components(classes)
    n = images_NHW3.shape[0]
    result: list[list[DetectedObject]] = [[] for _ in range(n)]
    img_idx, ys, xs = np.nonzero(labels)
    if len(img_idx) == 0:
        return result
    uniq, inv = np.unique(labels[img_idx, ys, xs], return_inverse=True)
    area = np.bincount(inv)
    cx = np.bincount(inv, weights=xs) / area
    cy = np.bincount(inv, weights=ys) / area
    x0 = np.full(len(uniq), 10**9)
    x1 = np.full(len(uniq), -1)
    y0, y1 = x0.copy(), x1.copy()
    np.minimum.at(x0, inv, xs)
    np.maximum.at(x1, inv, xs)
    np.minimum.at(y0, inv, ys)
    np.maximum.at(y1, inv, ys)
    first = np.zeros(len(uniq), dtype=np.int64)
    first[inv[::-1]] = np.arange(len(inv))[::-1]  # one pixel of each component
    for k in np.nonzero(area >= MIN_AREA_PX)[0]:
        i = img_idx[first[k]]
        color = _COLOR_NAMES[classes[i, ys[first[k]], xs[first[k]]] - 1]
        fill = area[k] / ((x1[k] - x0[k] + 1) * (y1[k] - y0[k] + 1))
        result[i].append(DetectedObject(color, _shape_of(fill), int(area[k]), float(cx[k]), float(cy[k])))
    return result


def _relation_holds(relation: str, a: DetectedObject, b: DetectedObject) -> bool:
    m = RELATION_MARGIN_PX
    return {
        "left_of": a.cx + m < b.cx,
        "right_of": a.cx > b.cx + m,
        "above": a.cy + m < b.cy,
        "below": a.cy > b.cy + m,
    }[relation]


def _position_holds(position: str, a: DetectedObject, size: int) -> bool:
    half = size / 2
    return {"left": a.cx < half, "right": a.cx > half, "top": a.cy < half, "bottom": a.cy > half}[position]


def score_objects(spec: SceneSpec, objects: list[DetectedObject], size: int) -> ImageScore:
    """GenEval-style criteria for one image's detected objects."""
    criteria: dict[str, bool] = {}
    found = []
    for gi, g in enumerate(spec.groups):
        mine = [o for o in objects if o.color == g.color]
        found.append(mine)
        criteria[f"color.{gi}"] = len(mine) > 0
        criteria[f"count.{gi}"] = len(mine) == g.count
        criteria[f"shape.{gi}"] = len(mine) > 0 and all(o.shape == g.shape for o in mine)
    if spec.relation:
        a, b = found
        criteria["position"] = len(a) == 1 and len(b) == 1 and _relation_holds(spec.relation, a[0], b[0])
    if spec.position:
        a = found[0]
        criteria["position"] = len(a) == 1 and _position_holds(spec.position, a[0], size)
    return ImageScore(criteria)


def score_images(images_NHW3: np.ndarray, prompts: list[str]) -> list[ImageScore]:
    """Score a batch of uint8 images (N, H, W, 3) against their prompts."""
    if len(images_NHW3) != len(prompts):
        raise ValueError(f"{len(images_NHW3)} images but {len(prompts)} prompts")
    specs = [parse_prompt(p) for p in prompts]
    objects = detect_objects(images_NHW3)
    return [score_objects(s, o, images_NHW3.shape[1]) for s, o in zip(specs, objects, strict=False)]


def criterion_means(scores: list[ImageScore]) -> dict[str, float]:
    """Mean pass rate per criterion kind ("color", "count", "shape", "position")."""
    sums: dict[str, list[float]] = {}
    for s in scores:
        for name, ok in s.criteria.items():
            sums.setdefault(name.split(".")[0], []).append(float(ok))
    return {k: sum(v) / len(v) for k, v in sorted(sums.items())}
