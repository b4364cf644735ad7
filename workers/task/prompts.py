"""MiniGenEval's prompt grammar: parse prompts into scene specs, enumerate and split them.

A prompt names one or two groups of objects. A group is a count, a colour and a shape
("two red circles"); two groups are joined by "and" (co-occurrence, attribute binding)
or by a relation between two single objects ("a red circle left of a blue square").
A single object may carry an absolute position ("a red circle on the left").
Groups of one prompt always differ in colour, so the detector can tell them apart.

Example:
    spec = parse_prompt("two red circles and a blue square")
    spec.groups[0]   # Group(count=2, color='red', shape='circle')
    split_prompts()["heldout"][:3]
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

from workers.algo.seeds import domain_seed

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (40, 80, 240),
    "yellow": (235, 215, 40),
    "purple": (170, 60, 220),
}
SHAPES = ("circle", "square", "triangle")
COUNT_WORDS = {"a": 1, "one": 1, "two": 2, "three": 3}
RELATIONS = {"left of": "left_of", "right of": "right_of", "above": "above", "below": "below"}
POSITIONS = ("left", "right", "top", "bottom")
MAX_OBJECTS = 3  # more objects of a legible size (9-12 px) do not fit a 32x32 canvas

VOCAB: tuple[str, ...] = tuple(
    ["<pad>"]
    + sorted(
        set(COUNT_WORDS)
        | set(COLORS)
        | set(SHAPES)
        | {s + "s" for s in SHAPES}
        | {"and", "left", "right", "of", "above", "below", "on", "the", "top", "bottom"}
    )
)
MAX_PROMPT_WORDS = 10


@dataclass(frozen=True)
class Group:
    count: int
    """How many objects of this colour and shape (1-3)."""
    color: str
    shape: str


@dataclass(frozen=True)
class SceneSpec:
    """What an image must show to satisfy a prompt."""

    groups: tuple[Group, ...]
    relation: str | None = None
    """"left_of" | "right_of" | "above" | "below": groups[0] relative to groups[1]."""
    position: str | None = None
    """Absolute position of a single object: "left" | "right" | "top" | "bottom"."""

    @property
    def category(self) -> str:
        """The GenEval-style task this prompt tests."""
        if self.relation:
            return "position"
        if self.position:
            return "absolute_position"
        if len(self.groups) == 2:
            return "counting_binding" if any(g.count > 1 for g in self.groups) else "color_binding"
        return "counting" if self.groups[0].count > 1 else "single_object"

    @property
    def num_objects(self) -> int:
        return sum(g.count for g in self.groups)


def _group_text(g: Group, article: str = "a") -> str:
    if g.count == 1:
        return f"{article} {g.color} {g.shape}"
    return f"{['', 'one', 'two', 'three'][g.count]} {g.color} {g.shape}s"


def prompt_text(spec: SceneSpec) -> str:
    """The canonical prompt for a spec (parse_prompt(prompt_text(s)) == s)."""
    if spec.relation:
        rel = {v: k for k, v in RELATIONS.items()}[spec.relation]
        return f"{_group_text(spec.groups[0])} {rel} {_group_text(spec.groups[1])}"
    if spec.position:
        return f"{_group_text(spec.groups[0])} on the {spec.position}"
    if len(spec.groups) == 2:
        # "one" rather than "a" when counts are mixed reads naturally: "two red circles and one blue square"
        art = "one" if any(g.count > 1 for g in spec.groups) else "a"
        return f"{_group_text(spec.groups[0], art)} and {_group_text(spec.groups[1], art)}"
    return _group_text(spec.groups[0])


class PromptError(ValueError):
    """A prompt outside MiniGenEval's grammar."""


def _parse_group(words: list[str], prompt: str) -> Group:
    if len(words) != 3:
        raise PromptError(f"{prompt!r}: expected '<count> <colour> <shape>', got {' '.join(words)!r}")
    count_w, color, shape_w = words
    if count_w not in COUNT_WORDS:
        raise PromptError(f"{prompt!r}: {count_w!r} is not a count; use one of {sorted(COUNT_WORDS)}")
    if color not in COLORS:
        raise PromptError(f"{prompt!r}: {color!r} is not a colour; use one of {sorted(COLORS)}")
    count = COUNT_WORDS[count_w]
    shape = shape_w[:-1] if shape_w.endswith("s") else shape_w
    if shape not in SHAPES:
        raise PromptError(f"{prompt!r}: {shape_w!r} is not a shape; use one of {list(SHAPES)} (plural for counts > 1)")
    if (count > 1) != shape_w.endswith("s"):
        raise PromptError(f"{prompt!r}: {count_w!r} needs the {'plural' if count > 1 else 'singular'} {shape_w!r}")
    return Group(count, color, shape)


