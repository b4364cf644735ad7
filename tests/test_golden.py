"""Golden runs: `spotlight train` and `spotlight run` give the same numbers as the fixtures recorded
before the layout change (tests/golden.py; timings and dollars excluded)."""

import json

import pytest

from tests.golden import fixture_path, produce


@pytest.mark.parametrize("kind", ["train", "run"])
def test_cpu_smoke_output_equals_the_golden_fixture(kind, tmp_path):
    expected = json.loads(fixture_path(kind).read_text())
    assert json.loads(json.dumps(produce(kind, tmp_path))) == expected
