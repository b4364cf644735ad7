import pytest

from workers.task.prompts import (
    HELDOUT_CATEGORIES,
    PromptError,
    all_specs,
    parse_prompt,
    prompt_text,
    split_prompts,
    tokenize,
)


def test_every_grammar_prompt_round_trips_through_the_parser():
    for spec in all_specs():
        assert parse_prompt(prompt_text(spec)) == spec


@pytest.mark.parametrize(
    "prompt,word",
    [
        ("a red dog", "dog"),
        ("two orange circles", "orange"),
        ("a red circle next to a blue square", "next"),
    ],
)
def test_words_outside_the_grammar_raise_an_error_naming_them(prompt, word):
    with pytest.raises(ValueError, match=word):
        parse_prompt(prompt)


@pytest.mark.parametrize(
    "prompt,problem",
    [
        ("two red circle", "plural"),
        ("a red circles", "singular"),
        ("a red circle and a red square", "different colours"),
        ("three red circles and one blue square", "at most 3"),
        ("two red circles on the left", "single object"),
    ],
)
def test_malformed_prompts_say_what_is_wrong(prompt, problem):
    with pytest.raises(PromptError, match=problem):
        parse_prompt(prompt)


def test_heldout_split_is_disjoint_stable_and_hard():
    split = split_prompts()
    assert not set(split["train"]) & set(split["heldout"])
    assert split == split_prompts()
    cats = {parse_prompt(p).category for p in split["heldout"]}
    assert cats == set(HELDOUT_CATEGORIES)
    assert len(split["heldout"]) == 16 * len(HELDOUT_CATEGORIES)


def test_tokenize_pads_and_validates():
    ids, lengths = tokenize(["a red circle", "two blue squares and one green triangle"])
    assert lengths == [3, 7] and len(ids[0]) == len(ids[1]) and ids[0][3] == 0
    with pytest.raises(ValueError):
        tokenize(["a red unicorn"])