def parse_prompt(prompt: str) -> SceneSpec:
    """Parse a prompt into a SceneSpec; PromptError (a ValueError) says what is outside the grammar."""
    words = prompt.lower().strip().rstrip(".").split()
    unknown = [w for w in words if w not in VOCAB or w == "<pad>"]
    if unknown:
        raise PromptError(f"{prompt!r}: unknown word(s) {unknown}; the vocabulary is {list(VOCAB[1:])}")
    if len(words) > MAX_PROMPT_WORDS:
        raise PromptError(f"{prompt!r}: at most {MAX_PROMPT_WORDS} words")
    text = " ".join(words)
    if text.endswith(tuple(f" on the {p}" for p in POSITIONS)):
        position = words[-1]
        group = _parse_group(words[:-3], prompt)
        if group.count != 1:
            raise PromptError(f"{prompt!r}: 'on the {position}' applies to a single object")
        return SceneSpec((group,), position=position)
    for phrase, rel in RELATIONS.items():
        left, sep, right = text.partition(f" {phrase} ")
        if sep:
            groups = (_parse_group(left.split(), prompt), _parse_group(right.split(), prompt))
            if any(g.count != 1 for g in groups):
                raise PromptError(f"{prompt!r}: '{phrase}' relates two single objects")
            return _checked(SceneSpec(groups, relation=rel), prompt)
    left, sep, right = text.partition(" and ")
    groups = (_parse_group(left.split(), prompt),)
    if sep:
        groups += (_parse_group(right.split(), prompt),)
    return _checked(SceneSpec(groups), prompt)


def _checked(spec: SceneSpec, prompt: str) -> SceneSpec:
    if len(spec.groups) == 2 and spec.groups[0].color == spec.groups[1].color:
        raise PromptError(f"{prompt!r}: the two groups must have different colours")
    if spec.num_objects > MAX_OBJECTS:
        raise PromptError(f"{prompt!r}: at most {MAX_OBJECTS} objects in one image")
    return spec


def all_specs() -> list[SceneSpec]:
    """Every prompt of the grammar, in a fixed order."""
    groups = [Group(n, c, s) for n in (1, 2, 3) for c in COLORS for s in SHAPES]
    singles = [g for g in groups if g.count == 1]
    specs = [SceneSpec((g,)) for g in groups]
    specs += [SceneSpec((g,), position=p) for g in singles for p in POSITIONS]
    for a, b in itertools.permutations(groups, 2):
        if a.color != b.color and a.count + b.count <= MAX_OBJECTS:
            specs.append(SceneSpec((a, b)))
    for a, b in itertools.permutations(singles, 2):
        if a.color != b.color:
            specs += [SceneSpec((a, b), relation=r) for r in RELATIONS.values()]
    return specs


CATEGORIES = ("single_object", "absolute_position", "counting", "color_binding", "counting_binding", "position")
"""Every prompt category of the grammar (SceneSpec.category)."""
HELDOUT_CATEGORIES = ("counting", "color_binding", "counting_binding", "position")
"""The held-out split tests what GenEval finds hard: counting, attribute binding, relations."""


def _bucket(text: str) -> float:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def split_prompts(heldout_per_category: int = 16) -> dict[str, list[str]]:
    """The published train / held-out split (deterministic, independent of the run's seed).

    Held-out prompts are never seen in pretraining nor in RL; they are drawn, per hard
    category, by a fixed hash of the prompt text so the split never changes.
    """
    train, heldout = _split(heldout_per_category)
    return {"train": list(train), "heldout": list(heldout)}


@functools.lru_cache(maxsize=4)
def _split(heldout_per_category: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """split_prompts' lists, made once: enumerating the grammar takes tens of milliseconds, every iteration asks."""
    by_cat: dict[str, list[str]] = {}
    for spec in all_specs():
        by_cat.setdefault(spec.category, []).append(prompt_text(spec))
    heldout: list[str] = []
    for cat in HELDOUT_CATEGORIES:
        heldout += sorted(by_cat[cat], key=_bucket)[:heldout_per_category]
    held = set(heldout)
    return tuple(p for cat in by_cat.values() for p in cat if p not in held), tuple(heldout)


@functools.lru_cache(maxsize=1)
def _train_by_category() -> dict[str, tuple[str, ...]]:
    by_cat: dict[str, list[str]] = {}
    for p in split_prompts()["train"]:
        by_cat.setdefault(parse_prompt(p).category, []).append(p)
    return {cat: tuple(prompts) for cat, prompts in by_cat.items()}


def tokenize(prompts: list[str]) -> tuple[list[list[int]], list[int]]:
    """Word ids (padded to MAX_PROMPT_WORDS) and lengths; validates every prompt first."""
    index = {w: i for i, w in enumerate(VOCAB)}
    ids, lengths = [], []
    for p in prompts:
        parse_prompt(p)
        words = p.lower().strip().rstrip(".").split()
        ids.append([index[w] for w in words] + [0] * (MAX_PROMPT_WORDS - len(words)))
        lengths.append(len(words))
    return ids, lengths


def iteration_prompts(
    seed: int, iteration: int, num_prompts: int, categories: tuple[str, ...] | None = None
) -> list[str]:
    """The train prompts of an iteration: category-balanced, deterministic in (seed, iteration); the generator's
    seed is the "prompts" domain of workers/algo/seeds.py, apart from every request seed."""
    by_cat = _train_by_category()
    cats = sorted(c for c in by_cat if categories is None or c in categories)
    rng = np.random.default_rng(domain_seed(seed, "prompts", iteration))
    out = []
    for i in range(num_prompts):
        pool = by_cat[cats[(i + iteration * num_prompts) % len(cats)]]
        out.append(pool[rng.integers(len(pool))])
    return out
